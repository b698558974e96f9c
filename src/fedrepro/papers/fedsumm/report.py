"""FedSUMM's Table I, Table II and Figures 3-6 from the cells' scores and round logs.

* Table I: character ROUGE-1/2/L F1 of {BART, CT} x {single, all, FedAvg, FedSUMM} on every
  corpus of the split config, ours (mean ± sample std over seeds) beside the paper's.  A corpus
  without data (EDUCATION is not public) says "data not available" in our columns; the paper's
  numbers stay beside it.
* Table II: ROUGE-L of BART (single), + CD (single), + CD & FedAvg, + CD & FedSUMM on CSL,
  THUCNews and EDUCATION (``fedsumm.table2_corpora``), plus our + CD (all) row (no paper value).
  The paper's "Bart" row equals its Table I BART single numbers, hence our reading of the rows.
* Figure 3: validation perplexity of the global / trained model after every round, 8 models per
  corpus.  Figure 4: training loss per local step (x = communication round; a round's steps are
  spread over [t−1, t]; federated: the mean over the round's clients of their s-th step).
  Figure 5: (a) ROUGE-L of the global model after every round on ``fedsumm.figure5.corpus``;
  (b) final ROUGE-L vs the number of clients N.  Figure 6: the mean discrepancy ratio ρ over the
  round's clients, FedAvg vs FedSUMM; its CSV adds per round the distribution of ρ − 1 (per
  parameter entry, per tensor, per modulating group) and how far FedSUMM's server update is from
  FedAvg's (:func:`rho_summary`).  Every figure writes the plotted numbers as CSV.
* ``dp_tradeoff`` (ours): ROUGE vs ε for a few noise multipliers, and the private clip norm per
  round (:func:`dp_tradeoff`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.io import InputError, atomic_path, read_json, write_text_atomic
from fedrepro.reporting.reference import load_paper_results
from fedrepro.reporting.tables import SCALES

CORPUS_NAMES = {
    "csl": "CSL",
    "nlpcc2017": "NLPCC",
    "lcsts": "LCSTS",
    "thucnews": "THUCNEWS",
    "education": "EDUCATION",
}
MODEL_NAMES = {"bart": "BART", "ct": "CT", "bart-cd": "BART + CD"}
PAPER_BACKBONES = {
    "bart": "bart-base-chinese",
    "ct": "copy-transformer",
    "bart-cd": "bart-base-chinese",
}
REGIMES = ("single", "all", "FedAvg", "FedSUMM")
METRICS = {"rouge1": "R-1", "rouge2": "R-2", "rougeL": "R-L"}
TABLE2_ROWS = [  # (row label, our model, our regime, paper method name)
    ("Bart", "bart", "single", "Bart"),
    ("+ CD", "bart-cd", "single", "+ CD"),
    ("+ CD & FedAvg", "bart-cd", "FedAvg", "+ CD & FedAvg"),
    ("+ CD & FedSUMM", "bart-cd", "FedSUMM", "+ CD & FedSUMM"),
    ("+ CD (all; ours only)", "bart-cd", "all", None),
]
NOT_AVAILABLE = "data not available"


# -- inputs ---------------------------------------------------------------------------------
def collect_scores(score_paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Long frame ``corpus, n, model, regime, seed, rouge1, rouge2, rougeL, perplexity``."""
    rows = []
    for path in score_paths:
        d = read_json(path)
        if d.get("paper") != "fedsumm" or "rougeL" not in d:
            raise InputError(f"{path}: not a FedSUMM scores file (needs paper: fedsumm and rougeL)")
        rows.append(
            {
                "corpus": d["corpus"],
                "n": int(d["num_clients"]),
                "model": d["model"],
                "regime": d["regime"],
                "seed": int(d["seed"]),
                "rouge1": float(d["rouge1"]),
                "rouge2": float(d["rouge2"]),
                "rougeL": float(d["rougeL"]),
                "perplexity": float(d["perplexity"]),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "corpus",
            "n",
            "model",
            "regime",
            "seed",
            "rouge1",
            "rouge2",
            "rougeL",
            "perplexity",
        ],
    )


