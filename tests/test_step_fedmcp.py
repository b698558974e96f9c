"""FedMCP's client step and server average, checked against the papers' equations written out here.

Paper: Zhao et al., "FedMCP: Parameter-Efficient Federated Learning with Model-Contrastive
Personalization" (``../shared/papers/fedmcp.txt``); baselines: MOON (Li et al., CVPR 2021, §3.3
eq. 3-4), FedRep (Collins et al., ICML 2021, Algorithm 1), FedMatch (Chen et al., CIKM 2021),
FedPETuning's LoRA (FedLR), FedAvg (McMahan et al. 2017).

1. **One client round per method** (all 13 of :data:`methods.METHODS`).  On a tiny float64
   RoBERTa and fixed batches, one call of :func:`methods.local_update` (the client round of
   ``task.client_train_round``) is replayed here on a deep copy of the model: the method's total
   loss is written out with torch / ``torch.nn.functional`` from the model's outputs (its
   ``forward`` only -- none of ``losses.py``), back-propagated, and stepped by a fresh
   ``torch.optim.Adam`` of the client's hyperparameters.  Checked per method:

   * the optimiser the client builds (class, parameter set, lr, betas, eps, weight decay 0);
   * the gradient that optimiser sees at every step equals the gradient of the written-out loss
     (one Adam step from zero moments moves each coordinate by ≈ lr·sign(g), which hides a
     re-weighted term; the gradient does not);
   * every trainable parameter after the round equals the replay's; every other one (the frozen
     backbone, and the adapter set / head the method does not train) is unchanged bit for bit;
   * what the client sends (``model.shared_state()``, serialised by ``task.client_train_round``
     as ``cpu_state(model.shared_state())``) is exactly the method's shared set, holding the
     trained values.

   Asymmetric hyperparameters (γ = 0.3, μ = 1.7, μ_moon = 1.3, τ = 0.7, lr 3e-3 ≠ full_ft_lr
   7e-4) so that a swapped, dropped or re-scaled term shows.  Each method is run for one step
   and for two (one call, two batches): in the first step the received adapter equals the
   training one, so MOON's positive term and FedMCP's −Sim(X, Z) have zero gradient (both are
   maximal there); the second step is where they act.  ``torch.optim.Adam`` has a weight-decay
   hyperparameter, but every FedMCP client uses 0 (§V-C "Adam", docs/decisions.md "Optimiser");
   that is asserted rather than varied.

2. **Aggregation with unequal clients.**  The paper uses one server rule for every method: the
   average of the uploaded tensors -- Algorithm 1 line 6 prints the unweighted
   θ_g^{t+1} = (1/m) Σ_i θ_g^{i,t}, §IV-E "FL Aggregation" says "the server computes a *weighted*
   average"; the code follows §IV-E, weighting by |D_i| (Flower's ``num-examples``;
   docs/decisions.md "Aggregation weights").  Tested here as *weighted*, through
   :class:`fedrepro.fl.strategy.SortedCheckpointFedAvg` directly (clients of 1, 4 and 9 examples,
   replies arriving out of order) and through a real 3-client cell (``run_cell``, in-process
   engine; FedMCP with 2, 4 and 10 training examples, FedMatch with 1, 4 and 9), against
   Σ_i n_i θ_i / Σ_i n_i computed here -- and shown to differ from the unweighted 1/m mean.
   (A FedMCP client whose last batch holds one example stops the run: eq. 6-7's CKA needs
   n ≥ 2, ``linear_cka`` raises; hence FedMCP's sizes.)

Mutants of methods.py / losses.py / task.py each of which fails tests here: eq. 8's γ and 1 − γ
swapped; Y detached in L_c; MOON's τ dropped; FedMCP sending A_p too; Z from the adapter being
trained instead of the round's received average (2-step cases only); noLc without its (1 − γ);
MOON's z_prev replaced by the received model; FedAvg (Full FT) at the adapters' lr; FedMatch's
patch not uploaded; ``num_examples`` = 1 (the unweighted mean, cell tests only).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import json
import random
from collections import OrderedDict
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from transformers import RobertaConfig, RobertaModel

import helpers
from fedrepro.papers.fedmcp.methods import METHODS, LocalHParams, build_model, local_update

ADAM = torch.optim.Adam  # the real class, before any test patches it

HP = LocalHParams(lr=3e-3, full_ft_lr=7e-4, epochs=1, gamma=0.3, mu=1.7, moon_mu=1.3,
                  moon_tau=0.7, head_epochs=1)
N_LABELS = 3
CFG = {"bottleneck": 4, "lora_r": 2, "lora_alpha": 6}  # LoRA scaling α/r = 3

# The model runs in float64; the client computes some cross-entropies from float32 logits
# (``logits.float()``), which puts ~1e-7 relative noise into its gradients.  So: gradients to
# 1e-5 of the step's largest gradient entry; parameters to 3e-6 (1/1000 of an Adam step of lr).
# Every mutant of the module docstring moves gradients by >= 1e-2 of that scale.
GRAD_RTOL = 1e-5
PARAM_TOL = {"rtol": 1e-6, "atol": 3e-6}


# -- the tiny model and its data ----------------------------------------------------------------
def tiny_backbone() -> RobertaModel:
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=40, type_vocab_size=1,
                        pad_token_id=1, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    return RobertaModel(cfg).eval()


def build(name: str):
    """The method's client model in float64, adapters / LoRA B non-zero (W_up = B = 0 at init
    would make them no-ops with zero gradients into W_down / A)."""
    torch.manual_seed(11)
    model = build_model(name, tiny_backbone(), num_labels=N_LABELS, cfg=CFG)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".adapters." in n or "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.double()


def make_batches(n: int):
    """``n`` batches of 5 examples, 7 tokens, rows 1 and 3 padded.  The first token is random,
    not ``<s>``: in a tiny random RoBERTa a fixed first token gives nearly the same first-token
    state for every row (centred Gram norm ~1e-3), where FedMCP-cls's CKA is ill-conditioned."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(n):
        ids = torch.randint(3, 100, (5, 7), generator=g)
        mask = torch.ones_like(ids)
        ids[1, 4:], mask[1, 4:] = 1, 0
        ids[3, 6:], mask[3, 6:] = 1, 0
        out.append({"input_ids": ids, "attention_mask": mask,
                    "labels": torch.tensor([0, 2, 1, 2, 0])})
    return out


