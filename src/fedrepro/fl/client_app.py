"""Flower ClientApp (message API, flwr 1.41): one client of a federated cell, any paper
(the paper's task module, :mod:`fedrepro.fl.tasks`, does the work).

The client learns which partition it is from its node config (``partition-id``, set by the
simulation engine, or by ``--node-config`` for a deployed SuperNode), and reads only that
partition's folder.  A deployed SuperNode may also pass ``data-dir`` in its node config, which
then overrides the folder named in the cell.
"""

from __future__ import annotations

import json
import threading

import torch  # noqa: F401 - Flower's ArrayRecord.to_torch_state_dict needs torch imported
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedrepro import cancellation
from fedrepro.devices import cpu_state
from fedrepro.fl import failpoints
from fedrepro.fl.checkpoint import client_checkpoint_writes
from fedrepro.fl.strategy import metric_record
from fedrepro.fl.tasks import task_for

app = ClientApp()


def _client_view(config, context: Context) -> tuple[dict, int, str]:
    """The cell as this node sees it: its partition id, its client, and only its own data folder
    (the node's ``data-dir`` where the deployment gives one)."""
    cell = json.loads(str(config["cell"]))
    partition_id = int(context.node_config["partition-id"])
    client = cell["clients"][partition_id]
    if "data-dir" in context.node_config:
        cell["client_data"] = {client: str(context.node_config["data-dir"])}
    else:  # keep only this client's own folder in view
        cell["client_data"] = {client: cell["client_data"][client]}
    return cell, partition_id, client


class ClientError(RuntimeError):
    """A client's failure, naming the client, its partition and the round (the server's log and
    ``checkpoints/failure.json`` then say which client failed and why, on every engine)."""


def _bounded(cell: dict, client: str, partition_id: int, round_index: int, what: str, work):
    """``work()`` run for this client, bounded by the cell's ``round_timeout_s`` (issue 17, item 4).

    The work runs in a daemon thread that the ClientApp waits for at most the round's time limit:
    a client that stalls then answers with an error instead of holding its worker forever.  This
    matters on Flower's simulation engine, whose runtime waits for every running ClientApp before
    ``run_simulation`` returns, even after the ServerApp has given up on the round; the stalled
    thread dies with the Ray actor (or the ClientApp process) when the run is torn down.  On
    giving up, the call also *cancels* the worker (:mod:`fedrepro.cancellation`): it stops at its
    next training step, checkpoint write or failpoint sleep -- the call waits for that up to
    :data:`~fedrepro.cancellation.GRACE_S` -- so it cannot re-seed or draw from the torch
    generator of what this process runs next (the in-process engine, the test suite).  Any
    exception is re-raised as a :class:`ClientError` naming the client.  The failpoint
    ``client_<what>`` (:mod:`fedrepro.fl.failpoints`) is hit first."""
    limit = float(cell.get("round_timeout_s", 3600))
    box: dict = {}
    what_round = f"client {client}'s {what} of round {round_index}"
    # a child of the caller's token: the in-process grid cancels it when its deadline passes first
    token = cancellation.Token(what_round, parent=cancellation.current())

    def run() -> None:
        try:
            with cancellation.cancellable(token):
                cancellation.check()  # the caller was given up on already: start nothing
                failpoints.hit(f"client_{what}", client)
                box["out"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["exc"] = exc

    worker = threading.Thread(target=run, name=f"fedrepro-client-{client}", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        # stop the worker at its next safe point (fedrepro.cancellation): left running, it would
        # re-seed and draw from the process's torch generator under whatever this process runs next
        cancellation.give_up(token, worker, min(cancellation.GRACE_S, limit))
        raise ClientError(
            f"client {client} (partition {partition_id}) did not finish its {what} of round "
            f"{round_index} within the round's time limit of {limit:g} s (config key "
            "<paper>.round_timeout_s)"
        )
    if "exc" in box:
        exc = box["exc"]
        raise ClientError(
            f"client {client} (partition {partition_id}) failed in round {round_index}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return box["out"]


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    cell, partition_id, client = _client_view(config, context)
    round_index = int(config["server-round"]) + int(config["round-offset"])
    server_state = msg.content["arrays"].to_torch_state_dict()
    task = task_for(cell)
    extra = {k: v for k, v in msg.content.items() if k not in ("arrays", "config")}
    kwargs = {"records": extra} if getattr(task, "WANTS_RECORDS", False) else {}

    def work():
        # the task's save_state calls are client checkpoint writes: in the background where the
        # runner joins them in this process (in-process engine), else synchronous (Ray actors and
        # deployed SuperNodes are other processes: their files are written before the reply)
        with client_checkpoint_writes():
            return task.client_train_round(cell, client, round_index, server_state, **kwargs)

    out = _bounded(cell, client, partition_id, round_index, "train", work)
    state, stats = out[0], out[1]
    reply_records = out[2] if len(out) > 2 else {}  # a task may send more than its tensors
    content = RecordDict(
        {"arrays": ArrayRecord(cpu_state(state)), "metrics": metric_record(stats, partition_id), **reply_records}
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the server's model on this client's own data, for tasks that define
    ``client_evaluate(cell, client, round, server_state) -> {metric: value}`` (FedSUMM: validation
    perplexity and ROUGE-L of the global model after every round, Fig. 3 and 5a)."""
    config = msg.content["config"]
    cell, partition_id, client = _client_view(config, context)
    task = task_for(cell)
    if not hasattr(task, "client_evaluate"):
        raise RuntimeError(f"paper {cell.get('paper')!r} defines no client-side evaluation")
    round_index = int(config["server-round"]) + int(config["round-offset"])
    state = msg.content["arrays"].to_torch_state_dict()
    metrics = _bounded(cell, client, partition_id, round_index, "evaluate",
                       lambda: task.client_evaluate(cell, client, round_index, state))
    return Message(content=RecordDict({"metrics": metric_record(metrics, partition_id)}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which client (partition) this node is, for deterministic sampling."""
    pid = int(context.node_config["partition-id"])
    return Message(content=RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=msg)
