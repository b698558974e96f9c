"""FedMCP's Table I, Table II and Figures 3-5 from the cells' scores and round logs.

* Table I: accuracy per task (mean ± sample std over runs), Avg (the mean over the six tasks,
  then mean ± std over runs, as the paper's Avg column), Param. (%) and Comm. (%) -- computed
  exactly for the real roberta-base architecture (:func:`exact_shares`, built on the meta device:
  no weights) *and* for the backbone the run used -- with the paper's values beside ours and the
  best / second best marked (†, ††) separately on ours and on the paper's.
* Table II: the loss-component ablation (w/o L_c, w/o L_b, full) in the same layout.
* Figure 3: test accuracy per round (mean and std over the six clients; runs averaged first),
  FedMCP vs FedAvg (PEFT).  Figures 4 and 5: per-client accuracy, CKA vs cosine similarity and
  mean vs [CLS] pooling.  Every figure also writes the plotted numbers as CSV.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.io import InputError, atomic_path, read_json, write_text_atomic
from fedrepro.reporting.reference import load_paper_results
from fedrepro.reporting.tables import DAGGER, DOUBLE_DAGGER, SCALES

TASKS = ["MRPC", "RTE", "SST-2", "QNLI", "QQP", "MNLI"]

PAPER_NAMES = {
    "Local": "Local",
    "FedAvg-FT": "FedAvg (Full FT)",
    "FedAvg-PEFT": "FedAvg (PEFT)",
    "FedLR": "FedLR",
    "FedAP": "FedAP",
    "MOON": "MOON",
    "FedRep": "FedRep",
    "FedMatch": "FedMatch",
    "FedMCP": "FedMCP",
    "FedMCP-noLc": "FedMCP w/o CL",
    "FedMCP-noLb": "FedMCP w/o BL",
    "FedMCP-cos": "FedMCP (cosine)",
    "FedMCP-cls": "FedMCP ([CLS] pooling)",
}
"""Our method keys -> the names the paper (and paper_results.csv) uses."""

TABLE_OF = {"table1": "Table I", "table2": "Table II", "figure4": "Fig. 4", "figure5": "Fig. 5"}


# -- inputs ---------------------------------------------------------------------------------
def collect_accuracy(score_paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Long frame ``method, seed, client, accuracy`` from FedMCP ``scores.json`` files."""
    rows = []
    for path in score_paths:
        data = read_json(path)
        if data.get("paper") != "fedmcp" or "clients" not in data:
            raise InputError(f"{path}: not a FedMCP scores file (needs paper: fedmcp and clients)")
        for client, s in data["clients"].items():
            rows.append({"method": data["method"], "seed": int(data["seed"]), "client": client,
                         "accuracy": float(s["accuracy"])})
    if not rows:
        raise InputError("no FedMCP scores given")
    return pd.DataFrame(rows)


