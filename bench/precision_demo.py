"""Measurement: what bf16 mixed precision changes in the *results* of demo cells, against fp32 (CPU).

    # the demo inputs the cells read (tiny backbones, client files), in a project folder ROOT
    # (the repository itself, or a copy of it so as not to touch its results/ and .snakemake/):
    cd ROOT && snakemake --cores 1 results/backbones/bart-large results/backbones/roberta-base \
        results/partitions/adafedseleckd-domains/seed~{1,2,3,4,5}/clients \
        results/partitions/fedmcp-crosstask/seed~1/clients
    # then, from the repository (bench/results/precision_demo.json: seed 1 measured, 2-5 the spread):
    PYTHONPATH=src python bench/precision_demo.py --root ROOT --seeds 1 2 3 4 5 \
        --out bench/results/precision_demo.json

Builds each cell from the demo config (``--config``, default ``config/config.yaml``) with the
paper's own grid -- ``fedrepro.papers.adafedseleckd.grid.make_cell`` (split ``domains``, backbone
``bart-large``, scope ``all``, each of ``--methods``) and ``fedrepro.papers.fedmcp.grid.make_cell``
(the demo's ``roberta-base``, crosstask, each of ``--fedmcp-methods``) -- after setting
``<paper>.precision`` / ``<paper>.frozen_dtype`` in the config section, so the keys enter the cell
exactly as in the workflow (``fedrepro.precision.precision_cell``: an fp32 cell carries neither
key; checked).  Variants (:data:`VARIANTS`):

``fp32``                      today's bits (the reference)
``bf16-mixed``                ``precision: bf16-mixed`` (CPU autocast bfloat16 around forwards)
``bf16-mixed+frozen-bf16``    ``precision: bf16-mixed``, ``frozen_dtype: bf16`` (frozen backbone
                              stored in bfloat16; adapters/heads stay float32)

Each cell is trained (``fedrepro.fl.cell.run_cell``, the ``train_cell`` rule's call) and evaluated
(the paper's ``evaluate_cell``, the ``evaluate_cell`` rule's call) on the CPU in a scratch folder --
the two stages of the row job (``run_row``) on a fresh folder, timed separately.  Recorded per
variant and seed: AdaFedSelecKD's test ROUGE-1/2/L F1 per client and their mean over clients,
FedMCP's test accuracy per task and its mean (all in points, 0-100), the difference to fp32 (same
seed) in points, the share of test predictions identical to fp32's, the per-round training metrics,
and the wall time (train, evaluate).  Each non-fp32 variant also evaluates fp32's adapters in its
own precision (``eval_only_on_fp32_adapters``: what decoding/inference alone changes).
``--seeds``: training seeds (the demo's ``domains`` split is the same for every seed; FedMCP's is
``split_seed``'s); the first is the measurement, the others give fp32's own spread over seeds and
the difference per seed (``summary``).  ``--ada-rounds`` / ``--fedmcp-rounds`` override the
config's ``train.rounds`` (recorded in each ``cell``).  Needs the full environment (Flower's apps
run the rounds).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paper_dims import machine, now

from fedrepro.io import read_json, read_jsonl, write_json_atomic

VARIANTS = {
    "fp32": {"precision": "fp32", "frozen_dtype": "fp32"},
    "bf16-mixed": {"precision": "bf16-mixed", "frozen_dtype": "fp32"},
    "bf16-mixed+frozen-bf16": {"precision": "bf16-mixed", "frozen_dtype": "bf16"},
}
ROUGE = ("rouge1", "rouge2", "rougeL")


def _absolute(cell: dict, root: Path) -> dict:
    """The cell with its input paths made absolute against the project folder ``root``."""
    cell = copy.deepcopy(cell)
    cell["backbone_dir"] = str(root / cell["backbone_dir"])
    cell["client_data"] = {c: str(root / p) for c, p in cell["client_data"].items()}
    if cell.get("pos_tags"):
        cell["pos_tags"] = {c: str(root / p) for c, p in cell["pos_tags"].items()}
    return cell


def _with_precision(config: dict, paper: str, variant: str) -> dict:
    config = copy.deepcopy(config)
    config[paper] |= VARIANTS[variant]
    return config


def _check_keys(cell: dict, variant: str) -> None:
    """The cell carries exactly the non-fp32 keys of the variant (``precision_cell``)."""
    want = {k: v for k, v in VARIANTS[variant].items() if v != "fp32"}
    got = {k: cell[k] for k in ("precision", "frozen_dtype") if k in cell}
    if got != want:
        raise AssertionError(f"{variant}: cell precision keys {got}, expected {want}")


def _train(cell: dict) -> float:
    from fedrepro.fl.cell import run_cell

    folder = Path(cell["out_dir"])
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    run_cell(cell, str(folder / "adapters.safetensors"), str(folder / "train_log.json"),
             str(folder / "provenance.json"))
    return time.perf_counter() - t0


def _evaluate(cell: dict, evaluate, adapters: Path, folder: Path) -> tuple[dict, list[dict], float]:
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    evaluate(cell, str(adapters), str(folder / "predictions.jsonl"), str(folder / "scores.json"))
    seconds = time.perf_counter() - t0
    return read_json(folder / "scores.json"), read_jsonl(folder / "predictions.jsonl"), seconds


def _same_predictions(a: list[dict], b: list[dict]) -> float:
    pa = {(r["client"], r["id"]): r["prediction"] for r in a}
    pb = {(r["client"], r["id"]): r["prediction"] for r in b}
    return sum(pa[k] == pb.get(k) for k in pa) / max(len(pa), 1)


def _round_losses(train_log: dict) -> list[dict]:
    """Per round: the aggregated training metrics the clients reported (train loss; FedMCP's
    per-round test accuracy when ``eval_every_round``)."""
    return [{"round": r.get("round")} | dict(r.get("aggregated_metrics") or {})
            for r in train_log.get("rounds", [])]


def _ada_metrics(scores: dict) -> dict:
    """ROUGE-1/2/L F1 per client and their means over clients (points); ``avg_r1_r2_rl`` is
    ``prefix_cache_rouge.py``'s average ROUGE."""
    pc = {c: {k: v[k] for k in ROUGE} for c, v in scores["per_client"].items()}
    mean = {k: sum(v[k] for v in pc.values()) / len(pc) for k in ROUGE}
    mean["avg_r1_r2_rl"] = sum(mean[k] for k in ROUGE) / 3
    return {"per_client": pc, "mean": mean, "n": {c: v["n"] for c, v in scores["per_client"].items()}}


