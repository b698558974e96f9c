"""AdaFedSelecKD's Table V / Table VII / Fig. 12 methods against hand computations.

* FedNova's normalised average and FedProx's proximal term (fedrepro.fl.algorithms), and the
  AdaFedProx client step (methods._step) against AdaFedAvg's on a stub model;
* AdaFedOPT's server step (Flower's FedAdam / FedYogi inside AdaFedOptStrategy) against Reddi et
  al.'s formulas computed with numpy, its moments saved and reloaded on a resume;
* AdaFedNova's and AdaFedProx's strategies, make_strategy's dispatch;
* the noun–verb hard-KD mask of selective_kd_loss (Fig. 12) and the per-token KD trace (Fig. 11);
* the grid's method variants (~tau, ~sample, ~post), the split settings' client names against the
  data layer, the experiments' series;
* report_round / final_states (best validation loss per client) and the Table VII post-addition
  start (init_from).

Everything runs on scalars, tiny tensors or a stub model (no backbone is built).
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

import helpers
from fedrepro.fl.algorithms import fednova_aggregate, fedprox_proximal_term
from fedrepro.fl.checkpoint import checkpoint_paths, load_state, save_state
from fedrepro.fl.strategy import SortedCheckpointFedAvg
from fedrepro.io import InputError, read_json, write_json_atomic
from fedrepro.papers.adafedseleckd import grid as ada_grid
from fedrepro.papers.adafedseleckd import task
from fedrepro.papers.adafedseleckd.kd import selective_kd_loss
from fedrepro.papers.adafedseleckd.methods import METHODS, TrainHParams, _step, get_method, local_update
from fedrepro.papers.adafedseleckd.strategy import (
    AdaFedNovaStrategy,
    AdaFedOptStrategy,
    AdaFedProxStrategy,
    make_strategy,
)


# =============================================================================================
# 1. FedNova
# =============================================================================================
def test_fednova_normalised_average_by_hand():
    x = OrderedDict(w=torch.tensor(1.0), v=torch.tensor([2.0, -1.0]))
    ys = [OrderedDict(w=torch.tensor(0.0), v=torch.tensor([0.0, 1.0])),
          OrderedDict(w=torch.tensor(4.0), v=torch.tensor([6.0, -3.0]))]
    tau, n = (2, 6), (3, 1)
    p = (0.75, 0.25)
    tau_eff = p[0] * tau[0] + p[1] * tau[1]  # 3.0
    assert tau_eff == 3.0
    out = fednova_aggregate(x, ys, local_steps=tau, num_examples=n)
    assert list(out) == ["w", "v"]
    # w: d = 0.75·(1 − 0)/2 + 0.25·(1 − 4)/6 = 0.25, x − 3·0.25 = 0.25
    assert out["w"].dtype == torch.float32 and out["w"].shape == ()
    assert float(out["w"]) == pytest.approx(0.25, abs=1e-7)
    for k in x:
        d = sum(pi * (x[k].double() - y[k].double()) / t for pi, y, t in zip(p, ys, tau))
        assert torch.allclose(out[k].double(), x[k].double() - tau_eff * d, atol=1e-7)
    # FedAvg's weighted average (0.75·0 + 0.25·4 = 1) is not what FedNova gives with unequal τ
    assert float(out["w"]) != pytest.approx(1.0)


def test_fednova_with_equal_steps_is_fedavg():
    g = torch.Generator().manual_seed(0)
    x = OrderedDict(a=torch.randn(3, 2, generator=g), b=torch.randn(4, generator=g))
    ys = [OrderedDict((k, torch.randn(v.shape, generator=g)) for k, v in x.items()) for _ in range(2)]
    out = fednova_aggregate(x, ys, local_steps=[4, 4], num_examples=[3, 1])
    for k in x:
        avg = 0.75 * ys[0][k].double() + 0.25 * ys[1][k].double()
        assert torch.allclose(out[k].double(), avg, atol=1e-6)
    # scalar case of the brief: equal τ gives exactly 0.75·0 + 0.25·4 = 1
    sx = OrderedDict(w=torch.tensor(1.0))
    same = fednova_aggregate(sx, [OrderedDict(w=torch.tensor(0.0)), OrderedDict(w=torch.tensor(4.0))],
                             local_steps=[4, 4], num_examples=[3, 1])
    assert float(same["w"]) == 1.0


def test_fednova_bad_inputs():
    x = OrderedDict(w=torch.tensor(1.0))
    with pytest.raises(InputError, match=">= 1 local step"):
        fednova_aggregate(x, [x, x], local_steps=[0, 2], num_examples=[1, 1])
    with pytest.raises(InputError, match="one state, step count and example count"):
        fednova_aggregate(x, [x, x], local_steps=[1], num_examples=[1, 1])
    with pytest.raises(InputError, match="one state, step count and example count"):
        fednova_aggregate(x, [], local_steps=[], num_examples=[])


# =============================================================================================
# 2. FedProx
# =============================================================================================
def test_fedprox_proximal_term_value_and_gradient_by_hand():
    w = {"a": torch.tensor([1.0, 2.0], requires_grad=True), "b": torch.tensor([0.5], requires_grad=True)}
    g = {"a": torch.tensor([0.0, -1.0]), "b": torch.tensor([1.5]), "extra": torch.zeros(2)}
    mu = 0.3
    term = fedprox_proximal_term(w, g, mu)
    # ‖w − w_g‖² = 1 + 9 + 1 = 11
    assert float(term.detach()) == pytest.approx(mu / 2 * 11.0)
    term.backward()
    assert torch.allclose(w["a"].grad, mu * torch.tensor([1.0, 3.0]))
    assert torch.allclose(w["b"].grad, mu * torch.tensor([-1.0]))
    with pytest.raises(InputError, match="lacks"):
        fedprox_proximal_term(w, {"a": g["a"]}, mu)


V = 7  # the stub model's vocabulary


class StubModel(torch.nn.Module):
    """What ``_step`` / ``local_update`` use of an AdapterSummarizer: ``stacks[role]`` and
    ``path_logits`` -- here logits are an embedding of the decoder inputs, one table per role."""

    def __init__(self, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.stacks = torch.nn.ModuleDict({r: torch.nn.Embedding(V, V) for r in ("local", "global")})
        with torch.no_grad():
            for emb in self.stacks.values():
                emb.weight.copy_(torch.randn(V, V, generator=gen))

    def path_logits(self, input_ids, attention_mask, decoder_input_ids, student="local", teacher=None):
        s = self.stacks[student](decoder_input_ids)
        t = None if teacher is None else self.stacks[teacher](decoder_input_ids).detach()
        return s, t


PAD, START = 0, 1


def _examples(n: int = 3, hard_kd: bool = False) -> list[dict]:
    out = []
    for i in range(n):
        labels = [2 + (i + j) % (V - 2) for j in range(3 + i)]  # lengths 3, 4, 5: padding in a batch
        e = {"id": f"ex{i}", "input_ids": [3, 4, 5], "labels": labels}
        if hard_kd:
            e["kd_allowed"] = [(i + j) % 2 == 0 for j in range(len(labels))]
        out.append(e)
    return out


def _batch(examples):
    from fedrepro.data.seq2seq import collate

    return collate(examples, PAD, START)


def _hp(**kw) -> TrainHParams:
    base = dict(lr=0.1, weight_decay=0.0, batch_size=2, local_epochs=1, lam=0.3, tau=5.0, prox_mu=0.5)
    base.update(kw)
    return TrainHParams(**base)


def test_adafedprox_step_differs_from_adafedavg_by_the_proximal_gradient():
    hp = _hp()
    batch = _batch(_examples())
    avg_model, prox_model = StubModel(0), StubModel(0)
    w0 = avg_model.stacks["local"].weight.detach().clone()
    gen = torch.Generator().manual_seed(1)
    w_r = {"weight": w0 + torch.randn(w0.shape, generator=gen)}  # w ≠ w^r
    lr = 0.1
    opt_avg = torch.optim.SGD(avg_model.stacks["local"].parameters(), lr=lr)
    opt_prox = torch.optim.SGD(prox_model.stacks["local"].parameters(), lr=lr)
    loss_avg, *_ = _step(avg_model, get_method("AdaFedAvg"), batch, torch.device("cpu"), hp, math.inf, opt_avg)
    loss_prox, *_ = _step(prox_model, get_method("AdaFedProx"), batch, torch.device("cpu"), hp, math.inf,
                          opt_prox, proximal_to=w_r)
    sq = float(((w0 - w_r["weight"]) ** 2).sum())
    # loss: CE + μ/2‖w − w^r‖²
    assert float(loss_prox.detach()) - float(loss_avg.detach()) == pytest.approx(hp.prox_mu / 2 * sq, rel=1e-5)
    # one SGD step: the two updates differ by exactly −lr · μ (w − w^r)
    diff = prox_model.stacks["local"].weight.detach() - avg_model.stacks["local"].weight.detach()
    assert torch.allclose(diff, -lr * hp.prox_mu * (w0 - w_r["weight"]), atol=1e-6)
    # the global stack is never touched
    assert torch.equal(prox_model.stacks["global"].weight, avg_model.stacks["global"].weight)


def test_adafedprox_with_mu_zero_is_adafedavg_and_needs_the_received_adapter():
    batch = _batch(_examples())
    a, b = StubModel(0), StubModel(0)
    hp0 = _hp(prox_mu=0.0)
    w_r = {"weight": torch.zeros(V, V)}
    la, *_ = _step(a, get_method("AdaFedAvg"), batch, "cpu", hp0, math.inf,
                   torch.optim.SGD(a.stacks["local"].parameters(), lr=0.1))
    lb, *_ = _step(b, get_method("AdaFedProx"), batch, "cpu", hp0, math.inf,
                   torch.optim.SGD(b.stacks["local"].parameters(), lr=0.1), proximal_to=w_r)
    assert torch.equal(la, lb) and torch.equal(a.stacks["local"].weight, b.stacks["local"].weight)
    c = StubModel(0)
    with pytest.raises(InputError, match="proximal_to"):
        _step(c, get_method("AdaFedProx"), batch, "cpu", _hp(), math.inf,
              torch.optim.SGD(c.stacks["local"].parameters(), lr=0.1))


def test_local_update_passes_proximal_to_through_every_step():
    """Two batches with plain SGD: AdaFedProx's run equals a hand loop of CE + μ/2‖w − w^r‖²."""
    hp = _hp(batch_size=2)
    examples = _examples(4)
    model = StubModel(0)
    w_r = {"weight": torch.zeros(V, V)}
    opt = torch.optim.SGD(model.stacks["local"].parameters(), lr=hp.lr)
    stats = local_update(model, get_method("AdaFedProx"), examples, hp, opt, 5, "c", 1, PAD, START,
                         proximal_to=w_r)
    assert stats["n_batches"] == 2
    ref = StubModel(0)
    ref_opt = torch.optim.SGD(ref.stacks["local"].parameters(), lr=hp.lr)
    from fedrepro.data.seq2seq import derive_seed, iterate_batches
    from fedrepro.papers.adafedseleckd.kd import cross_entropy_loss

    for batch in iterate_batches(examples, 2, PAD, START, derive_seed(5, "c", 1, 0)):
        logits = ref.stacks["local"](batch["decoder_input_ids"])
        loss = cross_entropy_loss(logits, batch["labels"]) + hp.prox_mu / 2 * (ref.stacks["local"].weight ** 2).sum()
        ref_opt.zero_grad()
        loss.backward()
        ref_opt.step()
    assert torch.allclose(model.stacks["local"].weight, ref.stacks["local"].weight, atol=1e-6)


