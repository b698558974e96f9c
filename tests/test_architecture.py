"""The layout contract: one room per paper over a shared core (README "Layout").

* import-linter's contracts in pyproject.toml hold (papers independent of each other; the shared
  core never imports a paper; data imports nothing above it);
* every paper in the runner's registry provides the whole task protocol, and its strategy hook
  where it names one;
* no import cycle anywhere in the package.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from fedrepro.fl.strategy import SortedCheckpointFedAvg
from fedrepro.fl.tasks import PAPERS, Task, strategy_factory, task_for

ROOT = Path(__file__).resolve().parents[1]
PAPER_NAMES = ("adafedseleckd", "fedmcp", "fedsum", "fedsumm")


def test_import_contracts_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 kept, 0 broken" in res.stdout


def test_every_paper_is_a_room():
    assert set(PAPERS) == set(PAPER_NAMES)
    for name in PAPER_NAMES:
        pkg = ROOT / "src" / "fedrepro" / "papers" / name
        assert (pkg / "task.py").is_file() and (pkg / "grid.py").is_file() and (pkg / "report.py").is_file()
        assert (ROOT / "rules" / f"{name}.smk").is_file()
        assert (pkg / "scorecard.py").is_file()  # its tables and claims for the scorecard
    from fedrepro.catalog import PAPERS as CATALOG

    assert set(CATALOG) == set(PAPER_NAMES)


@pytest.mark.parametrize("paper", PAPER_NAMES)
def test_registry_gives_the_protocol(paper):
    task = task_for({"paper": paper})
    assert isinstance(task, Task)
    assert task.__name__ == f"fedrepro.papers.{paper}.task"
    make = strategy_factory({"paper": paper})
    if PAPERS[paper].strategy is None:
        assert make is None
    else:
        module = importlib.import_module(PAPERS[paper].strategy)
        assert make is module.make_strategy
        # what it builds is the shared checkpointed strategy, specialised
        assert any(
            isinstance(v, type) and issubclass(v, SortedCheckpointFedAvg) and v is not SortedCheckpointFedAvg
            for v in vars(module).values()
        )


def test_no_import_cycles():
    graph = grimp.build_graph("fedrepro")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(importer=imported, imported=module):
                cycles.append((module, imported))
    assert cycles == []