def perturbed(state, seed: int, scale: float = 0.2):
    g = torch.Generator().manual_seed(seed)
    return OrderedDict((k, v + scale * torch.randn(v.shape, generator=g, dtype=v.dtype))
                       for k, v in state.items())


# -- which parameters each method trains, sends and receives (module docstring's table) -----------
_PREFIX = {"global": "net.adapters.global.", "private": "net.adapters.private.",
           "g1": "net.g1.", "g2": "net.g2."}
_BOTH = ("global", "private", "g1")
_MCP = ("global", "private", "g1", "g2")

# method: (trained parts, sent parts, parts loaded back from the server's average)
PARTS = {
    "Local": (_BOTH, (), ()),
    "FedAvg-FT": (("encoder", "head"), ("encoder",), ("encoder",)),
    "FedAvg-PEFT": (_BOTH, ("global", "private"), ("global", "private")),
    "FedLR": (("lora", "head"), ("lora",), ("lora",)),
    "FedAP": (("global", "g2"), ("global",), ("global",)),
    "MOON": (_BOTH, ("global", "private"), ("global", "private")),
    "FedRep": (_BOTH, ("global", "private"), ("global", "private")),
    "FedMatch": (_BOTH, ("global", "private"), ("global",)),  # the patch A_p: uploaded, kept
    "FedMCP": (_MCP, ("global",), ("global",)),
    "FedMCP-noLc": (_MCP, ("global",), ("global",)),
    "FedMCP-noLb": (_MCP, ("global",), ("global",)),
    "FedMCP-cos": (_MCP, ("global",), ("global",)),
    "FedMCP-cls": (_MCP, ("global",), ("global",)),
}


def in_part(param: str, part: str) -> bool:
    if part == "encoder":
        return param.startswith("encoder.")
    if part == "head":
        return param.startswith("head.")
    if part == "lora":
        return param.startswith("encoder.") and "lora_" in param
    return param.startswith(_PREFIX[part])


def names_of(model, parts) -> set[str]:
    return {n for n, _ in model.named_parameters() if any(in_part(n, p) for p in parts)}