# =============================================================================================
# 3. AdaFedOPT (Flower's FedAdam / FedYogi) and the other strategies
# =============================================================================================


def _strategy_kwargs(tmp_path: Path, round_offset: int = 0) -> dict:
    return dict(out_dir=tmp_path, round_offset=round_offset, expected_clients=2, fraction_train=1.0,
                min_train_nodes=2, min_available_nodes=2, fraction_evaluate=0.0, min_evaluate_nodes=0,
                weighted_by_key="num-examples")


OPT = {"eta": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3}


def _opt_cell(name: str = "adam", **over) -> dict:
    return {"method": "AdaFedOPT", "train": {"lr": 0.01, "prox_mu": 0.2},
            "server_optimizer": {"name": name, **OPT, **over}}


def _arrays(d: dict) -> ArrayRecord:
    return ArrayRecord(OrderedDict((k, Array(np.asarray(v, dtype=np.float32))) for k, v in d.items()))


def _configure(strategy, server_round: int, current: dict):
    strategy._node_of = {0: 11, 1: 12}  # partition id -> node id (skips the partition query)
    return sorted(strategy.configure_train(server_round, _arrays(current), ConfigRecord({}), None),
                  key=lambda m: m.metadata.dst_node_id)


def _replies(instructions, client_arrays: list[dict], ns=(3, 1), steps=(2, 6)) -> list[Message]:
    return [
        Message(RecordDict({"arrays": _arrays(arr),
                            "metrics": MetricRecord({"partition-id": pid, "num-examples": n,
                                                     "n-batches": t, "train-loss": 0.5})}),
                reply_to=inst)
        for pid, (inst, arr, n, t) in enumerate(zip(instructions, client_arrays, ns, steps))
    ]


