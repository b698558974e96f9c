"""FedSUMM's server-side DP (eq. 9–10, clipping reading): pure function and Flower wrapper."""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from itertools import pairwise

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedrepro.fl.dp import (
    METRIC_KEYS,
    DifferentialPrivacyServerSideMedianClipping,
    clip_factor,
    dp_adaptive_clip_mean,
    dp_median_clip_mean,
    geometric_clip_update,
    median_clip_norm,
    update_norm,
)
from fedrepro.fl.privacy import DPSettings, accounting_report, epsilon_per_round
from fedrepro.io import InputError


def upd(**tensors) -> OrderedDict:
    return OrderedDict((k, torch.tensor(v, dtype=torch.float32)) for k, v in tensors.items())


def test_median_rule():
    assert median_clip_norm([4.0, 1.0, 2.0]) == 2.0
    assert median_clip_norm([1.0, 2.0, 3.0, 10.0]) == 2.5  # even count: mean of the middle two
    assert (
        clip_factor(10.0, 2.5) == 0.25
        and clip_factor(1.0, 2.5) == 1.0
        and clip_factor(0.0, 0.0) == 1.0
    )
    with pytest.raises(InputError):
        median_clip_norm([])
    with pytest.raises(InputError):
        median_clip_norm([1.0, float("nan")])


def test_clipping_to_median_sigma_zero_is_mean_of_clipped():
    # norms 5, 1, 10 -> M = 5; [6, 8] is divided by max(1, 10/5) = 2 -> [3, 4]
    updates = [upd(w=[3.0, 4.0]), upd(w=[0.0, 1.0]), upd(w=[6.0, 8.0])]
    mean, info = dp_median_clip_mean(updates, noise_multiplier=0.0)
    assert torch.allclose(mean["w"], torch.tensor([2.0, 3.0]))
    assert info["clip_norm"] == 5.0 and info["num_clipped"] == 1 and info["num_clients"] == 3
    assert info["noise_scale"] == 0.0 and info["norms"] == pytest.approx([5.0, 1.0, 10.0])


def test_clipped_norms_never_exceed_median_over_tensors():
    gen = torch.Generator().manual_seed(0)
    updates = [
        OrderedDict(a=torch.randn(5, 3, generator=gen) * s, b=torch.randn(4, generator=gen) * s)
        for s in (0.1, 1.0, 3.0, 7.0, 0.5)
    ]
    norms = [update_norm(u) for u in updates]
    m = median_clip_norm(norms)
    for u, n in zip(updates, norms):
        f = clip_factor(n, m)
        clipped = OrderedDict((k, v * f) for k, v in u.items())
        assert update_norm(clipped) <= m * (1 + 1e-6)
        if n <= m:
            assert f == 1.0  # below the median: untouched
    mean, info = dp_median_clip_mean(updates, 0.0)
    manual = sum(u["a"].double() * clip_factor(n, m) for u, n in zip(updates, norms)) / 5
    assert torch.allclose(mean["a"].double(), manual, atol=1e-6)
    assert info["num_clipped"] == 2


def test_noise_std_is_median_times_sigma_on_the_sum():
    n = 200_000
    # constant updates with norms 1·√n, 2·√n, 4·√n -> M = 2√n; the last one is halved
    updates = [OrderedDict(w=torch.full((n,), v)) for v in (1.0, 2.0, 4.0)]
    sigma = 1.5e-3
    mean, info = dp_median_clip_mean(updates, sigma, torch.Generator().manual_seed(11))
    big_m = 2.0 * math.sqrt(n)
    assert info["clip_norm"] == pytest.approx(big_m)
    assert info["noise_scale"] == pytest.approx(big_m * sigma)
    assert info["noise_std_on_mean"] == pytest.approx(big_m * sigma / 3)
    noise_on_sum = mean["w"].double() * 3 - (1.0 + 2.0 + 2.0)
    assert float(noise_on_sum.mean()) == pytest.approx(0.0, abs=4 * big_m * sigma / math.sqrt(n))
    assert float(noise_on_sum.std()) == pytest.approx(big_m * sigma, rel=0.01)
    again, _ = dp_median_clip_mean(updates, sigma, torch.Generator().manual_seed(11))
    other, _ = dp_median_clip_mean(updates, sigma, torch.Generator().manual_seed(12))
    assert torch.equal(mean["w"], again["w"]) and not torch.equal(mean["w"], other["w"])


