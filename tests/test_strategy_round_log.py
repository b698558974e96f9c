"""The server round every paper's strategy inherits (``fedrepro.fl.strategy``), pinned value by
value (the ``fl.strategy`` mutation scope, 2026-11-28): the round log's per-client entries, bytes
and aggregated metrics, the timing file's measurements kept out of the log, the server-step
figures by hand (skipped and non-float tensors, chunks, zero weights, the torch path), the
partial-participation draw, the train messages, the wave spool and its ``.npy`` reader, and the
clients' metric records.

``test_rehearsal_checks.py`` compares the server step with a hand computation on one round; its
first mutation run (0.68 on these 21 functions) showed that the round log's entries -- what the
report's payload, loss and KD checks read -- could be renamed, emptied or moved to the timing file
unnoticed, and that nothing reached ``metric_record`` or ``missing_replies``."""

from __future__ import annotations

import io
import math
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from fedrepro.fl import strategy as fl_strategy
from fedrepro.fl.checkpoint import checkpoint_paths, load_state, timing_path
from fedrepro.fl.strategy import SortedCheckpointFedAvg, metric_record, server_step
from fedrepro.io import InputError, read_json


pytestmark = pytest.mark.usefixtures("task_identity")  # Flower messages outside a run (conftest.py)


def _arrays(d: dict, dtype=np.float32) -> ArrayRecord:
    return ArrayRecord(OrderedDict((k, Array(np.asarray(v, dtype=dtype))) for k, v in d.items()))


def _strategy(tmp_path, **kw) -> SortedCheckpointFedAvg:
    args = dict(out_dir=tmp_path, round_offset=0, expected_clients=3, fraction_train=1.0,
                min_train_nodes=1, min_available_nodes=1)
    args.update(kw)
    s = SortedCheckpointFedAvg(**args)
    s._node_of = {0: 10, 1: 11, 2: 12}  # partition id -> node id (skips the partition query)
    return s


def _reply(inst: Message, arrays: dict, pid: int, n: int, **metrics) -> Message:
    rec = {"partition-id": pid, "num-examples": n, **metrics}
    return Message(RecordDict({"arrays": _arrays(arrays), "metrics": MetricRecord(rec)}), reply_to=inst)


# -- the round log ---------------------------------------------------------------------------------
W_T = {"w": [1.0, 2.0, -0.5], "b": [0.25]}
CLIENT = {0: {"w": [2.0, 0.0, -0.5], "b": [1.0]}, 2: {"w": [0.0, 4.0, 1.5], "b": [0.0]}}


def test_a_round_s_log_entry_and_timing_file(tmp_path):
    s = _strategy(tmp_path, round_offset=4, fraction_train=0.5, min_train_nodes=2)
    msgs = s.configure_train(2, _arrays(W_T), ConfigRecord({"lr": 0.1}), None)
    by_node = {m.metadata.dst_node_id: m for m in msgs}
    chosen = sorted(by_node)  # two of the three partitions, drawn for absolute round 6
    assert [10 + p for p in s.sample_partitions(6, [0, 1, 2])] == chosen
    pids = [n - 10 for n in chosen]
    # replies in reverse order, with measurements (seconds, peak, flops) beside the results
    replies = [_reply(by_node[10 + pid], CLIENT.get(pid, CLIENT[0]), pid, 3 if i == 0 else 1,
                      **{"train-loss": 0.5 + pid, "kd-fraction": 0.25, "seconds-steps": 1.5,
                         "peak-gpu-mb": 700.0, "flops-per-step": 3.0})
               for i, pid in enumerate(reversed(pids))]
    new, metrics = s.aggregate_train(2, replies)
    entry = read_json(checkpoint_paths(tmp_path, 6)[1])
    per_client = 4 * 4  # 4 float32 entries
    assert entry["round"] == 6
    assert entry["clients"] == [
        {"partition_id": pid, "num_examples": 3 if pid == pids[-1] else 1, "train_loss": 0.5 + pid,
         "kd_fraction": 0.25, "uplink_tensors": {"w": [3], "b": [1]}, "uplink_bytes": per_client}
        for pid in pids]  # sorted by partition id, measurements left out
    assert entry["bytes_down"] == 2 * per_client and entry["bytes_up"] == 2 * per_client
    record = _arrays(W_T).count_bytes()
    assert entry["record_bytes_down"] == 2 * record and entry["record_bytes_up"] == 2 * record
    assert "server_step" in entry and entry["server_step"]["tensors"] == 2
    # Flower's num-examples-weighted means of the numbers (its mean of partition ids included), no timing
    assert entry["aggregated_metrics"] == {
        "train-loss": pytest.approx((3 * (0.5 + pids[1]) + 0.5 + pids[0]) / 4), "kd-fraction": 0.25,
        "partition-id": pytest.approx((3 * pids[1] + pids[0]) / 4)}
    assert set(metrics) >= {"train-loss", "seconds-steps"}
    timing = read_json(timing_path(tmp_path, 6))
    assert timing["round"] == 6 and timing["clients"] == [
        {"partition_id": pid, "seconds_steps": 1.5, "peak_gpu_mb": 700.0, "flops_per_step": 3.0} for pid in pids]
    assert timing["seconds"] >= 0 and timing["server_peak_rss_mb"] > 0
    assert timing["seconds_background_finish"] >= timing["seconds_trim"] >= 0
    assert set(timing) == {"round", "seconds", "server_peak_rss_mb", "seconds_background_finish", "seconds_trim",
                           "clients"}
    # the tensors of the round: the weighted mean, in the checkpoint
    saved, got = load_state(checkpoint_paths(tmp_path, 6)[0]), new.to_torch_state_dict()
    assert saved.keys() == got.keys() and all(torch.equal(saved[k], got[k]) for k in got)
    a, b = (CLIENT.get(p, CLIENT[0])["w"] for p in pids)  # weights 1 (pids[0]) and 3 (pids[1])
    assert got["w"].tolist() == pytest.approx([(x + 3 * y) / 4 for x, y in zip(a, b)])
    assert s._broadcast is None


