"""Atomic file output and line-oriented JSON helpers.

Every file the pipeline writes goes through these helpers: the content is written to a temporary
file in the destination folder and renamed into place, so a killed run never leaves a half-written
file that a later run (or Snakemake) would trust. A full or read-only disk raises
:class:`OutputError` naming the output, after the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import errno
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


class OutputError(OSError):
    """An output could not be written (disk full, read-only file system, no permission).

    The message names the output and what to do; the atomic helpers raise it only after removing
    their temporary file, so nothing half-written is left where a later run would look.
    ``errno`` is the operating system's (``ENOSPC``, ``EROFS``, ``EACCES`` ...).
    """


_WRITE_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EACCES", "EPERM", "EIO")
    if hasattr(errno, name)
)
_HINTS = {
    errno.ENOSPC: "free disk space",
    getattr(errno, "EDQUOT", -1): "free space within your disk quota",
    errno.EFBIG: "raise the file-size limit (ulimit -f) or free space",
    errno.EROFS: "the file system is read-only: point the results at a writable folder",
    errno.EACCES: "make the folder writable for this user",
    errno.EPERM: "make the folder writable for this user",
}


def _output_error(path: Path, exc: OSError, folder: bool = False) -> OutputError:
    if isinstance(exc, OutputError) and not folder:
        return exc
    hint = _HINTS.get(exc.errno, "check the folder")
    reason = os.strerror(exc.errno) if isinstance(exc, OutputError) else exc.strerror or exc
    return OutputError(
        exc.errno,
        f"{path}: could not write it ({reason}); nothing was written there and no "
        f"partial file is left -- {hint} ({path.parent}), then rerun",
        str(path),
    )


def _is_write_failure(exc: OSError, tmp: Path) -> bool:
    """A failure of writing ``tmp`` (not, say, of reading an input inside the ``with`` block):
    a write-side errno on the temporary path, or on no path at all (``write()`` errors name none)."""
    if isinstance(exc, OutputError):
        return True
    if exc.errno not in _WRITE_ERRNOS:
        return False
    return exc.filename is None or str(exc.filename).startswith(str(tmp))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    Use for writers that want a file name (``torch.save``, ``DataFrame.to_csv``, ``savefig``). If
    the block fails, the temporary file is removed and ``path`` is left as it was (absent, or its
    previous complete version). A disk that is full or read-only, or a folder without write
    permission, raises :class:`OutputError` naming ``path``. A temporary of ``path`` left by a
    writer that was killed (SIGKILL runs no ``finally``) is removed first, so a rerun leaves no
    stray file beside its outputs.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path, suffix or ".tmp")
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise _output_error(path, exc) from exc
    tmp_path = Path(tmp)
    try:
        try:
            yield tmp_path
        except OSError as exc:
            if _is_write_failure(exc, tmp_path):
                raise _output_error(path, exc) from exc
            raise
        try:
            os.replace(tmp_path, path)
        except OSError as exc:
            raise _output_error(path, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            tmp_path.unlink(missing_ok=True)


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
    """Yield a fresh temporary folder beside ``path``; move it onto ``path`` only on success.

    A failed block removes the temporary folder and leaves ``path`` as it was; a full or
    read-only disk raises :class:`OutputError` naming ``path``.
    """
    import shutil

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path, "", folders=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as exc:
        raise _output_error(path, exc, folder=True) from exc
    try:
        try:
            yield tmp
        except OSError as exc:
            if _is_write_failure(exc, tmp):
                raise _output_error(path, exc, folder=True) from exc
            raise
        try:
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
        except OSError as exc:
            raise _output_error(path, exc, folder=True) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes_atomic(path: str | os.PathLike, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` atomically (a full or read-only disk: :class:`OutputError`)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


def torch_save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj)`` to ``path`` atomically.

    The object is serialised to memory first and then written like any file: ``torch.save`` to a
    file that hits a full disk raises an opaque ``RuntimeError`` ("unexpected pos ...") where this
    raises :class:`OutputError` naming ``path``. The archive's inner folder is ``archive/`` (as for
    any buffer) instead of the temporary file's random name, so the same object gives the same
    bytes.
    """
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    write_bytes_atomic(path, buf.getbuffer())


def safetensors_save_atomic(tensors: dict, path: str | os.PathLike) -> None:
    """``safetensors`` file of ``tensors`` (torch tensors or numpy arrays) at ``path`` atomically.

    Same bytes as ``safetensors.*.save_file`` (no metadata); serialised to memory first because
    ``save_file`` reports a full disk as ``SafetensorError`` without the path, where this raises
    :class:`OutputError` naming it.
    """
    values = list(tensors.values())
    if values and all(type(v).__module__ == "numpy" for v in values):
        from safetensors.numpy import save
    else:
        from safetensors.torch import save
    write_bytes_atomic(path, save(tensors))


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