X0 = {"w": [1.0, 2.0, -0.5], "b": [0.25]}
ROUND1 = [{"w": [2.0, 0.0, -0.5], "b": [1.0]}, {"w": [0.0, 4.0, 1.5], "b": [0.0]}]
ROUND2 = [{"w": [0.5, 1.0, 0.0], "b": [0.5]}, {"w": [3.0, 1.0, -2.0], "b": [2.0]}]


def _fedavg(clients, ns=(3, 1)):
    p = np.array(ns, dtype=np.float64) / sum(ns)
    return {k: sum(pi * np.asarray(c[k], dtype=np.float64) for pi, c in zip(p, clients)) for k in clients[0]}


def _hand_fedopt(name: str, rounds: list[list[dict]]) -> list[dict]:
    """Reddi et al. 2021 Alg. 2 as Flower implements it (bias-corrected η for Adam with exponent
    server_round + 1; Yogi without bias correction), in float64."""
    eta, b1, b2, tau = OPT["eta"], OPT["beta_1"], OPT["beta_2"], OPT["tau"]
    x = {k: np.asarray(v, dtype=np.float64) for k, v in X0.items()}
    m = {k: np.zeros_like(v) for k, v in x.items()}
    v = {k: np.zeros_like(v) for k, v in x.items()}
    out = []
    for t, clients in enumerate(rounds, start=1):
        avg = _fedavg(clients)
        for k in x:
            delta = avg[k] - x[k]
            m[k] = b1 * m[k] + (1 - b1) * delta
            if name == "adam":
                v[k] = b2 * v[k] + (1 - b2) * delta ** 2
                eta_t = eta * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
            else:  # yogi
                v[k] = v[k] - (1 - b2) * delta ** 2 * np.sign(v[k] - delta ** 2)
                eta_t = eta
            x[k] = x[k] + eta_t * m[k] / (np.sqrt(v[k]) + tau)
        out.append({k: a.copy() for k, a in x.items()})
    return out


def _run_rounds(strategy, rounds: list[list[dict]], start: dict) -> list[dict]:
    current, out = start, []
    for r, clients in enumerate(rounds, start=1):
        instructions = _configure(strategy, r, current)
        arrays, _ = strategy.aggregate_train(r, _replies(instructions, clients))
        current = {k: a.numpy() for k, a in arrays.items()}
        out.append({k: np.asarray(v, dtype=np.float64) for k, v in current.items()})
    return out


def test_fedadam_first_step_by_hand(task_identity, tmp_path):
    s = AdaFedOptStrategy(_opt_cell("adam"), **_strategy_kwargs(tmp_path))
    instructions = _configure(s, 1, X0)
    assert {k: list(v) for k, v in s.opt.current_arrays.items()} == X0  # configure_train sets x
    arrays, _ = s.aggregate_arrays(1, _replies(instructions, ROUND1))
    assert list(arrays.keys()) == ["w", "b"]  # the broadcast's key order
    eta, b1, b2, tau = OPT["eta"], OPT["beta_1"], OPT["beta_2"], OPT["tau"]
    avg = _fedavg(ROUND1)
    for k in X0:
        x = np.asarray(X0[k], dtype=np.float64)
        delta = avg[k] - x
        m, v = (1 - b1) * delta, (1 - b2) * delta ** 2
        expected = x + eta * math.sqrt(1 - b2 ** 2) / (1 - b1 ** 2) * m / (np.sqrt(v) + tau)
        assert np.allclose(arrays[k].numpy(), expected, rtol=1e-5, atol=1e-6), k
        assert np.allclose(s.opt.m_t[k], m, rtol=1e-5) and np.allclose(s.opt.v_t[k], v, rtol=1e-5)


