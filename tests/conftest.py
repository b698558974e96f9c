import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def task_identity(monkeypatch):
    """Flower messages built outside a Flower run take the run id of a ServerApp process: run 1,
    node 0, task 0 (as a SuperLink sets them), restored after the test."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real data samples not present at {SHARED_DATA} (only on the project's dev machines)")
    return SHARED_DATA


def pytest_collection_modifyitems(config, items):
    """``rehearsal``-marked tests (true-size cells, minutes each) run only with
    ``FEDREPRO_REHEARSAL=1`` (``make rehearse``), ``exhaustive``-marked ones (more seeds and fault
    kinds of checks ``make test`` runs once; Snakemake killed mid-run) only with
    ``FEDREPRO_EXHAUSTIVE=1`` (``make test-slow``), ``e2e``-marked ones (every paper's targets
    built by Snakemake, the Flower deployment, the report in a browser, the stall and crash checks
    of the Ray simulation and the deployment) only with ``FEDREPRO_E2E=1`` (``make test-e2e``);
    elsewhere they are skipped with that reason."""
    gated = {
        "rehearsal": ("FEDREPRO_REHEARSAL",
                      "true-size rehearsal cells: run by `make rehearse` (FEDREPRO_REHEARSAL=1)"),
        "exhaustive": ("FEDREPRO_EXHAUSTIVE",
                       "more seeds / fault kinds: run by `make test-slow` (FEDREPRO_EXHAUSTIVE=1)"),
        "e2e": ("FEDREPRO_E2E",
                "whole-workflow / deployment run: by `make test-e2e` (FEDREPRO_E2E=1)"),
    }
    for marker, (env, reason) in gated.items():
        if os.environ.get(env) == "1":
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _longest_files_first(items)


# Seconds each of the longest test files took in `make test` on the 2-core CI machine (pytest
# --durations, two workers, 2026-11-27; the `e2e` tests not counted); every other file takes under
# 25 s.
LONG_FILES = {
    "test_workflow.py": 250, "test_fedsumm_runner.py": 130, "test_federated.py": 130,
    "test_device_placement.py": 120, "test_fedsum_runner.py": 100, "test_workflow_kill.py": 90,
    "test_fedmcp_runner.py": 70,
}


# The same for `make test-e2e` (FEDREPRO_E2E=1: only the `e2e` tests' time counted; 2026-11-27).
LONG_E2E_FILES = {
    "test_workflow.py": 530, "test_fedmcp_workflow.py": 320, "test_no_hang.py": 300,
    "test_fedsum_workflow.py": 260, "test_report.py": 200, "test_federated.py": 180,
    "test_fedsumm_workflow.py": 180, "test_deployment.py": 160, "test_params_canonical.py": 65,
}


def _longest_files_first(items) -> None:
    """Under pytest-xdist (``make test``: ``-n 2 --dist loadfile``) hand the longest files out
    first, so that no worker starts a 7-minute file while the other has nothing left (the tests of
    a file keep their order; files only move)."""
    seconds = LONG_E2E_FILES if os.environ.get("FEDREPRO_E2E") == "1" else LONG_FILES

    def weight(item) -> int:
        return -seconds.get(item.path.name, 0)

    items.sort(key=weight)  # stable: the order inside a file and among the short files is kept


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


@pytest.fixture(autouse=True)
def _rehearsal_precision_pin_undone():
    """``fedrepro.rehearsal.plan.apply`` pins ``precision: auto``'s answer in ``os.environ``, as
    Snakemake's process should: undo it after each test, so no later test (nor its subprocesses)
    inherits another test's decision."""
    from fedrepro.rehearsal.plan import PRECISION_ENV

    before = os.environ.get(PRECISION_ENV)
    yield
    if before is None:
        os.environ.pop(PRECISION_ENV, None)
    else:
        os.environ[PRECISION_ENV] = before


CLIENT_THREADS = ("fedrepro-client-", "client-node-")
"""Name prefixes of the threads a client's work runs in (fedrepro.fl.client_app, fedrepro.fl.engine)."""


@pytest.fixture(autouse=True)
def _no_client_work_left_running():
    """A test must not leave a client's work running: it would go on beside the tests after it in
    this worker process -- re-seeding and drawing from their torch generator -- and one of them,
    not this test, would fail on bits (CI did once: fedrepro.cancellation).  A thread that was
    already running before the test (a leak of an earlier one, reported there) is not counted."""
    import threading
    import time

    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 15.0  # a cancelled worker ends at its next safe point
    while True:
        left = [t.name for t in threading.enumerate()
                if t not in before and t.is_alive() and t.name.startswith(CLIENT_THREADS)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"client work left running after the test: {left} (see fedrepro.cancellation)"
