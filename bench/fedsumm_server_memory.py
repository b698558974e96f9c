"""Benchmark: RAM, state size and time of FedSUMM's server at bart-base-chinese size (issue 12).

    python bench/fedsumm_server_memory.py --out bench/results/fedsumm_server_memory.json

The server (``FedSummServer``, paper config: ``delta`` gradients, own memory entry, cumulative ρ
over all parameters, ``round_mean`` reference) is built for the trainable parameters of
``fnlp/bart-base-chinese`` (BartConfig: vocabulary 51,271, d_model 768, 6+6 layers, FFN 3072,
1,024 positions; built on the meta device, no download; w_0 random) and run for a few rounds on
synthetic replies of the right shapes: client c of round t returns ``w^c = w_t·(1 + a) + b`` with
small scalars a, b of (c, t), made tensor by tensor when the server reads them, so what is
measured is the server's state and round, not the replies (on Flower the runner holds the round's
replies and train messages as well, see docs/decisions-fedsumm.md).  Each round also makes the
guidance of the next round's clients (one at a time, as ``client_records`` does) and writes the
server-state checkpoint, keeping the runner's retention (the previous round's state until the next
round starts).  Every configuration runs in its own process; peak RSS is that process's
``ru_maxrss``.

Layouts: ``legacy`` (the server before issue 12, loaded from git at ``LEGACY_COMMIT``: MG, g̃,
S_c, S_g as float32 tensors in RAM per client), ``memory`` and ``disk`` (``fedsumm.server_state``;
float32 or bfloat16 MG).  The legacy and in-memory layouts cannot run at full size in 8 GB (legacy
needs ~8.4 GB for a single client), so they are measured on two scaled-down BARTs (d_model 192
and 384, same vocabulary) with N = 1..5 clients, all in every round, and extrapolated with a fit
``RSS = R0 + P·(α + β·N)`` (linear in the parameter count P and in N); the JSON says which numbers
are measured and which extrapolated.  The disk layout is measured at full size with N = 50 and
N = 200 (a few clients per round: the state is then that of the clients seen so far, its size per
client is exact, and RAM does not grow with N) and with N = 8 all in every round.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedrepro.io import write_json_atomic
from fedrepro.papers.fedsumm import algorithm as current

LEGACY_REF = "a5ed780"  # the last commit before issue 12's server-state change
BART_BASE_CHINESE = {  # fnlp/bart-base-chinese (hub v2 dimensions; v1 has 21,128 / 512)
    "vocab_size": 51271,
    "d_model": 768,
    "encoder_layers": 6,
    "decoder_layers": 6,
    "encoder_ffn_dim": 3072,
    "decoder_ffn_dim": 3072,
    "encoder_attention_heads": 12,
    "decoder_attention_heads": 12,
    "max_position_embeddings": 1024,
}
SCALED = {
    "d192": dict(
        BART_BASE_CHINESE,
        d_model=192,
        encoder_ffn_dim=768,
        decoder_ffn_dim=768,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
    ),
    "d384": dict(
        BART_BASE_CHINESE,
        d_model=384,
        encoder_ffn_dim=1536,
        decoder_ffn_dim=1536,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
    ),
}
GB = 1e9


def trainable_shapes(bart: dict) -> OrderedDict[str, tuple[int, ...]]:
    """Names and shapes of BartForConditionalGeneration's trainable parameters (meta device),
    sorted by name (the order the runner sends them in)."""
    from transformers import BartConfig, BartForConditionalGeneration

    with torch.device("meta"):
        model = BartForConditionalGeneration(BartConfig(**bart))
    return OrderedDict(
        sorted((n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad)
    )


def _legacy_module(work: Path):
    src = subprocess.run(
        ["git", "show", f"{LEGACY_REF}:src/fedrepro/papers/fedsumm/algorithm.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = work / "fedsumm_algorithm_legacy.py"
    path.write_text(src, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("fedsumm_algorithm_legacy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _git_sha(ref: str) -> str:
    out = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or ref


def _rss() -> dict:
    fields = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _legacy_state_bytes(server) -> int:
    """Bytes of the legacy server's tensors (MG, stored g̃, ρ sums), shared storages once."""
    guidance = [g.modulated_gradient for g in server.guidance.values()]
    return _tensor_bytes([server.memory, guidance, server.tracker.sums], set())


def _tensor_bytes(obj, seen: set) -> int:
    if isinstance(obj, torch.Tensor):
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


