"""One room per paper: everything that belongs to one paper lives in ``fedrepro.papers.<paper>``.

Each room provides ``task.py`` (the client side of :class:`fedrepro.fl.tasks.Task`, registered in
:data:`fedrepro.fl.tasks.PAPERS`), ``grid.py`` (config -> cells, paths, targets), ``report.py`` (its
tables and figures beside the paper's numbers) and its model and equations; ``strategy.py`` where
its server does more than FedAvg. The rooms never import each other (pyproject.toml contracts).
"""
