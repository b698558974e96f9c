"""Step tests of every method a FedSum cell runs (``fedrepro.papers.fedsum``), against the papers'
equations written out here with torch -- never with the project's loss functions.

Paper: *Data-Efficient Federated Learning under Data Scarcity Scenario for Text Summarization*
(``shared/papers/fedsum.md``).  Equations used below:

* L_data = Σ_b Σ_c ℓ(φ̂_bc, φ_bc) / B, ℓ = binary cross entropy (Alg. 2 line 7, §4.2);
* Data skip (§4.2, Alg. 2 lines 6–9): a *normal* batch (Alg. 3 line 9: Q < Q̄ and ε < ε̄) is skipped
  (L_data = 0) iff ρ̂ ≤ ρ_(i,j) = (t/T)·(e/E)·(j/τ_i), ρ̂ ~ U(0,1);
* L_pm = ζ_p · Σ_b Σ_c ℓ(h(ω̃_p, H_j), LD)[b][c] / B per received head, accumulated over PK_i
  (eq. 7, Alg. 2 lines 13–16); θ trains on L_data + L_pm, ω on L_data only (§4, Alg. 2 l. 19–20);
* L_po = Σ_ξ ‖P̄_c^ξ − P_(i,c)^ξ‖₂ − ‖P_(i,p)^1 − P_(i,p)^0‖₂ (eq. 3–5), one SGD step of θ after
  the local epochs (Alg. 2 lines 22–24); SP_i = Concat(P_(i,c)^0, P_(i,c)^1) (eq. 6);
* server: Ω_g, ε̄, Q̄ (eq. 2) and P̄_c weighted by n_i/n (Alg. 1 lines 14–15), PDT[i][p] =
  tanh(‖SP_i − SP_p‖₂) (Alg. 1 line 10), ω̃_i = Dropout(ω_i, γ) (Alg. 1 line 11);
* baselines (§5.1): FedProx (Li et al. 2020) L_data + μ/2‖w − w^r‖²; SCAFFOLD (Karimireddy et
  al. 2020, Alg. 1 option II) y ← y − η(g + c − c_i), c_i⁺ = c_i − c + (x − y)/(Kη),
  x ← x + η_g·(1/|S|)Σ(y_i − x), c ← c + (1/N)ΣΔc_i; FedNova (Wang et al. 2020) x ← x −
  τ_eff·Σ p_i(x − y_i)/τ_i; FedProto (Tan et al. 2022) L_data + λ·MSE(H_s, C̄^(φ_s)), C̄^j =
  Σ_i |D_ij|/N_j·C_i^j; FedDC = federated *daisy-chaining* (Kamp, Fischer & Vreeken 2021, the
  paper's citation: permutation every d rounds, n_i/n aggregation every b rounds -- it has no
  drift-correction term, that is Gao et al.'s unrelated FedDC); Separate: L_data, no server.

The step tests run one real client round (``task.client_train_round``, the code the Flower
ClientApp calls; Separate: ``baseline_local_update``, it has no server) of a float64 tiny BERTSUM
on one fixed batch with one local epoch (one SGD step -- two for FedProx, whose proximal gradient
vanishes at the first step because w = w^r there), and compare the tensors the client sends (or,
for FedProto, keeps) with a deep copy stepped by a fresh ``torch.optim.SGD`` on the loss written
here.  One embedding matrix is frozen (requires_grad False) and must come back unchanged.
"""

from __future__ import annotations

import copy
import math
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from transformers import BertConfig, BertModel

from fedrepro.io import InputError
from fedrepro.papers.fedsum import algorithm as fedsum_alg
from fedrepro.papers.fedsum import strategy as fedsum_strategy
from fedrepro.papers.fedsum import task as fedsum_task
from fedrepro.papers.fedsum.algorithm import VARIANTS, FedSumBroadcast, FedSumHParams
from fedrepro.papers.fedsum.baselines import BASELINES, baseline_local_update
from fedrepro.papers.fedsum.model import BertSumExt, EncodedDocument, collate

HIDDEN = 8
LR = 0.004
MU = 0.3  # FedProx μ
PROTO_LAMBDA = 1.7  # FedProto λ
ZETA = (0.3, 0.85)  # ζ_p = PDT[i][p] of the two received perturbed heads
LAM = 0.6  # Alg. 3's λ
FROZEN = "representation.encoder.embeddings.word_embeddings.weight"
TOL = {"rtol": 1e-9, "atol": 1e-12}  # float64 model: only summation order differs

# three documents, B = 3, m = 5 sentence slots; 5 key sentences, 7 others
DOC_LABELS = ([1, 0, 0, 1], [0, 1, 0], [0, 0, 0, 1, 1])
# Alg. 3 by hand: per-column key sentences / B = [1/3, 1/3, 0, 2/3, 1/3], total 5/3; with λ = 0.6
# the threshold is 1, the cumulative sums 1/3, 2/3, 2/3, 4/3 -- so Q = 4
BATCH_Q = 4


def tiny_model(seed: int) -> BertSumExt:
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=40,
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertSumExt(BertModel(cfg, add_pooling_layer=False), head_seed=seed).double()


def make_doc(i: int, labels) -> EncodedDocument:
    rng = random.Random(i)
    ids, segs, clss = [], [], []
    for s in range(len(labels)):
        clss.append(len(ids))
        span = [2] + [rng.randint(5, 39) for _ in range(3)] + [3]
        ids += span
        segs += [s % 2] * len(span)
    return EncodedDocument(
        f"d{i}", ids, segs, clss, list(labels), [f"s{s}" for s in range(len(labels))]
    )


BATCH = collate([make_doc(i, lab) for i, lab in enumerate(DOC_LABELS)])
FRESH = tiny_model(0)  # the model every client builds (task.fresh_model)
FRESH.get_parameter(FROZEN).requires_grad_(False)
GLOBAL = tiny_model(1).federated_state()  # Ω_g the server sends (differs from FRESH)
GLOBAL["head.linear1.bias"] = torch.tensor([1.0], dtype=torch.float64)  # logits ±: both classes
OWN = tiny_model(2).federated_state()  # a personalised client's own model (FedProto)


