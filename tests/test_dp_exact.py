"""FedSUMM's server-side DP (``fedrepro.fl.dp``, eq. 9-10, clipping reading) pinned to exact numbers.

Every expected value here is worked out by hand or recomputed independently in the test: the norms
of hand-made updates (3-4-5 triangles: ζ = 5, 3, 10), the median, the clip factors, the clipped
sums, and the noise, redrawn from a generator seeded like the code's (torch for the pure functions,
NumPy ``default_rng(derive_seed(seed, "fedsumm-dp", round))`` for the Flower wrapper).  Andrew et
al.'s (2021) adaptive clipping is checked against its formulas: ``b̃ = (Σ 1[ζ ≤ C] + N(0, σ_b²))/m``,
``C' = C·exp(−η(b̃ − γ))``, ``z_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2)``.  (The ε accounting lives in
:mod:`fedrepro.fl.privacy`; ``tests/test_dp.py`` checks it against dp-accounting.)
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedrepro.data.seq2seq import derive_seed
from fedrepro.fl.dp import (
    METRIC_KEYS,
    DifferentialPrivacyServerSideMedianClipping,
    clip_factor,
    dp_adaptive_clip_mean,
    dp_median_clip_mean,
    median_clip_norm,
)
from fedrepro.io import InputError

F64 = torch.float64


def upd(dtype=F64, **tensors) -> OrderedDict:
    return OrderedDict((k, torch.tensor(v, dtype=dtype)) for k, v in tensors.items())


def three_updates(dtype=F64) -> list[OrderedDict]:
    """ζ = √(9+16) = 5, √(1+4+4) = 3, √(36+64) = 10 over two tensors each (exact in float)."""
    return [
        upd(dtype, a=[3.0, 0.0], b=[4.0]),
        upd(dtype, a=[1.0, 2.0], b=[2.0]),
        upd(dtype, a=[0.0, 6.0], b=[8.0]),
    ]


# clipped at 5: the first two untouched, the third halved ([0, 3], [4]) -> sums a = [4, 5], b = [10]
CLIPPED_SUM_AT_5 = {"a": torch.tensor([4.0, 5.0], dtype=F64), "b": torch.tensor([10.0], dtype=F64)}


class FlwrLog(logging.Handler):
    """Collects what ``flwr``'s logger (the ``log`` of fl/dp.py) is given, formatted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int | None = None) -> list[str]:
        return [r.getMessage() for r in self.records if level is None or r.levelno == level]


@pytest.fixture
def flwr_log():
    handler = FlwrLog()
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


# --------------------------------------------------------------------------- eq. 9: the median
def test_median_clip_norm_exact_values_and_rejections():
    assert median_clip_norm([10.0, 5.0, 3.0]) == 5.0
    assert median_clip_norm([7.0]) == 7.0
    assert median_clip_norm([0.0, 1.0]) == 0.5  # a zero norm (an unchanged client) is a valid norm
    assert median_clip_norm([0.0, 0.0, 0.0]) == 0.0
    # taken in float64 even for float32 norms: the mean of 1 and 1 + 2^-23 is 1 + 2^-24, which
    # float32 cannot hold (a float32 median rounds it to 1)
    norms32 = np.array([1.0, 1.0 + 2.0**-23], dtype=np.float32)
    assert median_clip_norm(norms32) == 1.0 + 2.0**-24
    for bad in ([], [1.0, -1.0], [-0.5], [1.0, math.inf], [math.nan, 1.0, 2.0]):
        with pytest.raises(InputError):
            median_clip_norm(bad)


def test_clip_factor_exact():
    assert clip_factor(1.0, 0.5) == 0.5  # a norm of 1 above M is clipped like any other
    assert clip_factor(10.0, 4.0) == 0.4
    assert clip_factor(5.0, 5.0) == 1.0  # at M: untouched
    assert clip_factor(3.0, 5.0) == 1.0
    assert clip_factor(0.0, 0.0) == 1.0  # all-zero round: nothing to scale, no 0/0
    assert clip_factor(0.0, 2.0) == 1.0


