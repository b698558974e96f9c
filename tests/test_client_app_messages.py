"""The ClientApp every paper's clients run (``fedrepro.fl.client_app``), message by message, with a
stand-in task (the ``fl.client_app`` mutation scope, 2026-11-28): which partition and data folder a
node sees, the absolute round it trains, the records a task gets and sends back, the reply's
tensors and metrics, a client's failure and time limit named, evaluation and the partition query.

The step tests call ``client_app.train`` for one method each and check the trained tensors; these
check the wrapper's own bookkeeping with numbers that differ wherever two could be swapped."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from fedrepro.fl import checkpoint, client_app


@pytest.fixture(autouse=True)
def _flower_run(monkeypatch, task_identity):
    """Flower messages outside a run (conftest.py), no failpoints from the caller's environment."""
    monkeypatch.delenv("FEDREPRO_FAILPOINTS", raising=False)


CLIENTS = ["alpha", "beta", "gamma"]


def _cell(**kw) -> dict:
    cell = {"paper": "p", "clients": CLIENTS, "client_data": {c: f"/data/{c}" for c in CLIENTS},
            "round_timeout_s": 30}
    cell.update(kw)
    return cell


def _msg(cell: dict, server_round=2, offset=5, kind=MessageType.TRAIN, **records) -> Message:
    arrays = ArrayRecord(OrderedDict([("w", Array(np.asarray([1.0, 2.0], dtype=np.float32)))]))
    content = {"arrays": arrays, "config": ConfigRecord({"cell": json.dumps(cell), "server-round": server_round,
                                                         "round-offset": offset}), **records}
    return Message(RecordDict(content), message_type=kind, dst_node_id=7)


def _ctx(pid=1, **node_config) -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": pid, **node_config}, state=RecordDict(),
                   run_config={})


class Task(SimpleNamespace):
    """A stand-in task module: records what it was called with."""


def _task(monkeypatch, wants_records=False, reply_records=None, evaluate=True) -> Task:
    calls = []

    def client_train_round(cell, client, round_index, server_state, **kwargs):
        calls.append({"cell": cell, "client": client, "round": round_index, "state": server_state,
                      "kwargs": kwargs, "writes": getattr(checkpoint._client_thread, "active", False),
                      "thread": threading.current_thread().name})
        state = {"w": server_state["w"] * 2, "b": torch.tensor([3.0], dtype=torch.float32)}
        stats = {"num_examples": 4, "train_loss": 0.75, "method": "x"}
        return (state, stats, reply_records) if reply_records is not None else (state, stats)

    task = Task(client_train_round=client_train_round, calls=calls)
    if wants_records:
        task.WANTS_RECORDS = True
    if evaluate:
        def client_evaluate(cell, client, round_index, state):
            calls.append({"evaluate": (client, round_index, state["w"].tolist())})
            return {"num_examples": 2, "rouge_l": 0.5}
        task.client_evaluate = client_evaluate
    monkeypatch.setattr(client_app, "task_for", lambda cell: task)
    return task


def test_a_train_message_trains_the_node_s_partition_at_the_absolute_round(monkeypatch):
    task = _task(monkeypatch)
    msg = _msg(_cell(), server_round=2, offset=5)
    reply = client_app.train(msg, _ctx(pid=1))
    (call,) = task.calls
    assert call["client"] == "beta" and call["round"] == 7  # server round 2 after 5 rounds of a resumed run
    assert call["cell"]["client_data"] == {"beta": "/data/beta"}  # only its own folder in view
    assert call["state"]["w"].tolist() == [1.0, 2.0] and call["kwargs"] == {}
    assert call["writes"] is True  # inside client_checkpoint_writes
    assert call["thread"] == "fedrepro-client-beta"  # bounded: run in the client's worker thread
    assert set(reply.content.keys()) == {"arrays", "metrics"}
    sent = reply.content["arrays"].to_torch_state_dict()
    assert list(sent) == ["w", "b"] and sent["w"].tolist() == [2.0, 4.0] and sent["b"].tolist() == [3.0]
    assert dict(reply.content["metrics"]) == {"partition-id": 1, "num-examples": 4, "train-loss": 0.75}
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id


def test_a_deployed_node_s_data_dir_replaces_the_cell_s_folder(monkeypatch):
    task = _task(monkeypatch)
    client_app.train(_msg(_cell()), _ctx(pid=2, **{"data-dir": "/mnt/node/gamma"}))
    assert task.calls[0]["client"] == "gamma" and task.calls[0]["cell"]["client_data"] == {"gamma": "/mnt/node/gamma"}
    cell, pid, client = client_app._client_view(ConfigRecord({"cell": json.dumps(_cell())}), _ctx(pid=0))
    assert (pid, client, cell["client_data"]) == (0, "alpha", {"alpha": "/data/alpha"})
    assert cell["clients"] == CLIENTS and cell["round_timeout_s"] == 30


