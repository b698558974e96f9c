"""FedSum's client round as a ClientApp calls it (``fedsum.task.client_train_round``), with the
cell's real model, data and files: what each round hands the method's update and what it keeps.

The step tests (``test_step_fedsum.py``) replace the cell's model and batches by fixed ones and
check that one call is one step of each method's total loss.  The mutation run of
``fedsum.task`` (issue 24) showed that nothing checked the round around that call: a round that
built its model or its batches from another cell, client or round, dropped the FedProx μ the
server sent, a FedProto round that reported another model's ROUGE, the client's files pruned one
round too early or never, or FedSum's initial portrait computed without the server's model all
passed every test.  Here the updates are wrapped to record what each round hands them:

* the model a round trains starts from the cell's fresh BERTSUM (FedProto: from the client's own
  file of its previous round); the server's state, the cell's seed, the client's name, the round
  and the cell's precision reach the update; FedProx's μ is the server's, not the config's;
* the batches are the client's documents, shuffled per (seed, client, round, epoch): every
  document once per epoch, in batches of ``train.batch_size``;
* FedProto keeps its model in its own file and reports the ROUGE of that model on the test set,
  with the selections it made; a class with no sentence counts 0;
* the client's files: a round reads its newest file of an *earlier* round; a save keeps the
  round's file and the one a resume needs, and removes the older ones (all kept under
  ``keep_round_checkpoints``);
* FedSum's phases: the initial portrait SP_i (eq. 6) of the client's documents under the
  server's model; a round's message rebuilt as the server sent it; errors name the client.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from fedrepro.fl.checkpoint import checkpoint_paths, load_state
from fedrepro.io import InputError
from fedrepro.papers.fedsum import task
from fedrepro.papers.fedsum.algorithm import FedSumBroadcast, initial_semantic_portrait
from fedrepro.papers.fedsum.model import epoch_batches, make_batches
from fedrepro.precision import Precision

import test_fedsum_runner as runner  # noqa: E402

# the runner tests' tiny BERTSUM and four clients of 2, 3, 4 and 7 documents (a module fixture)
world = runner.world

CLIENT = "client03"  # 4 documents: two batches of 2 per epoch
EPOCHS = 2


def _cell(world: Path, tmp_path: Path, method: str, **over) -> dict:
    cell = runner._cell(world, tmp_path, method, rounds=3, **over)
    cell["train"] = {**cell["train"], "local_epochs": EPOCHS}
    cell["baselines"] = {**cell["baselines"], "mu": 1.0}
    return cell


def _clone(state) -> OrderedDict:
    return OrderedDict((k, v.detach().clone()) for k, v in state.items())


def _equal(a, b) -> bool:
    """The same tensors under the same names (files come back with their keys sorted)."""
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def _perturbed(state, scale: float = 0.05, seed: int = 3) -> OrderedDict:
    g = torch.Generator().manual_seed(seed)
    return OrderedDict(
        (k, v + scale * torch.randn(v.shape, generator=g, dtype=v.dtype) if v.is_floating_point() else v)
        for k, v in state.items()
    )


def _fresh_state(cell) -> OrderedDict:
    return _clone(task.fresh_model(cell)[1].federated_state())


def _batch_key(batches) -> list[tuple]:
    """A batch list as comparable values: the document ids and the token ids of each batch."""
    return [(b.ids, b.input_ids.tolist()) for b in batches]


def _expected_batches(cell, client: str, round_index: int, epoch: int):
    """The contract of ``client_batches``: the client's documents shuffled by
    (cell seed, "fedsum-batches", client, round, epoch), ``train.batch_size`` a batch."""
    tok, _ = task.fresh_model(cell)
    docs = task.client_docs(cell, client)
    return epoch_batches(docs, int(cell["train"]["batch_size"]), int(cell["seed"]), "fedsum-batches",
                         client, round_index, pad_token_id=int(tok.pad_token_id))(epoch)


@pytest.fixture
def calls(monkeypatch):
    """Every ``baseline_local_update`` / ``fedsum_local_update`` call of the client round: the
    model's Ω when it was called, every epoch's batches, the hyperparameters and keywords, the
    upload it returned."""
    seen = []
    real_b, real_f = task.baseline_local_update, task.fedsum_local_update

    def record(kind, model, batches, hp, kw, run):
        entry = {"kind": kind, "model_in": _clone(model.federated_state()), "hp": hp, "kw": dict(kw),
                 "batches": [_batch_key(batches(e)) for e in range(1, hp.local_epochs + 1)]}
        entry["upload"] = run()
        seen.append(entry)
        return entry["upload"]

    def spy_b(model, method, batches, hp, **kw):
        return record("baseline", model, batches, hp, kw,
                      lambda: real_b(model, method, batches, hp, **kw))

    def spy_f(model, batches, bc, hp, variant="FedSum", **kw):
        return record("fedsum", model, batches, hp, {**kw, "broadcast": bc, "variant": variant},
                      lambda: real_f(model, batches, bc, hp, variant, **kw))

    monkeypatch.setattr(task, "baseline_local_update", spy_b)
    monkeypatch.setattr(task, "fedsum_local_update", spy_f)
    return seen


def _check_common(cell, entry, round_index: int, client: str = CLIENT) -> None:
    kw = entry["kw"]
    assert kw["client"] == client and kw["seed"] == cell["seed"] == 1
    assert kw["precision"] == Precision.from_cell(cell) and kw["precision"] is not None
    want = [_batch_key(_expected_batches(cell, client, round_index, e)) for e in range(1, EPOCHS + 1)]
    assert entry["batches"] == want
    # every document of the client once per epoch, two to a batch
    docs = sorted(d.id for d in task.client_docs(cell, client))
    for epoch in entry["batches"]:
        assert sorted(i for ids, _ in epoch for i in ids) == docs
        assert [len(ids) for ids, _ in epoch] == [2, 2]
    # the pin tells clients and rounds apart (else the check above proves little)
    other = [_batch_key(_expected_batches(cell, client, round_index + 1, e)) for e in range(1, EPOCHS + 1)]
    assert other != want


# ================================================================================================
# baselines
# ================================================================================================
@pytest.mark.parametrize("method", ["FedAvg", "FedProx", "SCAFFOLD"])
def test_a_baseline_round_trains_the_cells_model_on_the_clients_batches(world, tmp_path, calls, method):
    cell = _cell(world, tmp_path, method)
    server = _perturbed(task.initial_state(cell))
    records = {}
    if method == "FedProx":
        records["fedprox"] = ConfigRecord({"proximal-mu": 1.7})  # the server's μ, not the config's 1.0
    if method == "SCAFFOLD":
        records["scaffold-c"] = ArrayRecord(_perturbed(OrderedDict(
            (k, torch.zeros_like(v)) for k, v in server.items()), seed=9))
    sent, stats, reply = task.client_train_round(cell, CLIENT, 2, server, records)

    (entry,) = calls
    _check_common(cell, entry, 2)
    assert _equal(entry["model_in"], _fresh_state(cell))  # a fresh model of the cell ...
    assert _equal(entry["kw"]["global_state"], server)  # ... given the server's Ω
    assert entry["kw"]["t"] == 2
    assert entry["hp"] == task.baseline_hparams(cell)
    assert entry["kw"].get("mu") == (1.7 if method == "FedProx" else None)
    assert stats["num_examples"] == 4 and stats["local_steps"] == EPOCHS * 2
    assert _equal(sent, entry["upload"].federated_state)
    if method == "SCAFFOLD":
        assert entry["kw"]["client_control"] is None  # c_i = 0 before the client's first round
        assert _equal(entry["kw"]["server_control"], records["scaffold-c"].to_torch_state_dict())
        assert _equal(task.latest_client_state(cell, CLIENT, 3), entry["upload"].client_control)
        assert _equal(reply["scaffold-delta-c"].to_torch_state_dict(), entry["upload"].control_delta)
        # round 3 starts from the c_i round 2 kept
        task.client_train_round(cell, CLIENT, 3, server, records)
        assert _equal(calls[1]["kw"]["client_control"], entry["upload"].client_control)
    else:
        assert reply == {}


def test_fedprox_without_the_servers_mu_is_refused(world, tmp_path, calls):
    cell = _cell(world, tmp_path, "FedProx")
    with pytest.raises(InputError, match="FedProx client client03: no proximal-mu"):
        task.client_train_round(cell, CLIENT, 1, task.initial_state(cell), {})


def test_fedproto_keeps_its_model_and_reports_that_models_rouge(world, tmp_path, calls):
    cell = _cell(world, tmp_path, "FedProto")
    assert task.initial_state(cell) == OrderedDict()  # FedProto's models never leave the clients
    sent, stats, reply = task.client_train_round(cell, CLIENT, 1, {}, {})
    first = calls[0]
    _check_common(cell, first, 1)
    assert _equal(first["model_in"], _fresh_state(cell))
    assert first["kw"]["global_prototypes"] is None  # nothing received yet: no prototype term
    assert sent == OrderedDict()
    kept = task.latest_client_state(cell, CLIENT, 2)
    assert _equal(kept, first["upload"].federated_state)
    # the ROUGE and the selections of the kept model on the test set
    _, model = task.fresh_model(cell)
    model.load_federated_state(kept)
    ev = task.evaluate_model(cell, model)
    for k, v in ev["metrics"].items():
        if k != "n":
            assert stats[k] == pytest.approx(float(v), abs=0)
    assert "n" not in stats and stats["test_docs"] == ev["metrics"]["n"] == 6
    assert task.selections_from_record(reply["fedsum-eval"]) == ev["selected"]
    counts = first["upload"].class_counts
    assert stats["class_0_count"] == counts[0] > 0 and stats["class_1_count"] == counts[1] > 0
    assert set(reply) == {"fedproto-upload", "fedsum-eval"}

    # round 2: from the model round 1 kept, with the server's prototypes
    protos = {0: torch.full((runner.HIDDEN,), 0.25), 1: torch.full((runner.HIDDEN,), -0.5)}
    task.client_train_round(cell, CLIENT, 2, {}, {"fedproto-prototypes": task.prototypes_record(protos)})
    second = calls[1]
    assert _equal(second["model_in"], kept)
    got = second["kw"]["global_prototypes"]
    assert set(got) == {0, 1} and all(torch.equal(got[c], protos[c]) for c in (0, 1))


def test_fedproto_counts_a_class_without_sentences_as_zero(world, tmp_path, monkeypatch):
    cell = _cell(world, tmp_path, "FedProto")
    real = task.baseline_local_update

    def no_key_sentences(*a, **kw):
        up = real(*a, **kw)
        return dataclasses.replace(up, class_counts={0: up.class_counts[0]})

    monkeypatch.setattr(task, "baseline_local_update", no_key_sentences)
    _, stats, _ = task.client_train_round(cell, CLIENT, 1, {}, {})
    assert stats["class_1_count"] == 0 and stats["class_0_count"] > 0


# ================================================================================================
# the client's files
# ================================================================================================
def _state(value: float) -> OrderedDict:
    return OrderedDict([("w", torch.full((2,), value))])


def _server_round_done(cell, r: int) -> None:
    """The server's checkpoint of round r complete on disk (tensors, then the JSON)."""
    for p in checkpoint_paths(cell["out_dir"], r):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"{}")


