"""FedSum's server procedures as Flower strategies (message API, flwr 1.41).

Every class subclasses the runner's :class:`~fedrepro.fl.strategy.SortedCheckpointFedAvg`, which
sorts replies by partition id (bit-identical reruns), stops the run on a failed client, samples
the round's participants from a seeded generator (``clients_per_round``) and checkpoints every
round for resume.  Flower's own strategies aggregate in arrival order and keep no checkpoints,
so using them directly would lose those properties; where Flower has the method (FedProx) we
*compose* with it instead (:class:`FedSumFedProx` puts Flower's ``FedProx`` before our class in
the MRO, so Flower's ``configure_train`` injects ``proximal-mu`` and then hands over to ours).

==============  ==================================================================================
strategy        server step per round (what arrives -> what is sent next)
==============  ==================================================================================
FedAvg          Flower's weighted average of the replies' Ω_i (n_i/n)
FedProx         the same (Flower's ``FedProx`` + μ to the clients)
SCAFFOLD        x += η_g·mean(y_i − x); c += (1/N)·Σ Δc_i; c goes out with x every round
FedNova         x −= τ_eff·Σ p_i (x − y_i)/τ_i with the clients' step counts τ_i
FedProto        C̄^(j) = Σ_i |D_ij|/N_j · C_i^(j); no model is aggregated or sent
FedDC           daisy chaining: aggregate every b rounds, else a seeded derangement of the returned
                models every d rounds -- each client's next message carries the model it holds
FedSum*         Alg. 1: Ω_g, ε̄, Q̄ (eq. 2) and P̄_c weighted by n_i/n; PDT from the portraits;
                perturbed heads for next round's PK_i; initial portraits before round 1
==============  ==================================================================================

Participants (``fedsum.client_selection``, per method): ``uniform`` -- the runner's seeded draw --
or ``proportional`` -- k clients drawn without replacement with probability ∝ n_i (the authors'
code does this for FedSum and FedProx, ``style="FedProx"``; uniform for the other baselines),
from the same (cell seed, round) generator (:meth:`FedSumRunnerStrategy.sample_partitions`).

After every round the strategy evaluates the model of the round (:func:`fedsum_task.evaluate_state`
for the global-model methods; the clients' own reports for FedProto) and writes it with the
round's downlink/uplink record contents into the round log; server state beyond Ω (c, C̄, the
daisy chain, FedSum's ε̄/Q̄/P̄/PDT/heads) is saved per round and reloaded on resume.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import random
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp.strategy import FedProx

from fedrepro.papers.fedsum.algorithm import (
    FedSumServerState,
    FedSumUpload,
    fedsum_broadcast,
    fedsum_server_round,
    get_variant,
    new_server_state,
)
from fedrepro.papers.fedsum.baselines import (
    DaisyChain,
    fednova_aggregate,
    fedproto_aggregate,
    scaffold_server_update,
    zeros_like_state,
)
from fedrepro.papers.fedsum import task as task
from fedrepro.fl.strategy import SortedCheckpointFedAvg, payload_bytes
from fedrepro.fl.tensors import RecordTensors
from fedrepro.io import InputError, torch_save_atomic, write_json_atomic

log = logging.getLogger(__name__)


def _describe(records: Mapping) -> dict:
    """JSON description of message records: ArrayRecords as {key: shape}, the rest as values."""
    out = {}
    for name, rec in records.items():
        if isinstance(rec, ArrayRecord):
            out[name] = {k: list(a.shape) for k, a in rec.items()}
        else:
            out[name] = {
                k: (
                    list(v)
                    if isinstance(v, list) and len(v) <= 64
                    else v
                    if not isinstance(v, list)
                    else f"<{len(v)} values>"
                )
                for k, v in rec.items()
            }
    return out


def size_proportional_sample(ids: list[int], sizes: list[int], k: int, rng: random.Random) -> list[int]:
    """``k`` of ``ids`` drawn one after another without replacement, each draw picking a remaining
    id with probability size / (sum of the remaining sizes) -- the law of NumPy's
    ``choice(ids, k, replace=False, p=sizes/sum(sizes))`` (the FedSum authors' selection; the
    inclusion probability of a client is then not k·n_i/n but its successive-sampling value).
    Returns the ids in the order drawn.  Integer sizes: the cumulative sums are exact."""
    if len(ids) != len(sizes):
        raise ValueError("one size per id")
    if any(int(n) < 0 for n in sizes):
        raise InputError(f"negative client size in {sizes}")
    if sum(1 for n in sizes if int(n) > 0) < k:
        raise InputError(
            f"size-proportional selection of {k} clients: only {sum(1 for n in sizes if n > 0)} "
            f"clients hold data (fedsum.client_selection)"
        )
    remaining = list(zip(ids, (int(n) for n in sizes)))
    chosen = []
    for _ in range(k):
        cumulative = list(itertools.accumulate(n for _, n in remaining))
        j = bisect.bisect_right(cumulative, rng.random() * cumulative[-1])
        j = min(j, len(remaining) - 1)  # rng.random() * total rounding up to the total
        while remaining[j][1] == 0:  # never a client without data (only reachable by rounding)
            j -= 1
        chosen.append(remaining.pop(j)[0])
    return chosen


class FedSumRunnerStrategy(SortedCheckpointFedAvg):
    """The common part: the current broadcast x, per-round evaluation, record accounting and
    the server-state file.  Aggregation is Flower's FedAvg (the FedAvg method)."""

    def __init__(self, cell: Mapping, **kwargs):
        super().__init__(**kwargs)
        self.cell = dict(cell)
        self.clients = list(cell["clients"])
        self.total_rounds = int(cell["train"]["rounds"])
        self._current: OrderedDict | None = None  # x^(t-1): the arrays broadcast this round
        self._evaluated: OrderedDict | None = None  # the model the round is evaluated with
        self._sent: dict[str, dict] = {}
        self._extra_down_bytes = 0
        self._sizes: dict[str, int] | None = None  # n_i per client (proportional selection)
        if self.round_offset > 0:
            self.load_server_state(self.round_offset)

    # -- participants ----------------------------------------------------------------------
    def selection_rule(self) -> str:
        """``uniform`` (the runner's draw) or ``proportional`` (to n_i); a cell without the key
        (made before it existed) samples uniformly."""
        rule = self.cell.get("client_selection", "uniform")
        if rule not in ("uniform", "proportional"):
            raise InputError(
                f"FedSum cell: client_selection must be 'uniform' or 'proportional', got {rule!r} "
                f"(config key fedsum.client_selection)"
            )
        return rule

    def sample_partitions(self, absolute_round: int, partition_ids: list[int]) -> list[int]:
        """The round's participants (``fedsum.client_selection``).  ``uniform``: the runner's
        seeded draw without replacement.  ``proportional`` (the authors' FedSum and FedProx):
        k clients drawn one after another without replacement, each with probability
        n_i / Σ n_j over the clients not yet drawn -- the law of the authors'
        ``np.random.choice(K, k, replace=False, p=n_i/n)`` --, from the same generator seeded by
        (cell seed, round): the same draw on every engine and every rerun."""
        if self.selection_rule() == "uniform":
            return super().sample_partitions(absolute_round, partition_ids)
        k = max(int(len(partition_ids) * self.fraction_train), self.min_train_nodes)
        if k >= len(partition_ids):
            return sorted(partition_ids)
        if self._sizes is None:
            self._sizes = task.client_sizes(self.cell)
        ids = sorted(partition_ids)
        weights = [self._sizes[self.client_name(p)] for p in ids]
        rng = random.Random(f"{self.seed}/sample/{absolute_round}")
        return sorted(size_proportional_sample(ids, weights, k, rng))

    def client_name(self, partition_id: int) -> str:
        try:
            return self.clients[int(partition_id)]
        except IndexError:
            raise InputError(
                f"partition id {partition_id} outside the cell's {len(self.clients)} clients"
            ) from None

    # -- broadcast -------------------------------------------------------------------------
    def configure_train(self, server_round, arrays, config, grid):
        self._current = arrays.to_torch_state_dict()
        self._sent, self._extra_down_bytes = {}, 0
        return super().configure_train(server_round, arrays, config, grid)

    def client_records(self, absolute_round: int, partition_id: int) -> dict:
        records = self.records_for(absolute_round, self.client_name(partition_id))
        self._sent[self.client_name(partition_id)] = _describe(records)
        self._extra_down_bytes += sum(
            payload_bytes(r)
            for k, r in records.items()
            if isinstance(r, ArrayRecord) and k != "arrays"
        )
        return records

    def records_for(self, absolute_round: int, client: str) -> dict:
        """Extra records of ``client``'s train message (none for FedAvg)."""
        return {}

    # -- aggregation -----------------------------------------------------------------------
    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        arrays, metrics = super().aggregate_arrays(absolute_round, replies)
        self._evaluated = arrays.to_torch_state_dict()
        return arrays, metrics

    def reply_metrics(self, replies: list[Message]):
        """The replies' MetricRecords averaged by ``num-examples`` (Flower's aggregator)."""
        return self.train_metrics_aggr_fn([m.content for m in replies], self.weighted_by_key)

    @staticmethod
    def reply_state(m: Message) -> OrderedDict:
        return m.content["arrays"].to_torch_state_dict()

    # -- round log -------------------------------------------------------------------------
    def evaluate(self, absolute_round: int, replies: list[Message]) -> dict:
        """The round's test record: the server's model (global methods)."""
        ev = task.evaluate_state(self.cell, self._evaluated)
        return {
            "evaluated": "global",
            "metrics": ev["metrics"],
            "selected": {"global": ev["selected"]},
        }

    def server_extras(self, absolute_round: int, replies: list[Message]) -> dict:
        return {}

    def round_extras(self, absolute_round: int, replies: list[Message]) -> dict:
        uplink = {}
        up_bytes = 0
        for m in replies:
            extra = {k: v for k, v in m.content.items() if k not in ("arrays", "metrics")}
            uplink[self.client_name(int(m.content["metrics"]["partition-id"]))] = _describe(extra)
            up_bytes += sum(payload_bytes(r) for r in extra.values() if isinstance(r, ArrayRecord))
        return {
            "downlink_records": self._sent,
            "uplink_records": uplink,
            "extra_bytes_down": self._extra_down_bytes,
            "extra_bytes_up": up_bytes,
            "server": self.server_extras(absolute_round, replies),
            "evaluation": self.evaluate(absolute_round, replies),
        }

    # -- server state ----------------------------------------------------------------------
    def state_path(self, absolute_round: int) -> Path:
        return self.out_dir / "checkpoints" / f"server_state_round_{absolute_round:03d}.pt"

    def state_dict(self) -> dict | None:
        """Server state beyond Ω to persist (None: nothing)."""
        return None

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def save_server_state(self, absolute_round: int) -> None:
        state = self.state_dict()
        if state is None:
            return
        torch_save_atomic(state, self.state_path(absolute_round))
        old = self.state_path(absolute_round - 2)
        if (
            absolute_round > 2
            and old.exists()
            and not self.cell.get("keep_round_checkpoints", False)
        ):
            old.unlink()

    def load_server_state(self, absolute_round: int) -> None:
        if self.state_dict() is None:  # nothing beyond Ω (FedAvg, FedProx, FedNova)
            return
        path = self.state_path(absolute_round)
        if not path.exists():
            raise InputError(
                f"{path}: server state of round {absolute_round} is missing; delete "
                f"{self.out_dir / 'checkpoints'} to restart this cell"
            )
        self.load_state_dict(torch.load(path, weights_only=True))


