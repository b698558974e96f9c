"""The rehearsal report: ``results/rehearsal/report.{json,md}``.

Per cell (:func:`fedrepro.rehearsal.plan.cells`): status (a failed cell names its job log and the
error lines at its end), wall time per round, optimizer step time, peak process memory (the
Snakemake benchmark's ``max_rss`` of the cell's jobs, Ray workers included) and peak GPU memory
where CUDA was used, bytes on the wire per round, and whether the declared job resources cover
what was measured, projected to the paper's full rounds and data:

* a full round makes ``sum_i E * ceil(n_i / B)`` optimizer steps over the round's clients (``n_i``
  the client's training examples in its data folder, ``B`` the paper batch, ``E`` local epochs);
  a step at batch ``B`` is taken as the measured step at the rehearsal's batch
  ``b = min(B, examples_per_client)`` times ``B / b`` (linear in the batch: pessimistic on a GPU,
  about right on a CPU); the rest of a measured round (server, messages, evaluation) is kept as
  measured; the job's start-up (its wall time outside the rounds) is added once;
* memory is compared as measured (at batch ``b``; activations grow with the batch, so on a GPU
  rerun the rehearsal with ``examples_per_client`` >= the batch to measure it at full batch).

Device-hours per table: the number of cells of the paper grid that build the table times the
projected training hours of the matching rehearsal cell (same paper, method and backbone; else
the paper's mean).  Projections are estimates from a few steps; they say so.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from fedrepro.io import read_json, write_json_atomic, write_text_atomic

ERROR_MARKERS = ("Error", "error", "Traceback", "Exception", "Killed", "MemoryError")


def _read_benchmark(path: Path) -> dict | None:
    """Snakemake's benchmark TSV: ``s`` (wall seconds), ``max_rss`` (MB), ... (last row)."""
    if not path.exists():
        return None
    rows = list(csv.DictReader(path.open(), delimiter="\t"))
    if not rows:
        return None
    out = {}
    for key in ("s", "max_rss", "max_vms", "max_uss", "cpu_time"):
        try:
            out[key] = float(rows[-1][key])
        except (KeyError, TypeError, ValueError):
            out[key] = None
    return out


def _failure_reason(log: Path) -> str:
    if not log.exists():
        return f"the job did not run or left no log ({log}); see Snakemake's output"
    lines = log.read_text(errors="replace").splitlines()
    hits = [ln for ln in lines if any(m in ln for m in ERROR_MARKERS)]
    tail = (hits or lines)[-3:]
    return f"{log}: " + " | ".join(ln.strip()[:300] for ln in tail)


def _train_sizes(cell: dict, root: Path) -> list[int] | None:
    sizes = []
    for client in cell.get("clients", []):
        folder = (cell.get("client_data") or {}).get(client)
        path = root / str(folder) / "train.jsonl" if folder else None
        if path is None or not path.exists():
            return None
        with path.open("rb") as fh:
            sizes.append(sum(1 for line in fh if line.strip()))
    return sizes


def _epochs(train: dict) -> int:
    for key in ("local_epochs", "epochs"):
        if key in train:
            return int(train[key])
    return 1