def test_bad_input():
    with pytest.raises(InputError, match="Generator"):
        dp_median_clip_mean([upd(w=[1.0])], 1.0)
    with pytest.raises(InputError, match=">= 0"):
        dp_median_clip_mean([upd(w=[1.0])], -1.0)
    with pytest.raises(InputError, match="shape"):
        dp_median_clip_mean([upd(w=[1.0]), upd(w=[1.0, 2.0])], 0.0)
    with pytest.raises(InputError, match="floating"):
        dp_median_clip_mean([OrderedDict(w=torch.tensor([1]))], 0.0)


# ----------------------------------------------------------------------------- Flower wrapper
class _Grid:
    """Just enough of a Flower Grid for FedAvg.configure_train: three connected nodes."""

    def get_node_ids(self):
        return [1, 2, 3]



def _round(strategy, current: dict, client_arrays: list[dict], server_round: int = 1):
    arrays = ArrayRecord(OrderedDict((k, Array(v)) for k, v in current.items()))
    instructions = sorted(
        strategy.configure_train(server_round, arrays, ConfigRecord({}), _Grid()),
        key=lambda m: m.metadata.dst_node_id,
    )
    assert len(instructions) == len(client_arrays)
    replies = [
        Message(
            RecordDict(
                {
                    "arrays": ArrayRecord(OrderedDict((k, Array(v)) for k, v in arr.items())),
                    "metrics": MetricRecord({"num-examples": 1, "train-loss": 0.5}),
                }
            ),
            reply_to=inst,
        )
        for inst, arr in zip(instructions, client_arrays)
    ]
    return strategy.aggregate_train(server_round, replies)


def test_wrapper_around_fedavg_matches_pure_function(task_identity):
    current = {"w": np.array([1.0, 1.0], dtype=np.float32), "b": np.zeros(1, dtype=np.float32)}
    deltas = [
        {"w": np.array([3.0, 4.0]), "b": np.array([0.0])},
        {"w": np.array([0.0, 1.0]), "b": np.array([0.0])},
        {"w": np.array([6.0, 8.0]), "b": np.array([0.0])},
    ]
    clients = [{k: (current[k] + d[k]).astype(np.float32) for k in current} for d in deltas]
    dp = DifferentialPrivacyServerSideMedianClipping(
        FedAvg(min_available_nodes=3, min_train_nodes=3),
        noise_multiplier=0.0,
        num_sampled_clients=3,
        seed=5,
    )
    arrays, metrics = _round(dp, current, clients)
    # M = 5, third update halved -> mean delta [2, 3]; FedAvg's equal weights give the plain mean
    assert np.allclose(arrays["w"].numpy(), [3.0, 4.0]) and np.allclose(arrays["b"].numpy(), [0.0])
    assert metrics[METRIC_KEYS["clip_norm"]] == pytest.approx(5.0)
    assert metrics[METRIC_KEYS["num_clipped"]] == 1 and metrics[METRIC_KEYS["noise_scale"]] == 0.0
    assert metrics["train-loss"] == pytest.approx(0.5)  # the inner strategy's metrics are kept
    pure, _ = dp_median_clip_mean(
        [OrderedDict((k, torch.tensor(v)) for k, v in d.items()) for d in deltas], 0.0
    )
    assert np.allclose(arrays["w"].numpy(), current["w"] + pure["w"].numpy())


def test_wrapper_noise_scale_recorded_and_seeded(task_identity):
    n = 30_000
    current = {"w": np.zeros(n, dtype=np.float32)}
    clients = [{"w": np.full(n, v, dtype=np.float32)} for v in (0.5, 1.0, 3.0)]
    sigma = 0.01

    def run(seed):
        dp = DifferentialPrivacyServerSideMedianClipping(
            FedAvg(min_available_nodes=3, min_train_nodes=3),
            noise_multiplier=sigma,
            num_sampled_clients=3,
            seed=seed,
        )
        arrays, metrics = _round(dp, current, clients)
        return arrays["w"].numpy(), metrics, dp

    out, metrics, dp = run(seed=5)
    big_m = 1.0 * math.sqrt(n)
    assert metrics[METRIC_KEYS["clip_norm"]] == pytest.approx(big_m, rel=1e-6)
    assert metrics[METRIC_KEYS["noise_scale"]] == pytest.approx(big_m * sigma, rel=1e-6)
    assert metrics[METRIC_KEYS["noise_std_on_mean"]] == pytest.approx(big_m * sigma / 3, rel=1e-6)
    assert dp.history[0]["noise_scale"] == pytest.approx(big_m * sigma, rel=1e-6)
    noise = out.astype(np.float64) - (0.5 + 1.0 + 1.0) / 3  # clipped mean is 2.5/3
    assert noise.std() == pytest.approx(big_m * sigma / 3, rel=0.03)
    assert np.array_equal(out, run(seed=5)[0]) and not np.array_equal(out, run(seed=6)[0])


