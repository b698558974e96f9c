"""The registry of papers: which task (client side) and strategy (server side) a cell runs.

The federated runner (:mod:`fedrepro.fl.cell`, the Flower apps, the engines) is the same for every
paper and never imports one: it looks the paper up here by ``cell["paper"]`` and imports the
modules named in :data:`PAPERS` at run time. A paper lives in ``fedrepro.papers.<name>``; its
``task`` module implements :class:`Task`, and its optional ``strategy`` module provides
``make_strategy(cell, **kwargs)`` returning a subclass of
:class:`fedrepro.fl.strategy.SortedCheckpointFedAvg` (papers without one run that strategy,
i.e. FedAvg of the shared tensors weighted by |D_i|).

Adding a paper: create ``fedrepro/papers/<name>/task.py`` (and ``strategy.py`` where its server
does more than FedAvg) and add one :class:`PaperEntry` to :data:`PAPERS`.
"""

from __future__ import annotations

import importlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from fedrepro.io import InputError

if TYPE_CHECKING:
    import torch

    from fedrepro.fl.strategy import SortedCheckpointFedAvg


@runtime_checkable
class Task(Protocol):
    """What the shared runner asks of a paper's ``task`` module (module-level functions).

    Optional members, looked up with ``getattr``: ``WANTS_RECORDS`` (bool: the client round also
    receives the train message's extra records as ``records=``) and ``client_evaluate(cell, client,
    round, server_state) -> {metric: value}`` (the client side of a Flower evaluate message).
    """

    def is_federated(self, cell: dict) -> bool:
        """Whether the cell's method runs through Flower (else :meth:`run_local` trains it)."""
        ...

    def initial_state(self, cell: dict) -> OrderedDict[str, torch.Tensor]:
        """The tensors of the server's first broadcast (w_0 of the shared parameters)."""
        ...

    def client_train_round(
        self, cell: dict, client: str, round_index: int, server_state: dict[str, torch.Tensor]
    ) -> tuple:
        """One client's work in round ``round_index`` (1-based, across resumes).

        Returns ``(tensors to send, stats)`` or ``(tensors, stats, extra RecordDict entries)``;
        ``stats`` must hold ``num_examples`` (the FedAvg weight), and every other int/float in it
        is recorded per client in the round log.
        """
        ...

    def run_local(self, cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
        """Train a method without a server (local-only, centralized); ``{client: final state}``."""
        ...

    def final_states(self, cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
        """After the last round: the state each evaluated client is evaluated with."""
        ...

    def parameter_report(self, cell: dict) -> dict:
        """Trainable and communicated parameter counts of the cell's model (provenance)."""
        ...


@dataclass(frozen=True)
class PaperEntry:
    """Where a paper's runner hooks live (dotted module paths, imported on first use)."""

    task: str
    strategy: str | None = None


PAPERS: dict[str, PaperEntry] = {
    "adafedseleckd": PaperEntry(
        "fedrepro.papers.adafedseleckd.task", "fedrepro.papers.adafedseleckd.strategy"
    ),
    "fedmcp": PaperEntry("fedrepro.papers.fedmcp.task"),
    "fedsum": PaperEntry("fedrepro.papers.fedsum.task", "fedrepro.papers.fedsum.strategy"),
    "fedsumm": PaperEntry("fedrepro.papers.fedsumm.task", "fedrepro.papers.fedsumm.strategy"),
}


def _entry(cell: Mapping) -> PaperEntry:
    paper = cell.get("paper", "adafedseleckd")
    try:
        return PAPERS[paper]
    except KeyError:
        raise InputError(
            f"cell paper {paper!r} has no federated task; known: {sorted(PAPERS)}"
        ) from None


def task_for(cell: Mapping) -> Task:
    """The task module of ``cell["paper"]`` (default ``adafedseleckd``)."""
    return cast(Task, importlib.import_module(_entry(cell).task))


def strategy_factory(cell: Mapping) -> Callable[..., SortedCheckpointFedAvg] | None:
    """The paper's ``make_strategy(cell, **kwargs)``, or None when it runs the base strategy."""
    module = _entry(cell).strategy
    if module is None:
        return None
    return cast(Any, importlib.import_module(module)).make_strategy
