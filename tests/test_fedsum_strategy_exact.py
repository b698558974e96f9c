"""FedSum's Flower strategies (``fedrepro.papers.fedsum.strategy``) through whole rounds, as Flower
calls them (``configure_train`` / ``aggregate_train``): the round log each writes (records sent
and received with their bytes, the server's extras: SCAFFOLD's ‖c‖, FedNova's τ_i, FedDC's action,
FedSum's ε̄/Q̄/PDT, the evaluation -- global model or FedProto's clients), the server state saved
every round and a run resumed from it giving the same next round, FedSum's initial-portrait pass
(Alg. 1's PDT init), the size-proportional client draw (successive sampling ∝ n_i) and the
method -> strategy table.  Clients a, b, c hold 1, 4 and 9 examples (test_step_fedsum's X, Y).
"""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedrepro.fl.checkpoint import checkpoint_paths
from fedrepro.io import InputError
from fedrepro.papers.fedsum import strategy as fss
from fedrepro.papers.fedsum import task as fedsum_task
from test_step_fedsum import FEDAVG, X, Y, _t, close, configure, make_cell, replies, server

BYTES = 5 * 4  # X/Y: 5 float32 entries


@pytest.fixture
def evaluated(monkeypatch):
    """``task.evaluate_state`` stubbed: records the model it is given, answers fixed metrics."""
    seen = []

    def ev(cell, state):
        assert cell["method"] and cell["clients"]  # the strategy's cell
        seen.append({k: v.clone() for k, v in state.items()})
        return {"metrics": {"rougeL_f1": 0.25, "n": 7}, "selected": {"d1": [0, 2]}}

    monkeypatch.setattr(fedsum_task, "evaluate_state", ev)
    return seen


def _round(s, server_round, current, states, extra=None, metrics=None):
    inst = configure(s, server_round, current)
    arrays, _ = s.aggregate_train(server_round, replies(inst, states, extra, metrics)[::-1])
    meta = json.loads(checkpoint_paths(s.out_dir, server_round + s.round_offset)[1].read_text())
    return inst, arrays.to_torch_state_dict(), meta


def _lists(state) -> dict:
    return {k: v.tolist() for k, v in state.items()}


DC = [
    {"representation.w": [0.5, 0.5], "head.linear1.weight": [[0.5, 0.5]], "head.linear1.bias": [0.5]},
    {"representation.w": [1.0, -4.0], "head.linear1.weight": [[-2.0, -2.0]], "head.linear1.bias": [-2.0]},
    {"representation.w": [3.0, 3.0], "head.linear1.weight": [[3.0, 3.0]], "head.linear1.bias": [3.0]},
]


