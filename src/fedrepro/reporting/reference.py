"""The numbers the papers report, shipped as package data.

``resources/paper_results.csv`` is a copy of the project's reference file: one row per reported
number, in long format with columns ``paper, table, backbone, setting, client, method, metric,
value, std`` (``std`` is empty where the paper gives none). Every comparison with a paper reads
its numbers from here; nothing else in the package hard-codes them.
"""

from __future__ import annotations

import functools
import importlib.resources

import pandas as pd

from fedrepro.io import InputError

RESOURCE = "resources/paper_results.csv"
"""Location of the reference CSV inside the ``fedrepro`` package."""

COLUMNS = ("paper", "table", "backbone", "setting", "client", "method", "metric", "value", "std")
"""Columns of the reference CSV, in file order."""


@functools.lru_cache(maxsize=1)
def _load_cached() -> pd.DataFrame:
    resource = importlib.resources.files("fedrepro").joinpath(RESOURCE)
    try:
        with resource.open("r", encoding="utf-8") as fh:
            df = pd.read_csv(fh, dtype={c: str for c in COLUMNS[:7]}, keep_default_na=False,
                             na_values={"value": [""], "std": [""]})
    except FileNotFoundError as exc:
        raise InputError(
            f"fedrepro/{RESOURCE}: package data missing; reinstall the package "
            "(pip install -e . --no-deps)"
        ) from exc
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise InputError(
            f"fedrepro/{RESOURCE}: missing column(s) {missing}; expected {list(COLUMNS)}"
        )
    df = df[list(COLUMNS)]
    for col in ("value", "std"):
        df[col] = pd.to_numeric(df[col], errors="raise").astype(float)
    return df


def load_paper_results() -> pd.DataFrame:
    """Load every number reported by the project's four papers.

    Returns
    -------
    pandas.DataFrame
        Long format, one row per reported number, columns ``paper, table, backbone, setting,
        client, method, metric, value, std``. ``value`` and ``std`` are floats (``std`` is NaN
        where the paper reports none). The frame is a fresh copy; callers may modify it.

    Raises
    ------
    InputError
        If the package data file is missing or lacks a column.
    """
    return _load_cached().copy()


def paper_values(paper: str, table: str) -> pd.DataFrame:
    """Return the reported numbers of one table of one paper.

    Parameters
    ----------
    paper : str
        Paper key as used in the reference CSV, e.g. ``"adafedseleckd"``.
    table : str
        Table label as used in the reference CSV, e.g. ``"Table III"``.

    Returns
    -------
    pandas.DataFrame
        The matching rows (same columns as :func:`load_paper_results`), in file order, with a
        fresh ``RangeIndex``.

    Raises
    ------
    InputError
        If the paper or the table is not in the reference CSV; the message lists what is.
    """
    df = load_paper_results()
    papers = sorted(df["paper"].unique())
    if paper not in papers:
        raise InputError(f"paper {paper!r} not in the reference results; known papers: {papers}")
    of_paper = df[df["paper"] == paper]
    out = of_paper[of_paper["table"] == table]
    if out.empty:
        tables = list(dict.fromkeys(of_paper["table"]))
        raise InputError(f"{paper}: table {table!r} not in the reference results; known: {tables}")
    return out.reset_index(drop=True)