@pytest.mark.parametrize("name", ["adam", "yogi"])
def test_fedopt_two_rounds_by_hand(task_identity, tmp_path, name):
    s = AdaFedOptStrategy(_opt_cell(name), **_strategy_kwargs(tmp_path))
    got = _run_rounds(s, [ROUND1, ROUND2], X0)
    want = _hand_fedopt(name, [ROUND1, ROUND2])
    for g, w in zip(got, want):
        for k in X0:
            assert np.allclose(g[k], w[k], rtol=1e-5, atol=1e-6), (name, k, g[k], w[k])
    # Yogi's v differs from Adam's from round 2 on (round 1: both (1 − β₂)Δ²)
    other = _hand_fedopt("yogi" if name == "adam" else "adam", [ROUND1, ROUND2])
    assert not np.allclose(got[1]["w"], other[1]["w"], rtol=1e-5, atol=1e-6)


def test_fedadam_keeps_the_adapters_dtype(task_identity, tmp_path):
    s = AdaFedOptStrategy(_opt_cell("adam"), **_strategy_kwargs(tmp_path))
    instructions = _configure(s, 1, X0)
    arrays, _ = s.aggregate_arrays(1, _replies(instructions, ROUND1))
    dtypes = {k: arrays[k].numpy().dtype for k in arrays}
    assert all(d == np.float32 for d in dtypes.values()), (
        f"AdaFedOPT returned {dtypes} for float32 adapters")


def test_fedopt_moments_are_saved_and_a_resumed_run_steps_identically(task_identity, tmp_path):
    a = AdaFedOptStrategy(_opt_cell("adam"), **_strategy_kwargs(tmp_path))
    got = _run_rounds(a, [ROUND1, ROUND2], X0)
    path1 = a.moments_path(1)
    assert path1.exists() and a.moments_path(2).exists()
    saved = torch.load(path1, weights_only=True)
    # round 1's moments: m = (1 − β₁)Δ, v = (1 − β₂)Δ² of the first step
    avg = _fedavg(ROUND1)
    for k in X0:
        delta = avg[k] - np.asarray(X0[k], dtype=np.float64)
        assert np.allclose(saved["m_t"][k].numpy(), (1 - OPT["beta_1"]) * delta, rtol=1e-5)
        assert np.allclose(saved["v_t"][k].numpy(), (1 - OPT["beta_2"]) * delta ** 2, rtol=1e-5)
    # a new strategy at round_offset 1 reloads them bit for bit ...
    b = AdaFedOptStrategy(_opt_cell("adam"), **_strategy_kwargs(tmp_path, round_offset=1))
    for k in X0:
        assert np.array_equal(b.opt.m_t[k], saved["m_t"][k].numpy())
        assert np.array_equal(b.opt.v_t[k], saved["v_t"][k].numpy())
    # ... and its first round (absolute round 2, same bias correction) gives the uninterrupted bits
    after1 = {k: np.asarray(v) for k, v in got[0].items()}
    instructions = _configure(b, 1, after1)
    arrays, _ = b.aggregate_train(1, _replies(instructions, ROUND2))
    for k in X0:
        assert np.array_equal(np.asarray(arrays[k].numpy(), dtype=np.float64), got[1][k]), k
    # a resume whose moments are missing names the file
    with pytest.raises(InputError, match="server optimiser state of round 5"):
        AdaFedOptStrategy(_opt_cell("adam"), **_strategy_kwargs(tmp_path, round_offset=5))


def test_fedopt_bad_optimizer_settings_name_the_key(tmp_path):
    with pytest.raises(InputError, match=r"adafedseleckd\.server_optimizer\.name"):
        AdaFedOptStrategy(_opt_cell("sgd"), **_strategy_kwargs(tmp_path))
    with pytest.raises(InputError, match=r"adafedseleckd\.server_optimizer: unknown keys \['lr'\]"):
        AdaFedOptStrategy(_opt_cell("adam", lr=1.0), **_strategy_kwargs(tmp_path))
    # Adagrad without β's: built, with η and the client lr (η_l) of the cell
    cell = {"method": "AdaFedOPT", "train": {"lr": 0.01},
            "server_optimizer": {"name": "adagrad", "eta": 0.1, "tau": 1e-3}}
    s = AdaFedOptStrategy(cell, **_strategy_kwargs(tmp_path))
    assert s.optimizer_name == "adagrad" and s.opt.eta == 0.1 and s.opt.eta_l == 0.01


def test_fedadagrad_with_the_configs_betas_is_built(tmp_path):
    s = AdaFedOptStrategy(_opt_cell("adagrad"), **_strategy_kwargs(tmp_path))  # beta_1, beta_2 set
    assert s.optimizer_name == "adagrad", "AdaFedOPT with name adagrad and beta_1 set must be built"


