"""Row jobs resume cell by cell (fedrepro.fl.rows), a killed writer's temporaries are swept
(fedrepro.io), and a killed checkpoint cleanup leaves a cell a rerun can finish
(fedrepro.fl.checkpoint.discard_checkpoints) -- issue 17, without models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedrepro.fl import rows
from fedrepro.fl.checkpoint import (
    checkpoint_paths,
    discard_checkpoints,
    latest_round,
    prepare_checkpoints,
)
from fedrepro.io import write_json_atomic, write_text_atomic


def _cells(tmp_path: Path, n: int = 3, lr: float = 0.1) -> list[dict]:
    return [{"paper": "t", "method": f"m{i}", "train": {"rounds": 1, "lr": lr},
             "out_dir": str(tmp_path / f"m{i}")} for i in range(n)]


class Counting:
    """Stages that write their files and count their calls; ``die_at``: raise (a kill) there."""

    def __init__(self, die_at: tuple[str, int] | None = None):
        self.calls: list[tuple[str, str]] = []
        self.die_at = die_at

    def stage(self, name: str, files: tuple[str, ...]):
        def fn(cell):
            self.calls.append((name, Path(cell["out_dir"]).name))
            if self.die_at == (name, len(self.calls)):
                raise KeyboardInterrupt("killed")
            for f in files:
                write_text_atomic(Path(cell["out_dir"]) / f, f"{f} of {cell['method']} lr {cell['train']['lr']}\n")
        return files, fn

    def stages(self):
        return [self.stage("train", ("a.bin", "log.json")), self.stage("eval", ("scores.json",))]


def _snakemake_cleanup(cells):
    """What Snakemake does before it reruns a job: delete every declared output."""
    for c in cells:
        for f in ("a.bin", "log.json", "scores.json"):
            (Path(c["out_dir"]) / f).unlink(missing_ok=True)


def test_a_rerun_row_restores_finished_stages_and_runs_the_rest_once(tmp_path):
    cells = _cells(tmp_path)
    first = Counting(die_at=("eval", 4))  # m0 trained+evaluated, m1 trained, killed in m1's eval
    with pytest.raises(KeyboardInterrupt):
        rows.run_row(cells, first.stages())
    assert first.calls == [("train", "m0"), ("eval", "m0"), ("train", "m1"), ("eval", "m1")]
    _snakemake_cleanup(cells)
    again = Counting()
    rows.run_row(cells, again.stages())
    assert again.calls == [("eval", "m1"), ("train", "m2"), ("eval", "m2")]
    clean = _cells(tmp_path / "clean")
    rows.run_row(clean, Counting().stages())
    for c, ref in zip(cells, clean):
        for f in ("a.bin", "log.json", "scores.json"):
            assert (Path(c["out_dir"]) / f).read_bytes() == (Path(ref["out_dir"]) / f).read_bytes()
        # a finished row leaves only its outputs
        assert sorted(p.name for p in Path(c["out_dir"]).iterdir()) == ["a.bin", "log.json", "scores.json"]


def test_a_receipt_of_another_config_or_with_a_changed_file_is_not_trusted(tmp_path):
    cells = _cells(tmp_path, n=2)
    with pytest.raises(KeyboardInterrupt):
        rows.run_row(cells, Counting(die_at=("train", 3)).stages())
    _snakemake_cleanup(cells)
    changed = _cells(tmp_path, n=2, lr=0.2)  # a hyperparameter changed: m0 must be trained again
    again = Counting()
    rows.run_row(changed, again.stages())
    assert again.calls == [("train", "m0"), ("eval", "m0"), ("train", "m1"), ("eval", "m1")]
    assert "lr 0.2" in (Path(changed[0]["out_dir"]) / "a.bin").read_text()
    # a receipt whose file no longer hashes to its manifest (disk corruption, an edit)
    with pytest.raises(KeyboardInterrupt):
        rows.run_row(cells, Counting(die_at=("train", 3)).stages())
    (rows.receipt_dir(cells[0]) / "log.json").unlink()
    (rows.receipt_dir(cells[0]) / "log.json").write_text("tampered\n")
    _snakemake_cleanup(cells)
    again = Counting()
    rows.run_row(cells, again.stages())
    assert again.calls[:2] == [("train", "m0"), ("eval", "m0")]
    # a receipt whose manifest was never written (killed while writing the receipt)
    with pytest.raises(KeyboardInterrupt):
        rows.run_row(cells, Counting(die_at=("train", 3)).stages())
    for name in ("stage_0.json", "stage_1.json"):
        (rows.receipt_dir(cells[0]) / name).unlink()
    again = Counting()
    rows.run_row(cells, again.stages())
    assert again.calls[:2] == [("train", "m0"), ("eval", "m0")]


def test_restored_outputs_are_hard_links_of_the_receipt(tmp_path):
    cells = _cells(tmp_path, n=2)
    with pytest.raises(KeyboardInterrupt):
        rows.run_row(cells, Counting(die_at=("train", 3)).stages())
    _snakemake_cleanup(cells)
    assert rows.restore_finished(cells[0], Counting().stages()) == 2
    out = Path(cells[0]["out_dir"]) / "a.bin"
    assert out.stat().st_ino == (rows.receipt_dir(cells[0]) / "a.bin").stat().st_ino


def test_a_killed_writers_temporary_is_swept_when_the_file_is_written_again(tmp_path):
    target = tmp_path / "train_log.json"
    stale = tmp_path / ".train_log.json.ab12cd_3.tmp"  # what tempfile.mkstemp names it
    stale.write_text('{"half": ')
    other = tmp_path / ".train_log.json.bak"  # not a temporary of atomic_path: kept
    other.write_text("x")
    write_json_atomic(target, {"rounds": []})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".train_log.json.bak", "train_log.json"]


def test_a_cleanup_killed_midway_leaves_a_cell_a_rerun_can_finish(tmp_path):
    cell = {"paper": "t", "train": {"rounds": 2}, "out_dir": str(tmp_path / "c")}
    prepare_checkpoints(cell)
    for r in (1, 2):
        for p in checkpoint_paths(cell["out_dir"], r):
            p.write_text("{}")
    client = tmp_path / "c" / "clients" / "A" / "local_round_002.safetensors"
    client.parent.mkdir(parents=True)
    client.write_text("x")
    # killed after the checkpoints were renamed away, before the clients were: a fresh start
    os.replace(tmp_path / "c" / "checkpoints", tmp_path / "c" / ".discarded-checkpoints")
    assert prepare_checkpoints(cell) == 0
    assert not (tmp_path / "c" / "clients").exists()  # stale client states of the old run
    assert not (tmp_path / "c" / ".discarded-checkpoints").exists()
    for p in checkpoint_paths(cell["out_dir"], 1):
        p.write_text("{}")
    client.parent.mkdir(parents=True)
    client.write_text("x")
    discard_checkpoints(cell["out_dir"])
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == []
    assert latest_round(cell["out_dir"]) == 0