def test_a_failed_or_short_round_names_the_clients(tmp_path):
    s = _strategy(tmp_path, round_offset=2)
    msgs = s.configure_train(1, _arrays(W_T), ConfigRecord({}), None)
    ok = _reply(msgs[0], CLIENT[0], 0, 1)
    bad = Message(Error(code=0, reason="client 1 ran out of memory"), reply_to=msgs[1])
    worse = Message(Error(code=0, reason="client 2 lost its disk"), reply_to=msgs[2])
    # every client answered, two with an error: both named
    with pytest.raises(RuntimeError, match=r"^round 3 failed: client 1 ran out of memory; client 2 lost its disk$"):
        s.aggregate_train(1, [ok, bad, worse])
    assert read_json(tmp_path / "checkpoints" / "failure.json") == {
        "round": 3, "reason": "client 1 ran out of memory; client 2 lost its disk"}
    s = _strategy(tmp_path / "b", round_offset=2, timeout=30)
    msgs = s.configure_train(1, _arrays(W_T), ConfigRecord({}), None)
    with pytest.raises(RuntimeError, match=r"round 3 failed: 1 of 3 clients replied; no reply from partition\(s\) "
                                           r"\[1, 2\] within the round's time limit of 30 s"):
        s.aggregate_train(1, [_reply(msgs[0], CLIENT[0], 0, 1)])
    with pytest.raises(RuntimeError, match=r"round 3 failed: 0 of 3 clients replied; no reply from partition\(s\) "
                                           r"\[0, 1, 2\]"):
        s.aggregate_train(1, [])


def test_missing_replies_in_words(tmp_path):
    s = _strategy(tmp_path, timeout=12.5)
    msgs = s.configure_train(1, _arrays(W_T), ConfigRecord({}), None)
    sent = {10: 0, 11: 1, 12: 2}
    got = [_reply(msgs[1], CLIENT[0], 1, 1)]
    assert s.missing_replies(sent, got) == (
        "1 of 3 clients replied; no reply from partition(s) [0, 2] within the round's time limit of 12.5 s "
        "(config key <paper>.round_timeout_s)")
    assert s.missing_replies(sent, got, total=5).startswith("1 of 5 clients replied; no reply from partition(s) [0, 2]")
    assert s.missing_replies({}, [], total=2) == (
        "0 of 2 clients replied within the round's time limit of 12.5 s (config key <paper>.round_timeout_s)")