# ------------------------------------------------------------ eq. 10: the clipped, noised mean
def test_median_clip_mean_three_unequal_updates_exact_noise():
    # M = median(5, 3, 10) = 5, σ = 0.1: M·σ = 0.5 on the sum (below 1 on purpose), 0.5/3 on the mean
    sigma, seed = 0.1, 7
    mean, info = dp_median_clip_mean(three_updates(), sigma, torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed)  # the noise, tensor by tensor in key order, float64
    noise = {k: torch.randn(CLIPPED_SUM_AT_5[k].shape, generator=gen, dtype=F64) for k in ("a", "b")}
    assert list(mean) == ["a", "b"]
    for k in ("a", "b"):
        assert mean[k].dtype == F64
        torch.testing.assert_close(mean[k], (CLIPPED_SUM_AT_5[k] + noise[k] * 0.5) / 3, rtol=1e-15, atol=0)
    assert info == {
        "clipping": "round_median",
        "clip_norm": 5.0,
        "noise_multiplier": 0.1,
        "noise_scale": pytest.approx(0.5, rel=1e-15),
        "noise_std_on_mean": pytest.approx(0.5 / 3, rel=1e-15),
        "num_clipped": 1,
        "num_clients": 3,
        "norms": [5.0, 3.0, 10.0],
    }
    assert isinstance(info["noise_multiplier"], float)
    # noise of std M·σ above 1 as well: σ = 0.4 -> M·σ = 2
    mean2, info2 = dp_median_clip_mean(three_updates(), 0.4, torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed)
    for k in ("a", "b"):
        expected = (CLIPPED_SUM_AT_5[k] + torch.randn(CLIPPED_SUM_AT_5[k].shape, generator=gen, dtype=F64) * 2.0) / 3
        torch.testing.assert_close(mean2[k], expected, rtol=1e-15, atol=0)
    assert info2["noise_scale"] == pytest.approx(2.0, rel=1e-15)


def test_median_clip_mean_sigma_zero_is_exact_and_draws_nothing():
    gen = torch.Generator().manual_seed(3)
    state, global_state = gen.get_state(), torch.get_rng_state()
    mean, info = dp_median_clip_mean(three_updates(), 0.0, gen)
    assert torch.equal(gen.get_state(), state)  # σ = 0: the generator is not advanced
    for k in ("a", "b"):
        assert torch.equal(mean[k], CLIPPED_SUM_AT_5[k] / 3)
    mean, _ = dp_median_clip_mean(three_updates(), 0.0)  # no generator needed
    assert torch.equal(torch.get_rng_state(), global_state)  # nor the global one touched
    assert info["noise_scale"] == 0.0 and info["noise_std_on_mean"] == 0.0 and info["noise_multiplier"] == 0.0


def test_output_dtype_is_the_first_updates_and_a_single_update_passes_through():
    # a float32 first update with float64 others: the mean comes back as float32 (the model's dtype)
    mixed = three_updates(F64)
    mixed[0] = OrderedDict((k, v.float()) for k, v in mixed[0].items())
    mean, _ = dp_median_clip_mean(mixed, 0.0)
    assert mean["a"].dtype == torch.float32 and torch.equal(mean["a"], torch.tensor([4 / 3, 5 / 3]))
    out, info = dp_adaptive_clip_mean(mixed, 5.0, 0.5, 2.0, generator=torch.Generator().manual_seed(0))
    assert out["a"].dtype == torch.float32 and out["b"].dtype == torch.float32
    # one client: M is its own norm, nothing is clipped, the mean is the update itself
    single = [upd(torch.float32, a=[3.0, 0.0], b=[4.0])]
    mean, info = dp_median_clip_mean(single, 0.0)
    assert torch.equal(mean["a"], single[0]["a"]) and torch.equal(mean["b"], single[0]["b"])
    assert mean["a"].dtype == torch.float32
    assert info["clip_norm"] == 5.0 and info["num_clipped"] == 0 and info["num_clients"] == 1
    out, info = dp_adaptive_clip_mean(single, 4.0, 0.5, 2.0, generator=torch.Generator().manual_seed(0))
    assert out["a"].dtype == torch.float32 and info["num_unclipped"] == 0 and info["num_clients"] == 1


