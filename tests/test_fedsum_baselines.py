"""FedSum's baselines (fedrepro.papers.fedsum.baselines): each method's defining step against a
hand computation, and one client round of each on a tiny BERTSUM."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random
from collections import OrderedDict

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from fedrepro.papers.fedsum.baselines import (
    BASELINES,
    BaselineHParams,
    DaisyChain,
    baseline_local_update,
    derangement,
    fednova_aggregate,
    fedproto_aggregate,
    fedproto_regularizer,
    fedprox_proximal_term,
    scaffold_client_control_update,
    scaffold_correct_gradients,
    scaffold_server_update,
    zeros_like_state,
)
from fedrepro.io import InputError
from fedrepro.papers.fedsum.model import BertSumExt, EncodedDocument, make_batches


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


def batches(n: int = 4, seed: int = 0):
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        ns = rng.randint(2, 4)
        ids, segs, clss = [], [], []
        for s in range(ns):
            clss.append(len(ids))
            span = [2] + [rng.randint(5, 39) for _ in range(3)] + [3]
            ids += span
            segs += [s % 2] * len(span)
        labels = [int(s == 0) for s in range(ns)]
        docs.append(EncodedDocument(f"d{i}", ids, segs, clss, labels, [f"s{s}" for s in range(ns)]))
    return make_batches(docs, 2)


HP = BaselineHParams(lr=0.05, local_epochs=1)


# -- FedProx ---------------------------------------------------------------------------------------
def test_fedprox_proximal_term_by_hand():
    w = {
        "a": torch.tensor([1.0, 2.0], requires_grad=True),
        "b": torch.tensor([0.5], requires_grad=True),
    }
    g = {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.5]), "unused": torch.zeros(1)}
    term = fedprox_proximal_term(w, g, mu=2.0)
    assert float(term.detach()) == pytest.approx(0.5 * 2.0 * (1 + 4 + 1))
    term.backward()  # ∇ = μ (w − w_g)
    assert torch.allclose(w["a"].grad, torch.tensor([2.0, 4.0]))
    assert torch.allclose(w["b"].grad, torch.tensor([-2.0]))
    with pytest.raises(InputError, match="lacks"):
        fedprox_proximal_term(w, {"a": g["a"]}, 1.0)


# -- SCAFFOLD --------------------------------------------------------------------------------------
def test_scaffold_gradient_correction_and_control_update_by_hand():
    p = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    p.grad = torch.tensor([0.5, -0.5])
    scaffold_correct_gradients(
        {"w": p}, {"w": torch.tensor([0.2, 0.2])}, {"w": torch.tensor([1.0, 0.0])}
    )
    assert torch.allclose(p.grad, torch.tensor([0.5 + 0.2 - 1.0, -0.5 + 0.2]))
    # option II: c_i⁺ = c_i − c + (x − y)/(Kη) = 1 − 0.5 + (1 − 0.6)/(4·0.1) = 1.5
    new, delta = scaffold_client_control_update(
        {"w": torch.tensor([1.0])},
        {"w": torch.tensor([0.5])},
        {"w": torch.tensor([1.0])},
        {"w": torch.tensor([0.6])},
        num_steps=4,
        lr=0.1,
    )
    assert float(new["w"]) == pytest.approx(1.5) and float(delta["w"]) == pytest.approx(0.5)
    # server: x += mean(y_i − x) = 1 + mean(−0.4, 0.2); c += (1/N)·ΣΔc = 0.5 + 0.4/10
    x, c = scaffold_server_update(
        {"w": torch.tensor([1.0])},
        {"w": torch.tensor([0.5])},
        [{"w": torch.tensor([0.6])}, {"w": torch.tensor([1.2])}],
        [{"w": torch.tensor([0.5])}, {"w": torch.tensor([-0.1])}],
        num_clients_total=10,
    )
    assert float(x["w"]) == pytest.approx(0.9) and float(c["w"]) == pytest.approx(0.54)
    x, _ = scaffold_server_update(
        {"w": torch.tensor([1.0])},
        {"w": torch.tensor([0.5])},
        [{"w": torch.tensor([0.6])}, {"w": torch.tensor([1.2])}],
        [{"w": torch.tensor([0.5])}, {"w": torch.tensor([-0.1])}],
        num_clients_total=10,
        weights=[3, 1],
    )
    assert float(x["w"]) == pytest.approx(1 + 0.75 * -0.4 + 0.25 * 0.2)


def test_scaffold_option_two_equals_mean_raw_gradient():
    """With corrected SGD steps, c_i⁺ of option II is the mean of the raw local gradients."""
    a = torch.tensor([3.0, -1.0])
    x = torch.tensor([0.0, 0.0])
    c, ci = torch.tensor([0.3, 0.1]), torch.tensor([-0.2, 0.4])
    y, lr, raw = x.clone(), 0.1, []
    for _ in range(5):  # f(y) = ½‖y − a‖², g = y − a
        g = y - a
        raw.append(g)
        y = y - lr * (g - ci + c)
    new, _ = scaffold_client_control_update({"w": ci}, {"w": c}, {"w": x}, {"w": y}, 5, lr)
    assert torch.allclose(new["w"], torch.stack(raw).mean(0), atol=1e-6)


# -- FedNova ---------------------------------------------------------------------------------------
def test_fednova_normalized_averaging_by_hand():
    x = {"w": torch.tensor([0.0])}
    ys = [{"w": torch.tensor([-2.0])}, {"w": torch.tensor([-3.0])}]
    # p = (.75, .25); d = ((0 − (−2))/2, 3/6) = (1, .5); τ_eff = .75·2 + .25·6 = 3
    # x ← 0 − 3 · (.75·1 + .25·.5) = −2.625 (FedAvg would give −2.25)
    out = fednova_aggregate(x, ys, local_steps=[2, 6], num_examples=[3, 1])
    assert float(out["w"]) == pytest.approx(-2.625)
    same = fednova_aggregate(x, ys, local_steps=[4, 4], num_examples=[3, 1])
    assert float(same["w"]) == pytest.approx(0.75 * -2 + 0.25 * -3)  # equal τ: FedAvg
    with pytest.raises(InputError):
        fednova_aggregate(x, ys, local_steps=[0, 4], num_examples=[3, 1])


# -- FedProto --------------------------------------------------------------------------------------
def test_fedproto_alignment_term_and_aggregation_by_hand():
    h = torch.tensor([[[1.0, 1.0], [3.0, 3.0], [9.0, 9.0]]], requires_grad=True)
    labels = torch.tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, False]])  # the third slot is padding
    glob = {0: torch.tensor([0.0, 1.0]), 1: torch.tensor([3.0, 1.0])}
    # squared errors 1, 0 | 0, 4 → mean 5/4, λ = 2
    term = fedproto_regularizer(h, labels, mask, glob, weight=2.0)
    assert float(term.detach()) == pytest.approx(2.5)
    term.backward()
    assert torch.all(h.grad[0, 2] == 0)
    only0 = fedproto_regularizer(h.detach(), labels, mask, {0: glob[0], 1: None})
    assert float(only0) == pytest.approx(0.5)  # (1 + 0)/2
    assert float(fedproto_regularizer(h.detach(), labels, mask, {0: None, 1: None})) == 0.0
    protos = fedproto_aggregate(
        [{0: torch.tensor([1.0]), 1: torch.tensor([2.0])}, {0: torch.tensor([4.0]), 1: None}],
        [{0: 2, 1: 1}, {0: 1, 1: 0}],
    )
    assert float(protos[0]) == pytest.approx((2 * 1 + 1 * 4) / 3)
    assert float(protos[1]) == pytest.approx(2.0)


# -- FedDC -----------------------------------------------------------------------------------------
def test_derangement_and_daisy_chain_permutation():
    ids = [f"c{i}" for i in range(6)]
    for seed in range(20):
        perm = derangement(ids, np.random.default_rng(seed))
        assert sorted(perm) == ids and all(a != b for a, b in zip(ids, perm))
    assert derangement(["solo"], np.random.default_rng(0)) == ["solo"]
    dc = DaisyChain(daisy_period=1, aggregation_period=3, seed=5)
    p1 = dc.permutation(1, ["c2", "c0", "c1", "c3"])
    assert p1 == DaisyChain(1, 3, seed=5).permutation(1, ["c0", "c1", "c2", "c3"])  # seeded
    assert sorted(p1) == sorted(p1.values()) == ["c0", "c1", "c2", "c3"]
    assert all(r != s for r, s in p1.items())
    assert any(dc.permutation(t, ids) != dc.permutation(1, ids) for t in range(2, 6))
    assert [dc.action(t) for t in range(1, 7)] == ["permute", "permute", "aggregate"] * 2
    assert [DaisyChain(2, 5).action(t) for t in range(1, 6)] == [
        "keep",
        "permute",
        "keep",
        "permute",
        "aggregate",
    ]


def test_daisy_chain_server_rounds():
    init = OrderedDict(w=torch.tensor([0.0]))
    dc = DaisyChain(1, 2, seed=0, global_state=init)
    states = {c: OrderedDict(w=torch.tensor([float(i + 1)])) for i, c in enumerate("abc")}
    n = {"a": 1, "b": 1, "c": 2}
    action, avg = dc.server_round(1, states, n)
    assert action == "permute" and float(avg["w"]) == pytest.approx((1 + 2 + 2 * 3) / 4)
    perm = dc.permutation(1, ["a", "b", "c"])
    for receiver, sender in perm.items():
        assert torch.equal(dc.model_for(receiver)["w"], states[sender]["w"])
    assert torch.equal(dc.model_for("z")["w"], init["w"])  # holds nothing: the last aggregate
    action, avg = dc.server_round(2, states, n)
    assert action == "aggregate" and dc.held == {}
    assert torch.equal(dc.model_for("a")["w"], avg["w"])
    with pytest.raises(InputError, match="no model"):
        DaisyChain(1, 2).model_for("a")


# -- one client round of each method ---------------------------------------------------------------
def same(a, b) -> bool:
    return all(torch.allclose(a[k], b[k]) for k in a)


def test_each_baseline_runs_one_round():
    data = batches()
    glob = tiny_model(1).federated_state()
    ups = {}
    for name in BASELINES:
        kw = {}
        if name == "SCAFFOLD":
            kw = {"server_control": zeros_like_state(glob)}
        ups[name] = baseline_local_update(
            tiny_model(0), name, data, HP, client="c", t=1, global_state=glob, **kw
        )
        assert ups[name].local_steps == 2 and ups[name].num_examples == 4
    # receiving methods start from the global model; Separate and FedProto from their own
    assert same(ups["FedAvg"].federated_state, ups["FedNova"].federated_state)
    assert same(ups["FedAvg"].federated_state, ups["FedDC"].federated_state)
    assert same(ups["Separate"].federated_state, ups["FedProto"].federated_state)  # round 1
    assert not same(ups["FedAvg"].federated_state, ups["Separate"].federated_state)
    # FedProx's proximal term pulls toward the global model; with μ = 0 it is FedAvg
    prox0 = baseline_local_update(
        tiny_model(0), "FedProx", data, HP, client="c", t=1, global_state=glob, mu=0.0
    )
    assert same(prox0.federated_state, ups["FedAvg"].federated_state)

    def dist(state):
        return sum(float((state[k] - glob[k]).pow(2).sum()) for k in glob)

    far = baseline_local_update(
        tiny_model(0), "FedProx", data, HP, client="c", t=1, global_state=glob, mu=10.0
    )  # ημ = 0.5 < 1
    assert dist(far.federated_state) < dist(ups["FedAvg"].federated_state)
    # SCAFFOLD with c = c_i = 0 is FedAvg's trajectory; c_i⁺ = (x − y)/(Kη)
    sc = ups["SCAFFOLD"]
    assert same(sc.federated_state, ups["FedAvg"].federated_state)
    k = "head.linear1.bias"
    expected = (glob[k] - sc.federated_state[k]) / (2 * HP.lr)
    assert torch.allclose(sc.client_control[k], expected, atol=1e-5)
    assert torch.allclose(sc.control_delta[k], expected, atol=1e-5)
    # FedProto uploads prototypes and counts; its regulariser changes the round once C̄ exists
    fp = ups["FedProto"]
    assert set(fp.class_prototypes) == {0, 1} and fp.class_counts[1] == 4
    fp2 = baseline_local_update(
        tiny_model(0), "FedProto", data, HP, client="c", t=2, global_prototypes=fp.class_prototypes
    )
    assert fp2.stats["L_extra"] > 0
    with pytest.raises(InputError, match="control variate"):
        baseline_local_update(tiny_model(0), "SCAFFOLD", data, HP, client="c", t=1)


def test_hparams_from_config():
    hp = BaselineHParams.from_config({"mu": 0.01, "aggregation_period": 3})
    assert hp.mu == 0.01 and hp.aggregation_period == 3
    with pytest.raises(InputError, match="unknown"):
        BaselineHParams.from_config({"proximal_mu": 1})
    with pytest.raises(InputError, match="unknown FedSum baseline"):
        baseline_local_update(tiny_model(0), "FedBN", batches(), HP, client="c", t=1)


def test_daisy_chain_state_round_trips(tmp_path):
    dc = DaisyChain(1, 2, seed=0, global_state=OrderedDict(w=torch.tensor([0.0])))
    dc.server_round(
        1,
        {c: OrderedDict(w=torch.tensor([float(i)])) for i, c in enumerate("ab")},
        {"a": 1, "b": 1},
    )
    torch.save(dc.to_dict(), tmp_path / "dc.pt")
    back = DaisyChain.from_dict(torch.load(tmp_path / "dc.pt"))
    assert torch.equal(back.model_for("a")["w"], dc.model_for("a")["w"]) and back.held.keys() == {
        "a",
        "b",
    }