def _fedmcp_metrics(scores: dict) -> dict:
    """Test accuracy per task (already in points) and its mean over tasks."""
    pc = {c: {"accuracy": v["accuracy"]} for c, v in scores["clients"].items()}
    return {"per_client": pc, "mean": {"accuracy": sum(v["accuracy"] for v in pc.values()) / len(pc)},
            "n": {c: v["n"] for c, v in scores["clients"].items()}}


def _minus(a: dict, b: dict) -> dict:
    """``a - b`` of two metric dicts: the mean's keys and each client's."""
    return {"mean": {k: a["mean"][k] - b["mean"][k] for k in a["mean"]},
            "per_client": {c: {k: v[k] - b["per_client"][c][k] for k in v} for c, v in a["per_client"].items()}}


def _paper(paper: str):
    """(make the cell of (config, method, seed), evaluate_cell, metrics of scores.json)."""
    if paper == "adafedseleckd":
        from fedrepro.papers.adafedseleckd import grid
        from fedrepro.papers.adafedseleckd.evaluate import evaluate_cell

        return (lambda cfg, m, s: grid.make_cell(cfg, "domains", "bart-large", m, "all", s),
                evaluate_cell, _ada_metrics)
    from fedrepro.papers.fedmcp import grid
    from fedrepro.papers.fedmcp.task import evaluate_cell

    return (lambda cfg, m, s: grid.make_cell(cfg, "roberta-base", m, s), evaluate_cell, _fedmcp_metrics)