def test_scaffold_round_log_state_and_resume(task_identity, tmp_path, evaluated):
    """SCAFFOLD through aggregate_train: the log names c (sent) and Δc_i (received) with their
    bytes, ‖c‖ after the round, the global evaluation of the new x; c is saved with the round and a
    resumed strategy (round_offset 1) broadcasts the same c and reaches the same x_2."""
    extra = [{"scaffold-delta-c": ArrayRecord(_t(d))} for d in DC]
    s = server(fss.FedSumScaffold, tmp_path, "SCAFFOLD")
    _, x1, meta = _round(s, 1, X, Y, extra)
    want_c = [4.5 / 3, -0.5 / 3, 1.5 / 3, 1.5 / 3, 1.5 / 3]  # Σ Δc_i / N, N = 3
    assert meta["server"]["control_norm"] == pytest.approx(math.sqrt(sum(v * v for v in want_c)))
    assert meta["downlink_records"]["b"] == {"scaffold-c": {
        "head.linear1.bias": [1], "head.linear1.weight": [1, 2], "representation.w": [2]}}
    assert set(meta["uplink_records"]) == {"a", "b", "c"}
    assert meta["uplink_records"]["c"]["scaffold-delta-c"]["representation.w"] == [2]
    assert meta["extra_bytes_down"] == 3 * BYTES and meta["extra_bytes_up"] == 3 * BYTES
    assert meta["evaluation"] == {"evaluated": "global", "metrics": {"rougeL_f1": 0.25, "n": 7},
                                  "selected": {"global": {"d1": [0, 2]}}}
    for k in X:
        close(evaluated[-1][k], x1[k])
    saved = s.state_path(1)
    assert saved.name == "server_state_round_001.pt" and saved.parent.name == "checkpoints"
    inst2, x2, _ = _round(s, 2, _lists(x1), Y, extra)
    assert inst2[0].content["scaffold-c"] is inst2[2].content["scaffold-c"]  # one record per round
    cell = make_cell(tmp_path, "SCAFFOLD")
    resumed = fss.make_strategy(
        cell, out_dir=tmp_path / "server", round_offset=1, expected_clients=3,
        fraction_train=1.0, min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0,
        min_evaluate_nodes=0, weighted_by_key="num-examples")
    assert isinstance(resumed, fss.FedSumScaffold)
    resumed._node_of = {0: 11, 1: 12, 2: 13}
    for k in X:  # c after round 2 is what was saved with round 2; round 1's c was loaded
        assert resumed.control[k].shape == torch.Size(torch.tensor(X[k]).shape)
    inst2b = configure(resumed, 1, _lists(x1))
    for m, mb in zip(inst2, inst2b):
        for k in X:
            assert torch.equal(torch.from_numpy(m.content["scaffold-c"][k].numpy()),
                               torch.from_numpy(mb.content["scaffold-c"][k].numpy()))
    x2b, _ = resumed.aggregate_arrays(2, replies(inst2b, Y, extra))
    x2b = x2b.to_torch_state_dict()
    for k in X:
        assert torch.equal(x2[k], x2b[k])
    # round 3's state replaces round 1's (kept: the last two)
    _round(s, 3, _lists(x2), Y, extra)
    assert not s.state_path(1).exists() and s.state_path(2).exists() and s.state_path(3).exists()


def test_scaffold_server_reads_the_replies_tensor_by_tensor(task_identity, tmp_path, evaluated, monkeypatch):
    """The SCAFFOLD server update gets each reply's y_i and Δc_i as RecordTensors (decoded one
    tensor at a time, not every client's whole model and Δc at once: the CPU rehearsal's cell was
    killed at 24 GB) and reaches the x and c of eagerly decoded dicts."""
    rec = ArrayRecord(_t(DC[1]))
    lazy = fss.RecordTensors(rec)
    eager = rec.to_torch_state_dict()
    assert list(lazy) == list(eager) and len(lazy) == len(eager) == 3
    for k in eager:
        assert torch.equal(lazy[k], eager[k]) and lazy[k].dtype == eager[k].dtype
    seen, real = [], fss.scaffold_server_update

    def spy(x, c, states, deltas, **kw):
        seen.append([type(v).__name__ for v in (*states, *deltas)])
        ref = real(x, c, [dict(v) for v in states], [dict(v) for v in deltas], **kw)
        got = real(x, c, states, deltas, **kw)
        for a, b in zip(ref, got):
            assert all(torch.equal(a[k], b[k]) for k in a)
        return got

    monkeypatch.setattr(fss, "scaffold_server_update", spy)
    extra = [{"scaffold-delta-c": ArrayRecord(_t(d))} for d in DC]
    _round(server(fss.FedSumScaffold, tmp_path, "SCAFFOLD"), 1, X, Y, extra)
    assert seen == [["RecordTensors"] * 6]


def test_missing_server_state_is_an_error_and_fedavg_keeps_none(task_identity, tmp_path, evaluated):
    cell = make_cell(tmp_path, "SCAFFOLD")
    kw = dict(out_dir=tmp_path / "none", round_offset=2, expected_clients=3, fraction_train=1.0,
              min_train_nodes=3, min_available_nodes=3)
    with pytest.raises(InputError, match="server state of round 2 is missing"):
        fss.make_strategy(cell, **kw)
    avg = fss.make_strategy(make_cell(tmp_path, "FedAvg"), **kw)  # nothing to load
    assert type(avg) is fss.FedSumRunnerStrategy and avg.state_dict() is None
    avg._node_of = {0: 11, 1: 12, 2: 13}
    _, got, meta = _round(avg, 1, X, Y)
    for k in X:
        close(got[k], FEDAVG[k])
    assert meta["round"] == 3 and meta["server"] == {} and meta["downlink_records"]["a"] == {}
    assert meta["extra_bytes_down"] == 0 and meta["extra_bytes_up"] == 0
    assert meta["uplink_records"] == {"a": {}, "b": {}, "c": {}}  # metrics are not a record
    assert not list((tmp_path / "none" / "checkpoints").glob("server_state_*"))


