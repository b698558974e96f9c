"""Benchmark: FedSUMM's per-round cost beyond its clients' training steps, at the paper model's
true size (issue 25, item 3).

    python bench/fedsumm_round_overhead.py --out bench/results/fedsumm_round_overhead_cpu.json
    python bench/fedsumm_round_overhead.py --out bench/results/fedsumm_round_overhead_cpu.json \
        --clients 3 --profile                      # + a cProfile top-40 (cumulative) per regime
    python bench/fedsumm_round_overhead.py --out bench/results/fedsumm_round_overhead_h100.json \
        --device cuda --clients 10 --threads 4

A FedSUMM cell of the paper config (``config/paper.yaml`` ``fedsumm`` with the rehearsal overlay
``config/rehearsal.yaml``: 2 rounds, 2 training and 2 evaluation examples per client, generation
capped at 8 new tokens; corpus ``csl``, model ``bart``, so ROUGE-L is computed every round as in
Fig. 5a; the ``update_direction_rank`` ρ reading, server state on disk in waves of 4) is built by
:func:`fedrepro.papers.fedsumm.grid.make_cell` and trained through the project's runner
(:func:`fedrepro.fl.cell.run_cell`, in-process engine) on ``fnlp/bart-base-chinese``'s architecture
at its true size with random weights (``kind: shape``, 116 M parameters, the vocabulary from the
synthetic training text), once per regime (``FedSUMM`` and ``FedAvg``), each in a fresh process.
The clients' data are synthetic Chinese texts (~250-character inputs, ~20-character summaries).

Per round: the round's wall seconds (the strategy's round clock, provenance ``timing``), the
seconds in the clients' training steps (:class:`fedrepro.devices.StepTimer`'s ``seconds_steps``:
forward, backward, optimizer step), the overhead share ``1 - steps / round``, and a breakdown of
the rest from timers the child process wraps around the phases of a round (inclusive seconds;
nested phases are listed with their parent as prefix, e.g. ``client.train/build_model``):

* client side (:mod:`fedrepro.papers.fedsumm.task`): ``client.train`` (one client's
  ``client_train_round``) and in it ``build_model``, ``load_state``, ``guidance``,
  ``local_update`` (its steps are ``seconds_steps``), ``shared_state`` (the reply's tensors);
  ``client.evaluate`` (``client_evaluate``) and in it ``build_model``, ``load_state``, ``nll``,
  ``generate``; the ClientApp's message conversions (``flwr.to_torch_state_dict``,
  ``flwr.ArrayRecord``);
* server side (:mod:`fedrepro.papers.fedsumm.strategy`): ``server.client_records`` (the guidance
  sent with a train message), ``server.spool_reply``, ``server.aggregate_arrays`` and in it
  ``server_round`` / ``rho`` (the ρ reading) / ``finish_round`` (adapter and mean),
  ``server.evaluate_global`` (the evaluate messages to every client), ``server.save_server_state``;
  the server-step check and the round checkpoint run in the round writer thread while the next
  round trains (:mod:`fedrepro.fl.strategy`), listed as ``background/server.server_step`` and
  ``background/server.save_global`` (outside the round's clock, so not in ``other``).

``page_cache`` per round (Linux): the largest ``Dirty`` and ``Writeback`` of ``/proc/meminfo`` in MB,
sampled every 0.25 s by a thread of the child, and ``Dirty`` when each server-state save began --
to test the reading of the H200 profile (34.8 s inside one ``torch.save`` of the few-kB disk-storage
server state): the kernel throttling a writer while the round's ~10 GB of spooled replies and
vector files wait to reach the disk.  ``--storage memory`` keeps the server's vectors in RAM
(``fedsumm.server_state.storage``; the paper config's ``disk`` by default) for a side-by-side run.

``other`` is the round's seconds not in a top-level phase.  ``--profile`` writes a cProfile top 40
by cumulative time of each regime's child next to the JSON (``<out stem>_<regime>.prof.txt``).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import platform
import pstats
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

REGIMES = ("FedSUMM", "FedAvg")
# a few thousand common CJK characters: the synthetic texts' alphabet
CHARS = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)] + list("，。的了是在和有")


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice(CHARS) for _ in range(rng.randint(lo, hi)))


def _merge(a: dict, b: dict) -> dict:
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            _merge(a[k], v)
        else:
            a[k] = v
    return a


def paper_config() -> dict:
    """config/paper.yaml with the rehearsal overlay applied (as ``make rehearse`` reads it)."""
    import yaml

    from fedrepro.rehearsal import plan

    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text(encoding="utf-8"))
    _merge(config, yaml.safe_load((ROOT / "config" / "rehearsal.yaml").read_text(encoding="utf-8")))
    return plan.apply(config, ROOT)


def prepare(work: Path, args, config: dict) -> tuple[str, dict]:
    """The clients' folders and the shape backbone (built once, reused from ``work``)."""
    from fedrepro.io import write_jsonl_atomic
    from fedrepro.papers.fedsumm.grid import client_names
    from fedrepro.papers.fedsumm.task import prepare_backbone

    folders, files = {}, []
    for i, client in enumerate(client_names("csl", args.clients)):
        rng = random.Random(f"bench/{client}")
        for split in ("train", "val", "test"):
            records = [
                {"id": f"{client}-{split}-{j}", "source": "csl", "client": client, "split": split,
                 "input": _text(rng, 200, 300), "target": _text(rng, 15, 25), "meta": {}}
                for j in range(args.examples)
            ]
            path = work / "data" / client / f"{split}.jsonl"
            write_jsonl_atomic(path, records)
            files.append(str(path))
        folders[client] = str(work / "data" / client)
    backbone = work / "bart-base-chinese-shape"
    if not (backbone / "config.json").exists():
        t0 = time.perf_counter()
        settings = dict(config["fedsumm"]["backbone"], kind="shape")
        prepare_backbone(settings, files, str(backbone))
        print(f"shape backbone built in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return str(backbone), folders


def make_cell(config: dict, backbone: str, folders: dict, regime: str, out_dir: Path, args) -> dict:
    from fedrepro.papers.fedsumm.grid import make_cell as fedsumm_cell

    cell = fedsumm_cell(config, "csl", args.clients, "bart", regime, 0)
    cell.update({
        "backbone_dir": backbone, "client_data": dict(folders), "out_dir": str(out_dir),
        "device": args.device, "threads": args.threads,
        "gpus_per_client": 1.0 if args.device == "cuda" else 0.0,
    })
    cell["train"]["rounds"] = args.rounds
    if args.storage:
        cell["server_state"] = dict(cell["server_state"], storage=args.storage)
    cell["rehearsal"] = {"examples_per_client": args.examples, "eval_examples": args.examples}
    return cell


# -- the child: phase timers around the round's work ----------------------------------------------
class Phases:
    """Inclusive seconds per phase and round; nested phases get their parent's name as prefix."""

    def __init__(self) -> None:
        self.round = 0
        self.seconds: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.calls: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        # one stack per thread: the server waits while a client runs (one thread), but a round's
        # server-step check and files are written by the round writer thread meanwhile
        # (fedrepro.fl.strategy); its phases are listed under "background/"
        self._local = threading.local()

    def wrap(self, owner, attr: str, name: str) -> None:
        original = getattr(owner, attr)
        is_static = isinstance(owner, type) and isinstance(owner.__dict__.get(attr), staticmethod)
        phases = self

        @functools.wraps(original)
        def timed(*a, **kw):
            stack = getattr(phases._local, "stack", None)
            if stack is None:
                main = threading.current_thread() is threading.main_thread()
                stack = phases._local.stack = [] if main else ["background"]
            full = "/".join([*stack, name])
            stack.append(name)
            t0 = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                stack.pop()
                phases.seconds[phases.round][full] += time.perf_counter() - t0
                phases.calls[phases.round][full] += 1

        setattr(owner, attr, staticmethod(timed) if is_static else timed)


def install_timers(phases: Phases) -> None:
    from flwr.app import ArrayRecord

    import fedrepro.fl.strategy as fl_strategy
    from fedrepro.papers.fedsumm import algorithm, strategy, task

    for attr, name in (("client_train_round", "client.train"), ("client_evaluate", "client.evaluate"),
                       ("build_model", "build_model"), ("load_shared_state", "load_state"),
                       ("guidance_from_records", "guidance"), ("fedsumm_local_update", "local_update"),
                       ("shared_state", "shared_state"), ("nll_sums", "nll"), ("generate", "generate"),
                       ("initial_state", "initial_state")):
        phases.wrap(task, attr, name)
    phases.wrap(ArrayRecord, "to_torch_state_dict", "flwr.to_torch_state_dict")
    phases.wrap(ArrayRecord, "__init__", "flwr.ArrayRecord")
    S = strategy.FedSummStrategy
    for attr, name in (("client_records", "server.client_records"), ("spool_reply", "server.spool_reply"),
                       ("aggregate_arrays", "server.aggregate_arrays"),
                       ("evaluate_global", "server.evaluate_global"),
                       ("save_server_state", "server.save_server_state")):
        phases.wrap(S, attr, name)
    phases.wrap(fl_strategy, "save_state", "server.save_global")
    phases.wrap(fl_strategy, "server_step", "server.server_step")  # in the round writer thread
    for cls in (algorithm.FedSummServer, strategy.FedAvgServer):
        if "server_round" in cls.__dict__:
            phases.wrap(cls, "server_round", "server_round")
    phases.wrap(algorithm.FedSummServer, "_rho", "rho")
    phases.wrap(algorithm.FedSummServer, "_finish_round", "finish_round")

    phases.wrap(S, "configure_train", "server.configure_train")  # before the round clock starts
    timed = S.configure_train

    def configure_train(self, server_round, *a, **kw):
        phases.round = server_round + self.round_offset  # what follows belongs to this round
        return timed(self, server_round, *a, **kw)

    S.configure_train = configure_train


def _meminfo_mb(keys=("Dirty", "Writeback")) -> dict[str, float]:
    """``/proc/meminfo``'s ``keys`` in MB ({} where there is no such file)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in keys:
            out[name] = int(rest.split()[0]) / 1024
    return out


class PageCacheSampler(threading.Thread):
    """Largest ``Dirty`` / ``Writeback`` (MB) per round, sampled every ``every`` seconds."""

    def __init__(self, phases: Phases, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.phases, self.every = phases, every
        self.peak: dict[int, dict[str, float]] = defaultdict(dict)
        self.at_save: dict[int, list[float]] = defaultdict(list)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.sample()

    def sample(self) -> None:
        peak = self.peak[self.phases.round]
        for k, v in _meminfo_mb().items():
            peak[k] = max(peak.get(k, 0.0), round(v, 1))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def child(cell_file: str, profile_out: str | None) -> None:
    from fedrepro.fl.cell import run_cell
    from fedrepro.papers.fedsumm import strategy

    cell = json.loads(Path(cell_file).read_text(encoding="utf-8"))
    out = Path(cell["out_dir"])
    phases = Phases()
    install_timers(phases)
    sampler = PageCacheSampler(phases)
    save = strategy.FedSummStrategy.save_server_state

    def save_server_state(self, absolute_round):  # the page cache when the save begins
        sampler.at_save[phases.round].append(round(_meminfo_mb().get("Dirty", float("nan")), 1))
        return save(self, absolute_round)

    strategy.FedSummStrategy.save_server_state = save_server_state
    sampler.start()
    prof = cProfile.Profile() if profile_out else None
    if prof:
        prof.enable()
    t0 = time.perf_counter()
    run_cell(cell, str(out / "adapters.safetensors"), str(out / "train_log.json"),
             str(out / "provenance.json"))
    wall = time.perf_counter() - t0
    sampler.stop()
    if prof:
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
        Path(profile_out).write_text(s.getvalue(), encoding="utf-8")
    (out / "phases.json").write_text(json.dumps({
        "wall_s": wall,
        "seconds": {r: dict(v) for r, v in phases.seconds.items()},
        "calls": {r: dict(v) for r, v in phases.calls.items()},
        "page_cache": {r: {"peak_mb": dict(sampler.peak.get(r, {})),
                           "dirty_mb_at_server_state_save": sampler.at_save.get(r, [])}
                       for r in sorted(set(sampler.peak) | set(sampler.at_save))},
    }), encoding="utf-8")


def run_regime(cell: dict, work: Path, profile_out: str | None) -> dict:
    cell_file = work / f"cell-{cell['regime']}.json"
    cell_file.write_text(json.dumps(cell), encoding="utf-8")
    cmd = [sys.executable, __file__, "--child", str(cell_file)]
    if profile_out:
        cmd += ["--child-profile", profile_out]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))))
    process_wall = time.perf_counter() - t0
    out = Path(cell["out_dir"])
    prov = json.loads((out / "provenance.json").read_text(encoding="utf-8"))
    phases = json.loads((out / "phases.json").read_text(encoding="utf-8"))
    rounds = []
    for r in prov["timing"]["rounds"]:
        steps = sum(c.get("seconds_steps", 0.0) for c in r["clients"])
        sec = phases["seconds"].get(str(r["round"]), {})
        # top-level phases inside the round clock (configure_train runs before it starts)
        top = {k: v for k, v in sec.items() if "/" not in k and k != "server.configure_train"}
        breakdown = {k: round(v, 4) for k, v in sorted(sec.items())}
        rounds.append({
            "round": r["round"], "seconds": r["seconds"], "seconds_client_steps": steps,
            "overhead_share": 1 - steps / r["seconds"],
            "seconds_client_train_not_steps": sec.get("client.train", 0.0) - steps,
            "seconds_other": r["seconds"] - sum(top.values()),
            "breakdown": breakdown,
            "calls": phases["calls"].get(str(r["round"]), {}),
            "page_cache": phases.get("page_cache", {}).get(str(r["round"])),
        })
    later = rounds[1:]
    return {
        "regime": cell["regime"],
        "process_wall_s": process_wall,
        "run_cell_wall_s": prov["wall_time_s"],
        "before_first_round": {k: round(v, 4) for k, v in sorted(phases["seconds"].get("0", {}).items())},
        "rounds": rounds,
        "overhead_share_rounds_after_first": (
            1 - sum(r["seconds_client_steps"] for r in later) / sum(r["seconds"] for r in later)
            if later else None),
        "overhead_share_first_round": rounds[0]["overhead_share"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the JSON to write")
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--clients", type=int, default=3, help="N (the GPU run: 10)")
    ap.add_argument("--examples", type=int, default=2, help="train / val / test examples per client")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--profile", action="store_true", help="cProfile top 40 (cumulative) per regime")
    ap.add_argument("--work-dir", default=None, help="keeps the shape backbone between runs")
    ap.add_argument("--storage", default=None, choices=("memory", "disk"),
                    help="the server's vectors in RAM or on disk (default: the paper config's)")
    ap.add_argument("--label", default=None, help="a free-form note stored in the JSON (e.g. before/after)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.child_profile)
        return
    if not args.out:
        ap.error("--out is required")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from fedrepro.io import write_json_atomic

    config = paper_config()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="fedsumm-round-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    backbone, folders = prepare(work, args, config)
    results = {}
    out = Path(args.out)

    def write(cell) -> None:  # after every regime: a time limit keeps the regimes that finished
        meta = json.loads((Path(backbone) / "fedrepro_backbone.json").read_text(encoding="utf-8"))
        write_json_atomic(out, {
            "benchmark": "fedsumm_round_overhead",
            "what": ("FedSUMM and FedAvg cells (paper config + rehearsal overlay) at bart-base-chinese's "
                     "true size (random weights) through run_cell, in-process engine: per round the wall "
                     "seconds, the clients' step seconds, the overhead share 1 - steps/round and where the "
                     "rest goes (phase timers; inclusive, nested phases prefixed by their parent)"),
            "target": "a round costs only a few seconds beyond its steps (GPU); overhead share as low as possible",
            "label": args.label,
            "settings": {k: v for k, v in vars(args).items() if not k.startswith("child")}
            | {"backbone_parameters": meta.get("parameters"),
               "backbone": "fnlp/bart-base-chinese architecture, kind: shape (random weights)",
               "cell": {k: cell[k] for k in ("train", "generation", "algorithm", "server_state",
                                             "rouge_every_round", "rehearsal", "engine", "threads")}},
            "regimes": results,
            "machine": {"hostname": platform.node(), "platform": platform.platform(),
                        "cpus": os.cpu_count(), "torch": torch.__version__,
                        "python": platform.python_version(),
                        "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                        "loadavg_at_end": os.getloadavg(), "cuda": torch.cuda.is_available(),
                        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                         text=True, check=False).stdout.strip(),
            "git_dirty": bool(subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT,
                                             capture_output=True, text=True, check=False).stdout.strip()),
        })

    for regime in args.regimes.split(","):
        out_dir = Path(tempfile.mkdtemp(prefix=f"cell-{regime}-", dir=work))
        prof = str(out.with_name(f"{out.stem}_{regime}.prof.txt")) if args.profile else None
        cell = make_cell(config, backbone, folders, regime, out_dir, args)
        results[regime] = r = run_regime(cell, work, prof)
        for x in r["rounds"]:
            print(f"[{regime}] round {x['round']}: {x['seconds']:.1f} s, steps "
                  f"{x['seconds_client_steps']:.1f} s, overhead {x['overhead_share']:.3f}",
                  file=sys.stderr, flush=True)
        write(cell)


if __name__ == "__main__":
    main()