def test_a_task_that_wants_records_gets_the_message_s_others_and_may_send_more(monkeypatch):
    guidance = ArrayRecord(OrderedDict([("g", Array(np.asarray([5.0], dtype=np.float32)))]))
    extra_back = {"memory": ArrayRecord(OrderedDict([("m", Array(np.asarray([9.0], dtype=np.float32)))]))}
    task = _task(monkeypatch, wants_records=True, reply_records=extra_back)
    reply = client_app.train(_msg(_cell(), guidance=guidance), _ctx())
    records = task.calls[0]["kwargs"]["records"]
    assert list(records) == ["guidance"] and records["guidance"]["g"].numpy().tolist() == [5.0]
    assert set(reply.content.keys()) == {"arrays", "metrics", "memory"}
    assert reply.content["memory"]["m"].numpy().tolist() == [9.0]
    # a task that does not ask gets no records, whatever the message carries
    plain = _task(monkeypatch)
    client_app.train(_msg(_cell(), guidance=guidance), _ctx())
    assert plain.calls[0]["kwargs"] == {}


def test_a_client_s_failure_names_the_client_its_partition_and_round(monkeypatch):
    task = _task(monkeypatch)

    def boom(*a, **k):
        raise ValueError("bad batch")

    task.client_train_round = boom
    with pytest.raises(client_app.ClientError,
                       match=r"^client beta \(partition 1\) failed in round 7: ValueError: bad batch$") as err:
        client_app.train(_msg(_cell()), _ctx())
    assert isinstance(err.value.__cause__, ValueError)
    # a failpoint named for the client's train fires first
    monkeypatch.setenv("FEDREPRO_FAILPOINTS", json.dumps({"client_train": {"beta": "raise"}}))
    _task(monkeypatch)
    with pytest.raises(client_app.ClientError, match=r"failed in round 7: FailpointError: failpoint client_train "
                                                     r"raised for client beta"):
        client_app.train(_msg(_cell()), _ctx())
    client_app.train(_msg(_cell()), _ctx(pid=0))  # another client: no failpoint


def test_a_client_over_its_time_limit_is_named_and_cancelled(monkeypatch):
    from fedrepro import cancellation

    task = _task(monkeypatch)
    stopped, said = threading.Event(), []

    def slow(*a, **k):
        try:
            for _ in range(200):  # up to 10 s, stopped at a step by the cancellation
                cancellation.sleep(0.05)
        except cancellation.Cancelled as exc:
            said.append(str(exc))
            stopped.set()
            raise

    task.client_train_round = slow
    with pytest.raises(client_app.ClientError,
                       match=r"^client beta \(partition 1\) did not finish its train of round 7 within the "
                             r"round's time limit of 0\.3 s \(config key <paper>\.round_timeout_s\)$"):
        client_app.train(_msg(_cell(round_timeout_s=0.3)), _ctx())
    assert stopped.wait(5)
    # the worker's own stop names its work: the client's train of the round
    assert said == ["client beta's train of round 7 was given up on (the round's time limit passed): stopped"]


def test_the_time_limit_defaults_to_an_hour(monkeypatch):
    seen = {}
    real = threading.Thread.join

    def join(self, timeout=None):
        if self.name.startswith("fedrepro-client-"):
            seen["timeout"] = timeout
        return real(self, timeout)

    monkeypatch.setattr(threading.Thread, "join", join)
    _task(monkeypatch)
    cell = _cell()
    del cell["round_timeout_s"]
    client_app.train(_msg(cell), _ctx())
    assert seen["timeout"] == 3600.0


def test_evaluation_and_the_partition_query(monkeypatch):
    task = _task(monkeypatch)
    reply = client_app.evaluate(_msg(_cell(), server_round=3, offset=1, kind=MessageType.EVALUATE), _ctx(pid=2))
    assert task.calls == [{"evaluate": ("gamma", 4, [1.0, 2.0])}]
    assert set(reply.content.keys()) == {"metrics"}
    assert dict(reply.content["metrics"]) == {"partition-id": 2, "num-examples": 2, "rouge-l": 0.5}
    _task(monkeypatch, evaluate=False)
    with pytest.raises(RuntimeError, match=r"^paper 'p' defines no client-side evaluation$"):
        client_app.evaluate(_msg(_cell(), kind=MessageType.EVALUATE), _ctx())
    monkeypatch.setenv("FEDREPRO_FAILPOINTS", json.dumps({"client_evaluate": {"beta": "raise"}}))
    _task(monkeypatch)
    with pytest.raises(client_app.ClientError, match=r"failpoint client_evaluate raised for client beta"):
        client_app.evaluate(_msg(_cell(), kind=MessageType.EVALUATE), _ctx())
    q = client_app.query(_msg(_cell(), kind=MessageType.QUERY), _ctx(pid=2))
    assert dict(q.content["metrics"]) == {"partition-id": 2} and set(q.content.keys()) == {"metrics"}


def test_a_cancelled_caller_starts_nothing(monkeypatch):
    from fedrepro import cancellation

    task = _task(monkeypatch)
    token = cancellation.Token("the round")
    token.cancel()
    with cancellation.cancellable(token):
        with pytest.raises(client_app.ClientError, match=r"failed in round 7: Cancelled"):
            client_app.train(_msg(_cell()), _ctx())
    assert task.calls == []
