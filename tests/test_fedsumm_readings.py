"""FedSUMM's readings of the modulation (issue 14, item 1): ρ under each ``fedsumm.algorithm.reading``
against hand computations, the literal reading's ρ − 1 = O(δ²), the round log's ρ statistics and
FedSUMM-vs-FedAvg update difference, and reruns giving the same bits."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest
import torch

from fedrepro.io import InputError
from fedrepro.papers.fedsumm.algorithm import (
    READINGS,
    ClientReply,
    DiscrepancyTracker,
    FedSummConfig,
    FedSummServer,
    deviation_summary,
    discrepancy_ratios,
    layer_key,
    normal_scores,
    parameter_groups,
    rho_statistics,
    softmax_normalize,
    update_difference,
)
from fedrepro.papers.fedsumm.strategy import FedAvgServer

LN2, LN4 = math.log(2.0), math.log(4.0)
EPS = 0.5


def od(**tensors) -> OrderedDict:
    return OrderedDict((k, torch.tensor(v, dtype=torch.float32)) for k, v in tensors.items())


def _reply(params: OrderedDict, w_t: OrderedDict, loss: float) -> ClientReply:
    return ClientReply(params, OrderedDict((k, w_t[k] - params[k]) for k in w_t), loss)


def _expected(p: list[float], q: list[float]) -> float:
    """The ``expected`` reduction by hand: Σ p_i · p_i / q_i."""
    return sum(a * a / b for a, b in zip(p, q))


def _softmax(x: list[float]) -> list[float]:
    e = [math.exp(v) for v in x]
    return [v / sum(e) for v in e]


# ----------------------------------------------------------------------------- groups
def test_layer_groups():
    names = ["model.shared.weight", "enc.layers.0.fc.weight", "enc.layers.0.fc.bias",
             "enc.layers.1.fc.weight", "enc.norm.weight", "enc.norm.bias", "bias"]
    assert [layer_key(n) for n in names] == [
        "model.shared", "enc.layers.0", "enc.layers.0", "enc.layers.1", "enc.norm", "enc.norm",
        "bias",
    ]
    assert parameter_groups(names, "per_layer") == [
        ["model.shared.weight"],
        ["enc.layers.0.fc.weight", "enc.layers.0.fc.bias"],
        ["enc.layers.1.fc.weight"],
        ["enc.norm.weight", "enc.norm.bias"],
        ["bias"],
    ]
    assert parameter_groups(names, "global") == [names]
    assert parameter_groups(names, "per_tensor") == [[n] for n in names]
    # per layer: one softmax over the layer's tensors concatenated
    p = od(**{"l.0.a": [0.0, LN2], "l.0.b": [0.0], "h.w": [0.0]})
    s0, s1 = softmax_normalize(p, "per_layer")
    assert torch.allclose(s0, torch.tensor([0.25, 0.5, 0.25])) and torch.equal(s1, torch.ones(1))


def test_config_validates_the_reading():
    assert FedSummConfig().reading == "literal" and "update_direction" in READINGS
    with pytest.raises(InputError, match="fedsumm.algorithm.reading"):
        FedSummConfig(reading="per_row")
    with pytest.raises(InputError, match="rho_scope"):
        FedSummConfig(reading="per_layer", rho_scope="per_tensor")
    with pytest.raises(InputError, match="rho_reference: round_mean"):
        FedSummConfig(reading="update_direction", rho_reference="broadcast")
    assert FedSummConfig(reading="literal", rho_scope="per_tensor").softmax_scope == "per_tensor"
    assert FedSummConfig(reading="per_layer").softmax_scope == "per_layer"
    assert FedSummConfig(reading="update_direction").softmax_scope == "per_tensor"
    rank = FedSummConfig(reading="update_direction_rank")
    assert (rank.softmax_scope, rank.rho_input, rank.direction_transform) == (
        "per_tensor", "update", "normal_scores")
    assert FedSummConfig(reading="update_direction").direction_transform == "unit_rms"
    assert FedSummConfig(reading="update_direction_raw").direction_transform == "none"
    with pytest.raises(InputError, match="rho_reference: round_mean"):
        FedSummConfig(reading="update_direction_rank", rho_reference="broadcast")


# ----------------------------------------------------------------------------- ρ per reading, by hand
# one client against the uniform broadcast model w_t = 0 (weights readings), ε = 0.5, own memory
W0 = od(**{"enc.layers.0.a": [0.0, 0.0], "enc.layers.0.b": [0.0], "head.w": [0.0, 0.0, 0.0]})
W1 = od(**{"enc.layers.0.a": [LN2, 0.0], "enc.layers.0.b": [0.0], "head.w": [0.0, 0.0, LN4]})
# p over the six entries ∝ [2, 1, 1, 1, 1, 4] / 10, q = 1/6:
RHO_LITERAL = _expected([0.2, 0.1, 0.1, 0.1, 0.1, 0.4], [1 / 6] * 6)  # 6·0.24 = 1.44
# per tensor: a: p=[2/3, 1/3] vs 1/2 -> 10/9; b: one entry -> 1; head: p=[1,1,4]/6 vs 1/3 -> 3/2
RHO_TENSOR = {"enc.layers.0.a": 10 / 9, "enc.layers.0.b": 1.0, "head.w": 1.5}
# per layer: layers.0 = [ln2, 0, 0]: p=[2,1,1]/4 vs 1/3 -> 9/8; head -> 3/2
RHO_LAYER = {"enc.layers.0.a": 9 / 8, "enc.layers.0.b": 9 / 8, "head.w": 1.5}


@pytest.mark.parametrize(
    "reading, per_tensor_rho, rho, tensor_range",
    [
        # the round log's per-tensor ρ: the reduction restricted to each tensor's entries --
        # literal: a: p=[.2,.1], ratio [1.2,.6] -> (.24+.06)/.3 = 1; b: .6; head: 1.08/.6 = 1.8
        ("literal", {k: RHO_LITERAL for k in W0}, RHO_LITERAL, (-0.4, 0.8)),
        ("per_tensor", RHO_TENSOR, (10 / 9 + 1 + 1.5) / 3, (0.0, 0.5)),
        # per layer: layers.0 p=[1/2,1/4,1/4] vs 1/3 -> a: (.75 + .1875)/.75 = 1.25, b: .75
        ("per_layer", RHO_LAYER, (9 / 8 + 1.5) / 2, (-0.25, 0.5)),
    ],
)
def test_weight_readings_hand_computation(reading, per_tensor_rho, rho, tensor_range):
    assert RHO_LITERAL == pytest.approx(1.44)
    cfg = FedSummConfig(epsilon=EPS, reading=reading, rho_reference="broadcast")
    server = FedSummServer(cfg, ["c"], seed=0)
    w_next, log = server.server_round(1, W0, {"c": _reply(W1, W0, 1.0)})
    assert log["rho"]["c"] == pytest.approx(rho)
    # g̃_k = MG_k · ε · ρ_k (MG = w_t − w^c) and w_next = w^c − g̃ = w^c·(1 + ερ_k)
    g = server.guidance_for("c").modulated_gradient
    for k in W0:
        assert torch.allclose(g[k], -W1[k] * EPS * per_tensor_rho[k], atol=1e-7)
        assert torch.allclose(w_next[k], W1[k] * (1 + EPS * per_tensor_rho[k]), atol=1e-6)
    stats = log["rho_statistics"]["c"]
    assert (stats["tensor"]["min"], stats["tensor"]["max"]) == pytest.approx(tensor_range)
    groups = sorted(set(per_tensor_rho.values()))
    assert stats["group"]["max"] == pytest.approx(groups[-1] - 1)
    assert stats["group"]["min"] == pytest.approx(groups[0] - 1)


def test_update_direction_readings_hand_computation():
    """Two clients; σ of the update directions (unit RMS per tensor, or raw) vs the mean update."""
    w_t = od(a=[1.0, 2.0], b=[0.5, 0.5, 0.5])
    d1, d2 = [1.0, -1.0], [1.0, 1.0]  # updates of tensor a; tensor b: [2, 0, 0] and [0, 0, 0]
    params = {
        "c1": od(a=[1.0 + d1[0], 2.0 + d1[1]], b=[2.5, 0.5, 0.5]),
        "c2": od(a=[1.0 + d2[0], 2.0 + d2[1]], b=[0.5, 0.5, 0.5]),
    }
    replies = {c: _reply(params[c], w_t, 1.0) for c in params}
    # unit RMS: a: c1 [1, -1] (rms 1), c2 [1, 1], mean [1, 0] -> [√2, 0];
    #           b: c1 [2, 0, 0] -> [√3, 0, 0], c2 zero -> uniform, mean [1, 0, 0] -> [√3, 0, 0]
    r3 = math.sqrt(3.0)
    q_a, q_b = _softmax([math.sqrt(2.0), 0.0]), _softmax([r3, 0.0, 0.0])
    rho_unit = {
        "c1": {"a": _expected(_softmax([1.0, -1.0]), q_a), "b": 1.0},  # b: c1 = mean exactly
        "c2": {"a": _expected([0.5, 0.5], q_a), "b": _expected([1 / 3] * 3, q_b)},
    }
    # raw: a: mean [1, 0]; b: c1 [2, 0, 0], c2 [0, 0, 0], mean [1, 0, 0]
    q_a, q_b = _softmax([1.0, 0.0]), _softmax([1.0, 0.0, 0.0])
    rho_raw = {
        "c1": {"a": _expected(_softmax([1.0, -1.0]), q_a), "b": _expected(_softmax([2.0, 0, 0]), q_b)},
        "c2": {"a": _expected([0.5, 0.5], q_a), "b": _expected([1 / 3] * 3, q_b)},
    }
    # rank-based normal scores (z = Φ^{-1}(mid-rank / d)): a: c1 [1, -1] -> ±Φ^{-1}(3/4), c2 [1, 1]
    # (one tie) -> [0, 0], mean [1, 0] -> [Φ^{-1}(3/4), -Φ^{-1}(3/4)]; b: c1 [2, 0, 0] ->
    # [Φ^{-1}(5/6), Φ^{-1}(1/3), Φ^{-1}(1/3)] = the mean's scores (ρ = 1), c2 zero -> [0, 0, 0]
    z34, z56, z13 = (float(torch.special.ndtri(torch.tensor(u, dtype=torch.float64)))
                     for u in (0.75, 5 / 6, 1 / 3))
    q_a, q_b = _softmax([z34, -z34]), _softmax([z56, z13, z13])
    rho_rank = {
        "c1": {"a": _expected(_softmax([z34, -z34]), q_a), "b": 1.0},
        "c2": {"a": _expected([0.5, 0.5], q_a), "b": _expected([1 / 3] * 3, q_b)},
    }
    assert rho_rank["c2"]["a"] == pytest.approx(1 / (4 * q_a[0] * q_a[1]))
    for reading, hand in (("update_direction", rho_unit), ("update_direction_raw", rho_raw),
                          ("update_direction_rank", rho_rank)):
        server = FedSummServer(FedSummConfig(epsilon=EPS, reading=reading), ["c1", "c2"], seed=0)
        w_next, log = server.server_round(1, w_t, replies)
        for c in params:
            assert log["rho"][c] == pytest.approx((hand[c]["a"] + hand[c]["b"]) / 2, rel=1e-6)
            g = server.guidance_for(c).modulated_gradient
            for k in ("a", "b"):
                assert torch.allclose(
                    g[k], (w_t[k] - params[c][k]) * EPS * hand[c][k], rtol=1e-6, atol=1e-7
                )
        # w_next = w_t + mean_c (1 + ερ_{c,k}) Δ^c_k
        for k in ("a", "b"):
            expected = w_t[k] + sum(
                (1 + EPS * hand[c][k]) * (params[c][k] - w_t[k]) for c in params
            ) / 2
            assert torch.allclose(w_next[k], expected, atol=1e-6)
        # FedAvg under the same reading logs the same ρ (Fig. 6) and steps plainly
        avg = FedAvgServer(FedSummConfig(epsilon=EPS, reading=reading), ["c1", "c2"], seed=0)
        w_avg, log_avg = avg.server_round(1, w_t, replies)
        assert log_avg["rho"] == log["rho"] and "update_difference" not in log_avg
        assert log_avg["round"] == 1 and log_avg["clients"] == ["c1", "c2"]
        assert log_avg["losses"] == {c: float(replies[c].loss) for c in ("c1", "c2")}
        assert torch.allclose(w_avg["a"], torch.tensor([2.0, 2.0]))


# ----------------------------------------------------------------------------- rank-based normal scores
def _ndtri(u) -> torch.Tensor:
    return torch.special.ndtri(torch.tensor(u, dtype=torch.float64)).float()


def test_normal_scores_hand_computation():
    """z_i = Φ^{-1}((#below + #equal/2)/d): ties (±0 are one value) share their mid-rank."""
    x = torch.tensor([3.0, -1.0, 0.0, -0.0, 2.0])
    assert torch.equal(normal_scores(x), _ndtri([0.9, 0.1, 0.4, 0.4, 0.7]))
    assert torch.equal(normal_scores(torch.zeros(2, 3)), torch.zeros(2, 3))
    assert torch.equal(normal_scores(torch.tensor([7.0])), torch.zeros(1))
    assert normal_scores(torch.zeros(0)).shape == (0,)
    # a sparse row: 6 zeros, 2 negative, 2 positive of 10 entries
    sparse = torch.tensor([0.0, -5.0, 0.0, 0.0, 1e-3, 0.0, -1e-6, 0.0, 0.0, 40.0])
    u = [0.5, 0.05, 0.5, 0.5, 0.85, 0.5, 0.15, 0.5, 0.5, 0.95]
    assert torch.equal(normal_scores(sparse), _ndtri(u))
    # values distinct at bfloat16 (8 significant bits): the exact rank transform, any shape
    g = torch.Generator().manual_seed(0)
    v = torch.unique(torch.randn(4000, generator=g).to(torch.bfloat16).float())
    v = v[torch.randperm(v.numel(), generator=g)].reshape(-1, 1)
    ranks = torch.argsort(torch.argsort(v.reshape(-1))).double()
    exact = torch.special.ndtri((ranks + 0.5) / v.numel()).float().reshape(v.shape)
    assert torch.equal(normal_scores(v), exact)


def test_normal_scores_invariances():
    """Invariant to a power-of-two scale (bit for bit); another positive scale or a signed power
    (an increasing map) moves scores only where entries cross 8-bit rounding buckets; heavy tails
    still give N(0, 1) scores.  AdamW's first step lr·g/(|g| + eps) ranks as sign(g)."""
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(50_000, generator=g) * torch.rand(50_000, generator=g).pow(4)
    base = normal_scores(grad)
    assert torch.equal(normal_scores(grad * 2.0**-14), base)
    for other in (grad * 0.37, grad.sign() * grad.abs().sqrt()):
        diff = (normal_scores(other) - base).abs()
        assert float(diff.mean()) < 5e-3 and float(diff.max()) < 0.25
    z = normal_scores(torch.randn(1 << 16, generator=g) ** 3)  # heavy tails: still N(0, 1)
    assert abs(float(z.mean())) < 1e-3 and float(z.std()) == pytest.approx(1.0, abs=2e-3)
    grad = 1e-3 * torch.randn(50_000, generator=g)  # |g| > 256·eps but for 0.2 % of entries
    adamw = normal_scores(5e-5 * grad / (grad.abs() + 1e-8))
    assert float((adamw - normal_scores(grad.sign())).abs().mean()) < 0.01


@pytest.mark.parametrize("r", [1.0, 0.9, 0.5, 0.0])
def test_rank_reading_rho_is_a_function_of_the_rank_correlation(r):
    """Client and mean directions of a Gaussian copula with correlation r: after the normal-score
    transform Σ p²/q → E[e^{2a−b}]·E[e^b]/E[e^a]² = exp(2(1 − r)) (``mean``: exp(1 − r)) for any
    marginals, here cubed (heavy-tailed) client entries; identical directions give 1 exactly."""
    g = torch.Generator().manual_seed(2)
    d = 1 << 18
    a = torch.randn(d, generator=g)
    b = r * a + math.sqrt(1 - r * r) * torch.randn(d, generator=g)
    p = torch.softmax(normal_scores(a**3 if r < 1 else a), 0)
    q = torch.softmax(normal_scores(b), 0)
    (expected,) = discrepancy_ratios([p], [q], "expected")
    (mean,) = discrepancy_ratios([p], [q], "mean")
    if r == 1.0:  # p = q: every ratio is 1, ρ = Σ p_i (float64) and the plain mean of ones
        assert expected == pytest.approx(1.0, abs=1e-12) and mean == 1.0
    else:
        assert expected == pytest.approx(math.exp(2 * (1 - r)), rel=0.02)
        assert mean == pytest.approx(math.exp(1 - r), rel=0.01)


def _round_rho(reading: str, w_t: OrderedDict, updates: dict) -> float:
    """Round-1 mean ρ of a FedAvg server (Fig. 6's curve) on ``w_t + Δ_c``."""
    server = FedAvgServer(FedSummConfig(reading=reading), sorted(updates), seed=0)
    replies = {c: _reply(OrderedDict((k, w_t[k] + u[k]) for k in w_t), w_t, 1.0)
               for c, u in updates.items()}
    return server.server_round(1, w_t, replies)[1]["rho_mean"]


def _dense_updates(d: int, g) -> dict:
    """4 clients: a shared direction plus as much client noise (dense Gaussian)."""
    shared = torch.randn(d, generator=g)
    return {f"c{i}": OrderedDict(w=1e-4 * (shared + torch.randn(d, generator=g))) for i in range(4)}


def _embedding_updates(rows: int, g, sgd: bool) -> dict:
    """Embedding-like 32-column rows, 4 clients of 2 examples: each moves 4 rows every client
    moves (frequent tokens) and 4 of its own, Gaussian on those rows; elsewhere exactly 0 (AdamW's
    first step where g = 0) or, ``sgd``, dense rows 10⁴ times smaller (the tied LM head's gradient
    on every row, shared across clients)."""
    common = torch.randn(4, 32, generator=g)
    background = torch.randn(rows, 32, generator=g)
    out = {}
    for i in range(4):
        u = 1e-4 * background + 1e-4 * 0.3 * torch.randn(rows, 32, generator=g) if sgd \
            else torch.zeros(rows, 32)
        own = 4 + 4 * i + torch.arange(4)
        u[:4] = common + torch.randn(4, 32, generator=g)
        u[own] = torch.randn(4, 32, generator=g)
        out[f"c{i}"] = OrderedDict(w=u)
    return out


def test_rho_dimension_sweep_old_reading_grows_rank_reading_stays_in_band():
    """Issue 23: at bart-base-chinese's size ρ was 616 under ``update_direction``.  Its unit-RMS
    scaling makes the k moved entries of d ~ sqrt(d/k) large, and the softmax concentrates on them
    exponentially: with the same 8 rows moved, ρ grows with the table (64 → 1,024 → 16,384 rows:
    ~20–80 → ~10⁹ → non-finite once a ratio overflows).  Under ``update_direction_rank`` ρ stays
    within [1.5, 3.5] at every size and structure, and on dense Gaussian updates (where unit RMS
    is already a normal score) both readings give exp(2(1 − r)) at every size, within 3 %."""
    g = torch.Generator().manual_seed(3)
    w_small = lambda n: OrderedDict(w=torch.zeros(n))  # noqa: E731
    dense = {}
    for d in (1 << 10, 1 << 14, 1 << 18):
        ups = _dense_updates(d, g)
        dense[d] = {r: _round_rho(r, w_small(d), ups)
                    for r in ("update_direction", "update_direction_rank")}
    # Δ_c = s + n_c, mean = s + n̄ (Var n̄ = 1/4): r = 1.25 / sqrt(2 · 1.25), ρ = exp(2(1 − r))
    r = 1.25 / math.sqrt(2 * 1.25)
    for d, v in dense.items():
        assert v["update_direction_rank"] == pytest.approx(math.exp(2 * (1 - r)), rel=0.03)
        assert v["update_direction_rank"] == pytest.approx(v["update_direction"], rel=0.03)
    for sgd in (False, True):
        old, new = [], []
        for rows in (64, 1024, 16384):
            ups = _embedding_updates(rows, g, sgd)
            w_t = OrderedDict(w=torch.zeros(rows, 32))
            old.append(_round_rho("update_direction", w_t, ups))
            new.append(_round_rho("update_direction_rank", w_t, ups))
        # measured: rank 2.45, 3.00, 2.41 (AdamW-like), 2.70, 2.72, 2.00 (SGD-like); unit RMS
        # 21, 8e8, nan and 78, 1e10, nan
        assert all(1.5 <= x <= 3.5 for x in new), new
        assert old[0] < 100 and old[1] > 1e6 * old[0], old
        assert not math.isfinite(old[2]) or old[2] > old[1], old


# ----------------------------------------------------------------------------- literal: ρ − 1 = O(δ²)
@pytest.mark.parametrize("delta", [1e-4, 1e-3, 1e-2, 5e-2])
def test_literal_rho_minus_one_is_second_order_in_the_deviation(delta):
    """Weights ~ N(0, 0.02²), each client off by δ·N(0, 1) per entry: the literal scalar ρ − 1 is
    χ² ≈ Var(δ) = δ² (1e-6 at δ = 1e-3; resolved down to 1e-8 at δ = 1e-4 since both sums are
    normalised in float64 -- unnormalised, the float32 softmaxes' sums put a ±1e-6 floor on it),
    its entries ρ_i − 1 are first order (p99 ≈ 2.33 δ), and the FedSUMM step is FedAvg's times
    1 + ερ (nothing beyond the step length).  The unit-RMS update reading on the same replies:
    ρ − 1 of order one."""
    g = torch.Generator().manual_seed(0)
    n = 200_000
    w_t = OrderedDict(w=0.02 * torch.randn(n, generator=g), v=0.02 * torch.randn(1000, generator=g))
    params = {
        c: OrderedDict((k, w_t[k] + delta * torch.randn(w_t[k].shape, generator=g)) for k in w_t)
        for c in ("a", "b")
    }
    replies = {c: _reply(params[c], w_t, 2.0 - i) for i, c in enumerate(params)}  # rank swaps
    server = FedSummServer(FedSummConfig(epsilon=0.1, rho_reference="broadcast"), ["a", "b"], 0)
    _, log = server.server_round(1, w_t, replies)
    for c in params:
        # Gaussian δ: χ² = exp(δ²) − 1 ≈ δ²; ρ_i = exp(δ_i)/E[exp δ] = exp(δ_i − δ²/2)
        assert log["rho"][c] - 1 == pytest.approx(math.expm1(delta**2), rel=0.05)
        par = log["rho_statistics"][c]["parameter"]
        assert par["p99"] == pytest.approx(math.expm1(2.326 * delta - delta**2 / 2), rel=0.05)
        assert par["p1"] == pytest.approx(math.expm1(-2.326 * delta - delta**2 / 2), rel=0.05)
        assert abs(par["p50"]) < 0.05 * delta
    diff = log["update_difference"]
    assert diff["rel_diff"] == pytest.approx(0.1 * math.exp(delta**2), rel=1e-3)
    assert diff["best_scale"] - 1 == pytest.approx(0.1 * math.exp(delta**2), rel=1e-3)
    # beyond the step length, and what the sort by loss (rank: a and b swap entries) changes:
    # ε·(ρ_a − ρ_b) ~ 1e-4·δ², below float32's rounding of the updates (~1e-6 relative)
    assert diff["rel_diff_beyond_scale"] < 1e-5 and diff["rel_diff_vs_rank"] < 1e-5
    unit = FedSummServer(FedSummConfig(epsilon=0.1, reading="update_direction"), ["a", "b"], 0)
    _, log_u = unit.server_round(1, w_t, replies)
    assert all(0.2 < r - 1 < 5 for r in log_u["rho"].values())


# ----------------------------------------------------------------------------- the statistics
def test_rho_statistics_hand_computation():
    sc = [torch.tensor([0.5, 0.25, 0.25])]
    sg = [torch.tensor([0.25, 0.5, 0.25])]
    slices = [[("a", 0, 2), ("b", 2, 1)]]
    (group,) = discrepancy_ratios(sc, sg, "expected")  # Σ p·ratio = 0.5·2 + 0.25·0.5 + 0.25
    assert group == pytest.approx(1.375)
    st = rho_statistics(sc, sg, slices, "expected", group_values=[group])
    # ρ_i − 1 = [1, −0.5, 0]; linear quantiles: p1 = −0.5 + 0.02·0.5, p99 = 0 + 0.98·1
    assert st["parameter"] == pytest.approx(
        {"min": -0.5, "p1": -0.49, "p50": 0.0, "p99": 0.98, "max": 1.0, "mean": 1 / 6}
    )
    # per tensor, expected: a = (0.5·2 + 0.25·0.5)/0.75 = 1.5, b = 1 -> [0.5, 0]
    assert st["tensor"] == pytest.approx(
        {"min": 0.0, "p1": 0.005, "p50": 0.25, "p99": 0.495, "max": 0.5, "mean": 0.25}
    )
    assert st["group"] == pytest.approx({k: 0.375 for k in st["group"]})
    # mean reduction per tensor: a = (2 + 0.5)/2 = 1.25, b = 1
    st = rho_statistics(sc, sg, slices, "mean")
    assert st["tensor"]["max"] == pytest.approx(0.25) and "group" not in st
    assert deviation_summary([3.0]) == {k: 3.0 for k in ("min", "p1", "p50", "p99", "max", "mean")}


def _summary(values) -> dict:
    return dict(zip(("min", "p1", "p50", "p99", "max"), np.quantile(values, [0, 0.01, 0.5, 0.99, 1])),
                mean=float(np.mean(values)))


@pytest.mark.parametrize("reduction", ["expected", "mean"])
def test_rho_statistics_and_ratios_chunk_by_chunk_equal_the_hand_values(monkeypatch, reduction):
    """Three tensors of one softmax group, cut into chunks of 2 entries (so chunks cross no
    tensor but a tensor spans several): eq. 5's ρ and the statistics of ρ − 1 as written out
    here in float64, whatever the chunk size and whether S_g's sum is passed in."""
    from fedrepro.papers.fedsumm import algorithm as A

    g = torch.Generator().manual_seed(3)
    raw_c, raw_g = torch.rand(9, generator=g) + 0.1, torch.rand(9, generator=g) + 0.1
    sc, sg = [2 * raw_c / raw_c.sum()], [2 * raw_g / raw_g.sum()]  # S over two rounds
    slices = [[("a", 0, 3), ("b", 3, 2), ("c", 5, 4)]]
    p = sc[0].double() / sc[0].double().sum()
    q = sg[0].double() / sg[0].double().sum()
    ratio = p / q
    rho = float((p * ratio).sum()) if reduction == "expected" else float(ratio.mean())
    dev = (ratio - 1).numpy()
    parameter = _summary(dev)
    tensors = []
    for _, start, n in slices[0]:
        part = slice(start, start + n)
        tensors.append(float((p[part] * ratio[part]).sum() / p[part].sum()) - 1
                       if reduction == "expected" else float(ratio[part].mean()) - 1)
    tensor = _summary(tensors)
    for chunk in (A._RATIO_CHUNK, 2):
        monkeypatch.setattr(A, "_RATIO_CHUNK", chunk)
        for totals in (None, A.global_totals(sg)):
            (got,) = discrepancy_ratios(sc, sg, reduction, totals)
            assert got == pytest.approx(rho, rel=1e-9), chunk
            st = rho_statistics(sc, sg, slices, reduction, group_values=[got],
                                global_totals=totals)
            assert st["parameter"] == pytest.approx(parameter, rel=1e-5, abs=1e-6), chunk
            assert st["tensor"] == pytest.approx(tensor, rel=1e-5, abs=1e-6), chunk
            assert st["group"] == pytest.approx({k: rho - 1 for k in st["group"]}, rel=1e-9)


@pytest.mark.parametrize("reduction", ["expected", "mean"])
def test_rho_and_statistics_of_several_groups_each_normalised_by_its_own_sums(monkeypatch, reduction):
    """Two softmax groups of different sizes and totals (per-layer scope): ρ_G and every
    statistic in float64 by hand, each group normalised by its *own* ΣS_c and ΣS_g -- from one
    pass (``rho_and_statistics``) as from the two functions the tracker used to call."""
    from fedrepro.papers.fedsumm import algorithm as A

    g = torch.Generator().manual_seed(5)
    sizes = (5, 7)
    sc = [(torch.rand(n, generator=g) + 0.1) * w for n, w in zip(sizes, (1.0, 9.0))]
    sg = [(torch.rand(n, generator=g) + 0.1) * w for n, w in zip(sizes, (3.0, 0.5))]
    slices = [[("a", 0, 2), ("b", 2, 3)], [("c", 0, 4), ("d", 4, 3)]]
    groups, ratios, tensors = [], [], []
    for c, q_raw, group in zip(sc, sg, slices):
        p = c.double() / c.double().sum()
        q = q_raw.double() / q_raw.double().sum()
        ratio = p / q
        groups.append(float((p * ratio).sum()) if reduction == "expected" else float(ratio.mean()))
        ratios.append((ratio - 1).numpy())
        for _, start, n in group:
            part = slice(start, start + n)
            tensors.append(float((p[part] * ratio[part]).sum() / p[part].sum()) - 1
                           if reduction == "expected" else float(ratio[part].mean()) - 1)
    for chunk in (A._RATIO_CHUNK, 3):
        monkeypatch.setattr(A, "_RATIO_CHUNK", chunk)
        got, st = A.rho_and_statistics(sc, sg, slices, reduction)
        assert got == pytest.approx(groups, rel=1e-12), chunk
        assert discrepancy_ratios(sc, sg, reduction, A.global_totals(sg)) == pytest.approx(groups, rel=1e-12)
        assert st["parameter"] == pytest.approx(_summary(np.concatenate(ratios)), rel=1e-5, abs=1e-6)
        assert st["tensor"] == pytest.approx(_summary(tensors), rel=1e-9, abs=1e-12)
        assert st["group"] == pytest.approx(_summary([v - 1 for v in groups]), rel=1e-9)
        assert rho_statistics(sc, sg, slices, reduction, group_values=got) == st
    with pytest.raises(InputError, match="its slices cover 4"):
        A.rho_and_statistics(sc[:1], sg[:1], [[("a", 0, 4)]], reduction)
    with pytest.raises(InputError, match="2 softmax groups but slices for 1"):
        A.rho_and_statistics(sc, sg, slices[:1], reduction)
    with pytest.raises(InputError, match="2 softmax groups but global totals for 1"):
        A.rho_and_statistics(sc, sg, slices, reduction, A.global_totals(sg)[:1])
    with pytest.raises(InputError, match="2 softmax groups but global totals for 1"):
        discrepancy_ratios(sc, sg, reduction, A.global_totals(sg)[:1])
    if reduction == "expected":  # eq. 5 as printed is the default of all three
        assert discrepancy_ratios(sc, sg) == got
        assert A.rho_and_statistics(sc, sg, slices) == (got, st)
        assert rho_statistics(sc, sg, slices) == {k: v for k, v in st.items() if k != "group"}


def test_the_ratios_use_the_callers_totals_and_numpy_quantiles_on_the_cpu(monkeypatch):
    """ΣS_g passed in (``global_totals``: once per round for every client sharing S_g) is not
    summed again -- by the functions nor by the tracker, whose round sums each S_g once -- and on
    the CPU the quantiles of ρ − 1 are NumPy's partition, not a sort of 10^8 entries."""
    from fedrepro.papers.fedsumm import algorithm as A

    sc = [torch.tensor([0.5, 0.25, 0.25]), torch.tensor([0.4, 0.6])]
    sg = [torch.tensor([0.25, 0.5, 0.25]), torch.tensor([0.5, 0.5])]
    slices = [[("a", 0, 3)], [("b", 0, 2)]]
    totals = A.global_totals(sg)
    want = A.rho_and_statistics(sc, sg, slices)
    calls = []
    real_sum = A._float64_sum
    monkeypatch.setattr(A, "_float64_sum", lambda t: calls.append(t.numel()) or real_sum(t))

    def no_sort(values):
        raise AssertionError("the CPU's quantiles went through a sort")

    monkeypatch.setattr(A, "_deviation_summary_torch", no_sort)
    assert A.discrepancy_ratios(sc, sg, "expected", totals) == want[0]
    assert A.rho_and_statistics(sc, sg, slices, "expected", totals) == want
    assert A.rho_statistics(sc, sg, slices, global_totals=totals) == {
        k: v for k, v in want[1].items() if k != "group"}
    assert calls == []
    # a tracker round of three clients that share S_g: ΣS_g once per group, for both paths
    zeros = OrderedDict(a=torch.zeros(2), b=torch.zeros(1))
    moved = {c: OrderedDict(a=torch.tensor([0.1 * i, 0.0]), b=torch.zeros(1)) for i, c in
             enumerate("cde", start=1)}
    for window in ("cumulative", "round"):
        for statistics in (False, True):
            calls.clear()
            DiscrepancyTracker(window=window).update_round_detailed(moved, zeros, statistics=statistics)
            assert calls == [3], (window, statistics)


def test_a_shared_global_sum_read_back_for_a_client_after_one_with_other_rounds():
    """Partial participation: in round 2, a and c (both in round 1) share S_g, b (new) has its own;
    in the order a, b, c the tracker reads a's S_g back for c after b's replaced it.  Every client's
    ρ and statistics equal those of a tracker that saw only that client's rounds."""
    g = torch.Generator().manual_seed(11)
    shapes = {"w": (3, 2), "b": (2,)}

    def params():
        return OrderedDict((k, torch.randn(*s, generator=g)) for k, s in shapes.items())

    w1, w2 = params(), params()
    r1 = {"a": params(), "c": params()}
    r2 = {"a": params(), "b": params(), "c": params()}
    shared = DiscrepancyTracker()
    shared.update_round_detailed(r1, w1, statistics=True)
    got = shared.update_round_detailed(r2, w2, statistics=True)
    assert shared.global_sums["a"] == shared.global_sums["c"] != shared.global_sums["b"]
    for c in r2:
        alone = DiscrepancyTracker()
        if c in r1:
            alone.update_round_detailed({c: r1[c]}, w1)
        want = alone.update_round_detailed({c: r2[c]}, w2, statistics=True)[c]
        assert (got[c].rho, got[c].groups, got[c].statistics) == (
            want.rho, want.groups, want.statistics), c


def test_tracker_defaults_validation_and_its_own_store():
    """A tracker made without arguments is eq. 5 as printed (global softmax, ``expected``,
    cumulative) on a store of its own that keeps only the live sums; its state round-trips;
    unknown settings are refused."""
    zeros = od(a=[0.0, 0.0], b=[0.0])
    tracker = DiscrepancyTracker()
    assert tracker.update("c", od(a=[0.0, LN2], b=[0.0]), zeros) == pytest.approx(1.125)
    assert tracker.update("c", zeros, zeros) == pytest.approx(3 * 198 / 576)  # cumulative
    assert tracker.store.nbytes() == 2 * 3 * 4  # S_c and S_g of the last round, float32
    again = DiscrepancyTracker()
    again.load_state_dict(tracker.state_dict())
    assert again.update("c", zeros, zeros) == tracker.update("c", zeros, zeros)
    for kwargs in ({"reduction": "median"}, {"window": "weekly"}, {"scope": "per_row"}):
        with pytest.raises(InputError):
            DiscrepancyTracker(**kwargs)
    with pytest.raises(InputError, match="rho_scope/rho_reduction/rho_window"):
        DiscrepancyTracker(window="round").load_state_dict(tracker.state_dict())


def test_tracker_statistics_follow_the_cumulative_sums():
    """Round 2's statistics are those of the summed softmaxes (eq. 5's Σ over t)."""
    tracker = DiscrepancyTracker(scope="per_tensor", window="cumulative")
    zeros = od(a=[0.0, 0.0], b=[0.0])
    tracker.update_round_detailed({"c": od(a=[LN2, 0.0], b=[0.0])}, zeros, statistics=True)
    out = tracker.update_round_detailed({"c": zeros}, zeros, statistics=True)["c"]
    # S_c,a = [2/3, 1/3] + [1/2, 1/2] = [7/6, 5/6], S_g,a = [1, 1]: ρ_i − 1 = [1/6, −1/6]
    assert out.statistics["parameter"]["max"] == pytest.approx(1 / 6)
    assert out.statistics["parameter"]["min"] == pytest.approx(-1 / 6)
    # expected over a: Σ S²/S_g / Σ S = (49 + 25)/36 / 2 = 37/36; b: 1
    assert out.groups == pytest.approx([37 / 36, 1.0])
    assert out.rho == pytest.approx((37 / 36 + 1) / 2)


def test_update_difference_hand_computation():
    plain = [od(w=[1.0, 0.0]), od(w=[0.0, 1.0])]  # Δ_A = [0.5, 0.5]
    scaled = [od(w=[1.2, 0.0]), od(w=[0.0, 1.2])]  # same ρ for both: FedAvg × 1.2
    d = update_difference(scaled, plain)
    assert d["rel_diff"] == pytest.approx(0.2) and d["best_scale"] == pytest.approx(1.2)
    assert d["rel_diff_beyond_scale"] == pytest.approx(0.0, abs=1e-12)
    assert d["cosine"] == pytest.approx(1.0) and d["norm_fedavg"] == pytest.approx(math.sqrt(0.5))
    tilted = [od(w=[1.4, 0.0]), od(w=[0.0, 1.0])]  # Δ_S = [0.7, 0.5], d = [0.2, 0]
    d = update_difference(tilted, plain)
    # ‖d‖/‖Δ_A‖ = 0.2/√0.5; s = 1 + ⟨d, Δ_A⟩/‖Δ_A‖² = 1 + 0.1/0.5 = 1.2;
    # Δ_S − 1.2·Δ_A = [0.1, −0.1] -> √0.02/√0.5 = 0.2
    assert d["rel_diff"] == pytest.approx(0.2 / math.sqrt(0.5))
    assert d["best_scale"] == pytest.approx(1.2)
    assert d["rel_diff_beyond_scale"] == pytest.approx(0.2)
    assert d["cosine"] == pytest.approx(1.2 / math.sqrt(0.74) / math.sqrt(2))


# ----------------------------------------------------------------------------- reruns
def _trace(reading: str, assignment: str = "own") -> list:
    cfg = FedSummConfig(epsilon=0.3, reading=reading, memory_assignment=assignment)
    server = FedSummServer(cfg, ["a", "b", "c"], seed=5)
    g = torch.Generator().manual_seed(3)
    w = OrderedDict(**{"l.0.x": torch.randn(6, 4, generator=g), "l.0.y": torch.randn(4, generator=g),
                       "h.z": torch.randn(5, generator=g)})
    out = []
    for t in range(1, 4):
        replies = {}
        for i, c in enumerate(server.sample_clients(t)):
            params = OrderedDict((k, v + 0.1 * torch.randn(v.shape, generator=g)) for k, v in w.items())
            replies[c] = _reply(params, w, float(torch.rand((), generator=g)) + i)
        w, log = server.server_round(t, w, replies)
        out.append((w, log))
    return out


@pytest.mark.parametrize("reading", READINGS)
def test_same_seed_same_bits_and_the_log_holds_the_statistics(reading):
    a, b = _trace(reading), _trace(reading)
    for (wa, la), (wb, lb) in zip(a, b):
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        assert la["rho"] == lb["rho"] and la["rho_statistics"] == lb["rho_statistics"]
        assert la["update_difference"] == lb["update_difference"]
        for c, st in la["rho_statistics"].items():
            assert set(st) == {"parameter", "tensor", "group"}
            for part in st.values():
                assert set(part) == {"min", "p1", "p50", "p99", "max", "mean"}
                assert part["min"] <= part["p1"] <= part["p50"] <= part["p99"] <= part["max"]
                assert all(np.isfinite(list(part.values())))
            assert st["group"]["min"] <= la["rho"][c] - 1 <= st["group"]["max"] + 1e-12
        assert set(la["update_difference"]) == {
            "rel_diff", "best_scale", "rel_diff_beyond_scale", "cosine", "norm_fedavg",
            "rel_diff_vs_rank",
        }


def test_rho_summary_row_of_a_round_log_entry():
    from fedrepro.papers.fedsumm.report import RHO_SUMMARY_COLUMNS, rho_summary

    part = lambda lo, mid, hi: {"min": lo, "p1": lo, "p50": mid, "p99": hi, "max": hi, "mean": mid}
    entry = {
        "rho": {"a": 1.5, "b": 1.25},
        "rho_statistics": {
            "a": {"parameter": part(-0.5, 0.1, 2.0), "tensor": part(0.0, 0.2, 1.0),
                  "group": part(0.0, 0.3, 1.0)},
            "b": {"parameter": part(-0.25, 0.3, 1.0), "tensor": part(0.1, 0.4, 0.5),
                  "group": part(0.1, 0.5, 0.5)},
        },
        "update_difference": {"rel_diff": 0.15, "best_scale": 1.12,
                              "rel_diff_beyond_scale": 0.03, "rel_diff_vs_rank": 0.01},
    }
    row = rho_summary(entry)
    assert set(row) == set(RHO_SUMMARY_COLUMNS)
    assert (row["rho_client_min"], row["rho_client_max"]) == (0.25, 0.5)
    # min over clients, max over clients, quantiles and mean averaged over clients
    assert (row["param_min"], row["param_max"]) == (-0.5, 2.0)
    assert row["param_p50"] == pytest.approx(0.2) and row["param_p1"] == pytest.approx(-0.375)
    assert (row["tensor_min"], row["tensor_max"], row["group_p50"]) == pytest.approx((0.0, 1.0, 0.4))
    assert row["update_rel_diff"] == 0.15 and row["update_rel_diff_other_assignment"] == 0.01
    fedavg = rho_summary({"rho": {"a": 1.0}, "rho_statistics": entry["rho_statistics"]})
    assert math.isnan(fedavg["update_rel_diff"]) and fedavg["param_max"] == 2.0
    assert all(math.isnan(v) for v in rho_summary({}).values())  # a log from before issue 14


def test_normal_scores_over_the_whole_float_range():
    """Entries from −3e38 to 3e38 (the extreme buckets of the bfloat16-keyed histogram, signs
    and both zeros): each distinct value its own mid-rank, in float order."""
    x = torch.tensor([3e38, -3e38, -1.0, 1e-30, -0.0, -1e-30, 1.0, 0.0, 2.5e-38, -2.5e-38, 7.0])
    order = sorted(set(float(v) for v in x))  # -0.0 == 0.0: one value
    d = x.numel()
    u = []
    for v in x.tolist():
        below = sum(1 for w in x.tolist() if w < v)
        equal = sum(1 for w in x.tolist() if w == v)
        u.append((below + equal / 2) / d)
    assert len(order) == d - 1
    assert torch.equal(normal_scores(x), _ndtri(u))
    assert torch.equal(normal_scores(-x), -normal_scores(x))
