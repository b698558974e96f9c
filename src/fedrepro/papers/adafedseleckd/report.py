"""Collect per-cell ROUGE score files and build the paper-vs-ours result tables.

Score-file contract
-------------------
Every training cell writes one ``scores.json``::

    {"paper": "adafedseleckd", "scale": "demo" | "paper", "backbone": "bart-large",
     "method": "AdaFedSelectKD", "setting": "federated", "seed": 1,
     "per_client": {"Academic": {"rouge1": 25.1, "rouge2": 6.2, "rougeL": 18.0, "n": 49}, ...}}

Scores are ROUGE F1 in percent. For AdaFedSelectKD's main tables the methods are ``AdaSingle``
(setting ``"single"``; each of its cells holds exactly one client), ``AdaCentralized``
(``"centralized"``) and ``AdaFedAvg`` / ``AdaFedKD`` / ``AdaFedSelectKD`` (``"federated"``).

The paper's numbers are never written here: they come from the reference CSV through
:mod:`fedrepro.reporting.reference`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.io import InputError, atomic_path, read_json, write_text_atomic
from fedrepro.reporting.reference import paper_values
from fedrepro.reporting.tables import (
    DAGGER,
    DOUBLE_DAGGER,
    METRIC_LABELS,
    RANK_DECIMALS,
    ROUGE_KEYS,
    SCALES,
)

PAPER = "adafedseleckd"
SCORE_COLUMNS = ("paper", "backbone", "method", "setting", "client", "seed", "metric", "value",
                 "scale")
"""Columns of :func:`collect_scores`'s long-format frame."""

ADAFEDSELECKD_CLIENTS = ("Academic", "Committee", "Product")
"""Client order of Tables III, IV and VI."""

ADAFEDSELECKD_METHODS = ("AdaSingle", "AdaCentralized", "AdaFedAvg", "AdaFedKD", "AdaFedSelectKD")
"""Method order of Tables III, IV and VI."""

METHOD_SETTINGS = {
    "AdaSingle": "single",
    "AdaCentralized": "centralized",
    "AdaFedAvg": "federated",
    "AdaFedKD": "federated",
    "AdaFedSelectKD": "federated",
}
"""The setting each AdaFedSelecKD method must declare in its score files."""

MAIN_TABLES = ("Table III", "Table IV", "Table VI")
"""The AdaFedSelecKD main-result tables (bart-large, bart-base, led-large in the paper)."""



# ----------------------------------------------------------------------------- score files


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _records_from_file(path: Path) -> list[dict]:
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(obj).__name__}")

    def need(key: str, kind: str) -> object:
        if key not in obj:
            raise InputError(f"{path}: missing key {key!r} (score-file contract: see "
                             "fedrepro.papers.adafedseleckd.report)")
        val = obj[key]
        ok = {"str": lambda v: isinstance(v, str) and v != "", "int": _is_int,
              "dict": lambda v: isinstance(v, dict)}[kind](val)
        if not ok:
            raise InputError(f"{path}: key {key!r} must be a non-empty {kind}, "
                             f"got {type(val).__name__} {val!r}")
        return val

    paper = need("paper", "str")
    scale = need("scale", "str")
    backbone = need("backbone", "str")
    method = need("method", "str")
    setting = need("setting", "str")
    seed = need("seed", "int")
    per_client = need("per_client", "dict")
    if scale not in SCALES:
        raise InputError(f"{path}: 'scale' must be one of {SCALES}, got {scale!r}")
    if paper == PAPER and method in METHOD_SETTINGS and setting != METHOD_SETTINGS[method]:
        raise InputError(f"{path}: method {method!r} must have setting "
                         f"{METHOD_SETTINGS[method]!r}, got {setting!r}")
    if not per_client:
        raise InputError(f"{path}: 'per_client' is empty; expected at least one client")
    if setting == "single" and len(per_client) != 1:
        raise InputError(f"{path}: setting 'single' must hold exactly one client, got "
                         f"{sorted(per_client)}")

    records = []
    for client, vals in per_client.items():
        where = f"{path}: per_client[{client!r}]"
        if not isinstance(vals, dict):
            raise InputError(f"{where} must be an object, got {type(vals).__name__}")
        for key in ROUGE_KEYS:
            if key not in vals:
                raise InputError(f"{where}: missing key {key!r}")
            v = vals[key]
            if not _is_number(v) or not math.isfinite(v) or not 0.0 <= v <= 100.0:
                raise InputError(f"{where}[{key!r}] must be a finite number in [0, 100] "
                                 f"(ROUGE F1 in percent), got {v!r}")
            records.append((paper, backbone, method, setting, client, seed, key, float(v), scale))
        if "n" not in vals:
            raise InputError(f"{where}: missing key 'n'")
        n = vals["n"]
        if not _is_int(n) or n < 1:
            raise InputError(f"{where}['n'] must be a positive integer, got {n!r}")
        records.append((paper, backbone, method, setting, client, seed, "n", float(n), scale))
    return records