def measure_cell(entry: dict, root: Path, settings: dict, full_rounds: int | None) -> dict:
    """The report row of one rehearsal cell (``root``: the rehearsal's working directory)."""
    out = {k: entry[k] for k in ("paper", "method", "backbone", "setting", "cell")}
    missing = [f for f in entry["files"] if not (root / f).exists()]
    benches = {j: _read_benchmark(root / spec["benchmark"]) for j, spec in entry["jobs"].items()}
    out["declared"] = {j: spec["resources"] for j, spec in entry["jobs"].items()}
    if missing:
        out["status"] = "failed"
        out["reason"] = "; ".join(_failure_reason(root / spec["log"]) for spec in entry["jobs"].values())
        out["missing"] = missing
        return out
    out["status"] = "ok"
    prov = read_json(root / entry["cell"] / "provenance.json")
    cell = prov["cell"]
    timing = prov.get("timing") or {}
    rounds = timing.get("rounds") or []
    round_s = [float(r["seconds"]) for r in rounds if r.get("seconds") is not None]
    steps = [c.get("seconds_per_step") for r in rounds for c in r.get("clients", [])]
    steps = [float(x) for x in steps if x]
    step_total = [sum(float(c.get("seconds_steps") or 0) for c in r.get("clients", [])) for r in rounds]
    gpu = [float(c["peak_gpu_mb"]) for r in rounds for c in r.get("clients", []) if c.get("peak_gpu_mb")]
    train = cell.get("train", {})
    batch = int(train.get("batch_size", 1))
    eff_batch = min(batch, int(settings["examples_per_client"]))
    bytes_rounds = prov.get("bytes_per_round") or []
    train_bench = benches.get("train") or {}
    eval_bench = benches.get("evaluate") or {}
    shared_by = int(entry["jobs"]["train"].get("shared_by", 1))
    rss = [b.get("max_rss") for b in benches.values() if b and b.get("max_rss") is not None]
    out.update({
        "engine": prov.get("engine"),
        "device": "cuda" if (prov.get("machine") or {}).get("cuda") and gpu else "cpu",
        "rounds_run": len(round_s),
        "wall_s": prov.get("wall_time_s"),
        "train_job_s": train_bench.get("s"),
        "evaluate_job_s": eval_bench.get("s"),
        "job_cells": shared_by,
        "round_s": round_s,
        "step_s": statistics.median(steps) if steps else None,
        "steps_per_round": [
            round(sum(float(c.get("seconds_steps") or 0) / float(c["seconds_per_step"])
                      for c in r.get("clients", []) if c.get("seconds_per_step")))
            for r in rounds
        ],
        "batch_size": batch,
        "effective_batch": eff_batch,
        "peak_rss_mb": max(rss) if rss else None,
        "driver_peak_rss_mb": timing.get("peak_rss_mb"),
        "peak_gpu_mb": max(gpu) if gpu else None,
        "bytes_per_round": (
            statistics.mean(b["down"] + b["up"] for b in bytes_rounds) if bytes_rounds else 0
        ),
        "parameters": prov.get("parameters"),
    })
    # -- projection to the paper's rounds and data
    sizes = _train_sizes(cell, root)
    proj: dict = {"full_rounds": full_rounds, "assumption": "step time linear in the batch"}
    if sizes is not None and steps and round_s and full_rounds:
        per_round_clients = int(cell.get("clients_per_round") or len(sizes))
        frac = per_round_clients / max(len(sizes), 1)
        full_steps = frac * sum(_epochs(train) * math.ceil(n / batch) for n in sizes)
        step_full = statistics.median(steps) * batch / eff_batch
        overhead = max(statistics.mean(r - s for r, s in zip(round_s, step_total)), 0.0)
        startup = max(float(prov.get("wall_time_s") or 0) - sum(round_s), 0.0)
        train_s = full_rounds * (full_steps * step_full + overhead) + startup
        proj.update({
            "client_train_examples": sizes,
            "steps_per_round": full_steps,
            "step_s_at_paper_batch": step_full,
            "round_s": full_steps * step_full + overhead,
            "train_hours": train_s / 3600,
        })
        declared = out["declared"]["train"]
        runtime_min = declared.get("runtime")
        if runtime_min:
            # a row job trains several cells: compare its share of the declared runtime
            proj["runtime_covered"] = train_s / 60 <= float(runtime_min) / shared_by
    mem = out["declared"]["train"].get("mem_mb")
    if mem and out.get("peak_rss_mb"):
        proj["memory_covered"] = out["peak_rss_mb"] <= float(mem)
    out["projection"] = proj
    return out


def _match(rows: list[dict], paper: str, path: str) -> list[dict]:
    parts = set(Path(path).parts)
    mine = [r for r in rows if r["paper"] == paper and r.get("projection", {}).get("train_hours")]
    both = [r for r in mine if r["method"] in parts and r["backbone"] in parts]
    if both:
        return both
    same_backbone = [r for r in mine if r["backbone"] in parts]
    return same_backbone or mine


def table_hours(rows: list[dict], grids: dict[str, dict[str, list[str]]]) -> list[dict]:
    """``grids``: paper -> table/figure -> the full grid's cell folders."""
    out = []
    for paper, targets in grids.items():
        for target, cells in targets.items():
            hours, matched = 0.0, True
            for cell in cells:
                m = _match(rows, paper, cell)
                if not m:
                    matched = False
                    break
                hours += statistics.mean(r["projection"]["train_hours"] for r in m)
            out.append({"paper": paper, "target": target, "cells": len(set(cells)),
                        "train_hours": round(hours, 2) if matched else None})
    return out