RHO_SUMMARY_COLUMNS = (
    "rho_client_min",
    "rho_client_max",
    "param_min",
    "param_p1",
    "param_p50",
    "param_p99",
    "param_max",
    "param_mean",
    "tensor_min",
    "tensor_p50",
    "tensor_max",
    "group_min",
    "group_p50",
    "group_max",
    "update_rel_diff",
    "update_best_scale",
    "update_rel_diff_beyond_scale",
    "update_rel_diff_other_assignment",
)
"""Per-round columns of :func:`rho_summary` (ρ values as ρ − 1)."""


def rho_summary(entry: Mapping) -> dict[str, float]:
    """A round log entry's ρ distribution and update difference in one row (ρ values as ρ − 1).

    ``rho_client_min/max``: the smallest and largest client ρ_c; ``param_*``: the distribution
    of eq. 5's entry-wise ratio ρ_i − 1 (``min``/``max`` over all clients, the quantiles and the
    mean averaged over clients); ``tensor_*`` the same over the per-tensor values, ``group_*``
    over the values that modulate (one per client for ``literal``); ``update_*``: FedSUMM's
    server update against FedAvg's on the same replies (:func:`~fedrepro.papers.fedsumm.algorithm.
    update_difference`; ``other_assignment``: against the other memory assignment, i.e. what the
    sort by loss changes).  NaN where the log has no such entry (FedAvg: no update difference;
    logs written before issue 14)."""
    out = dict.fromkeys(RHO_SUMMARY_COLUMNS, np.nan)
    rho = entry.get("rho") or {}
    if rho:
        out["rho_client_min"] = min(rho.values()) - 1.0
        out["rho_client_max"] = max(rho.values()) - 1.0
    stats = [s for s in (entry.get("rho_statistics") or {}).values() if s]
    for part, keys in (
        ("parameter", ("min", "p1", "p50", "p99", "max", "mean")),
        ("tensor", ("min", "p50", "max")),
        ("group", ("min", "p50", "max")),
    ):
        values = [s[part] for s in stats if part in s]
        if not values:
            continue
        prefix = "param" if part == "parameter" else part
        for k in keys:
            column = [v[k] for v in values]
            agg = min if k == "min" else max if k == "max" else (lambda x: float(np.mean(x)))
            out[f"{prefix}_{k}"] = float(agg(column))
    diff = entry.get("update_difference") or {}
    if diff:
        out["update_rel_diff"] = diff.get("rel_diff", np.nan)
        out["update_best_scale"] = diff.get("best_scale", np.nan)
        out["update_rel_diff_beyond_scale"] = diff.get("rel_diff_beyond_scale", np.nan)
        other = [v for k, v in diff.items() if k.startswith("rel_diff_vs_")]
        if other:
            out["update_rel_diff_other_assignment"] = other[0]
    return {k: (np.nan if v is None else float(v)) for k, v in out.items()}


def _cell_key(meta: dict) -> dict:
    """A FedSUMM cell's identity from its ``scores.json``."""
    return {
        "corpus": meta["corpus"],
        "n": int(meta["num_clients"]),
        "model": meta["model"],
        "regime": meta["regime"],
        "seed": int(meta["seed"]),
    }