def test_keep_round_checkpoints_keeps_every_server_state(task_identity, tmp_path, evaluated):
    s = server(fss.FedSumFedNova, tmp_path, "FedNova")
    s.cell["keep_round_checkpoints"] = True
    steps = [{"local-steps": k} for k in (2, 5, 9)]
    _, x1, meta = _round(s, 1, X, Y, metrics=steps)
    assert meta["server"] == {"local_steps": [2, 5, 9]}
    d = server(fss.FedSumDaisyChain, tmp_path / "dc", "FedDC")
    d.cell["keep_round_checkpoints"] = True
    x = X
    for t in (1, 2, 3):
        _, got, meta = _round(d, t, x, Y)
        x = _lists(got)
    assert all(d.state_path(t).exists() for t in (1, 2, 3))
    e = server(fss.FedSumDaisyChain, tmp_path / "default", "FedDC")
    del e.cell["keep_round_checkpoints"]
    x = X
    for t in (1, 2, 3):
        _, got, meta = _round(e, t, x, Y)
        x = _lists(got)
    assert [e.state_path(t).exists() for t in (1, 2, 3)] == [False, True, True]


def test_feddc_round_log_and_resumed_chain(task_identity, tmp_path, evaluated):
    """FedDC (d = 1, b = 2): round 1 permutes (log: the derangement, who holds a model), round 2
    aggregates; the chain saved after round 1 gives a resumed strategy the same round-2 messages."""
    s = server(fss.FedSumDaisyChain, tmp_path, "FedDC")
    _, x1, meta = _round(s, 1, X, Y)
    perm = s.daisy.permutation(1, ["a", "b", "c"])
    assert meta["server"]["feddc"] == {"action": "permute", "permutation": perm}
    assert meta["server"]["holding"] == ["a", "b", "c"]
    assert meta["downlink_records"]["a"] == {"arrays": {
        "head.linear1.bias": [1], "head.linear1.weight": [1, 2], "representation.w": [2]}}
    assert meta["extra_bytes_down"] == 0  # the model replaces the broadcast, not extra
    for k in X:
        close(x1[k], FEDAVG[k])
        close(evaluated[-1][k], FEDAVG[k])
    inst2 = configure(s, 2, _lists(x1))
    cell = make_cell(tmp_path, "FedDC")
    r = fss.FedSumDaisyChain(cell, out_dir=tmp_path / "server", round_offset=1, expected_clients=3,
                             fraction_train=1.0, min_train_nodes=3, min_available_nodes=3)
    r._node_of = {0: 11, 1: 12, 2: 13}
    inst2b = configure(r, 1, _lists(x1))
    for m, mb in zip(inst2, inst2b):
        for k in X:
            close(mb.content["arrays"][k].numpy(), m.content["arrays"][k].numpy())
    _, x2, meta2 = _round(r, 1, _lists(x1), [Y[2], Y[0], Y[1]])
    assert meta2["server"]["feddc"] == {"action": "aggregate"} and meta2["server"]["holding"] == []
    close(x2["head.linear1.bias"], [(-1 + 8 + 4.5) / 14])


