"""Benchmark: AdaFedAvg epoch time with the frozen-prefix cache / without, at true model size.

    PYTHONPATH=src python bench/prefix_cache.py --device cpu --dtype float32 \\
        --batch-size 2 --source-length 128 --target-length 32 --examples 8 \\
        --out bench/results/prefix_cache_cpu.json

One client's local epochs (:func:`fedrepro.papers.adafedseleckd.methods.local_update`, the code
the clients run) over a fixed set of random-token examples on BART-large's true dimensions with
random weights (``kind: shape``) and the paper's adapters (top 6 decoder layers, m = 2048), the
backbone without dropout (``backbone_dropout: false``, which the cache needs).  Three variants:

* ``batched``: the prefix computed once per padded batch (no cache; the path of
  ``backbone_dropout: true``, here without dropout) -- the baseline of the target ratio;
* ``per_example``: ``prefix_cache: off`` -- the canonical per-example prefix, recomputed;
* ``cached``: ``prefix_cache: fp32`` (or ``--cache-dtype bf16``) -- stored by the first epoch.

Epochs of the variants are interleaved so that machine noise hits all alike; the first epoch of
each (which fills the cache) is not measured.  Target: cached / batched <= 0.4.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paper_dims import machine, now, paper_summarizer, random_examples, sync

from fedrepro.io import write_json_atomic
from fedrepro.papers.adafedseleckd.methods import (
    METHODS,
    TrainHParams,
    local_update,
    make_optimizer,
)
from fedrepro.papers.adafedseleckd.prefix_cache import PrefixCache

TARGET = 0.4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backbone", default="bart-large", choices=["bart-large", "bart-base"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--cache-dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--examples", type=int, default=8, help="the client's examples (fixed set)")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--source-length", type=int, default=128, help="longest source (tokens)")
    ap.add_argument("--target-length", type=int, default=32, help="longest target (tokens)")
    ap.add_argument("--epochs", type=int, default=3, help="measured epochs (after the first)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    t_build = time.perf_counter()
    model, model_settings = paper_summarizer(args.backbone, ("local",), args.device, args.dtype)
    build_s = time.perf_counter() - t_build
    cfg = model.backbone.config
    pad_id, start_id = int(cfg.pad_token_id), int(cfg.decoder_start_token_id)
    examples = random_examples(args.examples, cfg.vocab_size, args.source_length, args.target_length)
    hp = TrainHParams(lr=2e-4, weight_decay=0.01, batch_size=args.batch_size, local_epochs=1,
                      lam=0.2, tau=5.0)
    spec = METHODS["AdaFedAvg"]
    init = model.adapter_state("local")
    variants = {
        "batched": None,
        "per_example": PrefixCache("off", 0),
        "cached": PrefixCache(args.cache_dtype, 1 << 62),
    }
    optimizers = {name: make_optimizer(model, hp) for name in variants}
    states = {name: init for name in variants}
    times: dict[str, list[float]] = {name: [] for name in variants}
    peak: dict[str, int] = {}
    first: dict[str, float] = {}
    for epoch in range(1 + args.epochs):
        order = list(variants) if epoch % 2 == 0 else list(reversed(variants))
        for name in order:
            model.load_adapter_state("local", states[name])
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync(args.device)
            t0 = time.perf_counter()
            local_update(model, spec, examples, hp, optimizers[name], 0, "bench", epoch + 1,
                         pad_id, start_id, prefix_cache=variants[name])
            sync(args.device)
            dt = time.perf_counter() - t0
            states[name] = model.adapter_state("local")
            if epoch == 0:
                first[name] = dt
            else:
                times[name].append(dt)
            if args.device == "cuda":
                peak[name] = max(peak.get(name, 0), torch.cuda.max_memory_allocated())
    med = {k: statistics.median(v) for k, v in times.items()}
    cache = variants["cached"]
    result = {
        "benchmark": "prefix_cache",
        "what": "median wall time of one AdaFedAvg local epoch (local_update), after the first "
                "epoch (which fills the cache); batched = prefix once per padded batch, "
                "per_example = prefix_cache off (canonical per-example prefix, recomputed), "
                "cached = prefix_cache " + args.cache_dtype,
        "epoch_time_s": med,
        "epoch_times_s": times,
        "first_epoch_s": first,
        "ratio_cached_over_batched": med["cached"] / med["batched"],
        "ratio_cached_over_per_example": med["cached"] / med["per_example"],
        "target_ratio": TARGET,
        "target_met": med["cached"] / med["batched"] <= TARGET,
        "cache_bytes": cache.used,
        "cache_hits": cache.hits,
        "cache_misses": cache.misses,
        "steps_per_epoch": -(-args.examples // args.batch_size),
        "build_s": build_s,
        "settings": vars(args) | {"model": model_settings, "backbone_dropout": False},
        "machine": machine(args.device),
        "date": now(),
    }
    if peak:
        result["peak_gpu_bytes"] = peak
    write_json_atomic(args.out, result)
    print(json.dumps({k: result[k] for k in ("epoch_time_s", "ratio_cached_over_batched",
                                             "ratio_cached_over_per_example")}, indent=2))


if __name__ == "__main__":
    main()