def test_fednova_strategy_normalises_by_the_clients_steps(task_identity, tmp_path):
    s = AdaFedNovaStrategy({"method": "AdaFedNova"}, **_strategy_kwargs(tmp_path))
    instructions = _configure(s, 1, X0)
    replies = _replies(instructions, ROUND1, ns=(3, 1), steps=(2, 6))
    arrays, metrics = s.aggregate_arrays(1, replies)
    x = OrderedDict((k, torch.tensor(v, dtype=torch.float32)) for k, v in X0.items())
    ys = [OrderedDict((k, torch.tensor(v, dtype=torch.float32)) for k, v in c.items()) for c in ROUND1]
    want = fednova_aggregate(x, ys, [2, 6], [3, 1])
    got = arrays.to_torch_state_dict()
    assert list(got) == list(X0)
    for k in X0:
        assert torch.equal(got[k], want[k])
        # by hand: τ_eff = 3, x − 3·(0.75 (x − y1)/2 + 0.25 (x − y2)/6)
        xk = np.asarray(X0[k], dtype=np.float64)
        d = 0.75 * (xk - np.asarray(ROUND1[0][k])) / 2 + 0.25 * (xk - np.asarray(ROUND1[1][k])) / 6
        assert np.allclose(got[k].numpy(), xk - 3.0 * d, atol=1e-6)
    assert metrics["train-loss"] == pytest.approx(0.5)
    assert s.round_extras(1, replies) == {"local_steps": [2, 6]}


def test_fedprox_strategy_sends_mu_and_averages(task_identity, tmp_path):
    s = AdaFedProxStrategy({"method": "AdaFedProx", "train": {"prox_mu": 0.2}}, **_strategy_kwargs(tmp_path))
    instructions = _configure(s, 1, X0)
    assert len(instructions) == 2
    assert all(m.content["config"]["proximal-mu"] == pytest.approx(0.2) for m in instructions)
    arrays, _ = s.aggregate_arrays(1, _replies(instructions, ROUND1))
    avg = _fedavg(ROUND1)
    for k in X0:
        assert np.allclose(arrays[k].numpy(), avg[k], atol=1e-6)
    with pytest.raises(InputError, match=r"adafedseleckd\.train\.prox_mu"):
        AdaFedProxStrategy({"train": {"prox_mu": -1}}, **_strategy_kwargs(tmp_path))


def test_make_strategy_dispatches_on_the_methods_server(tmp_path):
    kinds = {
        "AdaFedAvg": SortedCheckpointFedAvg, "AdaFedKD": SortedCheckpointFedAvg,
        "AdaFedSelectKD": SortedCheckpointFedAvg, "AdaFedHardKD": SortedCheckpointFedAvg,
        "AdaFedOPT": AdaFedOptStrategy, "AdaFedProx": AdaFedProxStrategy, "AdaFedNova": AdaFedNovaStrategy,
    }
    for method, cls in kinds.items():
        cell = {**_opt_cell(), "method": method}
        assert type(make_strategy(cell, **_strategy_kwargs(tmp_path))) is cls, method
    # Table V's methods have AdaFedAvg's single adapter replaced by the server's result
    for m in ("AdaFedOPT", "AdaFedProx", "AdaFedNova"):
        spec = METHODS[m]
        assert spec.roles == ("local",) and spec.server_role == "local" and not spec.distill
    assert METHODS["AdaFedProx"].proximal and not METHODS["AdaFedAvg"].proximal
    assert METHODS["AdaFedHardKD"].hard_kd and not METHODS["AdaFedHardKD"].selective


# =============================================================================================
# 4. hard KD (Fig. 12)
# =============================================================================================
def _kd_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(2, 4, 6, generator=g, requires_grad=True)
    teacher = torch.randn(2, 4, 6, generator=g)
    labels = torch.randint(0, 6, (2, 4), generator=g)
    labels[0, 3] = labels[1, 2] = labels[1, 3] = -100
    allowed = torch.tensor([[True, False, True, True], [False, True, True, False]])
    return student, teacher, labels, allowed


def test_hard_kd_mask_and_loss_by_hand():
    student, teacher, labels, allowed = _kd_inputs()
    lam = 0.3
    loss, kd_mask = selective_kd_loss(student, teacher, labels, lam, math.inf, allowed=allowed)
    valid = labels != -100
    assert torch.equal(kd_mask, allowed & valid)
    # by hand, per token: (1 − λ)·CE + λ·KL(q_g ‖ q_l) where allowed, CE elsewhere; mean over valid
    s = student.detach().clone().requires_grad_(True)
    log_ql = F.log_softmax(s, -1)
    log_qg = F.log_softmax(teacher, -1)
    ce = -log_ql.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    kl = (log_qg.exp() * (log_qg - log_ql)).sum(-1)
    gate = (allowed & valid).float()
    per_token = (1 - lam * gate) * ce + lam * gate * kl
    hand = (per_token * valid.float()).sum() / valid.sum()
    assert float(loss.detach()) == pytest.approx(float(hand.detach()), rel=1e-6)
    # the hand-written backward is the gradient of the hand formula
    loss.backward()
    hand.backward()
    assert torch.allclose(student.grad, s.grad, atol=1e-6)


def test_hard_kd_with_everything_allowed_is_adafedkd_bit_for_bit():
    student, teacher, labels, _ = _kd_inputs(1)
    s2 = student.detach().clone().requires_grad_(True)
    everything = torch.ones_like(labels, dtype=torch.bool)
    loss_a, mask_a = selective_kd_loss(student, teacher, labels, 0.2, math.inf, allowed=everything)
    loss_b, mask_b = selective_kd_loss(s2, teacher, labels, 0.2, math.inf, allowed=None)
    assert torch.equal(loss_a, loss_b) and torch.equal(mask_a, mask_b)
    loss_a.backward()
    loss_b.backward()
    assert torch.equal(student.grad, s2.grad)
    with pytest.raises(ValueError, match="allowed mask shape"):
        selective_kd_loss(student, teacher, labels, 0.2, math.inf, allowed=everything[:, :2])