def collect_rounds(log_paths: Iterable[str | os.PathLike]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per round (``corpus, n, model, regime, seed, round, perplexity, rougeL, rho_mean,
    train_loss`` and :func:`rho_summary`'s columns) and per step (``…, round, step, x, loss``) from the cells' ``train_log.json``;
    each log's cell comes from the ``scores.json`` beside it."""
    rounds, steps = [], []
    for path in log_paths:
        meta = read_json(Path(path).parent / "scores.json")
        key = _cell_key(meta)
        for entry in read_json(path)["rounds"]:
            r = int(entry["round"])
            ev = entry.get("evaluation") or {}
            if "perplexity" not in ev:
                raise InputError(f"{path}: round {r} has no evaluation (not a FedSUMM round log)")
            losses = [c["train_loss"] for c in entry["clients"]]
            rounds.append(
                {
                    **key,
                    "round": r,
                    "perplexity": ev["perplexity"],
                    "rougeL": ev.get("rougeL", np.nan),
                    "rho_mean": entry.get("rho_mean", np.nan),
                    "train_loss": float(np.mean(losses)),
                    **rho_summary(entry),
                }
            )
            per_client = list((entry.get("step_losses") or {}).values())
            width = max((len(s) for s in per_client), default=0)
            for s in range(width):
                vals = [c[s] for c in per_client if len(c) > s]
                steps.append(
                    {
                        **key,
                        "round": r,
                        "step": s + 1,
                        "x": r - 1 + (s + 1) / width,
                        "loss": float(np.mean(vals)),
                    }
                )
    return pd.DataFrame(rounds), pd.DataFrame(steps)


# -- tables ---------------------------------------------------------------------------------
def _paper_value(
    paper: pd.DataFrame, table: str, model: str, corpus: str, method: str, metric: str
) -> float:
    ref = paper[
        (paper.table == table)
        & (paper.backbone == PAPER_BACKBONES[model])
        & (paper.client == CORPUS_NAMES[corpus])
        & (paper.method == method)
        & (paper.metric == metric)
    ]
    return float(ref.value.iloc[0]) if len(ref) else np.nan


def _ours(
    scores: pd.DataFrame, corpus: str, model: str, regime: str, metric: str
) -> tuple[float, float, int]:
    sub = scores[(scores.corpus == corpus) & (scores.model == model) & (scores.regime == regime)][
        metric
    ]
    return (
        float(sub.mean()) if len(sub) else np.nan,
        float(sub.std(ddof=1)) if len(sub) > 1 else np.nan,
        len(sub),
    )


def table1(scores: pd.DataFrame, statuses: Mapping[str, str | None]) -> pd.DataFrame:
    paper = load_paper_results()
    paper = paper[paper.paper == "fedsumm"]
    rows = []
    for corpus, status in statuses.items():
        for model in ("bart", "ct"):
            for regime in REGIMES:
                row = {
                    "Dataset": CORPUS_NAMES[corpus],
                    "Model": MODEL_NAMES[model],
                    "Regime": regime,
                    "corpus": corpus,
                    "model": model,
                    "status": status or "ok",
                }
                for metric, label in METRICS.items():
                    mean, std, runs = _ours(scores, corpus, model, regime, metric)
                    row[f"{label} ours"], row[f"{label} ours std"] = mean, std
                    row[f"{label} paper"] = _paper_value(
                        paper, "Table I", model, corpus, regime, metric
                    )
                row["runs"] = runs
                rows.append(row)
    return pd.DataFrame(rows)


def table2(
    scores: pd.DataFrame, statuses: Mapping[str, str | None], corpora: list[str]
) -> pd.DataFrame:
    paper = load_paper_results()
    paper = paper[paper.paper == "fedsumm"]
    rows = []
    for label, model, regime, method in TABLE2_ROWS:
        row = {"Model": label, "model": model, "regime": regime}
        for corpus in corpora:
            name = CORPUS_NAMES[corpus]
            mean, std, runs = _ours(scores, corpus, model, regime, "rougeL")
            row[f"{name} ours"], row[f"{name} ours std"] = mean, std
            row[f"{name} paper"] = (
                _paper_value(paper, "Table II", model, corpus, method, "rougeL")
                if method
                else np.nan
            )
            row[f"{name} status"] = statuses.get(corpus) or "ok"
            row["runs"] = runs
        rows.append(row)
    return pd.DataFrame(rows)


def _num(x: float, std: float = np.nan) -> str:
    if pd.isna(x):
        return "—"
    return f"{x:.1f}" + (f" ± {std:.1f}" if not pd.isna(std) else "")


def _ours_text(row: pd.Series, label: str, status_key: str = "status") -> str:
    if row[status_key] != "ok":
        return NOT_AVAILABLE
    return _num(row[f"{label} ours"], row[f"{label} ours std"])


def _notice(scale: str) -> list[str]:
    if scale == "demo":
        return [
            (
                "> **DEMO-SCALE numbers: tiny models trained for a few rounds on generated samples "
                "of the corpora; NOT comparable to the paper's numbers.**"
            ),
            "",
        ]
    return []


def _tex(text: str) -> str:
    return (
        text.replace("±", r"$\pm$")
        .replace("—", "--")
        .replace("%", r"\%")
        .replace("&", r"\&")
        .replace("_", r"\_")
        .replace("ρ", r"$\rho$")
    )


def _rows_table1(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    header = ["Dataset", "Model", "Regime"] + [
        f"{m} {w}" for m in METRICS.values() for w in ("ours", "paper")
    ]
    body = []
    for _, r in df.iterrows():
        cells = [r.Dataset, r.Model, r.Regime]
        for label in METRICS.values():
            cells += [_ours_text(r, label), _num(r[f"{label} paper"])]
        body.append(cells)
    return header, body


def _rows_table2(df: pd.DataFrame, corpora: list[str]) -> tuple[list[str], list[list[str]]]:
    names = [CORPUS_NAMES[c] for c in corpora]
    header = ["Model"] + [f"{n} {w}" for n in names for w in ("ours", "paper")]
    body = []
    for _, r in df.iterrows():
        cells = [r.Model]
        for n in names:
            cells += [_ours_text(r, n, f"{n} status"), _num(r[f"{n} paper"])]
        body.append(cells)
    return header, body


def _markdown(header, body, title, scale, legend) -> str:
    lines = [f"**{title}{' (DEMO SCALE)' if scale == 'demo' else ''}**", ""] + _notice(scale)
    lines += [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines + ["", legend, ""])


def _latex(header, body, title, scale) -> str:
    caption = _tex(title) + (
        r" \textbf{DEMO SCALE: not comparable to the paper.}" if scale == "demo" else ""
    )
    lines = [
        "% Requires \\usepackage{booktabs}. Generated by fedrepro.papers.fedsumm.report.",
        r"\begin{table}[t]",
        r"\centering",
        r"\caption{" + caption + "}",
    ]
    n_text = sum(1 for h in header if not h.endswith(("ours", "paper")))
    lines.append(r"\begin{tabular}{" + "l" * n_text + "r" * (len(header) - n_text) + "}")
    lines += [r"\toprule", " & ".join(_tex(h) for h in header) + r" \\", r"\midrule"]
    lines += [" & ".join(_tex(c) for c in cells) + r" \\" for cells in body]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


LEGEND = (
    "Character ROUGE F1 (×100; every character a token, whitespace and punctuation dropped) on the "
    "test data of the N clients, mean ± sample std over seeds (no ± with one seed). Evaluated model: "
    "single / all — the model trained on one client's / the pooled data; FedAvg / FedSUMM — the "
    "final global model. “data not available”: the corpus has no local copy (EDUCATION is not public)."
)


def write_table(
    df: pd.DataFrame, header, body, out: Mapping[str, str], title: str, scale: str
) -> None:
    if scale not in SCALES:
        raise InputError(f"scale must be one of {SCALES}, got {scale!r}")
    csv_df = df.copy()
    csv_df["scale"] = scale
    with atomic_path(out["csv"], suffix=".csv") as tmp:
        csv_df.to_csv(tmp, index=False)
    write_text_atomic(out["md"], _markdown(header, body, title, scale, LEGEND))
    write_text_atomic(out["tex"], _latex(header, body, title, scale))


# -- figures --------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, data: pd.DataFrame, out: Mapping[str, str]) -> None:
    plt = _plt()
    with atomic_path(out["png"], suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    with atomic_path(out["csv"], suffix=".csv") as tmp:
        data.to_csv(tmp, index=False)


def _label(model: str, regime: str) -> str:
    return f"{MODEL_NAMES[model]}-{regime}"


def _panels(
    data: pd.DataFrame,
    y: str,
    x: str,
    ylabel: str,
    xlabel: str,
    title: str,
    scale: str,
    regimes=REGIMES,
    models=("bart", "ct"),
    log_y: bool = False,
):
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    corpora = [c for c in CORPUS_NAMES if c in set(data.corpus)] if len(data) else []
    fig, axes = plt.subplots(
        1, max(len(corpora), 1), figsize=(3.6 * max(len(corpora), 1), 3.2), squeeze=False
    )
    for ax, corpus in zip(axes[0], corpora):
        for model in models:
            for regime in regimes:
                d = data[(data.corpus == corpus) & (data.model == model) & (data.regime == regime)]
                d = d.groupby(x)[y].mean().reset_index()
                if len(d):
                    ax.plot(
                        d[x],
                        d[y],
                        marker="o" if x == "round" else None,
                        markersize=3,
                        linestyle="--" if model == "ct" else "-",
                        label=_label(model, regime),
                    )
        ax.set_title(CORPUS_NAMES[corpus], fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if log_y:
            ax.set_yscale("log")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    if corpora:
        axes[0][-1].legend(fontsize=6)
    fig.suptitle(("DEMO SCALE — " if scale == "demo" else "") + title, fontsize=10)
    return fig


def figure3(rounds: pd.DataFrame, out, scale: str) -> pd.DataFrame:
    data = rounds[["corpus", "n", "model", "regime", "seed", "round", "perplexity"]].copy()
    _save(
        _panels(
            data,
            "perplexity",
            "round",
            "validation perplexity",
            "communication round",
            "FedSUMM Fig. 3: perplexity per round",
            scale,
            log_y=True,
        ),
        data,
        out,
    )
    return data


def figure4(steps: pd.DataFrame, out, scale: str) -> pd.DataFrame:
    _save(
        _panels(
            steps,
            "loss",
            "x",
            "training loss",
            "communication round",
            "FedSUMM Fig. 4: training loss per local step",
            scale,
        ),
        steps,
        out,
    )
    return steps


def figure5(
    rounds: pd.DataFrame, scores: pd.DataFrame, report: Mapping, out, scale: str
) -> pd.DataFrame:
    plt = _plt()
    corpus, n = report["figure5_corpus"], int(report["clients"])
    a = rounds[
        (rounds.corpus == corpus) & (rounds.n == n) & rounds.regime.isin(["FedAvg", "FedSUMM"])
    ]
    if a.rougeL.isna().any() or a.empty:
        raise InputError(
            f"the {corpus} federated cells at N={n} have no ROUGE-L per round; set "
            "fedsumm.evaluation.rouge_every_round: true"
        )
    a = (
        a.groupby(["model", "regime", "round"])
        .rougeL.mean()
        .reset_index()
        .assign(panel="a", corpus=corpus, n=n)
    )
    b = scores[(scores.corpus == corpus) & scores.regime.isin(["FedAvg", "FedSUMM"])]
    b = (
        b.groupby(["model", "regime", "n"])
        .rougeL.mean()
        .reset_index()
        .assign(panel="b", corpus=corpus)
    )
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2))
    for model in ("bart", "ct"):
        for regime in ("FedAvg", "FedSUMM"):
            style = "--" if model == "ct" else "-"
            d = a[(a.model == model) & (a.regime == regime)]
            ax1.plot(
                d["round"], d.rougeL, style, marker="o", markersize=3, label=_label(model, regime)
            )
            d = b[(b.model == model) & (b.regime == regime)].sort_values("n")
            ax2.plot(d["n"], d.rougeL, style, marker="o", markersize=3, label=_label(model, regime))
    ax1.set(
        xlabel="communication round",
        ylabel="ROUGE-L F1",
        title=f"(a) {CORPUS_NAMES[corpus]}, N = {n}",
    )
    ax2.set(
        xlabel="number of clients N",
        ylabel="ROUGE-L F1",
        title=f"(b) {CORPUS_NAMES[corpus]}, final model",
    )
    ax2.set_xscale("log")
    ax2.set_xticks(sorted(set(b["n"])), [str(k) for k in sorted(set(b["n"]))])
    ax2.minorticks_off()
    ax2.legend(fontsize=6)
    fig.suptitle(
        ("DEMO SCALE — " if scale == "demo" else "")
        + "FedSUMM Fig. 5: ROUGE-L vs rounds and clients",
        fontsize=10,
    )
    data = pd.concat([a, b], ignore_index=True)
    _save(fig, data, out)
    return data


def figure6(rounds: pd.DataFrame, out, scale: str) -> pd.DataFrame:
    """Fig. 6: ρ − 1 per round, FedAvg vs FedSUMM; the CSV also holds each round's distribution
    of ρ − 1 and FedSUMM's update difference from FedAvg (:func:`rho_summary`)."""
    columns = ["corpus", "n", "model", "regime", "seed", "round", "rho_mean"]
    columns += [c for c in RHO_SUMMARY_COLUMNS if c in rounds.columns]
    data = rounds[rounds.regime.isin(["FedAvg", "FedSUMM"])][columns].copy()
    if data.rho_mean.isna().any():
        raise InputError(
            "a FedAvg / FedSUMM round log has no rho_mean (not written by FedSummStrategy)"
        )
    # ρ sits just above 1 under the literal reading (Σ over ~10^5 softmax entries): plot ρ − 1
    # on a log axis
    data.insert(columns.index("rho_mean") + 1, "rho_minus_1", data.rho_mean - 1.0)
    fig = _panels(
        data,
        "rho_minus_1",
        "round",
        "ρ − 1 (ρ: mean over the round's clients)",
        "communication round",
        "FedSUMM Fig. 6: discrepancy ratio per round, FedAvg vs FedSUMM",
        scale,
        regimes=("FedAvg", "FedSUMM"),
        log_y=bool((data.rho_minus_1 > 0).all()),
    )
    _save(fig, data, out)
    return data


def dp_tradeoff(log_paths: Iterable[str | os.PathLike], out, scale: str) -> pd.DataFrame:
    """``fedsumm_dp_tradeoff`` (ours, not in the paper): (a) final ROUGE-1/2/L F1 against ε after
    the last round, one point per noise multiplier σ, the cell without DP as a dashed line
    (ε = ∞); (b) the clip norm C_t of every round (the private estimate) beside the true median of
    the round's update norms (a diagnostic that only the log sees).  The CSV holds both panels:
    panel ``a`` one row per cell, panel ``b`` one row per (cell, round) with ε after that round."""
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    rows, per_round = [], []
    for path in log_paths:
        meta = read_json(Path(path).parent / "scores.json")
        entries = read_json(path)["rounds"]
        key = _cell_key(meta)
        dps = [e.get("dp") for e in entries]
        if any(d is None for d in dps) and not all(d is None for d in dps):
            raise InputError(f"{path}: some rounds have a dp entry and some do not")
        last = dps[-1] if dps and dps[-1] is not None else None
        if last is not None and last.get("epsilon") is None:
            raise InputError(
                f"{path}: a DP cell without ε (clipping {last.get('clipping')!r} has no guarantee); "
                "the tradeoff needs fedsumm.dp.clipping: adaptive"
            )
        rows.append(
            {
                "panel": "a",
                **key,
                "dp": last is not None,
                "noise_multiplier": last["noise_multiplier"] if last else np.nan,
                "update_noise_multiplier": last.get("update_noise_multiplier", np.nan) if last else np.nan,
                "delta": last["delta"] if last else np.nan,
                "sampling_rate": last["sampling_rate"] if last else np.nan,
                "rounds": len(entries),
                "epsilon": last["epsilon"] if last else np.inf,
                "final_clip_norm": last["clip_norm"] if last else np.nan,
                **{m: float(meta[m]) for m in METRICS},
            }
        )
        for e, d in zip(entries, dps):
            if d is not None:
                per_round.append(
                    {
                        "panel": "b",
                        **key,
                        "dp": True,
                        "noise_multiplier": d["noise_multiplier"],
                        "round": int(e["round"]),
                        "epsilon": d["epsilon"],
                        "clip_norm": d["clip_norm"],
                        "median_norm": d.get("median_norm", float(np.median(d["norms"]))),
                        "num_clipped": d["num_clipped"],
                    }
                )
    a = pd.DataFrame(rows)
    b = pd.DataFrame(per_round)
    if a.empty or not a.dp.any():
        raise InputError("fedsumm_dp_tradeoff: no DP cell among the inputs")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.4, 3.3))
    dp_cells = a[a.dp].groupby("noise_multiplier")
    mean = dp_cells[["epsilon", *METRICS]].mean().reset_index().sort_values("epsilon")
    for (m, label), color in zip(METRICS.items(), ("C0", "C1", "C2")):
        ax1.plot(mean.epsilon, mean[m], marker="o", color=color, label=label)
        ref = a[~a.dp][m].mean()
        if np.isfinite(ref):
            ax1.axhline(ref, color=color, linestyle="--", linewidth=0.8)
    for _, r in mean.iterrows():
        ax1.annotate(f"σ={r.noise_multiplier:g}", (r.epsilon, r.rougeL), fontsize=6,
                     textcoords="offset points", xytext=(3, 3))
    ax1.set_xscale("log")
    ax1.set(xlabel=f"ε after the last round (δ = {a[a.dp].delta.iloc[0]:g})",
            ylabel="ROUGE F1 (dashed: no DP)")
    ax1.legend(fontsize=6)
    for i, (sigma, d) in enumerate(b.groupby("noise_multiplier")):
        d = d.groupby("round")[["clip_norm", "median_norm"]].mean().reset_index()
        ax2.plot(d["round"], d.clip_norm, marker="o", markersize=3, color=f"C{i}",
                 label=f"C_t, σ={sigma:g}")
        ax2.plot(d["round"], d.median_norm, linestyle=":", color=f"C{i}",
                 label=f"median ζ, σ={sigma:g}")
    ax2.set(xlabel="communication round", ylabel="update norm: C_t (private) vs median")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.legend(fontsize=5)
    k = a.iloc[0]
    fig.suptitle(
        ("DEMO SCALE — " if scale == "demo" else "")
        + f"FedSUMM + DP (ours): ROUGE vs ε, {CORPUS_NAMES.get(k.corpus, k.corpus)}, "
        f"{MODEL_NAMES.get(k.model, k.model)}, N = {k.n}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    data = pd.concat([a, b], ignore_index=True)
    _save(fig, data, out)
    return data


TITLES = {
    "table1": "FedSUMM Table I: character ROUGE F1, {n} clients (paper: 50), ours vs. paper",
    "table2": "FedSUMM Table II: ROUGE-L F1 of the copy-distribution ablation, {n} clients (paper: 50)",
}


def build(
    target: str, inputs: Mapping[str, list[str]], outputs: Mapping[str, str], report: Mapping
) -> pd.DataFrame:
    """Workflow entry of the ``fedsumm_table`` / ``fedsumm_figure`` rules."""
    scale = report["scale"]
    scores = collect_scores(inputs.get("scores", []))
    statuses = dict(report["statuses"])
    title = TITLES.get(target, "").format(n=report["clients"])
    if target == "table1":
        df = table1(scores, statuses)
        write_table(df, *_rows_table1(df), outputs, title, scale)
        return df
    if target == "table2":
        corpora = list(report["table2_corpora"])
        df = table2(scores, statuses, corpora)
        write_table(df, *_rows_table2(df, corpora), outputs, title, scale)
        return df
    rounds, steps = collect_rounds(inputs.get("logs", []))
    if target == "figure3":
        return figure3(rounds, outputs, scale)
    if target == "figure4":
        return figure4(steps, outputs, scale)
    if target == "figure5":
        return figure5(rounds, scores, report, outputs, scale)
    if target == "figure6":
        return figure6(rounds, outputs, scale)
    if target == "dp_tradeoff":
        return dp_tradeoff(inputs.get("logs", []), outputs, scale)
    raise InputError(f"unknown FedSUMM target {target!r}")