class FedSumFedProx(FedProx, FedSumRunnerStrategy):
    """FedProx (Li et al. 2020): Flower's ``FedProx`` (writes ``proximal-mu`` into the round's
    config) composed with our runner strategy (sorted, checkpointed, seeded sampling); FedAvg on
    the server.  μ also travels in the client's ``fedprox`` ConfigRecord, since the shared
    ClientApp hands a task the message's extra records but not its ``config``."""

    def __init__(self, cell: Mapping, proximal_mu: float, **kwargs):
        FedSumRunnerStrategy.__init__(self, cell, **kwargs)
        self.proximal_mu = float(proximal_mu)

    def records_for(self, absolute_round: int, client: str) -> dict:
        return {"fedprox": ConfigRecord({"proximal-mu": self.proximal_mu})}


class FedSumScaffold(FedSumRunnerStrategy):
    """SCAFFOLD (Karimireddy et al. 2020, Alg. 1, option II): the server control variate c goes out
    with x; the clients reply y_i and Δc_i; x += η_g·mean(y_i − x), c += (1/N)·Σ Δc_i."""

    def __init__(self, cell: Mapping, **kwargs):
        self.control: OrderedDict | None = None
        self._control_record: tuple[int, ArrayRecord] | None = None
        super().__init__(cell, **kwargs)
        self.global_lr = float((cell.get("baselines") or {}).get("scaffold_global_lr", 1.0))

    def records_for(self, absolute_round: int, client: str) -> dict:
        if self.control is None:
            self.control = zeros_like_state(self._current)  # c = 0 before round 1
        # one record for every client of the round (not a 0.44 GB copy each at BERT-base size)
        if self._control_record is None or self._control_record[0] != absolute_round:
            self._control_record = (absolute_round, ArrayRecord(self.control))
        return {"scaffold-c": self._control_record[1]}

    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        missing = [
            int(m.content["metrics"]["partition-id"])
            for m in replies
            if "scaffold-delta-c" not in m.content
        ]
        if missing:
            raise InputError(f"SCAFFOLD round {absolute_round}: clients {missing} sent no Δc_i")
        # y_i and Δc_i read tensor by tensor from the replies (the update is per tensor): never
        # every client's decoded model and Δc at once -- 2 x 0.44 GB per client at BERT-base size,
        # beside the replies themselves (the CPU rehearsal's SCAFFOLD cell was killed at 24 GB)
        x, c = scaffold_server_update(
            self._current,
            self.control,
            [RecordTensors(m.content["arrays"]) for m in replies],
            [RecordTensors(m.content["scaffold-delta-c"]) for m in replies],
            num_clients_total=len(self.clients),
            global_lr=self.global_lr,
        )
        self.control = c
        self._evaluated = x
        return ArrayRecord(x), self.reply_metrics(replies)

    def server_extras(self, absolute_round, replies):
        norm = float(torch.sqrt(sum((v.double() ** 2).sum() for v in self.control.values())))
        return {"control_norm": norm}

    def state_dict(self):
        return {"control": self.control}

    def load_state_dict(self, state):
        self.control = OrderedDict(state["control"]) if state["control"] is not None else None