def _rounds_on_disk(cell, client: str = CLIENT) -> list[int]:
    folder = task.client_state_path(cell, client, 1).parent
    return sorted(int(p.stem.split("_")[1]) for p in folder.glob("round_*.safetensors"))


def test_a_round_reads_the_clients_newest_file_of_an_earlier_round(tmp_path):
    cell = {"out_dir": str(tmp_path / "cell"), "keep_round_checkpoints": True}
    assert task.latest_client_state(cell, CLIENT, 5) is None  # never took part: no folder
    task.save_client_state(cell, CLIENT, 1, _state(1.0))
    task.save_client_state(cell, CLIENT, 3, _state(3.0))  # not sampled in round 2
    task.client_state_path(cell, CLIENT, 2).parent.joinpath("notes.safetensors").write_bytes(b"x")
    assert task.latest_client_state(cell, CLIENT, 1) is None  # folder there, nothing earlier
    assert torch.equal(task.latest_client_state(cell, CLIENT, 2)["w"], _state(1.0)["w"])
    # a rerun of round 3 (killed after its file was written) starts from round 1's, not its own
    assert torch.equal(task.latest_client_state(cell, CLIENT, 3)["w"], _state(1.0)["w"])
    assert torch.equal(task.latest_client_state(cell, CLIENT, 4)["w"], _state(3.0)["w"])
    assert task.latest_client_state(cell, "client01", 4) is None


