"""One local step of every AdaFedSelecKD method against its loss written out from the paper, what
a client sends, and the server rules with unequal clients.

Paper: Feng et al., "Adapter-based Selective Knowledge Distillation for Federated Multi-domain
Meeting Summarization" (IEEE/ACM TASLP; /work/shared/papers/adafedseleckd.md).

1. **Client step** (Algorithm 1, lines 11-27): on a tiny BART with adapters, one call of
   :func:`~fedrepro.papers.adafedseleckd.methods.local_update` (one epoch, one batch, the method's
   own AdamW from ``make_optimizer``) changes the local adapter exactly as one fresh
   ``torch.optim.AdamW`` step on the method's total loss, written here with
   ``torch.nn.functional`` from the model's logits (never the project's ``kd.py``):

   * eq. 6 (AdaFedKD): ``L = (1 − λ)·CE(q_l, y) + λ·KL(q_g ‖ q_l)`` on every target token;
   * eq. 8 (AdaFedSelectKD): eq. 6 where the teacher's entropy (eq. 7) ``H(q_g) < τ`` (strict),
     plain CE elsewhere;
   * Fig. 12 (AdaFedHardKD): eq. 6 only on the tokens of noun/verb target words (τ = ∞);
   * Table V: AdaFedProx adds FedProx's ``μ/2‖w − w^r‖²``; AdaFedOPT / AdaFedNova / AdaFedAvg /
     AdaSingle / AdaCentralized train on CE alone.

   λ weighs the KD term (eq. 6, §IV-D: "the loss weight λ"); the KL's order is the teacher as the
   target, ``Σ q_g (log q_g − log q_l)``, with no temperature, and the loss is the mean over the
   batch's non-padding target tokens (docs/decisions.md, "KL direction", "Temperature").
   Hyperparameters are asymmetric on purpose: λ = 0.3, μ = 0.4, weight decay 0.05, and τ splits the
   batch's tokens (some distilled, some not), set *at* one token's entropy so that ``<`` and ``<=``
   differ.  The gradient left on the parameters is compared too (AdamW's first step is nearly
   ``lr·sign(g)``, blind to most changes of the gradient's size), as are the loss, the KD token
   count and the per-token KD trace.  Frozen tensors (the backbone, the teacher/global adapter)
   must not change by a bit.
2. **What the client sends** (Fig. 3: "the updated parameters are then transmitted to the
   server"): the real ClientApp (``fedrepro.fl.client_app.train`` -> ``task.client_train_round``)
   replies with exactly the trained local adapter, under the names the server broadcast; the KD
   methods' global adapter holds the received W^r and is not sent.
3. **Server rules with unequal clients** (Algorithm 1 lines 6-8 / eq. 2; Table V): three clients
   with 1, 3 and 7 examples (and 1, 2, 4 local steps) through the real strategy objects, against
   results computed by hand: FedAvg's n_i/n average (AdaFedAvg, the KD methods, AdaFedProx),
   FedNova's normalised average, FedOpt's (FedAdam) step on the average's pseudo-gradient.
   tests/test_ada_methods.py covers two clients (3 and 1 examples); this adds a third, shuffled
   replies and the FedAvg base strategy.
"""

from __future__ import annotations

import copy
import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from transformers import BartConfig, BartForConditionalGeneration

from fedrepro.data.seq2seq import derive_seed, iterate_batches
from fedrepro.fl.strategy import SortedCheckpointFedAvg
from fedrepro.papers.adafedseleckd import task
from fedrepro.papers.adafedseleckd.methods import METHODS, TrainHParams, local_update, make_optimizer
from fedrepro.papers.adafedseleckd.model import AdapterSummarizer
from fedrepro.papers.adafedseleckd.strategy import (
    AdaFedNovaStrategy,
    AdaFedOptStrategy,
    AdaFedProxStrategy,
    make_strategy,
)

V = 24  # vocabulary of the tiny backbone
PAD, BOS, EOS, START = 1, 0, 2, 2
SEED, ROUND = 7, 3
LAM, MU, LR, WD = 0.3, 0.4, 0.01, 0.05
ATOL = 1e-6