def wire_key(param: str) -> str:
    """A parameter's name in ``shared_state()`` (adapter sets by role, encoder tensors as named)."""
    return param.removeprefix("net.adapters.")


# -- the objectives, written from the papers -------------------------------------------------------
def ce(logits, labels):
    """Cross-entropy ℓ of FedMCP eq. 3-4, the mean over the batch (in float64; the client
    computes some of its cross-entropies from float32 logits: the tolerances allow for that)."""
    return F.cross_entropy(logits, labels)


def cka(X, Y):
    """FedMCP eq. 6-7 literally: K = XXᵀ, L = YYᵀ, H = I − 11ᵀ/n, HSIC = tr(KHLH)/(n−1)²,
    CKA = HSIC(K, L) / sqrt(HSIC(K, K) · HSIC(L, L))."""
    n = X.shape[0]
    H = torch.eye(n, dtype=X.dtype) - torch.ones(n, n, dtype=X.dtype) / n
    K, L = X @ X.T, Y @ Y.T

    def hsic(A, B):
        return torch.trace(A @ H @ B @ H) / (n - 1) ** 2

    return hsic(K, L) / torch.sqrt(hsic(K, K) * hsic(L, L))


def row_cos(X, Y):
    """Cosine of paired rows, x·y / (‖x‖ ‖y‖)."""
    return (X * Y).sum(-1) / (X.norm(dim=-1) * Y.norm(dim=-1))


def mean_cos(X, Y):
    """Fig. 4's cosine alternative to CKA: the batch mean of the paired rows' cosines."""
    return row_cos(X, Y).mean()


def ce_objective(mode):
    """Plain cross-entropy of the evaluated model (Local, FedAvg (PEFT), FedAP, FedMatch, FedRep;
    FedAvg (Full FT) and FedLR through their own head)."""

    def loss(model, b, ctx):
        logits, _ = (model(b["input_ids"], b["attention_mask"]) if mode is None
                     else model(b["input_ids"], b["attention_mask"], mode=mode))
        return ce(logits, b["labels"])

    return loss


def fedmcp_objective(gamma, mu, sim, pooling):
    """FedMCP eq. 8: (1 − γ)·L_a + γ·L_b + μ·L_c with L_a = ℓ(g1, backbone + ½A_g + ½A_p) (eq. 3),
    L_b = ℓ(g2, backbone + A_g) (eq. 4), L_c = Sim(X, Y) − Sim(X, Z) (eq. 5), X / Y / Z the pooled
    last layer of backbone + local A_g / A_p / the received average θ_g^t (fixed for the round,
    no gradient)."""

    def loss(model, b, ctx):
        ids, mask, y = b["input_ids"], b["attention_mask"], b["labels"]
        logits_a, _ = model(ids, mask, mode="both")
        logits_b, _ = model(ids, mask, mode="global")
        total = (1 - gamma) * ce(logits_a, y) + gamma * ce(logits_b, y)
        if mu:
            _, X = model(ids, mask, mode="global", pooling=pooling)
            _, Y = model(ids, mask, mode="private", pooling=pooling)
            with torch.no_grad():
                _, Z = ctx["received"](ids, mask, mode="global", pooling=pooling)
            total = total + mu * (sim(X, Y) - sim(X, Z))
        return total

    return loss


def moon_objective(model, b, ctx):
    """MOON eq. 3-4: ℓ_sup + μ·ℓ_con, ℓ_con = −log(e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} +
    e^{sim(z, z_prev)/τ})), sim = cosine, averaged over the batch; z of the local model (both
    adapter sets, head g1), z_glob of the received global model, z_prev of the client's model
    after its previous round (both frozen)."""
    ids, mask, y = b["input_ids"], b["attention_mask"], b["labels"]
    logits, z = model(ids, mask, mode="both")
    with torch.no_grad():
        _, z_glob = ctx["received"](ids, mask, mode="both")
        _, z_prev = ctx["prev"](ids, mask, mode="both")
    tau = HP.moon_tau
    pos, neg = row_cos(z, z_glob) / tau, row_cos(z, z_prev) / tau
    l_con = -(torch.exp(pos) / (torch.exp(pos) + torch.exp(neg))).log().mean()
    return ce(logits, y) + HP.moon_mu * l_con