def collect_rounds(log_paths: Iterable[str | os.PathLike], provenance_paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Long frame ``method, seed, round, client, accuracy`` from the cells' round logs."""
    rows = []
    for log_path, prov_path in zip(log_paths, provenance_paths):
        cell = read_json(prov_path)["cell"]
        clients = cell["clients"]
        for entry in read_json(log_path)["rounds"]:
            for c in entry["clients"]:
                if "test_accuracy" not in c:
                    raise InputError(f"{log_path}: round {entry['round']} has no test_accuracy; "
                                     f"set fedmcp.eval_every_round: true")
                rows.append({"method": cell["method"], "seed": int(cell["seed"]), "round": int(entry["round"]),
                             "client": c.get("client", clients[int(c["partition_id"])]),
                             "accuracy": float(c["test_accuracy"])})
    return pd.DataFrame(rows)


# -- parameter shares -------------------------------------------------------------------------
def exact_shares(method: str, model_cfg: dict | None = None) -> dict:
    """Trainable / communicated parameters of ``method`` on the released roberta-base
    (built from its config on the meta device; no weights), relative to full fine-tuning
    (backbone incl. pooler + one 2-class linear head), in percent."""
    import torch
    from transformers import RobertaModel

    from fedrepro.papers.fedmcp.methods import build_model
    from fedrepro.papers.fedmcp.model import roberta_base_config

    config = roberta_base_config()
    with torch.device("meta"):
        backbone = RobertaModel(config)
        full_ft = sum(p.numel() for p in backbone.parameters()) + config.hidden_size * 2 + 2
        model = build_model(method, backbone, 2, model_cfg or {})
        trainable = sum(p.numel() for p in model.trainable_parameters())
        shared = sum(p.numel() for p in model._shared_parameters().values()) if model.spec.federated else 0
    return {"params": trainable, "comm": shared, "full_ft": full_ft,
            "param_pct": 100.0 * trainable / full_ft, "comm_pct": 100.0 * shared / full_ft}


def run_shares(provenance_paths: Iterable[str | os.PathLike]) -> dict[str, dict]:
    """Per method, the shares measured on the run's own backbone (from provenance)."""
    out = {}
    for path in provenance_paths:
        prov = read_json(path)
        p = prov["parameters"]
        out[prov["cell"]["method"]] = {"param_pct": 100.0 * p["trainable_share"],
                                      "comm_pct": 100.0 * p["shared_share"]}
    return out


# -- tables ---------------------------------------------------------------------------------
def _marks(values: pd.Series) -> pd.Series:
    ranks = values.round(2).rank(ascending=False, method="min", na_option="keep")
    return ranks.map(lambda r: DAGGER if r == 1 else DOUBLE_DAGGER if r == 2 else "")


def accuracy_table(acc: pd.DataFrame, methods: list[str], table: str) -> pd.DataFrame:
    """One row per method: ``{task} ours mean/std``, ``{task} paper``/``paper std``, marks, Avg."""
    paper = load_paper_results()
    paper = paper[(paper.paper == "fedmcp") & (paper.metric == "accuracy")]
    rows = []
    for m in methods:
        sub = acc[acc.method == m]
        row = {"Method": PAPER_NAMES[m], "key": m, "runs": int(sub.seed.nunique())}
        for task in TASKS + ["Avg"]:
            if task == "Avg":
                per_seed = sub.groupby("seed").accuracy.mean() if not sub.empty else pd.Series(dtype=float)
                vals = per_seed if sub.groupby("seed").client.nunique().eq(len(TASKS)).all() else pd.Series(dtype=float)
            else:
                vals = sub[sub.client == task].accuracy
            row[f"{task} ours mean"] = float(vals.mean()) if len(vals) else np.nan
            row[f"{task} ours std"] = float(vals.std(ddof=1)) if len(vals) > 1 else np.nan
            ref = paper[(paper.method == PAPER_NAMES[m]) & (paper.client == task)
                        & (paper.table.isin([TABLE_OF[table], "Table I"]))]
            row[f"{task} paper"] = float(ref.value.iloc[0]) if len(ref) else np.nan
            row[f"{task} paper std"] = float(ref["std"].iloc[0]) if len(ref) else np.nan
        rows.append(row)
    df = pd.DataFrame(rows)
    for task in TASKS + ["Avg"]:
        df[f"{task} ours mark"] = _marks(df[f"{task} ours mean"])
        df[f"{task} paper mark"] = _marks(df[f"{task} paper"])
    return df


def table1(acc: pd.DataFrame, shares_run: dict[str, dict], model_cfg: dict | None = None) -> pd.DataFrame:
    df = accuracy_table(acc, [m for m in PAPER_NAMES if m in set(acc.method) and not m.startswith("FedMCP-")], "table1")
    paper = load_paper_results()
    paper = paper[(paper.paper == "fedmcp") & (paper.table == "Table I")]
    for kind in ("param_pct", "comm_pct"):
        metric = {"param_pct": "trainable_param_pct", "comm_pct": "comm_pct"}[kind]
        df[f"{kind} roberta-base"] = [exact_shares(m, model_cfg)[kind] for m in df.key]
        df[f"{kind} run backbone"] = [shares_run.get(m, {}).get(kind, np.nan) for m in df.key]
        vals = []
        for name in df.Method:
            ref = paper[(paper.method == name) & (paper.metric == metric)]
            vals.append(float(ref.value.iloc[0]) if len(ref) else np.nan)
        df[f"{kind} paper"] = vals
    df.attrs["baseline_adapters"] = str((model_cfg or {}).get("baseline_adapters", "paper"))
    return df


def _fmt(mean: float, std: float, mark: str) -> str:
    if pd.isna(mean):
        return "—"
    text = f"{mean:.2f}"
    if not pd.isna(std):
        text += f" ± {std:.2f}"
    return text + (f" {mark}" if mark else "")


def _pct(x: float) -> str:
    return "—" if pd.isna(x) else f"{x:.2f}"


def _notice(scale: str) -> list[str]:
    if scale == "demo":
        return ["> **DEMO-SCALE numbers: a tiny RoBERTa trained on generated GLUE-schema samples; "
                "NOT comparable to the paper's numbers.**", ""]
    return []


def markdown(df: pd.DataFrame, title: str, scale: str) -> str:
    cols = [t for t in TASKS + ["Avg"] if f"{t} ours mean" in df]
    has_shares = "param_pct paper" in df
    lines = [f"**{title}{' (DEMO SCALE)' if scale == 'demo' else ''}**", ""] + _notice(scale)
    header = ["Method"] + [f"{t} (ours)" for t in cols] + [f"{t} (paper)" for t in cols]
    if has_shares:
        header += ["Param. % (ours: roberta-base / run)", "Param. % (paper)",
                   "Comm. % (ours: roberta-base / run)", "Comm. % (paper)"]
    header.append("runs")
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for _, r in df.iterrows():
        cells = [r.Method]
        cells += [_fmt(r[f"{t} ours mean"], r[f"{t} ours std"], r[f"{t} ours mark"]) for t in cols]
        cells += [_fmt(r[f"{t} paper"], r[f"{t} paper std"], r[f"{t} paper mark"]) for t in cols]
        if has_shares:
            for kind in ("param_pct", "comm_pct"):
                cells += [f"{_pct(r[f'{kind} roberta-base'])} / {_pct(r[f'{kind} run backbone'])}",
                          _pct(r[f"{kind} paper"])]
        cells.append(str(r.runs))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Accuracy (%) on each client's test split: mean ± sample std over runs (no ± with one "
              "run). Avg = mean over the six tasks per run, then over runs. † / †† = best / second "
              "best per column, on ours and on the paper's separately."]
    if has_shares:
        lines += ["", ("Param. / Comm. = trainable / sent-per-round parameters in % of full fine-tuning, "
                       "ours exact on the released roberta-base (2 classes) / on the run's backbone. "
                       f"Baseline sizing `fedmcp.baseline_adapters: {df.attrs.get('baseline_adapters', 'paper')}` "
                       "(paper: MOON, FedRep, FedMatch on both adapter sets and 1.16 % sent, FedLR's LoRA "
                       "about one adapter set; docs/decisions.md). The PEFT methods' ours are ~0.84x the "
                       "paper's (FedLR 0.82x): one adapter set is 0.488 % of roberta-base, not 0.58 %.")]
    lines.append("")
    return "\n".join(lines)


