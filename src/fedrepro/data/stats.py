"""Dataset statistics tables (AdaFedSelecKD Table II) for whichever data the config uses."""

from __future__ import annotations

from importlib import resources

from pathlib import Path

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


# -- every source and every split setting (issue: data layer) ----------------------------------
def text_length(text: str | None, lang: str) -> int:
    """Length of a text: whitespace words for English, non-space characters for Chinese."""
    if not text:
        return 0
    return sum(1 for ch in text if not ch.isspace()) if lang == "zh" else len(text.split())


def _lengths(rec: dict, lang: str) -> tuple[int, int]:
    if "input" in rec:
        return text_length(rec["input"], lang), text_length(rec["target"], lang)
    return text_length(rec.get("text_a"), lang) + text_length(rec.get("text_b"), lang), 0


def records_table(records: list[dict], lang: str, group: str) -> pd.DataFrame:
    """Counts and mean source/target lengths per (group, split)."""
    rows = []
    for rec in records:
        src, tgt = _lengths(rec, lang)
        rows.append({group: rec.get(group) or rec.get("task"), "split": rec["split"], "src": src, "tgt": tgt})
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=[group, "split", "examples", "avg_source_len", "avg_target_len", "unit"])
    out = (
        df.groupby([group, "split"], sort=True)
        .agg(examples=("src", "size"), avg_source_len=("src", "mean"), avg_target_len=("tgt", "mean"))
        .reset_index()
    )
    out["unit"] = "characters" if lang == "zh" else "words"
    return out


def write_data_stats(
    record_files: dict[str, str],
    manifests: list[str],
    sources_csv: str,
    partitions_csv: str,
    figure_dir: str,
    reports: dict[str, str] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-source and per-setting statistics (CSV) and one client-size figure per setting.

    ``reports`` (source → ``prepare_report.json``) adds the number of malformed records each
    source's preparation skipped (``skip_malformed``) as a ``skipped`` column.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedrepro.data import sources
    from fedrepro.io import read_json, read_jsonl

    per_source, by_id, lang_of = [], {}, {}
    for name, path in sorted(record_files.items()):
        lang = sources.get(name).lang
        recs = read_jsonl(path)
        table = records_table(recs, lang, "client")
        table.insert(0, "source", name)
        if reports and name in reports:
            table["skipped_in_source"] = read_json(reports[name])["skipped"]
        per_source.append(table)
        for r in recs:
            by_id[r["id"]] = r
            lang_of[r["id"]] = lang
    src_df = pd.concat(per_source, ignore_index=True) if per_source else pd.DataFrame()
    with atomic_path(sources_csv, suffix=".csv") as tmp:
        src_df.to_csv(tmp, index=False)

    rows = []
    for path in sorted(manifests):
        m = read_json(path)
        setting = m["meta"]["setting"]
        clients = m["clients"]
        for client, splits in clients.items():
            for split, ids in splits.items():
                lens = [_lengths(by_id[i], lang_of[i]) for i in ids if i in by_id]
                rows.append({
                    "setting": setting, "seed": m["meta"].get("seed"), "client": client, "split": split,
                    "examples": len(ids),
                    "avg_source_len": sum(a for a, _ in lens) / max(len(lens), 1),
                    "avg_target_len": sum(b for _, b in lens) / max(len(lens), 1),
                })
        sizes = {c: len(s.get("train", [])) for c, s in clients.items()}
        fig, ax = plt.subplots(figsize=(max(4, 0.35 * len(sizes) + 2), 3))
        ax.bar(range(len(sizes)), list(sizes.values()))
        ax.set_xticks(range(len(sizes)), list(sizes), rotation=90, fontsize=7)
        ax.set_ylabel("training examples")
        ax.set_title(f"{setting} (seed {m['meta'].get('seed')})", fontsize=9)
        fig.tight_layout()
        out_png = Path(figure_dir) / f"{setting}_seed{m['meta'].get('seed')}.png"
        with atomic_path(out_png, suffix=".png") as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)
    part_df = pd.DataFrame(rows)
    with atomic_path(partitions_csv, suffix=".csv") as tmp:
        part_df.to_csv(tmp, index=False)
    return src_df, part_df