def _vec(seed: int, *shape, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=g, dtype=torch.float64)


# ω̃_p: float32 (the wire's dtype), with Bernoulli zeros as Alg. 1 line 11 leaves them
HEADS = []
for _s in (11, 12):
    _w = _vec(_s, 1, HIDDEN).float()
    _w[0, ::3] = 0.0
    HEADS.append(OrderedDict([("linear1.weight", _w), ("linear1.bias", _vec(_s + 50, 1).float())]))
GLOBAL_PROTOS = {0: _vec(21, HIDDEN).float(), 1: _vec(22, HIDDEN).float()}  # P̄_c^ξ / C̄^ξ


# -- the equations, written out -----------------------------------------------------------------
def l_data(logits: torch.Tensor) -> torch.Tensor:
    """L_data = Σ_b Σ_c ℓ / B with ℓ(z, φ) = −φ log σ(z) − (1 − φ) log(1 − σ(z)) = softplus(z) − φz
    over the valid sentence slots (FedSum Alg. 2 line 7)."""
    y = BATCH.labels.to(logits.dtype)
    m = BATCH.cls_mask.to(logits.dtype)
    return ((F.softplus(logits) - y * logits) * m).sum() / logits.shape[0]


def head_logits(h: torch.Tensor, head: OrderedDict) -> torch.Tensor:
    """h(ω, H) before the sigmoid: H·Wᵀ + b."""
    w, b = head["linear1.weight"].double(), head["linear1.bias"].double()
    return (h @ w.T).squeeze(-1) + b


def trainable(model) -> OrderedDict:
    return OrderedDict((k, p) for k, p in model.named_parameters() if p.requires_grad)


def sgd_step(params: OrderedDict, loss: torch.Tensor, correction: OrderedDict | None = None):
    """One step of a fresh ``torch.optim.SGD(lr=LR)`` (the clients' optimiser) on ``loss``;
    ``correction`` is added to every gradient first (SCAFFOLD)."""
    opt = torch.optim.SGD(list(params.values()), lr=LR)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if correction is not None:
        for k, p in params.items():
            assert p.grad is not None, k  # every trainable tensor takes part in the forward pass
            p.grad.add_(correction[k])
    opt.step()  # a tensor the loss does not reach (ω under L_pm alone) has no gradient: unchanged


def start_from(state: OrderedDict | None) -> BertSumExt:
    model = copy.deepcopy(FRESH)
    if state is not None:
        model.load_federated_state(state)
    model.train()
    return model


def class_means(h: torch.Tensor, classes: torch.Tensor) -> dict:
    """Eq. 3/4: the mean sentence vector per class ξ (None when the class is empty)."""
    return {
        xi: (h[classes == xi].mean(0) if bool((classes == xi).any()) else None) for xi in (0, 1)
    }


def valid_vectors(model: BertSumExt) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(H_s, φ_s, predicted class 1(σ(h(ω, H_s)) > 0.5)) of the batch's valid sentences."""
    h = model.sentence_vectors(BATCH)[BATCH.cls_mask]
    pred = (torch.sigmoid(head_logits(h, model.head_state()).detach()) > 0.5).long()
    return h, BATCH.labels[BATCH.cls_mask].long(), pred


def states_close(got: dict, want: dict, keys=None) -> None:
    for k in keys or want:
        torch.testing.assert_close(got[k], want[k], **TOL, msg=lambda m, k=k: f"{k}: {m}")


def max_gap(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in b)


# -- the client round, as the Flower ClientApp calls it -----------------------------------------
def make_cell(tmp_path, method: str, rounds: int = 3, epochs: int = 1) -> dict:
    return {
        "paper": "fedsum",
        "method": method,
        "seed": 5,
        "threads": 1,
        "device": "cpu",
        "clients": ["a", "b", "c"],
        "train": {"rounds": rounds, "local_epochs": epochs, "lr": LR},
        "fedsum": {"lam": LAM, "gamma": 0.3, "pdt_init": "portraits"},
        "baselines": {
            "mu": MU,
            "fedproto_lambda": PROTO_LAMBDA,
            "scaffold_global_lr": 0.8,
            "daisy_period": 1,
            "aggregation_period": 2,
        },
        "keep_round_checkpoints": False,
        "out_dir": str(tmp_path / "cell"),
    }


@pytest.fixture
def client(monkeypatch):
    """``task.client_train_round`` on FRESH and [BATCH]: the cell's model and batches replaced
    (no backbone folder or data files), and the personalised evaluation stubbed."""
    monkeypatch.setattr(fedsum_task, "fresh_model", lambda cell: (None, copy.deepcopy(FRESH)))
    monkeypatch.setattr(fedsum_task, "client_batches", lambda cell, c, r: lambda e: [BATCH])
    monkeypatch.setattr(
        fedsum_task,
        "evaluate_model",
        lambda cell, model: {
            "metrics": {m: 0.0 for m in fedsum_task.METRICS} | {"n": 1},
            "selected": {},
        },
    )

    def run(cell, round_index, server_state, records):
        return fedsum_task.client_train_round(cell, "a", round_index, server_state, records)

    return run


def check_shared(cell: dict, sent: OrderedDict) -> None:
    """What the client sends is the method's shared set: all of Ω = {θ, ω} (parameter report's
    ``shared_per_round`` entries) or nothing (FedProto, Separate); the frozen tensor unchanged."""
    shared = fedsum_task.parameter_report(cell)["shared_per_round"]
    assert sum(v.numel() for v in sent.values()) == shared
    if shared:
        assert list(sent) == list(FRESH.federated_state())
        assert torch.equal(sent[FROZEN], GLOBAL[FROZEN])