def collect_scores(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Read ``scores.json`` files into one long-format frame.

    Parameters
    ----------
    paths : iterable of path-like
        Score files following the contract in the module docstring.

    Returns
    -------
    pandas.DataFrame
        One row per (file, client, metric) with columns ``paper, backbone, method, setting,
        client, seed, metric, value, scale``. ``metric`` is ``rouge1``, ``rouge2``, ``rougeL``
        (percent) or ``n`` (number of test examples); ``value`` is float, ``seed`` is int.

    Raises
    ------
    InputError
        If no path is given, or a file is missing, not JSON, or breaks the contract (missing
        key, wrong type, score outside [0, 100], an AdaFedSelecKD method with the wrong setting,
        a ``single`` cell with more than one client); the message names the file. Also if two
        files give the same (paper, backbone, method, client, seed), which would double-count
        a run in the means.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise InputError("collect_scores: no score files given")
    records: list[tuple] = []
    origin: dict[tuple, Path] = {}
    for path in paths:
        recs = _records_from_file(path)
        for rec in recs:
            if rec[6] != "n":
                continue
            key = (rec[0], rec[1], rec[2], rec[4], rec[5])
            if key in origin:
                raise InputError(
                    f"{path}: duplicate result for paper={key[0]} backbone={key[1]} "
                    f"method={key[2]} client={key[3]} seed={key[4]} (already in {origin[key]})"
                )
            origin[key] = path
        records.extend(recs)
    df = pd.DataFrame.from_records(records, columns=list(SCORE_COLUMNS))
    df["seed"] = df["seed"].astype("int64")
    df["value"] = df["value"].astype(float)
    return df


# ----------------------------------------------------------------------------- main table


def _marks(values: pd.Series) -> pd.Series:
    """† for the largest, †† for the second-largest value (competition ranking; NaN unmarked)."""
    ranks = values.round(RANK_DECIMALS).rank(ascending=False, method="min", na_option="keep")
    return ranks.map(lambda r: DAGGER if r == 1 else DOUBLE_DAGGER if r == 2 else "")


def metric_columns(label: str) -> list[str]:
    """Names of the per-metric columns of the main table, e.g. for ``label="R-1"``.

    Parameters
    ----------
    label : str
        ``"R-1"``, ``"R-2"`` or ``"R-L"``.

    Returns
    -------
    list of str
        ``[f"{label} ours mean", f"{label} ours std", f"{label} n_seeds", f"{label} paper",
        f"{label} ours mark", f"{label} paper mark"]``.
    """
    return [f"{label} ours mean", f"{label} ours std", f"{label} n_seeds", f"{label} paper",
            f"{label} ours mark", f"{label} paper mark"]


def adafedseleckd_main_table(scores: pd.DataFrame, backbone: str, table: str) -> pd.DataFrame:
    """Build AdaFedSelecKD Table III, IV or VI: our seed-averaged ROUGE beside the paper's.

    Parameters
    ----------
    scores : pandas.DataFrame
        Long-format scores from :func:`collect_scores`. Rows of other papers, backbones,
        methods, clients or metrics are ignored.
    backbone : str
        Our backbone whose scores fill the table (e.g. ``"bart-large"``). It may differ from
        the paper's backbone for ``table`` (demo runs use tiny models); the paper values always
        come from ``table``.
    table : {"Table III", "Table IV", "Table VI"}
        Which paper table to compare against (bart-large, bart-base, led-large in the paper).

    Returns
    -------
    pandas.DataFrame
        15 rows, clients ``Academic, Committee, Product`` (outer) x methods ``AdaSingle,
        AdaCentralized, AdaFedAvg, AdaFedKD, AdaFedSelectKD`` (inner), in the paper's order.
        Columns ``Client, Setting, Method`` then, for each label ``R-1, R-2, R-L`` (ROUGE-1/2/L
        F1 in percent), the columns of :func:`metric_columns`:

        - ``ours mean``: mean over seeds (NaN if the method has no scores);
        - ``ours std``: sample standard deviation over seeds (``ddof=1``); NaN with one seed;
        - ``n_seeds``: number of seeds averaged (0 if none);
        - ``paper``: the value the paper reports (from the reference CSV);
        - ``ours mark`` / ``paper mark``: ``"†"`` for the best and ``"††"`` for the second
          best within the client and metric, ranked on our means (rounded to 2 decimals, as
          displayed) and on the paper's values respectively; ties share a rank (competition
          ranking), missing values get ``""``.

    Raises
    ------
    ValueError
        If ``table`` is not one of the main tables.
    InputError
        If the selected scores mix scales (``demo`` and ``paper``), or the reference CSV lacks
        a value the table needs.
    """
    if table not in MAIN_TABLES:
        raise ValueError(f"table must be one of {MAIN_TABLES}, got {table!r}")
    ref = paper_values(PAPER, table)
    ref = ref[ref["metric"].isin(ROUGE_KEYS)]

    missing_cols = [c for c in SCORE_COLUMNS if c != "paper" and c not in scores.columns]
    if missing_cols:
        raise InputError(f"scores frame lacks column(s) {missing_cols}; build it with "
                         "collect_scores()")
    sel = scores[
        (scores["backbone"] == backbone)
        & scores["method"].isin(ADAFEDSELECKD_METHODS)
        & scores["client"].isin(ADAFEDSELECKD_CLIENTS)
        & scores["metric"].isin(ROUGE_KEYS)
    ]
    if "paper" in sel.columns:
        sel = sel[sel["paper"] == PAPER]
    scales = sorted(sel["scale"].unique())
    if len(scales) > 1:
        raise InputError(f"scores for backbone {backbone!r} mix scales {scales}; "
                         "build one table per scale")
    stats = (
        sel.groupby(["client", "method", "metric"])["value"]
        # pandas' std is the sample std (ddof=1), NaN for a single seed
        .agg(mean="mean", std="std", n="count")
    )

    rows = []
    for client in ADAFEDSELECKD_CLIENTS:
        for method in ADAFEDSELECKD_METHODS:
            setting = METHOD_SETTINGS[method]
            row: dict[str, object] = {"Client": client, "Setting": setting.capitalize(),
                                      "Method": method}
            for key, label in METRIC_LABELS.items():
                hit = ref[(ref["client"] == client) & (ref["method"] == method)
                          & (ref["metric"] == key)]
                if len(hit) != 1:
                    raise InputError(f"reference CSV: expected one {PAPER} {table} value for "
                                     f"{client}/{method}/{key}, found {len(hit)}")
                if (client, method, key) in stats.index:
                    st = stats.loc[(client, method, key)]
                    mean, std, n = float(st["mean"]), float(st["std"]), int(st["n"])
                else:
                    mean, std, n = np.nan, np.nan, 0
                row[f"{label} ours mean"] = mean
                row[f"{label} ours std"] = std
                row[f"{label} n_seeds"] = n
                row[f"{label} paper"] = float(hit["value"].iloc[0])
            rows.append(row)
    df = pd.DataFrame(rows)
    for label in METRIC_LABELS.values():
        for who, col in (("ours", f"{label} ours mean"), ("paper", f"{label} paper")):
            df[f"{label} {who} mark"] = df.groupby("Client", sort=False)[col].transform(_marks)
    ordered = ["Client", "Setting", "Method"]
    for label in METRIC_LABELS.values():
        ordered += metric_columns(label)
    return df[ordered].reset_index(drop=True)


# ----------------------------------------------------------------------------- writers


def _demo_notice() -> str:
    return ("DEMO-SCALE numbers: tiny models trained on generated sample data; "
            "NOT comparable to the paper's numbers.")


def _labels(df: pd.DataFrame) -> list[str]:
    return [lab for lab in METRIC_LABELS.values() if f"{lab} ours mean" in df.columns]


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def _ours_cell(row: pd.Series, label: str, tex: bool) -> str:
    mean, std = row[f"{label} ours mean"], row[f"{label} ours std"]
    if pd.isna(mean):
        return "--" if tex else "—"
    text = _fmt(mean)
    if not pd.isna(std):
        text += (r" $\pm$ " if tex else " ± ") + _fmt(std)
    return text + _mark(row[f"{label} ours mark"], tex)


def _paper_cell(row: pd.Series, label: str, tex: bool) -> str:
    val = row[f"{label} paper"]
    if pd.isna(val):
        return "--" if tex else "—"
    return _fmt(val) + _mark(row[f"{label} paper mark"], tex)


def _mark(mark: str, tex: bool) -> str:
    if not mark:
        return ""
    if tex:
        return r"$^{\dagger\dagger}$" if mark == DOUBLE_DAGGER else r"$^{\dagger}$"
    return " " + mark


def _seeds_cell(row: pd.Series, labels: list[str]) -> str:
    ns = sorted({int(row[f"{lab} n_seeds"]) for lab in labels})
    return "/".join(str(n) for n in ns)


def _tex_escape(text: str) -> str:
    repl = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
            "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
            "^": r"\textasciicircum{}", "±": r"$\pm$", "—": "--"}
    out = "".join(repl.get(ch, ch) for ch in text)
    return out.replace(DOUBLE_DAGGER, r"$^{\dagger\dagger}$").replace(DAGGER, r"$^{\dagger}$")