# -- the train messages and the draw -----------------------------------------------------------------
def test_train_messages_carry_the_round_and_count_the_downlink(tmp_path):
    asked = []

    class Extra(SortedCheckpointFedAvg):
        def client_records(self, absolute_round, partition_id):
            asked.append((absolute_round, partition_id))
            return {"guidance": _arrays({"g": [float(partition_id)]})}

    s = Extra(out_dir=tmp_path, round_offset=7, expected_clients=3, fraction_train=1.0, min_train_nodes=1,
              min_available_nodes=1)
    s._node_of = {2: 12, 0: 10, 1: 11}
    arrays, config = _arrays(W_T), ConfigRecord({"lr": 0.5})
    msgs = s.configure_train(3, arrays, config, None)
    assert asked == [(10, 0), (10, 1), (10, 2)]
    assert [m.metadata.dst_node_id for m in msgs] == [10, 11, 12]
    for m, pid in zip(msgs, (0, 1, 2)):
        assert m.content["arrays"] is arrays and m.content["config"]["server-round"] == 3
        assert m.content["config"]["lr"] == 0.5
        assert m.content["guidance"]["g"].numpy().tolist() == [float(pid)]
    assert s._round_nodes == {10: 0, 11: 1, 12: 2} and s._n_sampled == 3
    assert s._down_bytes == 3 * 16 and s._down_record_bytes == 3 * arrays.count_bytes()
    assert s._broadcast is arrays and s._own_start is False and not s._pending
    # in waves a client's own records wait for its wave: remembered per message
    w = Extra(out_dir=tmp_path, round_offset=7, expected_clients=3, wave_size=2, fraction_train=1.0,
              min_train_nodes=1, min_available_nodes=1)
    w._node_of = {0: 10, 1: 11}
    asked.clear()
    msgs = w.configure_train(1, arrays, ConfigRecord({}), None)
    assert asked == [] and "guidance" not in msgs[0].content
    assert sorted(w._pending.values()) == [(8, 0), (8, 1)]
    w.attach_client_records(msgs[1])
    assert asked == [(8, 1)] and msgs[1].content["guidance"]["g"].numpy().tolist() == [1.0]


def test_the_draw_is_the_seed_s_and_the_round_s(tmp_path):
    s = _strategy(tmp_path, seed=5, fraction_train=0.4, min_train_nodes=1)
    ids = list(range(10))
    draws = {t: s.sample_partitions(t, ids) for t in (1, 2, 3)}
    assert all(len(d) == 4 and d == sorted(d) for d in draws.values())  # int(10 · 0.4)
    assert draws == {t: sorted(random.Random(f"5/sample/{t}").sample(ids, 4)) for t in (1, 2, 3)}
    assert len({tuple(d) for d in draws.values()}) == 3  # the round changes the draw
    assert s.sample_partitions(1, list(reversed(ids))) == draws[1]  # whatever order the ids come in
    assert _strategy(tmp_path, seed=6, fraction_train=0.4).sample_partitions(1, ids) != draws[1]
    # at least min_train_nodes; all of them when that is everyone
    assert len(_strategy(tmp_path, fraction_train=0.1, min_train_nodes=3).sample_partitions(1, ids)) == 3
    assert _strategy(tmp_path, fraction_train=0.5, min_train_nodes=4).sample_partitions(1, [3, 1, 2, 0]) == [0, 1, 2, 3]
    assert _strategy(tmp_path, fraction_train=0.75, min_train_nodes=1).sample_partitions(1, [3, 1, 2, 0]) == \
        sorted(random.Random("0/sample/1").sample([0, 1, 2, 3], 3))


# -- the server step by hand ------------------------------------------------------------------------------
def _rec(d: dict, dtype=np.float32, as_torch=False) -> dict:
    def read(v):
        a = np.asarray(v, dtype=dtype)
        return torch.from_numpy(a) if as_torch else a
    return {k: (tuple(np.shape(v)), lambda v=v: read(v)) for k, v in d.items()}


REF = {"a": [0.0, 1.0, 2.0, 3.0, 4.0], "b": [[1.0, -1.0], [0.5, 0.0]]}
NEW = {"a": [0.5, 1.0, 2.0, 2.0, 4.0], "b": [[1.0, -1.0], [0.5, 0.25]]}
CLIENTS = [{"a": [1.0, 1.0, 2.0, 3.0, 2.0], "b": [[1.0, 0.0], [0.5, 0.0]]},
           {"a": [0.0, 4.0, 2.0, 1.0, 4.0], "b": [[2.0, -1.0], [0.5, 1.0]]}]