# ================================================================================================
# 1. one step of every method
# ================================================================================================
STEP_TESTS = {
    "Separate": "test_separate_step",
    "FedAvg": "test_fedavg_like_step",
    "FedNova": "test_fedavg_like_step",
    "FedDC": "test_fedavg_like_step",
    "FedProx": "test_fedprox_steps",
    "SCAFFOLD": "test_scaffold_step",
    "FedProto": "test_fedproto_step",
    "FedSum": "test_fedsum_variant_step",
    "FedSum-depth": "test_fedsum_variant_step",
    "FedSum-breadth": "test_fedsum_variant_step",
}


def test_every_registered_method_has_a_step_test():
    """The registry (``task.METHODS``: §5.1's seven baselines + Table 4's FedSum variants) is
    exactly the set of methods stepped below."""
    assert set(fedsum_task.METHODS) == set(STEP_TESTS) == set(BASELINES) | set(VARIANTS)
    assert all(name in globals() for name in STEP_TESTS.values())


def test_separate_step(tmp_path, client):
    """Separate (§5.1: "each client only trains their model locally"): one SGD step on L_data
    from the client's own model; no server, nothing sent (shared_per_round = 0)."""
    cell = make_cell(tmp_path, "Separate")
    model = copy.deepcopy(FRESH)
    up = baseline_local_update(
        model, "Separate", [BATCH], fedsum_task.baseline_hparams(cell), client="a", t=2, seed=5
    )
    ref = start_from(None)
    _, z = ref.logits(BATCH)
    sgd_step(trainable(ref), l_data(z))
    states_close(up.federated_state, ref.federated_state())
    assert torch.equal(up.federated_state[FROZEN], FRESH.federated_state()[FROZEN])
    assert up.local_steps == 1 and up.num_examples == 3
    assert fedsum_task.parameter_report(cell)["shared_per_round"] == 0
    with pytest.raises(InputError, match="no server"):
        fedsum_task.client_train_round(cell, "a", 2, {}, {})


@pytest.mark.parametrize("method", ["FedAvg", "FedNova", "FedDC"])
def test_fedavg_like_step(tmp_path, client, method):
    """FedAvg, FedNova (vanilla SGD, τ_i = step count) and FedDC (daisy-chaining: the client
    trains the model the server put in ``arrays``): one SGD step on L_data from the received Ω;
    the reply is the whole stepped Ω (and FedNova's τ_i = 1)."""
    cell = make_cell(tmp_path, method)
    sent, stats, reply = client(cell, 2, GLOBAL, {})
    ref = start_from(GLOBAL)
    _, z = ref.logits(BATCH)
    sgd_step(trainable(ref), l_data(z))
    states_close(sent, ref.federated_state())
    assert max_gap(sent, GLOBAL) > 1e-4  # it moved
    check_shared(cell, sent)
    assert stats["local_steps"] == 1 and stats["num_examples"] == 3 and reply == {}


def test_fedprox_steps(tmp_path, client):
    """FedProx: L_data + μ/2·Σ‖w − w^r‖² over the trainable tensors, μ = 0.3 from the server's
    ``fedprox`` record.  Two SGD steps (E = 2 on the one batch): at the first w = w^r, so the
    proximal gradient μ(w − w^r) only acts in the second."""
    cell = make_cell(tmp_path, "FedProx", epochs=2)
    sent, stats, reply = client(cell, 2, GLOBAL, {"fedprox": ConfigRecord({"proximal-mu": MU})})

    def reference(mu: float) -> OrderedDict:
        ref = start_from(GLOBAL)
        for _ in range(2):
            params = trainable(ref)
            _, z = ref.logits(BATCH)
            prox = sum(((p - GLOBAL[k]) ** 2).sum() for k, p in params.items())
            sgd_step(params, l_data(z) + mu / 2 * prox)
        return ref.federated_state()

    want = reference(MU)
    states_close(sent, want)
    assert max_gap(sent, reference(0.0)) > 1e-6 > 1e3 * TOL["atol"]  # the term mattered
    check_shared(cell, sent)
    assert stats["local_steps"] == 2 and reply == {}


def test_scaffold_step(tmp_path, client):
    """SCAFFOLD option II: y = x − η(∇L_data(x) + c − c_i); the client keeps c_i⁺ = c_i − c +
    (x − y)/(Kη) (K = 1) in its own file and sends y and Δc_i = c_i⁺ − c_i."""
    cell = make_cell(tmp_path, "SCAFFOLD")
    keys = list(FRESH.federated_state())
    c = OrderedDict((k, _vec(100 + i, *GLOBAL[k].shape, scale=0.4)) for i, k in enumerate(keys))
    ci = OrderedDict((k, _vec(300 + i, *GLOBAL[k].shape, scale=0.7)) for i, k in enumerate(keys))
    fedsum_task.save_client_state(cell, "a", 1, ci)  # c_i from the client's previous round
    sent, stats, reply = client(cell, 2, GLOBAL, {"scaffold-c": ArrayRecord(c)})

    ref = start_from(GLOBAL)
    _, z = ref.logits(BATCH)
    params = trainable(ref)
    sgd_step(params, l_data(z), OrderedDict((k, c[k] - ci[k]) for k in params))
    y = ref.federated_state()
    states_close(sent, y)
    assert max_gap(sent, start_from(GLOBAL).federated_state()) > 1e-4
    c_new = OrderedDict((k, ci[k] - c[k] + (GLOBAL[k] - y[k]) / (1 * LR)) for k in keys)
    states_close(
        reply["scaffold-delta-c"].to_torch_state_dict(),
        OrderedDict((k, c_new[k] - ci[k]) for k in keys),
    )
    states_close(fedsum_task.latest_client_state(cell, "a", 3), c_new)
    check_shared(cell, sent)
    assert stats["local_steps"] == 1