@pytest.mark.parametrize("keep", [None, False, True])
def test_a_save_keeps_the_round_and_the_file_a_resume_needs(tmp_path, keep):
    cell = {"out_dir": str(tmp_path / "cell")}
    if keep is not None:
        cell["keep_round_checkpoints"] = keep
    task.save_client_state(cell, CLIENT, 1, _state(1.0))
    task.save_client_state(cell, CLIENT, 2, _state(2.0))
    # no server checkpoint complete yet: a resume would start from scratch -- keep every file
    assert _rounds_on_disk(cell) == [1, 2]
    _server_round_done(cell, 1)
    task.save_client_state(cell, CLIENT, 3, _state(3.0))
    # round 3 started from round 2's file, but the last complete server round is 1: a resume
    # from it gives the client its round-1 file, so both stay
    assert _rounds_on_disk(cell) == [1, 2, 3]
    _server_round_done(cell, 2)
    _server_round_done(cell, 3)
    task.save_client_state(cell, CLIENT, 4, _state(4.0))
    assert _rounds_on_disk(cell) == ([1, 2, 3, 4] if keep else [3, 4])
    assert torch.equal(load_state(task.client_state_path(cell, CLIENT, 4))["w"], _state(4.0)["w"])
    # another client's files are its own
    task.save_client_state(cell, "client01", 4, _state(9.0))
    assert _rounds_on_disk(cell) == ([1, 2, 3, 4] if keep else [3, 4])
    assert _rounds_on_disk(cell, "client01") == [4]


