"""Disk faults (issue 17, item 6): a full or read-only results folder gives a clear error naming
the output, and leaves no half-written file that a later run would trust.

Every output of the pipeline is written through :mod:`fedrepro.io`'s write-then-rename helpers
(``tests/test_disk_faults.py::test_outputs_are_written_through_the_atomic_helpers`` keeps it so).
The faults are real where the machine allows: a file-size limit (``RLIMIT_FSIZE``: writes past it
fail with ``EFBIG``, as on a full disk) in a child process, a tiny or read-only tmpfs when this
user may mount one (root in CI containers usually may), a read-only folder (not for root: chmod
does not stop root). ``os.replace`` failing is simulated.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedrepro import io as fio
from fedrepro.io import OutputError, atomic_dir, atomic_path, write_json_atomic, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
OLD = "the previous complete version\n"


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- a full disk: writes past a file-size limit fail (EFBIG) --------------------------------------------
CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    import pandas as pd
    from fedrepro import io as fio
    from fedrepro.fl.checkpoint import save_state
    import torch

    out = Path(sys.argv[1])
    big = "x" * 50_000
    writers = {
        "text.txt": lambda p: fio.write_text_atomic(p, big),
        "obj.json": lambda p: fio.write_json_atomic(p, {"a": big}),
        "records.jsonl": lambda p: fio.write_jsonl_atomic(p, ({"i": i, "t": big[:900]} for i in range(60))),
        "table.csv": lambda p: _csv(p),
        "state.safetensors": lambda p: save_state(p, {"w": torch.zeros(20_000)}),
        "optimizer.pt": lambda p: fio.torch_save_atomic({"m": torch.zeros(20_000)}, p),
        "client_dir": lambda p: _dir(p),
    }

    def _csv(p):
        with fio.atomic_path(p) as tmp:
            pd.DataFrame({"t": [big[:1000]] * 50}).to_csv(tmp, index=False)

    def _dir(p):
        with fio.atomic_dir(p) as tmp:
            fio.write_text_atomic(tmp / "small.txt", "ok\\n")
            fio.write_text_atomic(tmp / "big.txt", big)

    for name in writers:  # the previous complete versions, written before the limit
        if name == "client_dir":
            (out / name).mkdir()
            (out / name / "small.txt").write_text(sys.argv[2])
        else:
            (out / name).write_text(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, resource.RLIM_INFINITY))
    result = {}
    for name, write in writers.items():
        try:
            write(out / name)
            result[name] = None
        except Exception as exc:
            result[name] = [type(exc).__name__, getattr(exc, "errno", None), str(exc)]
    print(json.dumps(result))
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE/SIGXFSZ behaviour is Linux's")
def test_a_full_disk_names_the_output_and_keeps_the_previous_version(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), OLD], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) == {"text.txt", "obj.json", "records.jsonl", "table.csv",
                           "state.safetensors", "optimizer.pt", "client_dir"}
    for name, failure in result.items():
        assert failure is not None, f"{name}: a write past the file-size limit succeeded"
        kind, code, msg = failure
        assert kind == "OutputError" and code == errno.EFBIG, failure
        assert msg.startswith(f"[Errno {errno.EFBIG}] {out / name}: could not write it"), msg
        assert "no partial file is left" in msg
    # nothing but the previous complete versions: no temporary file, no partial output
    assert _files(out) == sorted(["client_dir", "client_dir/small.txt", "obj.json", "optimizer.pt",
                                  "records.jsonl", "state.safetensors", "table.csv", "text.txt"])
    for p in out.rglob("*"):
        if p.is_file():
            assert p.read_text() == OLD, p


# -- a tiny and a read-only tmpfs (where this user may mount one) ---------------------------------------
@contextlib.contextmanager
def _tmpfs(where: Path, size: str):
    where.mkdir()
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc})")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True, timeout=30)


def _raw_csl(folder: Path, n: int) -> None:
    folder.mkdir(parents=True)
    lines = [f"to title\t{'摘要内容' * 40}{i}\t标题{i}" for i in range(n)]
    (folder / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_full_tmpfs_fails_the_prepare_step_cleanly_and_a_rerun_completes(tmp_path):
    from fedrepro.data.prepare import prepare_source

    raw = tmp_path / "raw"
    _raw_csl(raw, 400)  # ~200 KB of records: more than the 64 KiB file system holds
    with _tmpfs(tmp_path / "results", "64k") as results:
        records, report = results / "data" / "records.jsonl", results / "data" / "report.json"
        with pytest.raises(OutputError) as err:
            prepare_source("csl", raw, str(records), str(report))
        assert err.value.errno == errno.ENOSPC
        assert str(err.value).startswith(f"[Errno {errno.ENOSPC}] {records}: could not write it")
        assert "free disk space" in str(err.value)
        assert _files(results) == ["data"]  # no records.jsonl, no report, no temporary file
    # the same step on a disk with room: complete outputs
    out = tmp_path / "ok"
    rep = prepare_source("csl", raw, str(out / "records.jsonl"), str(out / "report.json"))
    assert rep["counts"] == {"train": 400} and _files(out) == ["records.jsonl", "report.json"]


def test_a_read_only_tmpfs_names_the_output(tmp_path):
    with _tmpfs(tmp_path / "results", "1m") as results:
        (results / "table.md").write_text(OLD)
        subprocess.run(["mount", "-o", "remount,ro", str(results)], check=True, timeout=30)
        try:
            with pytest.raises(OutputError) as err:
                write_text_atomic(results / "table.md", "new\n")
            assert err.value.errno == errno.EROFS
            assert f"{results / 'table.md'}: could not write it" in str(err.value)
            assert "read-only" in str(err.value)
            with (pytest.raises(OutputError, match=re.escape(f"{results / 'cells'}: could not")),
                  atomic_dir(results / "cells")):
                pass
            assert _files(results) == ["table.md"] and (results / "table.md").read_text() == OLD
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(results)], check=True, timeout=30)


# -- a read-only folder (chmod; root ignores it) ------------------------------------------------------
@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes into read-only folders; the tmpfs tests cover root")
def test_a_read_only_folder_names_the_output(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "scores.json").write_text(OLD)
    folder.chmod(0o555)
    try:
        with pytest.raises(OutputError) as err:
            write_json_atomic(folder / "scores.json", {"rouge1": 1.0})
        assert err.value.errno in (errno.EACCES, errno.EPERM)
        assert f"{folder / 'scores.json'}: could not write it" in str(err.value)
        assert _files(folder) == ["scores.json"] and (folder / "scores.json").read_text() == OLD
    finally:
        folder.chmod(0o755)


# -- the rename step fails; errors that are not about the output ---------------------------------------
def test_a_failing_rename_leaves_the_previous_version_and_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "round_003.json"
    target.write_text(OLD)

    def replace(src, dst):
        raise OSError(errno.EROFS, "Read-only file system", str(src), None, str(dst))

    monkeypatch.setattr(fio.os, "replace", replace)
    with pytest.raises(OutputError, match=re.escape(f"{target}: could not write it")):
        write_json_atomic(target, {"round": 3})
    assert _files(tmp_path) == ["round_003.json"] and target.read_text() == OLD


def test_a_write_that_fails_midway_removes_its_partial_file(tmp_path):
    target = tmp_path / "model.pt"
    with pytest.raises(OutputError) as err, atomic_path(target) as tmp:
        tmp.write_bytes(b"half of a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert err.value.errno == errno.ENOSPC and str(target) in str(err.value)
    assert _files(tmp_path) == []


def test_an_input_error_inside_the_block_is_not_reported_as_an_output_error(tmp_path):
    with pytest.raises(FileNotFoundError), atomic_path(tmp_path / "out.json"):
        (tmp_path / "missing-input.json").read_text()
    assert _files(tmp_path) == []


# -- the audit: outputs go through the atomic helpers ----------------------------------------------------
WRITE_CALL = re.compile(
    r"open\([^)]*[\"'][wa]b?[\"']|\.to_csv\(|savefig\(|torch\.save\(|save_file\(|json\.dump\(|"
    r"\.write_text\(|\.write_bytes\(|\.to_parquet\(|pq\.write_table\("
)
# writes that are not pipeline outputs, or that write into a staging path of an atomic helper
ALLOWED = {
    "src/fedrepro/io.py": "the helpers themselves",
    "src/fedrepro/logs.py": "the job log, a stream appended to (not an output a rerun trusts)",
    "src/fedrepro/fl/deploy/__init__.py": "the deployment's own TLS files, config and process "
                                          "logs in its throw-away run folder",
    "src/fedrepro/data/download.py": "downloads into a mkstemp .part file renamed when complete",
    "src/fedrepro/models/resident.py": "the FEDREPRO_LOAD_LOG diagnostic: one line appended per "
                                       "backbone load (a log, not an output)",
    "src/fedrepro/reporting/browser.py": "the page the headless browser opens, in the caller's "
                                         "scratch folder (not an output)",
}


def test_outputs_are_written_through_the_atomic_helpers():
    """Every write call in src/ and workflow_scripts/ writes a temporary path of an atomic helper
    (``tmp``/``staging``/a ``.part`` file), or is in a file listed in ``ALLOWED`` with the reason."""
    assert all((ROOT / rel).is_file() for rel in ALLOWED)
    assert WRITE_CALL.search('(out / "x.json").write_text(s)') and WRITE_CALL.search("torch.save(m, p)")
    offenders = []
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "workflow_scripts").rglob("*.py")]):
        rel = str(path.relative_to(ROOT))
        if rel in ALLOWED:
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#")[0]
            if not WRITE_CALL.search(code) or code.lstrip().startswith(("def ", '"', "'")):
                continue
            if re.search(r"\btmp\b|tmp_path|staging|\btmp\)|\(tmp\b|dst\b", code):
                continue
            offenders.append(f"{rel}:{lineno}: {line.strip()}")
    assert not offenders, "writes outside the atomic helpers:\n" + "\n".join(offenders)