# ------------------------------------------------- adaptive clipping (Andrew et al.) and accounting


def test_epsilon_equals_dp_accounting_for_hand_set_values_and_falls_with_sigma():
    # σ = 1.1, q = 20/100, 20 rounds, δ = 1e-5: the count's noise is folded into σ, so ε is that
    # of one Poisson-subsampled Gaussian with multiplier σ, composed 20 times
    dp = DPSettings(enabled=True, noise_multiplier=1.1, delta=1e-5, clipped_count_stddev=None)
    eps = epsilon_per_round(dp, 20, 20, 100)
    acc = RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.1)), 20)
    assert eps[-1] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert eps[-1] == pytest.approx(6.371, abs=1e-3)  # dp-accounting 0.6.0's number, pinned
    one = RdpAccountant()
    one.compose(dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.1)), 1)
    assert eps[0] == pytest.approx(one.get_epsilon(1e-5), rel=1e-9)
    assert all(a < b for a, b in pairwise(eps))  # spent budget grows every round
    # the update's z_Δ and the count's 2σ_b compose to σ: (1/z_Δ² + 1/(2σ_b)²)^(-1/2) = σ
    z, sb = dp.noise_split(20)
    assert sb == 1.0 and (z**-2 + (2 * sb) ** -2) ** -0.5 == pytest.approx(1.1, rel=1e-12)
    # more noise, less ε; all clients every round (q = 1): no amplification, larger ε
    finals = [epsilon_per_round(DPSettings(noise_multiplier=s, clipped_count_stddev=3.0), 5, 4, 4)[-1]
              for s in (0.5, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in pairwise(finals))
    assert epsilon_per_round(DPSettings(noise_multiplier=1.0, clipped_count_stddev=3.0), 5, 4, 4)[-1] > (
        epsilon_per_round(DPSettings(noise_multiplier=1.0, clipped_count_stddev=3.0), 5, 4, 40)[-1]
    )
    # eq. 9 literally: no guarantee, no ε
    literal = DPSettings(noise_multiplier=1.0, clipping="round_median")
    assert epsilon_per_round(literal, 3, 4, 4) == [None] * 3
    rep = accounting_report(literal, 3, 4, 4)
    assert rep["epsilon"] is None and rep["guarantee"].startswith("none")


def test_adaptive_clip_norm_update_equals_the_formula_on_a_hand_made_round():
    # norms 5, 1, 10 against C_t = 4: two clipped, one unclipped
    updates = [upd(w=[3.0, 4.0]), upd(w=[0.0, 1.0]), upd(w=[6.0, 8.0])]
    sigma, sb, gamma, eta, c = 0.5, 2.0, 0.5, 0.2, 4.0
    gen = torch.Generator().manual_seed(3)
    mean, info = dp_adaptive_clip_mean(updates, c, sigma, sb, gamma, eta, generator=gen)
    # the same generator's first draw is the count noise
    count_noise = float(torch.randn((), generator=torch.Generator().manual_seed(3), dtype=torch.float64)) * sb
    b = (1 + count_noise) / 3
    assert info["num_unclipped"] == 1 and info["num_clipped"] == 2
    assert info["noisy_unclipped_fraction"] == pytest.approx(b, rel=1e-12)
    assert info["next_clip_norm"] == pytest.approx(c * math.exp(-eta * (b - gamma)), rel=1e-12)
    assert geometric_clip_update(4.0, 1.0, 0.5, 0.2) == pytest.approx(4.0 * math.exp(-0.1))
    assert geometric_clip_update(4.0, 0.0, 0.5, 0.2) == pytest.approx(4.0 * math.exp(0.1))  # all clipped: C grows
    # clipped to C_t = 4 (not to the next norm): [3,4]·4/5 + [0,1] + [6,8]·4/10, plus noise z_Δ·C_t
    z = (sigma**-2 - (2 * sb) ** -2) ** -0.5
    assert info["update_noise_multiplier"] == pytest.approx(z, rel=1e-12)
    assert info["noise_scale"] == pytest.approx(z * c) and info["noise_std_on_mean"] == pytest.approx(z * c / 3)
    gen2 = torch.Generator().manual_seed(3)
    torch.randn((), generator=gen2, dtype=torch.float64)
    noise = torch.randn(2, generator=gen2, dtype=torch.float64) * z * c
    clipped_sum = torch.tensor([2.4, 3.2]) + torch.tensor([0.0, 1.0]) + torch.tensor([2.4, 3.2])
    assert torch.allclose(mean["w"].double(), (clipped_sum.double() + noise) / 3, atol=1e-6)
    # the estimate tracks the median: norms spread over [0.5, 1.5] (median 1), C_1 = 0.1, 60 rounds
    c, gen = 0.1, torch.Generator().manual_seed(0)
    spread = [upd(w=[float(v)]) for v in np.linspace(0.5, 1.5, 20)]
    for _ in range(60):
        _, info = dp_adaptive_clip_mean(spread, c, 0.5, 1.0, 0.5, 0.2, generator=gen)
        c = info["next_clip_norm"]
    assert 0.75 < c < 1.3  # (Flower 1.41's sign drives C to 0.005 here: fl/dp.py docstring)


def test_adaptive_noise_std_is_update_multiplier_times_clip_over_clients():
    n = 200_000
    updates = [OrderedDict(w=torch.full((n,), v)) for v in (1.0, 2.0, 4.0)]  # norms v·√n
    c = 2.0 * math.sqrt(n)
    sigma, sb = 0.02, 1.0
    mean, info = dp_adaptive_clip_mean(updates, c, sigma, sb, generator=torch.Generator().manual_seed(11))
    z = (sigma**-2 - (2 * sb) ** -2) ** -0.5
    assert info["noise_std_on_mean"] == pytest.approx(z * c / 3, rel=1e-12)
    noise_on_mean = mean["w"].double() - (1.0 + 2.0 + 2.0) / 3
    assert float(noise_on_mean.std()) == pytest.approx(z * c / 3, rel=0.01)
    assert float(noise_on_mean.mean()) == pytest.approx(0.0, abs=4 * z * c / 3 / math.sqrt(n))
    again, info2 = dp_adaptive_clip_mean(updates, c, sigma, sb, generator=torch.Generator().manual_seed(11))
    other, _ = dp_adaptive_clip_mean(updates, c, sigma, sb, generator=torch.Generator().manual_seed(12))
    assert torch.equal(mean["w"], again["w"]) and info2["next_clip_norm"] == info["next_clip_norm"]
    assert not torch.equal(mean["w"], other["w"])


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("noise_multiplier", 0.0, "fedsumm.dp.noise_multiplier"),
        ("noise_multiplier", -1.0, "fedsumm.dp.noise_multiplier"),
        ("delta", 1.0, "fedsumm.dp.delta"),
        ("delta", 0.0, "fedsumm.dp.delta"),
        ("delta", 1.5, "fedsumm.dp.delta"),
        ("target_quantile", 0.0, "fedsumm.dp.target_quantile"),
        ("target_quantile", 1.0, "fedsumm.dp.target_quantile"),
        ("initial_clip_norm", 0.0, "fedsumm.dp.initial_clip_norm"),
        ("clip_norm_lr", -0.2, "fedsumm.dp.clip_norm_lr"),
        ("clipped_count_stddev", 0.0, "fedsumm.dp.clipped_count_stddev"),
        ("clipping", "median", "fedsumm.dp.clipping"),
        ("sigma", 1.0, "unknown keys ['sigma']"),
    ],
)
def test_bad_dp_settings_are_config_errors_naming_the_key(key, value, words):
    with pytest.raises(InputError, match=re.escape(words)):
        DPSettings.from_config({"enabled": True, key: value})


def test_sigma_above_twice_the_count_noise_names_both_keys():
    dp = DPSettings.from_config({"noise_multiplier": 1.0})  # σ_b = 4/20 = 0.2 at 4 clients
    with pytest.raises(InputError, match=r"fedsumm.dp.noise_multiplier.*fedsumm.dp.clipped_count_stddev"):
        dp.check(4)
    dp.check(50)  # σ_b = 2.5
    DPSettings.from_config({"noise_multiplier": 1.0, "clipping": "round_median"}).check(4)  # no count