def latex(df: pd.DataFrame, title: str, scale: str) -> str:
    cols = [t for t in TASKS + ["Avg"] if f"{t} ours mean" in df]

    def tex(text: str) -> str:
        return (text.replace("±", r"$\pm$").replace(DOUBLE_DAGGER, r"$^{\dagger\dagger}$")
                .replace(DAGGER, r"$^{\dagger}$").replace("%", r"\%").replace("—", "--")
                .replace("_", r"\_").replace("&", r"\&"))

    caption = tex(title) + (r" \textbf{DEMO SCALE: not comparable to the paper.}" if scale == "demo" else "")
    shares = [k for k in ("param_pct", "comm_pct") if f"{k} paper" in df]
    share_names = {"param_pct": "Param. (\\%)", "comm_pct": "Comm. (\\%)"}
    lines = ["% Requires \\usepackage{booktabs}. Generated by fedrepro.papers.fedmcp.report.",
             r"\begin{table}[t]", r"\centering", r"\caption{" + caption + "}",
             r"\begin{tabular}{l" + "rr" * (len(cols) + len(shares)) + "}", r"\toprule",
             " & ".join([""] + [r"\multicolumn{2}{c}{" + tex(t) + "}" for t in cols]
                        + [r"\multicolumn{2}{c}{" + share_names[k] + "}" for k in shares]) + r" \\",
             " & ".join(["Method"] + ["Ours", "Paper"] * (len(cols) + len(shares))) + r" \\", r"\midrule"]
    for _, r in df.iterrows():
        cells = [tex(r.Method)]
        for t in cols:
            cells += [tex(_fmt(r[f"{t} ours mean"], r[f"{t} ours std"], r[f"{t} ours mark"])),
                      tex(_fmt(r[f"{t} paper"], r[f"{t} paper std"], r[f"{t} paper mark"]))]
        for k in shares:  # ours: exact on roberta-base
            cells += [tex(_pct(r[f"{k} roberta-base"])), tex(_pct(r[f"{k} paper"]))]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def write_table(df: pd.DataFrame, out_prefix: str | os.PathLike, title: str, scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    out_prefix = Path(out_prefix)
    csv_df = df.copy()
    csv_df["scale"] = scale
    with atomic_path(out_prefix.with_name(out_prefix.name + ".csv"), suffix=".csv") as tmp:
        csv_df.to_csv(tmp, index=False)
    write_text_atomic(out_prefix.with_name(out_prefix.name + ".md"), markdown(df, title, scale))
    write_text_atomic(out_prefix.with_name(out_prefix.name + ".tex"), latex(df, title, scale))


TITLES = {
    "table1": "FedMCP Table I: accuracy on the six GLUE clients (cross-task cross-silo), ours vs. paper",
    "table2": "FedMCP Table II: loss-component ablation (w/o L_c = contrastive, w/o L_b = global-path CE)",
    "figure3": "FedMCP Fig. 3: test accuracy per round (mean ± std over the six clients)",
    "figure4": "FedMCP Fig. 4: CKA vs. cosine similarity in L_c",
    "figure5": "FedMCP Fig. 5: mean pooling vs. [CLS] representation in L_c",
}


def build_table(target: str, score_paths, provenance_paths, out_prefix, scale: str,
                model_cfg: dict | None = None) -> pd.DataFrame:
    """Workflow entry for ``fedmcp_table1`` / ``fedmcp_table2``."""
    acc = collect_accuracy(score_paths)
    if target == "table1":
        df = table1(acc, run_shares(provenance_paths), model_cfg)
    elif target == "table2":
        df = accuracy_table(acc, ["FedMCP-noLc", "FedMCP-noLb", "FedMCP"], "table2")
    else:
        raise InputError(f"unknown FedMCP table {target!r}")
    write_table(df, out_prefix, TITLES[target], scale)
    return df


# -- figures --------------------------------------------------------------------------------
def _save_figure(fig, data: pd.DataFrame, png: str | os.PathLike, csv: str | os.PathLike) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(png, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    with atomic_path(csv, suffix=".csv") as tmp:
        data.to_csv(tmp, index=False)


def figure3(rounds: pd.DataFrame, png, csv, scale: str) -> pd.DataFrame:
    """Accuracy per round: per round, the six clients' accuracies (averaged over runs) -> mean, std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_client = rounds.groupby(["method", "round", "client"]).accuracy.mean().reset_index()
    data = (per_client.groupby(["method", "round"]).accuracy.agg(["mean", "std"]).reset_index()
            .rename(columns={"mean": "accuracy_mean", "std": "accuracy_std_over_clients"}))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m in ["FedAvg-PEFT", "FedMCP"]:
        d = data[data.method == m]
        if d.empty:
            continue
        ax.plot(d["round"], d.accuracy_mean, marker="o", label=PAPER_NAMES[m])
        ax.fill_between(d["round"], d.accuracy_mean - d.accuracy_std_over_clients.fillna(0),
                        d.accuracy_mean + d.accuracy_std_over_clients.fillna(0), alpha=0.2)
    ax.set_xlabel("communication round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(("DEMO SCALE — " if scale == "demo" else "") + "FedMCP vs FedAvg (PEFT)", fontsize=9)
    ax.legend()
    data["method"] = data["method"].map(PAPER_NAMES)
    _save_figure(fig, data, png, csv)
    return data


def figure_pair(acc: pd.DataFrame, target: str, png, csv, scale: str) -> pd.DataFrame:
    """Figures 4 and 5: per-client accuracy (mean over runs) of FedMCP and its variant, plus
    the Avg bars; the paper's Avg for each is in the CSV."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variant = {"figure4": "FedMCP-cos", "figure5": "FedMCP-cls"}[target]
    labels = {"figure4": ("CKA", "cosine"), "figure5": ("mean pooling", "[CLS]")}[target]
    paper = load_paper_results()
    paper = paper[(paper.paper == "fedmcp") & (paper.client == "Avg") & (paper.metric == "accuracy")]
    rows = []
    for m, lab in zip(["FedMCP", variant], labels):
        sub = acc[acc.method == m]
        per = sub.groupby("client").accuracy.mean()
        for task in TASKS + ["Avg"]:
            val = float(sub.groupby("seed").accuracy.mean().mean()) if task == "Avg" else float(per.get(task, np.nan))
            ref = paper[(paper.method == PAPER_NAMES[m]) & (paper.table.isin([TABLE_OF[target], "Table I"]))]
            rows.append({"variant": lab, "method": PAPER_NAMES[m], "client": task, "accuracy": val,
                         "paper_avg": float(ref.value.iloc[0]) if task == "Avg" and len(ref) else np.nan})
    data = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = np.arange(len(TASKS) + 1)
    for k, lab in enumerate(labels):
        d = data[data.variant == lab].set_index("client").reindex(TASKS + ["Avg"])
        ax.bar(x + (k - 0.5) * 0.38, d.accuracy, width=0.38, label=lab)
    ax.set_xticks(x, TASKS + ["Avg"], fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(("DEMO SCALE — " if scale == "demo" else "") + TITLES[target].split(": ", 1)[1], fontsize=9)
    ax.legend(fontsize=8)
    _save_figure(fig, data, png, csv)
    return data


def build_figure(target: str, score_paths, log_paths, provenance_paths, png, csv, scale: str) -> pd.DataFrame:
    """Workflow entry for ``fedmcp_figure3`` / ``4`` / ``5``."""
    if target == "figure3":
        return figure3(collect_rounds(log_paths, provenance_paths), png, csv, scale)
    if target in ("figure4", "figure5"):
        return figure_pair(collect_accuracy(score_paths), target, png, csv, scale)
    raise InputError(f"unknown FedMCP figure {target!r}")