def _replies(module, server, t: int, w: OrderedDict, shapes: dict) -> dict:
    """S_t's synthetic replies, made tensor by tensor on every read (pure, cheap)."""
    replies = {}
    for c in server.sample_clients(t):
        i = server.client_index[c]
        a, b = 1e-3 * math.sin(7 * i + t), 1e-3 * math.cos(3 * i + t)
        params = current.LazyTensors(shapes, lambda k, a=a, b=b, w=w: w[k] * (1 + a) + b)
        grad = current.LazyTensors(shapes, lambda k, p=params, w=w: w[k] - p[k])
        replies[c] = module.ClientReply(params, grad, 1.0 + 0.01 * ((7 * i + 3 * t) % 11))
    return replies


def worker(spec: dict) -> dict:
    """One configuration in this process: returns its measurements."""
    torch.set_num_threads(spec["threads"])
    work = Path(spec["work_dir"])
    shapes = trainable_shapes(spec["bart"])
    n_params = sum(math.prod(s) for s in shapes.values())
    layout = spec["layout"]
    module = _legacy_module(work) if layout == "legacy" else current
    rss_imports = _rss()["VmRSS"]
    g = torch.Generator().manual_seed(0)
    w = OrderedDict((k, 0.02 * torch.randn(s, generator=g)) for k, s in shapes.items())
    clients = [f"c{i:03d}" for i in range(spec["clients"])]
    config = module.FedSummConfig(epsilon=0.1, clients_per_round=spec["clients_per_round"])
    state_dir = work / "checkpoints" / "server_state"
    if layout == "legacy":
        server = module.FedSummServer(config, clients, seed=1)
    else:
        server = module.FedSummServer(
            config,
            clients,
            seed=1,
            state=module.ServerStateConfig(layout, spec["dtype"]),
            state_dir=state_dir,
        )
    rss_start = _rss()["VmRSS"]
    saved: dict[int, Path] = {}
    rounds = []
    for t in range(1, spec["rounds"] + 1):
        if t - 1 in saved and t - 2 in saved:  # round t starts: round t-2's state can go
            saved.pop(t - 2).unlink()
        if layout == "disk":
            server.collect_garbage(
                set().union(*(current.state_names(torch.load(p)) for p in saved.values()))
            )
        replies = _replies(module, server, t, w, shapes)
        t0 = time.perf_counter()
        w, log = server.server_round(t, w, replies)
        t_round = time.perf_counter() - t0
        del replies
        disk_in_round = server.store.disk_bytes() if layout == "disk" else 0
        t0 = time.perf_counter()
        for c in server.sample_clients(t + 1):  # the next round's guidance, one at a time
            guidance = server.guidance_for(c)
            del guidance
        t_guidance = time.perf_counter() - t0
        t0 = time.perf_counter()
        path = work / "checkpoints" / f"fedsumm_server_round_{t:03d}.pt"
        torch.save(server.state_dict(), path)
        saved[t] = path
        if t - 2 in saved:
            saved.pop(t - 2).unlink()
        if layout == "disk":
            server.collect_garbage(
                set().union(*(current.state_names(torch.load(p)) for p in saved.values()))
            )
        t_save = time.perf_counter() - t0
        if layout == "legacy":
            state_ram = _legacy_state_bytes(server)
            state_disk = 0
        elif layout == "memory":
            state_ram, state_disk = server.state_bytes(), 0
        else:
            state_ram, state_disk = 0, server.state_bytes()
        rounds.append(
            {
                "round": t,
                "participants": len(log["rho"]),
                "clients_seen": len(server.losses),
                "seconds_server_round": t_round,
                "seconds_next_guidance": t_guidance,
                "seconds_checkpoint": t_save,
                "rss_after_round": _rss(),
                "state_bytes_ram": state_ram,
                "state_bytes_disk_live": state_disk,
                "disk_bytes_during_round": disk_in_round,
                "disk_bytes_after_checkpoint": (
                    server.store.disk_bytes() if layout == "disk" else 0
                ),
                "checkpoint_file_bytes": path.stat().st_size,
                "rho_mean": log["rho_mean"],
            }
        )
        print(json.dumps({"layout": layout, **rounds[-1]}), file=sys.stderr, flush=True)
    return {
        "n_params": n_params,
        "rss_after_imports": rss_imports,
        "rss_after_w0_and_server": rss_start,
        "peak_rss": _peak_rss(),
        "rounds": rounds,
        "seconds_per_round_mean": sum(
            r["seconds_server_round"] + r["seconds_next_guidance"] + r["seconds_checkpoint"]
            for r in rounds
        )
        / len(rounds),
        "seconds_server_round_per_participant": sum(r["seconds_server_round"] for r in rounds)
        / sum(r["participants"] for r in rounds),
    }


