"""Benchmark: does FedSUMM's ρ (eq. 5–6) mean the same at bart-base-chinese's true size as at the
demo's?  (issue 23, item 4)

    PYTHONPATH=src python bench/fedsumm_rho_scale.py --out bench/results/fedsumm_rho_scale.json

Observed on an H100 at true size (116 M parameters, random weights, N = 10 clients of 2 examples,
AdamW lr 5e-5, ``reading: update_direction``): ρ = 616 in round 1 against 1.1–1.6 in the demo
(Fig. 6), and with ``apply_on_server`` a server step 1 + ε·ρ ≈ 62 times each client's update.
This script measures ρ under the readings of the update direction for a sweep of model sizes, from
the demo's tiny BART to bart-base-chinese's true dimensions:

* models: Chinese BART (``BartForConditionalGeneration``) with **random weights** (seed 0):
  ``demo`` = config/config.yaml's ``fedsumm.backbone.tiny`` (d_model 32, 1+1 layers, FFN 64, 160
  positions) with the demo's vocabulary size (``--demo-vocab``, 936: the demo builds it from the
  samples' characters), two scaled-down BARTs with the true 21,128-token vocabulary and 512
  positions, and ``true`` = :data:`fedrepro.models.shapes.ARCHITECTURES`
  ``["fnlp/bart-base-chinese"]`` (6+6 layers, d_model 768, 116,256,768 parameters);
* clients: ``--clients`` (4, the demo's N) clients of ``--examples`` (2) examples each: random
  token sequences (``--source-length`` 64 / ``--target-length`` 16 tokens; short — what matters
  for ρ is the parameter count, not the sequence length) whose tokens are drawn from a Zipf(1)
  law over the vocabulary (character frequencies: clients share the frequent rows of the
  embedding, each touches a few hundred rare ones);
* one real local update per client: one step on its 2 examples (one batch; BART's cross-entropy,
  gradient clipped to norm 1 as ``fedsumm.train.max_grad_norm``) from the same w_0, with AdamW
  (lr 5e-5, the paper config's before issue 23) and with SGD (eq. 3; lr ``--sgd-lr``, 0.2: the
  paper config's), the same learning rates at every size; Δ_c = w^c − w_0 in float32 as the server
  computes it from the returned parameters (ρ does not depend on the step's scale, only on its
  shape: which entries move and how their sizes are spread).

Per size, optimizer and reading: ρ_c (eq. 5–6 in round 1, ``rho_reduction: expected``, one softmax
per tensor against the round's mean update, ρ_c = the mean over tensors — what the server logs and
Fig. 6 shows, for FedAvg and FedSUMM alike), the tensors with the largest ρ, and the server step that
results with ``apply_on_server: true`` (own memory entry, ``client_gradient: delta``, ε = 0.1):
``Δ_server = mean_c (1 + ε·ρ_{c,k}) Δ_c`` per tensor k, reported as ‖Δ_server‖ / ‖mean_c Δ_c‖.
At the two small sizes the numbers are checked against :meth:`FedSummServer.server_round` on the
same replies (``check``).  Readings: ``update_direction`` (unit RMS per tensor, the configs' reading
before issue 23), ``update_direction_rank`` (rank-based normal scores, issue 23) and, as a rejected
candidate, ``clip3`` (the unit-RMS direction clipped to ±3; not a config option).  The time to
transform one client's update (all tensors, one thread) is recorded per reading.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedrepro.io import write_json_atomic  # noqa: E402
from fedrepro.models.shapes import architecture, build_shape_model  # noqa: E402
from fedrepro.papers.fedsumm.algorithm import (  # noqa: E402
    ClientReply,
    FedSummConfig,
    FedSummServer,
    discrepancy_ratios,
    update_direction,
    unit_rms,
)

HUB_ID = "fnlp/bart-base-chinese"
EPSILON = 0.1
READINGS = ("update_direction", "update_direction_rank", "clip3")
TRANSFORM = {
    "update_direction": lambda t: update_direction(t, "unit_rms"),
    "update_direction_rank": lambda t: update_direction(t, "normal_scores"),
    "clip3": lambda t: unit_rms(t).clamp_(-3.0, 3.0),
}
SIZES = {
    # name: BartConfig overrides (None: the true architecture)
    "demo": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "heads": 2, "ffn": 64,
             "positions": 160},
    "d128": {"d_model": 128, "encoder_layers": 2, "decoder_layers": 2, "heads": 4, "ffn": 512,
             "positions": 512, "vocab": 21128},
    "d384": {"d_model": 384, "encoder_layers": 3, "decoder_layers": 3, "heads": 6, "ffn": 1536,
             "positions": 512, "vocab": 21128},
    "true": None,
}


def build_model(size: str, demo_vocab: int):
    from transformers import BartConfig, BartForConditionalGeneration

    spec = SIZES[size]
    if spec is None:
        return build_shape_model(architecture(HUB_ID), seed=0)
    arch = architecture(HUB_ID).config
    config = BartConfig(**{
        **{k: arch[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id",
                                "decoder_start_token_id", "forced_eos_token_id", "dropout")},
        "vocab_size": spec.get("vocab", demo_vocab),
        "d_model": spec["d_model"],
        "encoder_layers": spec["encoder_layers"], "decoder_layers": spec["decoder_layers"],
        "encoder_attention_heads": spec["heads"], "decoder_attention_heads": spec["heads"],
        "encoder_ffn_dim": spec["ffn"], "decoder_ffn_dim": spec["ffn"],
        "max_position_embeddings": spec["positions"],
    })
    torch.manual_seed(0)
    return BartForConditionalGeneration(config)


def client_batch(vocab: int, client: int, examples: int, source_length: int,
                 target_length: int) -> dict:
    """``examples`` random sequences whose tokens follow Zipf(1) over ids 104..vocab-1 (after
    bert-base-chinese's specials), seeded by the client."""
    g = torch.Generator().manual_seed(1000 + client)
    first = 104 if vocab > 1000 else 5
    ranks = torch.arange(1, vocab - first + 1, dtype=torch.float64)
    weights = 1.0 / ranks
    src = first + torch.multinomial(weights, examples * source_length, True, generator=g)
    tgt = first + torch.multinomial(weights, examples * target_length, True, generator=g)
    src = src.reshape(examples, source_length)
    tgt = tgt.reshape(examples, target_length)
    src[:, 0], src[:, -1] = 101, 102  # [CLS] x [SEP]
    tgt[:, -1] = 102
    return {"input_ids": src, "attention_mask": torch.ones_like(src), "labels": tgt}


def local_update(model, w0: OrderedDict, batch: dict, optimizer: str, lr: float,
                 seed: int) -> tuple[OrderedDict, float]:
    """One step from w_0 on ``batch``; returns Δ = w^c − w_0 (float32, per trainable tensor) and
    the gradient's norm before clipping."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(w0[n])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = (torch.optim.AdamW(params, lr=lr, weight_decay=0.0) if optimizer == "adamw"
           else torch.optim.SGD(params, lr=lr))
    model.train()
    torch.manual_seed(seed)
    loss = model(**batch, use_cache=False).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
    opt.step()
    out = OrderedDict((n, p.detach() - w0[n]) for n, p in model.named_parameters()
                      if p.requires_grad)
    del opt
    return out, grad_norm


def l2(tensors) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors.values()))


def global_sigma(mean: OrderedDict, transform) -> OrderedDict:
    """σ_g of eq. 6 per tensor: softmax(T(mean_c Δ_c)) (once per round)."""
    return OrderedDict((k, torch.softmax(transform(v).reshape(-1), 0)) for k, v in mean.items())


def rho_per_tensor(delta: OrderedDict, sigma_g: OrderedDict, transform) -> dict[str, float]:
    """Eq. 5–6 in round 1 per tensor: Σ_i p_i²/q_i with p = softmax(T(Δ_c)), q = σ_g."""
    out = {}
    for k in delta:
        p = torch.softmax(transform(delta[k]).reshape(-1), 0)
        out[k] = discrepancy_ratios([p], [sigma_g[k]], "expected")[0]
    return out


def server_step_ratio(deltas: list[OrderedDict], mean: OrderedDict,
                      rhos: list[dict[str, float]]) -> float:
    """‖mean_c (1 + ε ρ_{c,k}) Δ_c‖ / ‖mean_c Δ_c‖ (apply_on_server, own entry, delta gradient)."""
    num = den = 0.0
    for k in mean:
        s = sum((1.0 + EPSILON * r[k]) * d[k].double() for d, r in zip(deltas, rhos)) / len(deltas)
        num += float(s.pow(2).sum())
        den += float(mean[k].double().pow(2).sum())
    return math.sqrt(num / den)


def tensor_profile(delta: OrderedDict, k: str) -> dict:
    t = delta[k].reshape(-1)
    u = unit_rms(t)
    return {"numel": t.numel(), "zero_fraction": float((t == 0).double().mean()),
            "max_abs_unit_rms": float(u.abs().max())}


def check_with_server(w0: OrderedDict, deltas: list[OrderedDict], reading: str) -> dict:
    """ρ and ‖Δ_server‖/‖Δ_FedAvg‖ from :meth:`FedSummServer.server_round` on the same replies."""
    config = FedSummConfig(epsilon=EPSILON, reading=reading, dldt="off")
    clients = [f"c{i}" for i in range(len(deltas))]
    server = FedSummServer(config, clients, seed=0)
    replies = {}
    for c, d in zip(clients, deltas):
        params = OrderedDict((k, w0[k] + d[k]) for k in w0)
        replies[c] = ClientReply(params, OrderedDict((k, w0[k] - params[k]) for k in w0), 1.0)
    _, log = server.server_round(1, w0, replies)
    diff = log["update_difference"]
    return {"rho_mean": log["rho_mean"], "rho": [log["rho"][c] for c in clients],
            "server_step_ratio": diff["best_scale"] / diff["cosine"]}


def run_size(size: str, args) -> dict:
    t0 = time.perf_counter()
    model = build_model(size, args.demo_vocab)
    vocab = model.config.vocab_size
    w0 = OrderedDict((n, p.detach().clone()) for n, p in model.named_parameters()
                     if p.requires_grad)
    n_params = sum(t.numel() for t in w0.values())
    print(f"== {size}: {n_params:,} parameters, vocabulary {vocab}", flush=True)
    batches = [client_batch(vocab, c, args.examples, args.source_length, args.target_length)
               for c in range(args.clients)]
    out = {"size": size, "parameters": n_params, "vocab_size": vocab,
           "d_model": model.config.d_model,
           "layers": [model.config.encoder_layers, model.config.decoder_layers],
           "tensors": len(w0), "optimizers": {}}
    for optimizer in args.optimizers:
        lr = args.adamw_lr if optimizer == "adamw" else args.sgd_lr
        t1 = time.perf_counter()
        steps = [local_update(model, w0, b, optimizer, lr, seed=c)
                 for c, b in enumerate(batches)]
        deltas = [d for d, _ in steps]
        train_s = time.perf_counter() - t1
        mean = OrderedDict((k, sum(d[k] for d in deltas) / len(deltas)) for k in w0)
        res = {"lr": lr, "seconds_local_updates": train_s,
               "grad_norm_before_clipping": [g for _, g in steps],
               "update_norm": [l2(d) for d in deltas], "mean_update_norm": l2(mean),
               "readings": {}}
        print(f"  {optimizer} lr {lr}: |grad| {[round(g, 3) for _, g in steps]}, |update| "
              f"{[round(x, 4) for x in res['update_norm']]}", flush=True)
        for reading in READINGS:
            transform = TRANSFORM[reading]
            torch.set_num_threads(1)
            t2 = time.perf_counter()
            for k in deltas[0]:
                transform(deltas[0][k])
            transform_s = time.perf_counter() - t2
            torch.set_num_threads(args.threads)
            sigma_g = global_sigma(mean, transform)
            per_tensor = [rho_per_tensor(d, sigma_g, transform) for d in deltas]
            del sigma_g
            rho = [sum(r.values()) / len(r) for r in per_tensor]
            top = sorted(per_tensor[0], key=per_tensor[0].get, reverse=True)[:4]
            res["readings"][reading] = {
                "rho": rho,
                "rho_mean": sum(rho) / len(rho),
                "rho_tensor_max": max(max(r.values()) for r in per_tensor),
                "server_step_ratio": server_step_ratio(deltas, mean, per_tensor),
                "top_tensors_client0": [{"tensor": k, "rho": per_tensor[0][k],
                                         **tensor_profile(deltas[0], k)} for k in top],
                "seconds_transform_one_client_1thread": transform_s,
            }
            if args.verbose:
                for t in res["readings"][reading]["top_tensors_client0"]:
                    print("     ", t, flush=True)
            print(f"  {optimizer} {reading}: rho {res['readings'][reading]['rho_mean']:.4g} "
                  f"(clients {', '.join(f'{r:.4g}' for r in rho)}), step ratio "
                  f"{res['readings'][reading]['server_step_ratio']:.4g}, transform "
                  f"{transform_s:.2f} s", flush=True)
            if size in ("demo", "d128") and reading != "clip3":
                chk = check_with_server(w0, deltas, reading)
                res["readings"][reading]["check"] = chk
                for key in ("rho_mean", "server_step_ratio"):
                    a, b = chk[key], res["readings"][reading][key]
                    assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5), (
                        chk, reading)
        out["optimizers"][optimizer] = res
        del deltas, mean
    out["seconds"] = time.perf_counter() - t0
    return out


def machine() -> dict:
    import transformers

    return {"platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(),
            "numpy": np.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/fedsumm_rho_scale.json"))
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--optimizers", nargs="+", default=["adamw", "sgd"], choices=["adamw", "sgd"])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--examples", type=int, default=2)
    ap.add_argument("--source-length", type=int, default=64)
    ap.add_argument("--target-length", type=int, default=16)
    ap.add_argument("--adamw-lr", type=float, default=5e-5)
    ap.add_argument("--sgd-lr", type=float, default=0.2)
    ap.add_argument("--demo-vocab", type=int, default=936)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--verbose", action="store_true", help="print each reading's top tensors")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results = [run_size(s, args) for s in args.sizes]
    table = [{"size": r["size"], "parameters": r["parameters"], "optimizer": o, "lr": res["lr"],
              "update_norm_mean": sum(res["update_norm"]) / len(res["update_norm"]),
              "reading": reading, "rho_mean": v["rho_mean"],
              "rho_tensor_max": v["rho_tensor_max"], "server_step_ratio": v["server_step_ratio"],
              "seconds_transform_one_client_1thread": v["seconds_transform_one_client_1thread"]}
             for r in results for o, res in r["optimizers"].items()
             for reading, v in res["readings"].items()]
    write_json_atomic(args.out, {
        "what": "FedSUMM rho (eq. 5-6, round 1, rho_reduction expected, per-tensor softmax against "
                "the round's mean update, rho_c = mean over tensors) and the apply_on_server step "
                "ratio ||mean_c (1 + eps*rho_ck) D_c|| / ||mean_c D_c|| (eps 0.1) across model "
                "sizes; random weights, random Zipf token examples, one local step per client",
        "started": started, "machine": machine(), "settings": vars(args), "table": table,
        "sizes": results})
    for row in table:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