def _fmt(x, digits=1):
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "**NO**"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def render_md(report: dict) -> str:
    s = report["settings"]
    lines = [
        "# Paper-scale rehearsal",
        "",
        f"{report['summary']['ok']} of {report['summary']['cells']} cells ok, "
        f"{report['summary']['failed']} failed; machine: {report['machine']}; "
        f"{s['rounds']} round(s), {s['examples_per_client']} training / {s['eval_examples']} "
        f"evaluation examples per client, generation capped at {s['max_new_tokens']} new tokens, "
        f"coverage `{s['coverage']}`, data `{s['data']}`, backbones `{s['backbones']}`.",
        "",
        "Backbones: " + ", ".join(f"{k} ({v})" for k, v in sorted(report["backbones"].items())),
        "",
        "| paper | method | backbone | setting | status | s/round | step s (batch) | peak RSS MB "
        "| declared MB | mem ok | bytes/round | projected train h | declared h | time ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["cells"]:
        p = r.get("projection") or {}
        d = (r.get("declared") or {}).get("train", {})
        rs = r.get("round_s") or []
        declared_h = d.get("runtime") / 60 / r.get("job_cells", 1) if d.get("runtime") else None
        lines.append(
            f"| {r['paper']} | {r['method']} | {r['backbone']} | {r['setting']} | {r['status']} "
            f"| {_fmt(statistics.mean(rs) if rs else None)} "
            f"| {_fmt(r.get('step_s'), 2)} ({r.get('effective_batch', '–')}/{r.get('batch_size', '–')}) "
            f"| {_fmt(r.get('peak_rss_mb'), 0)} | {_fmt(d.get('mem_mb'))} | {_fmt(p.get('memory_covered'))} "
            f"| {_fmt(r.get('bytes_per_round'))} | {_fmt(p.get('train_hours'), 2)} | {_fmt(declared_h, 1)} "
            f"| {_fmt(p.get('runtime_covered'))} |"
        )
    failed = [r for r in report["cells"] if r["status"] != "ok"]
    if failed:
        lines += ["", "## Failed cells", ""]
        lines += [f"- `{r['cell']}`: {r.get('reason')}" for r in failed]
    lines += ["", f"## Projected {report['device_hours_unit']} per table (training only)", "",
              "| paper | table/figure | cells | hours |", "|---|---|---|---|"]
    lines += [f"| {t['paper']} | {t['target']} | {t['cells']} | {_fmt(t['train_hours'], 2)} |"
              for t in report["tables"]]
    lines += ["", "Notes: " + " ".join(report["notes"]), ""]
    return "\n".join(lines)


def build(plan: dict, root: str | Path, json_out: str | Path, md_out: str | Path) -> dict:
    """Write the report from the rehearsal ``plan`` (``rehearsal_plan`` rule: the cells, the
    settings, the paper rounds, the full grid per table, the backbones)."""
    root = Path(root)
    settings = plan["settings"]
    rows = [measure_cell(e, root, settings, plan["full_rounds"].get(e["paper"])) for e in plan["cells"]]
    ok = sum(r["status"] == "ok" for r in rows)
    cuda = any(r.get("device") == "cuda" for r in rows)
    backbones = {}
    for name, folder in plan.get("backbone_dirs", {}).items():
        meta = root / folder / "fedrepro_backbone.json"
        if meta.exists():
            info = read_json(meta)
            backbones[name] = info.get("scale") or info.get("kind") or "local"
        elif (root / folder).exists():
            backbones[name] = "checkpoint"
        else:
            backbones[name] = "not built"
    report = {
        "summary": {"cells": len(rows), "ok": ok, "failed": len(rows) - ok},
        "machine": plan.get("machine"),
        "settings": settings,
        "backbones": backbones,
        "cells": rows,
        "device_hours_unit": "GPU-hours" if cuda else "CPU-hours (this machine)",
        "tables": table_hours(rows, plan["grids"]),
        "notes": [
            "Projections scale a few measured steps to the paper's rounds and the data in the client "
            "folders the rehearsal used (the generated samples with data: samples -- not the paper's "
            "corpus sizes -- so rerun with data: configured on the real data for real figures).",
            "Memory is measured at the rehearsal's batch (see the effective batch column).",
            "kind: shape backbones have random weights: time and memory only, no results.",
        ],
    }
    write_json_atomic(json_out, report)
    write_text_atomic(md_out, render_md(report))
    return report


def machine() -> str:
    """This machine in words (CPU count, memory, GPU)."""
    import os
    import platform

    import torch

    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gb = float("nan")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.node()}: {os.cpu_count()} CPUs, {mem_gb:.0f} GiB, {gpu}"


def main(argv: list[str] | None = None) -> int:
    """Write the report of a rehearsal folder from whatever it holds (``make rehearse`` calls it
    when Snakemake stopped on a failed cell, so the failures are reported too)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("root", nargs="?", default="results/rehearsal")
    args = parser.parse_args(argv)
    root = Path(args.root)
    plan_path = root / "plan.json"
    if not plan_path.exists():
        raise SystemExit(f"{plan_path}: no rehearsal plan; run `make rehearse` first")
    report = build(read_json(plan_path), root, root / "report.json", root / "report.md")
    print(f"{root / 'report.md'}: {report['summary']['ok']} of {report['summary']['cells']} cells ok")
    return 0 if report["summary"]["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