# ================================================================================================
# FedSum's phases
# ================================================================================================
def _broadcast(cell, round_index: int) -> tuple[dict, FedSumBroadcast]:
    _, model = task.fresh_model(cell)
    head = _perturbed(model.head.state_dict(), scale=0.3, seed=7)
    bc = FedSumBroadcast(
        round=round_index, total_rounds=3, global_significance=0.42, global_bias_level=1.5,
        global_class_prototypes={0: torch.full((runner.HIDDEN,), 0.1), 1: torch.full((runner.HIDDEN,), 0.2)},
        parameter_knowledge=[(0.35, head)],
    )
    return task.broadcast_records(bc, cell["method"], ["client01"]), bc


@pytest.mark.parametrize("method", ["FedSum", "FedSum-depth"])
def test_a_fedsum_round_hands_alg2_the_message_model_and_batches(world, tmp_path, calls, method):
    cell = _cell(world, tmp_path, method, fedsum={"lam": 0.7, "gamma": 0.2, "pdt_init": "portraits"})
    server = _perturbed(task.initial_state(cell))
    records, bc = _broadcast(cell, 2)
    sent, stats, reply = task.client_train_round(cell, CLIENT, 2, server, records)
    (entry,) = calls
    _check_common(cell, entry, 2)
    assert _equal(entry["model_in"], _fresh_state(cell))
    assert _equal(entry["kw"]["global_state"], server)
    assert entry["kw"]["variant"] == method
    assert entry["hp"] == task.fedsum_hparams(cell) and entry["hp"].lam == 0.7 and entry["hp"].gamma == 0.2
    got = entry["kw"]["broadcast"]
    assert (got.round, got.total_rounds, got.global_significance, got.global_bias_level) == (2, 3, 0.42, 1.5)
    ((zeta, head),) = got.parameter_knowledge
    assert zeta == 0.35 and _equal(head, OrderedDict((k, v.float()) for k, v in bc.parameter_knowledge[0][1].items()))
    up = entry["upload"]
    assert _equal(sent, up.federated_state)
    assert stats["num_examples"] == 4 == up.num_examples
    assert stats["mean_significance"] == up.mean_significance
    assert stats["mean_bias_level"] == up.mean_bias_level
    if up.semantic_portrait is not None:
        assert torch.equal(reply["fedsum-upload"].to_torch_state_dict()["portrait"], up.semantic_portrait.float())


def test_fedsum_messages_that_do_not_fit_name_the_client(world, tmp_path, calls):
    cell = _cell(world, tmp_path, "FedSum")
    server = task.initial_state(cell)
    records, _ = _broadcast(cell, 1)
    with pytest.raises(InputError, match="FedSum client client03: message for round 1 received in round 2"):
        task.client_train_round(cell, CLIENT, 2, server, records)
    del records["fedsum-heads"]
    with pytest.raises(InputError, match="FedSum client client03: no perturbed head of client01"):
        task.client_train_round(cell, CLIENT, 1, server, {**records, "fedsum-heads": ArrayRecord(OrderedDict())})
    with pytest.raises(InputError, match="FedSum client client03: the server sent no global model in round 1"):
        task.client_train_round(cell, CLIENT, 1, {}, _broadcast(cell, 1)[0])
    with pytest.raises(InputError, match="FedSum client client03: unknown phase ''"):
        task.client_train_round(cell, CLIENT, 1, server, {"fedsum": ConfigRecord({})})
    with pytest.raises(InputError, match="FedSum client client03: the server's message has no 'fedsum'"):
        task.client_train_round(cell, CLIENT, 1, server, {})
    assert calls == []