def test_fedproto_step(tmp_path, client):
    """FedProto: from the client's *own* model, one SGD step on L_data + λ·MSE(H_s, C̄^(φ_s))
    (mean over valid sentences and dimensions, λ = 1.7); no model is sent, the stepped model is
    kept on the client, and the reply holds its class prototypes (eq. 3 of FedSum = FedProto's
    C_i^j, measured after the step) with the class sentence counts |D_ij|."""
    cell = make_cell(tmp_path, "FedProto")
    fedsum_task.save_client_state(cell, "a", 1, OWN)
    records = {"fedproto-prototypes": fedsum_task.prototypes_record(GLOBAL_PROTOS)}
    sent, stats, reply = client(cell, 2, {}, records)

    def reference(lam: float) -> BertSumExt:
        ref = start_from(OWN)
        h, z = ref.logits(BATCH)
        hs, ys = h[BATCH.cls_mask], BATCH.labels[BATCH.cls_mask].long()
        target = torch.stack([GLOBAL_PROTOS[int(y)].double() for y in ys])
        sgd_step(trainable(ref), l_data(z) + lam * ((hs - target) ** 2).mean())
        return ref

    ref = reference(PROTO_LAMBDA)
    kept = fedsum_task.latest_client_state(cell, "a", 3)
    states_close(kept, ref.federated_state())
    assert torch.equal(kept[FROZEN], OWN[FROZEN])
    assert max_gap(kept, reference(0.0).federated_state()) > 1e-6
    assert sent == OrderedDict() and fedsum_task.parameter_report(cell)["shared_per_round"] == 0
    ref.eval()
    with torch.no_grad():
        h, labels, _ = valid_vectors(ref)
    protos = class_means(h, labels)
    got = reply["fedproto-upload"].to_torch_state_dict()
    for xi in (0, 1):
        torch.testing.assert_close(got[f"class-{xi}"], protos[xi].float(), rtol=1e-6, atol=1e-7)
    assert (stats["class_0_count"], stats["class_1_count"]) == (7, 5)


FEDSUM_CASES = [
    # (variant, batch kind): prime = trained on; normal at t = T, e = E, j = τ: ρ = 1, skipped
    ("FedSum", "prime"),
    ("FedSum", "normal"),
    ("FedSum-breadth", "normal"),
    ("FedSum-depth", "prime"),
    ("FedSum-depth", "normal"),
]


def fedsum_reference(variant: str, kind: str, use_pm=None, use_po=None):
    """Alg. 2 for one batch and E = 1, written out: (stepped model, ε, class prototypes measured
    before the L_po step)."""
    v = VARIANTS[variant]
    use_pm = v.parameter_knowledge if use_pm is None else use_pm
    use_po = v.prototype_knowledge if use_po is None else use_po
    skipped = v.depth and kind == "normal"
    ref = start_from(GLOBAL)
    h, z = ref.logits(BATCH)
    y = BATCH.labels.double()
    ell = (F.softplus(z) - y * z) * BATCH.cls_mask.double()
    eps = float((y * ell).detach().sum() / 3)  # ε = Σ MM / B, MM = LD ⊙ LM (Alg. 3 lines 1–2)
    loss = h.new_zeros(())
    if not skipped:
        loss = loss + l_data(z)
    if use_pm:  # eq. 7, summed over PK_i (Alg. 2 lines 13–16); the received heads stay fixed
        for zeta, head in zip(ZETA, HEADS):
            loss = loss + zeta * l_data(head_logits(h, head))
    if loss.requires_grad:
        sgd_step(trainable(ref), loss)
    ref.eval()
    h, labels, pred = valid_vectors(ref)
    assert set(pred.tolist()) == {0, 1}  # both prediction prototypes exist: eq. 5's 2nd term acts
    pc, pp = class_means(h, labels), class_means(h, pred)
    measured = {xi: pc[xi].detach().clone() for xi in (0, 1)}
    if use_po:  # eq. 5, one SGD step of θ only (Alg. 2 line 24)
        l_po = sum(torch.linalg.vector_norm(GLOBAL_PROTOS[xi].double() - pc[xi]) for xi in (0, 1))
        l_po = l_po - torch.linalg.vector_norm(pp[1] - pp[0])
        rep = OrderedDict(
            (k, p) for k, p in trainable(ref).items() if k.startswith("representation.")
        )
        sgd_step(rep, l_po)
    else:
        ref.zero_grad()
    return ref.federated_state(), eps, measured


