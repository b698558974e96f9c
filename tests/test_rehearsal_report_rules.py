"""The rehearsal report's rules, pinned value by value (the ``rehearsal.report`` mutation scope,
2026-11-28): what each paper and method is expected to do to the server step, each check's band
edges and reasons, and a cell's row and projection computed by hand.

``test_rehearsal_checks.py`` shows that a check warns on a clear violation (a ratio of 62, ρ of
616); mutation testing of ``fedrepro.rehearsal.report`` (0.66 on its first run) showed that the
rules behind those statuses could change unnoticed: a method routed to another expectation, a
bound's slack or scale, a band's closed end, the row's projection dividing by the wrong count.
These tests give each rule asymmetric inputs and compare whole results."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedrepro.io import read_json, write_json_atomic
from fedrepro.rehearsal import plan, report

# -- what each paper's server should do: expected_server_step ---------------------------------------
WEIGHTED = {"kind": "exact", "reference": "weighted", "scale": 1.0,
            "why": "FedAvg: the num-examples-weighted mean of the returned models"}
PLAIN_MEAN = {"kind": "exact", "reference": "uniform", "scale": 1.0,
              "why": "Algorithm 1: the plain mean of the returned models"}
NOT_OWN = {"kind": "skip", "why": "FedSUMM's adapter adds a memory entry that is not the client's own update "
           "(memory_assignment / client_gradient): no bound from the replies"}
DP_SKIP = {"kind": "skip", "why": "DP regime: the server step carries the Gaussian noise"}


def _fedsumm_scaled(eps: float) -> dict:
    return {"kind": "scaled", "reference": "uniform", "scale": 1 + eps * 5.0,
            "why": f"FedSUMM: client c's update times 1 + ε·ρ_c <= 1 + {eps:g}·5"}


@pytest.mark.parametrize("method, cell, expected", [
    # the regime is the cell's, else the method's
    ("FedSUMM", {}, _fedsumm_scaled(0.1)),
    ("FedAvg", {"regime": "FedSUMM"}, _fedsumm_scaled(0.1)),
    ("FedSUMM", {"regime": "FedAvg"}, PLAIN_MEAN),
    ("FedSUMM", {"algorithm": {"epsilon": 0.3}}, _fedsumm_scaled(0.3)),
    ("FedSUMM", {"algorithm": {"epsilon": 0.0}}, PLAIN_MEAN),  # ε = 0: Algorithm 1's plain mean
    ("FedSUMM", {"algorithm": {"apply_on_server": False}}, PLAIN_MEAN),
    ("FedSUMM", {"algorithm": {"memory_assignment": "global"}}, NOT_OWN),
    ("FedSUMM", {"algorithm": {"client_gradient": "raw"}}, NOT_OWN),
    ("FedSUMM", {"algorithm": {"memory_assignment": "own", "client_gradient": "delta"}}, _fedsumm_scaled(0.1)),
    # DP: only where it is enabled and the regime is one of its regimes
    ("FedSUMM", {"dp": {"enabled": True, "regimes": ["FedSUMM"]}}, DP_SKIP),
    ("FedAvg", {"regime": "FedAvg", "dp": {"enabled": True, "regimes": ["FedAvg", "FedSUMM"]}}, DP_SKIP),
    ("FedSUMM", {"dp": {"enabled": False, "regimes": ["FedSUMM"]}}, _fedsumm_scaled(0.1)),
    ("FedSUMM", {"dp": {"enabled": True, "regimes": ["FedAvg"]}}, _fedsumm_scaled(0.1)),
    ("FedSUMM", {"dp": {"enabled": True, "regimes": None}}, _fedsumm_scaled(0.1)),
])
def test_fedsumm_server_step_expectations(method, cell, expected):
    assert report.expected_server_step("fedsumm", method, cell, {"round": 1}) == expected


@pytest.mark.parametrize("method, cell, expected", [
    ("SCAFFOLD", {"baselines": {"scaffold_global_lr": 0.5}},
     {"kind": "exact", "reference": "uniform", "scale": 0.5, "why": "SCAFFOLD: x + η_g·mean(y_c − x), η_g = 0.5"}),
    ("SCAFFOLD", {}, {"kind": "exact", "reference": "uniform", "scale": 1.0,
                      "why": "SCAFFOLD: x + η_g·mean(y_c − x), η_g = 1"}),
    # the cell's method (with its variant after "~") wins over the argument
    ("FedAvg", {"method": "SCAFFOLD~glr2", "baselines": {"scaffold_global_lr": 2.0}},
     {"kind": "exact", "reference": "uniform", "scale": 2.0, "why": "SCAFFOLD: x + η_g·mean(y_c − x), η_g = 2"}),
    ("FedDC", {}, {"kind": "skip", "why": "FedDC: each client starts from the model it holds"}),
    ("FedProto", {}, {"kind": "skip", "why": "FedProto: only prototypes cross the wire"}),
    ("FedSum", {}, dict(WEIGHTED, why="FedSum: the n_i/n-weighted mean of the returned Ω")),
    ("FedProx~mu0.01", {}, dict(WEIGHTED, why="FedProx: the n_i/n-weighted mean of the returned Ω")),
])
def test_fedsum_server_step_expectations(method, cell, expected):
    assert report.expected_server_step("fedsum", method, cell, {"round": 1}) == expected


def test_fednova_expectations_come_from_the_round_s_local_steps():
    clients = [{"num_examples": 3}, {"num_examples": 1}]
    # FedSum's FedNova reads the server entry, AdaFedSelecKD's AdaFedNova the round's own key
    fs = report.expected_server_step("fedsum", "FedNova", {}, {"server": {"local_steps": [2, 4]}, "clients": clients})
    ada = report.expected_server_step("adafedseleckd", "AdaFedNova", {},
                                      {"local_steps": [2, 4], "clients": clients})
    # p = (3/4, 1/4): τ_eff = 2.5, scales 1.25 and 0.625
    scaled = {"kind": "scaled", "reference": "weighted", "scale": 1.25,
              "why": "FedNova: local steps [2, 4], client scales τ_eff/τ_c <= 1.25"}
    assert fs == scaled and ada == scaled
    wrong_key = {"local_steps": [2, 4], "clients": clients}
    assert report.expected_server_step("fedsum", "FedNova", {}, wrong_key)["kind"] == "skip"
    assert report.expected_server_step("adafedseleckd", "AdaFedNova", {},
                                       {"server": {"local_steps": [2, 4]}, "clients": clients})["kind"] == "skip"


def test_nova_scales():
    skip = {"kind": "skip", "why": "FedNova: the round log has no local step counts"}
    assert report._nova(None, [{}]) == skip
    assert report._nova([], []) == skip
    assert report._nova([2, 3], [{"num_examples": 1}]) == skip  # a count per client, or none
    assert report._nova([3, 3], [{"num_examples": 5}, {"num_examples": 1}]) == {
        "kind": "exact", "reference": "weighted", "scale": 1.0,
        "why": "FedNova with equal local steps (3): the weighted mean"}
    # num_examples missing counts 1: p = (1/2, 1/2), τ_eff = 3, scales 1.5 and 0.75
    out = report._nova([2, 4], [{}, {}])
    assert out == {"kind": "scaled", "reference": "weighted", "scale": 1.5,
                   "why": "FedNova: local steps [2, 4], client scales τ_eff/τ_c <= 1.5"}
    # weights from num_examples (1, 3): τ_eff = 0.25·4 + 0.75·1 = 1.75 -> scales 0.4375, 1.75
    assert report._nova([4, 1], [{"num_examples": 1}, {"num_examples": 3}])["scale"] == pytest.approx(1.75)


@pytest.mark.parametrize("opt, t, name, hp, correction", [
    (None, 3, "adam", (0.1, 0.9, 0.99), "flower"),                       # Flower's FedAdam defaults
    ({"name": "adam", "eta": 0.02, "beta_1": 0.8, "beta_2": 0.95}, 2, "adam", (0.02, 0.8, 0.95), "flower"),
    ({"name": "adam", "bias_correction": "adam"}, 2, "adam", (0.1, 0.9, 0.99), "adam"),
    ({"name": "yogi"}, 4, "yogi", (0.01, 0.9, 0.99), "flower"),
    ({"name": "yogi", "eta": 0.05, "beta_2": 0.9}, 1, "yogi", (0.05, 0.9, 0.9), "flower"),
    # FedAdagrad: Flower fixes β₁ = β₂ = 0, whatever the config says
    ({"name": "adagrad", "eta": 0.3, "beta_1": 0.5, "beta_2": 0.5}, 3, "adagrad", (0.3, 0.0, 0.0), "flower"),
])
def test_fedopt_expectation_is_eta_k_of_the_round(opt, t, name, hp, correction):
    cell = {"method": "AdaFedOPT"} if opt is None else {"method": "AdaFedOPT", "server_optimizer": opt}
    got = report.expected_server_step("adafedseleckd", "AdaFedOPT", cell, {"round": t})
    bound = report.adaptive_step_bound(name, *hp, t, correction)
    assert got == {"kind": "adaptive", "scale": bound,
                   "why": f"Fed{name.capitalize()} (η = {hp[0]:g}, β₁ = {hp[1]:g}, β₂ = {hp[2]:g}), "
                          f"round {t}: |step_i| <= η·K(t) = {bound:.4g}"}


def test_fedopt_expectation_edges():
    cell = {"method": "AdaFedOPT"}
    # a round log entry without its round: round 1
    assert report.expected_server_step("adafedseleckd", "AdaFedOPT", cell, {})["scale"] == \
        report.adaptive_step_bound("adam", 0.1, 0.9, 0.99, 1)
    assert report.expected_server_step("adafedseleckd", "AdaFedOPT",
                                       {"server_optimizer": {"name": "sgd"}}, {"round": 1}) == {
        "kind": "skip", "why": "unknown server optimizer 'sgd'"}
    # the other AdaFedSelecKD methods and other papers: the weighted mean
    assert report.expected_server_step("adafedseleckd", "AdaFedSelectKD", {}, {"round": 1}) == WEIGHTED
    assert report.expected_server_step("fedmcp", "FedMCP", {"method": "SCAFFOLD"}, {"round": 1}) == WEIGHTED
    assert report._method_base("A~b~c") == "A" and report._method_base("A") == "A"


def test_adaptive_step_bounds_summed_by_hand():
    eta, b1, b2, t = 0.1, 0.9, 0.99, 3
    q = b1 ** 2 / b2
    core = (1 - b1) / math.sqrt(1 - b2) * math.sqrt(1 + q + q * q)
    flower = math.sqrt(1 - b2 ** 4) / (1 - b1 ** 4)
    adam = math.sqrt(1 - b2 ** 3) / (1 - b1 ** 3)
    assert report.adaptive_step_bound("adam", eta, b1, b2, t) == pytest.approx(eta * flower * core, rel=1e-12)
    assert report.adaptive_step_bound("adam", eta, b1, b2, t, "flower") == pytest.approx(eta * flower * core, rel=1e-12)
    assert report.adaptive_step_bound("adam", eta, b1, b2, t, "adam") == pytest.approx(eta * adam * core, rel=1e-12)
    assert report.adaptive_step_bound("adam", eta, b1, b2, t, "none") == pytest.approx(eta * core, rel=1e-12)
    r = b1 / math.sqrt(b2)
    assert report.adaptive_step_bound("yogi", 0.01, b1, b2, 3) == pytest.approx(
        0.01 * (1 - b1) / math.sqrt(1 - b2) * (1 + r + r * r), rel=1e-12)
    assert report.adaptive_step_bound("adagrad", 0.2, 0.5, 0.0, 3) == pytest.approx(
        0.2 * 0.5 * math.sqrt(1 + 0.25 + 0.0625), rel=1e-12)
    # rounds below 1 count as round 1
    for name in ("adam", "yogi", "adagrad"):
        assert report.adaptive_step_bound(name, 0.1, 0.5, 0.9, 0) == report.adaptive_step_bound(name, 0.1, 0.5, 0.9, 1)
    assert report.adaptive_step_bound("yogi", 0.1, 0.5, 0.9, 1) == pytest.approx(0.1 * 0.5 / math.sqrt(0.1))


# -- one round's step against its expectation: _judge_step -----------------------------------------
def _step(**kw) -> dict:
    """A server_step entry whose uniform and weighted numbers differ (a swapped key shows)."""
    base = {"tensors": 2, "skipped_tensors": 1, "server_norm": 1.0, "ratio": 1.0, "weighted_ratio": 2.0,
            "mean_update_norm": 0.5, "weighted_mean_update_norm": 0.25,
            "client_update_norm_mean": 1.0, "client_update_norm_weighted": 0.75, "max_abs_server_step": 0.01}
    return {**base, **kw}


EXACT = {"kind": "exact", "reference": "uniform", "scale": 0.5, "why": "w"}


def test_an_exact_expectation_allows_five_percent_of_its_scale():
    j = report._judge_step
    assert j(3, _step(ratio=0.52), EXACT) is None
    assert j(3, _step(ratio=0.48), EXACT) is None
    assert j(3, _step(ratio=0.53), EXACT) == (
        "round 3: ‖Δ_server‖ / ‖uniform mean client Δ‖ = 0.53, expected 0.5 ± 0.025 (w)")
    assert j(3, _step(ratio=0.47), EXACT) is not None
    weighted = dict(EXACT, reference="weighted", scale=2.0)
    assert j(4, _step(ratio=9.0, weighted_ratio=2.09), weighted) is None  # the weighted ratio is judged
    assert j(4, _step(ratio=2.0, weighted_ratio=2.11), weighted) == (
        "round 4: ‖Δ_server‖ / ‖weighted mean client Δ‖ = 2.11, expected 2 ± 0.1 (w)")
    zero = dict(EXACT, scale=0.0)  # η_g = 0: the server must not move at all
    assert j(1, _step(ratio=0.0), zero) is None
    assert j(1, _step(ratio=1e-9), zero) is not None


def test_a_ratio_that_cannot_be_formed():
    j = report._judge_step
    # the clients' mean update is 0: fine if the server did not move either
    assert j(2, _step(ratio=None, server_norm=0.0), EXACT) is None
    assert j(2, _step(ratio=None, server_norm=0.5), EXACT) == (
        "round 2: the server moved (‖Δ_server‖ = 0.5) while the clients' uniform mean update is 0")
    assert j(2, _step(ratio=None, server_norm=None), EXACT) == (
        "round 2: the server moved (‖Δ_server‖ = None) while the clients' uniform mean update is 0")
    assert j(2, _step(ratio=None, weighted_ratio=None, server_norm=float("nan")),
             dict(EXACT, reference="weighted")) == (
        "round 2: the server moved (‖Δ_server‖ = nan) while the clients' weighted mean update is 0")
    assert j(2, _step(weighted_ratio=None), dict(EXACT, reference="weighted")) is not None
    assert j(2, _step(ratio=math.inf), EXACT) == (
        "round 2: ‖Δ_server‖ / ‖uniform mean client Δ‖ is not finite (inf)")


def test_a_scaled_expectation_is_bounded_by_the_dispersion():
    j = report._judge_step
    scaled = {"kind": "scaled", "reference": "uniform", "scale": 2.0, "why": "s"}
    # uniform: D = client_update_norm_mean / mean_update_norm = 1.0 / 0.5 = 2: limit 2·2·1.05 = 4.2
    assert j(1, _step(ratio=4.19), scaled) is None
    assert j(1, _step(ratio=4.21), scaled) == (
        "round 1: ‖Δ_server‖ / ‖uniform mean client Δ‖ = 4.21 > s_max·D = 2·2 (+5%) (s)")
    # weighted: D = 0.75 / 0.25 = 3: limit 2·3·1.05 = 6.3
    w = dict(scaled, reference="weighted")
    assert j(1, _step(ratio=100.0, weighted_ratio=6.29), w) is None
    assert j(1, _step(ratio=0.0, weighted_ratio=6.31), w) == (
        "round 1: ‖Δ_server‖ / ‖weighted mean client Δ‖ = 6.31 > s_max·D = 2·3 (+5%) (s)")
    # without the clients' norms the dispersion is unknown: no bound to break
    assert j(1, _step(ratio=1e6, client_update_norm_mean=None), scaled) is None
    assert j(1, _step(ratio=1e6, mean_update_norm=0.0), scaled) is None


def test_an_adaptive_expectation_bounds_every_entry():
    j = report._judge_step
    ada = {"kind": "adaptive", "scale": 0.5, "why": "a"}
    assert j(2, _step(ratio=50.0, max_abs_server_step=0.525), ada) is None  # 0.5 · 1.05
    assert j(2, _step(max_abs_server_step=0.526), ada) == (
        "round 2: an entry moved by 0.526 > η·K(t) = 0.5 (+5%) (a)")
    assert j(2, _step(max_abs_server_step=None), ada) == (
        "round 2: the server step is not finite (max |step| = None)")
    assert j(2, _step(max_abs_server_step=math.nan), ada) is not None


# -- check_server_step over a round log ------------------------------------------------------------
def test_server_step_values_notes_and_skips():
    cell = {"method": "SCAFFOLD", "baselines": {"scaffold_global_lr": 0.5}}
    rounds = [
        {"round": 1},  # before the strategy recorded it
        {"round": 2, "server_step": _step(ratio=0.5)},
        {"round": 3, "server_step": _step(ratio=0.7)},
        {"round": 4},
    ]
    out = report.check_server_step("fedsum", "SCAFFOLD", cell, rounds)
    why = "SCAFFOLD: x + η_g·mean(y_c − x), η_g = 0.5"
    assert out == {
        "check": "server_step", "status": "warn",
        "reasons": ["round 3: ‖Δ_server‖ / ‖uniform mean client Δ‖ = 0.7, expected 0.5 ± 0.025 (" + why + ")"],
        "values": {"rounds": [
            {"round": 2, "ratio": 0.5, "reference": "uniform", "max_abs_step": 0.01, "tensors": 2,
             "skipped_tensors": 1, "expected": why},
            {"round": 3, "ratio": 0.7, "reference": "uniform", "max_abs_step": 0.01, "tensors": 2,
             "skipped_tensors": 1, "expected": why}]},
        # the same note once, however many rounds give it
        "note": "the round log has no server_step (not a federated run, or one made before the "
                "strategy recorded it)"}
    # weighted methods show the weighted ratio; FedOpt the largest entry
    w = report.check_server_step("fedmcp", "FedMCP", {}, [{"round": 1, "server_step": _step(weighted_ratio=1.01)}])
    assert w["status"] == "ok" and "note" not in w and "reasons" not in w
    assert w["values"]["rounds"][0]["ratio"] == 1.01 and w["values"]["rounds"][0]["reference"] == "weighted"
    ada = report.check_server_step("adafedseleckd", "AdaFedOPT", {"method": "AdaFedOPT"},
                                   [{"round": 1, "server_step": _step(ratio=0.3)}])
    assert ada["values"]["rounds"][0]["reference"] == "max_abs" and ada["values"]["rounds"][0]["ratio"] == 0.3


def test_server_step_skips_say_why():
    assert report.check_server_step("fedsum", "FedAvg", {}, []) == {
        "check": "server_step", "status": "skip", "note": "no round log"}
    plain = report.check_server_step("fedsum", "FedAvg", {}, [{"round": 1}, {"round": 2}])
    assert plain == {"check": "server_step", "status": "skip",
                     "note": "the round log has no server_step (not a federated run, or one made before "
                             "the strategy recorded it)"}
    shapes = report.check_server_step("fedsum", "FedAvg", {}, [{"round": 1, "server_step": {"tensors": 0}},
                                                              {"round": 2, "server_step": {"tensors": 0, "note": "n"}}])
    assert shapes["note"] == ("no ratio: no tensor is both broadcast and returned with the same shape (the "
                              "uplink is not model-shaped); n")
    dc = report.check_server_step("fedsum", "FedDC", {}, [{"round": 1, "server_step": _step(ratio=9.0)}])
    assert dc == {"check": "server_step", "status": "skip",
                  "note": "FedDC: each client starts from the model it holds"}


def test_a_result_keeps_three_reasons_and_counts_the_rest():
    assert report._result("c", ["a", "b", "c"]) == {"check": "c", "status": "warn", "reasons": ["a", "b", "c"]}
    assert report._result("c", ["a", "b", "c", "d", "e"]) == {
        "check": "c", "status": "warn", "reasons": ["a", "b", "c", "(and 2 more)"]}
    assert report._result("c", (), {"x": 1}) == {"check": "c", "status": "ok", "values": {"x": 1}}
    assert report._result("c", skip="why", values={"x": 1}) == {
        "check": "c", "status": "skip", "note": "why", "values": {"x": 1}}
    assert report._result("c", skip="") == {"check": "c", "status": "skip", "note": ""}
    assert report._result("c", values={}) == {"check": "c", "status": "ok"}


# -- FedSUMM's ρ band ----------------------------------------------------------------------------------
def _rho(*per_round) -> list[dict]:
    return [{"round": t + 1, "rho": r} for t, r in enumerate(per_round)]


def test_rho_band_edges():
    expected = {"regime": "FedSUMM"}  # rho_reduction: expected by default: [1, 5] to 1e-6
    ok = report.check_fedsumm_rho("fedsumm", "FedSUMM", expected, _rho({"b": 5.0, "a": 1 - 1e-6}))
    assert ok == {"check": "fedsumm_rho", "status": "ok", "values": {"min": 1 - 1e-6, "max": 5.0}}
    bad = report.check_fedsumm_rho("fedsumm", "FedSUMM", expected, _rho({"b": 5.000001, "a": 1 - 2e-6}))
    assert bad["reasons"] == [  # clients in sorted order
        "round 1: ρ of client a = 1 outside [1, 5] (the demo's: 1.0-1.6)",
        "round 1: ρ of client b = 5 outside [1, 5] (the demo's: 1.0-1.6)"]
    mean = {"regime": "FedSUMM", "algorithm": {"rho_reduction": "mean"}}
    assert report.check_fedsumm_rho("fedsumm", "FedSUMM", mean, _rho({"a": 1e-9, "b": 5.0}))["status"] == "ok"
    zero = report.check_fedsumm_rho("fedsumm", "FedSUMM", mean, _rho({"a": 0.0}, {"a": 5.5}))
    assert zero["reasons"] == ["round 1: ρ of client a = 0 outside (0, 5] (the demo's: 1.0-1.6)",
                               "round 2: ρ of client a = 5.5 outside (0, 5] (the demo's: 1.0-1.6)"]
    assert zero["values"] == {"min": 0.0, "max": 5.5}


def test_rho_missing_or_not_finite_is_named_for_every_round_and_client():
    cell = {"algorithm": {"rho_reduction": "expected"}}  # the regime from the method
    out = report.check_fedsumm_rho("fedsumm", "FedAvg", cell,
                                   [{"round": 1}, {"round": 2, "rho": [1.2]}, {"round": 3, "rho": {}},
                                    {"round": 4, "rho": {"a": None, "b": math.inf, "c": 1.5}}])
    assert out == {"check": "fedsumm_rho", "status": "warn",
                   "reasons": ["round 1: no ρ in the round log", "round 2: no ρ in the round log",
                               "round 3: no ρ in the round log", "(and 2 more)"],
                   "values": {"min": 1.5, "max": 1.5}}
    out = report.check_fedsumm_rho("fedsumm", "FedAvg", cell, [{"round": 4, "rho": {"a": None, "b": math.inf}}])
    assert out == {"check": "fedsumm_rho", "status": "warn",
                   "reasons": ["round 4: ρ of client a is not finite (None)",
                               "round 4: ρ of client b is not finite (inf)"]}
    assert report.check_fedsumm_rho("fedsumm", "FedSUMM", {}, []) == {
        "check": "fedsumm_rho", "status": "skip", "note": "no round log"}
    assert report.check_fedsumm_rho("fedsumm", "FedSUMM", {"regime": "all"}, _rho({"a": 99.0})) == {
        "check": "fedsumm_rho", "status": "skip", "note": "regime all: not federated, no ρ"}
    assert report.check_fedsumm_rho("fedsumm", "single", {}, []) == {
        "check": "fedsumm_rho", "status": "skip", "note": "regime single: not federated, no ρ"}


# -- AdaFedSelecKD's KD share -------------------------------------------------------------------------
def _kd(t, *clients):
    return {"round": t, "clients": [dict(c, partition_id=i) for i, c in enumerate(clients)]}


def test_kd_share_is_the_round_s_distilled_tokens_over_its_target_tokens():
    # the round's share from the token counts (7 + 1) / (10 + 30) = 0.2, not the mean of 0.7, 0.0333
    rounds = [_kd(1, {"kd_fraction": 0.7, "n_kd_tokens": 7, "n_tokens": 10},
                  {"kd_fraction": 1 / 30, "n_kd_tokens": 1, "n_tokens": 30}),
              _kd(2, {"kd_fraction": 0.5}, {"kd_fraction": 0.3}),  # no token counts: the clients' mean
              _kd(3, {"train_loss": 1.0})]  # no share logged this round: skipped
    out = report.check_kd_share("adafedseleckd", "AdaFedSelectKD", {}, rounds, "pretrained")
    assert out == {"check": "kd_share", "status": "ok",
                   "values": {"round_shares": [0.2, pytest.approx(0.4)], "kind": "selective",
                              "weights": "pretrained"}}
    none = report.check_kd_share("adafedseleckd", "AdaFedAvg", {}, [_kd(1, {"kd_fraction": 0.0, "n_tokens": 5})],
                                 "tiny")
    assert none["values"] == {"round_shares": [0.0], "kind": "none", "weights": "tiny"} and "note" not in none
    # a round whose shares are all non-finite and without token counts: nan, reported, not judged degenerate
    nan = report.check_kd_share("adafedseleckd", "AdaFedSelectKD", {}, [_kd(1, {"kd_fraction": math.nan})],
                                "pretrained")
    assert nan["reasons"] == ["round 1: client 0's KD share nan is outside [0, 1]"]
    assert math.isnan(nan["values"]["round_shares"][0])


def test_kd_share_rules_per_method():
    def check(method, shares, weights="pretrained", cell=None):
        rounds = [_kd(2, *({"kd_fraction": f, "n_kd_tokens": f * 10, "n_tokens": 10} for f in shares))]
        return report.check_kd_share("adafedseleckd", method, cell if cell is not None else {}, rounds, weights)

    assert check("AdaFedKD", [1.0, 0.98])["reasons"] == [
        "round 2: AdaFedKD distils every token (τ = ∞) but the share is 0.99"]
    assert check("AdaFedAvg", [0.0, 0.2])["reasons"] == [
        "round 2: a method without KD distilled tokens (share 0.1)"]
    # the cell's method wins over the argument
    assert check("AdaFedAvg", [0.0, 0.2], cell={"method": "AdaFedSelectKD"})["status"] == "ok"
    assert check("AdaFedKD", [1.0, 1.0], cell={"method": "AdaFedAvg"})["status"] == "warn"
    assert check("AdaFedSelectKD", [0.0, 0.0])["reasons"] == [
        "round 2: degenerate KD share 0 (the entropy gate never opens)"]
    assert check("AdaFedSelectKD", [1.0, 1.0])["reasons"] == [
        "round 2: degenerate KD share 1 (the entropy gate always opens)"]
    assert check("AdaFedHardKD", [1.0, 1.0], "random")["reasons"] == [
        "round 2: degenerate KD share 1 (the noun/verb mask always opens)"]
    assert check("AdaFedHardKD", [0.0, 0.0], "tiny")["reasons"] == [
        "round 2: degenerate KD share 0 (the noun/verb mask never opens)"]
    assert check("AdaFedHardKD", [0.5, 0.0], "random")["status"] == "ok"
    assert check("AdaFedSelectKD", [0.3, 0.0])["status"] == "ok"
    for weights in ("random", "tiny", "unknown"):  # the entropy gate on untrained weights: not judged
        out = check("AdaFedSelectKD", [0.0, 0.0], weights)
        assert out["status"] == "ok" and out["note"] == f"{weights} weights: degeneracy of the entropy gate not judged"
    assert "note" not in check("AdaFedSelectKD", [0.3, 0.0])
    assert check("AdaFedKD", [-0.1, 1.0])["reasons"][0] == "round 2: client 0's KD share -0.1 is outside [0, 1]"
    assert check("AdaFedKD", [1.0, 1.0000001])["reasons"][0] == (
        "round 2: client 1's KD share 1.0000001 is outside [0, 1]")
    assert report.check_kd_share("adafedseleckd", "AdaFedKD", {}, [], "pretrained") == {
        "check": "kd_share", "status": "skip", "note": "the round log has no kd_fraction"}


# -- the payload -----------------------------------------------------------------------------------------
def _wire(t, ups, down, guidance=None):
    e = {"round": t, "clients": [{"partition_id": i, "uplink_bytes": u} for i, u in enumerate(ups)],
         "bytes_down": down}
    if guidance is not None:
        e["guidance_bytes_down"] = guidance
    return e


def test_payload_bytes_per_client_and_guidance():
    prov = {"parameters": {"shared_per_round": 25, "guidance_per_round": 10}}  # 100 B, guidance 40 B
    ok = report.check_payload(prov, [_wire(1, [100, 100, 100], 300 + 120, 120), _wire(2, [100], 100)])
    assert ok == {"check": "payload", "status": "ok",
                  "values": {"declared_bytes_per_client": 100, "guidance_bytes_per_client": 40}}
    out = report.check_payload(prov, [_wire(1, [100, 100], 200 + 120, 120), _wire(2, [100, 100], 200 + 60, 60),
                                      _wire(3, [100, 101], 201, None)])
    assert out["reasons"] == [
        "round 1: 120 B of guidance sent down, not a whole number (<= 2) of the declared 40 B per client",
        "round 2: 60 B of guidance sent down, not a whole number (<= 2) of the declared 40 B per client",
        "round 3: client 1 sent 101 B up, the method declares 25 shared entries × 4 B = 100 B",
        "(and 1 more)"]
    down = report.check_payload(prov, [_wire(1, [100, 100], 199, None)])
    assert down["reasons"] == ["round 1: 199 B sent down to 2 clients, declared 2 × 100 B = 200 B"]
    no_guidance = report.check_payload({"parameters": {"shared_per_round": 25}}, [_wire(1, [100], 140, 40)])
    assert no_guidance["reasons"] == [
        "round 1: 40 B of guidance sent down, not a whole number (<= 1) of the declared 0 B per client"]
    # a client without its uplink figure: wrong where the method shares something, 0 where it shares nothing
    assert report.check_payload(prov, [{"round": 1, "clients": [{"partition_id": 0}], "bytes_down": 100}])[
        "reasons"] == ["round 1: client 0 sent None B up, the method declares 25 shared entries × 4 B = 100 B"]
    assert report.check_payload({"parameters": {"shared_per_round": 0}},
                                [{"round": 1, "clients": [{"partition_id": 0}]}])["status"] == "ok"
    assert report.check_payload(prov, []) == {"check": "payload", "status": "skip", "note": "no round log"}
    assert report.check_payload({}, [_wire(1, [1], 1)]) == {
        "check": "payload", "status": "skip",
        "note": "the method's parameter report declares no shared_per_round"}


# -- losses ------------------------------------------------------------------------------------------------
def test_finite_losses_reads_every_loss_key_and_only_those():
    rounds = [{"round": 1, "clients": [{"train_loss": 1.0, "NLL": 2.0, "L_pm": 3.0, "L-sim": [4.0, 5.0],
                                        "n_tokens": math.nan, "loss_ok": True, "loss_name": "x",
                                        "Losses": {"a": 6.0, "b": [7.0]}}]},
              {"round": 2, "aggregated_metrics": {"eval-loss": 8.0}}]
    # counted: train_loss, NLL, L_pm, L-sim x2, Losses.a, Losses.b[0], eval-loss = 8 (a bool, a string and
    # n_tokens' nan are not losses)
    assert report.check_finite_losses(rounds) == {"check": "finite_losses", "status": "ok", "values": {"losses": 8}}
    rounds[1]["aggregated_metrics"]["eval-loss"] = -math.inf
    assert report.check_finite_losses(rounds)["reasons"] == [
        "non-finite loss: round 2.aggregated_metrics.eval-loss = -inf"]
    assert report.check_finite_losses([{"round": 1, "clients": [{"n": 1}]}]) == {
        "check": "finite_losses", "status": "skip", "note": "the round log records no loss"}
    assert report.check_finite_losses([]) == {"check": "finite_losses", "status": "skip", "note": "no round log"}
    assert not report._is_number(True) and report._is_number(2) and report._is_number(2.5)
    assert not report._finite(math.nan) and not report._finite("1") and report._finite(0)
    assert [k for k in ("loss", "LOSS", "nll", "L_x", "L-x", "l_x", "Lx", "n") if report._is_loss_key(k)] == [
        "loss", "LOSS", "nll", "L_x", "L-x"]


def test_run_checks_gives_each_paper_its_checks():
    rounds = [{"round": 1, "clients": [{"train_loss": 1.0, "kd_fraction": 0.0}], "rho": {"a": 2.0}}]
    assert list(report.run_checks("fedsumm", "FedSUMM", {}, {}, rounds)) == [
        "finite_losses", "server_step", "fedsumm_rho", "payload"]
    ada = report.run_checks("adafedseleckd", "AdaFedSelectKD", {}, {}, rounds, "random")
    assert list(ada) == ["finite_losses", "server_step", "kd_share", "payload"]
    assert ada["kd_share"]["values"]["weights"] == "random"
    default = report.run_checks("adafedseleckd", "AdaFedSelectKD", {}, {}, rounds)
    assert default["kd_share"]["values"]["weights"] == "unknown"
    assert list(report.run_checks("fedmcp", "FedMCP", {}, {}, rounds)) == ["finite_losses", "server_step", "payload"]


# -- a cell's row and projection ---------------------------------------------------------------------
def _bench(root: Path, rel: str, s: float, rss: float) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
                    f"1.0\t0:00:01\t1.0\t0\t0\t0\t0\t0\t0\t1\n{s}\t0:00:30\t{rss}\t5\t6\t0\t0\t0\t0\t7\n")


def _row_cell(root: Path, *, clients_per_round=2, train=None, prov_extra=None) -> dict:
    """Three clients with 5, 9 and 2 training examples (blank lines do not count), two rounds."""
    cell_dir = "results/x/B/M/seed~1"
    client_data = {}
    for name, n in (("c0", 5), ("c1", 9), ("c2", 2)):
        d = root / "data" / name
        d.mkdir(parents=True)
        (d / "train.jsonl").write_text("{}\n" * n + "\n  \n")
        client_data[name] = f"data/{name}"
    rounds = [
        {"round": 1, "seconds": 12.0, "clients": [
            {"seconds_steps": 3.0, "seconds_per_step": 1.5, "peak_gpu_mb": 300.0, "flops_per_step": 2e12},
            {"seconds_steps": 3.0, "seconds_per_step": 0.5, "peak_gpu_mb": 700.0}]},
        {"round": 2, "seconds": 9.0, "clients": [
            {"seconds_steps": 4.0, "seconds_per_step": 1.0, "flops_per_step": 3e12},
            {"seconds_steps": 1.0}]},  # a client without a step time: not counted
    ]
    cell = {"clients": list(client_data), "client_data": client_data,
            "train": train if train is not None else {"batch_size": 4, "epochs": 2}}
    if clients_per_round:
        cell["clients_per_round"] = clients_per_round
    prov = {"cell": cell, "engine": "inprocess", "machine": {"cuda": True, "gpu": "NVIDIA H100 80GB HBM3"},
            "wall_time_s": 40.0, "timing": {"rounds": rounds, "peak_rss_mb": 1234.0},
            "bytes_per_round": [{"down": 100, "up": 50}, {"down": 300, "up": 10}], "parameters": {"total": 7},
            **(prov_extra or {})}
    write_json_atomic(root / cell_dir / "provenance.json", prov)
    write_json_atomic(root / cell_dir / "scores.json", {})
    write_json_atomic(root / cell_dir / "train_log.json",
                      {"rounds": [{"round": 1, "clients": [{"num_examples": 3}, {"num_examples": 2}, "x"]},
                                  {"round": 2, "clients": [{"num_examples": 9}]}]})
    _bench(root, "bench/train.tsv", 30.0, 1500.0)
    _bench(root, "bench/eval.tsv", 12.0, 2100.0)
    return {"paper": "p", "method": "M", "backbone": "B", "setting": "s", "cell": cell_dir,
            "files": [f"{cell_dir}/provenance.json", f"{cell_dir}/scores.json"],
            "jobs": {"train": {"log": "logs/t.log", "benchmark": "bench/train.tsv",
                               "resources": {"mem_mb": 2000, "runtime": 5}, "shared_by": 2},
                     "evaluate": {"log": "logs/e.log", "benchmark": "bench/eval.tsv",
                                  "resources": {"mem_mb": 500}}}}


def test_a_cell_row_by_hand(tmp_path):
    entry = _row_cell(tmp_path)
    row = report.measure_cell(entry, tmp_path, {"examples_per_client": 2}, full_rounds=10)
    proj = row.pop("projection")
    checks = row.pop("checks")
    assert row == {
        "paper": "p", "method": "M", "backbone": "B", "setting": "s", "cell": entry["cell"],
        "declared": {"train": {"mem_mb": 2000, "runtime": 5}, "evaluate": {"mem_mb": 500}},
        "status": "ok", "engine": "inprocess", "device": "cuda", "rounds_run": 2, "wall_s": 40.0,
        "train_job_s": 30.0, "evaluate_job_s": 12.0, "job_cells": 2, "round_s": [12.0, 9.0],
        "step_s": 1.0,                      # the median of 1.5, 0.5, 1.0
        "steps_per_round": [8, 4],          # 3/1.5 + 3/0.5; 4/1
        "batch_size": 4,
        "effective_batch": 3,               # the first round's largest num_examples, below the batch
        "peak_rss_mb": 2100.0,              # the largest of the cell's jobs (the last benchmark row)
        "driver_peak_rss_mb": 1234.0, "peak_gpu_mb": 700.0,
        "bytes_per_round": 230,             # mean(100 + 50, 300 + 10)
        "parameters": {"total": 7}, "precision": "fp32", "emulated_bf16": None,
        "flops_per_step": 3e12,             # the largest counted step
        "mfu": pytest.approx(3.0 / 66.9), "mfu_vs_bf16_peak": pytest.approx(3.0 / 989.4),
        "tflops_per_s": pytest.approx(3.0), "peak_tflops": pytest.approx(66.9),
    }
    # 2 of 3 clients a round: 2/3 · 2 epochs · (⌈5/4⌉ + ⌈9/4⌉ + ⌈2/4⌉) = 8 steps of 1.0 · 4/3 s;
    # overhead mean(12 − 6, 9 − 5) = 5 s; start-up 40 − 21 = 19 s
    round_s = 8 * 4 / 3 + 5.0
    train_s = 10 * round_s + 19
    assert proj == {"full_rounds": 10, "assumption": "step time linear in the batch",
                    "client_train_examples": [5, 9, 2], "steps_per_round": pytest.approx(8.0),
                    "step_s_at_paper_batch": pytest.approx(4 / 3), "round_s": pytest.approx(round_s),
                    "train_hours": pytest.approx(train_s / 3600),
                    "runtime_covered": False,    # 2.93 min > 5 min declared / 2 cells of the job
                    "memory_covered": False}     # 2,100 MB > 2,000 declared
    assert {c["status"] for c in checks.values()} == {"skip"}


def test_a_cell_row_projection_variants(tmp_path):
    entry = _row_cell(tmp_path, clients_per_round=None, train={"batch_size": 4, "local_epochs": 1, "epochs": 5},
                      prov_extra={"wall_time_s": 10.0})
    entry["jobs"]["train"]["shared_by"] = 1
    entry["jobs"]["train"]["resources"] = {"mem_mb": 2100, "runtime": 1}
    row = report.measure_cell(entry, tmp_path, {"examples_per_client": 2}, full_rounds=3)
    p = row["projection"]
    # every client every round, local_epochs before epochs: 2 + 3 + 1 = 6 steps; the start-up clamps at 0
    assert p["steps_per_round"] == 6 and p["round_s"] == pytest.approx(6 * 4 / 3 + 5.0)
    assert p["train_hours"] == pytest.approx(3 * (6 * 4 / 3 + 5.0) / 3600)
    assert p["runtime_covered"] is True and p["memory_covered"] is True  # 0.65 min <= 1; 2,100 <= 2,100
    # no full rounds: no projection, the memory still compared
    assert report.measure_cell(entry, tmp_path, {"examples_per_client": 2}, full_rounds=None)["projection"] == {
        "full_rounds": None, "assumption": "step time linear in the batch", "memory_covered": True}
    # a first round that lists no clients, then no round log at all: the batch the rehearsal gave each client
    write_json_atomic(tmp_path / entry["cell"] / "train_log.json", {"rounds": [{"round": 1}]})
    assert report.measure_cell(entry, tmp_path, {"examples_per_client": 2}, full_rounds=3)["effective_batch"] == 2
    (tmp_path / entry["cell"] / "train_log.json").unlink()
    assert report.measure_cell(entry, tmp_path, {"examples_per_client": 2}, full_rounds=3)["effective_batch"] == 2
    assert report.measure_cell(entry, tmp_path, {"examples_per_client": 7}, full_rounds=3)["effective_batch"] == 4


def test_a_cell_row_on_the_cpu_and_without_numbers(tmp_path):
    entry = _row_cell(tmp_path, prov_extra={"machine": {"cuda": False}, "bytes_per_round": [],
                                            "timing": {"rounds": [{"round": 1, "seconds": None, "clients": []}]}})
    del entry["jobs"]["train"]["resources"]["runtime"]
    row = report.measure_cell(entry, tmp_path, {"examples_per_client": 2}, full_rounds=10)
    assert row["device"] == "cpu" and row["peak_gpu_mb"] is None and row["mfu"] is None
    assert row["rounds_run"] == 0 and row["step_s"] is None and row["bytes_per_round"] == 0
    assert row["flops_per_step"] is None and row["steps_per_round"] == [0]
    assert row["projection"] == {"full_rounds": 10, "assumption": "step time linear in the batch",
                                 "memory_covered": False}
    # CUDA in the machine but no GPU memory recorded: the steps did not run on it
    entry = _row_cell(tmp_path / "b", prov_extra={"timing": {"rounds": []}})
    assert report.measure_cell(entry, tmp_path / "b", {"examples_per_client": 2}, 10)["device"] == "cpu"


def test_a_failed_cell_names_every_job_s_log(tmp_path):
    entry = _row_cell(tmp_path)
    (tmp_path / entry["cell"] / "scores.json").unlink()
    log = tmp_path / "logs/t.log"
    log.parent.mkdir(parents=True)
    log.write_text("a Error 1\nb\nc error 2\nd Traceback\ne Killed\n" + "x" * 400 + " MemoryError\nlast\n")
    row = report.measure_cell(entry, tmp_path, {"examples_per_client": 2}, full_rounds=10)
    assert row["status"] == "failed" and row["missing"] == [f"{entry['cell']}/scores.json"]
    # the last three lines with an error marker, each cut at 300 characters; the evaluate job left no log
    assert row["reason"] == (
        f"{log}: d Traceback | e Killed | {'x' * 300}; "
        f"the job did not run or left no log ({tmp_path / 'logs/e.log'}); see Snakemake's output")
    assert row["declared"] == {"train": {"mem_mb": 2000, "runtime": 5}, "evaluate": {"mem_mb": 500}}
    assert "projection" not in row and "checks" not in row
    log.write_text("one\n two \nthree\nfour\n")  # no marker: the last three lines, stripped
    assert report._failure_reason(log) == f"{log}: two | three | four"


def test_benchmark_rows_and_client_sizes(tmp_path):
    _bench(tmp_path, "b.tsv", 30.0, 1500.0)
    assert report._read_benchmark(tmp_path / "b.tsv") == {"s": 30.0, "max_rss": 1500.0, "max_vms": 5.0,
                                                           "max_uss": 6.0, "cpu_time": 7.0}
    (tmp_path / "c.tsv").write_text("s\tmax_rss\n2.5\tNA\n")
    assert report._read_benchmark(tmp_path / "c.tsv") == {"s": 2.5, "max_rss": None, "max_vms": None,
                                                           "max_uss": None, "cpu_time": None}
    (tmp_path / "d.tsv").write_text("s\tmax_rss\n")
    assert report._read_benchmark(tmp_path / "d.tsv") is None
    assert report._read_benchmark(tmp_path / "none.tsv") is None
    (tmp_path / "d1").mkdir()
    (tmp_path / "d1/train.jsonl").write_text("{}\n\n{}\n")
    cell = {"clients": ["a", "b"], "client_data": {"a": "d1", "b": "d1"}}
    assert report._train_sizes(cell, tmp_path) == [2, 2]
    assert report._train_sizes({"clients": ["a", "z"], "client_data": {"a": "d1"}}, tmp_path) is None
    assert report._train_sizes({"clients": ["a"], "client_data": {"a": "nowhere"}}, tmp_path) is None
    assert report._train_sizes({"clients": ["a"]}, tmp_path) is None
    assert report._train_sizes({}, tmp_path) == []
    assert [report._epochs(t) for t in ({"local_epochs": "3", "epochs": 5}, {"epochs": 2}, {})] == [3, 2, 1]


def test_backbone_weights(tmp_path):
    for name, meta in (("s", {"kind": "shape"}), ("t", {"scale": "tiny"}), ("h", {"kind": "hub"}),
                       ("k", {"kind": "shape", "scale": "tiny"}), ("e", {})):
        (tmp_path / name).mkdir()
        write_json_atomic(tmp_path / name / "fedrepro_backbone.json", meta)
    (tmp_path / "plain").mkdir()
    got = {n: report.backbone_weights({"backbone_dir": n}, tmp_path)
           for n in ("s", "t", "h", "k", "e", "plain", "gone")}
    assert got == {"s": "random", "t": "tiny", "h": "pretrained", "k": "random", "e": "pretrained",
                   "plain": "pretrained", "gone": "unknown"}
    assert report.backbone_weights({}, tmp_path) == "unknown"
    assert report.backbone_weights({"backbone_dir": ""}, tmp_path) == "unknown"


# -- per table, and the whole report ----------------------------------------------------------------
def _hours_row(method, backbone, hours, paper="p"):
    return {"paper": paper, "method": method, "backbone": backbone, "projection": {"train_hours": hours}}


def test_table_hours_match_method_and_backbone_then_backbone_then_the_paper():
    rows = [_hours_row("A", "big", 1.0), _hours_row("A", "big", 3.0), _hours_row("B", "big", 10.0),
            _hours_row("A", "small", 100.0), _hours_row("A", "big", 1000.0, paper="q"),
            {"paper": "p", "method": "C", "backbone": "tiny", "projection": {}}]  # no projection: ignored
    grids = {"p": {"t1": ["r/big/A/seed~1", "r/big/A/seed~1", "r/big/C/seed~1", "r/huge/A/seed~1"]},
             "q": {"t2": ["r/x/Z/seed~1"]}, "none": {"t3": ["r/big/A/seed~1"], "t4": []}}
    out = report.table_hours(rows, grids)
    # t1: A on big = mean(1, 3) = 2, twice; C on big: big's mean (1 + 3 + 10) / 3; huge: the paper's mean
    paper_mean = (1 + 3 + 10 + 100) / 4
    assert out == [
        {"paper": "p", "target": "t1", "cells": 3, "train_hours": round(2 + 2 + 14 / 3 + paper_mean, 2)},
        {"paper": "q", "target": "t2", "cells": 1, "train_hours": 1000.0},
        {"paper": "none", "target": "t3", "cells": 1, "train_hours": None},  # no row of that paper
        {"paper": "none", "target": "t4", "cells": 0, "train_hours": 0.0},
    ]


def _plan_doc(cells, **extra):
    return {"settings": {**plan.DEFAULTS, "examples_per_client": 2}, "cells": cells, "full_rounds": {"p": 10},
            "grids": {"p": {"t": [cells[0]["cell"]]}}, "machine": "m", **extra}


def test_build_counts_and_names_the_backbones(tmp_path):
    entry = _row_cell(tmp_path)
    for name, meta in (("tinyb", {"scale": "tiny"}), ("shapeb", {"kind": "shape"}), ("localb", {})):
        (tmp_path / name).mkdir()
        write_json_atomic(tmp_path / name / "fedrepro_backbone.json", meta)
    (tmp_path / "ckpt").mkdir()
    doc = _plan_doc([entry], backbone_dirs={"a": "tinyb", "b": "shapeb", "c": "localb", "d": "ckpt", "e": "gone"},
                    precision={"ran": "fp32"})
    rep = report.build(doc, tmp_path, tmp_path / "r.json", tmp_path / "r.md")
    assert rep["summary"] == {"cells": 1, "ok": 1, "warn": 0, "failed": 0}
    assert rep["backbones"] == {"a": "tiny", "b": "shape", "c": "local", "d": "checkpoint", "e": "not built"}
    assert rep["device_hours_unit"] == "GPU-hours" and rep["machine"] == "m" and rep["precision"] == {"ran": "fp32"}
    assert rep["tables"] == [{"paper": "p", "target": "t", "cells": 1,
                              "train_hours": round(rep["cells"][0]["projection"]["train_hours"], 2)}]
    assert read_json(tmp_path / "r.json") == rep
    assert (tmp_path / "r.md").read_text().startswith("# Paper-scale rehearsal\n\n1 of 1 cells ok, 0 warn, 0 failed")
    # one warn (a NaN loss), one failed, one ok beside them, on the CPU
    warn = _row_cell(tmp_path / "w", prov_extra={"machine": {"cuda": False}})
    write_json_atomic(tmp_path / "w" / warn["cell"] / "train_log.json",
                      {"rounds": [{"round": 1, "clients": [{"train_loss": math.nan}]}]})
    failed = _row_cell(tmp_path / "f", prov_extra={"machine": {"cuda": False}})
    (tmp_path / "f" / failed["cell"] / "scores.json").unlink()
    ok = _row_cell(tmp_path / "o", prov_extra={"machine": {"cuda": False}})
    for sub, e in (("w", warn), ("f", failed), ("o", ok)):
        e["cell"] = f"{sub}/{e['cell']}"
        e["files"] = [f"{sub}/{f}" for f in e["files"]]
        e["jobs"] = {j: dict(s, benchmark=f"{sub}/{s['benchmark']}", log=f"{sub}/{s['log']}")
                     for j, s in e["jobs"].items()}
    rep = report.build(_plan_doc([warn, failed, ok]), tmp_path, tmp_path / "r.json", tmp_path / "r.md")
    assert rep["summary"] == {"cells": 3, "ok": 1, "warn": 1, "failed": 1}
    assert rep["device_hours_unit"] == "CPU-hours (this machine)" and rep["backbones"] == {}
    lines = report.summary_lines(rep)
    assert lines[0] == "rehearsal: 1 ok, 1 warn, 1 failed (3 cells; see report.md)"
    assert lines[1] == f"  warn {warn['cell']}: finite_losses: non-finite loss: round 1.clients[0].train_loss = nan"
    assert lines[2].startswith(f"  failed {failed['cell']}: the job did not run or left no log")
    assert len(lines) == 3


def test_summary_names_the_papers_that_ran_fp32():
    base = {"summary": {"cells": 0, "ok": 0, "failed": 0}, "cells": []}
    assert report.summary_lines(base) == ["rehearsal: 0 ok, 0 warn, 0 failed (0 cells; see report.md)"]
    fp32 = dict(base, precision={"ran": "fp32", "reason": "why", "fp32_instead_of": {"b": {}, "a": {}}})
    assert report.summary_lines(fp32)[1:] == ["  precision: fp32 in place of a, b's own (why)"]
    assert len(report.summary_lines(dict(base, precision={"ran": "paper", "fp32_instead_of": {"a": {}}}))) == 1
    assert len(report.summary_lines(dict(base, precision={"ran": "fp32", "fp32_instead_of": {}}))) == 1


def test_main_names_what_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"plan.json: no rehearsal plan; run `make rehearse` first"):
        report.main([str(tmp_path)])
    with pytest.raises(SystemExit, match=r"report.json: no rehearsal report; run `make rehearse` first"):
        report.main([str(tmp_path), "--summary"])
    entry = _row_cell(tmp_path)
    write_json_atomic(tmp_path / "plan.json", _plan_doc([entry]))
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{tmp_path / 'report.md'}: 1 of 1 cells ok",
                   "rehearsal: 1 ok, 0 warn, 0 failed (1 cells; see report.md)"]
    assert report.main([str(tmp_path), "--summary"]) == 0
    assert capsys.readouterr().out.splitlines() == ["rehearsal: 1 ok, 0 warn, 0 failed (1 cells; see report.md)"]


# -- the survivors of the first scoped run (2026-11-28) --------------------------------------------------
def _small_cell(root: Path, rounds: list[dict], cell: dict, job: dict, paper="p", method="M",
                prov_extra=None) -> dict:
    """One client with 4 training examples, the cell and its train job as given."""
    cell_dir = "results/small"
    (root / "d").mkdir(parents=True, exist_ok=True)
    (root / "d/train.jsonl").write_text("{}\n" * 4)
    write_json_atomic(root / cell_dir / "provenance.json",
                      {"cell": {"clients": ["c"], "client_data": {"c": "d"}, **cell},
                       "machine": {"cuda": True, "gpu": "NVIDIA H100 80GB HBM3"},
                       "timing": {"rounds": rounds}, **(prov_extra or {})})
    write_json_atomic(root / cell_dir / "scores.json", {})
    return {"paper": paper, "method": method, "backbone": "B", "setting": "s", "cell": cell_dir,
            "files": [f"{cell_dir}/scores.json"],
            "jobs": {"train": {"log": "l.log", "benchmark": "none.tsv", "resources": job}}}


def test_a_sparse_cell_row_takes_the_defaults(tmp_path):
    # no train block (batch 1), no shared_by (the job trains one cell), a round without clients, a
    # client with a step time but no step seconds; no GPU memory recorded: the CPU, no MFU although
    # the machine names a GPU and a step was counted
    rounds = [{"round": 1, "seconds": 3.0},
              {"round": 2, "seconds": 3.0, "clients": [{"seconds_per_step": 0.5, "flops_per_step": 1e12},
                                                       {"seconds_steps": 1.0, "seconds_per_step": 0.25}]}]
    entry = _small_cell(tmp_path, rounds, {}, {"runtime": 10})
    row = report.measure_cell(entry, tmp_path, {"examples_per_client": 2}, full_rounds=1)
    assert row["batch_size"] == 1 and row["effective_batch"] == 1 and row["job_cells"] == 1
    assert row["steps_per_round"] == [0, 4] and row["step_s"] == pytest.approx(0.375)
    assert row["device"] == "cpu" and row["flops_per_step"] == 1e12
    assert row["mfu"] is None and row["tflops_per_s"] == pytest.approx(1e12 / 0.375 / 1e12)
    assert row["peak_tflops"] is None and row["mfu_vs_bf16_peak"] is None
    # 4 steps of 0.375 s; overhead mean(3 − 0, 3 − 1) = 2.5; no wall time: no start-up
    assert row["projection"]["round_s"] == pytest.approx(4 * 0.375 + 2.5)
    assert row["projection"]["train_hours"] == pytest.approx((4 * 0.375 + 2.5) / 3600)
    assert row["projection"]["runtime_covered"] is True


def test_one_client_rounds_shorter_than_their_steps_and_a_runtime_met_exactly(tmp_path):
    # one client, every round: 1 step of 0.25 s at batch 4; the rounds' 0.2 s is less than the steps'
    # 0.25 s (clocks of different scope): no negative overhead; no wall time; 240 rounds = 60 s = 1 min
    rounds = [{"round": 1, "seconds": 0.2, "clients": [{"seconds_steps": 0.25, "seconds_per_step": 0.25}]}]
    entry = _small_cell(tmp_path, rounds, {"clients_per_round": 1, "train": {"batch_size": 4}},
                        {"runtime": 1})
    p = report.measure_cell(entry, tmp_path, {"examples_per_client": 4}, full_rounds=240)["projection"]
    assert p["steps_per_round"] == 1.0 and p["round_s"] == 0.25 and p["train_hours"] == 60 / 3600
    assert p["runtime_covered"] is True  # exactly the declared minute


def test_the_row_s_checks_are_the_entry_s_paper_method_and_weights(tmp_path):
    (tmp_path / "bb").mkdir()
    write_json_atomic(tmp_path / "bb" / "fedrepro_backbone.json", {"kind": "shape"})
    rounds = [{"round": 1, "seconds": 1.0, "clients": []}]
    log = [{"round": 1, "clients": [{"partition_id": 0, "kd_fraction": 0.0, "n_kd_tokens": 0, "n_tokens": 9}]}]
    entry = _small_cell(tmp_path, rounds, {"backbone_dir": "bb"}, {}, paper="adafedseleckd",
                        method="AdaFedSelectKD")
    write_json_atomic(tmp_path / entry["cell"] / "train_log.json", {"rounds": log})
    kd = report.measure_cell(entry, tmp_path, {"examples_per_client": 2}, 1)["checks"]["kd_share"]
    assert kd == {"check": "kd_share", "status": "ok",
                  "note": "random weights: degeneracy of the entropy gate not judged",
                  "values": {"round_shares": [0.0], "kind": "selective", "weights": "random"}}


def test_check_arguments_reach_each_check():
    cell = {"baselines": {"scaffold_global_lr": 0.5}}
    rounds = [{"round": 1, "clients": [{"partition_id": 0, "kd_fraction": 0.0}], "rho": {"a": 2.0},
               "server_step": _step(ratio=0.5)}]
    sc = report.run_checks("fedsum", "SCAFFOLD", cell, {}, rounds)["server_step"]
    assert sc["status"] == "ok" and sc["values"]["rounds"][0]["expected"].startswith("SCAFFOLD")
    rho = report.run_checks("fedsumm", "FedAvg", {}, {}, rounds)["fedsumm_rho"]
    assert rho == {"check": "fedsumm_rho", "status": "ok", "values": {"min": 2.0, "max": 2.0}}
    kd = report.run_checks("adafedseleckd", "AdaFedSelectKD", {}, {}, rounds, "pretrained")["kd_share"]
    assert kd["values"]["kind"] == "selective" and kd["status"] == "warn"  # degenerate on pretrained weights


def test_an_unreadable_byte_in_a_failed_job_s_log_is_replaced(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"ok\nRuntimeError: bad \xff byte\n")
    assert report._failure_reason(log) == f"{log}: RuntimeError: bad \ufffd byte"


def test_edges_of_the_server_step_bounds():
    # |ratio − s| exactly 5 % of s (in floating point): inside
    s, r = 0.12971485742871436, 0.13620060030015008
    assert abs(r - s) == report.STEP_SLACK * s
    assert report._judge_step(1, _step(ratio=r), dict(EXACT, scale=s)) is None
    scaled = {"kind": "scaled", "reference": "uniform", "scale": 2.0, "why": "s"}
    limit = scaled["scale"] * (1.0 / 0.5) * (1 + report.STEP_SLACK)  # s_max · D · 1.05, as computed
    assert report._judge_step(1, _step(ratio=limit), scaled) is None
    # FedNova: a round without local step counts is not judged, the next one is
    clients = [{"num_examples": 1}, {"num_examples": 1}]
    rounds = [{"round": 1, "server_step": _step(weighted_ratio=5.0), "clients": clients},
              {"round": 2, "server_step": _step(weighted_ratio=5.0), "clients": clients,
               "server": {"local_steps": [1, 1]}},
              {"round": 3, "server_step": {"tensors": 0, "note": "other"}}]
    out = report.check_server_step("fedsum", "FedNova", {}, rounds)
    assert [v["round"] for v in out["values"]["rounds"]] == [2] and len(out["reasons"]) == 1
    assert out["note"] == "FedNova: the round log has no local step counts; other"
    # FedNova's weights: a client without num_examples counts 1 (here beside 2): p = (2/3, 1/3)
    assert report._nova([1, 4], [{"num_examples": 2}, {}])["scale"] == pytest.approx(2.0)
    # a FedOpt config without a name is Flower's FedAdam with the config's values
    got = report.expected_server_step("adafedseleckd", "AdaFedOPT", {"server_optimizer": {"eta": 0.05}}, {"round": 2})
    assert got["scale"] == report.adaptive_step_bound("adam", 0.05, 0.9, 0.99, 2)


def test_a_kd_round_without_shares_between_two_with_them():
    rounds = [_kd(1, {"kd_fraction": 0.5}), _kd(2, {"train_loss": 1.0}), _kd(3, {"kd_fraction": 0.25})]
    out = report.check_kd_share("adafedseleckd", "AdaFedSelectKD", {}, rounds, "pretrained")
    assert out["values"]["round_shares"] == [0.5, 0.25]


def test_main_defaults_to_results_rehearsal_and_prints_every_line(tmp_path, monkeypatch, capsys):
    root = tmp_path / "results" / "rehearsal"
    entry = _row_cell(root)
    write_json_atomic(root / "plan.json", _plan_doc([entry], precision={
        "ran": "fp32", "reason": "r", "fp32_instead_of": {"p": {"precision": "bf16-mixed"}}}))
    monkeypatch.chdir(tmp_path)
    assert report.main([]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "results/rehearsal/report.md: 1 of 1 cells ok",
        "rehearsal: 1 ok, 0 warn, 0 failed (1 cells; see report.md)",
        "  precision: fp32 in place of p's own (r)"]
