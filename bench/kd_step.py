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

**Precision** (issue on GPU-hours, item 1): ``--precisions fp32,tf32,bf16-mixed,bf16-mixed+frozen-bf16``
runs each method under each of the project's precision modes (:mod:`fedrepro.precision`, the
``adafedseleckd.precision`` / ``frozen_dtype`` keys: autocast around the forward and the loss,
float32 master weights) side by side in one process; ``+frozen-bf16`` variants run on a second copy
of the model whose frozen backbone is stored in bfloat16.  Every variant starts from the same
adapter state and sees the same batches in the same order, so ``loss_after_steps`` (the loss of the
last measured step) and ``max_abs_loss_diff_vs_fp32`` compare their training trajectories.
(``--dtype`` casts the whole model, adapters included -- the older, non-config measurement.)

**Model FLOPs and MFU** (item 2): the FLOPs of one step of each variant are counted by PyTorch's
``FlopCounterMode`` on an extra, unmeasured step (:func:`fedrepro.flops.count_flops`: the matrix
products the step really dispatches) and computed from the model's dimensions by
:func:`fedrepro.flops.seq2seq_adapter_step_flops` (BART; S = batch·source, T = batch·target
tokens, d, f, V, m the model's width, FFN width, vocabulary and adapter bottleneck, L_e/L_d encoder
and decoder layers, K adapted layers)::

    prefix   = L_e (8 S d^2 + 4 S d f + 4 b s^2 d) + (L_d - K) (dec + 4 S d^2)   forward, no grad
    dec      = 8 T d^2 + 4 b t^2 d + 4 T d^2 + 4 b t s d + 4 T d f               one decoder layer
    forward  = K (dec + 4 S d^2 + 4 T d m) + 2 T d V                              adapted layers + head
    backward = 2 T d V + (K - 1) dec' + 8 K T d m - 2 T d m                       input + adapter grads
               (dec' = dec with its attention terms x 2.5: the fused kernel's backward, as PyTorch counts it)
    teacher  = K (dec + 4 T d m) + 2 T d V      (KD methods; cross-attention k/v memoised)

