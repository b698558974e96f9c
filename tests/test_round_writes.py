"""A round's server-side files off the critical path (issue 25, item 3).

Inside a run, the round's server-step check (float64 over every shared tensor), its tensors, its
timing and its log entry are written by one background thread while the next round trains
(:class:`fedrepro.fl.strategy.SortedCheckpointFedAvg`).  What must hold: the same bytes as the
synchronous path; round r's files complete (log entry last) before round r+1 writes anything and
before the run returns; a failed write stops the run naming the file, with no log entry claiming
the round.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

import helpers
import fedrepro.fl.strategy as strategy
from fedrepro.fl.cell import run_cell
from fedrepro.fl.checkpoint import checkpoint_paths, latest_round, timing_path

ROUND_WRITER = "fedrepro-round-writer"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("round-writes")
    folders = helpers.make_partitions(root / "data", sizes=(6, 2, 3))
    backbone = helpers.make_backbone(root)
    return root, folders, backbone


def _cell(world, name: str, method: str = "AdaFedSelectKD") -> dict:
    root, folders, backbone = world
    return dict(helpers.make_cell(root, method, backbone, folders, rounds=3, out_name=name),
                engine="inprocess", keep_round_checkpoints=True)


def _tree(folder: Path) -> dict[str, bytes]:
    # timing files hold measured seconds (provenance, not results): compared by their keys
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            rel = str(p.relative_to(folder))
            out[rel] = (sorted(json.loads(p.read_text())) if "timing_round" in rel
                        else p.read_bytes())
    return out


def test_round_files_are_written_in_the_background_in_order_and_joined(world, monkeypatch):
    """Round writes are slowed (0.4 s each, in the writer thread).  When round r+1 starts writing,
    round r's log entry exists (and was the last of its files); when run_cell returns, every round
    is on disk; the writes happened in the round-writer thread; the timing file says how long the
    background part took."""
    cell = _cell(world, "bg")
    real_save, real_json = strategy.save_state, strategy.write_json_atomic
    events: list[tuple[str, int, str]] = []

    def round_of(path) -> int:
        return int(Path(path).stem.rsplit("_", 1)[1])

    def slow_save(path, state):
        r = round_of(path)
        if r > 1:  # the previous round finished writing before this one writes anything
            assert latest_round(cell["out_dir"]) == r - 1, f"round {r - 1} incomplete at round {r}"
        events.append(("tensors", r, threading.current_thread().name))
        time.sleep(0.4)
        real_save(path, state)

    def json_spy(path, obj):
        name = Path(path).name
        if name.startswith(("server_round_", "timing_round_")):
            events.append((name.split("_round_")[0], round_of(path), threading.current_thread().name))
        real_json(path, obj)

    monkeypatch.setattr(strategy, "save_state", slow_save)
    monkeypatch.setattr(strategy, "write_json_atomic", json_spy)
    run_cell(cell, *helpers.cell_outputs(cell))
    assert [(kind, r) for kind, r, _ in events] == [
        (kind, r) for r in (1, 2, 3) for kind in ("tensors", "timing", "server")]
    assert {thread for _, _, thread in events} == {ROUND_WRITER}, events
    assert latest_round(cell["out_dir"]) == 3
    timing = json.loads(timing_path(cell["out_dir"], 2).read_text())
    assert timing["seconds_background_finish"] >= 0.4


def test_background_round_writes_give_the_same_bytes_as_synchronous_ones(world, monkeypatch):
    a = _cell(world, "async")
    run_cell(a, *helpers.cell_outputs(a))
    monkeypatch.setattr(strategy.SortedCheckpointFedAvg, "background_round_writes", False)
    b = _cell(world, "sync")
    run_cell(b, *helpers.cell_outputs(b))
    ta, tb = _tree(Path(a["out_dir"])), _tree(Path(b["out_dir"]))
    assert set(ta) == set(tb)
    different = [k for k in ta if ta[k] != tb[k] and not k.endswith(("cell_config.json", "provenance.json"))]
    assert not different, different
    assert json.loads(checkpoint_paths(a["out_dir"], 2)[1].read_text())["server_step"]["tensors"] > 0


def test_a_failed_background_round_write_stops_the_run_naming_the_file(world, monkeypatch):
    cell = _cell(world, "bgfail")
    bad = checkpoint_paths(cell["out_dir"], 2)[0]
    helpers.disk_full_at(monkeypatch, strategy, "save_state", bad)
    with pytest.raises(RuntimeError) as err:
        run_cell(cell, *helpers.cell_outputs(cell))
    assert str(bad) in str(err.value) and "No space left on device" in str(err.value)
    assert "round 2 failed" in str(err.value)
    assert latest_round(cell["out_dir"]) == 1  # no log entry claims round 2
    assert not checkpoint_paths(cell["out_dir"], 2)[1].exists()
    failure = json.loads((Path(cell["out_dir"]) / "checkpoints" / "failure.json").read_text())
    assert str(bad) in failure["reason"]
    assert not Path(helpers.cell_outputs(cell)[0]).exists()


def test_a_client_keeps_the_file_a_resume_from_the_last_complete_round_needs(tmp_path):
    """While round t+1 trains, round t's log entry may still be with the background writer: the
    last complete round on disk is t-1, and a client pruning its older files keeps its newest
    file at or before t-1 (FedSum's save_client_state; FedMCP's client round uses the same rule)."""
    import torch

    from fedrepro.fl.checkpoint import client_files_needed_from
    from fedrepro.papers.fedsum.task import client_state_path, save_client_state

    cell = {"out_dir": str(tmp_path / "cell"), "keep_round_checkpoints": False}
    folder = client_state_path(cell, "A", 1).parent

    def complete(r: int) -> None:  # round r's server checkpoint, as latest_round reads it
        tensors, meta = checkpoint_paths(cell["out_dir"], r)
        tensors.parent.mkdir(parents=True, exist_ok=True)
        tensors.write_bytes(b"x")
        meta.write_text("{}")

    def files() -> list[int]:
        return sorted(int(p.stem.rsplit("_", 1)[1]) for p in folder.glob("round_*.safetensors"))

    for r in (1, 2):
        save_client_state(cell, "A", r, {"w": torch.full((2,), float(r))})
    assert files() == [1, 2]  # no round complete yet: nothing pruned
    complete(1)
    save_client_state(cell, "A", 3, {"w": torch.ones(2)})  # round 2's entry still being written
    assert files() == [1, 2, 3]  # a resume from round 1 needs file 1
    assert client_files_needed_from(cell["out_dir"], folder, "round_", 2) == 1
    complete(2)
    complete(3)
    save_client_state(cell, "A", 4, {"w": torch.ones(2)})
    assert files() == [3, 4]  # round 3 complete: only the newest older file stays, as before
    assert client_files_needed_from(cell["out_dir"], folder, "round_", 3) == 3
    assert client_files_needed_from(tmp_path / "elsewhere", folder, "round_", 3) == 0  # keep all


def test_a_rounds_replies_are_freed_before_the_next_round_trains(world, monkeypatch):
    """Flower's round loop (``Strategy.start``) keeps the list of a round's replies in a local
    variable until the next round's replies replace it, i.e. through the whole next round: at
    BERT-base size SCAFFOLD's 4 replies are 3.5 GB (y_i and Δc_i).  Our grid hands the loop a
    ``RoundReplies`` list that aggregate_train empties: when round r+1's messages are made (round
    r's background write joined), no reply content of round r is alive; and once a round's files
    are written, the allocator's free pages are released (``release_free_memory``)."""
    import gc
    import weakref

    cell = _cell(world, "freed")
    base = strategy.SortedCheckpointFedAvg
    real_aggregate, real_configure = base.aggregate_train, base.configure_train
    replies_of: dict[int, list] = {}
    alive: dict[int, int] = {}

    def aggregate(self, server_round, replies):
        assert isinstance(replies, strategy.RoundReplies)
        replies_of[server_round] = [weakref.ref(m.content) for m in replies]
        out = real_aggregate(self, server_round, replies)
        assert replies == []  # handed over: the caller's list is empty
        return out

    def configure(self, server_round, arrays, config, grid):
        if server_round > 1:
            self.join_round_writes()
            gc.collect()
            alive[server_round] = sum(r() is not None for r in replies_of[server_round - 1])
        return real_configure(self, server_round, arrays, config, grid)

    trims: list[int] = []  # once per round, after its tensors: the freed pages back to the system
    monkeypatch.setattr(strategy, "release_free_memory", lambda: trims.append(
        sum(1 for r in (1, 2, 3) if checkpoint_paths(cell["out_dir"], r)[0].exists())) or True)
    monkeypatch.setattr(base, "aggregate_train", aggregate)
    monkeypatch.setattr(base, "configure_train", configure)
    run_cell(cell, *helpers.cell_outputs(cell))
    assert [len(v) for v in replies_of.values()] == [3, 3, 3]
    assert alive == {2: 0, 3: 0}
    assert trims == [1, 2, 3]
    for r in (1, 2, 3):  # how long each took (the allocator's lock is held meanwhile)
        assert json.loads(timing_path(cell["out_dir"], r).read_text())["seconds_trim"] >= 0


def test_only_the_round_loops_reply_list_is_emptied(tmp_path):
    """A plain list passed to aggregate_train by other code (the DP wrapper counts its replies
    after the inner aggregate_train) keeps its items; a ``RoundReplies`` is emptied."""
    import torch

    for kind, left in ((list, 2), (strategy.RoundReplies, 0)):
        s = strategy.SortedCheckpointFedAvg(out_dir=tmp_path / kind.__name__, round_offset=0,
                                            expected_clients=2)
        s._n_sampled = 2
        replies = kind([helpers.TrainReply(p, 1, {"w": torch.full((2,), float(p))}) for p in (0, 1)])
        arrays, _ = s.aggregate_train(1, replies)
        assert torch.equal(arrays.to_torch_state_dict()["w"], torch.full((2,), 0.5))
        assert len(replies) == left