def _by_hand(weights) -> dict:
    keys = sorted(REF)
    flat = {k: np.asarray(REF[k], dtype=np.float64).ravel() for k in keys}
    d = [np.concatenate([np.asarray(c[k], dtype=np.float64).ravel() - flat[k] for k in keys]) for c in CLIENTS]
    step = np.concatenate([np.asarray(NEW[k], dtype=np.float64).ravel() - flat[k] for k in keys])
    total = sum(weights)
    p = [w / total for w in weights] if total > 0 else [0.5, 0.5]  # no examples: the clients alike
    mean_u, mean_w = (d[0] + d[1]) / 2, p[0] * d[0] + p[1] * d[1]
    s, u, w = (float(np.linalg.norm(x)) for x in (step, mean_u, mean_w))
    norms = [float(np.linalg.norm(x)) for x in d]
    return {"server_norm": s, "max_abs_server_step": float(np.max(np.abs(step))), "mean_update_norm": u,
            "weighted_mean_update_norm": w, "ratio": s / u, "weighted_ratio": s / w,
            "cosine": float(step @ mean_u) / (s * u), "weighted_cosine": float(step @ mean_w) / (s * w),
            "client_update_norm_mean": sum(norms) / 2, "client_update_norm_weighted": p[0] * norms[0] + p[1] * norms[1]}


