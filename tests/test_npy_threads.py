"""fedrepro.fl.npy_threads: NumPy's .npy header parser under a lock on CPython builds with gh-106905
(the suite failed once with "SystemError: AST constructor recursion depth mismatch" in np.load on
the in-process engine's client thread)."""

from __future__ import annotations

import ast
import io
import threading

import numpy as np
import pytest

import fedrepro.fl.engine  # noqa: F401 - installs the lock where the interpreter needs it
import fedrepro.fl.strategy  # noqa: F401
from fedrepro.fl import npy_threads


@pytest.mark.parametrize(
    "version, expected",
    [((3, 10, 14), False), ((3, 11, 0), True), ((3, 11, 7), True), ((3, 11, 8), False),
     ((3, 12, 0), True), ((3, 12, 1), True), ((3, 12, 2), False), ((3, 13, 0), False)],
)
def test_affected_versions(version, expected):
    assert npy_threads.affected(version) is expected


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_np_load_parses_its_header_under_the_lock(monkeypatch):
    assert npy_threads.install(force=True)
    first = [m._read_array_header for m in npy_threads._format_modules()]
    assert npy_threads.install(force=True)  # idempotent: not wrapped twice
    assert [m._read_array_header for m in npy_threads._format_modules()] == first
    assert npy_threads.installed()
    calls = []
    real = ast.literal_eval

    def checked(src):  # numpy's reader imports ast in its body: it gets this module object
        calls.append(npy_threads._LOCK.locked())
        return real(src)

    monkeypatch.setattr(ast, "literal_eval", checked)
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.load(io.BytesIO(_npy(arr)))
    np.testing.assert_array_equal(out, arr)
    assert calls == [True]  # the header parsed once, with the lock held
    assert not npy_threads._LOCK.locked()


def test_installed_on_import_of_the_engine_where_needed():
    if npy_threads.affected():
        assert npy_threads.installed()


def test_many_threads_load_at_once():
    """np.load in 8 threads at once (the in-process engine's clients beside the round writer, the
    pattern of gh-106905): every array read back exactly, no SystemError."""
    npy_threads.install(force=True)
    blobs = [_npy(np.full((4, i + 1), i, dtype=np.int64)) for i in range(20)]
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def loader() -> None:
        try:
            start.wait()
            for _ in range(100):
                for i, b in enumerate(blobs):
                    got = np.load(io.BytesIO(b))
                    assert got.shape == (4, i + 1) and int(got[0, 0]) == i
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=loader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
