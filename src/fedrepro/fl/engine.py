"""An in-process Flower Grid: the same ServerApp strategy and ClientApp, without Ray.

Flower's simulation engine starts a Ray cluster per run (10-20 s and ~1.8 GB here, per cell).
A demo grid of dozens of small federated cells spends most of its time starting Ray, so the
runner offers a second *engine*: :class:`InProcessGrid` implements Flower's ``Grid`` interface
(the object a strategy talks to) by calling the ClientApp directly, one node after another, in
the calling process.  The strategy (our :class:`~fedrepro.fl.strategy.SortedCheckpointFedAvg`
or any Flower strategy), the messages, the ``ArrayRecord`` round trip and the ClientApp function
are Flower's own; only the transport and the scheduling differ.

Flower has no non-Ray simulation backend (``flwr.simulation`` only ships the Ray backend), hence
this hand-written class.  It is selected per cell with ``engine: inprocess`` (config key
``<paper>.engine``; both configs, chosen by ``bench/round_overhead.py``, docs/decisions.md);
``simulation`` (Ray) is the runner's default for a cell that names none, and the two give
byte-identical cells (tests/test_fedmcp_runner.py).

Client exceptions become error replies (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``), as in the
simulation engine, so the strategy's failure handling is exercised identically.  Each client runs
in a worker thread that the server waits for at most until the deadline of ``send_and_receive``'s
``timeout`` (the strategy passes the cell's ``round_timeout_s``): a client that hangs becomes an
error reply naming it and the limit, the clients after it in that round are not started, and the
round fails as it does on the other engines.  Python cannot kill a thread, so the stalled worker
is *cancelled* (:mod:`fedrepro.cancellation`): it stops at its next training step, checkpoint
write or failpoint sleep, which the grid waits for (up to ``cancellation.GRACE_S``) before the
round fails -- left running, it would re-seed and draw from the process's torch generator under
whatever the process runs next.  A worker stuck inside one call stays a daemon thread, logged,
and is abandoned when the job's process exits.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
import uuid
from collections.abc import Iterable, Iterator

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedrepro import cancellation
from fedrepro.fl import npy_threads

npy_threads.install()  # np.load in client threads on CPython 3.11.7 (gh-106905)


@contextlib.contextmanager
def server_identity(run_id: int = 0) -> Iterator[None]:
    """Set the process's Flower task identity as a SuperLink sets it for a ServerApp
    (``Message`` reads ``TaskIdentity.run_id``), restoring the previous one afterwards."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


class InProcessGrid(Grid):
    """``num_nodes`` virtual SuperNodes with node ids 1..n and ``partition-id`` 0..n-1."""

    def __init__(self, client_app, num_nodes: int, node_configs: list[dict] | None = None,
                 client_names: list[str] | None = None) -> None:
        self._app = client_app
        self._names = list(client_names or [])
        self._deadline: float | None = None
        self._limit: float | None = None
        self._run = Run.create_empty(0)
        configs = node_configs or [{} for _ in range(num_nodes)]
        self._contexts = {
            i + 1: Context(
                run_id=0,
                node_id=i + 1,
                node_config={"partition-id": i, "num-partitions": num_nodes, **configs[i]},
                state=RecordDict(),
                run_config={},
            )
            for i in range(num_nodes)
        }
        self._replies: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def _who(self, node_id: int) -> str:
        pid = int(self._contexts[node_id].node_config["partition-id"])
        name = self._names[pid] if pid < len(self._names) else None
        return f"client {name} (partition {pid})" if name else f"partition {pid} (node {node_id})"

    def _call(self, msg: Message) -> Message | None:
        """The ClientApp's reply to ``msg``, an error reply if it raised, or ``None`` if it did not
        finish before the deadline."""
        context = self._contexts[msg.metadata.dst_node_id]
        box: dict[str, Message] = {}
        # cancelled when the deadline passes: the ClientApp's bounded work (a child token) then
        # stops at its next safe point instead of training on beside what this process runs next
        token = cancellation.Token(f"{self._who(msg.metadata.dst_node_id)}'s message")

        def work() -> None:
            try:
                with cancellation.cancellable(token):
                    box["reply"] = self._app(msg, context)
            except Exception as exc:  # noqa: BLE001 - becomes an error reply, as in Flower
                reason = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
                box["reply"] = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=msg)

        worker = threading.Thread(target=work, name=f"client-node-{msg.metadata.dst_node_id}", daemon=True)
        worker.start()
        worker.join(None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0))
        if worker.is_alive():
            cancellation.give_up(token, worker)  # the cancelled work stops at its next safe point
            return None  # no reply within the deadline, whatever the cancelled work answered
        return box.get("reply")

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg_id = str(uuid.uuid4())
            # the id a SuperLink would assign (Flower's InMemoryGrid sets it the same way)
            msg.metadata.__dict__["_message_id"] = msg_id
            ids.append(msg_id)
            if self._deadline is not None and time.monotonic() >= self._deadline:
                continue  # the round's time is up: not started, no reply (as a lost node)
            reply = self._call(msg)
            if reply is None:
                limit = self._limit if self._limit is not None else 0.0
                reply = Message(Error(ErrorCode.MESSAGE_UNAVAILABLE, (
                    f"{self._who(msg.metadata.dst_node_id)} did not reply within the round's time "
                    f"limit of {limit:g} s (config key <paper>.round_timeout_s); the clients after "
                    "it in this round were not started")), reply_to=msg)
            self._replies[msg_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        self._limit = None if timeout is None else float(timeout)
        self._deadline = None if timeout is None else time.monotonic() + float(timeout)
        try:
            return self.pull_messages(self.push_messages(messages))
        finally:
            self._deadline = None
