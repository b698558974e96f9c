"""FedSum (fedrepro.papers.fedsum.algorithm): Data Partition (Alg. 3), Data skip, prototypes and L_po
(eq. 3–5), semantic portraits and the PDT (eq. 6), perturbed heads and L_pm (eq. 7), server
aggregation (eq. 2) and the client round (Alg. 2) -- against hand computations."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import math
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from fedrepro.papers.fedsum.algorithm import (
    VARIANTS,
    FedSumBroadcast,
    FedSumHParams,
    FedSumUpload,
    FedSumVariant,
    PortraitDistanceTable,
    aggregate_class_prototypes,
    bias_level,
    compute_prototypes,
    data_partition,
    fedsum_broadcast,
    fedsum_local_update,
    fedsum_server_round,
    frozen_head,
    local_significance,
    masked_loss_matrix,
    new_server_state,
    parameter_knowledge_loss,
    perturb_head,
    portrait_distance_table,
    prototype_knowledge_step,
    prototype_loss,
    semantic_portrait,
    skip_decision,
    skip_probability,
    skip_rng,
    weighted_average,
    weighted_mean,
)
from fedrepro.io import InputError
from fedrepro.papers.fedsum.model import (
    BertSumExt,
    EncodedDocument,
    SentenceClassifier,
    data_loss,
    make_batches,
    sentence_loss_matrix,
)


# -- a tiny BERTSUM on synthetic documents (no tokenizer needed) -----------------------------------
def tiny_model(seed: int = 0) -> BertSumExt:
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertSumExt(BertModel(cfg, add_pooling_layer=False), head_seed=seed)


def synthetic_docs(n: int, seed: int = 0) -> list[EncodedDocument]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        ns = rng.randint(2, 5)
        ids, segs, clss = [], [], []
        for s in range(ns):
            clss.append(len(ids))
            span = [2] + [rng.randint(5, 39) for _ in range(rng.randint(2, 4))] + [3]
            ids += span
            segs += [s % 2] * len(span)
        labels = [0] * ns
        labels[rng.randrange(ns)] = 1
        docs.append(EncodedDocument(f"d{i}", ids, segs, clss, labels, [f"s{s}" for s in range(ns)]))
    return docs


# -- Data Partition (Alg. 3) -----------------------------------------------------------------------
LD = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
LM = torch.tensor([[0.2, 0.9, 0.4, 0.1], [0.3, 0.6, 0.5, 0.0]])


def test_masked_matrix_significance_and_bias_level_by_hand():
    assert torch.equal(masked_loss_matrix(LD, LM), torch.tensor([[0.2, 0, 0.4, 0], [0, 0.6, 0, 0]]))
    # ε = (0.2 + 0.4 + 0.6) / B, B = 2
    assert local_significance(LD, LM) == pytest.approx(0.6)
    # per-document key sentences by column: [.5, .5, .5, 0], total 1.5; cumulative .5, 1, 1.5
    assert bias_level(LD, 0.3) == 1  # .5 >= .45
    assert bias_level(LD, 0.5) == 2  # 1 >= .75
    assert bias_level(LD, 2 / 3) == 2  # 1 >= 1 (equality counts: "≥")
    assert bias_level(LD, 0.8) == 3  # 1.5 >= 1.2
    assert bias_level(LD, 1.0) == 3
    assert bias_level(torch.zeros(2, 4), 0.5) == 1  # no key sentence
    with pytest.raises(InputError):
        bias_level(LD, 1.5)


def test_data_partition_normal_and_prime_cases():
    # Q = 2, ε = 0.6
    normal = data_partition(LD, LM, 0.5, global_significance=0.7, global_bias_level=2.5)
    assert (normal.bias_level, normal.significance, normal.normal) == (2, pytest.approx(0.6), True)
    # prime: the batch is more significant than the global level (ε ≥ ε̄) ...
    assert not data_partition(LD, LM, 0.5, global_significance=0.6, global_bias_level=2.5).normal
    # ... or less leading-biased (Q ≥ Q̄)
    assert not data_partition(LD, LM, 0.5, global_significance=0.7, global_bias_level=2.0).normal
    # round 1: ε̄ = Q̄ = 0, every batch is prime
    assert not data_partition(LD, LM, 0.5, 0.0, 0.0).normal


def test_skip_probability_schedule():
    assert skip_probability(1, 5, 1, 2, 1, 4) == pytest.approx(1 / 5 * 1 / 2 * 1 / 4)
    assert skip_probability(3, 5, 2, 2, 2, 4) == pytest.approx(0.3)
    assert skip_probability(5, 5, 2, 2, 4, 4) == 1.0
    # increasing in each of round, epoch and batch index
    assert all(
        skip_probability(t, 5, 2, 2, 4, 4) < skip_probability(t + 1, 5, 2, 2, 4, 4)
        for t in range(1, 5)
    )
    assert skip_probability(2, 5, 1, 2, 3, 4) < skip_probability(2, 5, 2, 2, 3, 4)
    assert all(
        skip_probability(2, 5, 1, 2, j, 4) < skip_probability(2, 5, 1, 2, j + 1, 4)
        for j in range(1, 4)
    )
    for bad in ((0, 5, 1, 2, 1, 4), (1, 5, 3, 2, 1, 4), (1, 5, 1, 2, 5, 4)):
        with pytest.raises(InputError):
            skip_probability(*bad)


def test_skip_decision_is_seeded_and_only_skips_normal_batches():
    a = [skip_decision(skip_rng(1, "c3", 2), 0.5, True) for _ in range(3)]
    b = [skip_decision(skip_rng(1, "c3", 2), 0.5, True) for _ in range(3)]
    assert a == b
    rng = skip_rng(1, "c3", 2)
    draws = [skip_decision(rng, 0.3, True) for _ in range(4000)]
    assert abs(np.mean([s for _, s in draws]) - 0.3) < 0.03
    assert all(s == (r <= 0.3) for r, s in draws)
    rng = skip_rng(1, "c3", 2)
    assert not any(skip_decision(rng, 1.0, False)[1] for _ in range(100))  # prime: never
    assert all(skip_decision(rng, 1.0, True)[1] for _ in range(100))  # ρ = 1: always
    assert skip_rng(1, "c3", 2).random() != skip_rng(1, "c3", 3).random()


# -- prototypes and L_po (eq. 3–5) -----------------------------------------------------------------
VECS = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, 4.0]])
LABELS = torch.tensor([0, 0, 1, 1])
SCORES = torch.tensor([0.9, 0.2, 0.6, 0.4])  # predicted classes 1, 0, 1, 0


def test_class_and_prediction_prototypes_by_hand():
    p = compute_prototypes(VECS, LABELS, SCORES)
    assert torch.equal(p.class_prototypes[0], torch.tensor([2.0, 0.0]))
    assert torch.equal(p.class_prototypes[1], torch.tensor([0.0, 3.0]))
    assert torch.equal(p.prediction_prototypes[1], torch.tensor([0.5, 1.0]))
    assert torch.equal(p.prediction_prototypes[0], torch.tensor([1.5, 2.0]))
    assert p.class_counts == {0: 2, 1: 2} and p.prediction_counts == {0: 2, 1: 2}
    none = compute_prototypes(VECS, torch.zeros(4, dtype=torch.long), torch.zeros(4))
    assert none.class_prototypes[1] is None and none.prediction_prototypes[1] is None


def test_prototype_loss_by_hand():
    p = compute_prototypes(VECS, LABELS, SCORES)
    glob = {0: torch.tensor([2.0, 1.0]), 1: torch.tensor([0.0, 0.0])}
    # generalizable ‖[0,−1]‖ + ‖[0,3]‖ = 4; discriminative ‖[.5,1] − [1.5,2]‖ = √2
    loss = prototype_loss(glob, p.class_prototypes, p.prediction_prototypes)
    assert float(loss) == pytest.approx(4 - math.sqrt(2))
    # a missing global prototype drops its term
    loss = prototype_loss({0: glob[0], 1: None}, p.class_prototypes, p.prediction_prototypes)
    assert float(loss) == pytest.approx(1 - math.sqrt(2))
    # gradient: d/dP_c^1 of ‖P̄ − P‖ = (P − P̄)/‖P − P̄‖ = [0, 1]
    leaf = p.class_prototypes[1].clone().requires_grad_(True)
    prototype_loss(glob, {0: None, 1: leaf}, {0: None, 1: None}).backward()
    assert torch.allclose(leaf.grad, torch.tensor([0.0, 1.0]))


def test_semantic_portrait_and_pdt():
    p = compute_prototypes(VECS, LABELS, SCORES)
    sp = semantic_portrait(p.class_prototypes, 2)
    assert sp.tolist() == [2.0, 0.0, 0.0, 3.0]  # Concat(P^0, P^1), eq. 6
    assert semantic_portrait({0: None, 1: torch.tensor([1.0, 1.0])}, 2).tolist() == [0, 0, 1, 1]
    sps = [torch.tensor([0.0, 0.0]), torch.tensor([3.0, 4.0]), torch.tensor([0.3, 0.4])]
    pdt = portrait_distance_table(sps)
    assert torch.equal(pdt, pdt.T)
    assert torch.all(pdt.diagonal() == 0)
    assert torch.all((pdt >= 0) & (pdt < 1))
    assert float(pdt[0, 1]) == pytest.approx(math.tanh(5.0))
    assert float(pdt[0, 2]) == pytest.approx(math.tanh(0.5))
    table = PortraitDistanceTable(["b", "a", "c"])
    for c, s in zip("abc", sps):
        table.update(c, s)
    assert table.weight("a", "b") == pytest.approx(math.tanh(5.0)) == table.weight("b", "a")
    assert table.weight("c", "c") == 0.0
    assert torch.allclose(table.table(), pdt)
    with pytest.raises(InputError, match="no semantic portrait"):
        PortraitDistanceTable(["a", "b"]).weight("a", "b")
    rand = PortraitDistanceTable(["a", "b", "c"], init="random", seed=4)
    w = rand.table()
    assert torch.equal(w, w.T) and torch.all(w.diagonal() == 0) and torch.all((w >= 0) & (w < 1))
    assert torch.equal(w, PortraitDistanceTable(["a", "b", "c"], init="random", seed=4).table())


def test_pdt_weights_parameter_knowledge_loss():
    h = torch.tensor([[[1.0, 2.0], [0.5, -1.0]]], requires_grad=True)
    labels = torch.tensor([[1.0, 0.0]])
    mask = torch.tensor([[True, True]])
    heads = []
    for w, b in (([1.0, 0.0], 0.0), ([0.0, -1.0], 0.5)):
        head = SentenceClassifier(2)
        with torch.no_grad():
            head.linear1.weight.copy_(torch.tensor([w]))
            head.linear1.bias.fill_(b)
        heads.append(frozen_head(head, head.state_dict()))
    per_head = [
        float(data_loss(sentence_loss_matrix(hd.logits(h), labels, mask)).detach()) for hd in heads
    ]
    loss = parameter_knowledge_loss(h, labels, mask, [(0.25, heads[0]), (0.75, heads[1])])
    assert float(loss.detach()) == pytest.approx(0.25 * per_head[0] + 0.75 * per_head[1])
    mean = parameter_knowledge_loss(h, labels, mask, [(0.25, heads[0]), (0.75, heads[1])], "mean")
    assert float(mean.detach()) == pytest.approx(float(loss.detach()) / 2)
    # ζ = 0 (the client's own portrait distance) contributes nothing
    zero = parameter_knowledge_loss(h, labels, mask, [(0.0, heads[0]), (0.75, heads[1])])
    assert float(zero.detach()) == pytest.approx(0.75 * per_head[1])
    loss.backward()
    assert h.grad.abs().sum() > 0  # θ learns through H ...
    assert all(p.grad is None and not p.requires_grad for hd in heads for p in hd.parameters())


def test_perturbed_head_is_bernoulli_masked_and_seeded():
    state = OrderedDict(weight=torch.ones(1, 4000), bias=torch.tensor([2.0]))
    a = perturb_head(state, 0.3, torch.Generator().manual_seed(1))
    b = perturb_head(state, 0.3, torch.Generator().manual_seed(1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert set(a["weight"].unique().tolist()) <= {0.0, 1.0}
    assert abs(float((a["weight"] == 0).float().mean()) - 0.3) < 0.03
    r = perturb_head(state, 0.3, torch.Generator().manual_seed(1), rescale=True)
    assert torch.allclose(r["weight"], a["weight"] / 0.7)
    assert torch.equal(perturb_head(state, 0.0, torch.Generator())["weight"], state["weight"])


# -- aggregation (eq. 2, Alg. 1 lines 14–15) -------------------------------------------------------
def test_weighted_aggregation_by_hand():
    assert weighted_mean([0.2, 0.6], [1, 3]) == pytest.approx(0.5)  # ε̄ of eq. 2
    avg = weighted_average(
        [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 4.0])}], [3, 1]
    )
    assert torch.allclose(avg["w"], torch.tensor([0.75, 1.0]))
    protos = aggregate_class_prototypes(
        [{0: torch.tensor([1.0]), 1: torch.tensor([2.0])}, {0: torch.tensor([3.0]), 1: None}],
        [1, 3],
    )
    assert float(protos[0]) == pytest.approx(2.5) and float(protos[1]) == pytest.approx(2.0)
    with pytest.raises(InputError):
        weighted_mean([1.0], [0])


def upload(n, eps, q, p0, p1, sp, head_w) -> FedSumUpload:
    state = OrderedDict(
        [
            ("representation.x", torch.tensor([float(n)])),
            ("head.linear1.weight", torch.tensor([[head_w, head_w]])),
            ("head.linear1.bias", torch.tensor([head_w])),
        ]
    )
    return FedSumUpload(
        n, state, eps, q, {0: torch.tensor(p0), 1: torch.tensor(p1)}, torch.tensor(sp), {}
    )


def test_server_round_and_broadcast():
    hp = FedSumHParams(gamma=0.0)
    state = new_server_state(["a", "b", "c"], pdt_init="portraits", seed=0)
    for c, sp in zip("abc", ([0.0, 0.0], [3.0, 4.0], [6.0, 8.0])):  # initial portraits
        state.pdt.update(c, torch.tensor(sp))
    first = fedsum_broadcast(state, "a", total_rounds=5)
    assert (first.round, first.global_significance, first.global_bias_level) == (1, 0.0, 0.0)
    assert first.parameter_knowledge == [] and first.global_class_prototypes == {0: None, 1: None}
    ups = {
        "b": upload(3, 0.2, 2.0, [1.0], [4.0], [0.0, 0.0], 1.0),
        "a": upload(1, 0.6, 4.0, [5.0], [0.0], [0.0, 0.0], 2.0),
    }
    omega = fedsum_server_round(state, ups, hp, seed=0)
    assert float(omega["representation.x"]) == pytest.approx((3 * 3 + 1 * 1) / 4)
    assert state.round == 1
    assert state.global_significance == pytest.approx(0.75 * 0.2 + 0.25 * 0.6)  # eq. 2
    assert state.global_bias_level == pytest.approx(0.75 * 2 + 0.25 * 4)
    assert float(state.global_class_prototypes[0]) == pytest.approx(0.75 * 1 + 0.25 * 5)
    # the new portraits of a and b are now equal; c keeps its initial one
    assert state.pdt.weight("a", "b") == 0.0
    assert state.pdt.weight("c", "a") == pytest.approx(math.tanh(10.0))
    bc = fedsum_broadcast(state, "c", total_rounds=5)
    assert bc.round == 2 and bc.global_significance == state.global_significance
    assert [z for z, _ in bc.parameter_knowledge] == [pytest.approx(math.tanh(10.0))] * 2
    assert torch.equal(bc.parameter_knowledge[0][1]["linear1.weight"], torch.tensor([[2.0, 2.0]]))
    own = fedsum_broadcast(state, "a", total_rounds=5)  # PK_a excludes a's own head
    assert len(own.parameter_knowledge) == 1
    assert float(own.parameter_knowledge[0][1]["linear1.bias"]) == 1.0
    assert fedsum_broadcast(state, "a", 5, "FedSum-depth").parameter_knowledge == []


# -- the client round (Alg. 2) ---------------------------------------------------------------------
HP = FedSumHParams(lr=0.05, local_epochs=2)


def run(variant, broadcast, seed=0, model_seed=0, docs=None):
    model = tiny_model(model_seed)
    docs = docs or synthetic_docs(6)
    batches = make_batches(docs, 2)
    up = fedsum_local_update(model, batches, broadcast, HP, variant, client="c1", seed=seed)
    return model, up


def test_local_round_one_is_deterministic_and_all_prime():
    bc = FedSumBroadcast(round=1, total_rounds=3)
    _, a = run("FedSum", bc)
    _, b = run("FedSum", bc)
    assert all(torch.equal(a.federated_state[k], b.federated_state[k]) for k in a.federated_state)
    assert a.stats["batches"] == 6 and a.stats["normal_batches"] == 0 == a.stats["skipped_batches"]
    assert a.stats["steps"] == 6 and a.stats["L_po"] == 0.0 and a.stats["received_heads"] == 0
    assert a.num_examples == 6
    assert a.semantic_portrait.shape == (32,)
    assert a.mean_bias_level >= 1 and a.mean_significance > 0


def test_normal_batches_are_skipped_late_in_training():
    # ε̄, Q̄ far above any batch: every batch is normal; at t = T the last batch of the last
    # epoch has ρ = 1 and is always skipped
    bc = FedSumBroadcast(round=3, total_rounds=3, global_significance=1e9, global_bias_level=1e9)
    _, up = run("FedSum-depth", bc)
    assert up.stats["normal_batches"] == 6
    assert 1 <= up.stats["skipped_batches"] <= 6
    assert up.stats["steps"] == 6 - up.stats["skipped_batches"]
    assert up.class_prototypes is None and up.semantic_portrait is None  # no breadth
    # the same round without the depth extension trains on every batch
    _, plain = run(FedSumVariant("none", False, False, False), bc)
    assert plain.stats["steps"] == 6 and plain.stats["skipped_batches"] == 0


def test_breadth_round_uses_received_heads_and_prototypes():
    donor = tiny_model(7)
    glob = {0: torch.zeros(16), 1: torch.ones(16)}
    pk = [(0.8, donor.head_state()), (0.1, tiny_model(8).head_state())]
    bc = FedSumBroadcast(
        round=2, total_rounds=3, global_class_prototypes=glob, parameter_knowledge=pk
    )
    _, up = run("FedSum", bc)
    assert up.stats["received_heads"] == 2 and up.stats["L_pm"] > 0
    assert up.stats["L_po"] != 0.0
    assert set(up.class_prototypes) == {0, 1}
    # without parameter knowledge no head is used
    _, up2 = run(FedSumVariant("proto-only", False, True, False), bc)
    assert up2.stats["received_heads"] == 0 and up2.stats["L_pm"] == 0.0


def test_prototype_step_gradient_equals_single_graph_gradient():
    docs = synthetic_docs(5, seed=3)
    batches = make_batches(docs, 2)
    glob = {0: torch.full((16,), 0.1), 1: torch.full((16,), -0.2)}
    a, b = tiny_model(4), tiny_model(4)
    head_before = copy.deepcopy(a.head_state())
    protos, value = prototype_knowledge_step(a, batches, glob, lr=0.5)
    # reference: one graph over all sentences, L_po by eq. 5, plain SGD on θ
    b.eval()
    hs, labels, scores = [], [], []
    for batch in batches:
        h, logits = b.logits(batch)
        hs.append(h[batch.cls_mask])
        labels.append(batch.labels[batch.cls_mask])
        scores.append(torch.sigmoid(logits)[batch.cls_mask].detach())
    ref = compute_prototypes(torch.cat(hs), torch.cat(labels), torch.cat(scores))
    loss = prototype_loss(glob, ref.class_prototypes, ref.prediction_prototypes)
    assert value == pytest.approx(float(loss.detach()), rel=1e-5)
    loss.backward()
    with torch.no_grad():
        for p in b.representation.parameters():
            if p.grad is not None:
                p -= 0.5 * p.grad
    moved = 0
    for (k, pa), (_, pb) in zip(
        a.representation.named_parameters(), b.representation.named_parameters()
    ):
        assert torch.allclose(pa, pb, atol=1e-6), k
        moved += int(not torch.equal(pa, tiny_model(4).representation.get_parameter(k)))
    assert moved > 0
    assert all(torch.equal(a.head_state()[k], head_before[k]) for k in head_before)  # ω untouched
    assert torch.allclose(protos.class_prototypes[1], ref.class_prototypes[1].detach(), atol=1e-6)


def test_no_extension_round_equals_fedavg_baseline():
    from fedrepro.papers.fedsum.baselines import BaselineHParams, baseline_local_update

    docs = synthetic_docs(6)
    bc = FedSumBroadcast(round=2, total_rounds=3, global_significance=1e9, global_bias_level=1e9)
    m1, m2 = tiny_model(2), tiny_model(2)
    up1 = fedsum_local_update(
        m1,
        make_batches(docs, 2),
        bc,
        HP,
        FedSumVariant("none", False, False, False),
        client="c",
        seed=0,
    )
    up2 = baseline_local_update(
        m2,
        "FedAvg",
        make_batches(docs, 2),
        BaselineHParams(lr=HP.lr, local_epochs=HP.local_epochs),
        client="c",
        t=2,
    )
    assert all(
        torch.allclose(up1.federated_state[k], up2.federated_state[k]) for k in up1.federated_state
    )


def test_variants_and_hparams():
    assert VARIANTS["FedSum-depth"].depth and not VARIANTS["FedSum-depth"].needs_prototypes
    assert VARIANTS["FedSum"].prototype_knowledge and VARIANTS["FedSum"].parameter_knowledge
    hp = FedSumHParams.from_config({"lam": 0.6, "gamma": 0.2, "local_epochs": 1})
    assert (hp.lam, hp.gamma, hp.local_epochs) == (0.6, 0.2, 1)
    with pytest.raises(InputError, match="unknown"):
        FedSumHParams.from_config({"lambda": 0.5})
    with pytest.raises(InputError, match="λ"):
        FedSumHParams(lam=1.2)
    with pytest.raises(InputError, match="unknown FedSum variant"):
        fedsum_broadcast(new_server_state(["a"]), "a", 3, "FedSum-wide")


def test_server_state_round_trips_through_a_checkpoint(tmp_path):
    state = new_server_state(["a", "b"], pdt_init="random", seed=3)
    ups = {
        "a": upload(1, 0.6, 4.0, [5.0], [0.0], [1.0, 0.0], 2.0),
        "b": upload(3, 0.2, 2.0, [1.0], [4.0], [0.0, 2.0], 1.0),
    }
    fedsum_server_round(state, ups, FedSumHParams(), seed=0)
    torch.save(state.to_dict(), tmp_path / "state.pt")
    back = type(state).from_dict(torch.load(tmp_path / "state.pt"))
    assert back.round == 1 and back.global_bias_level == state.global_bias_level
    assert torch.equal(back.pdt.table(), state.pdt.table())
    a, b = fedsum_broadcast(state, "a", 3), fedsum_broadcast(back, "a", 3)
    assert a.parameter_knowledge[0][0] == b.parameter_knowledge[0][0]
    assert all(
        torch.equal(a.parameter_knowledge[0][1][k], b.parameter_knowledge[0][1][k])
        for k in a.parameter_knowledge[0][1]
    )


def test_two_federated_rounds_compose():
    """Server → broadcast → client → server for two rounds, three clients, PDT from initial
    portraits (the runner's loop, without Flower)."""
    from fedrepro.papers.fedsum.algorithm import initial_semantic_portrait

    hp = FedSumHParams(lr=0.05, local_epochs=1)
    clients = {c: make_batches(synthetic_docs(2 + i, seed=10 + i), 2) for i, c in enumerate("abc")}
    model = tiny_model(0)
    omega = model.federated_state()
    state = new_server_state(list(clients), seed=1)
    for c, data in clients.items():
        state.pdt.update(c, initial_semantic_portrait(model, data))
    for t in (1, 2):
        ups = {}
        for c, data in clients.items():
            bc = fedsum_broadcast(state, c, total_rounds=2)
            assert len(bc.parameter_knowledge) == (0 if t == 1 else 2)
            ups[c] = fedsum_local_update(
                tiny_model(0), data, bc, hp, "FedSum", client=c, seed=1, global_state=omega
            )
        omega = fedsum_server_round(state, ups, hp, seed=1)
    assert state.round == 2 and ups["a"].stats["received_heads"] == 2
    assert state.global_significance > 0 and state.global_bias_level >= 1
    assert all(state.global_class_prototypes[xi] is not None for xi in (0, 1))
    model.load_federated_state(omega)  # the next global model loads
