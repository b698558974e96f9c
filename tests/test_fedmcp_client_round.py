"""FedMCP's client round as a ClientApp calls it (``fedmcp.task.client_train_round``), over two
rounds: what the round starts from and what it keeps.

The step tests (``test_step_fedmcp.py``) check that one call of ``local_update`` is one step of
each method's total loss; the mutation run of ``fedmcp.task`` (issue 24) showed that nothing
checked the round around it -- a round 2 that started from fresh private tensors, from round 1's
file under the wrong keys, without MOON's previous model, or with another client's batch order
passed every test.  Here ``local_update`` is wrapped to record what each round hands it:

* round 1 starts from the fresh model of (seed, client); round 2 from the private tensors round 1
  saved (``private.*``) -- not from fresh ones -- and, for MOON, with round 1's sent tensors as
  the previous model; every federated round gets the server state it was given;
* the file a round writes holds exactly what it returns as sent (``sent.*``) and the private
  tensors after training; the metrics count the client's examples and steps;
* the batches are a seeded shuffle per (seed, client, round, epoch) in fixed-size batches, each
  example once; a cell's seed and the client name both change the private tensors' start.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedrepro.fl.checkpoint import load_state
from fedrepro.io import write_jsonl_atomic
from fedrepro.papers.fedmcp import task

import test_step_fedmcp as step  # noqa: E402

# the step tests' tiny RoBERTa (a module fixture, requested by name) and GLUE-schema records
backbone_dir = step.backbone_dir
_records = step._records

TASKS = ("SST-2", "MRPC")


def _cell(tmp_path: Path, backbone_dir: Path, method: str, seed: int = 1, n_train: int = 6) -> dict:
    folders = {}
    for name in TASKS:
        for split, k in (("train", n_train), ("val", 2), ("test", 3)):
            write_jsonl_atomic(tmp_path / "data" / name / f"{split}.jsonl", _records(name, split, k))
        folders[name] = str(tmp_path / "data" / name)
    return {
        "paper": "fedmcp", "scale": "demo", "backbone": "roberta-base",
        "backbone_dir": str(backbone_dir), "method": method, "seed": seed,
        "clients": list(TASKS), "eval_clients": list(TASKS), "client_data": folders,
        "max_length": 32, "model": {"bottleneck": 4},
        "train": {"rounds": 2, "epochs": 2, "lr": 0.05, "batch_size": 4, "gamma": 0.3, "mu": 1.7},
        "threads": 1, "eval_batch_size": 8, "eval_every_round": False, "engine": "inprocess",
        "round_timeout_s": 300, "out_dir": str(tmp_path / "cell"), "keep_round_checkpoints": True,
    }


def _clone(state) -> OrderedDict:
    return OrderedDict((k, v.detach().clone()) for k, v in state.items())


def _equal(a, b) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def calls(monkeypatch):
    """Every ``local_update`` call of ``client_train_round``: the model's private tensors when it
    was called and after it returned, the server state and MOON's previous model it was given."""
    seen = []
    real = task.local_update

    def spy(model, spec, batches, hp, server_state, prev, precision=None):
        entry = {"private_in": _clone(task.private_state(model)),
                 "server": None if server_state is None else _clone(server_state),
                 "prev": None if prev is None else _clone(prev), "batches": [batches(0), batches(1)],
                 "torch_seed": torch.initial_seed()}
        stats = real(model, spec, batches, hp, server_state, prev, precision=precision)
        entry["stats"] = stats
        entry["private_out"] = _clone(task.private_state(model))
        entry["shared_out"] = _clone(model.shared_state())
        seen.append(entry)
        return stats

    monkeypatch.setattr(task, "local_update", spy)
    return seen


def _moved(state, seed: int) -> OrderedDict:
    g = torch.Generator().manual_seed(seed)
    return OrderedDict((k, v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype))
                       for k, v in state.items())