def run_cells(paper: str, config: dict, root: Path, tmp: Path, method: str, seed: int,
              variants, rounds) -> dict:
    """One demo cell of ``paper`` under each variant: trained and evaluated in that precision;
    each non-fp32 variant also evaluates fp32's adapters (``eval_only_on_fp32_adapters``: what the
    precision of decoding/inference alone changes)."""
    make, evaluate, metrics = _paper(paper)
    runs: dict = {}
    cells: dict = {}
    for variant in variants:
        cell = make(_with_precision(config, paper, variant), method, seed)
        _check_keys(cell, variant)
        cell = _absolute(cell, root)
        if rounds is not None:
            cell["train"]["rounds"] = int(rounds)
        cell["out_dir"] = str(tmp / paper / method / f"seed~{seed}" / variant)
        cells[variant] = cell
        folder = Path(cell["out_dir"])
        print(f"[precision_demo] {paper} {method} seed {seed} {variant} ...", flush=True)
        try:
            train_s = _train(cell)
            scores, preds, eval_s = _evaluate(cell, evaluate, folder / "adapters.safetensors", folder)
        except Exception as e:  # noqa: BLE001 - a finding too: which op bf16 fails on, where
            runs[variant] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            print(runs[variant]["traceback"], flush=True)
            continue
        runs[variant] = {"metrics": metrics(scores), "predictions": preds,
                         "provenance_precision": read_json(folder / "provenance.json").get("precision"),
                         "rounds": _round_losses(read_json(folder / "train_log.json")),
                         "seconds": {"train": train_s, "evaluate": eval_s, "total": train_s + eval_s}}
        print(f"[precision_demo]   {runs[variant]['metrics']['mean']}  {runs[variant]['seconds']}", flush=True)
    ref = runs.get("fp32")
    ok_ref = ref is not None and "error" not in ref
    res: dict = {}
    for variant, r in runs.items():
        if "error" in r:
            res[variant] = r
            continue
        row = {"mean": r["metrics"]["mean"], "per_client": r["metrics"]["per_client"], "n": r["metrics"]["n"],
               "seconds": r["seconds"], "provenance_precision": r["provenance_precision"],
               "rounds": r["rounds"]}
        if ok_ref and variant != "fp32":
            d = _minus(r["metrics"], ref["metrics"])
            row["minus_fp32_points"] = d["mean"]
            row["minus_fp32_points_per_client"] = d["per_client"]
            row["predictions_identical_to_fp32"] = _same_predictions(r["predictions"], ref["predictions"])
            fp32_adapters = Path(cells["fp32"]["out_dir"]) / "adapters.safetensors"
            try:
                scores, preds, eval_s = _evaluate(cells[variant], evaluate, fp32_adapters,
                                                  Path(cells[variant]["out_dir"]) / "eval_only")
                m = metrics(scores)
                row["eval_only_on_fp32_adapters"] = {
                    "mean": m["mean"], "minus_fp32_points": _minus(m, ref["metrics"])["mean"],
                    "predictions_identical_to_fp32": _same_predictions(preds, ref["predictions"]),
                    "seconds": eval_s}
            except Exception as e:  # noqa: BLE001 - recorded, as above
                row["eval_only_on_fp32_adapters"] = {"error": f"{type(e).__name__}: {e}",
                                                     "traceback": traceback.format_exc()}
        res[variant] = row
    res["cell"] = {k: cells[variants[0]][k] for k in
                   ("backbone", "seed", "clients", "train", "adapter_top_k", "bottleneck", "max_length",
                    "model", "partition") if k in cells[variants[0]]}
    return res


