"""FedSum's tables and figures (Tables 1-4, the appendix's WikiHow and Reddit tables, Figs. 3-5)
from the cells' per-round ROUGE records, with the paper's numbers beside ours.

Per cell, :func:`write_cell_scores` picks the reported round (FedSum §5.1: "We report the most
optimal testing records (with better R-R-1 values) among different communication rounds") and
writes ``scores.json`` (all six numbers of that round, and every round's) and the round's
extracted sentences (``predictions.jsonl``).  The tables average the reported records over the
runs (seeds; the paper: "the average of the results over 3 repeated experiments").

The paper's numbers come from :func:`fedrepro.reporting.reference.load_paper_results` (Tables 1-4;
the appendix tables' numbers are not in the paper's text, so those tables show ours only; Table 3's
Dir = 0.1 column is Table 1's R-R, and Table 4's FedAvg and "+ Two Extensions" rows are Table 1's
FedAvg and FedSum, as the paper's Table 4 repeats them).  Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.io import InputError, atomic_path, read_json, read_jsonl, write_text_atomic
from fedrepro.papers.fedsum.scores import METRICS, reported_round, write_cell_scores  # noqa: F401
from fedrepro.reporting.reference import load_paper_results

LABELS = {
    "rouge1_f1": "R-F-1",
    "rouge2_f1": "R-F-2",
    "rougeL_f1": "R-F-L",
    "rouge1_recall": "R-R-1",
    "rouge2_recall": "R-R-2",
    "rougeL_recall": "R-R-L",
}
RECALL = METRICS[3:]
METHOD_ORDER = (
    "Separate",
    "FedAvg",
    "FedProx",
    "SCAFFOLD",
    "FedDC",
    "FedNova",
    "FedProto",
    "FedSum",
)
"""Table 1's row order."""
PAPER_NAMES = {"SCAFFOLD": "Scaffold", "FedSum-depth": "FedAvg + depth extension"}
ABLATION_NAMES = {
    "FedAvg": "FedAvg",
    "FedSum-depth": "+ Depth Extension",
    "FedSum": "+ Two Extensions",
}
DATASET_NAMES = {
    "cnndm": "CNNDM",
    "pubmed": "PubMed",
    "wikihow": "WikiHow",
    "reddit_tifu": "Reddit",
}
PAPER_TABLE = {"table1": "Table 1", "table2": "Table 2"}
TITLES = {
    "table1": "FedSum Table 1: CNN/DM, Dir = {alpha} (R-F and R-R 1/2/L)",
    "table2": "FedSum Table 2: PubMed, Dir = {alpha} (R-F and R-R 1/2/L)",
    "table_wikihow": "FedSum appendix: WikiHow, Dir = {alpha} (R-F and R-R 1/2/L)",
    "table_reddit": "FedSum appendix: Reddit TIFU, Dir = {alpha} (R-F and R-R 1/2/L)",
    "table3": "FedSum Table 3: R-R 1/2/L on CNN/DM under different Dir",
    "table4": "FedSum Table 4: ablation on CNN/DM, Dir = {alpha} (FedAvg + depth / + both extensions)",
    "figure3": "FedSum Fig. 3: ROUGE recall vs. total training examples, FedSum (solid) vs. FedAvg (dotted)",
    "figure4": "FedSum Fig. 4: positions of the extracted sentences, FedSum / FedAvg / Oracle",
    "figure5": "FedSum Fig. 5: ROUGE of FedSum vs. λ",
}
SCALES = ("demo", "paper")
SCORER_NOTES = {
    "rouge": (
        "ROUGE scorer: {version} (pltrdy), as the FedSum code scores: no stemming, distinct n-grams, "
        "PTB-tokenised lower-cased text, sentences joined by `<q>`, summary-level ROUGE-L."
    ),
    "rouge-score": (
        "ROUGE scorer: {version} (Google), Porter stemmer, ROUGE-L over the whole summary."
    ),
}
"""What each ROUGE scorer (``fedsum.eval.rouge_scorer``) computes, for the table notes."""


def _fmt_alpha(alpha) -> str:
    a = float(alpha)
    return "∞" if math.isinf(a) else f"{a:g}"