@pytest.mark.parametrize("method", ["FedMCP", "FedRep", "MOON", "Local"])
def test_round_two_starts_from_what_round_one_kept(method, backbone_dir, tmp_path, calls):
    cell = _cell(tmp_path, backbone_dir, method)
    client = "MRPC"
    federated = task.is_federated(cell)
    server1 = task.initial_state(cell) if federated else OrderedDict()
    server2 = _moved(server1, 7)

    fresh = task.private_state(task.build_client_model(cell, client))
    sent1, out1 = task.client_train_round(cell, client, 1, server1)
    sent2, out2 = task.client_train_round(cell, client, 2, server2)
    r1, r2 = calls[:2]

    # round 1: the fresh model of (seed, client); round 2: the private tensors round 1 kept
    assert _equal(r1["private_in"], fresh)
    assert _equal(r2["private_in"], r1["private_out"])
    assert fresh and not _equal(r2["private_in"], fresh)  # round 1 moved them: the two differ
    # the server state each round was given (Local: none)
    if federated:
        assert _equal(r1["server"], server1) and _equal(r2["server"], server2)
    else:
        assert r1["server"] is None and r2["server"] is None
    # MOON's previous model: none in round 1, round 1's sent tensors in round 2
    assert r1["prev"] is None
    if method == "MOON":
        assert r2["prev"] is not None and _equal(r2["prev"], sent1)
    else:
        assert r2["prev"] is None

    for r, sent, rec in ((1, sent1, r1), (2, sent2, r2)):
        assert _equal(sent, rec["shared_out"])  # what is sent: the shared part after training
        saved = load_state(task.client_state_path(cell, client, r))
        assert _equal({k[len("sent."):]: v for k, v in saved.items() if k.startswith("sent.")}, sent)
        assert _equal({k[len("private."):]: v for k, v in saved.items() if k.startswith("private.")},
                      rec["private_out"])
    train = task.client_examples(cell, client, "train")
    n = len(train)
    # FedRep: head_epochs (1) on the head, then the epochs on the body; the others: the epochs
    epochs = cell["train"]["epochs"] + (1 if method == "FedRep" else 0)
    steps = epochs * math.ceil(n / cell["train"]["batch_size"])
    for out, rec in ((out1, r1), (out2, r2)):
        assert out["num_examples"] == n == 6
        assert out["n_steps"] == steps == 2 * epochs
        assert math.isfinite(out["train_loss"])
        parts = {k for k in rec["stats"] if k.startswith("L_")}  # the loss parts, reported
        assert {k for k in out if k.startswith("L_")} == parts
        assert all(out[k] == float(rec["stats"][k]) for k in parts)
    assert method != "FedMCP" or len({k for k in out1 if k.startswith("L_")}) >= 2
    # each epoch's batches: the seeded shuffle of this client's examples for (seed, client, round, epoch)
    pad = task.model_pad_id(cell)
    for r, rec in ((1, r1), (2, r2)):
        want = task.epoch_batches(train, cell["train"]["batch_size"], cell["seed"], client, r, pad)
        for epoch, got in enumerate(rec["batches"]):
            expected = want(epoch)
            assert len(got) == len(expected) and all(
                torch.equal(g[k], w[k]) for g, w in zip(got, expected) for k in w)
        first0, first1 = rec["batches"][0][0], rec["batches"][1][0]  # another epoch, another order
        assert not (torch.equal(first0["labels"], first1["labels"])
                    and torch.equal(first0["input_ids"], first1["input_ids"]))

    # a rerun of round 2 (a job killed after the round's file was written) starts again from
    # round 1's file, not from its own, and gives the same bits
    sent2b, _ = task.client_train_round(cell, client, 2, server2)
    assert _equal(calls[-1]["private_in"], r1["private_out"])
    assert _equal(sent2b, sent2)


def test_a_client_file_loads_into_a_fresh_model(backbone_dir, tmp_path, calls):
    """``load_client_state``: a saved file's ``sent.*`` and ``private.*`` tensors restore the model
    that wrote it (FedMatch: its patch is both sent and private)."""
    for method in ("FedMCP", "FedMatch"):
        cell = _cell(tmp_path / method, backbone_dir, method)
        task.client_train_round(cell, "SST-2", 1, task.initial_state(cell))
        model = task.build_client_model(cell, "SST-2")
        task.load_client_state(model, load_state(task.client_state_path(cell, "SST-2", 1)), "test")
        assert _equal(task.private_state(model), calls[-1]["private_out"])
        assert _equal(model.shared_state(), calls[-1]["shared_out"])
        with pytest.raises(Exception, match="private tensors do not match"):
            task.load_private_state(model, {"nope": torch.zeros(1)}, "where")


