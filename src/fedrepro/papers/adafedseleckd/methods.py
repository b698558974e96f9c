"""AdaFedSelecKD's five methods (§IV-B) and the client-side update of Algorithm 1.

=================  ============  ==================  ===========================================
method             setting       adapters            client objective / what the server sends
=================  ============  ==================  ===========================================
AdaSingle          single        local               CE on one domain, no server
AdaCentralized     centralized   local               CE on the pooled domains, no server
AdaFedAvg          federated     local               CE; the server's average *replaces* local
AdaFedKD           federated     global + local      eq. 6 on every token (τ = ∞)
AdaFedSelectKD     federated     global + local      eq. 8 (KD only where H(q_g) < τ)
AdaFedOPT          federated     local               CE; server: FedAvg's average as the pseudo-
                                                     gradient of Flower's FedAdam/FedYogi/FedAdagrad
AdaFedProx         federated     local               CE + μ/2‖w − w^r‖² (FedProx); server FedAvg
AdaFedNova         federated     local               CE; server: FedNova's normalised average
AdaFedHardKD       federated     global + local      eq. 6 only on target words tagged noun/verb
=================  ============  ==================  ===========================================

Table V compares AdaFedOPT, AdaFedProx and AdaFedNova ("adapter-based models are utilized for all
clients", §V-A): like AdaFedAvg they have one adapter that the server's result replaces each
round; only the server rule (FedOpt, FedNova) or the client objective (FedProx) differs.  Fig. 12's
noun–verb hard KD (AdaFedHardKD) is AdaFedKD with the KD term restricted to the label tokens of
target words spaCy tags NOUN or VERB (:mod:`fedrepro.papers.adafedseleckd.pos`).

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

from fedrepro.data.seq2seq import derive_seed, iterate_batches
from fedrepro.fl.algorithms import fedprox_proximal_term
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd.kd import cross_entropy_loss, selective_kd_loss


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    name: str
    setting: str  # "single" | "centralized" | "federated"
    roles: tuple[str, ...]
    server_role: str | None  # adapter role that receives the server's parameters each round
    distill: bool
    selective: bool
    server: str = "fedavg"  # "fedavg" | "fedopt" | "fednova" | "fedprox" (the strategy)
    proximal: bool = False  # FedProx's client term
    hard_kd: bool = False  # KD only on noun/verb target words (Fig. 12)

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
    "AdaFedOPT": MethodSpec("AdaFedOPT", "federated", ("local",), "local", False, False, "fedopt"),
    "AdaFedProx": MethodSpec(
        "AdaFedProx", "federated", ("local",), "local", False, False, "fedprox", proximal=True
    ),
    "AdaFedNova": MethodSpec("AdaFedNova", "federated", ("local",), "local", False, False, "fednova"),
    "AdaFedHardKD": MethodSpec(
        "AdaFedHardKD", "federated", ("global", "local"), "global", True, False, hard_kd=True
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
    prox_mu: float = 0.0

    @classmethod
    def from_config(cls, cfg: dict) -> TrainHParams:
        return cls(
            lr=float(cfg["lr"]),
            weight_decay=float(cfg["weight_decay"]),
            batch_size=int(cfg["batch_size"]),
            local_epochs=int(cfg["local_epochs"]),
            lam=float(cfg["lam"]),
            tau=float(cfg["tau"]),
            prox_mu=float(cfg.get("prox_mu", 0.0)),
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
    proximal_to: dict[str, torch.Tensor] | None = None,
    trace: dict | None = None,
    prefix_cache=None,
    precision=None,
) -> dict:
    """Algorithm 1, procedure ADAFEDSELECTKD (lines 11–27): E local epochs over the client's data.

    ``proximal_to`` (AdaFedProx): the round's received adapter w^r; the loss gains FedProx's
    μ/2‖w − w^r‖² over the local adapter (:func:`fedrepro.fl.algorithms.fedprox_proximal_term`).
    ``trace``: when given, ``trace[example id]`` collects each label token's KD decision (one
    list per time the example is trained), the record behind §V-C's word statistics (Fig. 11).
    Examples may carry ``kd_allowed`` (AdaFedHardKD: one bool per label token).
    ``prefix_cache`` (a :class:`~fedrepro.papers.adafedseleckd.prefix_cache.PrefixCache`, only
    for a backbone without dropout): each batch's frozen prefix is assembled from its examples'
    canonical prefixes, stored for the later epochs and rounds unless its mode is ``off``;
    ``None``: computed per padded batch.
    ``precision`` (a :class:`fedrepro.precision.Precision` or its mode name; ``None``: fp32):
    ``bf16-mixed`` runs each step's forward and loss under bf16 autocast, ``tf32`` the whole
    update with TF32 matmuls on CUDA; the adapters keep float32 weights and AdamW state.

    Batches are drawn in a permutation seeded by (seed, client, round, epoch), so a rerun — or a
    run resumed at a round boundary — sees the same batches.

    Returns training statistics: mean loss, the number of target tokens and how many of them used
    the KD term (the quantity behind §V-C's "86% / 88% / 89%" figures).
    """
    from fedrepro.devices import StepTimer, model_device
    from fedrepro.precision import Precision

    precision = Precision.of(precision)
    model.train()
    device = model_device(model)
    timer = StepTimer(device, flop_key=f"adafedseleckd:{spec.name}")
    tau = hp.tau if spec.selective else math.inf
    total_loss, n_batches, n_tokens, n_kd = 0.0, 0, 0, 0
    if prefix_cache is not None:
        prefix_cache.begin(model, client, examples)
    with precision.region(device):
        for epoch in range(hp.local_epochs):
            shuffle = derive_seed(seed, client, round_index, epoch)
            for batch in iterate_batches(examples, hp.batch_size, pad_token_id, start_token_id, shuffle):
                with timer.step():
                    loss, labels, kd, mask = _step(
                        model, spec, batch, device, hp, tau, optimizer, proximal_to, prefix_cache,
                        precision,
                    )
                if trace is not None:
                    _record_trace(trace, batch, labels, mask)
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


def _record_trace(trace: dict, batch: dict, labels: torch.Tensor, mask: torch.Tensor | None) -> None:
    valid = (labels != -100).cpu()
    bits = mask.cpu() if mask is not None else torch.zeros_like(valid)
    for i, ex_id in enumerate(batch["ids"]):
        n = int(valid[i].sum())
        trace.setdefault(ex_id, []).append([bool(b) for b in bits[i, :n].tolist()])


def _step(model, spec: MethodSpec, batch: dict, device, hp: TrainHParams, tau: float, optimizer,
          proximal_to: dict | None = None, prefix_cache=None, precision=None):
    """One optimizer step of eq. 6/8 (KD methods) or CE (+ FedProx's term):
    (loss, labels, KD tokens, KD mask or None).  The forward and the loss run under
    ``precision``'s autocast (bf16-mixed), the backward and the update outside it."""
    from fedrepro.devices import to_device
    from fedrepro.precision import Precision

    host_batch, batch = batch, to_device(batch, device)
    n_kd = 0
    labels = batch["labels"]
    kd_mask = None
    with Precision.of(precision).autocast(device):
        shared = {} if prefix_cache is None else {"prefix": prefix_cache.batch_prefix(model, host_batch, batch)}
        student, teacher = model.path_logits(
            batch["input_ids"],
            batch["attention_mask"],
            batch["decoder_input_ids"],
            student="local",
            teacher="global" if spec.distill else None,
            **shared,
        )
        if spec.distill:
            allowed = batch.get("kd_allowed") if spec.hard_kd else None
            if spec.hard_kd and allowed is None:
                raise InputError("AdaFedHardKD needs the POS mask of every example (kd_allowed)")
            loss, kd_mask = selective_kd_loss(student, teacher, labels, hp.lam, tau, allowed=allowed)
            n_kd += int(kd_mask.sum())
        else:
            loss = cross_entropy_loss(student, labels)
        if spec.proximal and hp.prox_mu > 0:
            if proximal_to is None:
                raise InputError("AdaFedProx needs the round's received adapter (proximal_to)")
            named = dict(model.stacks["local"].named_parameters())
            loss = loss + fedprox_proximal_term(named, proximal_to, hp.prox_mu)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss, labels, n_kd, kd_mask