def test_hard_kd_local_update_distils_only_the_allowed_tokens_and_traces_them():
    examples = _examples(3, hard_kd=True)
    model = StubModel(0)
    trace: dict = {}
    hp = _hp(batch_size=2, local_epochs=2)
    stats = local_update(model, get_method("AdaFedHardKD"), examples, hp,
                         torch.optim.SGD(model.stacks["local"].parameters(), lr=0.1), 0, "c", 1, PAD, START,
                         trace=trace)
    n_allowed = sum(sum(e["kd_allowed"]) for e in examples)
    n_tokens = sum(len(e["labels"]) for e in examples)
    assert stats["n_tokens"] == 2 * n_tokens and stats["n_kd_tokens"] == 2 * n_allowed
    assert sorted(trace) == [e["id"] for e in examples]
    for e in examples:  # one bit per label token, once per epoch
        assert trace[e["id"]] == [e["kd_allowed"], e["kd_allowed"]]
    # without the POS mask AdaFedHardKD refuses to train
    plain = [{k: v for k, v in e.items() if k != "kd_allowed"} for e in examples]
    with pytest.raises(InputError, match="kd_allowed"):
        local_update(model, get_method("AdaFedHardKD"), plain, hp,
                     torch.optim.SGD(model.stacks["local"].parameters(), lr=0.1), 0, "c", 1, PAD, START)


# =============================================================================================
# 5. the grid
# =============================================================================================
@pytest.fixture(scope="module")
def demo_config() -> dict:
    return helpers.configs()[0]


def test_method_variants_of_make_cell(demo_config):
    cfg = demo_config
    plain = ada_grid.make_cell(cfg, "domains", "bart-large", "AdaFedSelectKD", "all", 1)
    tau3 = ada_grid.make_cell(cfg, "domains", "bart-large", "AdaFedSelectKD~tau3", "all", 1)
    assert tau3["train"]["tau"] == 3.0 and plain["train"]["tau"] == float(cfg["adafedseleckd"]["train"]["tau"])
    assert tau3["method"] == "AdaFedSelectKD" and tau3["variant"] == "tau3" and "variant" not in plain
    assert tau3["out_dir"] != plain["out_dir"] and "AdaFedSelectKD~tau3" in tau3["out_dir"]
    # the variant does not leak into the shared train section of the config
    assert cfg["adafedseleckd"]["train"]["tau"] == 5.0

    sample = ada_grid.make_cell(cfg, "domains", "bart-large", "AdaFedAvg~sample2", "all", 1)
    assert sample["clients_per_round"] == 2 and sample["method"] == "AdaFedAvg"
    assert ada_grid.make_cell(cfg, "domains", "bart-large", "AdaFedAvg", "all", 1)["clients_per_round"] is None

    post = ada_grid.make_cell(cfg, "extreme", "bart-large", "AdaFedSelectKD~post", "all", 1)
    assert post["init_from"] == plain["out_dir"]  # the domains cell it continues
    assert post["clients"] == ["Academic", "Committee", "Product", "samsum"] == post["eval_clients"]
    assert post["train"]["rounds"] == cfg["adafedseleckd"]["experiments"]["table7"]["post_rounds"] == 3
    assert ada_grid.init_inputs(cfg, "extreme", "bart-large", "AdaFedSelectKD~post", 1) == [
        f"{plain['out_dir']}/adapters.safetensors"]

    with pytest.raises(InputError, match="unknown AdaFedSelecKD method variant 'foo'"):
        ada_grid.make_cell(cfg, "domains", "bart-large", "AdaFedSelectKD~foo", "all", 1)

    opt = ada_grid.make_cell(cfg, "domains", "bart-large", "AdaFedOPT", "all", 1)
    assert opt["server_optimizer"] == cfg["adafedseleckd"]["server_optimizer"]
    hard = ada_grid.make_cell(cfg, "domains", "bart-large", "AdaFedHardKD", "all", 1)
    assert hard["hard_kd_tags"] == ["NOUN", "VERB"]
    assert sorted(hard["pos_tags"]) == sorted(hard["clients"])
    assert "server_optimizer" not in plain and "pos_tags" not in plain and "init_from" not in plain


def test_partition_clients_match_the_data_layer(demo_config, tmp_path):
    from fedrepro.data.settings import build_manifest, settings
    from fedrepro.io import write_jsonl_atomic

    cfg = demo_config
    sizes = cfg["partitions"]["adafedseleckd"]["noniid_sizes"]
    qmsum = [{"id": f"{d}-{s}-{i}", "client": d, "source": "qmsum", "split": s}
             for d in ada_grid.DOMAINS for s, n in sizes.items() for i in range(n + 2)]
    files = {"qmsum": tmp_path / "qmsum.jsonl", "samsum": tmp_path / "samsum.jsonl"}
    write_jsonl_atomic(files["qmsum"], qmsum)
    write_jsonl_atomic(files["samsum"], [{"id": f"sam-{s}-{i}", "source": "samsum", "client": "samsum", "split": s}
                                         for s in sizes for i in range(3)])
    for src in cfg["partitions"]["adafedseleckd"]["long_meetings"]:
        files[src] = tmp_path / f"{src}.jsonl"
        write_jsonl_atomic(files[src], [{"id": f"{src}-{s}-{i}", "source": src, "client": src, "split": s}
                                        for s in sizes for i in range(2)])
    known = settings(cfg)
    for partition in ada_grid.PARTITIONS:
        setting = known[f"adafedseleckd-{partition}"]
        manifest = build_manifest(setting, {s: str(files[s]) for s in setting["sources"]}, seed=1)
        names = ada_grid.partition_clients(cfg, partition)
        assert sorted(names) == sorted(manifest), partition
    assert ada_grid.partition_clients(cfg, "iid") == ["client1", "client2", "client3"]
    assert ada_grid.partition_clients(cfg, "extreme") == [*ada_grid.DOMAINS, "samsum"]
    assert ada_grid.partition_clients(cfg, "long") == ["ami", "icsi", "elitr", "meetingbank"]
    assert ada_grid.partition_clients(cfg, "domains") == list(ada_grid.DOMAINS)
    with pytest.raises(InputError, match="unknown AdaFedSelecKD partition"):
        ada_grid.partition_clients(cfg, "nope")


