"""Send a workflow script's logging and stderr to its Snakemake log file."""

from __future__ import annotations

import logging
import sys
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