def test_fedproto_round_log_evaluates_the_clients(task_identity, tmp_path, evaluated):
    """FedProto: no model; the round is evaluated by the clients' own reports (metric mean over
    clients, per-client numbers and selections); C̄ is saved and reloaded on resume."""
    s = server(fss.FedSumFedProto, tmp_path, "FedProto")
    protos = [{"class-0": [1.0, 0.0], "class-1": [0.0, 2.0]}, {"class-0": [3.0, 3.0]},
              {"class-0": [-1.0, 2.0], "class-1": [4.0, -2.0]}]
    counts = [(3, 1), (7, 0), (20, 6)]
    extra, mets = [], []
    for i, (p, (c0, c1)) in enumerate(zip(protos, counts)):
        extra.append({"fedproto-upload": ArrayRecord(_t(p)),
                      "fedsum-eval": fedsum_task.selections_record({f"d{i}": [i, 2]})})
        met = {"class-0-count": c0, "class-1-count": c1, "test-docs": 10 + i}
        met.update({m.replace("_", "-"): 0.1 * (i + 1) + j for j, m in enumerate(fedsum_task.METRICS)})
        mets.append(met)
    inst, _, meta = _round(s, 1, {}, [None] * 3, extra, mets)
    ev = meta["evaluation"]
    assert ev["evaluated"] == "clients" and not evaluated
    assert ev["metrics"]["rouge1_f1"] == pytest.approx(0.2)
    assert ev["metrics"]["rougeL_recall"] == pytest.approx(0.2 + 5)
    assert ev["metrics"]["n"] == 10
    assert ev["per_client"]["c"]["rouge2_f1"] == pytest.approx(1.3) and ev["per_client"]["c"]["n"] == 12
    assert ev["selected"] == {"a": {"d0": [0, 2]}, "b": {"d1": [1, 2]}, "c": {"d2": [2, 2]}}
    assert meta["uplink_records"]["b"]["fedproto-upload"] == {"class-0": [2]}
    assert meta["uplink_records"]["b"]["fedsum-eval"] == {"doc-ids": ["d1"], "selected": ["1,2"]}
    assert meta["extra_bytes_down"] == 0  # no prototypes yet
    assert meta["extra_bytes_up"] == (2 + 1 + 2) * 2 * 4
    cell = make_cell(tmp_path, "FedProto")
    r = fss.make_strategy(cell, out_dir=tmp_path / "server", round_offset=1, expected_clients=3,
                          fraction_train=1.0, min_train_nodes=3, min_available_nodes=3)
    assert isinstance(r, fss.FedSumFedProto)
    close(r.global_prototypes[0], [4 / 30, 61 / 30])
    close(r.global_prototypes[1], [24 / 7, -10 / 7])
    r._node_of = {0: 11, 1: 12, 2: 13}
    inst2 = configure(r, 1, {})
    assert all(len(m.content["fedproto-prototypes"]) == 2 for m in inst2)


class PortraitGrid:
    def __init__(self, portraits, fail=False):
        self.portraits, self.fail, self.sent, self.timeouts = portraits, fail, [], []

    def send_and_receive(self, messages, timeout=None):
        self.timeouts.append(timeout)
        messages = list(messages)
        self.sent.extend(messages)
        out = []
        for m in messages:
            pid = m.metadata.dst_node_id - 11
            if self.fail and pid == 2:
                continue
            out.append(Message(RecordDict({
                "fedsum-portrait": ArrayRecord(OrderedDict(portrait=torch.tensor(self.portraits[pid]))),
                "metrics": MetricRecord({"partition-id": pid})}), reply_to=m))
        return out[::-1]


