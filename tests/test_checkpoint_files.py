"""The checkpoint folder's bookkeeping, without a cell (from the mutation run of
``fedrepro.fl.checkpoint``, docs/mutation.md): which round a resume starts from, which client file
it continues, which files a client may prune, who took part last, when checkpoints of another
config are discarded, and the config hash that decides it.  ``tests/test_federated.py`` and
``tests/test_workflow_kill.py`` check the same end to end (a killed run resumes to the same bytes);
these pin each rule on a hand-made folder."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedrepro.fl import checkpoint as ck
from fedrepro.io import InputError, write_json_atomic


def _round(out: Path, r: int, tensors: bool = True, clients=()) -> None:
    st, meta = ck.checkpoint_paths(out, r)
    if tensors:
        ck.save_state(st, {"w": torch.full((2,), float(r))})
    write_json_atomic(meta, {"round": r, "clients": [{"partition_id": p} for p in clients]})


def test_checkpoint_paths_and_the_last_complete_round(tmp_path):
    assert ck.checkpoint_paths(tmp_path, 7) == (tmp_path / "checkpoints" / "server_round_007.safetensors",
                                                tmp_path / "checkpoints" / "server_round_007.json")
    assert ck.latest_round(tmp_path) == 0  # no folder yet
    for r in (1, 2, 10):
        _round(tmp_path, r)
    _round(tmp_path, 11, tensors=False)  # its JSON without its tensors: not complete
    ck.save_state(ck.checkpoint_paths(tmp_path, 12)[0], {"w": torch.zeros(1)})  # tensors, no JSON yet
    assert ck.latest_round(tmp_path) == 10
    assert [e["round"] for e in ck.round_log(tmp_path, 2)] == [1, 2]


def test_timing_and_failure_files(tmp_path):
    assert ck.timing_path(tmp_path, 3) == tmp_path / "checkpoints" / "timing_round_003.json"
    write_json_atomic(ck.timing_path(tmp_path, 1), {"round": 1, "seconds": 2.0})
    write_json_atomic(ck.timing_path(tmp_path, 3), {"round": 3, "seconds": 4.0})
    assert ck.timing_log(tmp_path, 3) == [{"round": 1, "seconds": 2.0}, {"round": 3, "seconds": 4.0}]
    assert ck.timing_log(tmp_path, 2) == [{"round": 1, "seconds": 2.0}]
    assert ck.read_failure(tmp_path) is None
    write_json_atomic(tmp_path / "checkpoints" / "failure.json", {"round": 2, "reason": "client A: OOM"})
    assert json.loads(ck.read_failure(tmp_path)) == {"round": 2, "reason": "client A: OOM"}


def test_a_client_continues_from_its_newest_file_at_or_before_the_round(tmp_path):
    folder = tmp_path / "clients" / "A"
    assert ck.latest_client_round(folder, "local_round_", 5) == 0  # no folder
    folder.mkdir(parents=True)
    for r in (1, 3, 6):
        ck.save_state(folder / f"local_round_{r:03d}.safetensors", {"w": torch.zeros(1)})
    (folder / "local_round_004.safetensors.tmp").write_text("")  # not a finished file
    (folder / "other_round_005.safetensors").write_text("")  # another prefix
    (folder / "local_round_abc.safetensors").write_text("")
    assert ck.latest_client_round(folder, "local_round_", 5) == 3  # round 6 is a killed run's
    assert ck.latest_client_round(folder, "local_round_", 6) == 6
    assert ck.latest_client_round(folder, "local_round_", 3) == 3
    assert ck.latest_client_round(folder, "local_round_", 0) == 0
    assert ck.latest_client_round(folder, "other_round_", 9) == 5
    # what a client may prune: keep from the round it started from, or the older one a resume
    # from the last complete round would need
    for r in (1, 2, 3):
        _round(tmp_path, r)
    assert ck.client_files_needed_from(tmp_path, folder, "local_round_", 6) == 3
    assert ck.client_files_needed_from(tmp_path, folder, "local_round_", 1) == 1
    _round(tmp_path, 4, tensors=False)  # round 4's log still being written: resume from 3
    assert ck.client_files_needed_from(tmp_path / "nothing", folder, "local_round_", 6) == 0


def test_last_participation_reads_the_round_log(tmp_path):
    _round(tmp_path, 1, clients=(0, 2))
    _round(tmp_path, 2, clients=(1,))
    _round(tmp_path, 3, clients=(2,))
    assert ck.last_participation(tmp_path, ["A", "B", "C", "D"], 3) == {"A": 1, "B": 2, "C": 3, "D": 0}
    assert ck.last_participation(tmp_path, ["A", "B", "C", "D"], 2) == {"A": 1, "B": 2, "C": 1, "D": 0}


def test_the_config_hash_ignores_only_where_and_how_a_cell_runs():
    cell = {"seed": 1, "train": {"lr": 0.1}, "out_dir": "a", "round_timeout_s": 60, "engine": "inprocess"}
    h = ck.config_hash(cell)
    assert len(h) == 16 and int(h, 16) >= 0
    for k, v in (("out_dir", "b"), ("round_timeout_s", 5), ("engine", "simulation")):
        assert ck.config_hash({**cell, k: v}) == h, k
    assert ck.config_hash({**cell, "seed": 2}) != h
    assert ck.config_hash({**cell, "train": {"lr": 0.2}}) != h
    assert ck.config_hash(dict(reversed(list(cell.items())))) == h  # key order does not matter


def test_prepare_keeps_its_own_config_s_checkpoints_and_discards_another_s(tmp_path):
    cell = {"out_dir": str(tmp_path), "seed": 1}
    assert ck.prepare_checkpoints(cell) == 0
    stamp = json.loads((tmp_path / "checkpoints" / "cell_config.json").read_text())
    assert stamp == {"config_hash": ck.config_hash(cell), "cell": cell}
    _round(tmp_path, 1)
    _round(tmp_path, 2)
    ck.save_state(tmp_path / "clients" / "A" / "local_round_002.safetensors", {"w": torch.zeros(1)})
    write_json_atomic(tmp_path / "checkpoints" / "failure.json", {"reason": "x"})
    (tmp_path / ".discarded-checkpoints").mkdir()  # left by a run killed while discarding
    # the same config: resume after round 2, the client files stay, the old failure is cleared
    assert ck.prepare_checkpoints(dict(cell)) == 2
    assert (tmp_path / "clients" / "A" / "local_round_002.safetensors").exists()
    assert ck.read_failure(tmp_path) is None and not (tmp_path / ".discarded-checkpoints").exists()
    # another config: start afresh
    assert ck.prepare_checkpoints({**cell, "seed": 2}) == 0
    assert not (tmp_path / "clients").exists()
    assert not ck.checkpoint_paths(tmp_path, 1)[1].exists()


def test_another_config_s_checkpoints_go_even_without_client_files(tmp_path):
    ck.prepare_checkpoints({"out_dir": str(tmp_path), "seed": 1})
    _round(tmp_path, 1)  # a server-only method: no clients/ folder
    assert ck.prepare_checkpoints({"out_dir": str(tmp_path), "seed": 2}) == 0
    assert not ck.checkpoint_paths(tmp_path, 1)[0].exists()


def test_client_files_without_a_stamp_are_not_trusted(tmp_path):
    ck.save_state(tmp_path / "clients" / "A" / "local_round_001.safetensors", {"w": torch.zeros(1)})
    assert ck.prepare_checkpoints({"out_dir": str(tmp_path), "seed": 1}) == 0
    assert not (tmp_path / "clients").exists()


def test_discard_removes_checkpoints_first_and_leaves_no_trash(tmp_path):
    _round(tmp_path, 1)
    ck.save_state(tmp_path / "clients" / "A" / "local_round_001.safetensors", {"w": torch.zeros(1)})
    (tmp_path / "adapters.safetensors").write_text("the result")
    ck.discard_checkpoints(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapters.safetensors"]
    ck.discard_checkpoints(tmp_path)  # nothing to discard: no error
    # a run killed while it discarded left its trash: the next discard still works
    _round(tmp_path, 1)
    (tmp_path / ".discarded-checkpoints").mkdir()
    (tmp_path / ".discarded-checkpoints" / "server_round_001.json").write_text("{}")
    ck.discard_checkpoints(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapters.safetensors"]
    # killed between the two: checkpoints gone, clients still there -- a rerun starts afresh
    ck.save_state(tmp_path / "clients" / "A" / "local_round_001.safetensors", {"w": torch.zeros(1)})
    assert ck.latest_round(tmp_path) == 0


def test_load_state_sorts_and_names_a_missing_file(tmp_path):
    ck.save_state(tmp_path / "s.safetensors", OrderedDict([("b", torch.ones(1)), ("a", torch.zeros(1))]))
    assert list(ck.load_state(tmp_path / "s.safetensors")) == ["a", "b"]
    with pytest.raises(InputError, match="missing.safetensors: adapter state not found"):
        ck.load_state(tmp_path / "missing.safetensors")


def test_a_snapshot_is_a_detached_contiguous_copy():
    w = torch.arange(6.0, requires_grad=True)
    view = torch.arange(6.0).reshape(2, 3).t()
    snap = ck.snapshot({"w": w, "v": view})
    assert list(snap) == ["w", "v"] and not snap["w"].requires_grad and snap["v"].is_contiguous()
    with torch.no_grad():
        w.add_(1)
    view.mul_(0)
    assert snap["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and snap["v"].sum() == 15


def test_the_background_writer_names_the_first_failure_and_logs_the_rest(tmp_path, caplog):
    writer = ck.BackgroundWriter(max_pending=1, what="test file", name="fedrepro-test-writer")
    done = []
    writer.submit(tmp_path / "a", lambda: done.append("a"))

    def fail(msg):
        raise OSError(msg)

    writer.submit(tmp_path / "b", lambda: fail("disk full"))
    writer.submit(tmp_path / "c", lambda: fail("still full"))
    with pytest.raises(ck.ClientWriteError, match=r"/b: the background write of this test file failed: "
                                                  r"OSError: disk full"):
        writer.join()
    assert done == ["a"] and "/c failed too: OSError: still full" in caplog.text
    assert writer.pending() == 0
    writer.join()  # the errors were reported once
    assert any(t.name == "fedrepro-test-writer" for t in threading.enumerate())