@pytest.mark.parametrize("chunk", [2, 3, 1 << 20])  # small chunks first: a broken chunk loop fails fast
@pytest.mark.parametrize("weights", [[3, 1], [0, 0], [1, 0]])
def test_server_step_is_its_formula(monkeypatch, chunk, weights):
    monkeypatch.setattr(fl_strategy, "SERVER_STEP_CHUNK", chunk)
    out = server_step(_rec(REF), _rec(NEW), [_rec(c) for c in CLIENTS], weights)
    hand = _by_hand(weights)
    assert out.pop("tensors") == 2 and out.pop("skipped_tensors") == 0 and out.pop("entries") == 9
    assert out.keys() == hand.keys()
    for k, v in hand.items():
        assert out[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k
    # the weighted and uniform figures differ here (a swapped weight shows), the cosines are below 1
    if weights == [3, 1]:
        assert abs(hand["weighted_mean_update_norm"] - hand["mean_update_norm"]) > 0.1
        assert 0 < hand["cosine"] < 0.99


def test_server_step_on_torch_tensors_and_a_device_path(monkeypatch):
    """A torch device other than the CPU computes in torch float64 (``cpu:0`` takes that path on a
    CPU-only build): the numpy path's numbers; bfloat16 replies are read as float32."""
    used = []
    real = fl_strategy._add_tensor_torch
    monkeypatch.setattr(fl_strategy, "_add_tensor_torch", lambda *a: used.append(1) or real(*a))
    ref = server_step(_rec(REF), _rec(NEW), [_rec(c) for c in CLIENTS], [3, 1])
    assert not used
    dev = server_step(_rec(REF), _rec(NEW), [_rec(c, as_torch=True) for c in CLIENTS], [3, 1],
                      device=torch.device("cpu", 0))
    assert used == [1, 1]  # one call per tensor
    for k, v in ref.items():
        assert dev[k] == pytest.approx(v, rel=1e-12), k

    def bf16(d):
        return {k: (tuple(np.shape(v)), lambda v=v: torch.tensor(v, dtype=torch.bfloat16)) for k, v in d.items()}

    # every value here is exact in bfloat16: the same figures through _flat's float32 view
    assert server_step(bf16(REF), bf16(NEW), [bf16(c) for c in CLIENTS], [3, 1]) == ref
    assert fl_strategy._flat(torch.tensor([[1.5, 2.0]], dtype=torch.bfloat16)).tolist() == [1.5, 2.0]
    assert fl_strategy._flat(torch.tensor([[1.5, 2.0]], dtype=torch.bfloat16)).dtype == np.float32
    assert fl_strategy._flat(torch.ones(2, 3, dtype=torch.float64)).dtype == np.float64
    assert fl_strategy._flat(np.ones((2, 3), dtype=np.float16)).shape == (6,)
    assert fl_strategy._device_tensor(np.ones((2, 2)), "cpu").shape == (4,)


def test_server_step_compares_only_common_float_tensors():
    ref = {**REF, "steps": [1, 2], "gone": [1.0], "reshaped": [1.0, 2.0], "one_short": [3.0]}
    clients = [{**c, "steps": [2, 3], "gone": [2.0], "reshaped": [[1.0, 2.0]], "one_short": [1.0]} for c in CLIENTS]
    del clients[1]["one_short"]
    new = {**NEW, "steps": [5, 5], "reshaped": [1.0, 2.0], "one_short": [2.0]}

    def rec(d):
        def read(v, k):
            return np.asarray(v, dtype=np.int64 if k in ("steps", "n") else np.float32)
        return {k: (tuple(np.shape(v)), lambda v=v, k=k: read(v, k)) for k, v in d.items()}

    out = server_step(rec(ref), rec(new), [rec(c) for c in clients], [3, 1])
    # "steps" (integer), "gone" (not in the new model), "reshaped" (another shape in a reply),
    # "one_short" (missing from a reply) are skipped; "a" and "b" are compared as before
    assert out["tensors"] == 2 and out["skipped_tensors"] == 4 and out["entries"] == 9
    assert out["server_norm"] == pytest.approx(_by_hand([3, 1])["server_norm"], rel=1e-12)
    two_ints = server_step(rec({"steps": [1], "n": [2]}), rec({"steps": [1], "n": [3]}),
                           [rec({"steps": [1], "n": [2]})], [1])
    assert two_ints == {"tensors": 0, "skipped_tensors": 2, "entries": 0}
    assert server_step(_rec(REF), _rec(NEW), [], []) == {"tensors": 0, "skipped_tensors": 2, "entries": 0}
    # one client: its own update is the mean, whatever its weight (0 too)
    for w in (4, 0):
        one = server_step(_rec(REF), _rec(NEW), [_rec(CLIENTS[0])], [w])
        assert one["mean_update_norm"] == one["weighted_mean_update_norm"] == one["client_update_norm_mean"]
        assert one["client_update_norm_weighted"] == one["client_update_norm_mean"]


def test_server_step_edges():
    assert fl_strategy._quotient(3.0, 1.0) == 3.0 and fl_strategy._quotient(0.0, 2.0) == 0.0
    assert fl_strategy._quotient(1.0, 0.0) is None and math.isnan(fl_strategy._quotient(math.nan, 2.0))
    assert math.isnan(fl_strategy._fsum([math.inf, -math.inf, 1.0]))
    assert fl_strategy._fsum([1e308, 1e308]) == math.inf
    assert fl_strategy._fsum([1e16, 1.0, -1e16]) == 1.0  # exact, whatever the order
    # the server did not move: ratio 0, cosines None
    still = server_step(_rec(REF), _rec(REF), [_rec(c) for c in CLIENTS], [3, 1])
    assert still["server_norm"] == 0.0 and still["ratio"] == 0.0 and still["cosine"] is None
    assert still["max_abs_server_step"] == 0.0
    # the clients did not move: no ratio
    idle = server_step(_rec(REF), _rec(NEW), [_rec(REF), _rec(REF)], [3, 1])
    assert idle["ratio"] is None and idle["weighted_ratio"] is None and idle["client_update_norm_mean"] == 0.0
    empty = server_step(_rec({"e": np.zeros(0)}), _rec({"e": np.zeros(0)}), [_rec({"e": np.zeros(0)})], [1])
    assert empty == {"tensors": 1, "skipped_tensors": 0, "entries": 0}


def test_the_strategy_s_server_step_and_its_notes(tmp_path, monkeypatch):
    s = _strategy(tmp_path)
    new = _arrays(NEW)
    assert s.server_step(new, []) == {"tensors": 0, "note": "no broadcast recorded"}
    msgs = s.configure_train(1, _arrays(REF), ConfigRecord({}), None)
    replies = [_reply(msgs[i], c, i, n) for i, (c, n) in enumerate(zip(CLIENTS, (3, 1)))]
    got = s.server_step(new, replies)
    assert got == server_step(_rec(REF), _rec(NEW), [_rec(c) for c in CLIENTS], [3, 1])
    no_arrays = Message(RecordDict({"metrics": MetricRecord({"partition-id": 2, "num-examples": 1})}),
                        reply_to=msgs[2])
    assert s.server_step_inputs(new, [no_arrays])[2] == [{}]
    s._own_start = True
    assert s.server_step(new, replies) == {
        "tensors": 0, "note": "clients start from their own models (a per-client downlink replaces the broadcast): "
                              "no common w_t to compare with"}
    # the check computes where the strategy's check_device is (the cell's GPU)
    seen = []
    real = fl_strategy.server_step
    monkeypatch.setattr(fl_strategy, "server_step",
                        lambda *a, device=None: seen.append(device) or real(*a, device=device))
    on_device = _strategy(tmp_path / "d", check_device="cpu:0")
    msgs = on_device.configure_train(1, _arrays(REF), ConfigRecord({}), None)
    on_device.server_step(new, [_reply(msgs[i], c, i, n) for i, (c, n) in enumerate(zip(CLIENTS, (3, 1)))])
    assert seen == ["cpu:0"]


# -- the wave spool ----------------------------------------------------------------------------------------
def test_spooled_replies_keep_their_bytes_and_sizes(tmp_path):
    s = _strategy(tmp_path, wave_size=1)
    msgs = s.configure_train(1, _arrays(REF), ConfigRecord({}), None)
    reply = _reply(msgs[0], {"a": CLIENTS[0]["a"], "b": CLIENTS[0]["b"]}, 0, 2)
    arrays = reply.content["arrays"]
    record_bytes = arrays.count_bytes()
    blobs = b"".join(a.data for a in arrays.values())
    s.spool_reply(reply)
    entry = s._spooled[0]
    assert entry["path"] == tmp_path / "checkpoints" / "replies" / "partition_00000.npys"
    assert entry["path"].read_bytes() == blobs
    assert entry["bytes"] == 9 * 4 and entry["record_bytes"] == record_bytes
    assert entry["shapes"] == {"a": [5], "b": [2, 2]}
    assert list(entry["index"]) == ["a", "b"] and entry["index"]["a"][0] == 0
    assert not list(entry["path"].parent.glob("*.tmp*"))  # written atomically
    shapes, read = s.spooled_arrays(0)
    assert read("b").tolist() == CLIENTS[0]["b"] and read("a").tolist() == CLIENTS[0]["a"]
    view = entry["view"]  # mapped once, at the first read, and kept for the round
    read("a")
    assert entry["view"] is view
    # an error reply and a reply without arrays are left alone
    err = Message(Error(code=0, reason="x"), reply_to=msgs[1])
    s.spool_reply(err)
    bare = Message(RecordDict({"metrics": MetricRecord({"partition-id": 2, "num-examples": 1})}), reply_to=msgs[2])
    s.spool_reply(bare)
    assert sorted(s._spooled) == [0]
    # an empty reply spools an empty file, which reads nothing
    s.spool_reply(Message(RecordDict({"arrays": ArrayRecord(),
                                      "metrics": MetricRecord({"partition-id": 1, "num-examples": 1})}),
                          reply_to=msgs[1]))
    assert s._spooled[1]["path"].stat().st_size == 0 and s.spooled_arrays(1)[0] == {}


def test_a_round_of_spooled_replies_logs_them_and_removes_their_files(tmp_path):
    class SpoolMean(SortedCheckpointFedAvg):
        """Averages spooled replies (as FedSUMM's server does), uniformly."""

        def aggregate_arrays(self, absolute_round, replies):
            reads = [self.spooled_arrays(int(m.content["metrics"]["partition-id"])) for m in replies]
            shapes = reads[0][0]
            mean = {k: sum(r(k) for _, r in reads) / len(reads) for k in shapes}
            return ArrayRecord(OrderedDict((k, Array(v.numpy())) for k, v in mean.items())), {}

    s = SpoolMean(out_dir=tmp_path, round_offset=0, expected_clients=2, wave_size=1, fraction_train=1.0,
                  min_train_nodes=1, min_available_nodes=1)
    s._node_of = {0: 10, 1: 11}
    msgs = s.configure_train(1, _arrays(REF), ConfigRecord({}), None)
    replies = [_reply(msgs[i], c, i, n, **{"train-loss": 1.0}) for i, (c, n) in enumerate(zip(CLIENTS, (3, 1)))]
    record = [r.content["arrays"].count_bytes() for r in replies]
    for r in replies:
        s.spool_reply(r)
    paths = [s._spooled[i]["path"] for i in (0, 1)]
    s.aggregate_train(1, replies)
    entry = read_json(checkpoint_paths(tmp_path, 1)[1])
    assert [c["uplink_tensors"] for c in entry["clients"]] == [{"a": [5], "b": [2, 2]}] * 2
    assert [c["uplink_bytes"] for c in entry["clients"]] == [36, 36] and entry["bytes_up"] == 72
    assert entry["record_bytes_up"] == sum(record)
    assert entry["server_step"]["tensors"] == 2 and entry["server_step"]["ratio"] == pytest.approx(
        server_step(_rec(REF), _rec({k: ((np.asarray(CLIENTS[0][k]) + CLIENTS[1][k]) / 2).tolist() for k in REF}),
                    [_rec(c) for c in CLIENTS], [3, 1])["ratio"], rel=1e-6)
    assert not any(p.exists() for p in paths) and s._spooled == {}


def test_npy_view_reads_any_npy_header_in_place():
    def npy(arr, version=None):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, arr, version=version)
        return buf.getvalue()

    fortran = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    for arr, version in ((fortran, None), (np.arange(4, dtype=np.int16), (2, 0)), (fortran, (2, 0)),
                         (np.float64(2.5), None)):
        blob = memoryview(npy(arr, version) + b"\x00" * 16)  # bytes after the array: not read
        got = fl_strategy._npy_view(blob, "x")
        assert got.shape == np.shape(arr) and got.dtype == np.asarray(arr).dtype
        assert np.array_equal(got, arr)
        assert [got.flags[f] for f in ("C_CONTIGUOUS", "F_CONTIGUOUS")] == [
            np.asarray(arr).flags[f] for f in ("C_CONTIGUOUS", "F_CONTIGUOUS")]
    with pytest.raises(InputError, match=r"^where: not a \.npy array .*; the spooled reply is damaged$"):
        fl_strategy._npy_view(memoryview(b"not an npy file at all"), "where")