def test_fedsum_initial_portraits_round_log_and_resume(task_identity, tmp_path, evaluated):
    """Before round 1 (pdt_init: portraits) every client sends its initial semantic portrait; the
    PDT holds tanh(‖SP_i − SP_p‖₂); the round log carries ε̄, Q̄, the PDT and the pass's bytes; the
    saved state gives a resumed strategy the same round-2 broadcast."""
    s = server(fss.FedSumServer, tmp_path, "FedSum")
    grid = PortraitGrid({0: [0.0, 0.0, 0.0, 0.0], 1: [3.0, 4.0, 0.0, 0.0], 2: [0.0, 0.0, 0.0, 0.5]})
    inst = sorted(s.configure_train(1, ArrayRecord(_t(X)), ConfigRecord({"k": 1}), grid),
                  key=lambda m: m.metadata.dst_node_id)
    assert len(grid.sent) == 3 and grid.timeouts == [s.timeout]
    assert grid.sent[1].content["arrays"]["representation.w"].numpy().tolist() == X["representation.w"]
    assert all(m.content["fedsum"]["phase"] == "initial-portrait" for m in grid.sent)
    assert grid.sent[0].content["config"]["server-round"] == 1 and grid.sent[0].content["config"]["k"] == 1
    assert s.state.pdt.weight("a", "b") == pytest.approx(math.tanh(5.0))
    assert s.state.pdt.weight("b", "c") == pytest.approx(math.tanh(math.sqrt(9 + 16 + 0.25)))
    cfg_a = inst[0].content["fedsum"]
    assert "knowledge-clients" not in cfg_a  # round 1: nobody has a head yet
    eps, q = (0.7, 0.2, 0.4), (3.0, 2.5, 5.5)
    ups = [{"fedsum-upload": ArrayRecord(_t({"class-0": [1.0, 0.0], "class-1": [0.0, 1.0],
                                              "portrait": sp}))}
           for sp in ([0.0, 0.0, 0.0, 0.0], [3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5])]
    mets = [{"mean-significance": e, "mean-bias-level": b} for e, b in zip(eps, q)]
    arrays, _ = s.aggregate_train(1, replies(inst, Y, ups, mets))
    meta = json.loads(checkpoint_paths(s.out_dir, 1)[1].read_text())
    srv = meta["server"]
    assert srv["global_significance"] == pytest.approx((0.7 + 0.8 + 3.6) / 14)
    assert srv["global_bias_level"] == pytest.approx((3.0 + 10.0 + 49.5) / 14)
    assert srv["perturbed_heads"] == ["a", "b", "c"] and srv["portraits"] == ["a", "b", "c"]
    assert srv["pdt"]["a"]["b"] == pytest.approx(math.tanh(5.0))
    assert srv["pdt"]["c"]["a"] == pytest.approx(math.tanh(0.5))
    assert srv["pdt"]["b"]["b"] == pytest.approx(0.0)
    assert srv["initial_portraits"] == {"clients": ["a", "b", "c"], "bytes_down": 3 * BYTES,
                                        "bytes_up": 3 * 16}
    x1 = _lists(arrays.to_torch_state_dict())
    inst2 = configure(s, 2, x1)
    cell = make_cell(tmp_path, "FedSum")
    r = fss.make_strategy(cell, out_dir=tmp_path / "server", round_offset=1, expected_clients=3,
                          fraction_train=1.0, min_train_nodes=3, min_available_nodes=3)
    r._node_of = {0: 11, 1: 12, 2: 13}
    inst2b = configure(r, 1, x1)  # round 2: no second portrait pass
    for m, mb in zip(inst2, inst2b):
        assert dict(m.content["fedsum"]) == dict(mb.content["fedsum"])
        ha, hb = m.content["fedsum-heads"].to_torch_state_dict(), mb.content["fedsum-heads"].to_torch_state_dict()
        assert ha.keys() == hb.keys() and all(torch.equal(ha[k], hb[k]) for k in ha)
    _, _, meta2 = _round(s, 2, x1, Y, ups, mets)
    assert "initial_portraits" not in meta2["server"]
    with pytest.raises(InputError, match="at round 2, asked for round 4"):
        s.records_for(4, "a")


def test_failed_initial_portrait_pass_stops_the_run(task_identity, tmp_path):
    s = server(fss.FedSumServer, tmp_path, "FedSum")
    grid = PortraitGrid({0: [0.0], 1: [1.0], 2: [2.0]}, fail=True)
    with pytest.raises(RuntimeError, match="initial portraits failed"):
        s.configure_train(1, ArrayRecord(_t(X)), ConfigRecord({}), grid)
    failure = json.loads((tmp_path / "server" / "checkpoints" / "failure.json").read_text())
    assert failure["round"] == 0 and "[2]" in failure["reason"]


