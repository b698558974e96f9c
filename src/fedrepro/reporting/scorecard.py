"""The reproduction scorecard: for every paper table the run built, how close our numbers are to
the paper's and whether the paper's *claims* hold in our numbers.

Per table (issue 15):

* **numbers** -- every (client/dataset, method, metric) of our table beside the paper's reported
  number (:mod:`fedrepro.reporting.reference`), outer-joined: a number the paper reports that the
  run did not produce is listed with status ``not run``, one of ours the paper does not report with
  ``not in paper`` -- nothing is dropped silently;
* **error** -- per metric, the mean and the max of ``|ours - paper|`` over the numbers both have;
* **rank** -- per client/dataset and metric, Kendall's tau-b (:func:`scipy.stats.kendalltau`)
  between our ordering of the methods and the paper's (the methods both have);
* **best** -- per client/dataset and metric, does the paper's best method win in our numbers too?
* **headline** -- the paper's own headline gaps (e.g. AdaFedSelectKD - AdaFedAvg, about +1.2
  ROUGE), ours beside the paper's table and the number its text claims.

The reporting layer knows no paper: each paper describes its tables and headline claims
declaratively (:class:`TableSpec`, :class:`Headline`) in ``fedrepro.papers.<paper>.scorecard``,
and ``workflow_scripts/scorecard.py`` passes them in. A table the run built without a spec is an
error (the scorecard covers every table), as is a spec whose columns no longer match the table.

Outputs (:func:`write_scorecard`): ``scorecard.csv`` (long format, one number per row),
``scorecard.md``, ``scorecard.html`` (an HTML fragment, one section per paper and table) and one
figure per paper (ours vs paper, one point per number, the line y = x). At demo scale every output
says in its first line that the numbers come from tiny models on generated data and are not
comparable with the papers'.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from fedrepro.io import InputError, atomic_path, write_text_atomic
from fedrepro.reporting.reference import paper_values

COLUMNS = ("scale", "paper", "table", "title", "section", "group", "method", "metric",
           "statistic", "value", "note")
"""Columns of ``scorecard.csv``: one number per row (``statistic`` says which number)."""

STATUS_OK, STATUS_NOT_RUN, STATUS_NOT_IN_PAPER, STATUS_NEITHER = (
    "ok", "not run", "not in paper", "neither")
"""``numbers`` rows: both have the number / only the paper / only ours / neither (an empty cell of
ours where the paper reports nothing either)."""

DEMO_BANNER = ("DEMO SCALE: tiny models trained on generated data; these numbers are NOT "
               "comparable with the papers'. The scorecard shows the comparison, not a result.")
ALL_GROUPS = "all"
"""``group`` of a per-metric or per-table row."""


@dataclass(frozen=True)
class Columns:
    """Which columns of our table CSV hold our numbers.

    ``pattern`` is a regular expression matched against every column name (full match); its named
    groups ``group`` and ``metric``, when present, give the client/dataset and the metric label.
    Otherwise ``group`` / ``metric`` below are the constants (a group may also come from
    :attr:`TableSpec.group`, the row's own columns)."""

    pattern: str
    group: str | None = None
    metric: str | None = None


@dataclass(frozen=True)
class Reference:
    """Which rows of the reference CSV are a table's paper numbers.

    ``table`` is the reference's table label; ``where`` keeps rows whose column value is one of the
    listed ones; ``rename`` maps reference values to ours (``{column: {reference: ours}}``) before
    the keys are formed; ``group`` are the reference columns joined (``" / "``) into the group key,
    ``method`` the column naming the method (Table VII of AdaFedSelecKD has its rows in
    ``setting``)."""

    table: str
    group: tuple[str, ...] = ("client",)
    method: str = "method"
    where: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rename: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class TableSpec:
    """How to read one of a paper's table CSVs (``results/tables/<paper>_<target>.csv``).

    ``method``: our column naming the method (row); ``group``: our columns joined into the
    client/dataset key (empty when the group comes from the column pattern or a constant);
    ``metrics``: our metric label -> the reference's metric name; ``unranked``: metrics that are
    costs, not scores (no rank, no best); ``best_among``: the methods that compete for "best"
    (empty: all); ``scored=False`` for a table without numbers (a case study), with ``note``."""

    paper: str
    target: str
    title: str
    method: str = "Method"
    columns: tuple[Columns, ...] = ()
    reference: tuple[Reference, ...] = ()
    group: tuple[str, ...] = ()
    metrics: Mapping[str, str] = field(default_factory=dict)
    unranked: tuple[str, ...] = ()
    best_among: tuple[str, ...] = ()
    scored: bool = True
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.paper}_{self.target}"