def test_the_batches_are_a_seeded_shuffle_per_seed_client_round_and_epoch():
    examples = tuple((tuple(range(1, 2 + i % 4)), i % 3) for i in range(10))
    make = task.epoch_batches

    def order(batches):
        return [tuple(r) for b in batches for r in b["input_ids"].tolist()], [
            y for b in batches for y in b["labels"].tolist()]

    one = make(examples, 4, 1, "a", 1, 0)
    first = one(0)
    assert [len(b["labels"]) for b in first] == [4, 4, 2]
    assert order(first) == order(make(examples, 4, 1, "a", 1, 0)(0))  # same seed: same batches
    ids, labels = order(first)
    assert sorted(zip([tuple(x for x in r if x) for r in ids], labels)) == sorted(
        (tuple(x), y) for x, y in examples)  # every example once
    others = [make(examples, 4, 2, "a", 1, 0)(0), make(examples, 4, 1, "b", 1, 0)(0),
              make(examples, 4, 1, "a", 2, 0)(0), one(1)]
    for other in others:  # seed, client, round and epoch each change the order
        assert order(other) != order(first)
    b = first[-1]
    assert b["input_ids"].dtype == b["attention_mask"].dtype == b["labels"].dtype == torch.long
    lengths = [len(x) for x in (examples[i][0] for i in range(10))]
    assert set(b["attention_mask"].flatten().tolist()) <= {0, 1}
    assert sorted(b["attention_mask"].sum(1).tolist()) == sorted(
        (b["input_ids"] != 0).sum(1).tolist())
    assert max(lengths) >= b["input_ids"].shape[1]


def test_the_seed_streams_are_the_documented_ones(backbone_dir, tmp_path, calls):
    """The exact streams (not only "different inputs give different streams"): the batch order of
    (seed, client, round, epoch, "fedmcp-batches"), the private tensors' initialisation from
    (seed, "fedmcp-init", client) and the round's torch stream (seed, client, round, "fedmcp-torch")."""
    from fedrepro.data.seq2seq import derive_seed
    from fedrepro.papers.fedmcp.methods import build_model

    examples = tuple((tuple(range(1, 2 + i % 4)), i % 3) for i in range(10))
    for seed, client, r, e in ((1, "a", 1, 0), (3, "MRPC", 2, 1)):
        got = task.epoch_batches(examples, 4, seed, client, r, 0)(e)
        g = torch.Generator().manual_seed(derive_seed(seed, client, r, e, "fedmcp-batches"))
        order = torch.randperm(len(examples), generator=g).tolist()
        assert [y for b in got for y in b["labels"].tolist()] == [examples[i][1] for i in order]
    cell = _cell(tmp_path, backbone_dir, "FedRep", seed=5)
    model = task.build_client_model(cell, "MRPC")
    base = task._encoder(str(cell["backbone_dir"]), 5)
    import copy

    torch.manual_seed(derive_seed(5, "fedmcp-init", "MRPC"))
    want = build_model("FedRep", copy.deepcopy(base), task.num_labels("MRPC"), cell["model"])
    assert _equal(task.private_state(model), task.private_state(want))
    server = task.initial_state(cell)
    task.client_train_round(cell, "MRPC", 2, server)
    assert calls[-1]["torch_seed"] == derive_seed(5, "MRPC", 2, "fedmcp-torch")