class FedSumFedNova(FedSumRunnerStrategy):
    """FedNova (Wang et al. 2020) with vanilla SGD: normalised averaging by the clients' local
    step counts (``local-steps``)."""

    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        steps = [int(m.content["metrics"]["local-steps"]) for m in replies]
        ns = [int(m.content["metrics"]["num-examples"]) for m in replies]
        # per tensor: the replies read tensor by tensor (RecordTensors), as SCAFFOLD's
        x = fednova_aggregate(self._current, [RecordTensors(m.content["arrays"]) for m in replies], steps, ns)
        self._evaluated = x
        return ArrayRecord(x), self.reply_metrics(replies)

    def server_extras(self, absolute_round, replies):
        return {"local_steps": [int(m.content["metrics"]["local-steps"]) for m in replies]}


class FedSumFedProto(FedSumRunnerStrategy):
    """FedProto (Tan et al. 2022): only prototypes cross the wire; the server averages them per
    class weighted by the class sizes; models stay personal (evaluated on the clients)."""

    def __init__(self, cell: Mapping, **kwargs):
        self.global_prototypes: dict = {0: None, 1: None}
        super().__init__(cell, **kwargs)

    def records_for(self, absolute_round: int, client: str) -> dict:
        return {"fedproto-prototypes": task.prototypes_record(self.global_prototypes)}

    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        protos, counts = [], []
        for m in replies:
            if "fedproto-upload" not in m.content:
                raise InputError(f"FedProto round {absolute_round}: a client sent no prototypes")
            protos.append(task.prototypes_from_record(m.content["fedproto-upload"]))
            met = m.content["metrics"]
            counts.append({xi: int(met[f"class-{xi}-count"]) for xi in (0, 1)})
        self.global_prototypes = fedproto_aggregate(protos, counts)
        self._evaluated = None
        return ArrayRecord(OrderedDict()), self.reply_metrics(replies)

    def evaluate(self, absolute_round, replies):
        per_client, selected = {}, {}
        for m in replies:
            client = self.client_name(int(m.content["metrics"]["partition-id"]))
            met = m.content["metrics"]
            per_client[client] = {k: float(met[k.replace("_", "-")]) for k in task.METRICS}
            per_client[client]["n"] = int(met["test-docs"])
            selected[client] = task.selections_from_record(m.content["fedsum-eval"])
        return task.personalised_evaluation(per_client, selected)

    def state_dict(self):
        return {"global_prototypes": dict(self.global_prototypes)}

    def load_state_dict(self, state):
        self.global_prototypes = dict(state["global_prototypes"])


