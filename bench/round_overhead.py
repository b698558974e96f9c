"""Benchmark: a federated cell at true model size on each engine -- wall time, peak memory of the
process tree, and the share of the time NOT spent in client training steps (issue 16).

    python bench/round_overhead.py --out bench/results/round_overhead.json

The cell is AdaFedSelecKD (AdaFedSelectKD: two adapter paths, the heaviest method) on
``facebook/bart-large``'s architecture at its true dimensions with random weights (the rehearsal's
``kind: shape`` backbone, :func:`fedrepro.models.backbones.build_shape_backbone`), with the paper's
adapters (top 6 decoder layers, bottleneck 2048: 25.2M parameters sent per client and round), 3
clients, a few training steps each (small batches and short sequences so that it runs on CPU), for
``--rounds`` rounds.  Each engine runs the same cell through :func:`fedrepro.fl.cell.run_cell` in a
fresh process:

* ``inprocess``: :class:`fedrepro.fl.engine.InProcessGrid` (server and clients in one process);
* ``simulation``: Flower's Ray simulation engine (``flwr.simulation.run_simulation``).

Measured: the child's wall time (imports included), ``run_cell``'s wall time (provenance
``wall_time_s``), each round's time (the strategy's round clock, timing files) and the clients'
training-step seconds in it (:class:`fedrepro.devices.StepTimer`: forward, backward, optimizer
step), and the peak of the summed RSS of the process tree (the child and every descendant -- Ray's
GCS, raylet and worker processes -- sampled every 0.1 s; shared pages count once per process, so
this is an upper bound).  The overhead share is ``1 - steps / wall`` for every round, for the
rounds after the first (steady state: the backbone is resident, Ray is up), and for the whole cell.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CLIENTS = ("Academic", "Committee", "Product")


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(3000)] + ["the", "meeting", "we", "should", "budget", "remote"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(60, 120))) for _ in range(n)]


def prepare(work: Path, args) -> tuple[str, dict]:
    """The shape backbone (built once, reused from ``work``) and the clients' folders."""
    from fedrepro.io import write_jsonl_atomic
    from fedrepro.models.backbones import prepare_backbone

    backbone = work / "bart-large-shape"
    if not (backbone / "config.json").exists():
        t0 = time.perf_counter()
        prepare_backbone({"name": "bart-large", "kind": "shape", "hub_id": "facebook/bart-large"},
                         _texts(2000, 0), backbone)
        print(f"shape backbone built in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    folders = {}
    n_train = args.batch_size * args.steps
    for i, client in enumerate(CLIENTS):
        for split, n in (("train", n_train), ("val", 2), ("test", 2)):
            texts = _texts(2 * n, 100 + i)
            records = [
                {"id": f"{client}-{split}-{j:03d}", "source": "bench", "client": client, "split": split,
                 "input": texts[2 * j], "target": texts[2 * j + 1][:200], "meta": {}}
                for j in range(n)
            ]
            write_jsonl_atomic(work / "data" / client / f"{split}.jsonl", records)
        folders[client] = str(work / "data" / client)
    return str(backbone), folders


def make_cell(backbone: str, folders: dict, engine: str, out_dir: Path, args) -> dict:
    clients = list(folders)
    return {
        "paper": "adafedseleckd", "scale": "bench", "backbone": "bart-large",
        "backbone_dir": backbone, "method": args.method, "seed": 0, "partition": "domains",
        "setting": "federated", "clients": clients, "eval_clients": clients,
        "client_data": dict(folders),
        "adapter_top_k": args.top_k, "bottleneck": args.bottleneck,
        "max_source_length": args.source_len, "max_target_length": args.target_len,
        "train": {"rounds": args.rounds, "local_epochs": 1, "lr": 2e-4, "weight_decay": 0.01,
                  "batch_size": args.batch_size, "lam": 0.2, "tau": 5.0, "backbone_dropout": True},
        "generation": {"num_beams": 1, "max_new_tokens": 8, "batch_size": 1},
        "threads": args.threads, "gpus_per_client": 0.0, "clients_per_round": None,
        "keep_round_checkpoints": False, "round_timeout_s": 3600, "engine": engine,
        "device": args.device, "out_dir": str(out_dir),
    }


def child(cell_file: str) -> None:
    """Run one cell in this (fresh) process."""
    from fedrepro.fl.cell import run_cell

    cell = json.loads(Path(cell_file).read_text(encoding="utf-8"))
    out = Path(cell["out_dir"])
    profile_out = os.environ.get("ROUND_OVERHEAD_PROFILE")
    if not profile_out:
        run_cell(cell, out / "adapters.safetensors", out / "train_log.json", out / "provenance.json")
        return
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.runcall(run_cell, cell, out / "adapters.safetensors", out / "train_log.json",
                 out / "provenance.json")
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(60)
    Path(profile_out).write_text(text.getvalue(), encoding="utf-8")


def run_engine(cell: dict, work: Path) -> dict:
    """``cell`` in a child process; the peak summed RSS of its process tree, sampled."""
    import psutil

    cell_file = work / f"cell-{cell['engine']}.json"
    cell_file.write_text(json.dumps(cell), encoding="utf-8")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(cell_file)],
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                [str(ROOT / "src")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))))
    root = psutil.Process(proc.pid)
    peak, peak_procs = 0, 0
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        if total > peak:
            peak, peak_procs = total, len(procs)
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cell['engine']} cell failed with exit code {proc.returncode}")
    prov = json.loads((Path(cell["out_dir"]) / "provenance.json").read_text(encoding="utf-8"))
    rounds = []
    for r in prov["timing"]["rounds"]:
        steps = sum(c.get("seconds_steps", 0.0) for c in r["clients"])
        rounds.append({"round": r["round"], "seconds": r["seconds"], "seconds_client_steps": steps,
                       "overhead_share": 1 - steps / r["seconds"],
                       "server_peak_rss_mb": r.get("server_peak_rss_mb")})
    steps_all = sum(r["seconds_client_steps"] for r in rounds)
    later = rounds[1:]
    steady = (1 - sum(r["seconds_client_steps"] for r in later) / sum(r["seconds"] for r in later)
              if later else None)
    return {
        "engine": cell["engine"],
        "process_wall_s": wall,
        "run_cell_wall_s": prov["wall_time_s"],
        "rounds": rounds,
        "client_steps_s": steps_all,
        "overhead_share_rounds_after_first": steady,
        "overhead_share_first_round": rounds[0]["overhead_share"],
        "overhead_share_run_cell": 1 - steps_all / prov["wall_time_s"],
        "overhead_share_process": 1 - steps_all / wall,
        "peak_tree_rss_bytes": peak,
        "processes_at_peak": peak_procs,
        "driver_peak_rss_mb": prov["timing"]["peak_rss_mb"],
        "bytes_up_per_round": prov["bytes_per_round"][0]["up"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the JSON to write")
    ap.add_argument("--engines", default="inprocess,simulation")
    ap.add_argument("--method", default="AdaFedSelectKD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="training steps per client and round")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--source-len", type=int, default=64)
    ap.add_argument("--target-len", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=6, help="paper: 6 for bart-large")
    ap.add_argument("--bottleneck", type=int, default=2048, help="paper: 2048 for bart-large")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu | cuda (the cell's device)")
    ap.add_argument("--work-dir", default=None, help="keeps the shape backbone between runs")
    ap.add_argument("--profile", default=None,
                    help="write a cProfile top 60 (cumulative) of the cell's process to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    if not args.out:
        ap.error("--out is required")
    if args.profile:  # the child process reads it (run_engine passes the environment on)
        os.environ["ROUND_OVERHEAD_PROFILE"] = str(Path(args.profile).resolve())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from fedrepro.io import write_json_atomic

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="round-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    backbone, folders = prepare(work, args)
    results = {}
    for engine in args.engines.split(","):
        out_dir = Path(tempfile.mkdtemp(prefix=f"cell-{engine}-", dir=work))
        results[engine] = run_engine(make_cell(backbone, folders, engine, out_dir, args), work)
        r = results[engine]
        print(f"[{engine}] wall {r['run_cell_wall_s']:.1f} s, steps {r['client_steps_s']:.1f} s, "
              f"overhead rounds>1 {r['overhead_share_rounds_after_first']:.3f}, cell "
              f"{r['overhead_share_run_cell']:.3f}, peak tree RSS {r['peak_tree_rss_bytes'] / 1e9:.2f} GB",
              file=sys.stderr, flush=True)
    meta = json.loads((Path(backbone) / "fedrepro_backbone.json").read_text(encoding="utf-8"))
    write_json_atomic(args.out, {
        "benchmark": "round_overhead",
        "what": ("one AdaFedSelecKD cell at bart-large's true size (random weights), 3 clients, per "
                 "engine: wall time, peak RSS of the process tree, share of the time not spent in "
                 "client training steps (per round, rounds after the first, whole cell)"),
        "target": "overhead share <= 0.05 for the paper-scale engine (rounds after the first)",
        "settings": {k: v for k, v in vars(args).items() if k not in ("child",)}
        | {"clients": len(folders), "backbone_parameters": meta["parameters"],
           "backbone": "facebook/bart-large architecture, kind: shape (random weights)"},
        "engines": results,
        "machine": {"hostname": platform.node(), "platform": platform.platform(),
                    "cpus": os.cpu_count(), "torch": torch.__version__,
                    "python": platform.python_version(),
                    "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                    "loadavg_at_end": os.getloadavg(), "cuda": torch.cuda.is_available()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                     text=True, check=False).stdout.strip(),
    })


if __name__ == "__main__":
    main()