@dataclass(frozen=True)
class Headline:
    """One headline claim: ``better - worse`` on ``metrics`` of table ``target`` (mean over the
    listed ``groups``, all groups when empty, and over the metrics), the gap the text claims
    (``claimed``; ``None`` where the text gives no number) and where the text says so."""

    paper: str
    target: str
    better: str
    worse: str
    metrics: tuple[str, ...]
    source: str
    claimed: float | None = None
    groups: tuple[str, ...] = ()
    claim: str = ""

    @property
    def name(self) -> str:
        return f"{self.better} − {self.worse}"


# -- reading -------------------------------------------------------------------------------------
def our_numbers(spec: TableSpec, table: pd.DataFrame, source: str = "table") -> pd.DataFrame:
    """Our numbers of one table in long form: ``group, method, metric, ours`` (``ours`` NaN for an
    empty cell). Raises :class:`InputError` naming ``source`` when the spec does not fit."""
    if spec.method not in table.columns:
        raise InputError(f"{source}: no column {spec.method!r} (the methods of {spec.key}); "
                         f"columns: {list(table.columns)}")
    missing = [c for c in spec.group if c not in table.columns]
    if missing:
        raise InputError(f"{source}: no column(s) {missing} (the groups of {spec.key})")
    rules = [(re.compile(c.pattern), c) for c in spec.columns]
    matched: list[tuple[str, re.Match, Columns]] = []
    for col in table.columns:
        for rx, rule in rules:
            m = rx.fullmatch(str(col))
            if m:
                matched.append((col, m, rule))
                break
    if not matched:
        raise InputError(f"{source}: none of its columns match the scorecard spec of {spec.key} "
                         f"({[c.pattern for c in spec.columns]}); did the table's format change? "
                         f"Update fedrepro.papers.{spec.paper}.scorecard")
    rows = []
    for _, row in table.iterrows():
        for col, m, rule in matched:
            named = m.groupdict()
            if named.get("group") is not None:
                group = named["group"]
            elif spec.group:
                group = " / ".join(str(row[c]) for c in spec.group)
            elif rule.group is not None:
                group = rule.group
            else:
                raise InputError(f"scorecard spec of {spec.key}: column {col!r} has no group "
                                 "(give Columns.group, TableSpec.group or a (?P<group>) pattern)")
            metric = named.get("metric") or rule.metric
            if metric is None:
                raise InputError(f"scorecard spec of {spec.key}: column {col!r} has no metric")
            rows.append({"group": group, "method": str(row[spec.method]),
                         "metric": spec.metrics.get(metric, metric),
                         "ours": pd.to_numeric(row[col], errors="coerce")})
    out = pd.DataFrame(rows, columns=["group", "method", "metric", "ours"])
    dup = out[out.duplicated(["group", "method", "metric"], keep=False)]
    if not dup.empty:
        raise InputError(f"{source}: the numbers {dup[['group', 'method', 'metric']].values.tolist()} "
                         f"appear more than once under the scorecard spec of {spec.key}")
    return out