# =============================================================================================
# the tiny model and the batch
# =============================================================================================
def _model(roles: tuple[str, ...]) -> AdapterSummarizer:
    """A ~11k-parameter BART (frozen) with one adapter per role on its top decoder layer (312
    trainable parameters).  The backbone's init_std is raised so that the teacher's entropies spread
    (0.4 … 2.4 nats on this batch, ln 24 ≈ 3.18 at most); the global and local adapters get
    different random values -- a later round, where the persistent local adapter (student) and the
    received global adapter (teacher) differ."""
    cfg = BartConfig(vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=2,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                     decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=PAD,
                     bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=START, init_std=0.3)
    torch.manual_seed(0)
    model = AdapterSummarizer(BartForConditionalGeneration(cfg), adapter_top_k=1, bottleneck=8,
                              roles=roles)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for role, scale in (("global", 1.5), ("local", 0.5)):
            if role in model.stacks:
                for p in model.stacks[role].parameters():
                    p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def _examples(hard_kd: bool = False) -> list[dict]:
    """Four examples of different source and target lengths (padding on both sides); with
    ``hard_kd`` each carries the noun/verb mask of its label tokens (Fig. 12)."""
    out = []
    for i in range(4):
        labels = [3 + (7 * i + 3 * j) % 20 for j in range(3 + 2 * i)] + [EOS]
        e = {"id": f"ex{i}", "input_ids": [BOS] + [3 + (5 * i + j) % 20 for j in range(4 + i)] + [EOS],
             "labels": labels}
        if hard_kd:
            e["kd_allowed"] = [(i + j) % 3 == 0 for j in range(len(labels))]
        out.append(e)
    return out


def _the_batch(examples: list[dict], client: str, batch_size: int) -> dict:
    """The one batch local_update draws (its seeded permutation of the examples)."""
    batches = list(iterate_batches(examples, batch_size, PAD, START, derive_seed(SEED, client, ROUND, 0)))
    assert len(batches) == 1
    return batches[0]


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """Eq. 7 in nats: H(q) = −Σ q log q over the vocabulary."""
    log_q = F.log_softmax(logits.float(), dim=-1)
    return -(log_q.exp() * log_q).sum(-1)


def _tau_splitting(model: AdapterSummarizer, batch: dict) -> tuple[float, int]:
    """τ equal to the entropy of the batch's middle token (in H(q_g) order): eq. 8's strict
    ``H(q_g) < τ`` distils the tokens below it, not that one.  Returns (τ, tokens below τ)."""
    with torch.no_grad():
        _, teacher = copy.deepcopy(model).path_logits(
            batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"],
            student="local", teacher="global")
    ent = _entropy(teacher)[batch["labels"] != -100].sort().values
    k = len(ent) // 2
    assert ent[k - 1] < ent[k] < ent[k + 1]  # distinct neighbours: exactly k tokens below τ
    return float(ent[k]), k


def _hp(tau: float) -> TrainHParams:
    return TrainHParams(lr=LR, weight_decay=WD, batch_size=8, local_epochs=1, lam=LAM, tau=tau,
                        prox_mu=MU)