# -- what a client sends ---------------------------------------------------------------------------------------
def test_metric_record_sends_the_numbers_with_flower_s_keys():
    rec = metric_record({"num_examples": 4, "train_loss": np.float64(0.5), "n_batches": 2, "is_last": True,
                         "method": "FedAvg", "seconds_steps": 1.25, "parts": [1.0]}, 3)
    assert dict(rec) == {"partition-id": 3, "num-examples": 4, "train-loss": 0.5, "n-batches": 2,
                         "seconds-steps": 1.25}
    assert isinstance(rec["num-examples"], int) and isinstance(rec["train-loss"], float)
    assert isinstance(rec["partition-id"], int)
    assert dict(metric_record({"num_examples": 0}, np.int64(2))) == {"partition-id": 2, "num-examples": 0}
    # NumPy scalars are sent as the numbers they hold (np.float32 is no Python float); np.bool_ is no metric
    numpy = metric_record({"num_examples": np.int64(5), "loss": np.float32(0.25), "flag": np.bool_(True)}, 0)
    assert dict(numpy) == {"partition-id": 0, "num-examples": 5, "loss": 0.25}
    assert type(numpy["num-examples"]) is int and type(numpy["loss"]) is float
    with pytest.raises(ValueError, match="num_examples"):
        metric_record({"train_loss": 1.0}, 0)