class FedSumDaisyChain(FedSumRunnerStrategy):
    """FedDC = federated daisy-chaining (Kamp et al. 2021): each participant receives the model it
    holds (``arrays`` of its own message); after round t the server aggregates (t mod b = 0) or
    permutes the returned models over the participants (t mod d = 0).  The round is evaluated
    with the n_i/n average of the returned models (the aggregate at aggregation rounds)."""

    def __init__(self, cell: Mapping, **kwargs):
        b = cell.get("baselines") or {}
        self.daisy = DaisyChain(
            int(b.get("daisy_period", 1)), int(b.get("aggregation_period", 2)), int(cell["seed"])
        )
        self._action: dict = {}
        super().__init__(cell, **kwargs)

    def records_for(self, absolute_round: int, client: str) -> dict:
        if self.daisy.global_state is None:
            self.daisy.global_state = OrderedDict(self._current)  # Ω⁰
        return {"arrays": ArrayRecord(OrderedDict(self.daisy.model_for(client)))}

    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        states = {
            self.client_name(int(m.content["metrics"]["partition-id"])): self.reply_state(m)
            for m in replies
        }
        ns = {
            self.client_name(int(m.content["metrics"]["partition-id"])): int(
                m.content["metrics"]["num-examples"]
            )
            for m in replies
        }
        action, average = self.daisy.server_round(absolute_round, states, ns)
        self._action = {"action": action}
        if action == "permute":
            self._action["permutation"] = self.daisy.permutation(absolute_round, sorted(states))
        self._evaluated = average
        return ArrayRecord(average), self.reply_metrics(replies)

    def server_extras(self, absolute_round, replies):
        return {"feddc": dict(self._action), "holding": sorted(self.daisy.held)}

    def state_dict(self):
        return self.daisy.to_dict()

    def load_state_dict(self, state):
        self.daisy = DaisyChain.from_dict(state)


