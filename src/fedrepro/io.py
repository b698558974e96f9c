"""Atomic file output and line-oriented JSON helpers.

Every file the pipeline writes goes through these helpers: the content is written to a temporary
file in the destination folder and renamed into place, so a killed run never leaves a half-written
file that a later run (or Snakemake) would trust.
"""

from __future__ import annotations

import contextlib
import json
import os
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
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``path``; move it onto ``path`` only on success."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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


_BOM = b"\xef\xbb\xbf"


def _require_readable_file(path: Path) -> None:
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected a file")
    if not path.is_file():
        raise InputError(f"{path}: file not found")


def _not_utf8(path: Path, lineno: int, exc: UnicodeDecodeError, line: bytes) -> InputError:
    col = exc.start - line.rfind(b"\n", 0, exc.start)  # 1-based column of the bad byte
    return InputError(
        f"{path}:{lineno}: not valid UTF-8 text (byte {exc.object[exc.start]:#04x} at column "
        f"{col}: {exc.reason}); convert the file to UTF-8"
    )


def iter_text_lines(path: str | os.PathLike, keepends: bool = False) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` of a UTF-8 text file, decoded line by line.

    Lines end at ``\\n`` only (JSON lines may hold U+2028 and other characters that
    ``str.splitlines`` would break on); a leading byte-order mark is dropped and, unless
    ``keepends``, the line end (``\\n`` or ``\\r\\n``) too. A missing path, a folder or bytes that
    are not UTF-8 raise :class:`InputError` naming the file (and the line of the bad bytes).
    """
    path = Path(path)
    _require_readable_file(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115 -- closed by the with block below
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1:
                raw = raw.removeprefix(_BOM)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _not_utf8(path, lineno, exc, raw) from exc
            if not keepends:
                line = line.removesuffix("\n").removesuffix("\r")
            yield lineno, line


def read_text(path: str | os.PathLike) -> str:
    """The whole UTF-8 text of ``path`` (a leading byte-order mark dropped).

    A missing path, a folder or bytes that are not UTF-8 raise :class:`InputError` naming the file
    and, for bad bytes, the line they are on.
    """
    path = Path(path)
    _require_readable_file(path)
    try:
        data = path.read_bytes().removeprefix(_BOM)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, data.count(b"\n", 0, exc.start) + 1, exc, data) from exc


def iter_jsonl(path: str | os.PathLike, what: str = "a JSON object") -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON-lines file.

    A malformed line (bad JSON, not an object, not UTF-8) raises :class:`InputError` naming the
    file and the line.
    """
    for lineno, line in iter_text_lines(path):
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
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