def test_update_checks():
    with pytest.raises(InputError):
        dp_median_clip_mean([], 0.0)
    with pytest.raises(InputError, match="has tensors"):
        dp_median_clip_mean([upd(a=[1.0]), upd(b=[1.0])], 0.0)
    with pytest.raises(InputError, match="has tensors"):  # same names, another order
        dp_median_clip_mean([upd(a=[1.0], b=[2.0]), upd(b=[2.0], a=[1.0])], 0.0)
    with pytest.raises(InputError, match="shape"):  # the odd one out is the first
        dp_median_clip_mean([upd(a=[1.0]), upd(a=[1.0, 2.0]), upd(a=[3.0, 4.0])], 0.0)
    with pytest.raises(InputError, match="floating"):
        dp_median_clip_mean([upd(a=[1.0]), OrderedDict(a=torch.tensor([1]))], 0.0)
    for bad in (-0.1, math.inf, math.nan):
        with pytest.raises(InputError, match="finite number >= 0"):
            dp_median_clip_mean(three_updates(), bad, torch.Generator())


# ------------------------------------------------------------ adaptive clipping (Andrew et al.)
def test_adaptive_round_exact():
    # C_t = 5: norms 5 (exactly C: unclipped), 3 (unclipped), 10 (clipped by 1/2); σ = 1, σ_b = 4
    # (σ > 2/σ_b: the bound is σ < 2σ_b), default γ = 1/2 and η = 0.2
    c, sigma, sb, seed = 5.0, 1.0, 4.0, 21
    mean, info = dp_adaptive_clip_mean(three_updates(), c, sigma, sb, generator=torch.Generator().manual_seed(seed))
    z = (sigma**-2 - (2 * sb) ** -2) ** -0.5
    assert z == pytest.approx(8 / math.sqrt(63), rel=1e-15)  # (1 - 1/64)^(-1/2)
    gen = torch.Generator().manual_seed(seed)
    count_noise = float(torch.randn((), generator=gen, dtype=F64)) * sb  # drawn first
    b = (2 + count_noise) / 3
    for k in ("a", "b"):  # then the update's noise, key by key, std z_Δ·C_t on the sum
        noise = torch.randn(CLIPPED_SUM_AT_5[k].shape, generator=gen, dtype=F64)
        torch.testing.assert_close(mean[k], (CLIPPED_SUM_AT_5[k] + noise * (z * c)) / 3, rtol=1e-14, atol=0)
        assert mean[k].dtype == F64
    assert info == {
        "clipping": "adaptive",
        "clip_norm": 5.0,
        "next_clip_norm": pytest.approx(5.0 * math.exp(-0.2 * (b - 0.5)), rel=1e-14),
        "target_quantile": 0.5,
        "clip_norm_lr": 0.2,
        "num_unclipped": 2,
        "noisy_unclipped_fraction": pytest.approx(b, rel=1e-14),
        "clipped_count_stddev": 4.0,
        "noise_multiplier": 1.0,
        "update_noise_multiplier": pytest.approx(z, rel=1e-14),
        "noise_scale": pytest.approx(z * c, rel=1e-14),
        "noise_std_on_mean": pytest.approx(z * c / 3, rel=1e-14),
        "num_clipped": 1,
        "num_clients": 3,
        "median_norm": 5.0,
        "norms": [5.0, 3.0, 10.0],
    }
    assert all(isinstance(info[k], float) for k in ("clip_norm", "target_quantile", "clip_norm_lr",
                                                     "clipped_count_stddev", "noise_multiplier"))