class Draws:
    def __init__(self, values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def test_size_proportional_sample_by_hand():
    """Successive sampling ∝ n_i: u·Σn against the cumulative sizes of the clients left."""
    # 0.5·14 = 7 -> [1, 5, 14] picks id 2; then 0.1·5 = 0.5 -> [1, 5] picks id 0
    assert fss.size_proportional_sample([0, 1, 2], [1, 4, 9], 2, Draws([0.5, 0.1])) == [2, 0]
    # u·Σn exactly on a boundary goes right: 1/14·14 = 1 -> id 1
    assert fss.size_proportional_sample([0, 1, 2], [1, 4, 9], 1, Draws([1 / 14])) == [1]
    assert fss.size_proportional_sample([7, 8, 9], [2, 0, 3], 2, Draws([0.39, 0.99])) == [7, 9]
    assert fss.size_proportional_sample([7, 8, 9], [2, 0, 3], 2, Draws([0.41, 0.0])) == [9, 7]
    # a u rounding up to 1: the last client with data, never one without
    assert fss.size_proportional_sample([7, 8, 9], [2, 3, 0], 1, Draws([1.0])) == [8]
    assert fss.size_proportional_sample([1, 2], [5, 6], 2, Draws([0.0, 0.0])) == [1, 2]
    with pytest.raises(ValueError):
        fss.size_proportional_sample([1, 2], [5], 1, Draws([0.0]))
    with pytest.raises(InputError, match="negative"):
        fss.size_proportional_sample([1, 2], [5, -1], 1, Draws([0.0]))
    with pytest.raises(InputError, match="only 1 clients hold data"):
        fss.size_proportional_sample([1, 2], [5, 0], 2, Draws([0.0, 0.0]))
    assert fss.size_proportional_sample([1, 2], [5, 0], 1, Draws([0.99])) == [1]


def test_proportional_selection_draws_from_the_round_seeded_generator(task_identity, tmp_path):
    s = server(fss.FedSumRunnerStrategy, tmp_path, "FedAvg", clients="abcde")
    s.fraction_train, s.min_train_nodes = 0.5, 2
    s.cell["client_selection"] = "proportional"
    s._sizes = dict(zip("abcde", (1, 4, 9, 0, 6)))
    for t in (1, 2, 3):
        rng = random.Random(f"{s.seed}/sample/{t}")
        left, chosen = [(0, 1), (1, 4), (2, 9), (3, 0), (4, 6)], []
        for _ in range(2):  # k = max(int(5·0.5), 2) = 2
            target, acc = rng.random() * sum(n for _, n in left), 0
            for j, (pid, n) in enumerate(left):
                acc += n
                if target < acc:
                    chosen.append(left.pop(j)[0])
                    break
        got = s.sample_partitions(t, [4, 3, 2, 1, 0])
        assert got == sorted(chosen) and 3 not in got
    s.min_train_nodes = 5
    assert s.sample_partitions(1, [4, 3, 2, 1, 0]) == [0, 1, 2, 3, 4]
    s.cell["client_selection"] = "size"
    with pytest.raises(InputError, match="client_selection"):
        s.sample_partitions(1, [0, 1])
    with pytest.raises(InputError, match="partition id 9 outside"):
        s.client_name(9)


def test_make_strategy_table(tmp_path):
    kw = dict(out_dir=tmp_path, round_offset=0, expected_clients=3)
    want = {"FedAvg": fss.FedSumRunnerStrategy, "FedProx": fss.FedSumFedProx,
            "SCAFFOLD": fss.FedSumScaffold, "FedNova": fss.FedSumFedNova,
            "FedProto": fss.FedSumFedProto, "FedDC": fss.FedSumDaisyChain, "FedSum": fss.FedSumServer}
    for method, cls in want.items():
        s = fss.make_strategy(make_cell(tmp_path, method), **kw)
        assert type(s) is cls and s.total_rounds == 3 and s.clients == ["a", "b", "c"]
    assert fss.make_strategy(make_cell(tmp_path, "FedProx"), **kw).proximal_mu == pytest.approx(0.3)
    cell = make_cell(tmp_path, "FedProx")
    del cell["baselines"]
    assert fss.make_strategy(cell, **kw).proximal_mu == 1.0
    cell = make_cell(tmp_path, "SCAFFOLD")
    assert fss.make_strategy(cell, **kw).global_lr == pytest.approx(0.8)
    del cell["baselines"]
    assert fss.make_strategy(cell, **kw).global_lr == 1.0
    for v in fedsum_task.VARIANTS:
        assert type(fss.make_strategy(make_cell(tmp_path, v), **kw)) is fss.FedSumServer
    with pytest.raises(InputError):
        fss.make_strategy(make_cell(tmp_path, "Separate"), **kw)


def test_scaffold_without_delta_c_and_before_any_round(task_identity, tmp_path):
    s = server(fss.FedSumScaffold, tmp_path, "SCAFFOLD")
    inst = configure(s, 1, X)
    extra = [{"scaffold-delta-c": ArrayRecord(_t(DC[0]))}, {}, {"scaffold-delta-c": ArrayRecord(_t(DC[2]))}]
    with pytest.raises(InputError, match=r"clients \[1\] sent no"):
        s.aggregate_arrays(1, replies(inst, Y, extra))
    fresh = server(fss.FedSumScaffold, tmp_path / "fresh", "SCAFFOLD")
    fresh.save_server_state(1)  # c not made yet: saved and loaded as None
    r = fss.FedSumScaffold(make_cell(tmp_path, "SCAFFOLD"), out_dir=tmp_path / "fresh" / "server",
                           round_offset=1, expected_clients=3)
    assert r.control is None


def test_describe_records():
    rec = {"cfg": ConfigRecord({"l64": list(range(64)), "l65": list(range(65)), "x": 3, "s": "v"}),
           "arr": ArrayRecord(_t({"w": [[1.0, 2.0, 3.0]]}))}
    assert fss._describe(rec) == {"cfg": {"l64": list(range(64)), "l65": "<65 values>", "x": 3,
                                          "s": "v"}, "arr": {"w": [1, 3]}}


def test_sampling_edges_defaults_and_seeds(task_identity, tmp_path, monkeypatch):
    assert fss.size_proportional_sample([1, 2], [1, 1], 2, Draws([0.0, 0.0])) == [1, 2]
    # u = 1 lands past the end: the last client with data below it, [3, 4, 5, 0] -> id 2
    assert fss.size_proportional_sample([0, 1, 2, 3], [3, 4, 5, 0], 1, Draws([1.0])) == [2]
    # uniform rule: the runner's seeded draw of round t
    s = server(fss.FedSumRunnerStrategy, tmp_path, "FedAvg", clients="abcde")
    s.fraction_train, s.min_train_nodes = 0.5, 2
    for t in (1, 2, 3):
        want = sorted(random.Random(f"{s.seed}/sample/{t}").sample([0, 1, 2, 3, 4], 2))
        assert s.sample_partitions(t, [4, 3, 2, 1, 0]) == want
    # proportional: n_i read once from the cell's data (task.client_sizes)
    calls = []
    monkeypatch.setattr(fedsum_task, "client_sizes",
                        lambda cell: calls.append(cell["clients"]) or dict(zip("abcde", (1, 4, 9, 0, 6))))
    s.cell["client_selection"] = "proportional"
    assert all(3 not in s.sample_partitions(t, [0, 1, 2, 3, 4]) for t in range(1, 9))
    assert calls == [list("abcde")]
    # defaults of a cell without baselines; the seeds of FedDC's chain and FedSum's PDT
    cell = make_cell(tmp_path, "FedDC")
    del cell["baselines"]
    d = fss.FedSumDaisyChain(cell, out_dir=tmp_path, round_offset=0, expected_clients=3)
    assert (d.daisy.daisy_period, d.daisy.aggregation_period, d.daisy.seed) == (1, 2, 5)
    assert d.server_extras(1, []) == {"feddc": {}, "holding": []}
    cell = make_cell(tmp_path, "FedDC")
    cell["baselines"].update(daisy_period=3, aggregation_period=4)
    d = fss.FedSumDaisyChain(cell, out_dir=tmp_path, round_offset=0, expected_clients=3)
    assert (d.daisy.daisy_period, d.daisy.aggregation_period) == (3, 4)
    p = fss.FedSumFedProto(make_cell(tmp_path, "FedProto"), out_dir=tmp_path, round_offset=0,
                           expected_clients=3)
    assert p.state_dict() == {"global_prototypes": {0: None, 1: None}}
    from fedrepro.data.seq2seq import derive_seed

    f = fss.FedSumServer(make_cell(tmp_path, "FedSum"), out_dir=tmp_path, round_offset=0,
                         expected_clients=3)
    assert f.state.pdt.seed == derive_seed(5, "pdt")
    assert "pdt" not in f.server_extras(1, [])
    f.state.pdt.update("a", torch.tensor([0.0, 0.0]))
    assert "pdt" not in f.server_extras(1, []) and f.server_extras(1, [])["portraits"] == ["a"]
    f.state.pdt.update("b", torch.tensor([3.0, 4.0]))
    assert f.server_extras(1, [])["pdt"]["a"]["b"] == pytest.approx(math.tanh(5.0))