def reported_numbers(spec: TableSpec, reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """The paper's numbers of one table: ``group, method, metric, reported``. ``reference`` (the
    long reference frame) defaults to the packaged file (:func:`paper_values`)."""
    parts = []
    for ref in spec.reference:
        if reference is None:
            df = paper_values(spec.paper, ref.table)
        else:
            df = reference[(reference["paper"] == spec.paper) & (reference["table"] == ref.table)]
            if df.empty:
                raise InputError(f"{spec.paper}: table {ref.table!r} not in the reference results")
        df = df.copy()
        for col, allowed in ref.where.items():
            df = df[df[col].isin(list(allowed))]
        for col, mapping in ref.rename.items():
            df[col] = df[col].map(lambda v, m=mapping: m.get(v, v))
        parts.append(pd.DataFrame({
            "group": df[list(ref.group)].astype(str).agg(" / ".join, axis=1),
            "method": df[ref.method].astype(str),
            "metric": df["metric"].astype(str),
            "reported": df["value"].astype(float),
        }))
    if not parts:
        return pd.DataFrame(columns=["group", "method", "metric", "reported"])
    out = pd.concat(parts, ignore_index=True)
    dup = out[out.duplicated(["group", "method", "metric"], keep=False)]
    if not dup.empty:
        raise InputError(f"scorecard spec of {spec.key}: the reference selections give "
                         f"{dup[['group', 'method', 'metric']].values.tolist()} more than once")
    return out


def pair_numbers(ours: pd.DataFrame, reported: pd.DataFrame) -> pd.DataFrame:
    """Outer join of ours and the paper's: ``group, method, metric, ours, reported, diff,
    status`` (status: :data:`STATUS_OK`, ``not run``, ``not in paper``, ``neither``)."""
    df = ours.merge(reported, on=["group", "method", "metric"], how="outer", sort=False)
    has_ours, has_paper = df["ours"].notna(), df["reported"].notna()
    df["status"] = np.select(
        [has_ours & has_paper, has_paper, has_ours],
        [STATUS_OK, STATUS_NOT_RUN, STATUS_NOT_IN_PAPER], STATUS_NEITHER)
    df["diff"] = df["ours"] - df["reported"]
    return df[["group", "method", "metric", "ours", "reported", "diff", "status"]]


# -- statistics ----------------------------------------------------------------------------------
def error_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per metric: ``n`` numbers both have, ``mean_abs_diff`` and ``max_abs_diff`` of
    ``|ours - paper|``, ``mean_diff`` (ours - paper) and how many are ``not_run``/``not_in_paper``."""
    rows = []
    for metric, g in pairs.groupby("metric", sort=False):
        ok = g[g["status"] == STATUS_OK]
        a = ok["diff"].abs()
        rows.append({"metric": metric, "n": len(ok),
                     "mean_abs_diff": a.mean() if len(ok) else math.nan,
                     "max_abs_diff": a.max() if len(ok) else math.nan,
                     "mean_diff": ok["diff"].mean() if len(ok) else math.nan,
                     "not_run": int((g["status"] == STATUS_NOT_RUN).sum()),
                     "not_in_paper": int((g["status"] == STATUS_NOT_IN_PAPER).sum())})
    return pd.DataFrame(rows, columns=["metric", "n", "mean_abs_diff", "max_abs_diff",
                                       "mean_diff", "not_run", "not_in_paper"])


def rank_agreement(pairs: pd.DataFrame, unranked: Sequence[str] = (),
                   best_among: Sequence[str] = ()) -> pd.DataFrame:
    """Per (group, metric): Kendall's tau-b between our and the paper's values of the methods
    both have (``n_methods`` of them), and whether the paper's best method is ours too.

    ``paper_best``: the method with the paper's highest number among ``best_among`` (all methods
    when empty); ``our_best``: ours, among the same methods that we ran; ``best_wins``: 1.0 when
    the paper's best has our highest number (a tie at the top counts, and is noted), 0.0 when not,
    NaN when we did not run it. ``tau`` is NaN (noted) with fewer than two methods or when one side
    is constant."""
    rows = []
    for (group, metric), g in pairs.groupby(["group", "metric"], sort=False):
        if metric in unranked:
            continue
        ok = g[g["status"] == STATUS_OK]
        notes = []
        tau = p = math.nan
        if len(ok) < 2:
            notes.append("fewer than two methods in both")
        elif ok["ours"].nunique() < 2 or ok["reported"].nunique() < 2:
            notes.append("tau undefined: one side is constant")
        else:
            res = kendalltau(ok["ours"].to_numpy(), ok["reported"].to_numpy())
            tau, p = float(res.statistic), float(res.pvalue)
        cand = g[g["method"].isin(best_among)] if best_among else g
        paper_side = cand[cand["reported"].notna()]
        paper_best = our_best = ""
        wins = math.nan
        if paper_side.empty:
            notes.append("the paper reports none of these methods")
        else:
            top = paper_side["reported"].max()
            paper_best = " = ".join(paper_side.loc[paper_side["reported"] == top, "method"])
            ours_side = cand[cand["ours"].notna()]
            if not ours_side.empty:
                our_top = ours_side["ours"].max()
                leaders = list(ours_side.loc[ours_side["ours"] == our_top, "method"])
                our_best = " = ".join(leaders)
                if len(leaders) > 1:
                    notes.append(f"our top is a tie of {len(leaders)}")
            best_rows = paper_side[paper_side["reported"] == top]
            ran = best_rows[best_rows["ours"].notna()]
            if ran.empty:
                notes.append("the paper's best was not run")
            else:
                wins = float((ran["ours"] == ours_side["ours"].max()).any())
        rows.append({"group": group, "metric": metric, "n_methods": len(ok), "tau": tau,
                     "p_value": p, "paper_best": paper_best, "our_best": our_best,
                     "best_wins": wins, "note": "; ".join(notes)})
    return pd.DataFrame(rows, columns=["group", "metric", "n_methods", "tau", "p_value",
                                       "paper_best", "our_best", "best_wins", "note"])


def headline_gap(pairs: pd.DataFrame, headline: Headline) -> dict:
    """``ours_gap`` and ``paper_gap``: the mean over (group, metric) of ``better - worse``, over
    the pairs where each side has both methods (``n_ours`` / ``n_paper`` of them)."""
    sel = pairs[pairs["metric"].isin(headline.metrics)]
    if headline.groups:
        sel = sel[sel["group"].isin(headline.groups)]
    out = {}
    for side, col in (("ours", "ours"), ("paper", "reported")):
        wide = sel.set_index(["group", "metric", "method"])[col].unstack("method")
        if headline.better in wide and headline.worse in wide:
            d = (wide[headline.better] - wide[headline.worse]).dropna()
        else:
            d = pd.Series(dtype=float)
        out[f"{side}_gap"] = float(d.mean()) if len(d) else math.nan
        out[f"n_{side}"] = len(d)
    return out


# -- one table, all tables -----------------------------------------------------------------------
def score_table(spec: TableSpec, table: pd.DataFrame | None, headlines: Iterable[Headline] = (),
                scale: str = "demo", source: str = "table",
                reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """The long scorecard rows (:data:`COLUMNS`) of one table; ``table`` is our CSV read with
    pandas (``None`` for an unscored table)."""
    rows: list[dict] = []

    def add(section, group, method, metric, statistic, value, note=""):
        rows.append({"scale": scale, "paper": spec.paper, "table": spec.target,
                     "title": spec.title, "section": section, "group": group, "method": method,
                     "metric": metric, "statistic": statistic, "value": value, "note": note})

    if not spec.scored:
        add("table", ALL_GROUPS, "", "", "scored", 0.0, spec.note or "no numbers to compare")
        return pd.DataFrame(rows, columns=list(COLUMNS))
    if table is None:
        raise InputError(f"scorecard: {spec.key} is scored but no table was given")
    pairs = pair_numbers(our_numbers(spec, table, source), reported_numbers(spec, reference))
    add("table", ALL_GROUPS, "", "", "scored", 1.0,
        spec.note or ("" if spec.reference else "the paper reports no numbers for this table"))
    for r in pairs.itertuples(index=False):
        for stat, value in (("ours", r.ours), ("paper", r.reported), ("diff", r.diff)):
            add("numbers", r.group, r.method, r.metric, stat, value, r.status)
    for r in error_summary(pairs).itertuples(index=False):
        for stat in ("n", "mean_abs_diff", "max_abs_diff", "mean_diff", "not_run", "not_in_paper"):
            add("error", ALL_GROUPS, "", r.metric, stat, float(getattr(r, stat)))
    for r in rank_agreement(pairs, spec.unranked, spec.best_among).itertuples(index=False):
        add("rank", r.group, "", r.metric, "kendall_tau", r.tau, r.note)
        add("rank", r.group, "", r.metric, "p_value", r.p_value)
        add("rank", r.group, "", r.metric, "n_methods", float(r.n_methods))
        add("best", r.group, r.paper_best, r.metric, "paper_best_wins", r.best_wins,
            f"our best: {r.our_best or '-'}")
    for h in headlines:
        if (h.paper, h.target) != (spec.paper, spec.target):
            continue
        gap = headline_gap(pairs, h)
        group = " + ".join(h.groups) if h.groups else ALL_GROUPS
        metric = " + ".join(h.metrics)
        note = f"{h.source}: {h.claim}" if h.claim else h.source
        add("headline", group, h.name, metric, "ours_gap", gap["ours_gap"], f"n={gap['n_ours']}")
        add("headline", group, h.name, metric, "paper_gap", gap["paper_gap"],
            f"n={gap['n_paper']}")
        add("headline", group, h.name, metric, "claimed_gap",
            math.nan if h.claimed is None else float(h.claimed), note)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def table_key(path: str | Path) -> str:
    """``<paper>_<target>`` of a table file ``.../<paper>_<target>.csv``."""
    return Path(path).name.removesuffix(".csv")


def build_scorecard(tables: Sequence[str | Path], specs: Iterable[TableSpec],
                    headlines: Iterable[Headline] = (), scale: str = "demo",
                    reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """The scorecard of every table in ``tables`` (CSV paths named ``<paper>_<target>.csv``).

    Raises :class:`InputError` for a table without a spec (the scorecard must cover every table
    the run built) and for a headline naming a table no spec has."""
    by_key = {s.key: s for s in specs}
    headlines = list(headlines)
    unknown = [f"{h.paper}_{h.target}" for h in headlines if f"{h.paper}_{h.target}" not in by_key]
    if unknown:
        raise InputError(f"scorecard headlines name tables without a spec: {unknown}")
    frames = []
    for path in tables:
        key = table_key(path)
        if key not in by_key:
            raise InputError(f"{path}: no scorecard spec for table {key!r}; add a TableSpec to "
                             "the paper's scorecard module (fedrepro.papers.<paper>.scorecard)")
        spec = by_key[key]
        frame = pd.read_csv(path, keep_default_na=True) if spec.scored else None
        frames.append(score_table(spec, frame, headlines, scale, str(path), reference))
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.concat(frames, ignore_index=True)


# -- rendering -----------------------------------------------------------------------------------
def _fmt(v) -> str:
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:.2f}"
    return str(v)


def _wide(rows: pd.DataFrame, index: list[str]) -> pd.DataFrame:
    """``rows`` with one column per statistic (NaN values kept, no cross product of the keys)."""
    return rows.set_index([*index, "statistic"])["value"].unstack("statistic").reindex(
        pd.MultiIndex.from_frame(rows[index].drop_duplicates()))


def _views(card: pd.DataFrame) -> list[tuple[str, str, str, dict[str, pd.DataFrame]]]:
    """``(paper, table, title, {view name: frame})`` per table, in card order."""
    out = []
    for (paper, table), t in card.groupby(["paper", "table"], sort=False):
        title = t["title"].iloc[0]
        views: dict[str, pd.DataFrame] = {}
        status = t[t["section"] == "table"].iloc[0]
        if status["value"] == 0.0:
            views["not scored"] = pd.DataFrame({"note": [status["note"]]})
            out.append((paper, table, title, views))
            continue
        if status["note"]:
            views["note"] = pd.DataFrame({"note": [status["note"]]})
        err = t[t["section"] == "error"].pivot_table(index="metric", columns="statistic",
                                                      values="value", sort=False)
        err = err.reindex(columns=["n", "mean_abs_diff", "max_abs_diff", "mean_diff", "not_run",
                                   "not_in_paper"])
        for col in ("n", "not_run", "not_in_paper"):
            err[col] = err[col].astype("Int64")
        views["|ours − paper| per metric"] = err.rename_axis(columns=None).reset_index()
        rank = t[t["section"] == "rank"]
        if not rank.empty:
            tau = rank[rank["statistic"] == "kendall_tau"].set_index(["group", "metric"])
            n = rank[rank["statistic"] == "n_methods"].set_index(["group", "metric"])["value"]
            best = t[t["section"] == "best"].set_index(["group", "metric"])
            views["rank agreement and best method"] = pd.DataFrame({
                "n methods": n.astype("Int64"), "Kendall tau": tau["value"], "paper's best": best["method"],
                "wins here": best["value"].map(
                    lambda v: "–" if pd.isna(v) else ("yes" if v == 1.0 else "no")),
                "ours": best["note"].str.removeprefix("our best: "),
                "note": tau["note"]}).reset_index()
        head = t[t["section"] == "headline"]
        if not head.empty:
            h = _wide(head, ["method", "group", "metric"])
            src = head[head["statistic"] == "claimed_gap"].set_index(
                ["method", "group", "metric"])["note"]
            h = h.reindex(columns=["ours_gap", "paper_gap", "claimed_gap"])
            h["source"] = src
            views["headline gaps"] = (h.rename_axis(columns=None).reset_index()
                                      .rename(columns={"method": "gap"}))
        nums = t[t["section"] == "numbers"]
        wide = _wide(nums, ["group", "method", "metric"])
        st = nums[nums["statistic"] == "ours"].set_index(["group", "method", "metric"])["note"]
        wide = wide.reindex(columns=["ours", "paper", "diff"])
        wide["status"] = st
        views["every number"] = wide.rename_axis(columns=None).reset_index()
        out.append((paper, table, title, views))
    return out


def render_markdown(card: pd.DataFrame, scale: str) -> str:
    """The scorecard as Markdown: a banner at demo scale, one section per paper and table."""
    lines = ["# Reproduction scorecard", ""]
    if scale == "demo":
        lines += [f"**{DEMO_BANNER}**", ""]
    lines += [(f"Scale: `{scale}`. Numbers: ours (results/tables) beside the paper's "
               "(fedrepro/resources/paper_results.csv); gaps in the tables' units."), ""]
    current = None
    for paper, table, title, views in _views(card):
        if paper != current:
            lines += [f"## {paper}", ""]
            current = paper
        lines += [f"### {paper}_{table}: {title}", ""]
        for name, frame in views.items():
            lines += [f"**{name}**", "", frame.map(_fmt).to_markdown(index=False), ""]
    return "\n".join(lines) + "\n"


def render_html(card: pd.DataFrame, scale: str) -> str:
    """The scorecard as an HTML fragment (no ``<html>``/``<body>``): a banner at demo scale, one
    ``<section>`` per paper, one per table; the long list of numbers folded in ``<details>``."""
    parts = ['<div class="fedrepro-scorecard">', "<h1>Reproduction scorecard</h1>"]
    if scale == "demo":
        parts.append(f'<p class="demo-banner"><strong>{html.escape(DEMO_BANNER)}</strong></p>')
    parts.append(f"<p>Scale: <code>{html.escape(scale)}</code>. Ours (results/tables) beside the "
                 "paper's (fedrepro/resources/paper_results.csv).</p>")
    current = None
    for paper, table, title, views in _views(card):
        if paper != current:
            if current is not None:
                parts.append("</section>")
            parts.append(f'<section class="paper" id="scorecard-{html.escape(paper)}">'
                         f"<h2>{html.escape(paper)}</h2>")
            current = paper
        parts.append(f'<section class="table" id="scorecard-{html.escape(paper)}-'
                     f'{html.escape(table)}"><h3>{html.escape(f"{paper}_{table}")}: '
                     f"{html.escape(title)}</h3>")
        for name, frame in views.items():
            body = frame.map(_fmt).to_html(index=False, border=0, classes="scorecard",
                                           escape=True)
            if name == "every number":
                parts.append(f"<details><summary>{html.escape(name)} ({len(frame)})</summary>"
                             f"{body}</details>")
            else:
                parts.append(f"<h4>{html.escape(name)}</h4>{body}")
        parts.append("</section>")
    if current is not None:
        parts.append("</section>")
    parts.append("</div>")
    return "\n".join(parts) + "\n"


def plot_paper(card: pd.DataFrame, paper: str, out: str | Path, scale: str) -> int:
    """One figure for ``paper``: ours (y) vs the paper's (x), one point per number both have,
    coloured by table, with the line y = x. Returns the number of points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nums = card[(card["paper"] == paper) & (card["section"] == "numbers")
                & (card["note"] == STATUS_OK)]
    wide = nums.pivot_table(index=["table", "group", "method", "metric"], columns="statistic",
                            values="value", sort=False)
    fig, ax = plt.subplots(figsize=(5.5, 5.0))
    n = 0
    if not wide.empty:
        for table, g in wide.groupby(level="table", sort=False):
            ax.scatter(g["paper"], g["ours"], s=14, alpha=0.75, label=table)
            n += len(g)
        lo = float(min(wide["paper"].min(), wide["ours"].min()))
        hi = float(max(wide["paper"].max(), wide["ours"].max()))
        pad = 0.05 * (hi - lo or 1.0)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", lw=1, ls="--",
                label="y = x")
        ax.legend(fontsize=7, loc="best")
    else:
        ax.text(0.5, 0.5, "no number both we and the paper have", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("paper")
    ax.set_ylabel("ours")
    title = f"{paper}: ours vs paper ({n} numbers)"
    if scale == "demo":
        title += "\nDEMO: tiny models, generated data — not comparable"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    with atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return n


def write_scorecard(card: pd.DataFrame, scale: str, csv: str | Path, md: str | Path,
                    html_out: str | Path, figures: Mapping[str, str | Path]) -> None:
    """Write ``card`` as CSV, Markdown, an HTML fragment and one figure per paper (``figures``:
    paper -> PNG path; a paper without a table in ``card`` gets a figure saying so)."""
    with atomic_path(csv, suffix=".csv") as tmp:
        card.to_csv(tmp, index=False)
    write_text_atomic(md, render_markdown(card, scale))
    write_text_atomic(html_out, render_html(card, scale))
    for paper, path in figures.items():
        plot_paper(card, paper, path, scale)