# =============================================================================================
# the paper's losses, written out
# =============================================================================================
def paper_loss(model: AdapterSummarizer, method: str, batch: dict, hp: TrainHParams,
               proximal_to: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The method's total client loss on ``batch`` (eq. 6 / eq. 8 / Fig. 12 / FedProx), from the
    model's logits with torch.nn.functional; returns (loss, KD mask over target tokens)."""
    spec = METHODS[method]
    student, teacher = model.path_logits(
        batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"],
        student="local", teacher="global" if spec.distill else None)
    labels = batch["labels"]
    valid = labels != -100
    # CE(q_l, y_t) per token (0 on padding)
    ce = F.cross_entropy(student.float().reshape(-1, V), labels.reshape(-1), ignore_index=-100,
                         reduction="none").reshape(labels.shape)
    if spec.distill:
        log_q_l = F.log_softmax(student.float(), dim=-1)
        log_q_g = F.log_softmax(teacher.float(), dim=-1).detach()
        # KL(q_g ‖ q_l) = Σ_v q_g (log q_g − log q_l): kl_div(input = log q_l, target = log q_g)
        kl = F.kl_div(log_q_l, log_q_g, log_target=True, reduction="none").sum(-1)
        if spec.selective:  # eq. 8: distil only where the teacher is confident, H(q_g) < τ
            gate = valid & (_entropy(teacher) < hp.tau)
        else:  # eq. 6 on every token (AdaFedKD) or on the noun/verb tokens (AdaFedHardKD)
            gate = valid.clone()
        if spec.hard_kd:
            gate &= batch["kd_allowed"]
        per_token = torch.where(gate, (1 - hp.lam) * ce + hp.lam * kl, ce)
    else:
        gate = torch.zeros_like(valid)
        per_token = ce
    loss = per_token[valid].mean()
    if spec.proximal:  # FedProx: μ/2 ‖w − w^r‖² over the local adapter
        sq = sum(((p - proximal_to[n]) ** 2).sum() for n, p in model.stacks["local"].named_parameters())
        loss = loss + hp.prox_mu / 2 * sq
    return loss, gate


def reference_step(model: AdapterSummarizer, method: str, batch: dict, hp: TrainHParams,
                   proximal_to: dict | None = None):
    """One fresh AdamW step (same lr, weight decay, PyTorch's default β, ε) on ``paper_loss``, on a
    deep copy of ``model``; returns (the copy, loss, KD mask)."""
    ref = copy.deepcopy(model)
    ref.train()
    loss, gate = paper_loss(ref, method, batch, hp, proximal_to)
    opt = torch.optim.AdamW(ref.stacks["local"].parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return ref, loss.detach(), gate


def _frozen(model: AdapterSummarizer) -> dict[str, torch.Tensor]:
    """Every tensor but the local adapter's: the backbone and, in the KD methods, the teacher."""
    out = {n: t.detach().clone() for n, t in model.named_parameters() if not n.startswith("stacks.local.")}
    out.update({f"buffer:{n}": b.clone() for n, b in model.named_buffers()})
    return out


# =============================================================================================
# 1. one step of each method
# =============================================================================================
CLIENTS = {"AdaCentralized": "Academic+Committee+Product"}  # the pooled run's name (task.run_local)


@pytest.mark.parametrize("method", list(METHODS))
def test_one_local_step_is_adamw_on_the_papers_loss(method):
    """local_update with the method's optimizer = one AdamW step on eq. 6 / eq. 8 / Fig. 12 /
    CE (+ FedProx's term): parameters, gradients, loss, KD tokens; frozen tensors unchanged."""
    spec = METHODS[method]
    client = CLIENTS.get(method, "Academic")
    model = _model(spec.roles)
    examples = _examples(hard_kd=spec.hard_kd)
    batch = _the_batch(examples, client, batch_size=8)
    tau, n_below = _tau_splitting(_model(("global", "local")), batch)
    hp = _hp(tau)
    n_tokens = int((batch["labels"] != -100).sum())
    proximal_to = None
    if spec.proximal:  # w^r ≠ w (a step after the first of the round), else the term's gradient is 0
        g = torch.Generator().manual_seed(5)
        proximal_to = {n: p.detach() + 0.3 * torch.randn(p.shape, generator=g)
                       for n, p in model.stacks["local"].named_parameters()}
    before = copy.deepcopy(model)
    frozen = _frozen(model)
    trained_names = [n for n, _ in model.stacks["local"].named_parameters()]
    assert [id(p) for p in make_optimizer(model, hp).param_groups[0]["params"]] == [
        id(p) for p in model.stacks["local"].parameters()]  # the optimiser holds the local adapter only

    trace: dict = {}
    stats = local_update(model, spec, examples, hp, make_optimizer(model, hp), SEED, client, ROUND,
                         PAD, START, proximal_to=proximal_to, trace=trace)
    ref, ref_loss, gate = reference_step(before, method, batch, hp, proximal_to)

    assert stats["n_batches"] == 1 and stats["n_tokens"] == n_tokens
    got, want = dict(model.stacks["local"].named_parameters()), dict(ref.stacks["local"].named_parameters())
    for n in trained_names:
        torch.testing.assert_close(got[n].grad, want[n].grad, rtol=1e-5, atol=1e-7, msg=f"grad {n}")
        torch.testing.assert_close(got[n].detach(), want[n].detach(), rtol=0, atol=ATOL, msg=n)
    assert any(not torch.equal(got[n], before.stacks["local"].state_dict()[n]) for n in trained_names)
    assert stats["train_loss"] == pytest.approx(float(ref_loss), rel=1e-5)
    # which tokens were distilled
    n_kd = int(gate.sum())
    assert stats["n_kd_tokens"] == n_kd
    bits = {ex_id: [bool(b) for b in gate[i][batch["labels"][i] != -100].tolist()]
            for i, ex_id in enumerate(batch["ids"])}
    assert trace == {k: [v] for k, v in bits.items()}
    if spec.selective:
        assert n_kd == n_below and 0 < n_kd < n_tokens
    elif spec.hard_kd:
        allowed = int((batch["kd_allowed"] & (batch["labels"] != -100)).sum())
        assert n_kd == allowed and 0 < n_kd < n_tokens
    elif spec.distill:  # AdaFedKD: τ = ∞ whatever hp.tau says
        assert n_kd == n_tokens
    else:
        assert n_kd == 0
    # frozen: backbone (and the teacher) bit for bit
    after = _frozen(model)
    assert after.keys() == frozen.keys()
    for n, t in frozen.items():
        assert torch.equal(after[n], t), f"{method}: frozen tensor {n} changed"
    if spec.distill:
        assert any(k.startswith("stacks.global.") for k in frozen)
        assert all(p.grad is None for p in model.stacks["global"].parameters())


def test_the_step_tests_see_the_kd_terms():
    """Sanity of the fixtures: on this batch eq. 8's step differs from eq. 6's, eq. 6's from CE's,
    and FedProx's from CE's -- so each term of the losses above is actually exercised."""
    examples = _examples()
    batch = _the_batch(examples, "Academic", 8)
    tau, _ = _tau_splitting(_model(("global", "local")), batch)
    hp = _hp(tau)
    kd_model = _model(("global", "local"))
    states = {}
    for method in ("AdaFedKD", "AdaFedSelectKD", "AdaFedAvg"):
        ref, _, _ = reference_step(kd_model, method, batch, hp)
        states[method] = ref.stacks["local"].state_dict()
    w_r = {n: p.detach() + 0.3 for n, p in kd_model.stacks["local"].named_parameters()}
    ref, _, _ = reference_step(kd_model, "AdaFedProx", batch, hp, w_r)
    states["AdaFedProx"] = ref.stacks["local"].state_dict()
    for a, b in (("AdaFedKD", "AdaFedSelectKD"), ("AdaFedKD", "AdaFedAvg"),
                 ("AdaFedSelectKD", "AdaFedAvg"), ("AdaFedProx", "AdaFedAvg")):
        diff = max(float((states[a][k] - states[b][k]).abs().max()) for k in states[a])
        assert diff > 100 * ATOL, (a, b, diff)


# =============================================================================================
# 2. what the client sends
# =============================================================================================


FEDERATED = [m for m, s in METHODS.items() if s.federated]


@pytest.mark.parametrize("method", FEDERATED)
def test_the_client_sends_its_trained_local_adapter(method, task_identity, monkeypatch, tmp_path):
    """The ClientApp's reply holds exactly the local adapter after its training (Fig. 3), under
    the broadcast's names; it equals one AdamW step on the paper's loss from the received W^r
    (round 1: local and, in the KD methods, global adapter both start from W^r); the KD methods'
    global adapter holds W^r (teacher) and is not what is sent."""
    from fedrepro.fl import client_app

    spec = METHODS[method]
    model = _model(spec.roles)
    g = torch.Generator().manual_seed(9)
    received = OrderedDict((k, v + 0.2 * torch.randn(v.shape, generator=g))
                           for k, v in model.adapter_state("local").items())  # W^r ≠ the model's own
    examples = tuple(_examples())
    masks = {e["id"]: tuple((i + j) % 3 == 0 for j in range(len(e["labels"])))
             for i, e in enumerate(examples)}
    monkeypatch.setattr(task, "get_model", lambda cell: (None, model))
    monkeypatch.setattr(task, "client_examples", lambda cell, client, split: examples)
    monkeypatch.setattr(task, "_hard_kd_masks", lambda *a: masks)
    clients = ["Academic", "Committee", "Product"]
    cell = {"paper": "adafedseleckd", "method": method, "seed": SEED, "clients": clients,
            "client_data": {c: str(tmp_path / c) for c in clients}, "out_dir": str(tmp_path / "cell"),
            "threads": 1, "round_timeout_s": 120, "max_target_length": 24, "pos_tags": {"Committee": "tags.jsonl"},
            "train": {"lr": LR, "weight_decay": WD, "batch_size": 8, "local_epochs": 1, "lam": LAM,
                      "tau": 1.5, "prox_mu": MU}}
    msg = Message(RecordDict({"arrays": ArrayRecord(received),
                              "config": ConfigRecord({"cell": json.dumps(cell), "server-round": 1,
                                                      "round-offset": 0})}),
                  message_type=MessageType.TRAIN, dst_node_id=12)
    ctx = Context(run_id=1, node_id=12, node_config={"partition-id": 1}, state=RecordDict(), run_config={})
    before = copy.deepcopy(model)
    before.load_adapter_state("local", received)
    if spec.distill:
        before.load_adapter_state("global", received)

    reply = client_app.train(msg, ctx)

    assert set(reply.content.keys()) == {"arrays", "metrics"}
    sent = reply.content["arrays"].to_torch_state_dict()
    local = model.adapter_state("local")
    assert list(sent) == list(received) == list(local)  # the broadcast's names, in its order
    for k in sent:
        assert torch.equal(sent[k], local[k]), k
    assert any(not torch.equal(sent[k], received[k]) for k in sent)  # it trained
    if spec.distill:  # the teacher is W^r, frozen, and not what is sent
        glob = model.adapter_state("global")
        assert all(torch.equal(glob[k], received[k]) for k in received)
    metrics = reply.content["metrics"]
    assert int(metrics["partition-id"]) == 1 and int(metrics["num-examples"]) == len(examples)
    assert int(metrics["n-batches"]) == 1
    # the sent adapter is one AdamW step of the method's loss from W^r (FedProx: w = w^r, its term 0)
    batch_examples = [dict(e, kd_allowed=list(masks[e["id"]])) for e in examples] if spec.hard_kd else list(examples)
    batch = list(iterate_batches(batch_examples, 8, PAD, START, derive_seed(SEED, "Committee", 1, 0)))[0]
    hp = TrainHParams.from_config(cell["train"])
    ref, _, _ = reference_step(before, method, batch, hp, received if spec.proximal else None)
    want = ref.adapter_state("local")
    for k in sent:
        torch.testing.assert_close(sent[k], want[k], rtol=0, atol=ATOL, msg=k)


def test_non_federated_methods_send_nothing():
    """AdaSingle / AdaCentralized (§IV-B) have no server: no shared role, trained by run_local."""
    for method in ("AdaSingle", "AdaCentralized"):
        spec = METHODS[method]
        assert spec.server_role is None and not spec.federated and spec.roles == ("local",)
        assert not task.is_federated({"method": method})
    for method in FEDERATED:
        spec = METHODS[method]
        assert spec.server_role == ("global" if spec.distill else "local"), method


# =============================================================================================
# 3. server rules with unequal clients
# =============================================================================================
N_EXAMPLES = (1, 3, 7)  # |D_i|; |D| = 11
N_STEPS = (1, 2, 4)  # local optimiser steps (batch size 2)
X0 = {"w": [1.0, -2.0], "b": [0.5]}  # W^r, the round's broadcast
CLIENT_W = [{"w": [11.0, 0.0], "b": [2.0]},
            {"w": [0.0, 11.0], "b": [-1.0]},
            {"w": [1.0, 2.0], "b": [1.0]}]
# Algorithm 1 line 8: W^{r+1} = Σ |D_i|/|D| W_i = (1·y1 + 3·y2 + 7·y3)/11
FEDAVG = {"w": [(11 + 0 + 7) / 11, (0 + 33 + 14) / 11], "b": [(2 - 3 + 7) / 11]}  # 18/11, 47/11, 6/11
# FedNova: τ_eff = Σ p_i τ_i = (1·1 + 3·2 + 7·4)/11 = 35/11; d = Σ p_i (x − y_i)/τ_i
#   w[0]: ((1−11)/1 + 3(1−0)/2 + 7(1−1)/4)/11 = −8.5/11  -> 1 + 35·8.5/121 = 418.5/121
#   w[1]: ((−2−0)/1 + 3(−2−11)/2 + 7(−2−2)/4)/11 = −28.5/11 -> −2 + 35·28.5/121 = 755.5/121
#   b:    ((0.5−2)/1 + 3(0.5+1)/2 + 7(0.5−1)/4)/11 = −0.125/11 -> 0.5 + 35·0.125/121 = 64.875/121
FEDNOVA = {"w": [418.5 / 121, 755.5 / 121], "b": [64.875 / 121]}
OPT = {"name": "adam", "eta": 0.05, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3}


def _fedadam_first_step() -> dict:
    """Reddi et al. 2021 Alg. 2 (FedAdam), round 1, as Flower writes it: Δ = FedAvg − x,
    m = (1 − β₁)Δ, v = (1 − β₂)Δ², x + η·√(1 − β₂²)/(1 − β₁²) · m/(√v + τ)."""
    eta, b1, b2, tau = OPT["eta"], OPT["beta_1"], OPT["beta_2"], OPT["tau"]
    out = {}
    for k in X0:
        x, avg = np.asarray(X0[k]), np.asarray(FEDAVG[k])
        delta = avg - x  # w: 7/11, 69/11; b: 0.5/11
        m, v = (1 - b1) * delta, (1 - b2) * delta ** 2
        out[k] = list(x + eta * math.sqrt(1 - b2 ** 2) / (1 - b1 ** 2) * m / (np.sqrt(v) + tau))
    return out


def _arrays(d: dict) -> ArrayRecord:
    return ArrayRecord(OrderedDict((k, Array(np.asarray(v, dtype=np.float32))) for k, v in d.items()))


@pytest.mark.parametrize("method,cls,expected", [
    pytest.param("AdaFedAvg", SortedCheckpointFedAvg, FEDAVG, id="fedavg-AdaFedAvg"),
    pytest.param("AdaFedSelectKD", SortedCheckpointFedAvg, FEDAVG, id="fedavg-AdaFedSelectKD"),
    pytest.param("AdaFedProx", AdaFedProxStrategy, FEDAVG, id="fedprox-AdaFedProx"),
    pytest.param("AdaFedNova", AdaFedNovaStrategy, FEDNOVA, id="fednova-AdaFedNova"),
    pytest.param("AdaFedOPT", AdaFedOptStrategy, None, id="fedadam-AdaFedOPT"),
])
def test_server_rule_with_three_unequal_clients(method, cls, expected, task_identity, tmp_path):
    """One round of the method's real strategy (make_strategy) with |D_i| = 1, 3, 7 and τ_i = 1, 2,
    4, replies arriving out of order, against the hand-computed weighted results."""
    expected = expected or _fedadam_first_step()
    cell = {"method": method, "train": {"lr": LR, "prox_mu": MU}, "server_optimizer": OPT}
    s = make_strategy(cell, out_dir=tmp_path, round_offset=0, expected_clients=3, fraction_train=1.0,
                      min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0,
                      min_evaluate_nodes=0, weighted_by_key="num-examples")
    assert type(s) is cls
    s._node_of = {0: 11, 1: 12, 2: 13}  # partition id -> node id (skips the partition query)
    instructions = sorted(s.configure_train(1, _arrays(X0), ConfigRecord({}), None),
                          key=lambda m: m.metadata.dst_node_id)
    assert len(instructions) == 3
    if method == "AdaFedProx":
        assert all(m.content["config"]["proximal-mu"] == pytest.approx(MU) for m in instructions)
    replies = [
        Message(RecordDict({"arrays": _arrays(CLIENT_W[pid]),
                            "metrics": MetricRecord({"partition-id": pid, "num-examples": N_EXAMPLES[pid],
                                                     "n-batches": N_STEPS[pid], "train-loss": 0.5})}),
                reply_to=instructions[pid])
        for pid in (2, 0, 1)  # out of order: the weights must follow the partitions
    ]
    arrays, _ = s.aggregate_train(1, replies)
    got = arrays.to_torch_state_dict()
    assert list(got) == list(X0)
    for k in X0:
        assert got[k].dtype == torch.float32
        np.testing.assert_allclose(got[k].numpy(), np.asarray(expected[k]), rtol=1e-6, atol=1e-6,
                                   err_msg=f"{method} {k}")
    # the unweighted mean (4, 13/3, 2/3) is not what any rule gives
    assert not np.allclose(got["w"].numpy(), [4.0, 13 / 3], atol=1e-3)