MFU = FLOPs / (median step time × the device's dense peak for the arithmetic): both against the
precision's own peak (fp32 FMA, TF32, bf16 tensor cores) and against the bf16 dense peak
(``mfu_vs_bf16_peak``: the issue's 30 % target); ``None`` on the CPU (no peak is assumed).
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

from _paper_dims import (DTYPES, PAPER_BACKBONES, machine, now, paper_summarizer,
                         random_examples, sync)

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


PRECISION_VARIANTS = ("fp32", "tf32", "bf16-mixed", "bf16-mixed+frozen-bf16")


def _precision(variant: str):
    from fedrepro.precision import Precision

    mode, _, frozen = variant.partition("+frozen-")
    return Precision(mode, frozen or "fp32", "adafedseleckd")


def _analytic_flops(model, batch: dict, teacher: bool, cached: bool) -> int:
    from fedrepro.flops import seq2seq_adapter_step_flops

    cfg = model.backbone.config
    b, s = batch["input_ids"].shape
    t = batch["decoder_input_ids"].shape[1]
    return seq2seq_adapter_step_flops(
        batch=b, source_len=s, target_len=t, d_model=cfg.d_model,
        ffn_dim=cfg.encoder_ffn_dim, encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers, vocab=cfg.vocab_size,
        top_k=len(model.stacks["local"].layers),
        bottleneck=model.stacks["local"].layers[0].down.out_features,
        teacher=teacher, prefix_computed=not cached)["total"]


def main() -> None:
    from fedrepro.flops import count_flops, mfu

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backbone", default="tiny", choices=["tiny", *PAPER_BACKBONES])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                    help="cast the whole model (adapters too); the config's way is --precisions")
    ap.add_argument("--precisions", default="fp32",
                    help=f"comma-separated precision variants, of {list(PRECISION_VARIANTS)}")
    ap.add_argument("--methods", default="AdaFedSelectKD,AdaFedAvg")
    ap.add_argument("--steps", type=int, default=60, help="measured steps per variant")
    ap.add_argument("--warmup", type=int, default=5, help="unmeasured steps per variant first")
    ap.add_argument("--batches", type=int, default=4, help="distinct batches the steps cycle over")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--source-length", type=int, default=384, help="longest source (tokens)")
    ap.add_argument("--target-length", type=int, default=64, help="longest target (tokens)")
    ap.add_argument("--fixed-lengths", action="store_true",
                    help="every example exactly --source-length/--target-length tokens (no padding)")
    ap.add_argument("--adapter-top-k", type=int, default=2, help="tiny backbone only")
    ap.add_argument("--bottleneck", type=int, default=128, help="tiny backbone only")
    ap.add_argument("--no-cache", action="store_true", help="skip the cached variants")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    for p in precisions:
        if p not in PRECISION_VARIANTS:
            raise SystemExit(f"--precisions: {p!r} is not one of {list(PRECISION_VARIANTS)}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.backbone == "tiny":
        model, model_settings = _tiny_summarizer(args)
    else:
        model, model_settings = paper_summarizer(args.backbone, ("global", "local"), args.device,
                                                 args.dtype)
    models = {"fp32": model}
    if any("+frozen-" in p for p in precisions):
        import copy

        frozen = copy.deepcopy(model)
        _precision("bf16-mixed+frozen-bf16").cast_frozen(frozen)
        models["bf16"] = frozen
    cfg = model.backbone.config
    pad_id, start_id = int(cfg.pad_token_id), int(cfg.decoder_start_token_id)
    lo = 1.0 if args.fixed_lengths else 0.5
    examples = random_examples(args.batches * args.batch_size, cfg.vocab_size,
                               args.source_length, args.target_length, min_fraction=lo)
    batches = [collate(examples[i : i + args.batch_size], pad_id, start_id)
               for i in range(0, len(examples), args.batch_size)]
    hp = TrainHParams(lr=2e-4, weight_decay=0.01, batch_size=args.batch_size, local_epochs=1,
                      lam=0.2, tau=5.0)
    device = torch.device(args.device)
    cache = PrefixCache("fp32", 1 << 62)
    cache.begin(model, "bench", examples)
    # variant -> (method, prefix cache, precision variant)
    variants: dict[str, tuple] = {}
    for prec in precisions:
        suffix = "" if precisions == ["fp32"] else f"@{prec}"
        for m in methods:
            variants[f"{m}{suffix}"] = (m, None, prec)
            if not args.no_cache and prec == "fp32":
                variants[f"{m}+cache{suffix}"] = (m, cache, prec)
    if any(c is not None for _, c, _ in variants.values()):
        for b in batches:  # fill the cache (not measured)
            cache.batch_prefix(model, b, {k: v.to(device) for k, v in b.items()})

    def model_of(prec: str):
        return models["bf16" if "+frozen-" in prec else "fp32"]

    optimizers = {name: make_optimizer(model_of(v[2]), hp) for name, v in variants.items()}
    init = model.adapter_state("local")
    states = {name: init for name in variants}
    for m in models.values():
        m.train()
    times: dict[str, list[float]] = {name: [] for name in variants}
    losses: dict[str, list[float]] = {name: [] for name in variants}
    peak: dict[str, int] = {}
    names = list(variants)

    def run_step(name: str, batch: dict):
        method, prefix_cache, prec = variants[name]
        spec = METHODS[method]
        tau = hp.tau if spec.selective else float("inf")
        mdl = model_of(prec)
        mdl.load_adapter_state("local", states[name])
        precision = _precision(prec)
        with precision.region(device):
            out = _step(mdl, spec, batch, device, hp, tau, optimizers[name], None, prefix_cache,
                        precision)
        states[name] = mdl.adapter_state("local")
        return out

    for i in range(args.warmup + args.steps):
        batch = batches[i % len(batches)]
        k = i % len(names)
        for name in names[k:] + names[:k]:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync(args.device)
            t0 = time.perf_counter()
            loss = run_step(name, batch)[0]
            sync(args.device)
            dt = time.perf_counter() - t0
            losses[name].append(float(loss.detach()))
            if i >= args.warmup:
                times[name].append(dt)
            if device.type == "cuda":
                peak[name] = max(peak.get(name, 0), torch.cuda.max_memory_allocated())
    # FLOPs: one extra, unmeasured step per variant under the counter (after the measured ones,
    # so it changes none of the compared trajectories), and the formula at the same batch
    flops, analytic = {}, {}
    for name in names:
        method, prefix_cache, prec = variants[name]
        batch = batches[0]
        _, flops[name] = count_flops(lambda: run_step(name, batch))
        if args.backbone in ("tiny", "bart-large", "bart-base"):
            analytic[name] = _analytic_flops(model, batch, METHODS[method].distill,
                                             prefix_cache is not None)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = {m: losses.get(f"{m}@fp32", losses.get(m)) for m in methods}
    result = {
        "benchmark": "kd_step",
        "what": "median wall time of one training step (prefix, forward, backward, AdamW) per "
                "method and precision; +cache: the frozen prefix from a warm fp32 prefix cache; "
                "flops: FlopCounterMode's count of one step at batches[0]; mfu against the "
                "precision's dense peak and against the bf16 dense peak",
        "step_time_s": med,
        "step_time_mean_s": {k: statistics.fmean(v) for k, v in times.items()},
        "flops_per_step": flops,
        "flops_per_step_formula": analytic,
        "mfu": {name: mfu(flops[name], med[name], gpu, variants[name][2].partition("+")[0]
                          if args.dtype == "float32" else args.dtype) for name in names},
        "loss_after_steps": {k: v[-1] for k, v in losses.items()},
        "max_abs_loss_diff_vs_fp32": {
            k: max(abs(a - b) for a, b in zip(v, ref[variants[k][0]])) for k, v in losses.items()
            if ref.get(variants[k][0]) is not None},
        "settings": {k: v for k, v in vars(args).items()
                     if args.backbone == "tiny" or k not in ("adapter_top_k", "bottleneck")}
                    | {"model": model_settings, "backbone_dropout": False},
        "machine": machine(args.device),
        "date": now(),
    }
    if "AdaFedSelectKD" in methods and "AdaFedAvg" in methods:
        suffix0 = "" if precisions == ["fp32"] else f"@{precisions[0]}"
        result["ratio_selectkd_over_fedavg"] = (med["AdaFedSelectKD" + suffix0]
                                                / med["AdaFedAvg" + suffix0])
        result["target_ratio"] = TARGET
    if len(precisions) > 1 and "fp32" in precisions:
        result["ratio_over_fp32"] = {
            name: med[name] / med[f"{variants[name][0]}@fp32"] for name in names
            if variants[name][1] is None}
    if not args.no_cache and "fp32" in precisions and precisions == ["fp32"]:
        result["ratio_selectkd_over_fedavg_cached"] = (
            med["AdaFedSelectKD+cache"] / med["AdaFedAvg+cache"])
        result["ratio_cached_over_uncached"] = {
            m: med[f"{m}+cache"] / med[m] for m in ("AdaFedSelectKD", "AdaFedAvg")}
        result["cache_bytes"] = cache.used
    if peak:
        result["peak_gpu_bytes"] = peak
    write_json_atomic(args.out, result)
    print(json.dumps({k: v for k, v in result.items()
                      if k.startswith(("step_time_s", "ratio", "mfu", "flops"))}, indent=2))


if __name__ == "__main__":
    main()
