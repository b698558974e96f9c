"""FedSUMM's server, piece by piece, where the mutation run of ``fedsumm.algorithm`` (issue 24,
docs/mutation.md) found no test: the round log's keys and the other memory assignment's
difference, an aggregation other than the plain mean (DP's path: the updates themselves, not the
one-pass mean), a round whose clients did not move, a reply whose gradient does not match, the
configuration's bounds, the memory store's copy, the tracker's statistics switch and window, and
the client update's bookkeeping without labels."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

from fedrepro.io import InputError
from fedrepro.papers.fedsumm import algorithm as A
from fedrepro.papers.fedsumm.algorithm import (
    ClientReply,
    DiscrepancyTracker,
    FedSummConfig,
    FedSummServer,
    plain_mean,
)

SHAPES = {"enc.w": (4, 3), "enc.b": (3,), "dec.w": (2, 3)}


def _world(seed=0, spread=0.1):
    g = torch.Generator().manual_seed(seed)
    w_t = OrderedDict((k, torch.randn(*s, generator=g)) for k, s in SHAPES.items())
    replies = {}
    for i, c in enumerate(["a", "b", "c"]):
        params = OrderedDict((k, v + spread * (i + 1) * torch.randn(*v.shape, generator=g))
                             for k, v in w_t.items())
        gradient = OrderedDict((k, w_t[k] - params[k]) for k in w_t)
        replies[c] = ClientReply(params, gradient, [0.9, 0.2, 0.5][i])  # losses: sort ≠ ids
    return w_t, replies


def _rounds(config, aggregate=plain_mean, rounds=2):
    w_t, replies = _world()
    server = FedSummServer(config, ["a", "b", "c"], seed=3)
    logs = []
    for t in range(1, rounds + 1):
        w_t, log = server.server_round(t, w_t, replies, aggregate=aggregate)
        logs.append(log)
    return w_t, logs, server


@pytest.mark.parametrize("assignment", ["own", "rank"])
def test_the_log_names_the_round_and_the_other_assignment(assignment):
    _, logs, _ = _rounds(FedSummConfig(epsilon=0.3, memory_assignment=assignment))
    other = "rank" if assignment == "own" else "own"
    for t, log in enumerate(logs, 1):
        assert log["round"] == t
        diff = log["update_difference"]
        assert set(diff) == {"rel_diff", "best_scale", "rel_diff_beyond_scale", "cosine",
                             "norm_fedavg", f"rel_diff_vs_{other}"}
    # round 2: every client has a memory entry and the loss order is not the id order, so the
    # other assignment applies other entries: a difference
    assert logs[1]["update_difference"][f"rel_diff_vs_{other}"] > 1e-3
    assert logs[1]["memory_source"] != {c: c for c in "abc"} or assignment == "own"


def test_another_aggregation_gets_the_modulated_updates():
    """With an aggregation other than the plain mean (DP's clip-and-noise functions) the server
    hands it the updates w^c − g̃^c − w_t themselves; a plain mean passed that way gives the
    one-pass mean's bits."""
    seen = []

    def recording(updates):
        seen.append([OrderedDict((k, u[k].clone()) for k in u) for u in updates])
        return plain_mean(updates)

    config = FedSummConfig(epsilon=0.3)
    direct, logs, server = _rounds(config)
    via, logs_via, _ = _rounds(config, aggregate=recording)
    assert all(torch.equal(direct[k], via[k]) for k in direct)
    assert logs[1]["update_difference"] == logs_via[1]["update_difference"]
    # round 2's updates are modulated (the entries are applied on the server): not w^c − w_t
    w_t, replies = _world()
    assert logs_via[1]["modulated"] == {c: True for c in "abc"}
    round2 = seen[1]
    plain = [A.client_update(replies[c].params, w_t) for c in sorted(replies)]
    assert any(not torch.allclose(u[k], p[k]) for u, p in zip(round2, plain) for k in SHAPES)


def test_clients_that_did_not_move():
    """Every reply equals w_t: the updates are 0, so the differences are undefined (NaN) and the
    FedAvg norm 0; the model stays."""
    g = torch.Generator().manual_seed(1)
    w_t = OrderedDict((k, torch.randn(*s, generator=g)) for k, s in SHAPES.items())
    replies = {c: ClientReply(OrderedDict((k, v.clone()) for k, v in w_t.items()),
                              OrderedDict((k, torch.zeros_like(v)) for k, v in w_t.items()), 0.4)
               for c in "ab"}
    server = FedSummServer(FedSummConfig(epsilon=0.3), ["a", "b"], seed=0)
    w_next, log = server.server_round(1, w_t, replies)
    diff = log["update_difference"]
    assert diff["norm_fedavg"] == 0.0
    for key in ("rel_diff", "best_scale", "rel_diff_beyond_scale", "cosine", "rel_diff_vs_rank"):
        assert math.isnan(diff[key]), key
    assert all(torch.equal(w_next[k], w_t[k]) for k in w_t)


def test_update_difference_when_the_modulated_mean_is_zero():
    """Δ_S = 0 while Δ_A ≠ 0: the cosine is undefined (NaN), the rest are numbers."""
    plain = [OrderedDict(w=torch.tensor([1.0, -2.0]))]
    modulated = [OrderedDict(w=torch.tensor([0.0, 0.0]))]
    diff = A.update_difference(modulated, plain)
    assert math.isnan(diff["cosine"])
    assert diff["rel_diff"] == pytest.approx(1.0) and diff["best_scale"] == pytest.approx(0.0)
    assert diff["norm_fedavg"] == pytest.approx(math.sqrt(5.0))


def test_a_reply_whose_gradient_does_not_match_is_refused():
    w_t, replies = _world()
    bad = replies["b"]
    gradient = OrderedDict(bad.gradient)
    gradient["extra"] = torch.zeros(2)
    del gradient["enc.b"]
    replies["b"] = ClientReply(bad.params, gradient, bad.loss)
    server = FedSummServer(FedSummConfig(), ["a", "b", "c"], seed=0)
    with pytest.raises(InputError, match=r"client 'b' gradient.*missing \['enc.b'\], "
                                         r"unexpected \['extra'\]"):
        server.server_round(1, w_t, replies)


def test_config_bounds():
    FedSummConfig(epsilon=0.0, unit_norm_tolerance=0.0, clients_per_round=1)  # all allowed
    for kwargs in ({"epsilon": -0.1}, {"epsilon": math.inf}, {"epsilon": math.nan},
                   {"unit_norm_tolerance": -1e-9}, {"clients_per_round": 0}):
        with pytest.raises(InputError):
            FedSummConfig(**kwargs)


def test_memory_store_keeps_a_copy_and_the_server_its_entries():
    store = A.MemoryVectorStore()
    source = OrderedDict(w=torch.tensor([1.0, 2.0]))
    name = store.put("mg", source)
    source["w"].mul_(10)  # the caller changes its tensor afterwards
    assert torch.equal(store.get(name)["w"], torch.tensor([1.0, 2.0]))
    w_t, replies = _world()
    server = FedSummServer(FedSummConfig(), ["a", "b", "c"], seed=0)
    assert server.memory_entry("a") is None  # before the first round
    server.server_round(1, w_t, replies)
    entry = server.memory_entry("b")
    assert all(torch.equal(entry[k], replies["b"].gradient[k]) for k in SHAPES)
    lazy = A.LazyTensors({"x": (2,)}, lambda k: torch.zeros(2))
    assert "x" in lazy and "y" not in lazy


def test_disk_store_counts_its_files(tmp_path):
    store = A.DiskVectorStore(tmp_path / "state")
    assert store.disk_bytes() == 0  # no folder yet
    store.put("mg", OrderedDict(w=torch.ones(3), b=torch.ones(2)))
    store.put("mg", OrderedDict(w=torch.ones(3)), dtype=torch.bfloat16)
    assert store.disk_bytes() == 5 * 4 + 3 * 2
    (tmp_path / "state" / "sub").mkdir()  # a folder is not a file
    assert store.disk_bytes() == 26


@pytest.mark.parametrize("reduction", ["expected", "mean"])
def test_tracker_statistics_on_request_in_both_windows(reduction):
    zeros = OrderedDict(a=torch.zeros(2), b=torch.zeros(1))
    moved = {"c": OrderedDict(a=torch.tensor([math.log(2.0), 0.0]), b=torch.zeros(1)),
             "d": OrderedDict(a=torch.tensor([0.0, math.log(4.0)]), b=torch.zeros(1))}
    for window in ("cumulative", "round"):
        quiet = DiscrepancyTracker(reduction=reduction, window=window)
        out = quiet.update_round_detailed(moved, zeros)
        assert set(out) == {"c", "d"} and all(r.statistics is None for r in out.values())
        asked = DiscrepancyTracker(reduction=reduction, window=window)
        out = asked.update_round_detailed(moved, zeros, statistics=True)
        assert set(out) == {"c", "d"}  # every client of the round, in both windows
        for c, r in out.items():
            sc = A.softmax_normalize(moved[c])
            sg = A.softmax_normalize(zeros)
            want = A.rho_statistics(sc, sg, A.group_slices(zeros, "global"), reduction,
                                    group_values=r.groups)
            assert r.statistics.keys() == want.keys()
            for part in want:
                assert r.statistics[part] == pytest.approx(want[part]), (window, c, part)
    with pytest.raises(InputError, match="client 'c'"):
        DiscrepancyTracker().update_round_detailed({"c": OrderedDict(a=torch.zeros(2))}, zeros)


def test_ratios_refuse_sums_of_different_scopes():
    s = [torch.tensor([0.5, 0.5])]
    with pytest.raises(InputError, match="same, non-zero number of scopes"):
        A.discrepancy_ratios(s, s + s)
    with pytest.raises(InputError, match="same, non-zero number of scopes"):
        A.discrepancy_ratios([], [])


def test_client_update_result_without_labels_and_its_timing():
    model = torch.nn.Linear(2, 1)
    batches = [{"x": torch.ones(3, 2)}, {"x": torch.zeros(2, 2)}]  # no "labels"

    def loss(m, batch):
        return m(batch["x"]).pow(2).mean()

    res = A.fedsumm_local_update(model, batches, loss, torch.optim.SGD(model.parameters(), lr=0.1),
                                 None, FedSummConfig())
    assert res.n_examples == 0 and res.n_steps == 2
    assert res.timing["seconds_steps"] > 0 and "seconds_per_step" in res.timing


def test_server_state_config_bounds_and_section_name():
    assert A.ServerStateConfig(wave_size=1).wave_size == 1
    for bad in (0, -2, True, 1.5, "4"):
        with pytest.raises(InputError, match="wave_size"):
            A.ServerStateConfig(wave_size=bad)
    with pytest.raises(InputError, match=r"fedsumm\.server_state"):
        A.ServerStateConfig.from_config({"storage": "disk", "wave": 4})
    with pytest.raises(InputError, match=r"fedsumm\.algorithm"):
        FedSummConfig.from_config({"epsilon": 0.1, "eps": 1})


def test_disk_store_collect_frees_exactly_the_stale_files(tmp_path):
    store = A.DiskVectorStore(tmp_path / "state")
    assert store.collect() == 0  # no folder yet
    keep = store.put("mg", OrderedDict(w=torch.ones(3)))
    old = store.put("mg", OrderedDict(w=torch.ones(5)))
    store.retain({keep})  # forgotten, its file stays until collected
    (tmp_path / "state" / ".mg-x.tmp").write_bytes(b"123")  # a killed writer's temporary
    assert store.collect() == 5 * 4 + 3  # both, summed
    assert not store.path(old).exists() and store.path(keep).exists()
    assert store.collect() == 0
    assert store.collect(keep=()) == 0  # the live entry is kept whatever keep says


def test_state_names_of_a_saved_state_in_ram_and_on_disk(tmp_path):
    w_t, replies = _world()
    for storage in ("memory", "disk"):
        server = FedSummServer(FedSummConfig(), ["a", "b", "c"], seed=0,
                               state=A.ServerStateConfig(storage=storage),
                               state_dir=tmp_path / storage)
        server.server_round(1, w_t, replies)
        names = A.state_names(server.state_dict())
        assert names == server.live_names() and len(names) == 3 + 3 + 1  # MG, S_c each; one S_g
    assert A.state_names({}) == set()


@pytest.mark.parametrize("change", ["config", "server_state", "client_ids", "seed"])
def test_a_saved_state_from_another_setting_is_refused(change):
    w_t, replies = _world()
    server = FedSummServer(FedSummConfig(), ["a", "b", "c"], seed=0)
    server.server_round(1, w_t, replies)
    state = server.state_dict()
    kwargs = {"config": FedSummConfig(), "client_ids": ["a", "b", "c"], "seed": 0}
    if change == "config":
        kwargs["config"] = FedSummConfig(epsilon=0.5)
    elif change == "client_ids":
        kwargs["client_ids"] = ["a", "b", "d"]
    elif change == "seed":
        kwargs["seed"] = 1
    other = FedSummServer(**kwargs, state=A.ServerStateConfig(dtype="bfloat16")
                          if change == "server_state" else None)
    with pytest.raises(InputError, match="another config, server_state, client list or seed"):
        other.load_state_dict(state)


class _Trickle:
    """A file object that moves at most ``step`` bytes per call (as a pipe or a network file may)."""

    def __init__(self, data: bytes = b"", step: int = 3):
        self.data, self.pos, self.step, self.written = bytearray(data), 0, step, bytearray()

    def readinto(self, buf) -> int:
        n = min(self.step, len(buf), len(self.data) - self.pos)
        buf[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n

    def write(self, buf) -> int:
        n = min(self.step, len(buf))
        self.written += bytes(buf[:n])
        return n


def test_vector_file_io_survives_short_reads_and_writes():
    import numpy as np

    arr = np.arange(7, dtype=np.float32) * 1.5
    out = _Trickle(step=5)
    A._write_all(out, arr)
    assert bytes(out.written) == arr.tobytes()
    back = np.zeros(7, dtype=np.float32)
    assert A._read_all(_Trickle(arr.tobytes(), step=3), back) == 28
    assert np.array_equal(back, arr)
    short = np.zeros(7, dtype=np.float32)  # a truncated file: the bytes that were there, no more
    assert A._read_all(_Trickle(arr.tobytes()[:10], step=4), short) == 10
    assert short.tobytes()[:10] == arr.tobytes()[:10] and not short[3:].any()
