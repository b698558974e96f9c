"""Row jobs: several cells trained one after the other in one process, resumable cell by cell.

A row job (``cells_per_job: row`` of AdaFedSelecKD and FedSum, FedSUMM's table rows) declares the
files of all its cells as the outputs of one Snakemake job.  Snakemake deletes every declared
output of a job before it runs it again (``--rerun-incomplete`` after a kill; ``Job.prepare`` ->
``remove_existing_output``), so a killed row job lost the outputs of the cells it had finished
and retrained them (issue 17).  Each cell's own checkpoints only cover the cell being trained:
they are removed when a cell finishes (``keep_round_checkpoints: false``).

Here a cell's work comes in *stages* (training, then evaluation or score selection), and each
finished stage leaves a *receipt* beside the cell's outputs, in ``<cell>/.finished/``: a hard link
(a copy where the file system has none) of each file the stage wrote and, written last, a
manifest ``stage_N.json`` with the cell's config hash and the SHA-256 of every file.  A rerun of
the row restores the stages whose receipts are complete, were made under the same config and
whose files still hash to the manifest, and runs only the stages after them: a cell killed
during its evaluation is evaluated again, not retrained.  Any other receipt is discarded and the
stage is run (training resumes from the cell's own round checkpoints,
:mod:`fedrepro.fl.checkpoint`).  When every cell of the row is done the receipts are removed, so
a finished row leaves only its outputs.

Hand-written: Snakemake has no notion of part of a job being done (its ``checkpoint`` rules are
about the DAG, not about resuming a job), and no library keeps outputs across its cleanup.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from fedrepro.fl.checkpoint import config_hash
from fedrepro.io import atomic_path, read_json, write_json_atomic

log = logging.getLogger(__name__)

RECEIPT = ".finished"
Stage = tuple[Sequence[str], Callable[[dict], object]]
"""The names of the files a stage writes into the cell's ``out_dir``, and the stage's function."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _link_or_copy(src: Path, dst: Path) -> None:
    """Put ``src``'s bytes at ``dst`` atomically: a hard link where possible, else a copy."""
    with atomic_path(dst) as tmp:
        tmp.unlink()
        try:
            os.link(src, tmp)
        except OSError:  # a file system without hard links
            shutil.copyfile(src, tmp)


def receipt_dir(cell: dict) -> Path:
    return Path(cell["out_dir"]) / RECEIPT


def _manifest(cell: dict, stage: int) -> Path:
    return receipt_dir(cell) / f"stage_{stage}.json"


def write_receipt(cell: dict, stage: int, files: Sequence[str]) -> None:
    """Record that stage ``stage`` (0-based) of ``cell`` finished with ``files`` (names in its ``out_dir``)."""
    out, folder = Path(cell["out_dir"]), receipt_dir(cell)
    folder.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for name in files:
        _link_or_copy(out / name, folder / name)
        hashes[name] = _sha256(folder / name)
    write_json_atomic(_manifest(cell, stage), {"config_hash": config_hash(cell), "files": hashes})


def _receipt_problem(cell: dict, stage: int, files: Sequence[str]) -> str | None:
    manifest = _manifest(cell, stage)
    if not manifest.exists():
        return "absent"
    record = read_json(manifest)
    if record.get("config_hash") != config_hash(cell):
        return "made under another config"
    if sorted(record.get("files", {})) != sorted(files):
        return "lists other files"
    for name in files:
        path = receipt_dir(cell) / name
        if not path.is_file() or _sha256(path) != record["files"][name]:
            return f"{name} is missing or changed"
    return None


def restore_finished(cell: dict, stages: Sequence[Stage]) -> int:
    """Put back the files of the stages of ``cell`` that a previous run of the row finished;
    returns how many stages (from the first) were restored.  Receipts of the stages after them
    (incomplete, of another config, or corrupt) are discarded."""
    done = 0
    for k, (files, _) in enumerate(stages):
        problem = _receipt_problem(cell, k, files)
        if problem:
            if problem != "absent":
                log.warning("discarding the receipt of stage %d of %s: %s", k, cell["out_dir"], problem)
            break
        done = k + 1
    if done == 0:
        shutil.rmtree(receipt_dir(cell), ignore_errors=True)
        return 0
    for k in range(done, len(stages)):
        _manifest(cell, k).unlink(missing_ok=True)
    for files, _ in stages[:done]:
        for name in files:
            _link_or_copy(receipt_dir(cell) / name, Path(cell["out_dir"]) / name)
    return done


def run_row(cells: Sequence[dict], stages: Sequence[Stage]) -> None:
    """Run the ``stages`` of each cell in order (each ``fn(cell)``), skipping (and restoring) the
    stages a killed earlier run of the same row finished."""
    for cell in cells:
        done = restore_finished(cell, stages)
        if done == len(stages):
            log.info("row job: %s finished before the job was stopped; restored, not run again",
                     cell["out_dir"])
            continue
        if done:
            log.info("row job: %s: %d of %d stages restored from an earlier run", cell["out_dir"],
                     done, len(stages))
        for k in range(done, len(stages)):
            files, fn = stages[k]
            fn(cell)
            write_receipt(cell, k, files)
    for cell in cells:
        shutil.rmtree(receipt_dir(cell), ignore_errors=True)