G, MU = HP.gamma, HP.mu
# method: (phases [(parts optimised by one fresh Adam, epochs)], objective, lr)
RECIPES = {
    "Local": ([(_BOTH, 1)], ce_objective("both"), HP.lr),
    "FedAvg-FT": ([(("encoder", "head"), 1)], ce_objective(None), HP.full_ft_lr),
    "FedAvg-PEFT": ([(_BOTH, 1)], ce_objective("both"), HP.lr),
    "FedLR": ([(("lora", "head"), 1)], ce_objective(None), HP.lr),
    "FedAP": ([(("global", "g2"), 1)], ce_objective("global"), HP.lr),
    "MOON": ([(_BOTH, 1)], moon_objective, HP.lr),
    # FedRep Algorithm 1: head epochs with the body frozen, then body epochs with the head frozen
    "FedRep": ([(("g1",), HP.head_epochs), (("global", "private"), HP.epochs)],
               ce_objective("both"), HP.lr),
    "FedMatch": ([(_BOTH, 1)], ce_objective("both"), HP.lr),
    "FedMCP": ([(_MCP, 1)], fedmcp_objective(G, MU, cka, "mean"), HP.lr),
    "FedMCP-noLc": ([(_MCP, 1)], fedmcp_objective(G, 0.0, cka, "mean"), HP.lr),  # μ = 0
    "FedMCP-noLb": ([(_MCP, 1)], fedmcp_objective(0.0, MU, cka, "mean"), HP.lr),  # γ = 0
    "FedMCP-cos": ([(_MCP, 1)], fedmcp_objective(G, MU, mean_cos, "mean"), HP.lr),  # Fig. 4
    "FedMCP-cls": ([(_MCP, 1)], fedmcp_objective(G, MU, cka, "cls"), HP.lr),  # Fig. 5: <s> state
}


# trainable parts with zero gradient: FedMCP-noLb's g2 (γ = 0: the head enters eq. 8 via L_b only)
IDLE = {"FedMCP-noLb": ("g2",)}


def test_the_tables_cover_every_method():
    assert set(PARTS) == set(RECIPES) == set(METHODS) and len(METHODS) == 13


# -- the real client round, its optimiser recorded -------------------------------------------------
class RecordingAdam(ADAM):
    """``torch.optim.Adam`` that keeps, at every step, the gradient of each of its parameters."""

    made: ClassVar[list[RecordingAdam]] = []

    def __init__(self, params, *args, **kwargs):
        super().__init__(params, *args, **kwargs)
        self.grads: list[dict[int, torch.Tensor | None]] = []
        RecordingAdam.made.append(self)

    def step(self, closure=None):
        self.grads.append({id(p): None if p.grad is None else p.grad.detach().clone()
                           for group in self.param_groups for p in group["params"]})
        return super().step(closure)


@pytest.fixture
def recorder(monkeypatch):
    RecordingAdam.made = []
    monkeypatch.setattr(torch.optim, "Adam", RecordingAdam)
    return RecordingAdam.made


def replay(model, name: str, batches, received: OrderedDict | None, prev: OrderedDict | None):
    """The round on a deep copy of ``model``: load the received tensors, then per phase a fresh
    ``torch.optim.Adam(lr)`` over the phase's parameters and one step per batch on the objective
    written above.  Returns (model after the round, [per phase [per step {name: grad}]])."""
    loaded = PARTS[name][2]
    phases, objective, lr = RECIPES[name]
    ref = copy.deepcopy(model)
    params = dict(ref.named_parameters())
    with torch.no_grad():
        for key, value in (received or {}).items():
            param = key if key.startswith("encoder.") else f"net.adapters.{key}"
            if any(in_part(param, p) for p in loaded):
                params[param].copy_(value)
    ctx = {"received": copy.deepcopy(ref).eval()}  # θ^t as received, frozen for the round
    if prev is not None:
        ctx["prev"] = copy.deepcopy(ref).eval()
        with torch.no_grad():
            for key, value in prev.items():
                dict(ctx["prev"].named_parameters())[f"net.adapters.{key}"].copy_(value)
    ref.train()
    grads = []
    for parts, epochs in phases:
        names = names_of(ref, parts)
        for n, p in params.items():
            p.requires_grad_(n in names)
        opt = ADAM([params[n] for n in sorted(names)], lr=lr)
        steps = []
        for _ in range(epochs):
            for b in batches:
                opt.zero_grad(set_to_none=True)
                objective(ref, b, ctx).backward()
                steps.append({n: params[n].grad.detach().clone() if params[n].grad is not None
                              else None for n in names})
                opt.step()
        grads.append(steps)
    return ref, grads


