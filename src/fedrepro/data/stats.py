"""Dataset statistics tables (AdaFedSelecKD Table II) for whichever data the config uses."""

from __future__ import annotations

from importlib import resources

import pandas as pd

from fedrepro.data.qmsum import table2_stats
from fedrepro.io import atomic_path, write_text_atomic


def write_qmsum_stats(raw_root: str, csv_out: str, md_out: str) -> pd.DataFrame:
    """Write Table II computed on ``raw_root`` (csv) and a markdown table with the paper's beside it."""
    ours = table2_stats(raw_root)
    with atomic_path(csv_out, suffix=".csv") as tmp:
        ours.to_csv(tmp, index=False)
    ref_path = resources.files("fedrepro") / "resources" / "qmsum_table2.csv"
    paper = pd.read_csv(ref_path)
    merged = ours.merge(paper, on=["domain", "split"], suffixes=("", " (paper)"), how="left")
    cols = ["domain", "split"]
    for c in ours.columns[2:]:
        cols += [c, f"{c} (paper)"]
    lines = [
        f"# QMSum statistics (AdaFedSelecKD Table II) computed on `{raw_root}`",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for _, row in merged[cols].iterrows():
        lines.append("| " + " | ".join(_fmt(row[c]) for c in cols) + " |")
    write_text_atomic(md_out, "\n".join(lines) + "\n")
    return ours


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)
