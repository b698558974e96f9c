"""Send a workflow script's logging and stderr to its Snakemake log file; the one progress line
every training runner logs per round (:class:`RoundProgress`)."""

from __future__ import annotations

import datetime
import logging
import sys
import time
from pathlib import Path


def to_file(path: str) -> None:
    """Route ``logging`` (INFO) and ``sys.stderr`` to ``path`` (the rule's ``log:``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    stream = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives for the job
    sys.stderr = stream
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=stream,
        force=True,
    )


def clock_text(seconds: float) -> str:
    """``h:mm:ss`` (``1 day, h:mm:ss`` past a day) of a duration, rounded to the second."""
    return str(datetime.timedelta(seconds=max(0, round(seconds))))


class RoundProgress:
    """One log line per finished training round, the same in every runner (federated or local):
    ``round 3/10 · 3 clients · elapsed 0:01:12 · ~0:02:48 left``.

    The estimate counts work in client-rounds (rounds × clients): the time per client-round so far
    (elapsed / client-rounds finished since this process started, so a resumed run does not count
    the rounds a previous process did) times the client-rounds left, at this round's number of
    clients. ``start_round`` is the last round finished before this process began; ``clock`` a
    monotonic clock in seconds (a fake one in tests).
    """

    def __init__(self, total_rounds: int, clients: int, start_round: int = 0,
                 clock=time.monotonic, logger: logging.Logger | None = None,
                 what: str = "round"):
        self.total = int(total_rounds)
        self.clients = int(clients)
        self.start_round = int(start_round)
        self.clock = clock
        self.t0 = clock()
        self.done_units = 0
        self.logger = logger or logging.getLogger("fedrepro.progress")
        self.what = what

    def line(self, round_: int, clients: int | None = None, extra: str = "") -> str:
        """Record round ``round_`` (absolute, 1-based) as finished by ``clients`` clients (default:
        the constructor's) and return its progress line (``extra``, e.g. the loss, appended)."""
        k = self.clients if clients is None else int(clients)
        self.done_units += k
        elapsed = self.clock() - self.t0
        left_units = max(0, self.total - int(round_)) * k
        left = elapsed * left_units / self.done_units if self.done_units else 0.0
        noun = "client" if k == 1 else "clients"
        return (f"{self.what} {int(round_)}/{self.total} · {k} {noun} · elapsed "
                f"{clock_text(elapsed)} · ~{clock_text(left)} left" + (f" · {extra}" if extra else ""))

    def log(self, round_: int, clients: int | None = None, extra: str = "") -> str:
        """:meth:`line`, logged at INFO; returns the line."""
        text = self.line(round_, clients, extra)
        self.logger.info(text)
        return text