def test_private_tensors_start_from_the_cell_seed_and_the_client(backbone_dir, tmp_path):
    cell = _cell(tmp_path, backbone_dir, "FedRep")
    base = task.private_state(task.build_client_model(cell, "MRPC"))
    assert _equal(base, task.private_state(task.build_client_model(cell, "MRPC")))
    assert not _equal(base, task.private_state(task.build_client_model({**cell, "seed": 2}, "MRPC")))
    other = task.private_state(task.build_client_model(cell, "SST-2"))
    # another client: another head (SST-2 has as many labels as MRPC, so only the seed differs)
    assert set(other) == set(base) and not _equal(other, base)
    # private: every trained tensor the server's average does not replace (FedMCP: the private
    # adapter and the head; not the frozen backbone, not the shared adapter)
    mcp = task.build_client_model({**cell, "method": "FedMCP"}, "MRPC")
    received = {id(p) for p in mcp._received_parameters().values()}
    trained = {n for n, p in mcp.named_parameters() if p.requires_grad}
    kept = {n for n, p in mcp.named_parameters() if p.requires_grad and id(p) not in received}
    assert received and kept and set(task.private_state(mcp)) == kept != trained
    # the cell's model settings reach the model: the adapter's bottleneck is model.bottleneck
    model = task.build_client_model({**cell, "method": "FedMCP", "model": {"bottleneck": 3}}, "MRPC")
    shapes = {tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad and "adapter" in n}
    assert any(3 in s for s in shapes) and not any(4 in s for s in shapes)


def test_a_round_that_evaluates_reports_the_trained_models_test_accuracy(backbone_dir, tmp_path, calls):
    """``eval_every_round`` (the default): the client's test accuracy of the model it trained
    (``task.accuracy`` of the model its file restores, at ``eval_batch_size``)."""
    cell = {**_cell(tmp_path, backbone_dir, "FedRep"), "eval_batch_size": 2}
    del cell["eval_every_round"]
    _, out = task.client_train_round(cell, "MRPC", 1, task.initial_state(cell))
    model = task.build_client_model(cell, "MRPC")
    task.load_client_state(model, load_state(task.client_state_path(cell, "MRPC", 1)), "test")
    want, _ = task.accuracy(model, task.client_examples(cell, "MRPC", "test"), 2, task.model_pad_id(cell))
    assert out["test_accuracy"] == want
    _, quiet = task.client_train_round({**cell, "eval_every_round": False}, "SST-2", 1,
                                       task.initial_state(cell))
    assert "test_accuracy" not in quiet


@pytest.mark.parametrize("keep", [False, True, None])
def test_old_client_files_go_once_no_resume_can_need_them(keep, backbone_dir, tmp_path):
    """``keep_round_checkpoints: false``: a round that started from round t-1's file deletes the
    client's older files -- but only those no resume can start from: a resume starts at the last
    complete server checkpoint (``checkpoints/server_round_XXX.{safetensors,json}``), which can lag
    a round behind while the server writes in the background (``fl.checkpoint.client_files_needed_from``)."""
    from fedrepro.fl.checkpoint import checkpoint_paths

    cell = {**_cell(tmp_path, backbone_dir, "FedRep"), "keep_round_checkpoints": keep}
    if keep is None:  # the key absent: the default, false
        del cell["keep_round_checkpoints"]
    keep = bool(keep)
    state = task.initial_state(cell)

    def server_done(r: int) -> None:  # the server's round-r checkpoint, complete on disk
        for p in checkpoint_paths(cell["out_dir"], r):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("{}")

    def files() -> list[int]:
        return [r for r in range(1, 6) if task.client_state_path(cell, "MRPC", r).exists()]

    task.client_train_round(cell, "MRPC", 1, state)
    server_done(1)
    task.client_train_round(cell, "MRPC", 2, state)   # started from round 1: nothing older
    assert files() == [1, 2]
    server_done(2)
    task.client_train_round(cell, "MRPC", 3, state)   # started from 2, server done with 2
    assert files() == ([1, 2, 3] if keep else [2, 3])
    # round 3's server checkpoint still being written: a resume would start from 2 -> keep 2
    task.client_train_round(cell, "MRPC", 4, state)
    assert files() == ([1, 2, 3, 4] if keep else [2, 3, 4])
    server_done(3)
    server_done(4)
    task.client_train_round(cell, "MRPC", 5, state)
    assert files() == ([1, 2, 3, 4, 5] if keep else [4, 5])