def test_adaptive_geometric_step_with_explicit_quantile_and_rate():
    # γ = 0.9, η = 0.5 against C = 4 on four updates of norms 1, 2, 6, 8 (two unclipped)
    updates = [upd(w=[float(v)]) for v in (1.0, 2.0, 6.0, 8.0)]
    seed = 5
    out, info = dp_adaptive_clip_mean(updates, 4, 0.5, 0.5, 0.9, 0.5, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed)
    b = (2 + float(torch.randn((), generator=gen, dtype=F64)) * 0.5) / 4
    assert info["noisy_unclipped_fraction"] == pytest.approx(b, rel=1e-14)
    assert info["next_clip_norm"] == pytest.approx(4 * math.exp(-0.5 * (b - 0.9)), rel=1e-14)
    z = (0.5**-2 - 1.0**-2) ** -0.5  # = 1/√3
    clipped_sum = 1.0 + 2.0 + 4.0 + 4.0
    noise = float(torch.randn(1, generator=gen, dtype=F64)[0]) * z * 4
    assert float(out["w"][0]) == pytest.approx((clipped_sum + noise) / 4, rel=1e-14)
    assert info["median_norm"] == 4.0 and info["num_clipped"] == 2
    assert isinstance(info["clip_norm"], float) and info["clip_norm"] == 4.0


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"clip_norm": 0.0}, "clip norm must be a finite number > 0"),
        ({"clip_norm": -1.0}, "clip norm must be a finite number > 0"),
        ({"clip_norm": math.inf}, "clip norm must be a finite number > 0"),
        ({"clip_norm": math.nan}, "clip norm must be a finite number > 0"),
        ({"noise_multiplier": 0.0}, "noise multiplier σ must be a finite number > 0"),
        ({"noise_multiplier": -0.5}, "noise multiplier σ must be a finite number > 0"),
        ({"noise_multiplier": math.inf}, "noise multiplier σ must be a finite number > 0"),
        ({"clipped_count_stddev": 0.0}, "clipped_count_stddev must be a finite number > 0"),
        ({"clipped_count_stddev": math.inf}, "clipped_count_stddev must be a finite number > 0"),
        ({"noise_multiplier": 2.0, "clipped_count_stddev": 1.0}, "must be < 2 x"),  # σ = 2σ_b
        ({"noise_multiplier": 2.5, "clipped_count_stddev": 1.0}, "must be < 2 x"),
        ({"target_quantile": 0.0}, "target quantile must be in"),
        ({"target_quantile": 1.0}, "target quantile must be in"),
        ({"target_quantile": 1.5}, "target quantile must be in"),
        ({"target_quantile": -0.1}, "target quantile must be in"),
        ({"clip_norm_lr": 0.0}, "learning rate > 0"),
        ({"clip_norm_lr": -0.2}, "learning rate > 0"),
        ({"generator": None}, "Generator"),
    ],
)
def test_adaptive_rejects_bad_settings(kwargs, words):
    args = {"clip_norm": 5.0, "noise_multiplier": 1.0, "clipped_count_stddev": 4.0,
            "target_quantile": 0.5, "clip_norm_lr": 0.2, "generator": torch.Generator().manual_seed(0)}
    with pytest.raises(InputError, match=words):
        dp_adaptive_clip_mean(three_updates(), **{**args, **kwargs})


def test_adaptive_accepts_the_edges_of_its_settings():
    # σ just below 2σ_b (and far above 2/σ_b); γ close to 0 and 1
    for sigma, sb, gamma in ((1.0, 4.0, 0.5), (1.9, 1.0, 0.01), (0.3, 0.2, 0.99)):
        _, info = dp_adaptive_clip_mean(three_updates(), 5.0, sigma, sb, gamma, 0.2,
                                        generator=torch.Generator().manual_seed(0))
        assert info["update_noise_multiplier"] == pytest.approx((sigma**-2 - (2 * sb) ** -2) ** -0.5, rel=1e-14)


# ------------------------------------------------------------------------ the Flower wrapper
class _Grid:
    def get_node_ids(self):
        return [1, 2, 3]



class Inner(FedAvg):
    """FedAvg's configure_train; records what it is handed, returns a fixed aggregate."""

    def __init__(self, aggregate: ArrayRecord | None = None, metrics: MetricRecord | None = None):
        super().__init__(min_available_nodes=3, min_train_nodes=3)
        self.aggregate, self.metrics = aggregate, metrics
        self.calls: list[tuple] = []
        self.seen: list[dict] = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.calls.append(("aggregate_train", server_round, len(replies)))
        self.seen = [{k: v.numpy().copy() for k, v in r.content["arrays"].items()} for r in replies]
        return self.aggregate, self.metrics

    def configure_evaluate(self, server_round, arrays, config, grid):
        self.calls.append(("configure_evaluate", server_round, arrays, config, grid))
        return ["evaluate-instructions"]

    def aggregate_evaluate(self, server_round, replies):
        self.calls.append(("aggregate_evaluate", server_round, replies))
        return MetricRecord({"eval-loss": 0.25})

    def summary(self):
        self.calls.append(("summary",))


def _replies(strategy, current: dict, client_arrays: list[dict], server_round: int):
    arrays = ArrayRecord(OrderedDict((k, Array(v)) for k, v in current.items()))
    instructions = sorted(
        strategy.configure_train(server_round, arrays, ConfigRecord({}), _Grid()),
        key=lambda m: m.metadata.dst_node_id,
    )
    return [
        Message(
            RecordDict({
                "arrays": ArrayRecord(OrderedDict((k, Array(v)) for k, v in arr.items())),
                "metrics": MetricRecord({"num-examples": 1}),
            }),
            reply_to=inst,
        )
        for inst, arr in zip(instructions, client_arrays)
    ]


