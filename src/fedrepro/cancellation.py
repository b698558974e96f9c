"""Cooperative cancellation of a client's work that the round has given up on.

A client's train or evaluate call runs in a worker thread bounded by the round's time limit
(:func:`fedrepro.fl.client_app._bounded`).  Python cannot stop a thread from outside, so before
this module a stalled worker went on after the server had failed the cell: it finished its sleep or
its slow step, re-seeded the process's global torch generator (``torch.manual_seed`` at the start
of every client round) and trained on.  In a process that runs on -- the test suite, a notebook
running cells one after another -- that thread drew dropout masks from, and re-seeded, the
generator of the *next* run, whose bits then differed from a clean run's (seen in CI:
``tests/test_waves.py`` after the stalled-client test of ``tests/test_no_hang.py``).

The bounded call runs its worker under a :class:`Token` (:func:`cancellable`) and cancels it
when it gives up -- so does the in-process engine's grid when its own deadline passes first
(:class:`fedrepro.fl.engine.InProcessGrid`; a token made in a cancellable thread is a child of
that thread's token, and cancelling a token cancels its children); the worker stops at its next
safe point with :class:`Cancelled`:

* :func:`sleep` (the ``sleep:`` failpoint) wakes at once;
* :func:`check` at the start of every training step (:class:`fedrepro.devices.StepTimer`) and
  before a client writes its checkpoint (:func:`fedrepro.fl.checkpoint.save_state`).

So a cancelled worker finishes at most the step it is in.  A thread stuck inside one call (a
hung C extension) cannot be stopped this way; the bounded call then logs that the thread still
runs.  Outside a bounded call (the server, the local regimes, the benchmarks) every function here
does nothing more than ``time.sleep``.

Hand-written: neither the standard library nor Flower cancels a running thread's Python work
(``concurrent.futures.Future.cancel`` only cancels work that has not started).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)
_local = threading.local()

GRACE_S = 10.0
"""How long a caller that gave up on a piece of work waits for it to stop at its next safe point
before it reports the failure anyway, with a warning that the work still runs (a demo step takes
well under this; a true-size step on a CPU can take longer: 4-44 s in the CPU rehearsal)."""


class Cancelled(RuntimeError):
    """The work was given up on (its round's time limit passed) and stopped at a safe point."""


class Token:
    """What a piece of work checks at its safe points; :meth:`cancel` is called from another
    thread.  A token made with a ``parent`` is cancelled with it (at once if it already is)."""

    def __init__(self, what: str, parent: Token | None = None) -> None:
        self.what = what
        self._event = threading.Event()
        self._children: list[Token] = []
        self._lock = threading.Lock()
        if parent is not None:
            parent._adopt(self)

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            children, self._children = self._children, []
        for child in children:
            child.cancel()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Wait at most ``seconds`` for :meth:`cancel`; whether it came."""
        return self._event.wait(seconds)

    def _adopt(self, child: Token) -> None:
        with self._lock:
            if not self._event.is_set():
                self._children.append(child)
                return
        child.cancel()


def current() -> Token | None:
    """The calling thread's token (None outside :func:`cancellable`)."""
    return getattr(_local, "token", None)


@contextlib.contextmanager
def cancellable(token: Token) -> Iterator[Token]:
    """Within the block the calling thread's safe points raise :class:`Cancelled` once ``token``
    is cancelled."""
    saved = current()
    _local.token = token
    try:
        yield token
    finally:
        _local.token = saved


def cancelled() -> bool:
    """Whether the calling thread's work has been given up on."""
    token = current()
    return token is not None and token.cancelled


def check() -> None:
    """A safe point: raise :class:`Cancelled` if the calling thread's work was given up on."""
    token = current()
    if token is not None and token.cancelled:
        raise Cancelled(f"{token.what} was given up on (the round's time limit passed): stopped")


def sleep(seconds: float) -> None:
    """``time.sleep(seconds)``, ended early (with :class:`Cancelled`) when the work is given up on."""
    token = current()
    if token is None:
        time.sleep(seconds)
        return
    token.wait(seconds)
    check()


def give_up(token: Token, worker: threading.Thread, grace: float = GRACE_S) -> bool:
    """Cancel ``token`` (the work ``worker`` runs) and wait up to ``grace`` seconds for the worker
    to stop at its next safe point; whether it stopped.  A worker still running then is logged,
    naming the token's work: until it ends, other work in the process may not reproduce its bits."""
    token.cancel()
    worker.join(grace)
    if worker.is_alive():
        log.warning("%s was given up on and is still running (inside one call); until it ends, "
                    "other work in this process may not reproduce its bits", token.what)
        return False
    return True
