"""FedSUMM's server arithmetic on the cell's device (``server_compute_device``; issue 25 item 3):
the same round on the stand-in accelerator of tests/device_check.py (real values, refuses a CPU
tensor beside a device one as CUDA does) gives the CPU's numbers, hands back CPU tensors, and the
CPU path is untouched without it."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from device_check import ACCEL, strict_device
from fedrepro.papers.fedsumm import algorithm as A
from fedrepro.papers.fedsumm.algorithm import ClientReply, FedSummConfig, FedSummServer


def _world(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"enc.w": (7, 5), "enc.b": (5,), "dec.w": (6, 4), "dec.b": (4,)}
    w_t = OrderedDict((k, torch.randn(*s, generator=g)) for k, s in shapes.items())
    replies = {}
    for i, c in enumerate(["a", "b", "c"]):
        params = OrderedDict((k, v + 0.05 * (i + 1) * torch.randn(*v.shape, generator=g))
                             for k, v in w_t.items())
        replies[c] = ClientReply(params, OrderedDict((k, w_t[k] - params[k]) for k in w_t),
                                 0.3 + 0.2 * i)
    return w_t, replies


def _two_rounds(reading, on_device: bool):
    w_t, replies = _world()
    server = FedSummServer(FedSummConfig(epsilon=0.3, reading=reading), ["a", "b", "c"], seed=0)
    logs, states = [], []
    for t in (1, 2):
        if on_device:
            with strict_device(), A.server_compute_device(ACCEL):
                w_t, log = server.server_round(t, w_t, replies)
        else:
            w_t, log = server.server_round(t, w_t, replies)
        logs.append(log)
        states.append(w_t)
    return logs, states


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        elif isinstance(v, float):
            yield f"{prefix}{k}", v


@pytest.mark.parametrize("reading", ["update_direction_rank", "update_direction", "literal"])
def test_a_round_on_the_compute_device_gives_the_cpus_numbers(reading):
    cpu_logs, cpu_states = _two_rounds(reading, on_device=False)
    dev_logs, dev_states = _two_rounds(reading, on_device=True)
    for a, b in zip(cpu_states, dev_states):
        for k in a:
            assert b[k].device.type == "cpu"  # the server's state stays on the CPU
            assert torch.equal(a[k], b[k]), k  # the stand-in computes on the CPU: same bits
    for la, lb in zip(cpu_logs, dev_logs):
        assert la["rho"] == lb["rho"]
        fa, fb = dict(_flat(la)), dict(_flat(lb))
        assert fa.keys() == fb.keys()
        for k in fa:  # the statistics' quantiles: sorted on the device, NumPy's linear rule
            assert fb[k] == pytest.approx(fa[k], rel=1e-6, abs=1e-9), k


def test_the_functions_move_their_inputs_and_hand_back_cpu_tensors():
    x = torch.randn(50, generator=torch.Generator().manual_seed(1))
    with strict_device(), A.server_compute_device(ACCEL):
        scores = A.normal_scores(x)
        sm = A.softmax_normalize(OrderedDict(w=x), "per_tensor")
        total = A._float64_sum(x)
        sq = A._square_sum(x)
    assert scores.device.type == "cpu" and sm[0].device.type == "cpu" and total.device.type == "cpu"
    assert torch.equal(scores, A.normal_scores(x))
    assert torch.equal(sm[0], A.softmax_normalize(OrderedDict(w=x), "per_tensor")[0])
    assert total == A._float64_sum(x) and sq == A._square_sum(x)


def test_a_cpu_device_moves_nothing():
    with A.server_compute_device("cpu"):
        assert A._COMPUTE[0] is None
    with A.server_compute_device(None):
        assert A._COMPUTE[0] is None
    with A.server_compute_device(ACCEL):
        assert A._COMPUTE[0] == ACCEL
    assert A._COMPUTE[0] is None


def test_deviation_summary_on_a_tensor_is_numpys():
    import numpy as np

    v = torch.randn(1001, generator=torch.Generator().manual_seed(2))
    a = A.deviation_summary(v.numpy().copy())
    b = A.deviation_summary(v)
    assert a.keys() == b.keys()
    for k in a:
        assert b[k] == pytest.approx(a[k], rel=1e-6), k
    with pytest.raises(A.InputError, match="no values"):
        A.deviation_summary(torch.empty(0))
    assert np.isfinite(list(b.values())).all()


def test_rho_moves_each_vector_to_the_device_once(monkeypatch):
    """Inside ρ (``_resident``) a client's update directions, eq. 6's softmax and eq. 5's sums stay
    on the compute device: the entries copied host -> device per client-round are about two
    models' worth (its reply and its stored S_c), where handing every function's result back to
    the CPU copied several times that.  The numbers are the same either way."""
    import contextlib

    moved, inside = [0], [False]
    original, rho = A._to_compute, A.FedSummServer._rho

    def counting(t):
        if inside[0] and A._COMPUTE[0] is not None and t.device.type == "cpu":
            moved[0] += t.numel()
        return original(t)

    def counted_rho(self, *args):  # only what ρ moves
        inside[0] = True
        try:
            return rho(self, *args)
        finally:
            inside[0] = False

    monkeypatch.setattr(A, "_to_compute", counting)
    monkeypatch.setattr(A.FedSummServer, "_rho", counted_rho)
    entries = sum(v.numel() for v in _world()[0].values())

    def run():
        moved[0] = 0
        logs, _ = _two_rounds("update_direction_rank", on_device=True)
        return moved[0], logs

    resident, logs = run()
    monkeypatch.setattr(A, "_resident", contextlib.nullcontext)
    handed_back, logs_back = run()
    assert [log["rho"] for log in logs] == [log["rho"] for log in logs_back]
    client_rounds = 2 * 3
    # per client-round: its reply twice (the round's mean direction, then its own); its old S_c
    # in round 2; per round w_t, S_g and the old S_g once
    assert resident <= entries * (2 * client_rounds + 3 + 2 * 3), resident / entries
    assert handed_back >= 1.8 * resident, (handed_back / entries, resident / entries)


@pytest.mark.parametrize("apply_on_server", [True, False])
def test_one_pass_round_sums_are_the_separate_functions_bits(apply_on_server):
    """FedSUMM's round reads each reply and memory entry once per tensor (``_round_sums``) for the
    mean, ``update_difference`` and the other assignment's difference: the same bits as the
    separate functions over ``client_update``; FedAvg's ``plain_update_mean`` likewise."""
    w_t, replies = _world(5)
    g = torch.Generator().manual_seed(9)
    entries = {c: OrderedDict((k, torch.randn(*v.shape, generator=g)) for k, v in w_t.items())
               for c in replies}
    scales = [0.37, {k: 0.1 * (i + 1) for i, k in enumerate(w_t)}, None]
    clients = sorted(replies)
    params = [replies[c].params for c in clients]
    chosen = [(entries[c], sc) for c, sc in zip(clients, scales)]
    other = [(entries[clients[(i + 1) % 3]], 0.25) for i in range(3)]
    server = FedSummServer(FedSummConfig(apply_on_server=apply_on_server), clients, seed=0)
    chosen = [server._applied(*e) for e in chosen]
    other = [server._applied(*e) for e in other]
    mean, diff, other_norm = server._round_sums(w_t, params, chosen, other)

    updates = [A.client_update(p, w_t, *e) for p, e in zip(params, chosen)]
    plain = [A.client_update(p, w_t) for p in params]
    alternative = [A.client_update(p, w_t, *e) for p, e in zip(params, other)]
    assert diff == A.update_difference(updates, plain)
    assert other_norm == A.mean_difference_norm(updates, alternative)
    expected, info = A.plain_mean(updates)
    assert all(torch.equal(mean[k], expected[k]) for k in w_t) and list(mean) == list(expected)
    if apply_on_server:
        assert diff["rel_diff"] > 0 and other_norm > 0  # the entries were applied
    else:
        assert diff["rel_diff"] == 0 and other_norm == 0
    fedavg, info_avg = A.plain_update_mean(w_t, params)
    expected_avg, info_expected = A.plain_mean(plain)
    assert info_avg == info_expected
    assert all(torch.equal(fedavg[k], expected_avg[k]) for k in w_t)
    # on the stand-in accelerator: CPU tensors back, the same values
    with strict_device(), A.server_compute_device(ACCEL):
        mean_dev, diff_dev, other_dev = server._round_sums(w_t, params, chosen, other)
        avg_dev, _ = A.plain_update_mean(w_t, params)
    assert all(mean_dev[k].device.type == "cpu" and torch.equal(mean_dev[k], mean[k]) for k in w_t)
    assert all(torch.equal(avg_dev[k], fedavg[k]) for k in w_t)
    assert diff_dev == pytest.approx(diff, rel=1e-12) and other_dev == pytest.approx(other_norm)


def test_the_ratio_passes_take_cache_sized_chunks_on_the_cpu_and_large_ones_on_a_device():
    assert A._chunk() == A._RATIO_CHUNK == 1 << 18
    with A.server_compute_device(ACCEL):
        assert A._chunk() == A._DEVICE_RATIO_CHUNK == 1 << 24
    assert A._chunk() == A._RATIO_CHUNK


def test_the_statistics_stay_on_the_device(monkeypatch):
    """ρ − 1 of every entry is made and summarised on the compute device (a GPU sort), not copied
    to the CPU: at 116 M entries a CPU sort takes ~20 s."""
    seen = []
    real = A._deviation_summary_torch
    monkeypatch.setattr(A, "_deviation_summary_torch",
                        lambda v: seen.append((v.device, v.dtype, v.numel())) or real(v))
    sc = [torch.tensor([0.5, 0.25, 0.25])]
    sg = [torch.tensor([0.25, 0.5, 0.25])]
    with strict_device(), A.server_compute_device(ACCEL):
        groups, stats = A.rho_and_statistics(sc, sg, [[("a", 0, 3)]])
    assert seen == [(ACCEL, torch.float32, 3)]
    assert groups == A.rho_and_statistics(sc, sg, [[("a", 0, 3)]])[0]