def _zeros_if_none(g, like):
    return torch.zeros_like(like) if g is None else g


@pytest.mark.parametrize("n_batches", [1, 2], ids=["1step", "2steps"])
@pytest.mark.parametrize("name", list(PARTS))
def test_one_round_is_an_adam_step_on_the_papers_objective(name, n_batches, recorder):
    """One ``local_update`` call (Algorithm 1 LocalUpdate, or the baseline's round) on one or two
    batches == Adam steps (eq. 9 with the client's Adam, §V-C) on the method's objective written
    above: FedMCP and its ablations eq. 8 with eq. 3-7 (§V-E), MOON eq. 3-4, FedRep's two phases,
    cross-entropy for the rest.  The server state is loaded first (FedMatch: A_g only, the
    averaged patch A_p is not); frozen parts stay bit for bit; the uplink is the method's set."""
    model = build(name)
    trained, sent, _ = PARTS[name]
    batches = make_batches(n_batches)
    server = perturbed(model.shared_state(), seed=3) if sent else None
    prev = perturbed(server, seed=4, scale=0.5) if name == "MOON" else None
    if name == "FedMatch":  # the averaged patch differs from the client's own: must not load
        assert any(k.startswith("private.") for k in server)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seed = 1234  # FedAvg (Full FT) trains with dropout: both rounds draw the same masks
    torch.manual_seed(seed)
    ref, ref_grads = replay(model, name, batches, server, prev)
    torch.manual_seed(seed)
    stats = local_update(model, name, batches, HP, server_state=server, prev_shared_state=prev)

    phases, _, lr = RECIPES[name]
    params = dict(model.named_parameters())
    by_id = {id(p): n for n, p in params.items()}
    # the optimisers: one fresh Adam per phase, over exactly the phase's parameters
    assert [type(o) for o in recorder] == [RecordingAdam] * len(phases)
    fresh = ADAM([torch.zeros(1, requires_grad=True)], lr=lr).defaults
    for opt, (parts, epochs) in zip(recorder, phases):
        got = {by_id[id(p)] for g in opt.param_groups for p in g["params"]}
        assert got == names_of(model, parts)
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
            assert opt.defaults[key] == fresh[key], key
        assert opt.defaults["weight_decay"] == 0.0 and opt.defaults["lr"] == lr
        assert len(opt.grads) == epochs * n_batches
    assert stats["lr"] == lr and stats["n_steps"] == sum(e for _, e in phases) * n_batches

    # the gradient each step saw is that of the objective written above
    for opt, ref_steps in zip(recorder, ref_grads):
        for step, (got, want) in enumerate(zip(opt.grads, ref_steps)):
            scale = max(float(w.abs().max()) for w in want.values() if w is not None)
            assert scale > 0
            for pid, g in got.items():
                n = by_id[pid]
                torch.testing.assert_close(
                    _zeros_if_none(g, params[n]), _zeros_if_none(want[n], params[n]),
                    rtol=GRAD_RTOL, atol=GRAD_RTOL * scale,
                    msg=lambda m, n=n, step=step: f"{name} step {step} grad {n}: {m}")

    # trained parameters: as the replay; everything else: untouched, bit for bit
    trainable = names_of(model, trained)
    assert {n for n, p in params.items() if p.requires_grad} == trainable  # FedRep restores flags
    ref_params = dict(ref.named_parameters())
    moved = set()
    for n, p in params.items():
        if n in trainable:
            torch.testing.assert_close(p.detach(), ref_params[n].detach(), **PARAM_TOL,
                                       msg=lambda m, n=n: f"{name} parameter {n}: {m}")
            if not torch.equal(p.detach(), before[n]):
                moved.add(n)
        else:
            assert torch.equal(p.detach(), before[n]), f"{name}: frozen {n} changed"
    for part in trained:  # every trained part moved (FedAvg (Full FT)'s pooler gets no gradient)
        if part in IDLE.get(name, ()):
            assert not moved & names_of(model, (part,)), (name, part)
        else:
            assert moved & names_of(model, (part,)), (name, part)

    # what the client sends: exactly the shared set, holding the trained values
    sent_state = model.shared_state()
    expected = {wire_key(n): n for n in names_of(model, sent)}
    assert set(sent_state) == set(expected)
    for key, n in expected.items():
        assert torch.equal(sent_state[key], params[n].detach()), key
    assert not names_of(model, ("g1", "g2", "head")) & set(expected.values())  # heads stay (§V-C)
    if sent == ("global",):
        assert not any(k.startswith("private.") for k in sent_state)  # A_p never leaves


