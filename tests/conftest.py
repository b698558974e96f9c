import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real data samples not present at {SHARED_DATA} (only on the project's dev machines)")
    return SHARED_DATA


def pytest_collection_modifyitems(config, items):
    """``rehearsal``-marked tests (true-size cells, minutes each) run only with
    ``FEDREPRO_REHEARSAL=1`` (``make rehearse``), ``exhaustive``-marked ones (more seeds and fault
    kinds of checks ``make test`` runs once; Snakemake killed mid-run) only with
    ``FEDREPRO_EXHAUSTIVE=1`` (``make test-slow``); elsewhere they are skipped with that reason."""
    gated = {
        "rehearsal": ("FEDREPRO_REHEARSAL",
                      "true-size rehearsal cells: run by `make rehearse` (FEDREPRO_REHEARSAL=1)"),
        "exhaustive": ("FEDREPRO_EXHAUSTIVE",
                       "more seeds / fault kinds: run by `make test-slow` (FEDREPRO_EXHAUSTIVE=1)"),
    }
    for marker, (env, reason) in gated.items():
        if os.environ.get(env) == "1":
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def wire(monkeypatch):
    """A :class:`helpers.WireTap` on the in-process engine: every reply the server pulls."""
    from helpers import WireTap

    from fedrepro.fl.engine import InProcessGrid

    tap = WireTap()
    original = InProcessGrid.pull_messages

    def pull(self, message_ids):
        replies = list(original(self, message_ids))
        tap.record(replies)
        return replies

    monkeypatch.setattr(InProcessGrid, "pull_messages", pull)
    return tap