# -- collecting ------------------------------------------------------------------------------------
def collect(score_paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """One row per cell: run (method dir), method, dataset, alpha, total, lam, seed, round, metrics."""
    rows = []
    for path in score_paths:
        s = read_json(path)
        if s.get("paper") != "fedsum" or "metrics" not in s:
            raise InputError(f"{path}: not a FedSum scores file (needs paper: fedsum and metrics)")
        alpha = math.inf if str(s["alpha"]) == "inf" else float(s["alpha"])
        rows.append(
            {
                "run": s["run"],
                "method": s["method"],
                "setting": s["setting"],
                "dataset": s["dataset"],
                "alpha": alpha,
                "total": int(s["total"]),
                "lam": s.get("lam"),
                "seed": int(s["seed"]),
                "round": int(s["round"]),
                # scores written before the scorer was recorded used rouge-score
                "rouge_scorer": s.get("rouge_scorer", "rouge-score"),
                "rouge_scorer_version": s.get(
                    "rouge_scorer_version", s.get("rouge_scorer", "rouge-score")
                ),
                **{m: float(s["metrics"][m]) for m in METRICS},
            }
        )
    if not rows:
        raise InputError("no FedSum scores given")
    return pd.DataFrame(rows)


def scorer_of(scores: pd.DataFrame) -> tuple[str, str]:
    """(scorer, scorer with version) of the collected cells; cells scored differently cannot
    share a table (an error naming the scorers)."""
    found = sorted(set(zip(scores.rouge_scorer, scores.rouge_scorer_version)))
    if len(found) != 1:
        raise InputError(
            f"FedSum cells scored with different ROUGE scorers {found}: rerun them with one "
            f"fedsum.eval.rouge_scorer"
        )
    return found[0]


def _mean_std(values: pd.Series) -> tuple[float, float]:
    v = values.dropna()
    return (float(v.mean()) if len(v) else np.nan, float(v.std(ddof=1)) if len(v) > 1 else np.nan)


def _paper_value(
    paper: pd.DataFrame, table: str, dataset: str, alpha: float, method: str, metric: str
) -> float:
    ref = paper[
        (paper.table == table)
        & (paper.client == DATASET_NAMES.get(dataset, dataset))
        & (paper.setting == f"dir={_fmt_alpha(alpha)}")
        & (paper.method == method)
        & (paper.metric == metric)
    ]
    return float(ref.value.iloc[0]) if len(ref) else np.nan


def _paper() -> pd.DataFrame:
    df = load_paper_results()
    return df[df.paper == "fedsum"]


def _marks(values: pd.Series) -> pd.Series:
    ranks = values.round(2).rank(ascending=False, method="min", na_option="keep")
    return ranks.map(lambda r: "†" if r == 1 else "††" if r == 2 else "")


# -- tables ----------------------------------------------------------------------------------------
def main_table(scores: pd.DataFrame, target: str, dataset: str, alpha: float) -> pd.DataFrame:
    """Tables 1, 2 and the appendix tables: R-F and R-R per method (mean ± std over runs)."""
    paper = _paper()
    rows = []
    methods = [m for m in METHOD_ORDER if m in set(scores.method)] + sorted(
        set(scores.method) - set(METHOD_ORDER)
    )
    for m in methods:
        sub = scores[scores.method == m]
        row = {
            "Method": PAPER_NAMES.get(m, m),
            "key": m,
            "runs": int(sub.seed.nunique()),
            "rounds": ",".join(str(r) for r in sub["round"]),
        }
        for metric in METRICS:
            mean, std = _mean_std(sub[metric])
            row[f"{LABELS[metric]} ours mean"], row[f"{LABELS[metric]} ours std"] = mean, std
            row[f"{LABELS[metric]} paper"] = _paper_value(
                paper, PAPER_TABLE.get(target, ""), dataset, alpha, PAPER_NAMES.get(m, m), metric
            )
        rows.append(row)
    df = pd.DataFrame(rows)
    for metric in METRICS:
        df[f"{LABELS[metric]} ours mark"] = _marks(df[f"{LABELS[metric]} ours mean"])
        df[f"{LABELS[metric]} paper mark"] = _marks(df[f"{LABELS[metric]} paper"])
    return df


def table3(scores: pd.DataFrame, alphas: list[float]) -> pd.DataFrame:
    """R-R 1/2/L per method and Dir; the paper's Dir = 0.1 numbers are Table 1's."""
    paper = _paper()
    rows = []
    methods = [m for m in METHOD_ORDER if m in set(scores.method)]
    for m in methods:
        row = {"Method": PAPER_NAMES.get(m, m), "key": m}
        for a in alphas:
            sub = scores[(scores.method == m) & (scores.alpha == float(a))]
            row[f"Dir={_fmt_alpha(a)} runs"] = int(sub.seed.nunique())
            for metric in RECALL:
                col = f"Dir={_fmt_alpha(a)} {LABELS[metric]}"
                row[f"{col} ours mean"], row[f"{col} ours std"] = _mean_std(sub[metric])
                table = "Table 1" if math.isclose(float(a), 0.1) else "Table 3"
                row[f"{col} paper"] = _paper_value(
                    paper, table, "cnndm", a, PAPER_NAMES.get(m, m), metric
                )
        rows.append(row)
    df = pd.DataFrame(rows)
    for a in alphas:
        for metric in RECALL:
            col = f"Dir={_fmt_alpha(a)} {LABELS[metric]}"
            df[f"{col} ours mark"] = _marks(df[f"{col} ours mean"])
            df[f"{col} paper mark"] = _marks(df[f"{col} paper"])
    return df


def table4(scores: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """FedAvg, + depth, + both extensions; improvement over FedAvg (ours and the paper's)."""
    paper = _paper()
    sources = {
        "FedAvg": ("Table 1", "FedAvg"),
        "FedSum-depth": ("Table 4", "FedAvg + depth extension"),
        "FedSum": ("Table 1", "FedSum"),
    }
    rows = []
    for m in ("FedAvg", "FedSum-depth", "FedSum"):
        sub = scores[scores.method == m]
        row = {"Method": ABLATION_NAMES[m], "key": m, "runs": int(sub.seed.nunique())}
        for metric in METRICS:
            row[f"{LABELS[metric]} ours mean"], row[f"{LABELS[metric]} ours std"] = _mean_std(
                sub[metric]
            )
            table, name = sources[m]
            row[f"{LABELS[metric]} paper"] = _paper_value(
                paper, table, "cnndm", alpha, name, metric
            )
        rows.append(row)
    df = pd.DataFrame(rows)
    for metric in METRICS:
        for who in ("ours mean", "paper"):
            col = f"{LABELS[metric]} {who}"
            df[f"{LABELS[metric]} {who.split()[0]} improvement"] = (
                df[col] - df.loc[df.key == "FedAvg", col].iloc[0]
            )
        df[f"{LABELS[metric]} ours mark"] = ""
        df[f"{LABELS[metric]} paper mark"] = ""
    return df


def _cell(mean: float, std: float = np.nan, mark: str = "") -> str:
    if pd.isna(mean):
        return "—"
    text = f"{mean:.2f}" + (f" ± {std:.2f}" if not pd.isna(std) else "")
    return text + (f" {mark}" if mark else "")


def _notice(scale: str) -> list[str]:
    if scale == "demo":
        return [
            (
                "> **DEMO-SCALE numbers: a tiny random BERT trained on a few sample documents; NOT "
                "comparable to the paper's numbers.**"
            ),
            "",
        ]
    return []


def _groups(df: pd.DataFrame) -> list[str]:
    """Column groups present (``R-F-1`` or ``Dir=0.5 R-R-1`` …), in table order."""
    return [c[: -len(" ours mean")] for c in df.columns if c.endswith(" ours mean")]


def markdown(df: pd.DataFrame, title: str, scale: str, note: str) -> str:
    groups = _groups(df)
    lines = [f"**{title}{' (DEMO SCALE)' if scale == 'demo' else ''}**", ""] + _notice(scale)
    header = ["Method"] + [f"{g} (ours)" for g in groups] + [f"{g} (paper)" for g in groups]
    improvement = [g for g in groups if f"{g} ours improvement" in df]
    header += [f"{g} Δ ours / paper" for g in improvement]
    if "runs" in df:
        header.append("runs")
    lines += [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    for _, r in df.iterrows():
        cells = [str(r.Method)]
        cells += [
            _cell(r[f"{g} ours mean"], r[f"{g} ours std"], r.get(f"{g} ours mark", ""))
            for g in groups
        ]
        cells += [_cell(r[f"{g} paper"], np.nan, r.get(f"{g} paper mark", "")) for g in groups]
        cells += [
            f"{_cell(r[f'{g} ours improvement'])} / {_cell(r[f'{g} paper improvement'])}"
            for g in improvement
        ]
        if "runs" in df:
            cells.append(str(r.runs))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", note, ""]
    return "\n".join(lines)


def latex(df: pd.DataFrame, title: str, scale: str) -> str:
    groups = _groups(df)

    def tex(text: str) -> str:
        return (
            str(text)
            .replace("±", r"$\pm$")
            .replace("††", r"$^{\dagger\dagger}$")
            .replace("†", r"$^{\dagger}$")
            .replace("—", "--")
            .replace("_", r"\_")
            .replace("&", r"\&")
            .replace("∞", r"$\infty$")
            .replace("%", r"\%")
        )

    caption = tex(title) + (
        r" \textbf{DEMO SCALE: not comparable to the paper.}" if scale == "demo" else ""
    )
    lines = [
        "% Requires \\usepackage{booktabs}. Generated by fedrepro.papers.fedsum.report.",
        r"\begin{table}[t]",
        r"\centering",
        r"\caption{" + caption + "}",
        r"\resizebox{\textwidth}{!}{",
        r"\begin{tabular}{l" + "rr" * len(groups) + "}",
        r"\toprule",
        " & ".join([""] + [r"\multicolumn{2}{c}{" + tex(g) + "}" for g in groups]) + r" \\",
        " & ".join(["Method"] + ["Ours", "Paper"] * len(groups)) + r" \\",
        r"\midrule",
    ]
    for _, r in df.iterrows():
        cells = [tex(r.Method)]
        for g in groups:
            cells += [
                tex(_cell(r[f"{g} ours mean"], r[f"{g} ours std"], r.get(f"{g} ours mark", ""))),
                tex(_cell(r[f"{g} paper"], np.nan, r.get(f"{g} paper mark", ""))),
            ]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}}", r"\end{table}", ""]
    return "\n".join(lines)


NOTE = (
    "ROUGE (%) of the reported round (best R-R-1 over the communication rounds, FedSum §5.1), "
    "mean ± sample std over runs (no ± with one run). R-F = F1, R-R = recall. † / †† = best / second "
    "best per column, on ours and on the paper's separately. — = not reported in the paper's text."
)


def write_table(
    df: pd.DataFrame, out_prefix: str | os.PathLike, title: str, scale: str, note: str = NOTE
) -> None:
    if scale not in SCALES:
        raise InputError(f"scale must be one of {SCALES}, got {scale!r}")
    out_prefix = Path(out_prefix)
    csv_df = df.copy()
    csv_df["scale"] = scale
    with atomic_path(out_prefix.with_name(out_prefix.name + ".csv"), suffix=".csv") as tmp:
        csv_df.to_csv(tmp, index=False)
    write_text_atomic(
        out_prefix.with_name(out_prefix.name + ".md"), markdown(df, title, scale, note)
    )
    write_text_atomic(out_prefix.with_name(out_prefix.name + ".tex"), latex(df, title, scale))


def build_table(
    target: str, score_paths: list[str], out_prefix: str, scale: str, options: Mapping
) -> pd.DataFrame:
    """Workflow entry for every ``fedsum_table*`` target; ``options``: ``dataset``, ``alpha``,
    ``alphas`` (Table 3)."""
    scores = collect(score_paths)
    alpha = float(options["alpha"])
    scorer, version = scorer_of(scores)
    title = TITLES[target].format(alpha=_fmt_alpha(alpha)) + f" [ROUGE: {version}]"
    if target in ("table1", "table2", "table_wikihow", "table_reddit"):
        df = main_table(scores, target, options["dataset"], alpha)
    elif target == "table3":
        df = table3(scores, [float(a) for a in options["alphas"]])
    elif target == "table4":
        df = table4(scores, alpha)
    else:
        raise InputError(f"unknown FedSum table {target!r}")
    df["rouge_scorer"] = version
    write_table(df, out_prefix, title, scale, NOTE + " " + SCORER_NOTES[scorer].format(version=version))
    return df


# -- figures ---------------------------------------------------------------------------------------
def _save_figure(fig, data: pd.DataFrame, png, csv) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(png, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    with atomic_path(csv, suffix=".csv") as tmp:
        data.to_csv(tmp, index=False)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _sweep(scores: pd.DataFrame, by: str) -> pd.DataFrame:
    rows = []
    for keys, sub in scores.groupby(["method", "alpha", by]):
        for metric in METRICS:
            mean, std = _mean_std(sub[metric])
            rows.append(
                {
                    "method": keys[0],
                    "alpha": keys[1],
                    by: keys[2],
                    "metric": LABELS[metric],
                    "mean": mean,
                    "std": std,
                    "runs": int(sub.seed.nunique()),
                }
            )
    return pd.DataFrame(rows)


def figure3(scores: pd.DataFrame, png, csv, scale: str, alpha: float) -> pd.DataFrame:
    """ROUGE recall vs. total training examples; heterogeneous (Dir = ``alpha``) and uniform panels."""
    plt = _pyplot()
    data = _sweep(scores, "total")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    colours = {"R-R-1": "C0", "R-R-2": "C1", "R-R-L": "C2"}
    for ax, a in zip(axes, sorted(set(data.alpha), key=lambda x: (math.isinf(x), x))):
        for method, style in (("FedSum", "-"), ("FedAvg", ":")):
            for label, colour in colours.items():
                d = data[
                    (data.method == method) & (data.alpha == a) & (data.metric == label)
                ].sort_values("total")
                ax.plot(
                    d.total, d["mean"], style, marker="o", color=colour, label=f"{method} {label}"
                )
        ax.set_title(("uniform" if math.isinf(a) else f"Dir = {_fmt_alpha(a)}"), fontsize=9)
        ax.set_xlabel("total training examples")
    axes[0].set_ylabel("ROUGE recall (%)")
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(
        ("DEMO SCALE — " if scale == "demo" else "")
        + f"FedSum (solid) vs FedAvg (dotted), CNN/DM (ROUGE: {scorer_of(scores)[1]})",
        fontsize=9,
    )
    _save_figure(fig, data, png, csv)
    return data


def figure5(scores: pd.DataFrame, png, csv, scale: str) -> pd.DataFrame:
    """FedSum's ROUGE F1 (solid) and recall (dashed) vs. λ, heterogeneous and uniform."""
    plt = _pyplot()
    scores = scores.assign(lam=scores["lam"].astype(float))
    data = _sweep(scores, "lam")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, a in zip(axes, sorted(set(data.alpha), key=lambda x: (math.isinf(x), x))):
        for k, n in enumerate(("1", "2", "L")):
            for kind, style in (("F", "-"), ("R", "--")):
                d = data[(data.alpha == a) & (data.metric == f"R-{kind}-{n}")].sort_values("lam")
                ax.plot(d.lam, d["mean"], style, marker="o", color=f"C{k}", label=f"R-{kind}-{n}")
        ax.set_title(("uniform" if math.isinf(a) else f"Dir = {_fmt_alpha(a)}"), fontsize=9)
        ax.set_xlabel("λ")
    axes[0].set_ylabel("ROUGE (%)")
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(
        ("DEMO SCALE — " if scale == "demo" else "")
        + f"FedSum vs λ, CNN/DM (ROUGE: {scorer_of(scores)[1]})",
        fontsize=9,
    )
    _save_figure(fig, data, png, csv)
    return data


def position_histogram(positions: list[int], bins: int) -> np.ndarray:
    """Share of extracted sentences at positions 1..bins (the last bin: ``bins`` and later)."""
    counts = np.zeros(bins)
    for p in positions:
        counts[min(int(p), bins - 1)] += 1
    return counts / counts.sum() if counts.sum() else counts


def figure4(
    prediction_paths: list[str],
    score_paths: list[str],
    oracle_paths: Mapping[str, str],
    test_paths: Mapping[str, list[str]],
    png,
    csv,
    scale: str,
    bins: int = 10,
) -> pd.DataFrame:
    """Fig. 4: proportion of extracted sentences per position in the document, FedSum, FedAvg and
    the Oracle (the oracle labels of the same test documents), with the total absolute deviation
    Σ_pos |p_method(pos) − p_Oracle(pos)| (the paper: FedAvg's deviation is 69.31 % (CNN/DM) and
    15.91 % (PubMed) higher than FedSum's)."""
    plt = _pyplot()
    pooled: dict[tuple[str, str], list[int]] = {}
    for pred, score in zip(prediction_paths, score_paths):
        s = read_json(score)
        for row in read_jsonl(pred):
            pooled.setdefault((s["dataset"], s["method"]), []).extend(
                int(j) for j in row["selected"]
            )
    rows = []
    datasets = sorted(
        {d for d, _ in pooled},
        key=lambda d: list(DATASET_NAMES).index(d) if d in DATASET_NAMES else 9,
    )
    for ds in datasets:
        test_ids = {r["id"] for path in test_paths[ds] for r in read_jsonl(path)}
        oracle = [
            j
            for r in read_jsonl(oracle_paths[ds])
            if r["id"] in test_ids
            for j, y in enumerate(r["labels"])
            if y
        ]
        hist = {"Oracle": position_histogram(oracle, bins)}
        for m in ("FedSum", "FedAvg"):
            if (ds, m) not in pooled:
                raise InputError(f"fedsum_figure4: no {m} predictions for {ds}")
            hist[m] = position_histogram(pooled[(ds, m)], bins)
        for model, h in hist.items():
            deviation = float(np.abs(h - hist["Oracle"]).sum())
            for b in range(bins):
                rows.append(
                    {
                        "dataset": ds,
                        "model": model,
                        "position": b + 1 if b < bins - 1 else f"{bins}+",
                        "proportion": float(h[b]),
                        "total_abs_deviation_from_oracle": deviation,
                    }
                )
    data = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.5), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        x = np.arange(bins)
        for k, model in enumerate(("FedSum", "FedAvg", "Oracle")):
            d = data[(data.dataset == ds) & (data.model == model)]
            dev = d.total_abs_deviation_from_oracle.iloc[0]
            label = model if model == "Oracle" else f"{model} (dev. {dev:.3f})"
            ax.bar(x + (k - 1) * 0.27, d.proportion, width=0.27, label=label)
        ax.set_xticks(x, [str(b + 1) for b in range(bins - 1)] + [f"{bins}+"], fontsize=7)
        ax.set_xlabel("sentence position")
        ax.set_title(DATASET_NAMES.get(ds, ds), fontsize=9)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("proportion of extracted sentences")
    fig.suptitle(
        ("DEMO SCALE — " if scale == "demo" else "") + "extracted-sentence positions vs the Oracle",
        fontsize=9,
    )
    _save_figure(fig, data, png, csv)
    return data


def build_figure(
    target: str,
    score_paths: list[str],
    png: str,
    csv: str,
    scale: str,
    options: Mapping,
    prediction_paths: list[str] | None = None,
) -> pd.DataFrame:
    """Workflow entry for ``fedsum_figure3`` / ``4`` / ``5``."""
    if target == "figure3":
        return figure3(collect(score_paths), png, csv, scale, float(options["alpha"]))
    if target == "figure5":
        return figure5(collect(score_paths), png, csv, scale)
    if target == "figure4":
        return figure4(
            list(prediction_paths or []),
            score_paths,
            options["oracle"],
            options["tests"],
            png,
            csv,
            scale,
            int(options.get("bins", 10)),
        )
    raise InputError(f"unknown FedSum figure {target!r}")
