"""AdaFedSelecKD's five methods (§IV-B) and the client-side update of Algorithm 1.

=================  ============  ==================  ===========================================
method             setting       adapters            client objective / what the server sends
=================  ============  ==================  ===========================================
AdaSingle          single        local               CE on one domain, no server
AdaCentralized     centralized   local               CE on the pooled domains, no server
AdaFedAvg          federated     local               CE; the server's average *replaces* local
AdaFedKD           federated     global + local      eq. 6 on every token (τ = ∞)
AdaFedSelectKD     federated     global + local      eq. 8 (KD only where H(q_g) < τ)
=================  ============  ==================  ===========================================

In the two KD methods the server's average is loaded into the *global* adapter (teacher, frozen),
the *local* adapter keeps its own state across rounds (it is initialised once from the server's
W^1) and is what the client trains and sends back (Fig. 3: "the updated parameters are then
transmitted to the server").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from fedrepro.papers.adafedseleckd.kd import cross_entropy_loss, selective_kd_loss
from fedrepro.data.seq2seq import derive_seed, iterate_batches
from fedrepro.io import InputError


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    name: str
    setting: str  # "single" | "centralized" | "federated"
    roles: tuple[str, ...]
    server_role: str | None  # adapter role that receives the server's parameters each round
    distill: bool
    selective: bool

    @property
    def federated(self) -> bool:
        return self.setting == "federated"


METHODS: dict[str, MethodSpec] = {
    "AdaSingle": MethodSpec("AdaSingle", "single", ("local",), None, False, False),
    "AdaCentralized": MethodSpec("AdaCentralized", "centralized", ("local",), None, False, False),
    "AdaFedAvg": MethodSpec("AdaFedAvg", "federated", ("local",), "local", False, False),
    "AdaFedKD": MethodSpec("AdaFedKD", "federated", ("global", "local"), "global", True, False),
    "AdaFedSelectKD": MethodSpec(
        "AdaFedSelectKD", "federated", ("global", "local"), "global", True, True
    ),
}


def get_method(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise InputError(
            f"unknown AdaFedSelecKD method {name!r}; known: {list(METHODS)} "
            f"(config key: adafedseleckd.methods)"
        ) from None


@dataclasses.dataclass(frozen=True)
class TrainHParams:
    """Client optimisation settings (§IV-D: AdamW, lr 2e-4, batch 16, weight decay 0.01, λ 0.2, τ 5)."""

    lr: float
    weight_decay: float
    batch_size: int
    local_epochs: int
    lam: float
    tau: float

    @classmethod
    def from_config(cls, cfg: dict) -> TrainHParams:
        return cls(
            lr=float(cfg["lr"]),
            weight_decay=float(cfg["weight_decay"]),
            batch_size=int(cfg["batch_size"]),
            local_epochs=int(cfg["local_epochs"]),
            lam=float(cfg["lam"]),
            tau=float(cfg["tau"]),
        )


def make_optimizer(model, hp: TrainHParams) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.trainable_parameters(), lr=hp.lr, weight_decay=hp.weight_decay)


def local_update(
    model,
    spec: MethodSpec,
    examples: Sequence[dict],
    hp: TrainHParams,
    optimizer: torch.optim.Optimizer,
    seed: int,
    client: str,
    round_index: int,
    pad_token_id: int,
    start_token_id: int,
) -> dict:
    """Algorithm 1, procedure ADAFEDSELECTKD (lines 11–27): E local epochs over the client's data.

    Batches are drawn in a permutation seeded by (seed, client, round, epoch), so a rerun — or a
    run resumed at a round boundary — sees the same batches.

    Returns training statistics: mean loss, the number of target tokens and how many of them used
    the KD term (the quantity behind §V-C's "86% / 88% / 89%" figures).
    """
    from fedrepro.devices import StepTimer, model_device, to_device

    model.train()
    device = model_device(model)
    timer = StepTimer(device)
    tau = hp.tau if spec.selective else math.inf
    total_loss, n_batches, n_tokens, n_kd = 0.0, 0, 0, 0
    for epoch in range(hp.local_epochs):
        shuffle = derive_seed(seed, client, round_index, epoch)
        for batch in iterate_batches(examples, hp.batch_size, pad_token_id, start_token_id, shuffle):
            with timer.step():
                loss, labels, kd = _step(model, spec, batch, device, hp, tau, optimizer)
            n_kd += kd
            total_loss += float(loss.detach())
            n_batches += 1
            n_tokens += int((labels != -100).sum())
    return {
        "train_loss": total_loss / max(n_batches, 1),
        "n_batches": n_batches,
        "n_tokens": n_tokens,
        "n_kd_tokens": n_kd,
        "kd_fraction": n_kd / n_tokens if n_tokens else 0.0,
        **timer.stats(),
    }


def _step(model, spec: MethodSpec, batch: dict, device, hp: TrainHParams, tau: float, optimizer):
    """One optimizer step of eq. 6/8 (KD methods) or CE: (loss, labels, KD tokens)."""
    from fedrepro.devices import to_device

    batch = to_device(batch, device)
    n_kd = 0
    student, teacher = model.path_logits(
        batch["input_ids"],
        batch["attention_mask"],
        batch["decoder_input_ids"],
        student="local",
        teacher="global" if spec.distill else None,
    )
    labels = batch["labels"]
    if spec.distill:
        loss, kd_mask = selective_kd_loss(student, teacher, labels, hp.lam, tau)
        n_kd += int(kd_mask.sum())
    else:
        loss = cross_entropy_loss(student, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss, labels, n_kd
