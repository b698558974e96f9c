"""Measurement: ROUGE of a bf16 prefix cache vs an fp32 one (and the uncached run) on demo cells.

    PYTHONPATH=src python bench/prefix_cache_rouge.py \\
        --provenance results/adafedseleckd/domains/bart-large/AdaFedSelectKD/all/seed~1/provenance.json \\
        --out bench/results/prefix_cache_rouge.json

Takes the cell of a finished demo run (its ``provenance.json``: tiny backbone, client data,
settings), sets ``adafedseleckd.train.backbone_dropout: false`` (which the cache needs), and
trains and evaluates it (the workflow's ``run_row``: training, then beam search and ROUGE on each
client's test set) once per ``prefix_cache`` mode -- ``off``, ``fp32``, ``bf16`` -- for each
``--methods``, into a scratch folder.  ``fp32`` must reproduce ``off`` exactly (same adapters,
same ROUGE); the JSON records the bf16 run's ROUGE difference per client and on average.  Needs
the full environment (Flower's apps run the rounds).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paper_dims import machine, now

from fedrepro.io import read_json, write_json_atomic
from fedrepro.papers.adafedseleckd.evaluate import run_row

MODES = ("off", "fp32", "bf16")


def _absolute(cell: dict, root: Path) -> dict:
    """The cell with its input paths made absolute against the run's project folder ``root``."""
    cell = json.loads(json.dumps(cell))
    cell["backbone_dir"] = str(root / cell["backbone_dir"])
    cell["client_data"] = {c: str(root / p) for c, p in cell["client_data"].items()}
    if cell.get("pos_tags"):
        cell["pos_tags"] = {c: str(root / p) for c, p in cell["pos_tags"].items()}
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provenance", required=True, help="a finished demo cell's provenance.json")
    ap.add_argument("--root", default=".", help="the project folder the cell's paths are relative to")
    ap.add_argument("--methods", nargs="+", default=["AdaFedAvg", "AdaFedSelectKD"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    base = _absolute(read_json(args.provenance)["cell"], Path(args.root).resolve())
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            results[method] = {}
            for mode in MODES:
                cell = json.loads(json.dumps(base))
                cell["method"] = method
                cell["train"] |= {"backbone_dropout": False, "prefix_cache": mode,
                                  "prefix_cache_budget_mb": 1024}
                cell["out_dir"] = str(Path(tmp) / method / mode)
                Path(cell["out_dir"]).mkdir(parents=True)
                t0 = time.perf_counter()
                run_row([cell])
                scores = read_json(Path(cell["out_dir"]) / "scores.json")["per_client"]
                adapters = (Path(cell["out_dir"]) / "adapters.safetensors").read_bytes()
                results[method][mode] = {"per_client": scores, "seconds": time.perf_counter() - t0,
                                         "adapters_bytes": adapters}
    out: dict = {"benchmark": "prefix_cache_rouge", "methods": {}}
    for method, runs in results.items():
        def avg(mode: str, runs=runs) -> float:
            s = runs[mode]["per_client"]
            return sum((v["rouge1"] + v["rouge2"] + v["rougeL"]) / 3 for v in s.values()) / len(s)

        out["methods"][method] = {
            "per_client": {m: runs[m]["per_client"] for m in MODES},
            "average_rouge": {m: avg(m) for m in MODES},
            "bf16_minus_fp32_average_rouge": avg("bf16") - avg("fp32"),
            "fp32_adapters_identical_to_off": runs["fp32"]["adapters_bytes"] == runs["off"]["adapters_bytes"],
            "bf16_adapters_identical_to_off": runs["bf16"]["adapters_bytes"] == runs["off"]["adapters_bytes"],
            "seconds": {m: runs[m]["seconds"] for m in MODES},
        }
    out |= {"what": "demo cell retrained with backbone_dropout false and each prefix_cache mode; "
                    "average ROUGE = mean over clients of mean(R-1, R-2, R-L) F1",
            "cell": {k: base[k] for k in ("backbone", "partition", "seed", "adapter_top_k", "bottleneck")}
            | {"train": base["train"], "provenance": args.provenance},
            "machine": machine("cpu"), "date": now()}
    write_json_atomic(args.out, out)
    print(json.dumps({m: {k: v for k, v in d.items() if k != "per_client"}
                      for m, d in out["methods"].items()}, indent=2))


if __name__ == "__main__":
    main()