def test_the_initial_portrait_is_sp_i_of_the_clients_documents_under_the_servers_model(world, tmp_path):
    cell = _cell(world, tmp_path, "FedSum")
    server = _perturbed(task.initial_state(cell), scale=0.2)
    phase = {"fedsum": ConfigRecord({"phase": "initial-portrait"})}
    sent, stats, reply = task.client_train_round(cell, CLIENT, 1, server, phase)
    assert sent == OrderedDict() and set(reply) == {"fedsum-portrait"}
    assert len(task.client_docs(cell, CLIENT)) == 4 and stats == {"num_examples": 4}

    def portrait(client: str, state) -> torch.Tensor:
        tok, model = task.fresh_model(cell)
        model.load_federated_state(state)
        batches = make_batches(task.client_docs(cell, client), int(cell["train"]["batch_size"]),
                               int(tok.pad_token_id))
        return initial_semantic_portrait(model, batches, task.fedsum_hparams(cell).prediction_threshold)

    got = reply["fedsum-portrait"].to_torch_state_dict()["portrait"]
    assert torch.equal(got, portrait(CLIENT, server).float())
    assert not torch.equal(got, portrait(CLIENT, task.initial_state(cell)).float())  # the server's model counts
    assert not torch.equal(got, portrait("client04", server).float())  # and the client's documents
    with pytest.raises(InputError, match="FedSum client client03: no initial model"):
        task.client_train_round(cell, CLIENT, 1, {}, phase)


# ================================================================================================
# small pieces of the round
# ================================================================================================
def test_client_batches_are_the_clients_documents_per_round_and_epoch(world, tmp_path):
    cell = _cell(world, tmp_path, "FedAvg")
    for client, n in (("client03", 4), ("client04", 7)):
        batches = task.client_batches(cell, client, 2)
        for epoch in (1, 2):
            got = batches(epoch)
            assert _batch_key(got) == _batch_key(_expected_batches(cell, client, 2, epoch))
            assert [len(b) for b in got] == [2] * (n // 2) + [1] * (n % 2)
            assert all(b.input_ids.device.type == "cpu" for b in got)
        assert _batch_key(batches(1)) != _batch_key(batches(2))
    assert _batch_key(task.client_batches(cell, "client04", 2)(1)) != _batch_key(
        task.client_batches(cell, "client04", 3)(1))


def test_the_initial_state_is_the_cells_fresh_model(world, tmp_path):
    cell = _cell(world, tmp_path, "FedAvg")
    state = task.initial_state(cell)
    assert _equal(state, _fresh_state(cell))
    other = task.initial_state({**cell, "seed": 2})
    assert list(other) == list(state) and not _equal(other, state)  # the head is drawn from the seed


def test_the_hyperparameters_come_from_the_cells_blocks(world, tmp_path):
    cell = _cell(world, tmp_path, "FedSum", fedsum={"lam": 0.7, "gamma": 0.2, "prediction_threshold": 0.4,
                                                     "pdt_init": "random"})
    hp = task.fedsum_hparams(cell)
    assert (hp.lam, hp.gamma, hp.prediction_threshold, hp.pdt_init) == (0.7, 0.2, 0.4, "random")
    assert (hp.lr, hp.local_epochs) == (0.005, EPOCHS)
    bp = task.baseline_hparams({**cell, "baselines": {**cell["baselines"], "mu": 0.25}})
    assert bp.mu == 0.25 and (bp.lr, bp.local_epochs) == (0.005, EPOCHS)


def test_test_selections_cross_the_wire_unchanged():
    selected = {"doc-b": [3, 0, 11], "doc-a": [], "doc-c": [2]}
    rec = task.selections_record(selected)
    assert dict(rec) == {"doc-ids": ["doc-a", "doc-b", "doc-c"], "selected": ["", "3,0,11", "2"]}
    assert task.selections_from_record(rec) == selected
    with pytest.raises(InputError, match="doc-ids and selected differ in length"):
        task.selections_from_record({"doc-ids": ["a", "b"], "selected": ["1"]})
