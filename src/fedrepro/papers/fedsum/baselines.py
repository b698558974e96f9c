"""The baselines of FedSum §5.1 on BERTSUM: client objectives and server rules, Flower-free.

==========  ============================  ==========================================  ==========
method      client objective (per batch)  server rule                                 evaluated
==========  ============================  ==========================================  ==========
Separate    L_data                        none: every client keeps its own model      per client
FedAvg      L_data                        Σ (n_i/n)·Ω_i                               global
FedProx     L_data + μ/2‖w − w_g‖²        Σ (n_i/n)·Ω_i (Flower's ``FedProx``)        global
SCAFFOLD    L_data, grad + c − c_i        x += η_g·mean(y_i − x); c += (|S|/N)·mean Δc  global
FedNova     L_data (vanilla SGD)          x −= τ_eff·Σ p_i (x − y_i)/τ_i               global
FedProto    L_data + λ·MSE(H_s, C̄^(φ_s))  C̄^(j) = Σ_i |D_ij|/N_j · C_i^(j); no Ω sent   per client
FedDC       L_data                        every b rounds Σ (n_i/n)·Ω_i, every d rounds  global
                                          a seeded derangement of the models
==========  ============================  ==========================================  ==========

L_data is BERTSUM's sentence BCE summed over sentences, averaged over documents (FedSum Alg. 2
line 7); every method uses plain SGD (the FedSum authors' code: lr 5e-3), a fresh optimiser each
round.  :func:`baseline_local_update` runs one client round of any of them.

What persists between rounds
----------------------------
* Separate, FedProto: each client's own model Ω_i (``upload.federated_state``; FedProto sends only
  prototypes).  The server keeps FedProto's global prototypes.
* SCAFFOLD: the client's control variate c_i (client side, zeros at first); c and x on the server.
* FedDC: the server's :class:`DaisyChain` (the model each client holds between aggregations).
* FedAvg, FedProx, FedNova: nothing beyond Ω_g.

Choices the papers leave open (ours; also in ``docs/decisions-fedsum.md``)
----------------------------------------------------------------------------
* **FedProx** (Li et al. 2020): only the client term; μ = 1 (FedSum authors' code).  w_g = the
  received global model, fixed during the round; the term covers every trained parameter.
* **SCAFFOLD** (Karimireddy et al. 2020, Alg. 1, option II): y ← y − η(g(y) − c_i + c) on every
  parameter; c_i⁺ = c_i − c + (x − y_i)/(Kη) with K the number of local steps; the server averages
  Δy *uniformly* over the replies (the paper's 1/|S|; pass ``weights`` for n_i/n) with global
  step size η_g = 1, and c ← c + (|S|/N)·mean Δc_i.
* **FedNova** (Wang et al. 2020): vanilla SGD, so a_i = τ_i = the client's local step count;
  p_i = n_i/n over the participants; τ_eff = Σ p_i τ_i.
* **FedProto** (Tan et al. 2022): the representation is the sentence vector (r(θ) of BERTSUM),
  classes are the sentence labels; regulariser λ·MSE (``MSELoss``: mean over sentences and
  dimensions) of each sentence's vector to its class's global prototype, λ = 1 (FedProto's code
  ``ld``); classes without a global prototype (round 1) add nothing.  Local prototypes are
  measured after the local epochs in eval mode; the server averages them per class weighted by
  the class's sentence counts |D_ij| (FedProto eq. 6 without its extra 1/|N_j|).  Models are
  personalised (never averaged), as in FedProto and the FedSum authors' code.
* **FedDC** = federated daisy-chaining (Kamp, Fischer & Vreeken 2021, Alg. 1): round t ends with an
  aggregation when t mod b = 0, else with a permutation when t mod d = 0, else each client keeps
  its model.  With partial participation the permutation is over the round's participants and is
  a derangement (no model returns to the client that produced it; Kamp draws a random
  permutation, which can leave a model in place), seeded by (seed, round); a client receives
  the model it holds, or the last aggregate if it holds none (every client holds the aggregate
  after an aggregation round).  Defaults d = 1, b = 2 (Kamp's experiments use d = 1 with b ≫ 1
  over hundreds of rounds; with FedSum's 5 rounds b = 2 still aggregates twice).  The model
  evaluated after each round is the n_i/n average of the returned models (the aggregate at
  aggregation rounds).
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from fedrepro.papers.fedsum.algorithm import (
    CLASSES,
    client_prototypes,
    weighted_average,
)
from fedrepro.fl.algorithms import fednova_aggregate, fedprox_proximal_term  # noqa: F401 (re-exported)
from fedrepro.io import InputError
from fedrepro.papers.fedsum.model import BertSumBatch, BertSumExt, data_loss, sentence_loss_matrix


@dataclasses.dataclass(frozen=True)
class BaselineSpec:
    name: str
    objective: str  # "ce" | "prox" | "scaffold" | "fedproto"
    server_rule: str  # "none" | "fedavg" | "scaffold" | "fednova" | "prototypes" | "daisy_chain"
    receives_global_model: bool
    evaluated: str  # "global" | "clients"


BASELINES: dict[str, BaselineSpec] = {
    "Separate": BaselineSpec("Separate", "ce", "none", False, "clients"),
    "FedAvg": BaselineSpec("FedAvg", "ce", "fedavg", True, "global"),
    "FedProx": BaselineSpec("FedProx", "prox", "fedavg", True, "global"),
    "SCAFFOLD": BaselineSpec("SCAFFOLD", "scaffold", "scaffold", True, "global"),
    "FedNova": BaselineSpec("FedNova", "ce", "fednova", True, "global"),
    "FedProto": BaselineSpec("FedProto", "fedproto", "prototypes", False, "clients"),
    "FedDC": BaselineSpec("FedDC", "ce", "daisy_chain", True, "global"),
}


def get_baseline(method: str | BaselineSpec) -> BaselineSpec:
    if isinstance(method, BaselineSpec):
        return method
    try:
        return BASELINES[method]
    except KeyError:
        raise InputError(f"unknown FedSum baseline {method!r}; known: {list(BASELINES)}") from None


@dataclasses.dataclass(frozen=True)
class BaselineHParams:
    """SGD lr 5e-3, 2 local epochs, FedProx μ = 1 (FedSum authors' code); FedProto λ = 1;
    SCAFFOLD η_g = 1; FedDC d = 1, b = 2 (module docstring)."""

    lr: float = 5e-3
    local_epochs: int = 2
    mu: float = 1.0
    fedproto_lambda: float = 1.0
    scaffold_global_lr: float = 1.0
    daisy_period: int = 1
    aggregation_period: int = 2

    def __post_init__(self):
        if self.lr <= 0 or self.local_epochs < 1:
            raise InputError("fedsum baselines: lr must be > 0 and local_epochs >= 1")
        if self.mu < 0 or self.fedproto_lambda < 0:
            raise InputError("fedsum baselines: mu and fedproto_lambda must be >= 0")
        if self.daisy_period < 1 or self.aggregation_period < 1:
            raise InputError("fedsum baselines: daisy_period and aggregation_period must be >= 1")

    @classmethod
    def from_config(cls, cfg: Mapping) -> BaselineHParams:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(cfg) - set(fields)
        if unknown:
            raise InputError(
                f"fedsum baselines: unknown keys {sorted(unknown)}; known: {sorted(fields)}"
            )
        return cls(**{k: type(fields[k].default)(v) for k, v in cfg.items()})


# -- FedProx: fedprox_proximal_term (shared with AdaFedSelecKD's AdaFedProx, fedrepro.fl.algorithms)


# -- SCAFFOLD --------------------------------------------------------------------------------------
def zeros_like_state(state: Mapping[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    """Initial control variates (c = c_i = 0, SCAFFOLD Alg. 1)."""
    return OrderedDict((k, torch.zeros_like(v)) for k, v in state.items())


def scaffold_correct_gradients(
    named_params: Mapping[str, torch.nn.Parameter],
    server_control: Mapping[str, torch.Tensor],
    client_control: Mapping[str, torch.Tensor],
) -> None:
    """g ← g − c_i + c in place (SCAFFOLD Alg. 1 line 10: y ← y − η(g_i(y) − c_i + c))."""
    for k, p in named_params.items():
        if p.grad is not None:
            p.grad.add_(server_control[k].to(p.grad.dtype) - client_control[k].to(p.grad.dtype))


def scaffold_client_control_update(
    client_control: Mapping[str, torch.Tensor],
    server_control: Mapping[str, torch.Tensor],
    global_state: Mapping[str, torch.Tensor],
    local_state: Mapping[str, torch.Tensor],
    num_steps: int,
    lr: float,
) -> tuple[OrderedDict[str, torch.Tensor], OrderedDict[str, torch.Tensor]]:
    """Option II of SCAFFOLD Alg. 1 line 12: c_i⁺ = c_i − c + (x − y_i)/(K·η).

    Returns (c_i⁺, Δc_i = c_i⁺ − c_i).  K = ``num_steps`` local steps, η = ``lr``.
    """
    if num_steps < 1:
        raise InputError("SCAFFOLD: the client made no local step (K = 0)")
    new, delta = OrderedDict(), OrderedDict()
    for k, ci in client_control.items():
        step = (global_state[k].double() - local_state[k].double()) / (num_steps * lr)
        c_new = (ci.double() - server_control[k].double() + step).to(ci.dtype)
        new[k] = c_new
        delta[k] = c_new - ci
    return new, delta


def scaffold_server_update(
    global_state: Mapping[str, torch.Tensor],
    server_control: Mapping[str, torch.Tensor],
    client_states: Sequence[Mapping[str, torch.Tensor]],
    control_deltas: Sequence[Mapping[str, torch.Tensor]],
    num_clients_total: int,
    global_lr: float = 1.0,
    weights: Sequence[float] | None = None,
) -> tuple[OrderedDict[str, torch.Tensor], OrderedDict[str, torch.Tensor]]:
    """SCAFFOLD Alg. 1 lines 16–17: x ← x + η_g·(1/|S|)Σ Δy_i with Δy_i = y_i − x;
    c ← c + (1/N)Σ Δc_i = c + (|S|/N)·mean Δc_i.  ``weights`` (e.g. n_i) replace the uniform
    1/|S| of the Δy average (the c update keeps SCAFFOLD's 1/N)."""
    s = len(client_states)
    if s == 0 or s != len(control_deltas):
        raise InputError(f"SCAFFOLD: {s} client states for {len(control_deltas)} control deltas")
    if num_clients_total < s:
        raise InputError(f"SCAFFOLD: N = {num_clients_total} < |S| = {s}")
    w = [1.0 / s] * s if weights is None else [x / math.fsum(weights) for x in weights]
    x_new, c_new = OrderedDict(), OrderedDict()
    for k, x in global_state.items():
        dy = sum(wi * (y[k].double() - x.double()) for wi, y in zip(w, client_states))
        x_new[k] = (x.double() + global_lr * dy).to(x.dtype)
    for k, c in server_control.items():
        dc = sum(d[k].double() for d in control_deltas)
        c_new[k] = (c.double() + dc / num_clients_total).to(c.dtype)
    return x_new, c_new


# -- FedNova: fednova_aggregate (shared with AdaFedSelecKD's AdaFedNova, fedrepro.fl.algorithms)


# -- FedProto --------------------------------------------------------------------------------------
def fedproto_regularizer(
    sentence_vectors: torch.Tensor,
    labels: torch.Tensor,
    cls_mask: torch.Tensor,
    global_prototypes: Mapping[int, torch.Tensor | None],
    weight: float = 1.0,
) -> torch.Tensor:
    """λ · MSE(H_s, C̄^(φ_s)) over the valid sentences whose class has a global prototype
    (FedProto, Tan et al. 2022, eq. 8's prototype term; ``MSELoss`` mean reduction)."""
    h = sentence_vectors[cls_mask]
    y = labels[cls_mask].long()
    have = [xi for xi in CLASSES if global_prototypes.get(xi) is not None]
    if not have or h.numel() == 0:
        return sentence_vectors.new_zeros(())
    sel = torch.zeros_like(y, dtype=torch.bool)
    target = torch.zeros_like(h)
    for xi in have:
        m = y == xi
        sel |= m
        target[m] = global_prototypes[xi].detach().to(h.dtype)
    if not bool(sel.any()):
        return sentence_vectors.new_zeros(())
    return float(weight) * F.mse_loss(h[sel], target[sel])


def fedproto_aggregate(
    prototypes: Sequence[Mapping[int, torch.Tensor | None]],
    class_counts: Sequence[Mapping[int, int]],
) -> dict[int, torch.Tensor | None]:
    """C̄^(j) = Σ_i (|D_ij| / N_j)·C_i^(j), N_j = Σ_i |D_ij| over the clients holding class j
    (FedProto eq. 6); None when no client has class j."""
    if len(prototypes) != len(class_counts):
        raise InputError("FedProto: one count table per prototype table needed")
    out: dict[int, torch.Tensor | None] = {}
    for xi in CLASSES:
        have = [
            (p[xi], int(c.get(xi, 0)))
            for p, c in zip(prototypes, class_counts)
            if p.get(xi) is not None and c.get(xi, 0) > 0
        ]
        if not have:
            out[xi] = None
            continue
        n = sum(c for _, c in have)
        out[xi] = sum((c / n) * p.double() for p, c in have).float()
    return out


# -- FedDC (federated daisy-chaining) --------------------------------------------------------------
def derangement(items: Sequence[str], rng: np.random.Generator) -> list[str]:
    """A uniformly random derangement of ``items`` (no item keeps its place), by rejection;
    a single item is returned as is."""
    items = list(items)
    if len(items) < 2:
        return items
    while True:
        perm = [items[i] for i in rng.permutation(len(items))]
        if all(a != b for a, b in zip(items, perm)):
            return perm


class DaisyChain:
    """FedDC's server (Kamp et al. 2021, Alg. 1): aggregation every ``aggregation_period`` (b)
    rounds, otherwise a model permutation every ``daisy_period`` (d) rounds; the permutation of
    round t is a derangement of that round's participants seeded by (seed, t).

    State: ``global_state`` (the last aggregate) and ``held`` (client → the model it holds)."""

    def __init__(
        self,
        daisy_period: int,
        aggregation_period: int,
        seed: int = 0,
        global_state: Mapping[str, torch.Tensor] | None = None,
    ):
        if daisy_period < 1 or aggregation_period < 1:
            raise InputError("FedDC: daisy_period and aggregation_period must be >= 1")
        self.daisy_period = int(daisy_period)
        self.aggregation_period = int(aggregation_period)
        self.seed = int(seed)
        self.global_state = None if global_state is None else OrderedDict(global_state)
        self.held: dict[str, OrderedDict] = {}

    def to_dict(self) -> dict:
        """Plain dict (``torch.save``-able) for checkpoints."""
        return {
            "daisy_period": self.daisy_period,
            "aggregation_period": self.aggregation_period,
            "seed": self.seed,
            "global_state": self.global_state,
            "held": {c: OrderedDict(s) for c, s in self.held.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> DaisyChain:
        dc = cls(d["daisy_period"], d["aggregation_period"], d["seed"], d["global_state"])
        dc.held = {c: OrderedDict(s) for c, s in d["held"].items()}
        return dc

    def action(self, t: int) -> str:
        """``"aggregate"`` if t mod b = 0, else ``"permute"`` if t mod d = 0, else ``"keep"``."""
        if t % self.aggregation_period == 0:
            return "aggregate"
        if t % self.daisy_period == 0:
            return "permute"
        return "keep"

    def permutation(self, t: int, clients: Sequence[str]) -> dict[str, str]:
        """{receiver: sender} for round t: a seeded derangement of the sorted ``clients``."""
        from fedrepro.data.seq2seq import derive_seed

        ids = sorted(str(c) for c in clients)
        senders = derangement(ids, np.random.default_rng(derive_seed(self.seed, "feddc", t)))
        return dict(zip(ids, senders))

    def model_for(self, client: str) -> OrderedDict:
        """The model ``client`` trains next: the one it holds, else the last aggregate."""
        state = self.held.get(str(client), self.global_state)
        if state is None:
            raise InputError(f"FedDC: no model for client {client} (set the initial global state)")
        return state

    def server_round(
        self,
        t: int,
        client_states: Mapping[str, Mapping[str, torch.Tensor]],
        num_examples: Mapping[str, int],
    ) -> tuple[str, OrderedDict]:
        """End of round t: aggregate, permute or keep; returns (action, the n_i/n average of the
        returned models -- the model evaluated after this round)."""
        ids = sorted(str(c) for c in client_states)
        if not ids:
            raise InputError("FedDC: no client replies")
        average = weighted_average([client_states[c] for c in ids], [num_examples[c] for c in ids])
        action = self.action(t)
        if action == "aggregate":
            self.global_state = average
            self.held = {}
        elif action == "permute":
            for receiver, sender in self.permutation(t, ids).items():
                self.held[receiver] = OrderedDict(client_states[sender])
        else:
            for c in ids:
                self.held[c] = OrderedDict(client_states[c])
        return action, average


# -- one client round ------------------------------------------------------------------------------
@dataclasses.dataclass
class BaselineUpload:
    """A client's reply: Ω_i (for FedProto it stays on the client), its local step count τ_i
    (FedNova), SCAFFOLD's Δc_i and new c_i (c_i stays on the client), FedProto's prototypes."""

    num_examples: int
    federated_state: OrderedDict
    local_steps: int
    stats: dict
    control_delta: OrderedDict | None = None
    client_control: OrderedDict | None = None
    class_prototypes: dict[int, torch.Tensor | None] | None = None
    class_counts: dict[int, int] | None = None


def baseline_local_update(
    model: BertSumExt,
    method: str | BaselineSpec,
    epoch_batches: Callable[[int], Sequence[BertSumBatch]] | Sequence[BertSumBatch],
    hp: BaselineHParams,
    *,
    client: str,
    t: int,
    seed: int = 0,
    global_state: Mapping[str, torch.Tensor] | None = None,
    server_control: Mapping[str, torch.Tensor] | None = None,
    client_control: Mapping[str, torch.Tensor] | None = None,
    global_prototypes: Mapping[int, torch.Tensor | None] | None = None,
    mu: float | None = None,
    precision=None,
) -> BaselineUpload:
    """One client round t of ``method`` (E = ``hp.local_epochs`` epochs of SGD, one step per
    batch; t only seeds the round's dropout).

    ``global_state`` (Ω keys, ``model.federated_state()``) is loaded first for methods that
    receive a model (FedAvg, FedProx, SCAFFOLD, FedNova, FedDC -- for FedDC pass
    ``DaisyChain.model_for(client)``); Separate and FedProto train the model as it is (the
    client's own).  SCAFFOLD needs ``server_control`` (c) and ``client_control`` (c_i; None = 0).
    FedProto takes ``global_prototypes`` (None in round 1).  ``mu`` overrides ``hp.mu`` (Flower's
    ``FedProx`` strategy sends ``proximal-mu``).  ``precision`` (a
    :class:`fedrepro.precision.Precision` or its mode name; ``None``: fp32): ``bf16-mixed`` runs
    each batch's forward and loss under bf16 autocast (FedProto's prototypes in float32),
    ``tf32`` the round with TF32 matmuls on CUDA.
    """
    from fedrepro.devices import model_device
    from fedrepro.precision import Precision

    precision = Precision.of(precision)
    with precision.region(model_device(model)):
        return _baseline_local_update(
            model, method, epoch_batches, hp, client=client, t=t, seed=seed,
            global_state=global_state, server_control=server_control,
            client_control=client_control, global_prototypes=global_prototypes, mu=mu,
            precision=precision,
        )


def _baseline_local_update(model, method, epoch_batches, hp, *, client, t, seed, global_state,
                           server_control, client_control, global_prototypes, mu,
                           precision) -> BaselineUpload:
    from fedrepro.data.seq2seq import derive_seed
    from fedrepro.devices import StepTimer, model_device

    spec = get_baseline(method)
    device = model_device(model)
    timer = StepTimer(device, flop_key=f"fedsum:{spec.name}")
    if spec.receives_global_model and global_state is not None:
        model.load_federated_state(global_state)
    torch.manual_seed(derive_seed(seed, "fedsum-baseline", spec.name, client, t))
    x = model.federated_state()  # the received model, fixed for the round
    named = OrderedDict((k, p) for k, p in model.named_parameters() if p.requires_grad)
    if spec.objective == "scaffold":
        if server_control is None:
            raise InputError("SCAFFOLD: the server control variate c is missing")
        client_control = zeros_like_state(x) if client_control is None else client_control
    mu = hp.mu if mu is None else float(mu)
    opt = torch.optim.SGD(list(named.values()), lr=hp.lr)
    steps, losses, extra = 0, [], []
    last: list[BertSumBatch] = []
    model.train()
    for e in range(1, hp.local_epochs + 1):
        batches = list(epoch_batches(e) if callable(epoch_batches) else epoch_batches)
        if not batches:
            raise InputError(f"client {client}: no training batches")
        last = batches
        for batch in batches:
            with timer.step():
                with precision.autocast(device):  # forward + loss; backward outside autocast
                    h, logits = model.logits(batch)
                    loss = data_loss(sentence_loss_matrix(logits, batch.labels, batch.cls_mask))
                    losses.append(float(loss.detach()))
                    if spec.objective == "prox" and mu > 0:
                        term = fedprox_proximal_term(named, x, mu)
                        extra.append(float(term.detach()))
                        loss = loss + term
                    elif spec.objective == "fedproto" and global_prototypes:
                        term = fedproto_regularizer(
                            h, batch.labels, batch.cls_mask, global_prototypes, hp.fedproto_lambda
                        )
                        extra.append(float(term.detach()))
                        loss = loss + term
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if spec.objective == "scaffold":
                    scaffold_correct_gradients(named, server_control, client_control)
                opt.step()
            steps += 1
    model.eval()
    y = model.federated_state()
    upload = BaselineUpload(
        num_examples=sum(len(b) for b in last),
        federated_state=y,
        local_steps=steps,
        stats={
            "steps": steps,
            "L_data": math.fsum(losses) / max(len(losses), 1),
            "L_extra": math.fsum(extra) / len(extra) if extra else 0.0,
            **timer.stats(),  # seconds_*/peak_*: measurements, moved to provenance by the runner
        },
    )
    if spec.objective == "scaffold":
        upload.client_control, upload.control_delta = scaffold_client_control_update(
            client_control, server_control, x, y, steps, hp.lr
        )
    if spec.objective == "fedproto":
        protos = client_prototypes(model, last)
        upload.class_prototypes = protos.class_prototypes
        upload.class_counts = protos.class_counts
    return upload