def run_config(spec: dict, work_root: Path, limit_bytes: float) -> dict:
    """``spec`` in a fresh process (its own ru_maxrss), killed if its RSS passes ``limit_bytes``."""
    import psutil

    work = Path(tempfile.mkdtemp(prefix="fedsumm-bench-", dir=work_root))
    (work / "checkpoints").mkdir()
    spec = dict(spec, work_dir=str(work))
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
    )
    peak_seen, killed = 0, False
    try:
        ps = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                rss = ps.memory_info().rss
            except psutil.NoSuchProcess:
                break
            peak_seen = max(peak_seen, rss)
            if rss > limit_bytes:
                proc.kill()
                killed = True
            time.sleep(0.05)
        out = proc.stdout.read()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if killed or proc.returncode != 0:
        return {"spec": spec, "failed": "killed over the RSS limit" if killed else proc.returncode}
    result = json.loads(out.strip().splitlines()[-1])
    result["spec"] = {k: v for k, v in spec.items() if k not in ("work_dir", "bart")}
    result["sampled_peak_rss"] = peak_seen
    return result


def _fit(points: list[tuple[int, int, int]]) -> dict:
    """Least squares ``rss = R0 + P·α + P·N·β`` over (P, N, rss)."""
    import numpy as np

    a = np.array([[1.0, p, p * n] for p, n, _ in points])
    y = np.array([float(r) for _, _, r in points])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ coef
    return {
        "R0_bytes": float(coef[0]),
        "alpha_bytes_per_param": float(coef[1]),
        "beta_bytes_per_param_per_client": float(coef[2]),
        "max_abs_residual_bytes": float(np.abs(resid).max()),
    }


def _predict(fit: dict, p: int, n: int) -> float:
    return (
        fit["R0_bytes"]
        + p * fit["alpha_bytes_per_param"]
        + p * n * fit["beta_bytes_per_param_per_client"]
    )


def measure(args) -> dict[str, dict]:
    """Every configuration, each in its own process."""
    work_root = Path(args.work_dir or tempfile.gettempdir())
    limit = args.rss_limit_gb * GB
    base = {"threads": args.threads, "rounds": args.rounds, "dtype": "float32"}
    full = dict(base, bart=BART_BASE_CHINESE)
    runs: dict[str, dict] = {}

    def go(name: str, spec: dict) -> None:
        free = shutil.disk_usage(work_root).free
        print(f"[{name}] free disk {free / GB:.1f} GB", file=sys.stderr, flush=True)
        runs[name] = run_config(spec, work_root, limit)
        r = runs[name]
        print(f"[{name}] peak RSS {r.get('peak_rss', 0) / GB:.2f} GB", file=sys.stderr, flush=True)

    # full size, disk: N = 50 and 200 with a few clients per round; N = 8 all in every round
    for dtype in ("float32", "bfloat16"):
        for n in (50, 200):
            spec = dict(full, layout="disk", dtype=dtype, clients=n)
            go(f"disk-{dtype}-N{n}", dict(spec, clients_per_round=args.clients_per_round))
    go("disk-float32-N8-all", dict(full, layout="disk", clients=8, clients_per_round=None))
    # scaled-down models, N = 1..5 all in every round: legacy vs the new layouts
    for scale, bart in SCALED.items():
        ns = (1, 2, 3, 4, 5) if scale == "d192" else (1, 2, 3)
        for layout in ("legacy", "memory", "disk"):
            for n in ns:
                go(
                    f"{layout}-{scale}-N{n}-all",
                    dict(base, bart=bart, layout=layout, clients=n, clients_per_round=None),
                )
    return runs