def test_wrapper_settings_checks():
    inner = Inner()
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            DifferentialPrivacyServerSideMedianClipping(inner, bad, 3)
    for bad in (0, -2):
        with pytest.raises(ValueError):
            DifferentialPrivacyServerSideMedianClipping(inner, 1.0, bad)
    with pytest.raises(ValueError):
        DifferentialPrivacyServerSideMedianClipping(None, 1.0, 3)
    one = DifferentialPrivacyServerSideMedianClipping(inner, 0.0, 1)  # one client a round is allowed
    assert one.num_sampled_clients == 1 and one.noise_multiplier == 0.0 and one.seed == 0  # default seed
    assert one.history == []
    assert repr(one) == "Differential Privacy Strategy Wrapper (Server-Side Median Clipping, FedSUMM eq. 9-10)"
    with pytest.raises(InputError, match="configure_train must run"):  # nothing sent yet
        one.aggregate_train(1, [])


def test_wrapper_summary_and_evaluation_are_the_inner_strategys(flwr_log):
    inner = Inner()
    dp = DifferentialPrivacyServerSideMedianClipping(inner, 0.25, 3, seed=4)
    dp.summary()
    assert [(r.levelno, r.getMessage()) for r in flwr_log.records] == [
        (logging.INFO, "\t├──> DP settings (FedSUMM eq. 9-10):"),
        (logging.INFO, "\t│\t├── Noise multiplier: 0.25"),
        (logging.INFO, "\t│\t└── Clipping norm: median of the round's update norms"),
    ]
    assert inner.calls == [("summary",)]
    arrays, config, grid = ArrayRecord(), ConfigRecord({"x": 1}), _Grid()
    assert dp.configure_evaluate(7, arrays, config, grid) == ["evaluate-instructions"]
    assert inner.calls[-1] == ("configure_evaluate", 7, arrays, config, grid)
    replies = ["r1", "r2"]
    assert dict(dp.aggregate_evaluate(8, replies)) == {"eval-loss": 0.25}
    assert inner.calls[-1] == ("aggregate_evaluate", 8, replies)


def _wrapper_round_inputs():
    """float32 model w = [1, 1], b = [2]; deltas (float64, exact): ζ = 1 − 2^-30, 5, 0.5.

    The first reply's w[0] is 2^-30: its delta 2^-30 − 1 is exact in float64 but −1 in float32, so
    the median M = 1 − 2^-30 shows the subtraction is done in float64."""
    eps = 2.0**-30
    current = {"w": np.array([1.0, 1.0], dtype=np.float32), "b": np.array([2.0], dtype=np.float32)}
    clients = [
        {"w": np.array([eps, 1.0], dtype=np.float32), "b": np.array([2.0], dtype=np.float32)},
        {"w": np.array([4.0, 1.0], dtype=np.float32), "b": np.array([6.0], dtype=np.float32)},
        {"w": np.array([1.0, 1.5], dtype=np.float32), "b": np.array([2.0], dtype=np.float32)},
    ]
    deltas = [{k: c[k].astype(np.float64) - current[k].astype(np.float64) for k in current} for c in clients]
    norms = [math.sqrt(sum(float((d[k] ** 2).sum()) for k in d)) for d in deltas]
    assert norms == [1 - eps, 5.0, 0.5]
    return current, clients, deltas, norms


