"""Client checkpoint writes off the critical path (issue 25, item 3).

On the in-process engine a client's state file is written by a background thread while the next
client trains (:mod:`fedrepro.fl.checkpoint`): the tensors written must be a snapshot taken when
the client saved them, every client file of a round must be complete before the server's round
checkpoint exists, and a failed background write must fail the cell naming the file.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

import helpers
from fedrepro.fl import checkpoint as ckpt
from fedrepro.fl.cell import run_cell
from fedrepro.fl.checkpoint import (
    WRITER,
    ClientWriteError,
    checkpoint_paths,
    client_checkpoint_writes,
    deferred_client_writes,
    load_state,
    save_state,
)
from fedrepro.papers.adafedseleckd.task import client_state_path

WRITER_THREAD = "fedrepro-checkpoint-writer"


# -- the writer itself ------------------------------------------------------------------------
def test_a_deferred_write_is_a_snapshot_independent_of_later_in_place_changes(tmp_path):
    """The writer is held busy; meanwhile the model is trained in place (an optimizer step, then
    a whole new state copied in): the file still holds the tensors as they were when saved --
    including a non-contiguous view and a bfloat16 tensor."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    extra = torch.arange(12.0).reshape(3, 4)
    state = {"weight": model.weight, "bias": model.bias, "view": extra.t(),
             "half": torch.linspace(0, 1, 5, dtype=torch.bfloat16)}
    expected = {k: v.detach().clone().contiguous() for k, v in state.items()}
    path = tmp_path / "clients" / "A" / "local_round_001.safetensors"
    gate = threading.Event()
    with deferred_client_writes():
        WRITER.submit(tmp_path / "gate", lambda: gate.wait(30))  # keep the writer busy
        with client_checkpoint_writes():
            save_state(path, state)
        assert not path.exists(), "the write was not deferred"
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        model(torch.ones(2, 4)).sum().backward()
        opt.step()  # in place
        with torch.no_grad():
            model.weight.copy_(torch.full_like(model.weight, 7.0))
        extra.add_(100.0)
        state["half"].mul_(0)
        gate.set()
    assert path.exists()  # joined on the way out
    got = load_state(path)
    assert set(got) == set(expected)
    for k in expected:
        assert torch.equal(got[k], expected[k]), k
        assert got[k].dtype == expected[k].dtype


def test_a_deferred_write_gives_the_same_bytes_as_a_synchronous_one(tmp_path):
    state = {"b": torch.randn(5, 3).t(), "a": torch.randn(7)}
    save_state(tmp_path / "sync.safetensors", state)
    with deferred_client_writes(), client_checkpoint_writes():
        save_state(tmp_path / "async.safetensors", state)
    assert (tmp_path / "sync.safetensors").read_bytes() == (tmp_path / "async.safetensors").read_bytes()


def test_writes_stay_synchronous_outside_a_joining_runner_or_a_client(tmp_path):
    """Only a client's save (client_checkpoint_writes) under a runner that joins them
    (deferred_client_writes) is deferred: a Ray actor or SuperNode, or the server, writes now."""
    gate = threading.Event()
    with client_checkpoint_writes():  # a client in a process whose server is elsewhere
        save_state(tmp_path / "actor.safetensors", {"x": torch.ones(2)})
        assert (tmp_path / "actor.safetensors").exists()
    with deferred_client_writes():
        WRITER.submit(tmp_path / "gate", lambda: gate.wait(30))
        save_state(tmp_path / "server.safetensors", {"x": torch.ones(2)})  # the server's thread
        assert (tmp_path / "server.safetensors").exists()
        gate.set()


def test_a_failed_background_write_is_raised_at_the_join_naming_the_file(tmp_path):
    blocker = tmp_path / "file"  # a file where a folder is needed: the write cannot succeed
    blocker.write_text("x")
    path = blocker / "local_round_001.safetensors"
    with pytest.raises(ClientWriteError) as err:
        with deferred_client_writes(), client_checkpoint_writes():
            save_state(path, {"x": torch.ones(2)})
    assert str(path) in str(err.value)
    assert WRITER.pending() == 0
    ckpt.join_client_writes()  # the error was reported once, not kept


# -- in a federated cell (in-process engine) --------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("client-writes")
    folders = helpers.make_partitions(root / "data", sizes=(6, 2, 3))
    backbone = helpers.make_backbone(root)
    return root, folders, backbone


def test_a_rounds_client_files_are_complete_before_its_server_checkpoint(world, monkeypatch):
    """Client writes are slowed down (each takes 0.3 s in the writer thread); at the moment the
    server writes round r's checkpoint every client's round-r file exists, holds the whole
    adapter and has no temporary beside it -- and the writes did happen in the background."""
    import fedrepro.fl.strategy as strategy

    root, folders, backbone = world
    cell = dict(helpers.make_cell(root, "AdaFedSelectKD", backbone, folders, rounds=2, out_name="order"),
                engine="inprocess", keep_round_checkpoints=True)
    real_write, real_save = ckpt.safetensors_save_atomic, strategy.save_state
    writers, checked = [], []

    def slow_write(tensors, path):
        if "/clients/" in str(path):
            writers.append(threading.current_thread().name)
            time.sleep(0.3)
        real_write(tensors, path)

    def server_save(path, state):
        r = int(Path(path).stem.rsplit("_", 1)[1])
        for c in cell["clients"]:
            f = client_state_path(cell, c, r)
            assert f.exists(), f"{f} missing when the server checkpoints round {r}"
            assert not list(f.parent.glob(f".{f.name}.*")), f"a temporary of {f} is left"
            got = load_state(f)
            assert set(got) == set(state) and all(got[k].shape == state[k].shape for k in got), f
        checked.append(r)
        real_save(path, state)

    monkeypatch.setattr(ckpt, "safetensors_save_atomic", slow_write)
    monkeypatch.setattr(strategy, "save_state", server_save)
    run_cell(cell, *helpers.cell_outputs(cell))
    assert checked == [1, 2]
    assert writers and set(writers) == {WRITER_THREAD}, writers
    assert checkpoint_paths(cell["out_dir"], 2)[0].exists()


def test_an_error_in_a_background_write_fails_the_cell_naming_the_file(world, monkeypatch):
    root, folders, backbone = world
    cell = dict(helpers.make_cell(root, "AdaFedSelectKD", backbone, folders, rounds=2, out_name="diskfull"),
                engine="inprocess", keep_round_checkpoints=True)
    bad = client_state_path(cell, "Committee", 1)
    helpers.disk_full_at(monkeypatch, ckpt, "safetensors_save_atomic", bad, path_arg=1)
    with pytest.raises(RuntimeError) as err:
        run_cell(cell, *helpers.cell_outputs(cell))
    assert str(bad) in str(err.value) and "No space left on device" in str(err.value)
    assert "round 1 failed" in str(err.value)
    # no round checkpoint claims a round whose client file is missing
    assert not checkpoint_paths(cell["out_dir"], 1)[1].exists()
    failure = json.loads((Path(cell["out_dir"]) / "checkpoints" / "failure.json").read_text())
    assert str(bad) in failure["reason"]
    assert not Path(helpers.cell_outputs(cell)[0]).exists()
    assert WRITER.pending() == 0
