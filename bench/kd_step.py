"""Benchmark: one training step of AdaFedSelectKD vs AdaFedAvg on the same tiny backbone.

    python bench/kd_step.py --out results/bench/kd_step.json

AdaFedSelectKD adds a teacher (global-adapter) path.  Because the encoder and the frozen decoder
layers below the adapters are computed once and shared, and the teacher path runs without grad,
its step should cost at most ~1.35× AdaFedAvg's.  Steps of the two methods are interleaved so that
machine noise hits both alike; the JSON records the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fedrepro.papers.adafedseleckd.methods import METHODS, TrainHParams, make_optimizer  # noqa: E402
from fedrepro.papers.adafedseleckd.kd import cross_entropy_loss, selective_kd_loss  # noqa: E402
from fedrepro.data.seq2seq import collate  # noqa: E402
from fedrepro.io import write_json_atomic  # noqa: E402
from fedrepro.models.backbones import prepare_backbone  # noqa: E402
from fedrepro.papers.adafedseleckd.model import build_summarizer  # noqa: E402

TINY = {  # the demo's tiny bart-large (config/config.yaml)
    "vocab_size": 3000, "d_model": 64, "encoder_layers": 2, "decoder_layers": 4, "heads": 4,
    "ffn_dim": 128, "max_source_length": 384, "max_target_length": 64, "warmup_steps": 0,
}


def _texts(n: int = 400) -> list[str]:
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(2500)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(20, 120))) for _ in range(n)]


def _batch(tokenizer, model, batch_size: int, src_len: int, tgt_len: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer)
    examples = [
        {"input_ids": torch.randint(5, vocab, (src_len,), generator=g).tolist(),
         "labels": torch.randint(5, vocab, (tgt_len,), generator=g).tolist()}
        for _ in range(batch_size)
    ]
    cfg = model.backbone.config
    return collate(examples, cfg.pad_token_id, cfg.decoder_start_token_id)


def _step(model, optimizer, batch, distill: bool, hp: TrainHParams) -> float:
    t0 = time.perf_counter()
    student, teacher = model.path_logits(
        batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"],
        student="local", teacher="global" if distill else None,
    )
    if distill:
        loss, _ = selective_kd_loss(student, teacher, batch["labels"], hp.lam, hp.tau)
    else:
        loss = cross_entropy_loss(student, batch["labels"])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--source-length", type=int, default=384)
    ap.add_argument("--target-length", type=int, default=64)
    ap.add_argument("--adapter-top-k", type=int, default=2)
    ap.add_argument("--bottleneck", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hp = TrainHParams(lr=2e-4, weight_decay=0.01, batch_size=args.batch_size, local_epochs=1, lam=0.2, tau=5.0)
    with tempfile.TemporaryDirectory() as tmp:
        bb = prepare_backbone({"name": "bart-large", "kind": "tiny", "tiny": TINY}, _texts(), Path(tmp) / "bb")
        tok, kd_model = build_summarizer(str(bb), args.adapter_top_k, args.bottleneck,
                                         METHODS["AdaFedSelectKD"].roles, 0)
        _, avg_model = build_summarizer(str(bb), args.adapter_top_k, args.bottleneck,
                                        METHODS["AdaFedAvg"].roles, 0)
    kd_opt, avg_opt = make_optimizer(kd_model, hp), make_optimizer(avg_model, hp)
    kd_model.train()
    avg_model.train()
    times = {"AdaFedSelectKD": [], "AdaFedAvg": []}
    for i in range(args.warmup + args.steps):
        batch = _batch(tok, kd_model, args.batch_size, args.source_length, args.target_length, i)
        order = [("AdaFedSelectKD", kd_model, kd_opt, True), ("AdaFedAvg", avg_model, avg_opt, False)]
        if i % 2:
            order.reverse()
        for name, model, opt, distill in order:
            dt = _step(model, opt, batch, distill, hp)
            if i >= args.warmup:
                times[name].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "benchmark": "kd_step",
        "what": "median wall time of one training step (forward, backward, AdamW) per method",
        "step_time_s": med,
        "step_time_mean_s": {k: statistics.fmean(v) for k, v in times.items()},
        "ratio_selectkd_over_fedavg": med["AdaFedSelectKD"] / med["AdaFedAvg"],
        "target_ratio": 1.35,
        "settings": vars(args) | {"tiny_backbone": TINY},
        "machine": {
            "hostname": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json_atomic(args.out, result)
    print(json.dumps({k: result[k] for k in ("step_time_s", "ratio_selectkd_over_fedavg")}, indent=2))


if __name__ == "__main__":
    main()