_LEGEND = ("Ours: mean ± sample std over seeds (no ± when only one seed; — when not run). "
           "† / †† mark the first / second best within each client and metric, computed "
           "separately on our means and on the paper's values. ROUGE F1 in percent.")


def _markdown(df: pd.DataFrame, title: str, scale: str) -> str:
    labels = _labels(df)
    heading = f"{title} (DEMO SCALE)" if scale == "demo" else title
    lines = [f"**{heading}**", ""]
    if scale == "demo":
        lines += [f"> **{_demo_notice()}**", ""]
    header = ["Client", "Setting", "Method"]
    for lab in labels:
        header += [f"{lab} (ours)", f"{lab} (paper)"]
    header.append("seeds")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] * 3 + ["---:"] * (2 * len(labels)) + ["---:"]) + "|")
    prev_client = None
    for _, row in df.iterrows():
        client = row["Client"] if row["Client"] != prev_client else ""
        prev_client = row["Client"]
        cells = [client, row["Setting"], row["Method"]]
        for lab in labels:
            cells += [_ours_cell(row, lab, tex=False), _paper_cell(row, lab, tex=False)]
        cells.append(_seeds_cell(row, labels))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", _LEGEND, ""]
    return "\n".join(lines)


def _latex(df: pd.DataFrame, title: str, scale: str) -> str:
    labels = _labels(df)
    caption = _tex_escape(title.rstrip(". ")) + "."
    if scale == "demo":
        caption += r" \textbf{" + _tex_escape(_demo_notice()) + "}"
    caption += " " + _tex_escape(_LEGEND)
    lines = [
        "% Requires \\usepackage{booktabs}. Generated by fedrepro.papers.adafedseleckd.report.write_table.",
        r"\begin{table}[t]",
        r"\centering",
        r"\caption{" + caption + "}",
        r"\begin{tabular}{lll" + "rr" * len(labels) + "r}",
        r"\toprule",
    ]
    top = [r"\multicolumn{3}{c}{}"]
    rules = []
    for i, lab in enumerate(labels):
        top.append(r"\multicolumn{2}{c}{" + lab + "}")
        start = 4 + 2 * i
        rules.append(rf"\cmidrule(lr){{{start}-{start + 1}}}")
    top.append("")
    lines.append(" & ".join(top) + r" \\")
    lines.append(" ".join(rules))
    sub = ["Client", "Setting", "Method"] + ["Ours", "Paper"] * len(labels) + ["Seeds"]
    lines.append(" & ".join(sub) + r" \\")
    lines.append(r"\midrule")
    prev_client = None
    for _, row in df.iterrows():
        if prev_client is not None and row["Client"] != prev_client:
            lines.append(r"\midrule")
        client = _tex_escape(row["Client"]) if row["Client"] != prev_client else ""
        prev_client = row["Client"]
        cells = [client, _tex_escape(row["Setting"]), _tex_escape(row["Method"])]
        for lab in labels:
            cells += [_ours_cell(row, lab, tex=True), _paper_cell(row, lab, tex=True)]
        cells.append(_seeds_cell(row, labels))
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def write_table(df: pd.DataFrame, out_prefix: str | os.PathLike, title: str, scale: str) -> None:
    """Write a main table as ``{out_prefix}.csv``, ``.md`` and ``.tex`` (each atomically).

    Parameters
    ----------
    df : pandas.DataFrame
        A table from :func:`adafedseleckd_main_table`.
    out_prefix : path-like
        Output path without extension; parent folders are created.
    title : str
        Caption, e.g. ``"Table III (bart-large): ours vs. paper"``.
    scale : {"demo", "paper"}
        Scale of our runs. With ``"demo"`` the markdown and LaTeX captions state that the
        numbers are DEMO-SCALE (tiny models on generated sample data, not comparable to the
        paper).

    Notes
    -----
    The CSV is the machine-readable copy: every column of ``df`` at full precision (marks as
    strings) plus a ``scale`` column. The markdown shows ``27.09 ± 0.31 †`` for ours (no ``±``
    with a single seed) beside ``27.09 †`` for the paper; the LaTeX is a ``booktabs`` tabular
    inside a ``table`` float with the same content and ``$^{\\dagger}$`` marks.

    Raises
    ------
    ValueError
        If ``scale`` is not ``"demo"`` or ``"paper"``.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    out_prefix = Path(out_prefix)
    csv_df = df.copy()
    csv_df["scale"] = scale
    with atomic_path(out_prefix.with_name(out_prefix.name + ".csv"), suffix=".csv") as tmp:
        csv_df.to_csv(tmp, index=False)
    write_text_atomic(out_prefix.with_name(out_prefix.name + ".md"), _markdown(df, title, scale))
    write_text_atomic(out_prefix.with_name(out_prefix.name + ".tex"), _latex(df, title, scale))


def build_adafedseleckd_table(
    score_paths: Iterable[str | os.PathLike],
    backbone: str,
    table: str,
    out_prefix: str | os.PathLike,
    title: str,
    scale: str,
) -> pd.DataFrame:
    """Workflow entry: collect the cells' scores and write one main table (csv, md, tex)."""
    df = adafedseleckd_main_table(collect_scores(score_paths), backbone, table)
    write_table(df, out_prefix, title, scale)
    return df
