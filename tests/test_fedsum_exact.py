"""FedSum (fedrepro.papers.fedsum.algorithm) by hand, edge by edge: Alg. 3's tolerance and
boundaries, the prototype / portrait / PDT corner cases (missing classes, dtypes, devices, the
random PDT's seed and symmetry), the perturbed heads' stream, the n_i/n helpers' validation and
float64 accumulation, and the client round's bookkeeping (skip stream, per-batch L_data / L_pm /
L_po statistics, ε and Q means, epoch indices, timing, defaults).  Numbers are computed here from
the formulas, not from the module (mutation survivors of issue 24)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import math
import types
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

import fedrepro.devices as devices
import fedrepro.papers.fedsum.algorithm as alg
from fedrepro.data.seq2seq import derive_seed
from fedrepro.io import InputError
from fedrepro.papers.fedsum.algorithm import (
    FedSumBroadcast,
    FedSumHParams,
    FedSumServerState,
    FedSumUpload,
    FedSumVariant,
    PortraitDistanceTable,
    aggregate_class_prototypes,
    bias_level,
    client_prototypes,
    compute_prototypes,
    data_partition,
    fedsum_local_update,
    fedsum_server_round,
    frozen_head,
    initial_semantic_portrait,
    local_significance,
    masked_loss_matrix,
    new_server_state,
    perturb_head,
    predicted_classes,
    prototype_knowledge_step,
    prototype_loss,
    prototypes_by_class,
    semantic_portrait,
    skip_probability,
    skip_rng,
    weighted_average,
    weighted_mean,
)
from fedrepro.papers.fedsum.model import BertSumExt, EncodedDocument, SentenceClassifier, collate

H = 8


def tiny(seed: int = 0) -> BertSumExt:
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=40, hidden_size=H, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return BertSumExt(BertModel(cfg, add_pooling_layer=False), head_seed=seed)


def doc(i: int, labels) -> EncodedDocument:
    g = np.random.default_rng(100 + i)
    ids, segs, clss = [], [], []
    for s in range(len(labels)):
        clss.append(len(ids))
        span = [2] + [int(x) for x in g.integers(5, 40, size=3)] + [3]
        ids += span
        segs += [s % 2] * len(span)
    sents = [f"s{s}" for s in range(len(labels))]
    return EncodedDocument(f"d{i}", ids, segs, clss, list(labels), sents)


# batch 1: Q = 1 (per-column key share [.5, .5, 0, 0], λ·total = .5); batch 2: Q = 4
# ([0, 0, .5, .5, .5], λ·total = .75, cumulative .5, 1.0 at column 4)
B1 = collate([doc(0, [1, 0, 0]), doc(1, [0, 1, 0, 0])])
B2 = collate([doc(2, [0, 0, 1]), doc(3, [0, 0, 0, 1, 1])])
B0 = collate([doc(4, [0, 0, 0]), doc(5, [0, 0])])  # no key sentence


def bce(logits, labels, mask):
    """Σ_b Σ_c BCE(σ(x), y) / B at the valid slots: softplus(x) − y·x."""
    per = (F.softplus(logits) - labels * logits) * mask.to(logits.dtype)
    return per.sum() / logits.shape[0]


def centred(seed: int = 1) -> BertSumExt:
    """A tiny model whose head bias puts the 0.5 score threshold between the 7th and 8th of the
    15 valid sentences of B1, B2 (so both predicted classes occur at 0.5)."""
    m = tiny(seed)
    _, _, s = valid(m, [B1, B2])
    x = torch.logit(s.double()).sort().values
    with torch.no_grad():
        m.head.linear1.bias -= float((x[6] + x[7]) / 2)
    return m


def head_logits(h, state):
    return h @ state["linear1.weight"][0] + state["linear1.bias"][0]


def valid(model: BertSumExt, batches):
    model.eval()
    with torch.no_grad():
        hs, ys, ss = [], [], []
        for b in batches:
            h, logits = model.logits(b)
            hs.append(h[b.cls_mask])
            ys.append(b.labels[b.cls_mask])
            ss.append(torch.sigmoid(logits)[b.cls_mask])
    return torch.cat(hs), torch.cat(ys), torch.cat(ss)


def states_close(a, b, atol=1e-6):
    assert list(a) == list(b)
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol), k


# -- settings --------------------------------------------------------------------------------------
def test_hparams_boundaries_and_config_bool():
    FedSumHParams(lam=0.0)
    FedSumHParams(lam=1.0)
    FedSumHParams(gamma=0.0)
    for bad in (dict(gamma=1.0), dict(gamma=1.5), dict(lr=0.0), dict(lr=-1.0),
                dict(local_epochs=0), dict(lam=-0.1)):
        with pytest.raises(InputError):
            FedSumHParams(**bad)
    hp = FedSumHParams(parameter_knowledge_reduction="mean")
    assert hp.parameter_knowledge_reduction == "mean"
    assert FedSumHParams(pdt_init="random").pdt_init == "random"
    hp = FedSumHParams.from_config({"dropout_rescale": True, "lr": "0.25", "local_epochs": 3.0})
    assert hp.dropout_rescale is True and hp.lr == 0.25 and hp.local_epochs == 3
    assert FedSumHParams.from_config({"dropout_rescale": 0}).dropout_rescale is False


# -- Data Partition (Alg. 3) -----------------------------------------------------------------------
def test_masked_loss_matrix_takes_the_loss_dtype():
    ld = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    lm = torch.tensor([[0.5, 0.25]], dtype=torch.float32)
    mm = masked_loss_matrix(ld, lm)
    assert mm.dtype == torch.float32 and mm.tolist() == [[0.5, 0.0]]


def test_bias_level_validation_and_boundaries():
    for bad in (torch.ones(3), torch.zeros(2, 0), torch.ones(2, 2, 2)):
        with pytest.raises(InputError):
            bias_level(bad, 0.5)
    assert bias_level(torch.tensor([[1.0], [0.0]]), 0.5) == 1  # m = 1 is valid
    assert bias_level(torch.tensor([[0.0, 1.0, 1.0]]), 0.0) == 1  # λ = 0: the first column
    with pytest.raises(InputError):
        bias_level(torch.ones(1, 2), -0.01)


def test_bias_level_tolerance_is_1e9_absolute_below_one_relative_above():
    # B = 4, m = 2, one key sentence per column: per-column share [.25, .25], total .5
    ld = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    # threshold λ·.5 = .25 + 0.75e-9: within 1e-9 of .25 -> Q = 1
    assert bias_level(ld, 0.5 + 1.5e-9) == 1
    # threshold .25 + 1.5e-9: beyond the tolerance -> Q = 2
    assert bias_level(ld, 0.5 + 3e-9) == 2
    # threshold − tol lands exactly on .25: "≥" counts it
    lam = 0.500000002
    assert lam * 0.5 - 1e-9 == 0.25
    assert bias_level(ld, lam) == 1
    # one document with 10 key sentences: threshold λ·10 ≈ 5 > 1, tolerance 1e-9·5
    ld10 = torch.tensor([[1.0] * 10 + [0.0] * 10])
    assert bias_level(ld10, 0.5 + 2e-10) == 5  # threshold 5 + 2e-9, within 5e-9 of 5
    assert bias_level(ld10, 0.5 + 1e-9) == 6  # threshold 5 + 1e-8: beyond


def test_data_partition_is_strict_in_significance():
    ld = torch.tensor([[1.0, 0.0, 1.0]])
    lm = torch.tensor([[0.5, 0.75, 0.25]])
    eps = local_significance(ld, lm)
    assert eps == 0.75
    assert not data_partition(ld, lm, 0.5, global_significance=0.75, global_bias_level=9).normal
    assert data_partition(ld, lm, 0.5, global_significance=0.7500001, global_bias_level=9).normal


def test_skip_probability_names_the_bad_index():
    with pytest.raises(InputError, match="^skip probability: round t = 4 outside 1..3$"):
        skip_probability(4, 3, 1, 1, 1, 1)
    with pytest.raises(InputError, match="^skip probability: epoch e = 0 outside 1..2$"):
        skip_probability(1, 3, 0, 2, 1, 1)
    with pytest.raises(InputError, match="^skip probability: batch j = 6 outside 1..5$"):
        skip_probability(1, 3, 1, 2, 6, 5)


def test_skip_rng_stream_is_pinned():
    want = np.random.default_rng(derive_seed(7, "fedsum-skip", "c2", 3)).random(5)
    assert skip_rng(7, "c2", 3).random(5).tolist() == want.tolist()


# -- prototypes and L_po ---------------------------------------------------------------------------
def test_prototypes_by_class_validates_shapes():
    with pytest.raises(InputError):
        prototypes_by_class(torch.ones(3, 2, 1), torch.zeros(3, dtype=torch.long))
    with pytest.raises(InputError):
        prototypes_by_class(torch.ones(3, 2), torch.zeros(2, dtype=torch.long))


def test_predicted_classes_default_threshold_is_strict_one_half():
    s = torch.tensor([0.5, 0.5000001, 0.49, 0.9])
    assert predicted_classes(s).tolist() == [0, 1, 0, 1]
    vecs = torch.tensor([[1.0], [3.0], [5.0], [7.0]])
    p = compute_prototypes(vecs, torch.tensor([0, 0, 1, 1]), s, threshold=0.45)
    # threshold .45: predicted 1, 1, 1, 1 -> no class 0; mean of class 1 = 4
    assert p.prediction_counts == {0: 0, 1: 4} and p.prediction_prototypes[0] is None
    assert float(p.prediction_prototypes[1]) == 4.0


def test_prototype_loss_dtypes_and_empty_case():
    g = {0: torch.tensor([1.0, 2.0], dtype=torch.float64), 1: None}
    c = {0: torch.tensor([4.0, 6.0]), 1: None}
    loss = prototype_loss(g, c, {0: None, 1: None})
    assert loss.dtype == torch.float32 and float(loss) == 5.0  # ‖[−3, −4]‖
    empty = prototype_loss({0: None, 1: None}, {0: None, 1: None}, {0: None, 1: None})
    assert empty.dtype == torch.float32 and empty.shape == () and float(empty) == 0.0
    one = prototype_loss({0: None, 1: None}, {0: None, 1: None},
                         {0: None, 1: torch.tensor([1.0], dtype=torch.float64)})
    assert one.dtype == torch.float64 and one.shape == () and float(one) == 0.0


def test_semantic_portrait_missing_classes_and_device():
    assert semantic_portrait({0: None, 1: None}, 3).tolist() == [0.0] * 6
    sp = semantic_portrait({0: torch.ones(3, device="meta"), 1: None}, 3)
    assert sp.device.type == "meta" and sp.shape == (6,)
    sp = semantic_portrait({0: None, 1: torch.tensor([1.0, 2.0], dtype=torch.float64)}, 2)
    assert sp.dtype == torch.float32 and sp.tolist() == [0.0, 0.0, 1.0, 2.0]


# -- PDT -------------------------------------------------------------------------------------------
def test_random_pdt_symmetric_positive_seeded_and_mixed():
    clients = ["a", "b", "c", "d"]
    u = np.random.default_rng(0).random((4, 4))
    t = PortraitDistanceTable(clients, init="random")  # default seed 0
    for i in range(4):
        for j in range(i + 1, 4):
            a, b = clients[i], clients[j]
            assert t.weight(a, b) == t.weight(b, a) == float(u[i, j]) > 0
    assert t.weight("c", "c") == 0.0
    # one portrait known: still the random entry; both known: tanh of the distance
    t.update("a", torch.tensor([0.0, 0.0]))
    assert t.weight("a", "b") == float(u[0, 1])
    t.update("b", torch.tensor([0.3, 0.4]))
    assert t.weight("a", "b") == pytest.approx(math.tanh(0.5))
    # portraits mode names the missing client
    p = PortraitDistanceTable(["a", "b"])
    p.update("a", torch.zeros(2))
    with pytest.raises(InputError, match=r"client\(s\) \['b'\] yet"):
        p.weight("a", "b")


def test_new_server_state_pdt_seed_and_checkpoint_round_trip(tmp_path):
    s0 = new_server_state(["a", "b", "c"], pdt_init="random")
    assert s0.pdt.seed == derive_seed(0, "pdt")
    s5 = new_server_state(["a", "b", "c"], pdt_init="random", seed=5)
    assert s5.pdt.seed == derive_seed(5, "pdt")
    u = np.random.default_rng(derive_seed(5, "pdt")).random((3, 3))
    assert s5.pdt.weight("c", "a") == float(u[0, 2])
    s5.global_significance = 0.375
    s5.global_bias_level = 2.5
    torch.save(s5.to_dict(), tmp_path / "s.pt")
    back = FedSumServerState.from_dict(torch.load(tmp_path / "s.pt"))
    assert back.pdt.seed == s5.pdt.seed
    assert back.pdt.weight("b", "c") == s5.pdt.weight("b", "c") == float(u[1, 2])
    assert back.global_significance == 0.375 and back.global_bias_level == 2.5


# -- perturbed heads -------------------------------------------------------------------------------
def test_perturb_head_validation_dtype_and_float64_stream():
    w = OrderedDict([("w", torch.arange(1.0, 13.0).reshape(3, 4)), ("b", torch.tensor([2.0]))])
    for bad in (1.0, 1.5):
        with pytest.raises(InputError):
            perturb_head(w, bad, torch.Generator())
    out = perturb_head(w, 0.3, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    for k in ("b", "w"):  # sorted key order
        keep = torch.bernoulli(torch.full(w[k].shape, 0.7, dtype=torch.float64), generator=g)
        assert out[k].dtype == torch.float32
        assert torch.equal(out[k], w[k] * keep.float())


def test_server_round_perturbation_stream_and_rescale():
    """ω̃_c = Dropout(ω_c, γ) drawn from Generator(derive_seed(seed, "fedsum-perturb", t, c)),
    rescaled by 1/(1−γ) with ``dropout_rescale``; the default seed is 0."""
    def up(n):
        st = OrderedDict([("representation.x", torch.tensor([float(n)])),
                          ("head.linear1.weight", torch.arange(1.0, 17.0).reshape(1, 16)),
                          ("head.linear1.bias", torch.tensor([3.0]))])
        return FedSumUpload(n, st, 0.1, 1.0, None, None, {})

    hp = FedSumHParams(gamma=0.4, dropout_rescale=True)

    def expected(seed, t, c):
        g = torch.Generator().manual_seed(derive_seed(seed, "fedsum-perturb", t, c))
        out = {}
        for k, v in (("linear1.bias", torch.tensor([3.0])),
                     ("linear1.weight", torch.arange(1.0, 17.0).reshape(1, 16))):
            keep = torch.bernoulli(torch.full(v.shape, 0.6, dtype=torch.float64), generator=g)
            out[k] = v * keep.float() / 0.6
        return out

    state = new_server_state(["a", "b"], pdt_init="random")
    torch.manual_seed(123)  # the global RNG plays no part
    fedsum_server_round(state, {"b": up(2), "a": up(1)}, hp)  # default seed 0
    first = copy.deepcopy(state.perturbed_heads)
    torch.manual_seed(456)
    fedsum_server_round(state, {"a": up(1), "b": up(2)}, hp, seed=0)  # round 2
    for c in "ab":
        for k, v in expected(0, 1, c).items():
            assert torch.allclose(first[c][k], v), (c, k)
        for k, v in expected(0, 2, c).items():
            assert torch.allclose(state.perturbed_heads[c][k], v), (c, k)
    s9 = new_server_state(["a", "b"], pdt_init="random")
    fedsum_server_round(s9, {"a": up(1), "b": up(2)}, hp, seed=9)
    for k, v in expected(9, 1, "b").items():
        assert torch.allclose(s9.perturbed_heads["b"][k], v)


def test_frozen_head_names_itself_in_errors():
    with pytest.raises(InputError, match=r"^received head \(ω̃\) state keys differ"):
        frozen_head(SentenceClassifier(4), {"linear1.weight": torch.zeros(1, 4)})


# -- aggregation helpers ---------------------------------------------------------------------------
def test_normalised_weights_validation():
    assert weighted_mean([1.0, 5.0], [0, 2]) == 5.0  # a zero weight is allowed
    assert weighted_mean([1.0, 5.0], [0.5, 1.5]) == 4.0  # fractional weights too
    with pytest.raises(InputError):
        weighted_mean([1.0, 5.0], [2, -1])
    with pytest.raises(InputError):
        weighted_mean([1.0], [1, 2])


def test_weighted_average_validation_order_and_float64():
    a = OrderedDict([("x", torch.tensor([1.0])), ("y", torch.tensor([2.0, 4.0]))])
    b = OrderedDict([("y", torch.tensor([6.0, 0.0])), ("x", torch.tensor([5.0]))])
    out = weighted_average([a, b], [3, 1])
    assert list(out) == ["x", "y"]  # the first state's key order
    assert out["x"].tolist() == [2.0] and out["y"].tolist() == [3.0, 3.0]
    single = weighted_average([a], [2])
    assert list(single) == ["x", "y"] and single["y"].tolist() == [2.0, 4.0]
    with pytest.raises(InputError):
        weighted_average([a, b], [1])
    with pytest.raises(InputError):
        weighted_average([a, OrderedDict(x=torch.tensor([1.0]))], [1, 1])
    # float64 states: accumulated in float64, not rounded to float32
    d = OrderedDict(x=torch.tensor([1.0 + 1e-12], dtype=torch.float64))
    avg = weighted_average([d, d], [1, 1])
    assert avg["x"].dtype == torch.float64 and float(avg["x"]) == 1.0 + 1e-12
    # the output takes the first state's dtype
    mixed = weighted_average([OrderedDict(x=torch.tensor([1.0], dtype=torch.float64)),
                              OrderedDict(x=torch.tensor([3.0]))], [1, 1])
    assert mixed["x"].dtype == torch.float64


def test_aggregate_class_prototypes_missing_class_and_precision():
    out = aggregate_class_prototypes([{0: None, 1: torch.tensor([2.0])},
                                      {0: None, 1: torch.tensor([6.0])}], [1, 3])
    assert out[0] is None and float(out[1]) == 5.0
    ps = [torch.tensor([0.1, 0.7, 1 / 3, 2.5, -1.3]) * s for s in (1.0, 1.1, 0.9)]
    got = aggregate_class_prototypes([{0: p, 1: None} for p in ps], [1, 1, 1])
    acc = sum(p.double() / 3 for p in ps)  # float64 sum, rounded once
    assert got[1] is None and torch.equal(got[0], acc.float())


# -- client prototypes and the L_po step -----------------------------------------------------------
def test_client_prototypes_threshold_default_and_passed():
    m = centred(1)
    _, _, s = valid(m, [B1, B2])
    assert 0 < int((s > 0.5).sum()) < len(s)
    assert client_prototypes(m, [B1, B2]).prediction_counts[1] == int((s > 0.5).sum())
    thr = float(s.sort().values[2])  # strictly between predicted-count changes
    got = client_prototypes(m, [B1, B2], thr)
    assert got.prediction_counts[1] == int((s > thr).sum()) != int((s > 0.5).sum())


def test_initial_portrait_with_no_key_sentence():
    m = tiny(1)
    sp = initial_semantic_portrait(m, [B0])
    hv, _, _ = valid(m, [B0])
    assert sp.shape == (2 * H,)
    assert torch.allclose(sp[:H], hv.mean(0), atol=1e-6) and sp[H:].tolist() == [0.0] * H


def _single_graph_step(model, batches, glob, lr, thr):
    """Reference: one graph over every valid sentence, eq. 5 at threshold ``thr``, SGD on θ."""
    model.eval()
    hs, ys, ss = [], [], []
    for b in batches:
        h, logits = model.logits(b)
        hs.append(h[b.cls_mask])
        ys.append(b.labels[b.cls_mask])
        ss.append(torch.sigmoid(logits)[b.cls_mask].detach())
    h, y, s = torch.cat(hs), torch.cat(ys), torch.cat(ss)
    pred = (s > thr)
    c0, c1 = h[y == 0].mean(0), h[y == 1].mean(0)
    p0, p1 = h[~pred].mean(0), h[pred].mean(0)
    loss = (torch.sqrt(((glob[0] - c0) ** 2).sum()) + torch.sqrt(((glob[1] - c1) ** 2).sum())
            - torch.sqrt(((p1 - p0) ** 2).sum()))
    loss.backward()
    with torch.no_grad():
        for p in model.representation.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    return float(loss.detach()), int(pred.sum())


def test_prototype_step_threshold_default_and_passed():
    glob = {0: torch.linspace(-0.3, 0.4, H), 1: torch.linspace(0.5, -0.2, H)}
    _, _, s = valid(centred(1), [B1, B2])
    thr = float(s.sort().values[2])
    for kwargs, t in (({}, 0.5), ({"threshold": thr}, thr)):
        a, b = centred(1), centred(1)
        protos, value = prototype_knowledge_step(a, [B1, B2], glob, 0.7, **kwargs)
        ref, n1 = _single_graph_step(b, [B1, B2], glob, 0.7, t)
        assert protos.prediction_counts[1] == n1
        assert value == pytest.approx(ref, rel=1e-5)
        states_close(a.representation_state(), b.representation_state(), atol=1e-5)


def test_prototype_step_without_any_term_is_a_no_op():
    m = tiny(1)
    before = m.federated_state()
    protos, value = prototype_knowledge_step(m, [B1, B2], {0: None, 1: None}, 0.7, threshold=1.0)
    assert value == 0.0 and protos.prediction_prototypes[1] is None
    states_close(m.federated_state(), before, atol=0)


# -- the client round (Alg. 2) ---------------------------------------------------------------------
def test_local_round_skip_stream_stats_and_means(monkeypatch):
    """Depth only, t = T = 2, E = 1, τ = 2, every batch normal: ρ = [.5, 1]; ρ̂ from
    default_rng(derive_seed(0, "fedsum-skip", client, 2)); batch 2 is always skipped, the client
    is picked so that batch 1 is not.  Default seed 0."""
    client = next(c for c in (f"c{i}" for i in range(100))
                  if np.random.default_rng(derive_seed(0, "fedsum-skip", c, 2)).random() > 0.5)
    draws = np.random.default_rng(derive_seed(0, "fedsum-skip", client, 2)).random(2)
    calls = []
    real = alg.skip_decision

    def spy(rng, rho, normal):
        out = real(rng, rho, normal)
        calls.append((rho, normal, *out))
        return out

    monkeypatch.setattr(alg, "skip_decision", spy)
    bc = FedSumBroadcast(round=2, total_rounds=2, global_significance=1e9, global_bias_level=1e9)
    hp = FedSumHParams(lr=0.3, local_epochs=1)
    m = tiny(2)
    seeds = []  # the round's dropout seed (the tiny model has no dropout: spied)
    real_seed = torch.manual_seed
    monkeypatch.setattr(torch, "manual_seed", lambda s: (seeds.append(s), real_seed(s))[1])
    up = fedsum_local_update(m, [B1, B2], bc, hp, "FedSum-depth", client=client)
    assert seeds == [derive_seed(0, "fedsum-local", client, 2)]
    assert calls == [(0.5, True, float(draws[0]), False), (1.0, True, float(draws[1]), True)]
    assert up.stats["batches"] == 2 and up.stats["normal_batches"] == 2
    assert up.stats["skipped_batches"] == 1 and up.stats["steps"] == 1
    assert up.stats["L_po"] == 0.0 and up.stats["L_pm"] == 0.0 and up.class_prototypes is None
    # reference: one SGD step on batch 1's L_data, batch 2 only measured
    monkeypatch.setattr(torch, "manual_seed", real_seed)
    ref = tiny(2)
    ref.train()
    h, logits = ref.logits(B1)
    loss1 = bce(logits, B1.labels, B1.cls_mask)
    per1 = (F.softplus(logits) - B1.labels * logits) * B1.cls_mask
    eps1 = float((per1 * B1.labels).sum().detach() / 2)
    loss1.backward()
    with torch.no_grad():
        for p in ref.parameters():
            if p.grad is not None:
                p -= 0.3 * p.grad
        _, lg2 = ref.logits(B2)
        eps2 = float(((F.softplus(lg2) - B2.labels * lg2) * B2.cls_mask * B2.labels).sum() / 2)
    assert up.stats["L_data"] == pytest.approx(float(loss1.detach()) / 2, rel=1e-5)  # (L_1 + 0) / 2
    assert up.mean_significance == pytest.approx((eps1 + eps2) / 2, rel=1e-5)
    assert up.mean_bias_level == (1 + 4) / 2
    assert up.num_examples == 4
    states_close(up.federated_state, ref.federated_state(), atol=1e-6)


def test_local_round_parameter_knowledge_reduction_and_stats():
    heads = [OrderedDict([("linear1.weight", torch.linspace(-1, 1, H).reshape(1, H)),
                          ("linear1.bias", torch.tensor([0.3]))]),
             OrderedDict([("linear1.weight", torch.linspace(0.8, -0.4, H).reshape(1, H)),
                          ("linear1.bias", torch.tensor([-0.2]))])]
    bc = FedSumBroadcast(round=2, total_rounds=3, parameter_knowledge=list(zip((0.25, 0.9), heads)))
    ref = tiny(3)
    with torch.no_grad():
        h, logits = ref.logits(B1)
        l_data = float(bce(logits, B1.labels, B1.cls_mask))
        l_p = [float(bce(head_logits(h, s), B1.labels, B1.cls_mask)) for s in heads]
    variant = FedSumVariant("pm", False, False, True)
    for red, want in (("sum", 0.25 * l_p[0] + 0.9 * l_p[1]),
                      ("mean", (0.25 * l_p[0] + 0.9 * l_p[1]) / 2)):
        hp = FedSumHParams(lr=0.1, local_epochs=1, parameter_knowledge_reduction=red)
        up = fedsum_local_update(tiny(3), [B1], bc, hp, variant, client="a", seed=4)
        assert up.stats["received_heads"] == 2
        assert up.stats["L_pm"] == pytest.approx(want, rel=1e-5)
        assert up.stats["L_data"] == pytest.approx(l_data, rel=1e-5)
        assert up.stats["L_po"] == 0.0


def test_local_round_prototype_step_threshold_and_timing(monkeypatch):
    """Depth + L_po, t = T = 2, one batch (ρ = 1, normal -> skipped): the model is untouched by
    the batch loop, so L_po is eq. 5 on the initial model at ``prediction_threshold``.  The step
    timer covers each batch plus the L_po step (t ≥ 2 only)."""
    clock = iter(range(1000))
    monkeypatch.setattr(devices, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    ref = tiny(4)
    hv, y, s = valid(ref, [B1])
    thr = float(s.sort().values[1])
    glob = {0: torch.linspace(-0.3, 0.4, H), 1: torch.linspace(0.5, -0.2, H)}
    pred = s > thr
    c0, c1, p0, p1 = hv[y == 0].mean(0), hv[y == 1].mean(0), hv[~pred].mean(0), hv[pred].mean(0)
    want = float((glob[0] - c0).norm() + (glob[1] - c1).norm() - (p1 - p0).norm())
    variant = FedSumVariant("po", True, True, False)
    hp = FedSumHParams(lr=0.1, local_epochs=1, prediction_threshold=thr)
    bc = FedSumBroadcast(round=2, total_rounds=2, global_significance=1e9, global_bias_level=1e9,
                         global_class_prototypes=glob)
    up = fedsum_local_update(tiny(4), [B1], bc, hp, variant, client="a", seed=0)
    assert up.stats["skipped_batches"] == 1 and up.stats["steps"] == 0
    assert up.stats["L_data"] == 0.0
    assert up.stats["L_po"] == pytest.approx(want, rel=1e-5)
    assert torch.allclose(up.semantic_portrait, torch.cat([c0, c1]), atol=1e-6)
    assert up.stats["seconds_steps"] == 2  # one batch + the L_po step
    bc1 = FedSumBroadcast(round=1, total_rounds=2, global_class_prototypes=glob)
    up1 = fedsum_local_update(tiny(4), [B1], bc1, hp, variant, client="a", seed=0)
    assert up1.stats["seconds_steps"] == 1 and up1.stats["L_po"] == 0.0  # no L_po step in round 1


def test_local_round_portrait_without_key_sentences():
    up = fedsum_local_update(tiny(5), [B0], FedSumBroadcast(1, 2), FedSumHParams(local_epochs=1),
                             "FedSum", client="a")
    assert up.class_prototypes[1] is None
    assert up.semantic_portrait.shape == (2 * H,) and up.semantic_portrait[H:].tolist() == [0.0] * H


def test_local_round_epoch_indices_and_default_variant():
    seen = []

    def batches(e):
        seen.append(e)
        return [B1] if e == 1 else [B2, B1]

    hp = FedSumHParams(lr=0.1, local_epochs=2)
    up = fedsum_local_update(tiny(6), batches, FedSumBroadcast(1, 2), hp, client="a", seed=0)
    assert seen == [1, 2] and up.stats["batches"] == 3 and up.num_examples == 4
    assert up.mean_bias_level == pytest.approx((1 + 4 + 1) / 3)
    assert up.class_prototypes is not None  # default variant "FedSum": breadth on
    ref = fedsum_local_update(tiny(6), batches, FedSumBroadcast(1, 2), hp, "FedSum", client="a",
                              seed=0)
    states_close(up.federated_state, ref.federated_state, atol=0)