@pytest.mark.parametrize("inner_metrics", [MetricRecord({"train-loss": 0.5}), None])
def test_wrapper_round_exact(task_identity, flwr_log, inner_metrics):
    current, clients, deltas, norms = _wrapper_round_inputs()
    big_m = 1 - 2.0**-30
    sigma, seed, server_round = 0.3, 9, 2
    agg = ArrayRecord(OrderedDict(
        w=Array(np.array([0.25, -1.5], dtype=np.float32)), b=Array(np.array([3.0], dtype=np.float32))
    ))
    inner = Inner(aggregate=agg, metrics=inner_metrics)
    dp = DifferentialPrivacyServerSideMedianClipping(inner, sigma, 3, seed=seed)
    replies = _replies(dp, current, clients, server_round)
    arrays, metrics = dp.aggregate_train(server_round, replies)

    # the inner strategy got this round, and each reply replaced by W_t + ΔW / max(1, ζ/M), float32
    assert inner.calls == [("aggregate_train", server_round, 3)]
    for seen, d, n in zip(inner.seen, deltas, norms):
        f = min(1.0, big_m / n)
        for k in current:
            assert seen[k].dtype == np.float32
            np.testing.assert_array_equal(seen[k], (current[k].astype(np.float64) + d[k] * f).astype(np.float32))
    # then N(0, (M·σ/m)²) per entry, drawn from default_rng(derive_seed(seed, "fedsumm-dp", round))
    rng = np.random.default_rng(derive_seed(seed, "fedsumm-dp", server_round))
    std = big_m * sigma / 3
    assert list(arrays) == ["w", "b"]
    for k in ("w", "b"):
        a = agg[k].numpy()
        expected = np.asarray(a + rng.normal(0.0, std, a.shape), dtype=np.float32)
        out = arrays[k].numpy()
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, expected)
    expected_info = {
        "clip_norm": pytest.approx(big_m, rel=1e-15),
        "noise_multiplier": sigma,
        "noise_scale": pytest.approx(big_m * sigma, rel=1e-15),
        "noise_std_on_mean": pytest.approx(std, rel=1e-15),
        "num_clipped": 1,
        "num_clients": 3,
    }
    assert {k: metrics[METRIC_KEYS[k]] for k in METRIC_KEYS} == expected_info
    if inner_metrics is not None:
        assert metrics["train-loss"] == 0.5  # the inner strategy's metrics are kept
    else:
        assert set(metrics) == set(METRIC_KEYS.values())
    assert dp.history == [{"round": server_round, **expected_info, "norms": norms}]
    messages = flwr_log.messages(logging.INFO)
    assert f"aggregate_train: updates clipped to the median norm M = {big_m:.6g}" in messages
    assert (
        f"aggregate_train: central DP noise, std {std:.6g} on the mean (M·σ = {big_m * sigma:.6g})"
        in messages
    )
    assert flwr_log.messages(logging.WARNING) == []  # 3 replies for 3 sampled clients: no warning


def test_wrapper_noise_depends_on_seed_and_round_and_sigma_zero_passes_through(task_identity, flwr_log):
    current, clients, _, _ = _wrapper_round_inputs()
    agg = ArrayRecord(OrderedDict(w=Array(np.zeros(4, dtype=np.float32))))

    def run(seed, server_round, sigma=2.0):
        dp = DifferentialPrivacyServerSideMedianClipping(Inner(aggregate=agg), sigma, 3, seed=seed)
        out, _ = dp.aggregate_train(server_round, _replies(dp, current, clients, server_round))
        return out

    big_m = 1 - 2.0**-30
    for seed, server_round in ((0, 1), (0, 3), (5, 1)):
        rng = np.random.default_rng(derive_seed(seed, "fedsumm-dp", server_round))
        expected = np.asarray(rng.normal(0.0, big_m * 2.0 / 3, 4), dtype=np.float32)
        np.testing.assert_array_equal(run(seed, server_round)["w"].numpy(), expected)
    # the default seed is 0
    dp = DifferentialPrivacyServerSideMedianClipping(Inner(aggregate=agg), 2.0, 3)
    default, _ = dp.aggregate_train(1, _replies(dp, current, clients, 1))
    np.testing.assert_array_equal(default["w"].numpy(), run(0, 1)["w"].numpy())
    # σ = 0: the inner strategy's aggregate comes back as it is (no noise, no copy)
    assert run(0, 1, sigma=0.0) is agg
    assert "aggregate_train: central DP noise, std 0 on the mean (M·σ = 0)" in flwr_log.messages(logging.INFO)


def test_wrapper_warns_when_fewer_replies_than_sampled(task_identity, flwr_log):
    current, clients, _, _ = _wrapper_round_inputs()
    dp = DifferentialPrivacyServerSideMedianClipping(
        Inner(aggregate=ArrayRecord(OrderedDict(w=Array(np.zeros(2, dtype=np.float32))))), 0.0, 4
    )
    dp.aggregate_train(1, _replies(dp, current, clients, 1))
    warnings = flwr_log.messages(logging.WARNING)
    assert len(warnings) == 1 and "(3) differs from the number of sampled clients (4)" in warnings[0]