# -- 2. the server's average over clients of unequal size ------------------------------------------
def weighted_mean(states, sizes) -> OrderedDict:
    """§IV-E "FL Aggregation": θ^{t+1} = Σ_i n_i θ^{i,t} / Σ_i n_i (float64)."""
    total = float(sum(sizes))
    return OrderedDict((k, sum(s[k].double() * (n / total) for s, n in zip(states, sizes)))
                       for k in states[0])


def uniform_mean(states) -> OrderedDict:
    """Algorithm 1 line 6 as printed: θ^{t+1} = (1/m) Σ_i θ^{i,t} (float64) -- not what runs."""
    return OrderedDict((k, sum(s[k].double() for s in states) / len(states)) for k in states[0])


@pytest.mark.parametrize("name", ["FedMCP", "FedMatch"])
def test_server_rule_is_the_example_weighted_mean_for_clients_of_1_4_9(name, tmp_path):
    """FedMCP cells run the base strategy (no ``fedmcp`` entry in ``fl.tasks.PAPERS`` has a
    strategy) with ``run_server``'s ``weighted_by_key="num-examples"``: three clients of 1, 4 and
    9 examples, replies arriving out of order, give Σ n_i θ_i / 14 -- the §IV-E weighted average,
    not Algorithm 1 line 6's 1/m.  FedMatch: its uploaded patch A_p is averaged the same way."""
    from fedrepro.fl.strategy import SortedCheckpointFedAvg
    from fedrepro.fl.tasks import strategy_factory

    assert strategy_factory({"paper": "fedmcp", "method": name}) is None
    sizes = (1, 4, 9)
    base = OrderedDict((k, v.float()) for k, v in build(name).shared_state().items())
    assert {k.split(".", 1)[0] for k in base} == set(PARTS[name][1])
    states = [perturbed(base, seed=20 + i, scale=1.0) for i in range(3)]
    strategy = SortedCheckpointFedAvg(
        out_dir=tmp_path, round_offset=0, expected_clients=3, seed=1, fraction_train=1.0,
        fraction_evaluate=0.0, min_train_nodes=3, min_evaluate_nodes=0, min_available_nodes=3,
        weighted_by_key="num-examples")  # as fedrepro.fl.server_app.run_server builds it
    strategy._n_sampled = 3
    arrays, _ = strategy.aggregate_train(1, [helpers.TrainReply(i, sizes[i], states[i], {"train-loss": 0.7}) for i in (2, 0, 1)])
    got = arrays.to_torch_state_dict()
    want, flat = weighted_mean(states, sizes), uniform_mean(states)
    assert list(got) == list(base)
    for k in base:
        torch.testing.assert_close(got[k].double(), want[k], rtol=1e-6, atol=1e-6)
        assert (got[k].double() - flat[k]).abs().max() > 1e-2  # not the unweighted mean
    from fedrepro.fl.checkpoint import checkpoint_paths, load_state

    saved = load_state(checkpoint_paths(tmp_path, 1)[0])
    assert all(torch.equal(saved[k], got[k]) for k in got)


# a 3-client cell through the real runner (in-process engine), clients of unequal size
TASKS = ("MRPC", "SST-2", "MNLI")
WORDS = ("good", "bad", "film", "great", "movie", "plot", "actor", "boring", "fun", "long",
         "short", "story", "cast", "music")


