"""FedSUMM's readings of the modulation side by side (issue 14, item 1): per round, the ρ
distribution and the difference between FedSUMM's and FedAvg's server update.

    # 1. train the demo Fig. 6 cells (Table I rows at N = 4: 5 corpora x {bart, ct}, FedAvg and
    #    FedSUMM, 3 rounds) once per reading, keeping each reading's round logs
    python bench/fedsumm_readings.py run --logs /tmp/fedsumm_readings
    # 2. tabulate them
    python bench/fedsumm_readings.py table --logs /tmp/fedsumm_readings \
        --out bench/results/fedsumm_readings.json --md bench/results/fedsumm_readings.md
    # the same for csl's rows over 10 rounds (literal, update_direction, its per-round window)
    python bench/fedsumm_readings.py run --logs /tmp/fedsumm_r10 --rounds 10 \
        --variants literal update_direction update_direction_round
    python bench/fedsumm_readings.py table --logs /tmp/fedsumm_r10 \
        --out bench/results/fedsumm_readings_r10.json --md bench/results/fedsumm_readings_r10.md \
        --what "csl, N = 4, bart and ct, 10 rounds"

``run`` calls Snakemake (``fedsumm_figure6``) with ``config/config.yaml`` plus an overlay that sets
``fedsumm.algorithm.reading`` (and, for the ``*_round`` variants, ``rho_window: round``), then
copies every FedAvg / FedSUMM cell's ``train_log.json`` and ``scores.json`` to
``<logs>/<variant>/<corpus>/n<N>/<model>/<regime>/seed~<s>/``.  Each variant retrains the cells
(the reading is part of the cell config); results/ holds the last variant's cells afterwards.

``table`` reads those logs with :func:`fedrepro.papers.fedsumm.report.rho_summary` (one row per
cell and round: ρ − 1 per client, per parameter entry, per tensor, per modulating group; the
update difference) and averages over the (corpus, model) pairs per variant, regime and round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedrepro.papers.fedsumm.report import RHO_SUMMARY_COLUMNS, rho_summary

VARIANTS = {
    "literal": {"reading": "literal"},
    "per_tensor": {"reading": "per_tensor"},
    "per_layer": {"reading": "per_layer"},
    "update_direction": {"reading": "update_direction"},
    "update_direction_raw": {"reading": "update_direction_raw"},
    "update_direction_rank": {"reading": "update_direction_rank"},
    "update_direction_round": {"reading": "update_direction", "rho_window": "round"},
    "literal_round": {"reading": "literal", "rho_window": "round"},
}
"""Overlays of ``fedsumm.algorithm`` (the ``*_round`` ones: eq. 5's sum over this round only,
to tell the cumulative window's own smoothing from a fall of ρ)."""


def run(logs: Path, variants: list[str], cores: int, rounds: int | None) -> None:
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    for name in variants:
        overlay = logs / f"{name}.yaml"
        lines = ["fedsumm:", "  algorithm:"] + [f"    {k}: {v}" for k, v in VARIANTS[name].items()]
        targets, pattern = ["fedsumm_figure6"], "*/n*/*/Fed*/seed~*/train_log.json"
        if rounds is not None:  # csl's two Table I rows, more rounds
            lines += ["  train:", f"    rounds: {rounds}"]
            targets = [f"results/fedsumm/csl/n4/{m}/FedSUMM/seed~1/train_log.json"
                       for m in ("bart", "ct")]
            pattern = "csl/n4/*/Fed*/seed~*/train_log.json"
        overlay.write_text("\n".join(lines) + "\n")
        cmd = [sys.executable, "-m", "snakemake", "--cores", str(cores), "--configfile",
               "config/config.yaml", str(overlay), "--", *targets]
        print("==", name, flush=True)
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
        for log in sorted((ROOT / "results/fedsumm").glob(pattern)):
            dest = logs / name / log.parent.relative_to(ROOT / "results/fedsumm")
            dest.mkdir(parents=True, exist_ok=True)
            for f in ("train_log.json", "scores.json"):
                shutil.copy2(log.parent / f, dest / f)


def collect(logs: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(logs.glob("*/*/n*/*/Fed*/seed~*/train_log.json")):
        variant, corpus, n, model, regime, seed = path.parent.relative_to(logs).parts
        for entry in json.loads(path.read_text())["rounds"]:
            rows.append({
                "variant": variant, "corpus": corpus, "n": int(n[1:]), "model": model,
                "regime": regime, "seed": int(seed.split("~")[1]), "round": int(entry["round"]),
                "rho_mean": entry["rho_mean"] - 1.0,
                "perplexity": (entry.get("evaluation") or {}).get("perplexity", np.nan),
                **rho_summary(entry),
            })
    if not rows:
        raise SystemExit(f"no round logs under {logs}")
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant and round: FedAvg's and FedSUMM's mean ρ − 1 and FedSUMM's distribution and
    update difference, averaged over the (corpus, model) pairs (min/max columns: min/max)."""
    keys = ["variant", "round"]
    avg = df[df.regime == "FedAvg"].groupby(keys).rho_mean.mean().rename("fedavg_rho")
    summ = df[df.regime == "FedSUMM"]
    agg = {c: ("min" if c.endswith("_min") else "max" if c.endswith("_max") else "mean")
           for c in ["rho_mean", *RHO_SUMMARY_COLUMNS]}
    out = summ.groupby(keys).agg(agg).rename(columns={"rho_mean": "fedsumm_rho"})
    out = out.join(avg)
    # Fig. 6's claim per pair: FedSUMM's ρ below FedAvg's in this round
    both = summ.merge(df[df.regime == "FedAvg"], on=["variant", "corpus", "model", "seed", "round"],
                      suffixes=("", "_avg"))
    out["pairs_fedsumm_below_fedavg"] = both.assign(
        below=both.rho_mean < both.rho_mean_avg).groupby(keys).below.sum()
    out["pairs"] = summ.groupby(keys).size()
    # the pooled validation perplexity of the new global model, FedSUMM over FedAvg (geometric
    # mean over the pairs): whether the reading changes what is learnt
    out["perplexity_ratio"] = both.assign(
        r=np.log(both.perplexity / both.perplexity_avg)).groupby(keys).r.mean().map(np.exp)
    return out.reset_index()


def markdown(s: pd.DataFrame) -> str:
    cols = [
        ("variant", "reading", "{}"), ("round", "t", "{}"),
        ("fedavg_rho", "FedAvg ρ̄−1", "{:.2e}"), ("fedsumm_rho", "FedSUMM ρ̄−1", "{:.2e}"),
        ("pairs_fedsumm_below_fedavg", "SUMM<Avg", "{:.0f}"),
        ("param_p1", "ρ_i−1 p1", "{:.1e}"), ("param_p99", "ρ_i−1 p99", "{:.1e}"),
        ("tensor_max", "tensor max", "{:.1e}"), ("group_p50", "group p50", "{:.1e}"),
        ("group_max", "group max", "{:.1e}"),
        ("update_rel_diff", "‖ΔS−ΔA‖/‖ΔA‖", "{:.4f}"),
        ("update_rel_diff_beyond_scale", "beyond scale", "{:.1e}"),
        ("update_rel_diff_other_assignment", "vs rank", "{:.1e}"),
        ("perplexity_ratio", "ppl SUMM/Avg", "{:.3f}"),
    ]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, r in s.iterrows():
        cells = []
        for key, _, fmt in cols:
            v = r[key]
            cells.append("–" if isinstance(v, float) and np.isnan(v) else fmt.format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("run", "table"))
    ap.add_argument("--logs", type=Path, required=True)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--cores", type=int, default=1)
    ap.add_argument("--rounds", type=int, help="run: csl's rows only, this many rounds")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--what", default="FedSUMM demo Fig. 6 cells (N = 4, 5 corpora x {bart, ct}, "
                    "FedAvg and FedSUMM, 3 rounds) per reading; ρ values as ρ − 1")
    args = ap.parse_args()
    if args.command == "run":
        run(args.logs, args.variants, args.cores, args.rounds)
        return
    df = collect(args.logs)
    s = summarise(df)
    order = {v: f"{i:02d}" for i, v in enumerate(VARIANTS)}
    s = s.sort_values(
        ["variant", "round"],
        key=lambda c: c.map(lambda v: order.get(v, f"99{v}")) if c.name == "variant" else c,
    )
    text = markdown(s)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        summary = json.loads(s.to_json(orient="records"))
        cells = json.loads(df.to_json(orient="records"))
        args.out.write_text(
            "{\n"
            f' "what": {json.dumps(args.what)},\n'
            ' "summary": [\n  ' + ",\n  ".join(json.dumps(r) for r in summary) + "\n ],\n"
            ' "cells": [\n  ' + ",\n  ".join(json.dumps(r) for r in cells) + "\n ]\n}\n"
        )
    if args.md:
        args.md.write_text(text)


if __name__ == "__main__":
    main()