def test_payload_bytes_are_entries_times_their_width():
    rec = ArrayRecord(OrderedDict([("h", Array(np.zeros((3, 4), dtype=np.float16))),
                                   ("f", Array(np.zeros(5, dtype=np.float32))),
                                   ("d", Array(np.zeros((), dtype=np.float64)))]))
    assert fl_strategy.payload_bytes(rec) == 3 * 4 * 2 + 5 * 4 + 8
    assert fl_strategy.payload_bytes(ArrayRecord()) == 0
    assert [fl_strategy.is_measurement(k) for k in ("seconds-steps", "peak_gpu_mb", "flops-per-step",
                                                     "train-loss", "n-seconds")] == [True, True, True, False, False]


# -- the round's files written beside the next round (inside a run) -----------------------------------------
class _Clock:
    """``time`` for the strategy module with a perf_counter that advances 1 s per call."""

    def __init__(self):
        self.t = 100.0

    def perf_counter(self):
        self.t += 1.0
        return self.t

    def __getattr__(self, name):
        import time
        return getattr(time, name)


def _round_of_two(s, server_round=1):
    msgs = s.configure_train(server_round, _arrays(REF), ConfigRecord({}), None)
    return [_reply(msgs[i], c, i, n) for i, (c, n) in enumerate(zip(CLIENTS, (3, 1)))]


def test_inside_a_run_the_round_s_files_are_written_in_the_background(tmp_path, monkeypatch, caplog):
    import logging

    from fedrepro.logs import RoundProgress

    class Extras(SortedCheckpointFedAvg):
        def round_extras(self, absolute_round, replies):
            return {"extra": [absolute_round, len(replies)]}

    clock = _Clock()
    monkeypatch.setattr(fl_strategy, "time", clock)
    devices = []
    real = fl_strategy.server_step
    monkeypatch.setattr(fl_strategy, "server_step",
                        lambda *a, device=None: devices.append(device) or real(*a, device=device))
    s = Extras(out_dir=tmp_path, round_offset=3, expected_clients=2, fraction_train=1.0, min_train_nodes=1,
               min_available_nodes=1, check_device="cpu:0")
    s._node_of = {0: 10, 1: 11}
    # three clients expected, two in the round: the line counts the round's
    s._progress = RoundProgress(5, 3, start_round=3, clock=lambda: 0.0, logger=logging.getLogger("t"))
    s._running = True  # as inside start(): the writer thread writes the files
    replies = _round_of_two(s)  # configure_train reads the clock once (the round's start)
    with caplog.at_level(logging.INFO, logger="t"):
        s.aggregate_train(1, replies)
    s.join_round_writes()
    assert devices == ["cpu:0"]
    entry = read_json(checkpoint_paths(tmp_path, 4)[1])
    assert entry["round"] == 4 and entry["extra"] == [4, 2] and entry["server_step"]["tensors"] == 2
    timing = read_json(timing_path(tmp_path, 4))
    # the clock: 101 at configure_train, 102 at the round's end; the writer reads 103 .. 106
    assert timing["seconds"] == 1.0 and timing["seconds_trim"] == 1.0 and timing["seconds_background_finish"] == 3.0
    assert "round 4/5 · 2 clients" in caplog.text
    assert s._writing_round == 4


