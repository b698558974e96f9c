"""Per-cell limits of a rehearsal (``rehearsal: true``, :mod:`fedrepro.rehearsal`).

A rehearsal cell carries ``cell["rehearsal"] = {"examples_per_client": n, "eval_examples": m}``;
every paper's task passes the examples it reads through :func:`rehearsal_limit`, which keeps the
first ``n`` training (``m`` evaluation) examples in file order, so a rehearsal runs the paper's
code path on a few examples.  A normal cell has no ``rehearsal`` key and is not touched (its
config hash is unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

TRAIN_SPLITS = ("train",)


def rehearsal_limit(cell: Mapping, items: Sequence[T], split: str) -> Sequence[T]:
    """``items`` cut to the rehearsal's size for ``split`` (``train``: ``examples_per_client``;
    any other split: ``eval_examples``); unchanged outside a rehearsal."""
    limits = cell.get("rehearsal")
    if not limits:
        return items
    key = "examples_per_client" if split in TRAIN_SPLITS else "eval_examples"
    n = int(limits[key])
    return items[:n]