def summarize(runs: dict[str, dict], p_full: int, clients_per_round: int) -> dict:
    """Fits, extrapolations to full size and the N = 50 / 200 summary from the runs."""
    fits, extrapolated = {}, {}
    for layout in ("legacy", "memory"):  # disk: measured at full size, no extrapolation needed
        pts = [
            (r["n_params"], r["spec"]["clients"], r["peak_rss"])
            for name, r in runs.items()
            if name.startswith(f"{layout}-d") and "peak_rss" in r
        ]
        fits[layout] = _fit(pts)
        extrapolated[layout] = {f"N{n}": _predict(fits[layout], p_full, n) for n in (1, 5, 50, 200)}
    per_client = {  # exact bytes of the state per client with all clients seen (float32 MG)
        "legacy": 4 * 4 * p_full,  # MG, g̃, S_c, S_g
        "new_float32": 2 * 4 * p_full,  # MG, S_c (+ one S_g per distinct T_c)
        "new_bfloat16": (2 + 4) * p_full,
    }
    all_8 = runs["disk-float32-N8-all"]
    summary = {}
    for n in (50, 200):
        fp32, bf16 = runs[f"disk-float32-N{n}"], runs[f"disk-bfloat16-N{n}"]
        summary[f"N{n}"] = {
            "legacy_state_bytes_ram": per_client["legacy"] * n,
            "legacy_peak_rss_bytes_extrapolated": extrapolated["legacy"][f"N{n}"],
            "memory_float32_state_bytes_ram": per_client["new_float32"] * n + 4 * p_full,
            "memory_float32_peak_rss_bytes_extrapolated": extrapolated["memory"][f"N{n}"],
            "disk_float32_peak_rss_bytes_measured": fp32.get("peak_rss"),
            "disk_bfloat16_peak_rss_bytes_measured": bf16.get("peak_rss"),
            "disk_float32_state_bytes_full_participation": (
                per_client["new_float32"] * n + 4 * p_full
            ),
            "disk_bfloat16_state_bytes_full_participation": (
                per_client["new_bfloat16"] * n + 4 * p_full
            ),
            "disk_float32_peak_disk_bytes_full_participation": 2
            * (per_client["new_float32"] * n + 4 * p_full),
            f"disk_float32_seconds_per_round_measured_{clients_per_round}_clients": fp32.get(
                "seconds_per_round_mean"
            ),
            "disk_float32_seconds_per_round_full_participation_extrapolated": (
                all_8["seconds_per_round_mean"] / 8 * n
                if "seconds_per_round_mean" in all_8
                else None
            ),
        }
    return {
        "per_client_state_bytes": per_client,
        "summary": summary,
        "fits": fits,
        "extrapolated_peak_rss_bytes_full_size": extrapolated,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the JSON to write (required unless --worker)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients-per-round", type=int, default=4, help="full-size N = 50 / 200 runs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rss-limit-gb", type=float, default=8.0, help="kill a run above this RSS")
    ap.add_argument("--work-dir", default=None, help="where the state files go (default: temp)")
    ap.add_argument(
        "--from-json",
        default=None,
        help="no measuring: recompute the summary from the runs of an earlier result",
    )
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if not args.out:
        ap.error("--out is required")
    import numpy as np

    p_full = sum(math.prod(s) for s in trainable_shapes(BART_BASE_CHINESE).values())
    if args.from_json:
        earlier = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        runs, settings = earlier["runs"], earlier["settings"]
        machine, date = earlier["machine"], earlier["date"]
        settings.pop("from_json", None)
    else:
        runs = measure(args)
        settings = vars(args) | {"bart": BART_BASE_CHINESE, "scaled": SCALED}
        machine = {
            "hostname": platform.node(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        }
        date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    k = settings["clients_per_round"]
    result = {
        "benchmark": "fedsumm_server_memory",
        "what": (
            "FedSUMM server (paper algorithm config) at bart-base-chinese size: peak RSS "
            "(ru_maxrss of a fresh process per configuration), bytes of the per-client state "
            "(RAM or disk), seconds per round (server_round + next round's guidance + checkpoint)"
        ),
        "n_params_bart_base_chinese": p_full,
        "budget": {"peak_rss_bytes_at_N50": 8 * GB},
        "legacy_layout": f"git {_git_sha(LEGACY_REF)} (src/fedrepro/papers/fedsumm/algorithm.py)",
        "git_commit": _git_sha("HEAD"),
        "measured_vs_extrapolated": (
            "disk-*-N50/N200 and disk-float32-N8-all: measured at full size; with "
            f"{k} clients per round only the clients seen hold state (their bytes are in "
            "rounds[].state_bytes_disk_live), and the full state with all N clients is per-client "
            "bytes × N + one shared S_g (exact: MG P·itemsize + S_c 4P per client). legacy / "
            "memory at full size: extrapolated from the scaled-down runs (d_model 192 and 384, "
            "N = 1..5, all clients every round) with RSS = R0 + P·(α + β·N) (fits); their state "
            "bytes (16·P·N legacy, 8·P·N + 4·P new) are exact. Full-participation seconds per "
            "round: the N = 8 all-clients run's per-round time × N/8 (a round is linear in its "
            "participants)."
        ),
        **summarize(runs, p_full, k),
        "runs": runs,
        "settings": settings,
        "machine": machine,
        "date": date,
    }
    write_json_atomic(args.out, result)
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
