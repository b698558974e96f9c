"""Helpers shared by the generators of the English summarization samples (SAMSum, CNN/DM, PubMed,
WikiHow, Reddit TIFU): deterministic writers in the upstream layouts and a seeded ``pick``.

``SPLITS`` and ``write_csv_atomic`` are the parsers' own (:mod:`fedrepro.data.sources._english`),
re-exported so that a generator needs only this module.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from typing import Any

from fedrepro.data.samples import check_scale
from fedrepro.data.sources._english import SPLITS, write_csv_atomic
from fedrepro.io import write_text_atomic

__all__ = [
    "SPLITS",
    "check_scale",
    "draw_new_ids",
    "pick",
    "scale_rng",
    "write_csv_atomic",
    "write_json_list_atomic",
    "write_jsonl_ordered",
]


def write_json_list_atomic(path: str | os.PathLike, objs: Sequence[dict]) -> int:
    """Write a JSON list (one object per line inside the brackets, keys in the given order)."""
    body = ",\n".join("  " + json.dumps(o, ensure_ascii=False) for o in objs)
    write_text_atomic(path, "[\n" + body + "\n]\n")
    return len(objs)


def write_jsonl_ordered(path: str | os.PathLike, objs: Sequence[dict]) -> int:
    """Write JSON lines keeping each object's key order (as the upstream files do)."""
    write_text_atomic(path, "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs))
    return len(objs)


def pick(rng: Any, seq: Sequence[Any]) -> Any:
    """``rng.choice`` spelled once (keeps the generators short)."""
    return seq[rng.randrange(len(seq))]


def scale_rng(name: str, copy: int) -> random.Random:
    """The random stream of the ``copy``-th extra copy (``copy >= 1``) of a split whose ``scale=1``
    stream is ``random.Random(name)``: ``random.Random(f"{name}/scale/{copy}")``."""
    return random.Random(f"{name}/scale/{copy}")


def draw_new_ids(rng: random.Random, lo: int, hi: int, n: int, used: set[int]) -> list[int]:
    """``n`` distinct integers of ``range(lo, hi)`` not in ``used`` (which gains them), sorted."""
    if hi - lo - len(used) < n:
        raise ValueError(f"range({lo}, {hi}) has fewer than {n} unused ids")
    out: list[int] = []
    while len(out) < n:
        i = rng.randrange(lo, hi)
        if i not in used:
            used.add(i)
            out.append(i)
    return sorted(out)