def test_experiment_series(demo_config):
    cfg = demo_config
    f8 = ada_grid.experiment_cells(cfg, "figure8")
    assert list(f8) == ["without SAMSum", "with SAMSum"]
    methods = cfg["adafedseleckd"]["experiments"]["figure8"]["methods"]
    assert f8["without SAMSum"] == [ada_grid.cell_dir("domains", "bart-large", m, "all", 1) for m in methods]
    assert f8["with SAMSum"] == [ada_grid.cell_dir("extreme", "bart-large", m, "all", 1) for m in methods]
    f4 = ada_grid.experiment_cells(cfg, "figure4")
    assert list(f4) == ["tau=3", "tau=5", "tau=7"]
    assert f4["tau=5"] == [ada_grid.cell_dir("domains", "bart-large", "AdaFedSelectKD", "all", 1)]
    assert f4["tau=3"] == [ada_grid.cell_dir("domains", "bart-large", "AdaFedSelectKD~tau3", "all", 1)]
    t7 = ada_grid.experiment_cells(cfg, "table7")
    assert t7["Post-addition"] == [ada_grid.cell_dir("extreme", "bart-large", "AdaFedSelectKD~post", "all", 1)]
    assert t7["Pre-addition"] == [ada_grid.cell_dir("extreme", "bart-large", "AdaFedSelectKD", "all", 1)]
    f10 = ada_grid.experiment_cells(cfg, "figure10")
    assert all("~sample2" in c for c in f10["sample 2 clients"])
    t5 = ada_grid.experiment_cells(cfg, "table5")["federated"]
    assert [Path(c).parts[-3] for c in t5] == cfg["adafedseleckd"]["experiments"]["table5"]["methods"]
    assert ada_grid.experiment_cells(cfg, "figure12")["methods"][0].endswith("/AdaFedHardKD/all/seed~1")


# =============================================================================================
# 6. report_round / final_states, and the post-addition start
# =============================================================================================
def _fake_kd_cell(tmp_path: Path, rounds: int = 3, rule: str = "best_val_loss") -> dict:
    """An AdaFedSelectKD cell folder with every client's local adapter per round (``w`` encodes
    client and round) and the server's round logs and checkpoints -- no model."""
    clients = list(ada_grid.DOMAINS)
    cell = {"method": "AdaFedSelectKD", "out_dir": str(tmp_path / "cell"), "clients": clients,
            "eval_clients": clients, "train": {"rounds": rounds}, "report_round": rule}
    for r in range(1, rounds + 1):
        for i, c in enumerate(clients):
            save_state(task.client_state_path(cell, c, r), {"w": torch.tensor([10.0 * i + r])})
        tensors, meta = checkpoint_paths(cell["out_dir"], r)
        save_state(tensors, {"w": torch.tensor([100.0 + r])})
        write_json_atomic(meta, {"round": r, "clients": [{"partition_id": i} for i in range(len(clients))]})
    return cell


LOSSES = {  # per client, rounds 1..3
    "Academic": [3.0, 1.0, 2.0],  # best: round 2
    "Committee": [2.0, 1.0, 1.0],  # tie: the later round, 3
    "Product": [1.0, 2.0, 3.0],  # best: round 1
}


def test_final_states_pick_each_clients_best_validation_round(tmp_path, monkeypatch):
    cell = _fake_kd_cell(tmp_path)
    calls = []

    def fake_loss(cell_, client, state):
        i, r = divmod(int(state["w"].item()), 10)
        assert ada_grid.DOMAINS[i] == client
        calls.append((client, r))
        return LOSSES[client][r - 1]

    monkeypatch.setattr(task, "validation_loss", fake_loss)
    out = task.final_states(cell)
    assert sorted(calls) == sorted((c, r) for c in LOSSES for r in (1, 2, 3))
    expected = {"Academic": 2, "Committee": 3, "Product": 1}
    for i, (c, r) in enumerate(expected.items()):
        assert float(out[c]["w"]) == 10.0 * i + r, c
    assert float(out[task.SERVER_KEY]["w"]) == 103.0  # the last round's server tensors
    sel = read_json(Path(cell["out_dir"]) / "selected_rounds.json")
    assert sel == {"rule": "best_val_loss", "rounds": expected, "validation_loss": LOSSES}
    # before_cleanup reports them (and writes the cell's kd_trace.json)
    assert task.before_cleanup(cell) == {"selected_rounds": sel}
    assert (Path(cell["out_dir"]) / "kd_trace.json").exists()


def test_final_states_last_round_needs_no_validation(tmp_path, monkeypatch):
    cell = _fake_kd_cell(tmp_path, rule="last")

    def no_loss(*a):
        raise AssertionError("validation_loss called under report_round: last")

    monkeypatch.setattr(task, "validation_loss", no_loss)
    out = task.final_states(cell)
    assert [float(out[c]["w"]) for c in ada_grid.DOMAINS] == [3.0, 13.0, 23.0]
    sel = read_json(Path(cell["out_dir"]) / "selected_rounds.json")
    assert sel == {"rule": "last", "rounds": dict.fromkeys(ada_grid.DOMAINS, 3), "validation_loss": {}}
    del cell["report_round"]  # default: last
    assert task.report_round(cell) == "last"