def test_a_failed_background_write_stops_the_run_at_its_round(tmp_path, monkeypatch):
    s = _strategy(tmp_path, round_offset=5)
    s._running = True

    def refuse(path, state):
        raise OSError("no space left on device")

    monkeypatch.setattr(fl_strategy, "save_state", refuse)
    s._node_of = {0: 10, 1: 11}
    s.aggregate_train(1, _round_of_two(s))
    with pytest.raises(RuntimeError, match=r"^round 6 failed: round 6: the background write of this round "
                                           r"checkpoint failed: OSError: \S*server_round_006\.safetensors: "
                                           r"OSError: no space left on device$"):
        s.join_round_writes()
    assert read_json(tmp_path / "checkpoints" / "failure.json")["round"] == 6


@pytest.mark.parametrize("which", ["timing", "log"])
def test_a_failed_json_write_names_its_file(tmp_path, monkeypatch, which):
    real = fl_strategy.write_json_atomic
    target = timing_path(tmp_path, 1) if which == "timing" else checkpoint_paths(tmp_path, 1)[1]

    def write(path, obj):
        if str(path) == str(target):
            raise OSError("read-only file system")
        return real(path, obj)

    monkeypatch.setattr(fl_strategy, "write_json_atomic", write)
    s = _strategy(tmp_path)
    s._node_of = {0: 10, 1: 11}
    with pytest.raises(OSError, match=f"^{target}: OSError: read-only file system$"):
        s.aggregate_train(1, _round_of_two(s))


def test_a_client_s_failed_checkpoint_write_stops_the_round(tmp_path, monkeypatch):
    from fedrepro.fl.checkpoint import ClientWriteError

    def fail():
        raise ClientWriteError("clients/partition_00001.safetensors: the background write failed")

    monkeypatch.setattr(fl_strategy, "join_client_writes", fail)
    s = _strategy(tmp_path, round_offset=1)
    s._node_of = {0: 10, 1: 11}
    with pytest.raises(RuntimeError, match=r"^round 2 failed: clients/partition_00001"):
        s.aggregate_train(1, _round_of_two(s))
    assert read_json(tmp_path / "checkpoints" / "failure.json") == {
        "round": 2, "reason": "clients/partition_00001.safetensors: the background write failed"}
    assert not checkpoint_paths(tmp_path, 2)[1].exists()


def test_the_first_round_asks_every_node_for_its_partition(tmp_path):
    class Grid:
        def __init__(self):
            self.sent = []

        def get_node_ids(self):
            return [21, 20]

        def send_and_receive(self, messages, timeout=None):
            self.sent.append((list(messages), timeout))
            return [Message(RecordDict({"metrics": MetricRecord({"partition-id": m.metadata.dst_node_id - 20})}),
                            reply_to=m) for m in messages]

    grid = Grid()
    s = SortedCheckpointFedAvg(out_dir=tmp_path, round_offset=0, expected_clients=2, fraction_train=1.0,
                               min_train_nodes=1, min_available_nodes=2, timeout=9.0)
    msgs = s.configure_train(1, _arrays(REF), ConfigRecord({}), grid)
    assert s._node_of == {0: 20, 1: 21} and [m.metadata.dst_node_id for m in msgs] == [20, 21]
    (queries, timeout), = grid.sent
    assert timeout == 9.0 and [q.metadata.dst_node_id for q in queries] == [20, 21]
    assert all(q.content["config"]["ask"] == "partition-id" for q in queries)
    s.configure_train(2, _arrays(REF), ConfigRecord({}), grid)
    assert len(grid.sent) == 1  # asked once
