"""The in-process engine's Grid (``fedrepro.fl.engine.InProcessGrid``) with a stand-in ClientApp
(the ``fl.engine`` mutation scope, 2026-11-28): the nodes and their configs, the message ids, a
client's exception as Flower's error reply, the round's deadline -- a stalled client named and
cancelled, the clients after it not started --, and the server identity restored."""

from __future__ import annotations

import threading
import time

import pytest
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from fedrepro import cancellation
from fedrepro.fl.engine import InProcessGrid, server_identity


pytestmark = pytest.mark.usefixtures("task_identity")  # Flower messages outside a run (conftest.py)


def _echo(seen=None, slow=None):
    """A ClientApp: answers with its partition id; ``slow``: partition -> seconds it sleeps
    (cancellably) first."""
    def app(msg, context):
        pid = int(context.node_config["partition-id"])
        if seen is not None:
            seen.append((pid, dict(context.node_config), context.node_id, threading.current_thread().name,
                         threading.current_thread().daemon, context.run_id, type(context.state).__name__,
                         len(context.state), context.run_config))
        if slow and pid in slow:
            end = time.monotonic() + slow[pid]
            while time.monotonic() < end:
                cancellation.sleep(0.02)
        if msg.content.get("config") is not None and msg.content["config"].get("raise"):
            raise ValueError(f"partition {pid} refuses")
        return Message(RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=msg)
    return app


def _messages(grid, nodes=None, **config):
    return [grid.create_message(RecordDict({"config": ConfigRecord(config)}), MessageType.TRAIN, node, "g")
            for node in (nodes or grid.get_node_ids())]


def test_nodes_carry_their_partition_and_config():
    seen = []
    grid = InProcessGrid(_echo(seen), 3, node_configs=[{"data-dir": "a"}, {}, {"x": 2}], client_names=["A", "B", "C"])
    assert grid.get_node_ids() == [1, 2, 3]
    replies = grid.send_and_receive(_messages(grid))
    assert [int(r.content["metrics"]["partition-id"]) for r in replies] == [0, 1, 2]
    assert [s[:3] for s in seen] == [(0, {"partition-id": 0, "num-partitions": 3, "data-dir": "a"}, 1),
                                     (1, {"partition-id": 1, "num-partitions": 3}, 2),
                                     (2, {"partition-id": 2, "num-partitions": 3, "x": 2}, 3)]
    assert [s[3] for s in seen] == ["client-node-1", "client-node-2", "client-node-3"]
    # each call in a daemon thread (a stalled one must not keep the job's process alive); a
    # SuperNode's context: run 0, empty state and run config
    assert [s[4:] for s in seen] == [(True, 0, "RecordDict", 0, {})] * 3
    assert grid.run.run_id == 0
    assert [r.metadata.src_node_id for r in replies] == [1, 2, 3]
    assert InProcessGrid(_echo(), 2).get_node_ids() == [1, 2]  # no configs: partition ids only


def test_messages_get_ids_and_replies_are_pulled_once():
    grid = InProcessGrid(_echo(), 2)
    msgs = _messages(grid)
    ids = list(grid.push_messages(msgs))
    assert len(set(ids)) == 2 and [m.metadata.message_id for m in msgs] == ids
    first = list(grid.pull_messages([ids[1]]))
    assert [r.metadata.reply_to_message_id for r in first] == [ids[1]]
    assert list(grid.pull_messages(ids)) and list(grid.pull_messages(ids)) == []
    m = grid.create_message(RecordDict(), MessageType.QUERY, 2, "grp", ttl=30.0)
    assert (m.metadata.dst_node_id, m.metadata.message_type, m.metadata.group_id, m.metadata.ttl) == (
        2, MessageType.QUERY, "grp", 30.0)
    run = object()
    grid.set_run(run)
    assert grid.run is run


def test_a_client_exception_is_flower_s_error_reply():
    grid = InProcessGrid(_echo(), 2, client_names=["A", "B"])
    replies = grid.send_and_receive(_messages(grid, raise_=0) + _messages(grid, nodes=[2], **{"raise": 1}))
    assert [r.has_error() for r in replies] == [False, False, True]
    err = replies[2].error
    assert err.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert err.reason.startswith("ValueError: partition 1 refuses\nTraceback")

    def f3():
        raise KeyError("deep")

    def f2():
        return f3()

    def f1():
        return f2()

    def deep(msg, context):  # 6 frames below the grid's worker: the reason keeps the first 5
        return (lambda: f1())()

    reply = list(InProcessGrid(deep, 1).send_and_receive(_messages(InProcessGrid(deep, 1))))[0]
    assert reply.error.reason.count('  File "') == 5


def test_a_stalled_client_is_named_cancelled_and_the_rest_not_started():
    seen = []
    grid = InProcessGrid(_echo(seen, slow={1: 30.0}), 3, client_names=["A", "B"])
    t0 = time.monotonic()
    replies = grid.send_and_receive(_messages(grid), timeout=0.5)
    assert time.monotonic() - t0 < 10  # cancelled at its next sleep, not left to run 30 s
    assert [p for p, *_ in seen] == [0, 1]  # partition 2 was not started
    assert len(replies) == 2 and not replies[0].has_error()
    err = replies[1].error
    assert err.code == ErrorCode.MESSAGE_UNAVAILABLE
    assert err.reason == ("client B (partition 1) did not reply within the round's time limit of 0.5 s (config key "
                          "<paper>.round_timeout_s); the clients after it in this round were not started")
    assert grid._deadline is None  # the next round has no stale deadline
    # a node without a name: its partition and node id
    assert grid._who(3) == "partition 2 (node 3)" and grid._who(1) == "client A (partition 0)"
    # without a timeout a client may take its time
    slow = InProcessGrid(_echo(slow={0: 0.3}), 1)
    assert not list(slow.send_and_receive(_messages(slow)))[0].has_error()


def test_a_round_whose_time_is_up_starts_no_client():
    seen = []
    grid = InProcessGrid(_echo(seen), 2)
    grid._deadline, grid._limit = time.monotonic() - 1, 0.0
    msgs = _messages(grid)
    ids = list(grid.push_messages(msgs))
    assert len(ids) == 2 and seen == [] and list(grid.pull_messages(ids)) == []


def test_the_grid_cancels_the_client_s_work_with_a_token_naming_it():
    said = []

    def app(msg, context):
        try:
            while True:
                cancellation.sleep(0.02)
        except cancellation.Cancelled as exc:
            said.append(str(exc))
            raise

    grid = InProcessGrid(app, 1, client_names=["A"])
    grid.send_and_receive(_messages(grid), timeout=0.2)
    assert said == ["client A (partition 0)'s message was given up on (the round's time limit passed): stopped"]


def test_server_identity_is_set_and_restored():
    with server_identity(run_id=7):
        assert (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id) == (1, 7, SUPERLINK_NODE_ID)
    assert (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id) == (0, 1, 0)
    with pytest.raises(RuntimeError), server_identity():
        assert TaskIdentity._run_id == 0
        raise RuntimeError
    assert TaskIdentity._run_id == 1
