"""Flower ClientApp (message API, flwr 1.41): one client of a federated cell, any paper
(the paper's task module, :mod:`fedrepro.fl.tasks`, does the work).

The client learns which partition it is from its node config (``partition-id``, set by the
simulation engine, or by ``--node-config`` for a deployed SuperNode), and reads only that
partition's folder.  A deployed SuperNode may also pass ``data-dir`` in its node config, which
then overrides the folder named in the cell.
"""

from __future__ import annotations

import json

import torch  # noqa: F401 - Flower's ArrayRecord.to_torch_state_dict needs torch imported
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedrepro.devices import cpu_state
from fedrepro.fl import failpoints
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


def _named(client: str, partition_id: int, round_index: int, work):
    try:
        failpoints.hit("client_train", client)
        return work()
    except Exception as exc:
        raise ClientError(
            f"client {client} (partition {partition_id}) failed in round {round_index}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    cell, partition_id, client = _client_view(config, context)
    round_index = int(config["server-round"]) + int(config["round-offset"])
    server_state = msg.content["arrays"].to_torch_state_dict()
    task = task_for(cell)
    extra = {k: v for k, v in msg.content.items() if k not in ("arrays", "config")}
    kwargs = {"records": extra} if getattr(task, "WANTS_RECORDS", False) else {}
    out = _named(client, partition_id, round_index,
                 lambda: task.client_train_round(cell, client, round_index, server_state, **kwargs))
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
    metrics = task.client_evaluate(cell, client, round_index, msg.content["arrays"].to_torch_state_dict())
    return Message(content=RecordDict({"metrics": metric_record(metrics, partition_id)}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which client (partition) this node is, for deterministic sampling."""
    pid = int(context.node_config["partition-id"])
    return Message(content=RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=msg)