def test_report_round_rejects_an_unknown_value(tmp_path):
    cell = _fake_kd_cell(tmp_path, rounds=1, rule="best_rouge")
    with pytest.raises(InputError, match=r"adafedseleckd\.report_round"):
        task.report_round(cell)
    with pytest.raises(InputError, match=r"adafedseleckd\.report_round"):
        task.final_states(cell)


def test_post_addition_starts_from_the_baseline_runs_final_adapters(tmp_path):
    base = tmp_path / "baseline"
    save_state(base / "adapters.safetensors", {
        "Academic::w": torch.tensor([1.0]), "Committee::w": torch.tensor([2.0]),
        "Product::w": torch.tensor([3.0]), f"{task.SERVER_KEY}::w": torch.tensor([9.0]),
    })
    cell = {"method": "AdaFedSelectKD", "init_from": str(base)}
    assert float(task.inherited_local(cell, "Committee")["w"]) == 2.0
    assert task.inherited_local(cell, "samsum") is None  # the joining client starts from W^r
    assert task.inherited_local({"method": "AdaFedSelectKD"}, "Academic") is None
    assert dict(task.initial_state(cell)) == {"w": torch.tensor([9.0])}
    no_server = tmp_path / "noserver"
    save_state(no_server / "adapters.safetensors", {"Academic::w": torch.tensor([1.0])})
    with pytest.raises(InputError, match="holds no server state"):
        task.initial_state({"init_from": str(no_server)})


# =============================================================================================
# 7. the KD trace
# =============================================================================================
def test_write_and_collect_trace_round_trip(tmp_path):
    cell = {"out_dir": str(tmp_path / "cell"), "train": {"rounds": 2}}
    decisions = {
        ("Academic", 1): {"a2": [[True, False, True]], "a1": [[False], [True]]},
        ("Academic", 2): {"a1": [[True], [True]]},
        ("Product", 1): {"p1": [[]]},
        ("Product", 3): {"p1": [[True]]},  # a round beyond train.rounds (a killed longer run)
    }
    for (client, r), trace in decisions.items():
        task.write_trace(task.trace_path(cell, client, r), trace)
    path = task.trace_path(cell, "Academic", 1)
    assert path.name == "kd_trace_round_001.json" and path.parent.name == "Academic"
    assert read_json(path) == {"a1": ["0", "1"], "a2": ["101"]}
    out = tmp_path / "kd_trace.json"
    task.collect_trace(cell, str(out))
    assert read_json(out) == {
        "rounds": 2,
        "clients": {
            "Academic": {"1": {"a1": ["0", "1"], "a2": ["101"]}, "2": {"a1": ["1", "1"]}},
            "Product": {"1": {"p1": [""]}},
        },
    }
    # no clients folder: an empty record
    empty = {"out_dir": str(tmp_path / "none"), "train": {"rounds": 1}}
    task.collect_trace(empty, str(tmp_path / "empty.json"))
    assert read_json(tmp_path / "empty.json") == {"rounds": 1, "clients": {}}


@pytest.mark.parametrize("correction", ["flower", "adam", "none"])
def test_fedadam_bias_correction_key_against_kingma_and_reddi(task_identity, tmp_path, correction):
    """``server_optimizer.bias_correction``: Flower's α_t uses the exponent t + 1 at server round t,
    Adam's (Kingma & Ba) t, Reddi et al.'s Algorithm 2 none -- two rounds each, by hand."""
    eta, b1, b2, tau = OPT["eta"], OPT["beta_1"], OPT["beta_2"], OPT["tau"]
    s = AdaFedOptStrategy(_opt_cell("adam", bias_correction=correction), **_strategy_kwargs(tmp_path))
    got = _run_rounds(s, [ROUND1, ROUND2], X0)
    x = {k: np.asarray(v, dtype=np.float64) for k, v in X0.items()}
    m = {k: np.zeros_like(v) for k, v in x.items()}
    v = {k: np.zeros_like(v) for k, v in x.items()}
    for t, clients in enumerate([ROUND1, ROUND2], start=1):
        avg = _fedavg(clients)
        e = {"flower": t + 1, "adam": t, "none": None}[correction]
        eta_t = eta if e is None else eta * math.sqrt(1 - b2 ** e) / (1 - b1 ** e)
        for k in x:
            delta = avg[k] - x[k]
            m[k] = b1 * m[k] + (1 - b1) * delta
            v[k] = b2 * v[k] + (1 - b2) * delta ** 2
            x[k] = x[k] + eta_t * m[k] / (np.sqrt(v[k]) + tau)
            assert np.allclose(got[t - 1][k], x[k], rtol=1e-5, atol=1e-7), (correction, t, k)
    # the three differ in round 1 (Adam's α_1 = √(1−β₂)/(1−β₁) = 1.0 at these β, Flower's ≈ 0.74)
    if correction != "flower":
        flower = _hand_fedopt("adam", [ROUND1])[0]
        assert not np.allclose(got[0]["w"], flower["w"], rtol=1e-4, atol=0), correction


def test_bias_correction_other_than_flower_is_refused_for_yogi_and_adagrad(tmp_path):
    for name in ("yogi", "adagrad"):
        with pytest.raises(InputError, match="bias_correction.*adam only"):
            AdaFedOptStrategy(_opt_cell(name, bias_correction="adam"), **_strategy_kwargs(tmp_path))
    with pytest.raises(InputError, match=r"bias_correction must be one of"):
        AdaFedOptStrategy(_opt_cell("adam", bias_correction="reddi"), **_strategy_kwargs(tmp_path))
