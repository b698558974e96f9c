"""Atomic file output and line-oriented JSON helpers.

Every file the pipeline writes goes through these helpers: the content is written to a temporary
file in the destination folder and renamed into place, so a killed run never leaves a half-written
file that a later run (or Snakemake) would trust.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """A problem with user-provided input (file, record, config key) and what to do about it."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    Use for writers that want a file name (``torch.save``, ``DataFrame.to_csv``, ``savefig``).
    A temporary of ``path`` left by a writer that was killed (SIGKILL runs no ``finally``) is
    removed first, so a rerun leaves no stray file beside its outputs.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path, suffix or ".tmp")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def remove_stale_temporaries(path: Path, suffix: str, folders: bool = False) -> None:
    """Delete ``.<name>.XXXXXXXX<suffix>`` files (``folders``: folders) beside ``path``: the
    temporaries of :func:`atomic_path` / :func:`atomic_dir` (``tempfile``'s 8 random characters)
    that a killed writer left."""
    import shutil

    pattern = re.compile(re.escape(f".{path.name}.") + r"[a-z0-9_]{8}" + re.escape(suffix))
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*"):
        if not pattern.fullmatch(stale.name) or stale.is_symlink():
            continue
        with contextlib.suppress(FileNotFoundError):
            if folders and stale.is_dir():
                shutil.rmtree(stale)
            elif not folders and stale.is_file():
                stale.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``path``; move it onto ``path`` only on success."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path, "", folders=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as pretty, key-sorted JSON atomically (stable bytes for the same object)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_jsonl_atomic(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write one JSON object per line atomically; return the number of records written."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n


def iter_jsonl(path: str | os.PathLike, what: str = "a JSON object") -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON-lines file.

    A malformed line raises :class:`InputError` naming the file and the line.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"{path}:{lineno}: not valid JSON ({exc.msg}); fix or remove this line"
                ) from exc
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{lineno}: expected {what}, got {type(obj).__name__}")
            yield lineno, obj


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSON-lines file; a malformed line raises :class:`InputError` naming file and line."""
    return [obj for _, obj in iter_jsonl(path)]


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; errors name the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"{path}: file not found") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