class FedSumServer(FedSumRunnerStrategy):
    """FedSum Algorithm 1 (and its Table 4 variants): per-client broadcast of ε̄, Q̄, P̄_c and PK_i;
    :func:`fedsum_server_round` on the uploads; before round 1 (``pdt_init: portraits``) every
    client's initial semantic portrait, asked for with a ``phase: initial-portrait`` message."""

    def __init__(self, cell: Mapping, **kwargs):
        self.hp = task.fedsum_hparams(cell)
        self.variant = get_variant(cell["method"])
        self.state: FedSumServerState = new_server_state(
            cell["clients"], self.hp.pdt_init, int(cell["seed"])
        )
        self._portrait_pass: dict = {}
        super().__init__(cell, **kwargs)

    def configure_train(self, server_round, arrays, config, grid):
        absolute = server_round + self.round_offset
        if (
            absolute == 1
            and self.variant.parameter_knowledge
            and self.hp.pdt_init == "portraits"
            and not self.state.pdt.portraits
        ):
            self._initial_portraits(server_round, arrays, config, grid)
        return super().configure_train(server_round, arrays, config, grid)

    def _initial_portraits(self, server_round, arrays, config, grid) -> None:
        """PDT init "according to the initial semantic portrait provided by clients" (§4.2)."""
        node_of = self.partitions(grid)
        cfg = ConfigRecord({**dict(config.items()), "server-round": server_round})
        messages = [
            Message(
                content=RecordDict(
                    {
                        "arrays": arrays,
                        "config": cfg,
                        "fedsum": ConfigRecord({"phase": "initial-portrait"}),
                    }
                ),
                message_type=MessageType.TRAIN,
                dst_node_id=node_of[pid],
            )
            for pid in sorted(node_of)
        ]
        replies = list(grid.send_and_receive(messages, timeout=self.timeout))
        errors = [m.error.reason for m in replies if m.has_error()]
        if errors or len(replies) < len(messages):
            reason = "; ".join(errors) or self.missing_replies(
                {node_of[pid]: pid for pid in sorted(node_of)}, replies
            )
            write_json_atomic(
                self.out_dir / "checkpoints" / "failure.json", {"round": 0, "reason": reason}
            )
            raise RuntimeError(f"FedSum initial portraits failed: {reason}")
        for m in sorted(replies, key=lambda m: int(m.content["metrics"]["partition-id"])):
            client = self.client_name(int(m.content["metrics"]["partition-id"]))
            self.state.pdt.update(
                client, m.content["fedsum-portrait"].to_torch_state_dict()["portrait"]
            )
        self._portrait_pass = {
            "clients": sorted(self.state.pdt.portraits),
            "bytes_down": payload_bytes(arrays) * len(messages),
            "bytes_up": sum(payload_bytes(m.content["fedsum-portrait"]) for m in replies),
        }

    def records_for(self, absolute_round: int, client: str) -> dict:
        if self.state.round + 1 != absolute_round:
            raise InputError(
                f"FedSum server state is at round {self.state.round}, asked for round {absolute_round}"
            )
        bc = fedsum_broadcast(self.state, client, self.total_rounds, self.variant)
        senders = (
            [p for p in sorted(self.state.perturbed_heads) if p != client]
            if bc.parameter_knowledge
            else []
        )
        return task.broadcast_records(bc, self.variant.name, senders)

    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        uploads = {}
        for m in replies:
            met = m.content["metrics"]
            client = self.client_name(int(met["partition-id"]))
            protos = portrait = None
            if self.variant.needs_prototypes:
                if "fedsum-upload" not in m.content:
                    raise InputError(
                        f"FedSum round {absolute_round}: {client} sent no prototypes/portrait"
                    )
                rec = m.content["fedsum-upload"]
                protos = task.prototypes_from_record(rec)
                portrait = rec.to_torch_state_dict()["portrait"]
            uploads[client] = FedSumUpload(
                num_examples=int(met["num-examples"]),
                federated_state=self.reply_state(m),
                mean_significance=float(met["mean-significance"]),
                mean_bias_level=float(met["mean-bias-level"]),
                class_prototypes=protos,
                semantic_portrait=portrait,
                stats={},
            )
        omega = fedsum_server_round(self.state, uploads, self.hp, int(self.cell["seed"]))
        self._evaluated = omega
        return ArrayRecord(omega), self.reply_metrics(replies)

    def server_extras(self, absolute_round, replies):
        out = {
            "global_significance": self.state.global_significance,
            "global_bias_level": self.state.global_bias_level,
            "perturbed_heads": sorted(self.state.perturbed_heads),
            "portraits": sorted(self.state.pdt.portraits),
        }
        known = sorted(self.state.pdt.portraits)
        if len(known) > 1:
            out["pdt"] = {i: {p: self.state.pdt.weight(i, p) for p in known} for i in known}
        if self._portrait_pass:
            out["initial_portraits"], self._portrait_pass = self._portrait_pass, {}
        return out

    def state_dict(self):
        return self.state.to_dict()

    def load_state_dict(self, state):
        self.state = FedSumServerState.from_dict(state)


def make_strategy(cell: Mapping, **kwargs) -> SortedCheckpointFedAvg:
    """The strategy of ``cell['method']`` (``fedrepro.fl.server_app.run_server`` calls this)."""
    method = task.check_method(cell["method"])
    if method in task.VARIANTS:
        return FedSumServer(cell, **kwargs)
    if method == "FedAvg":
        return FedSumRunnerStrategy(cell, **kwargs)
    if method == "FedProx":
        return FedSumFedProx(
            cell, proximal_mu=float((cell.get("baselines") or {}).get("mu", 1.0)), **kwargs
        )
    if method == "SCAFFOLD":
        return FedSumScaffold(cell, **kwargs)
    if method == "FedNova":
        return FedSumFedNova(cell, **kwargs)
    if method == "FedProto":
        return FedSumFedProto(cell, **kwargs)
    if method == "FedDC":
        return FedSumDaisyChain(cell, **kwargs)
    raise InputError(f"{method} has no server strategy (it runs without Flower)")
