"""Benchmark: one training step of AdaFedSelectKD vs AdaFedAvg, with and without the prefix cache.

    PYTHONPATH=src python bench/kd_step.py --out bench/results/kd_step.json        # demo's tiny
    PYTHONPATH=src python bench/kd_step.py --backbone bart-large --device cpu \\
        --batch-size 2 --source-length 128 --target-length 32 --steps 6 --warmup 1 \\
        --out bench/results/kd_step_bart_large_cpu.json

AdaFedSelectKD adds a teacher (global-adapter) path.  Because the encoder and the frozen decoder
layers below the adapters are computed once and shared, and the teacher path runs without grad,
its step should cost at most ~1.35x AdaFedAvg's.  ``--backbone bart-large`` builds BART-large at
its true dimensions with random weights (``kind: shape``) and the paper's adapters (top 6
decoder layers, m = 2048); ``tiny`` is the demo's tiny bart-large (config/config.yaml).

The two methods' steps run :func:`fedrepro.papers.adafedseleckd.methods._step` (the clients'
code) on one summarizer holding both adapter stacks: AdaFedAvg's step uses the local stack only
(no teacher path; the idle global stack costs nothing), so both methods run on the same weights
and memory.  Each is timed without the cache (the prefix computed per padded batch) and with a
warm ``fp32`` prefix cache (``--no-cache`` skips the latter).  The steps cycle over ``--batches``
fixed batches; the variants are interleaved in a rotating order so that machine noise hits all
alike; the JSON records the machine and settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paper_dims import DTYPES, machine, now, paper_summarizer, random_examples, sync

from fedrepro.data.seq2seq import collate
from fedrepro.io import write_json_atomic
from fedrepro.papers.adafedseleckd.methods import METHODS, TrainHParams, _step, make_optimizer
from fedrepro.papers.adafedseleckd.prefix_cache import PrefixCache

TARGET = 1.35

TINY = {  # the demo's tiny bart-large (config/config.yaml)
    "vocab_size": 3000, "d_model": 64, "encoder_layers": 2, "decoder_layers": 4, "heads": 4,
    "ffn_dim": 128, "max_source_length": 384, "max_target_length": 64, "warmup_steps": 0,
}


def _texts(n: int = 400) -> list[str]:
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(2500)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(20, 120))) for _ in range(n)]


def _tiny_summarizer(args) -> tuple:
    from fedrepro.models.backbones import prepare_backbone
    from fedrepro.papers.adafedseleckd.model import build_summarizer

    with tempfile.TemporaryDirectory() as tmp:
        bb = prepare_backbone({"name": "bart-large", "kind": "tiny", "tiny": TINY}, _texts(),
                              Path(tmp) / "bb")
        _, model = build_summarizer(str(bb), args.adapter_top_k, args.bottleneck,
                                    ("global", "local"), 0)
    model = model.to(device=args.device, dtype=DTYPES[args.dtype])
    return model, {"backbone": "tiny", "tiny_backbone": TINY, "adapter_top_k": args.adapter_top_k,
                   "bottleneck": args.bottleneck}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backbone", default="tiny", choices=["tiny", "bart-large", "bart-base"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--steps", type=int, default=60, help="measured steps per variant")
    ap.add_argument("--warmup", type=int, default=5, help="unmeasured steps per variant first")
    ap.add_argument("--batches", type=int, default=4, help="distinct batches the steps cycle over")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--source-length", type=int, default=384, help="longest source (tokens)")
    ap.add_argument("--target-length", type=int, default=64, help="longest target (tokens)")
    ap.add_argument("--adapter-top-k", type=int, default=2, help="tiny backbone only")
    ap.add_argument("--bottleneck", type=int, default=128, help="tiny backbone only")
    ap.add_argument("--no-cache", action="store_true", help="skip the cached variants")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    if args.backbone == "tiny":
        model, model_settings = _tiny_summarizer(args)
    else:
        model, model_settings = paper_summarizer(args.backbone, ("global", "local"), args.device,
                                                 args.dtype)
    cfg = model.backbone.config
    pad_id, start_id = int(cfg.pad_token_id), int(cfg.decoder_start_token_id)
    examples = random_examples(args.batches * args.batch_size, cfg.vocab_size,
                               args.source_length, args.target_length)
    batches = [collate(examples[i : i + args.batch_size], pad_id, start_id)
               for i in range(0, len(examples), args.batch_size)]
    hp = TrainHParams(lr=2e-4, weight_decay=0.01, batch_size=args.batch_size, local_epochs=1,
                      lam=0.2, tau=5.0)
    device = torch.device(args.device)
    cache = PrefixCache("fp32", 1 << 62)
    cache.begin(model, "bench", examples)
    # variant -> (method, prefix cache); one optimizer per variant (AdamW state of its own)
    variants = {"AdaFedSelectKD": ("AdaFedSelectKD", None), "AdaFedAvg": ("AdaFedAvg", None)}
    if not args.no_cache:
        variants |= {"AdaFedSelectKD+cache": ("AdaFedSelectKD", cache),
                     "AdaFedAvg+cache": ("AdaFedAvg", cache)}
        for b in batches:  # fill the cache (not measured)
            cache.batch_prefix(model, b, {k: v.to(device) for k, v in b.items()})
    optimizers = {name: make_optimizer(model, hp) for name in variants}
    init = model.adapter_state("local")
    states = {name: init for name in variants}
    model.train()
    times: dict[str, list[float]] = {name: [] for name in variants}
    peak: dict[str, int] = {}
    names = list(variants)
    for i in range(args.warmup + args.steps):
        batch = batches[i % len(batches)]
        k = i % len(names)
        for name in names[k:] + names[:k]:
            method, prefix_cache = variants[name]
            spec = METHODS[method]
            tau = hp.tau if spec.selective else float("inf")
            model.load_adapter_state("local", states[name])
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync(args.device)
            t0 = time.perf_counter()
            _step(model, spec, batch, device, hp, tau, optimizers[name], None, prefix_cache)
            sync(args.device)
            dt = time.perf_counter() - t0
            states[name] = model.adapter_state("local")
            if i >= args.warmup:
                times[name].append(dt)
            if device.type == "cuda":
                peak[name] = max(peak.get(name, 0), torch.cuda.max_memory_allocated())
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "benchmark": "kd_step",
        "what": "median wall time of one training step (prefix, forward, backward, AdamW) per "
                "method; +cache: the frozen prefix from a warm fp32 prefix cache",
        "step_time_s": med,
        "step_time_mean_s": {k: statistics.fmean(v) for k, v in times.items()},
        "ratio_selectkd_over_fedavg": med["AdaFedSelectKD"] / med["AdaFedAvg"],
        "target_ratio": TARGET,
        "settings": {k: v for k, v in vars(args).items()
                     if args.backbone == "tiny" or k not in ("adapter_top_k", "bottleneck")}
                    | {"model": model_settings, "backbone_dropout": False},
        "machine": machine(args.device),
        "date": now(),
    }
    if not args.no_cache:
        result["ratio_selectkd_over_fedavg_cached"] = (
            med["AdaFedSelectKD+cache"] / med["AdaFedAvg+cache"])
        result["ratio_cached_over_uncached"] = {
            m: med[f"{m}+cache"] / med[m] for m in ("AdaFedSelectKD", "AdaFedAvg")}
        result["cache_bytes"] = cache.used
    if peak:
        result["peak_gpu_bytes"] = peak
    write_json_atomic(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k.startswith(("step_time_s", "ratio"))},
                     indent=2))


if __name__ == "__main__":
    main()