def _records(task: str, split: str, n: int) -> list[dict]:
    rng = random.Random(f"{task}/{split}")
    out = []
    for i in range(n):
        a = " ".join(rng.choice(WORDS) for _ in range(6))
        b = " ".join(rng.choice(WORDS) for _ in range(4))
        label = min(int("good" in a) + (int("bad" in a) if task == "MNLI" else 0),
                    2 if task == "MNLI" else 1)
        out.append({"id": f"{task}-{split}-{i}", "task": task, "source": "glue", "split": split,
                    "text_a": a, "text_b": None if task == "SST-2" else b, "label": label})
    return out


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory) -> Path:
    from fedrepro.models.backbones import prepare_backbone

    root = tmp_path_factory.mktemp("fedmcp-step")
    prepare_backbone(
        {"name": "roberta-base", "kind": "tiny",
         "tiny": {"vocab_size": 200, "d_model": 32, "encoder_layers": 2, "heads": 2,
                  "ffn_dim": 64, "max_source_length": 32, "warmup_steps": 0}},
        [r["text_a"] for t in TASKS for r in _records(t, "train", 10)], root / "backbone")
    return root / "backbone"


@pytest.mark.parametrize("name,sizes", [("FedMCP", (2, 4, 10)), ("FedMatch", (1, 4, 9))])
def test_a_cell_averages_its_unequal_clients_by_their_training_examples(
        name, sizes, backbone_dir, tmp_path, wire):
    """One round of a real cell (``run_cell``, in-process engine) whose clients hold unequal
    training sets: each reply carries ``num-examples`` = |D_i| (the client's train split) and
    exactly the tensors the client saved as ``sent.*`` (``cpu_state(model.shared_state())``);
    the server's checkpoint is Σ_i |D_i| θ_i / Σ_i |D_i| of those replies (§IV-E).
    FedMCP's sizes avoid a batch of one example (batch size 4): eq. 6-7's CKA needs n ≥ 2."""
    from fedrepro.fl.cell import run_cell
    from fedrepro.fl.checkpoint import checkpoint_paths, load_state
    from fedrepro.io import write_jsonl_atomic

    folders = {}
    for task, n in zip(TASKS, sizes):
        for split, k in (("train", n), ("val", 2), ("test", 3)):
            write_jsonl_atomic(tmp_path / "data" / task / f"{split}.jsonl",
                               _records(task, split, k))
        folders[task] = str(tmp_path / "data" / task)
    out = tmp_path / "cell"
    cell = {
        "paper": "fedmcp", "scale": "demo", "backbone": "roberta-base",
        "backbone_dir": str(backbone_dir), "method": name, "seed": 1,
        "clients": list(TASKS), "eval_clients": list(TASKS), "client_data": folders,
        "max_length": 32, "model": {"bottleneck": 4},
        "train": {"rounds": 1, "epochs": 1, "lr": 0.03, "batch_size": 4, "gamma": 0.3, "mu": 1.7},
        "threads": 1, "eval_batch_size": 8, "eval_every_round": False, "engine": "inprocess",
        "round_timeout_s": 300, "out_dir": str(out), "keep_round_checkpoints": True,
    }
    run_cell(cell, out / "adapters.safetensors", out / "train_log.json", out / "provenance.json")

    replies = {pid: content for kind, pid, content in wire.replies if kind == "train"}
    assert sorted(replies) == [0, 1, 2]
    states, ns = [], []
    for pid, task in enumerate(TASKS):
        ns.append(int(replies[pid]["metrics"]["num-examples"]))
        state = replies[pid]["arrays"].to_torch_state_dict()
        assert {k.split(".", 1)[0] for k in state} == set(PARTS[name][1])  # the method's set
        saved = load_state(out / "clients" / task / "round_001.safetensors")
        sent = {k[len("sent."):]: v for k, v in saved.items() if k.startswith("sent.")}
        assert set(sent) == set(state) and all(torch.equal(sent[k], state[k]) for k in state)
        states.append(state)
    assert tuple(ns) == sizes
    server = load_state(checkpoint_paths(out, 1)[0])
    want, flat = weighted_mean(states, ns), uniform_mean(states)
    assert set(server) == set(want)
    gap = max(float((want[k] - flat[k]).abs().max()) for k in want)
    assert gap > 1e-4  # the clients moved apart enough to tell the two rules apart
    for k in want:
        torch.testing.assert_close(server[k].double(), want[k], rtol=1e-6, atol=1e-7)
    log = json.loads((out / "train_log.json").read_text())["rounds"][0]
    assert [c["num_examples"] for c in log["clients"]] == list(sizes)