@pytest.mark.parametrize("variant,kind", FEDSUM_CASES)
def test_fedsum_variant_step(tmp_path, client, variant, kind):
    """FedSum / FedSum-breadth / FedSum-depth (Table 4), one client round t ≥ 2 on one batch:
    θ steps on L_data + L_pm (ζ = 0.3, 0.85 on two received heads), ω on L_data only; a normal
    batch with ρ = (t/T)(e/E)(j/τ) = 1 is skipped under the depth extension (L_data = 0, L_pm still
    trains θ); then the L_po step of θ (eq. 5).  The reply: the stepped Ω, ε and Q (eq. 2's
    inputs) and, with the breadth extension, P_(i,c)^0/1 and SP_i (eq. 6)."""
    v = VARIANTS[variant]
    prime = kind == "prime"
    t, total = (2, 3) if prime else (3, 3)
    # prime: ε ≫ ε̄ (Alg. 3 line 9 fails); normal: Q = 4 < Q̄ = 4.5 and ε < ε̄ = 1e3
    bc = FedSumBroadcast(
        round=t,
        total_rounds=total,
        global_significance=0.01 if prime else 1e3,
        global_bias_level=4.5,
        global_class_prototypes=dict(GLOBAL_PROTOS)
        if v.prototype_knowledge
        else {0: None, 1: None},
        parameter_knowledge=list(zip(ZETA, HEADS)) if v.parameter_knowledge else [],
    )
    senders = ["b", "c"] if v.parameter_knowledge else []
    records = fedsum_task.broadcast_records(bc, variant, senders)
    cell = make_cell(tmp_path, variant, rounds=total)
    sent, stats, reply = client(cell, t, GLOBAL, records)

    want, eps, protos = fedsum_reference(variant, kind)
    states_close(sent, want)
    check_shared(cell, sent)
    skipped = v.depth and not prime
    assert stats["skipped_batches"] == int(skipped)
    assert stats["normal_batches"] == (int(not prime) if v.depth else 0)
    assert stats["steps"] == int(not skipped or v.parameter_knowledge)
    assert stats["received_heads"] == (2 if v.parameter_knowledge else 0)
    assert stats["mean_bias_level"] == BATCH_Q
    assert stats["mean_significance"] == pytest.approx(eps, rel=1e-12)
    head = ("head.linear1.weight", "head.linear1.bias")
    if skipped:  # ω learns from L_data only: a skipped batch leaves the head as received
        assert all(torch.equal(sent[k], GLOBAL[k]) for k in head)
    else:
        assert max_gap({k: sent[k] for k in head}, {k: GLOBAL[k] for k in head}) > 1e-4
    if v.needs_prototypes:
        up = reply["fedsum-upload"].to_torch_state_dict()
        assert set(up) == {"class-0", "class-1", "portrait"}
        for xi in (0, 1):
            torch.testing.assert_close(up[f"class-{xi}"], protos[xi].float(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(
            up["portrait"], torch.cat([protos[0], protos[1]]).float(), rtol=1e-6, atol=1e-7
        )
    else:
        assert reply == {}
    # each knowledge source moved the result by far more than the tolerance
    if v.parameter_knowledge:
        assert max_gap(sent, fedsum_reference(variant, kind, use_pm=False)[0]) > 1e-6
    if v.prototype_knowledge:
        assert max_gap(sent, fedsum_reference(variant, kind, use_po=False)[0]) > 1e-6
    if skipped:  # and dropping L_data is what the depth extension did
        assert (
            max_gap(
                sent,
                fedsum_reference("FedSum-breadth" if v.parameter_knowledge else variant, "prime")[
                    0
                ],
            )
            > 1e-6
        )


def test_fedsum_round_one_uses_neither_heads_nor_prototypes(tmp_path, client):
    """Alg. 2 lines 11 and 23: ``if t ≠ 1`` -- in round 1 FedSum is one L_data step (every batch
    prime: ε̄ = Q̄ = 0), whatever the message carries."""
    bc = FedSumBroadcast(
        round=1,
        total_rounds=3,
        global_class_prototypes=dict(GLOBAL_PROTOS),
        parameter_knowledge=list(zip(ZETA, HEADS)),
    )
    cell = make_cell(tmp_path, "FedSum")
    sent, stats, _ = client(
        cell, 1, GLOBAL, fedsum_task.broadcast_records(bc, "FedSum", ["b", "c"])
    )
    want, _, _ = fedsum_reference("FedSum", "prime", use_pm=False, use_po=False)
    states_close(sent, want)
    assert stats["received_heads"] == 0 and stats["L_po"] == 0.0


# ================================================================================================
# 2. Data skip: ρ_(i,j) = (t/T)·(e/E)·(j/τ_i)
# ================================================================================================
class ScriptedUniform:
    """Stands in for the client round's U(0,1) generator: returns ``values`` in order."""

    def __init__(self, values):
        self.values, self.calls = list(values), 0

    def random(self) -> float:
        self.calls += 1
        return self.values[self.calls - 1]


@pytest.mark.parametrize("t,total,epochs,tau", [(3, 4, 2, 4), (2, 5, 3, 3)])
def test_data_skip_probability_is_t_over_T_times_e_over_E_times_j_over_tau(
    monkeypatch, t, total, epochs, tau
):
    """FedSum §4.2 / Alg. 2 line 6: every batch draws ρ̂ and a normal batch is skipped iff
    ρ̂ ≤ ρ_(i,j) = (t/T)·(e/E)·(j/τ_i).  With every batch normal, the scripted draw is exactly ρ
    (must skip: "≤") or the next float above it (must train) for alternating (e, j) -- where ρ is
    dyadic, so exact in any evaluation order; else ρ(1 ∓ 1e-12) -- so a probability off by more
    than that flips a decision; the probabilities handed to the skip decision are also captured
    and compared with the formula."""
    rho = {
        (e, j): (t / total) * (e / epochs) * (j / tau)
        for e in range(1, epochs + 1)
        for j in range(1, tau + 1)
    }
    skip_here = {ej: (ej[0] + ej[1]) % 2 == 0 for ej in rho}
    if total == 4 and epochs == 2 and tau == 4:  # dyadic ρ = 3ej/32: exact in any order
        draws = [r if skip_here[ej] else float(np.nextafter(r, 2.0)) for ej, r in rho.items()]
    else:
        draws = [r * (1 - 1e-12 if skip_here[ej] else 1 + 1e-12) for ej, r in rho.items()]
    fake = ScriptedUniform(draws)
    monkeypatch.setattr(fedsum_alg, "skip_rng", lambda seed, c, r: fake)
    seen = []
    decide = fedsum_alg.skip_decision

    def spy(rng, p, normal):
        seen.append((p, normal))
        return decide(rng, p, normal)

    monkeypatch.setattr(fedsum_alg, "skip_decision", spy)
    batches = [collate([make_doc(j, DOC_LABELS[j % 3])]) for j in range(tau)]
    bc = FedSumBroadcast(
        round=t, total_rounds=total, global_significance=1e9, global_bias_level=1e9
    )
    hp = FedSumHParams(lam=LAM, lr=LR, local_epochs=epochs)
    up = fedsum_alg.fedsum_local_update(
        copy.deepcopy(FRESH), batches, bc, hp, "FedSum-depth", client="a", seed=0
    )
    assert fake.calls == epochs * tau  # one ρ̂ per batch
    assert [n for _, n in seen] == [True] * (epochs * tau)
    assert [p for p, _ in seen] == pytest.approx(list(rho.values()), rel=1e-14, abs=0)
    n_skip = sum(skip_here.values())
    assert up.stats["normal_batches"] == epochs * tau
    assert up.stats["skipped_batches"] == n_skip
    assert up.stats["steps"] == epochs * tau - n_skip


def test_data_skip_only_under_the_depth_extension_and_only_normal_batches(monkeypatch):
    """ρ̂ = 0 ≤ ρ for every batch: prime batches (round t ≥ 2 with ε̄ = Q̄ = 0, Alg. 3 line 9) are
    never skipped, and FedSum-breadth (no depth extension) neither draws nor skips."""
    fake = ScriptedUniform([0.0] * 8)
    monkeypatch.setattr(fedsum_alg, "skip_rng", lambda seed, c, r: fake)
    batches = [collate([make_doc(j, DOC_LABELS[j % 3])]) for j in range(4)]
    hp = FedSumHParams(lam=LAM, lr=LR, local_epochs=2)
    prime = FedSumBroadcast(round=2, total_rounds=3)
    up = fedsum_alg.fedsum_local_update(
        copy.deepcopy(FRESH), batches, prime, hp, "FedSum-depth", client="a", seed=0
    )
    assert (up.stats["normal_batches"], up.stats["skipped_batches"], up.stats["steps"]) == (0, 0, 8)
    assert fake.calls == 8
    normal = FedSumBroadcast(
        round=2,
        total_rounds=3,
        global_significance=1e9,
        global_bias_level=1e9,
        global_class_prototypes=dict(GLOBAL_PROTOS),
    )
    fake.calls = 0
    up = fedsum_alg.fedsum_local_update(
        copy.deepcopy(FRESH), batches, normal, hp, "FedSum-breadth", client="a", seed=0
    )
    assert (up.stats["skipped_batches"], up.stats["steps"], fake.calls) == (0, 8, 0)


# ================================================================================================
# 3. server rules with unequal clients (n = 1, 4, 9; n = 14)
# ================================================================================================
N = (1, 4, 9)
X = {
    "representation.w": [0.0, 1.0],
    "head.linear1.weight": [[1.0, 1.0]],
    "head.linear1.bias": [0.0],
}
Y = [
    {
        "representation.w": [1.0, -2.0],
        "head.linear1.weight": [[0.5, 3.0]],
        "head.linear1.bias": [2.0],
    },
    {
        "representation.w": [4.0, 0.0],
        "head.linear1.weight": [[-1.0, 1.0]],
        "head.linear1.bias": [0.5],
    },
    {
        "representation.w": [-0.5, 6.0],
        "head.linear1.weight": [[2.0, 0.0]],
        "head.linear1.bias": [-1.0],
    },
]
# Σ n_i y_i / 14 by hand: w = [(1 + 16 − 4.5), (−2 + 0 + 54)]/14,
# W = [(0.5 − 4 + 18), (3 + 4 + 0)]/14, b = (2 + 2 − 9)/14
FEDAVG = {
    "representation.w": [12.5 / 14, 52 / 14],
    "head.linear1.weight": [[14.5 / 14, 7 / 14]],
    "head.linear1.bias": [-5 / 14],
}


def _t(d: dict) -> OrderedDict:
    return OrderedDict((k, torch.tensor(v, dtype=torch.float32)) for k, v in d.items())



def server(cls, tmp_path, method: str, clients=("a", "b", "c"), **strategy_kw):
    cell = make_cell(tmp_path, method)
    cell["clients"] = list(clients)
    s = cls(
        cell,
        **strategy_kw,
        out_dir=tmp_path / "server",
        round_offset=0,
        expected_clients=3,
        fraction_train=1.0,
        min_train_nodes=3,
        min_available_nodes=3,
        fraction_evaluate=0.0,
        min_evaluate_nodes=0,
        weighted_by_key="num-examples",
    )
    s._node_of = {0: 11, 1: 12, 2: 13}  # partitions 0, 1, 2 = clients a, b, c (no query)
    return s


def configure(s, server_round: int, current: dict) -> list[Message]:
    return sorted(
        s.configure_train(server_round, ArrayRecord(_t(current)), ConfigRecord({}), None),
        key=lambda m: m.metadata.dst_node_id,
    )


def replies(instructions, states, extra=None, metrics=None) -> list[Message]:
    out = []
    for pid, (inst, state, n) in enumerate(zip(instructions, states, N)):
        met = {"partition-id": pid, "num-examples": n, **((metrics or [{}] * 3)[pid])}
        content = {
            "arrays": ArrayRecord(_t(state) if state else OrderedDict()),
            "metrics": MetricRecord(met),
            **((extra or [{}] * 3)[pid]),
        }
        out.append(Message(RecordDict(content), reply_to=inst))
    return out


def close(got, want, tol=1e-6):
    np.testing.assert_allclose(
        np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64), rtol=tol, atol=tol
    )


@pytest.mark.parametrize("method", ["FedAvg", "FedProx"])
def test_fedavg_and_fedprox_servers_weight_by_examples(task_identity, tmp_path, method):
    """FedAvg / FedProx server (Flower's weighted average): Σ (n_i/n)·y_i with n = 1, 4, 9."""
    cls = (
        fedsum_strategy.FedSumFedProx
        if method == "FedProx"
        else fedsum_strategy.FedSumRunnerStrategy
    )
    kw = {"proximal_mu": MU} if method == "FedProx" else {}
    s = server(cls, tmp_path, method, **kw)
    inst = configure(s, 1, X)
    if method == "FedProx":
        assert all(m.content["fedprox"]["proximal-mu"] == MU for m in inst)
    arrays, _ = s.aggregate_arrays(1, replies(inst, Y))
    got = arrays.to_torch_state_dict()
    for k in X:
        close(got[k], FEDAVG[k])


def test_scaffold_server_update_with_unequal_clients(task_identity, tmp_path):
    """SCAFFOLD (Alg. 1 lines 16–17): x ← x + η_g·(1/|S|)Σ(y_i − x) -- uniform over the replies,
    the n_i do not enter -- and c ← c + (1/N)Σ Δc_i with N = 5 clients in all; the next round
    broadcasts the new c.  η_g = 0.8."""
    s = server(fedsum_strategy.FedSumScaffold, tmp_path, "SCAFFOLD", clients="abcde")
    inst = configure(s, 1, X)
    assert all(
        float(np.abs(a.numpy()).max()) == 0 for m in inst for a in m.content["scaffold-c"].values()
    )
    dc = [
        {
            "representation.w": [0.5, 0.5],
            "head.linear1.weight": [[0.5, 0.5]],
            "head.linear1.bias": [0.5],
        },
        {
            "representation.w": [1.0, -4.0],
            "head.linear1.weight": [[-2.0, -2.0]],
            "head.linear1.bias": [-2.0],
        },
        {
            "representation.w": [3.0, 3.0],
            "head.linear1.weight": [[3.0, 3.0]],
            "head.linear1.bias": [3.0],
        },
    ]
    arrays, _ = s.aggregate_arrays(
        1, replies(inst, Y, [{"scaffold-delta-c": ArrayRecord(_t(d))} for d in dc])
    )
    got = arrays.to_torch_state_dict()
    # mean(y − x): w = [(1 + 4 − 0.5)/3, (−3 − 1 + 5)/3], W = [(−0.5 − 2 + 1)/3, (2 + 0 − 1)/3],
    # b = (2 + 0.5 − 1)/3
    close(got["representation.w"], [0.8 * 4.5 / 3, 1 + 0.8 * 1 / 3])
    close(got["head.linear1.weight"], [[1 + 0.8 * -1.5 / 3, 1 + 0.8 * 1 / 3]])
    close(got["head.linear1.bias"], [0.8 * 1.5 / 3])
    # c = 0 + (Δc_a + Δc_b + Δc_c)/5
    want_c = {
        "representation.w": [(0.5 + 1 + 3) / 5, (0.5 - 4 + 3) / 5],
        "head.linear1.weight": [[1.5 / 5, 1.5 / 5]],
        "head.linear1.bias": [1.5 / 5],
    }
    for k in X:
        close(s.control[k], want_c[k])
    nxt = configure(s, 2, {k: v.tolist() for k, v in got.items()})
    for m in nxt:
        for k in X:
            close(m.content["scaffold-c"][k].numpy(), want_c[k])


def test_fednova_server_with_unequal_clients(task_identity, tmp_path):
    """FedNova: p = (1, 4, 9)/14, τ = (2, 5, 9): τ_eff = (2 + 20 + 81)/14 = 103/14,
    x ← x − τ_eff·Σ p_i (x − y_i)/τ_i."""
    s = server(fedsum_strategy.FedSumFedNova, tmp_path, "FedNova")
    inst = configure(s, 1, X)
    arrays, _ = s.aggregate_arrays(
        1, replies(inst, Y, metrics=[{"local-steps": k} for k in (2, 5, 9)])
    )
    got = arrays.to_torch_state_dict()
    # w[0]: x = 0; Σ p_i (x − y_i)/τ_i = (1·−1/2 + 4·−4/5 + 9·0.5/9)/14 = −3.2/14
    close(got["representation.w"][0], -(103 / 14) * (-3.2 / 14))
    # w[1]: x = 1; (1·3/2 + 4·1/5 + 9·(−5)/9)/14 = −2.7/14
    close(got["representation.w"][1], 1 - (103 / 14) * (-2.7 / 14))
    # b: x = 0; (1·−2/2 + 4·−0.5/5 + 9·1/9)/14 = −0.4/14
    close(got["head.linear1.bias"][0], -(103 / 14) * (-0.4 / 14))


def test_fedproto_server_weights_prototypes_by_class_counts(task_identity, tmp_path):
    """FedProto eq. 6: C̄^j = Σ_i |D_ij|/N_j · C_i^j over the clients holding class j -- the class
    sentence counts, not n_i (client b has no class-1 sentence); the next round sends C̄."""
    s = server(fedsum_strategy.FedSumFedProto, tmp_path, "FedProto")
    inst = configure(s, 1, {})
    assert all(len(m.content["fedproto-prototypes"]) == 0 for m in inst)
    protos = [
        {"class-0": [1.0, 0.0], "class-1": [0.0, 2.0]},
        {"class-0": [3.0, 3.0]},
        {"class-0": [-1.0, 2.0], "class-1": [4.0, -2.0]},
    ]
    counts = [(3, 1), (7, 0), (20, 6)]
    arrays, _ = s.aggregate_arrays(
        1,
        replies(
            inst,
            [None] * 3,
            [{"fedproto-upload": ArrayRecord(_t(p))} for p in protos],
            [{"class-0-count": a, "class-1-count": b} for a, b in counts],
        ),
    )
    assert len(arrays) == 0  # no model is aggregated
    # C̄^0 = (3·[1,0] + 7·[3,3] + 20·[−1,2])/30, C̄^1 = (1·[0,2] + 6·[4,−2])/7
    close(s.global_prototypes[0], [(3 + 21 - 20) / 30, (0 + 21 + 40) / 30])
    close(s.global_prototypes[1], [24 / 7, (2 - 12) / 7])
    nxt = configure(s, 2, {})
    for m in nxt:
        close(m.content["fedproto-prototypes"]["class-0"].numpy(), [4 / 30, 61 / 30])
        close(m.content["fedproto-prototypes"]["class-1"].numpy(), [24 / 7, -10 / 7])


def test_feddc_server_permutes_then_aggregates_with_unequal_clients(task_identity, tmp_path):
    """FedDC (Kamp et al. 2021, d = 1, b = 2): round 1 ends with a permutation -- each client's
    next message carries another client's model (a derangement) -- and the round is evaluated with
    Σ (n_i/n)·y_i; round 2 ends with the aggregation Σ (n_i/n)·z_i, which every client then
    holds."""
    s = server(fedsum_strategy.FedSumDaisyChain, tmp_path, "FedDC")
    inst = configure(s, 1, X)
    for m in inst:  # everyone starts from Ω⁰
        for k, x in X.items():
            close(m.content["arrays"][k].numpy(), x)
    arrays, _ = s.aggregate_arrays(1, replies(inst, Y))
    got = arrays.to_torch_state_dict()
    for k in X:
        close(got[k], FEDAVG[k])
    perm = s.daisy.permutation(1, ["a", "b", "c"])
    assert all(r != snd for r, snd in perm.items())
    inst2 = configure(s, 2, {k: v.tolist() for k, v in got.items()})
    for m, receiver in zip(inst2, "abc"):
        sender = "abc".index(perm[receiver])
        for k in X:
            close(m.content["arrays"][k].numpy(), Y[sender][k])
    z = [Y[2], Y[0], Y[1]]  # the round-2 models (any three states)
    arrays, _ = s.aggregate_arrays(2, replies(inst2, z))
    got = arrays.to_torch_state_dict()
    # (1·y_c + 4·y_a + 9·y_b)/14: w = [(−0.5 + 4 + 36), (6 − 8 + 0)]/14,
    # W = [(2 + 2 − 9), (0 + 12 + 9)]/14
    close(got["representation.w"], [39.5 / 14, -2 / 14])
    close(got["head.linear1.weight"], [[-5 / 14, 21 / 14]])
    close(got["head.linear1.bias"], [(-1 + 8 + 4.5) / 14])
    assert s.daisy.held == {}
    for k in X:
        close(s.daisy.model_for("a")[k], got[k])


def test_fedsum_server_round_with_unequal_clients(task_identity, tmp_path):
    """FedSum Alg. 1 lines 8–15 through the strategy, clients a, b, c (n = 1, 4, 9) of a, b, c, d:
    Ω_g, ε̄, Q̄ (eq. 2) and P̄_c weighted by n_i/n; the PDT from the new portraits (d keeps its
    initial one); next round's PK_i holds ζ_p = tanh(‖SP_i − SP_p‖₂) and ω̃_p = Dropout(ω_p, γ),
    p ≠ i, from each sender's *own* head."""
    s = server(fedsum_strategy.FedSumServer, tmp_path, "FedSum", clients="abcd")
    initial = {"a": [9.0, 9.0, 9.0, 9.0], "b": [0.0] * 4, "c": [1.0] * 4, "d": [0.0, 0.0, 0.0, 0.0]}
    for c, sp in initial.items():
        s.state.pdt.update(c, torch.tensor(sp))
    inst = configure(s, 1, X)
    assert all(m.content["fedsum"]["global-significance"] == 0.0 for m in inst)
    eps, q = (0.7, 0.2, 0.4), (3.0, 2.5, 5.5)
    p0 = ([1.0, 0.0], [0.0, 2.0], [2.0, 2.0])
    p1 = ([3.0, 1.0], [1.0, 1.0], [0.0, -1.0])
    # new portraits: a = [0, 0, 0, 0], b = [3, 4, 0, 0], c = [0, 0, 0, 0.5]
    sp = ([0.0, 0.0, 0.0, 0.0], [3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5])
    extra = [
        {"fedsum-upload": ArrayRecord(_t({"class-0": a, "class-1": b, "portrait": c}))}
        for a, b, c in zip(p0, p1, sp)
    ]
    mets = [{"mean-significance": e, "mean-bias-level": b} for e, b in zip(eps, q)]
    arrays, _ = s.aggregate_arrays(1, replies(inst, Y, extra, mets))
    got = arrays.to_torch_state_dict()
    for k in X:
        close(got[k], FEDAVG[k])
    st = s.state
    assert st.global_significance == pytest.approx((0.7 + 0.8 + 3.6) / 14)
    assert st.global_bias_level == pytest.approx((3.0 + 10.0 + 49.5) / 14)
    close(st.global_class_prototypes[0], [(1 + 0 + 18) / 14, (0 + 8 + 18) / 14])
    close(st.global_class_prototypes[1], [(3 + 4 + 0) / 14, (1 + 4 - 9) / 14])
    assert st.pdt.weight("a", "b") == pytest.approx(math.tanh(5.0))
    assert st.pdt.weight("a", "c") == pytest.approx(math.tanh(0.5))
    assert st.pdt.weight("b", "d") == pytest.approx(math.tanh(5.0))  # d: initial [0, 0, 0, 0]
    # round 2's messages: a receives the heads of b and c; d (not in round 1) of a, b and c
    nxt = {
        m.metadata.dst_node_id: m for m in configure(s, 2, {k: v.tolist() for k, v in got.items()})
    }
    cfg_a = nxt[11].content["fedsum"]
    assert list(cfg_a["knowledge-clients"]) == ["b", "c"]
    close(list(cfg_a["knowledge-weights"]), [math.tanh(5.0), math.tanh(0.5)])
    assert cfg_a["global-bias-level"] == pytest.approx(62.5 / 14)
    heads = nxt[11].content["fedsum-heads"].to_torch_state_dict()
    for p, y in (("b", Y[1]), ("c", Y[2])):
        for k in ("linear1.weight", "linear1.bias"):
            own = torch.tensor(y[f"head.{k}"])
            kept = heads[f"{p}/{k}"] != 0
            assert torch.equal(heads[f"{p}/{k}"][kept], own[kept])  # ω̃_p: ω_p with Bernoulli zeros
    close(nxt[11].content["fedsum-prototypes"]["class-1"].numpy(), [0.5, -4 / 14])
    assert set(st.perturbed_heads) == {"a", "b", "c"}
    d = fedsum_alg.fedsum_broadcast(st, "d", 3)
    assert [z for z, _ in d.parameter_knowledge] == pytest.approx(
        [math.tanh(0.0), math.tanh(5.0), math.tanh(0.5)]
    )