def _summary(per_seed: dict, variants) -> dict:
    """Over seeds: each variant's difference to fp32 (mean, min, max, per seed), the same for
    eval-only, and fp32's own spread over seeds (the yardstick a precision effect is read against)."""
    seeds = list(per_seed)
    out: dict = {"seeds": seeds}
    fp32 = [per_seed[s]["fp32"]["mean"] for s in seeds if "mean" in per_seed[s].get("fp32", {})]
    if len(fp32) > 1:
        keys = fp32[0].keys()
        out["fp32_over_seeds"] = {k: {"mean": statistics.mean(x[k] for x in fp32),
                                      "stdev": statistics.stdev(x[k] for x in fp32),
                                      "min": min(x[k] for x in fp32), "max": max(x[k] for x in fp32)}
                                  for k in keys}
    for variant in variants:
        if variant == "fp32":
            continue
        for name, get in (("minus_fp32_points", lambda r: r.get("minus_fp32_points")),
                          ("eval_only_minus_fp32_points",
                           lambda r: (r.get("eval_only_on_fp32_adapters") or {}).get("minus_fp32_points"))):
            ds = [d for s in seeds if (d := get(per_seed[s].get(variant, {}))) is not None]
            if not ds:
                continue
            out.setdefault(variant, {})[name] = {
                k: {"mean": statistics.mean(d[k] for d in ds), "min": min(d[k] for d in ds),
                    "max": max(d[k] for d in ds), "per_seed": [d[k] for d in ds]} for k in ds[0]}
        ident = [per_seed[s][variant]["predictions_identical_to_fp32"] for s in seeds
                 if "predictions_identical_to_fp32" in per_seed[s].get(variant, {})]
        if ident:
            out.setdefault(variant, {})["predictions_identical_to_fp32_mean"] = statistics.mean(ident)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="the project folder holding the demo's results/ inputs")
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "config" / "config.yaml"))
    ap.add_argument("--papers", nargs="+", default=["adafedseleckd", "fedmcp"],
                    choices=["adafedseleckd", "fedmcp"])
    ap.add_argument("--methods", nargs="+", default=["AdaFedAvg", "AdaFedSelectKD"],
                    help="AdaFedSelecKD methods")
    ap.add_argument("--fedmcp-methods", nargs="+", default=["FedMCP"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1],
                    help="training seeds (the first is the measurement; more give fp32's spread)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--ada-rounds", type=int, default=None, help="override adafedseleckd.train.rounds")
    ap.add_argument("--fedmcp-rounds", type=int, default=None, help="override fedmcp.train.rounds")
    ap.add_argument("--keep", default=None, help="train into this folder (kept) instead of a scratch one")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.variants[0] != "fp32":
        ap.error("--variants must start with fp32 (the reference)")
    config = yaml.safe_load(Path(args.config).read_text())
    root = Path(args.root).resolve()
    t0 = time.perf_counter()
    out: dict = {"benchmark": "precision_demo", "variants": {v: VARIANTS[v] for v in args.variants}}
    jobs = [("adafedseleckd", m, args.ada_rounds) for m in args.methods if "adafedseleckd" in args.papers]
    jobs += [("fedmcp", m, args.fedmcp_rounds) for m in args.fedmcp_methods if "fedmcp" in args.papers]
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.keep).resolve() if args.keep else Path(scratch)
        for paper, method, rounds in jobs:
            per_seed = {f"seed~{s}": run_cells(paper, config, root, tmp, method, s, args.variants, rounds)
                        for s in args.seeds}
            out.setdefault(paper, {})[method] = per_seed | {"summary": _summary(per_seed, args.variants)}
    out |= {"what": "demo cells (the config's settings) trained and evaluated on the CPU under each "
                    "precision variant; ROUGE F1 and accuracy in points (0-100), means over "
                    "clients/tasks; minus_fp32_points = variant - fp32 (same seed); "
                    "eval_only_on_fp32_adapters: fp32's adapters evaluated in the variant's precision",
            "config": args.config, "root": str(root), "seeds": args.seeds,
            "total_seconds": time.perf_counter() - t0, "machine": machine("cpu"), "date": now()}
    write_json_atomic(args.out, out)
    brief: dict = {}
    for paper, methods in out.items():
        if paper not in ("adafedseleckd", "fedmcp"):
            continue
        for method, res in methods.items():
            first = res[f"seed~{args.seeds[0]}"]
            brief[f"{paper}/{method}/seed~{args.seeds[0]}"] = {
                v: r.get("error") or {"mean": r["mean"], "minus_fp32": r.get("minus_fp32_points"),
                                      "seconds": r["seconds"]}
                for v, r in first.items() if v in VARIANTS}
    print(json.dumps(brief, indent=2))


if __name__ == "__main__":
    main()
