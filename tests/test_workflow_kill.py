"""Kill ``snakemake`` mid-run, rerun it, and every file under ``results/`` equals a clean run's
(issue 17, the workflow level of tests/faults.py).

The run is SIGKILLed with its whole process group (Snakemake and the job it is running, here a
row job training and evaluating its three cells) within half a second after round 1 of a seeded
cell finished; the rerun first ``--unlock``s (a SIGKILLed Snakemake cannot release its lock), then runs
with the repository's default profile (``rerun-incomplete: true``): the killed job's outputs are
deleted and the job rerun, its finished cells restored from their receipts (fedrepro.fl.rows), its
unfinished one resumed from its checkpoints.  About a minute per case here (a clean run of the
target, then the killed one and its rerun): one case in ``make test``, two more ``exhaustive``
(``make test-slow``)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import faults
import pytest
from compare_results import compare
from helpers import ROOT, SNAKEMAKE, run_snakemake, write_config
from test_workflow import TINY_CONFIG

pytestmark = pytest.mark.slow

ADA_ROW = ("adafedseleckd/domains/bart-large/{m}/all/seed~7/{f}")


def _ada_targets() -> list[str]:
    from fedrepro.papers.adafedseleckd.grid import CELL_FILES, ROW_METHODS

    return [f"results/{ADA_ROW.format(m=m, f=f)}" for m in ROW_METHODS for f in CELL_FILES]


def _build(d: Path, targets: list[str]) -> subprocess.CompletedProcess:
    return run_snakemake("--cores", "2", "--configfile", str(d / "tiny.yaml"), "--directory", str(d),
                         *targets, timeout=1200)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    d = tmp_path_factory.mktemp("clean")
    write_config(d, TINY_CONFIG.format(samples=ROOT / "resources" / "samples" / "qmsum")
                 + "  cells_per_job: row\n", "tiny.yaml")
    res = _build(d, _ada_targets())
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return d


# the seed picks the cell under way at the kill: AdaFedKD (make test), AdaFedAvg, AdaFedSelectKD
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.exhaustive),
                                  pytest.param(5, marks=pytest.mark.exhaustive)])
def test_snakemake_killed_mid_run_reruns_to_a_clean_runs_results(clean, tmp_path, seed):
    d = tmp_path / "killed"
    d.mkdir()
    (d / "tiny.yaml").write_text((clean / "tiny.yaml").read_text())
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(
            [SNAKEMAKE, "--cores", "2", "--configfile", str(d / "tiny.yaml"), "--directory", str(d),
             *_ada_targets()], cwd=ROOT, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    # a seeded moment inside the row job: shortly after round 1 of a seeded one of its cells
    from fedrepro.papers.adafedseleckd.grid import ROW_METHODS

    rng = random.Random(seed)
    method = ROW_METHODS[rng.randrange(len(ROW_METHODS))]
    first = d / "results" / ADA_ROW.format(m=method, f="checkpoints/server_round_001.json")
    deadline = time.monotonic() + 900
    while not first.exists():
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-4000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.5))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "snakemake finished before it was killed"
    cell_dir = "results/" + ADA_ROW.rsplit("/", 1)[0]
    at_kill = {m: faults.state_at_kill(d, cell_dir.format(m=m)) for m in ROW_METHODS}
    unlock = run_snakemake("--unlock", "--configfile", str(d / "tiny.yaml"), "--directory", str(d))
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    res = _build(d, _ada_targets())
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert compare(clean / "results", d / "results") == []
    # the rerun redid only the killed job (data, backbone and partitions were finished), in which
    # the cells finished before the kill were restored and the one under way resumed
    assert "rule adafedseleckd_row:" in out and "rule backbone:" not in out
    job_log = "".join(p.read_text() for p in (d / "logs").rglob("*.log"))
    for m, state in at_kill.items():
        where = cell_dir.format(m=m)
        if state["trained"]:
            assert (f"{where} finished before the job was stopped; restored" in job_log
                    or f"{where}: 1 of 2 stages restored" in job_log), m
        elif 0 < state["rounds"] < 2:  # TINY_CONFIG: 2 rounds (after both: nothing left to train)
            assert f"resuming {where} from round {state['rounds']}" in job_log, m
    assert any(s["trained"] or s["rounds"] for s in at_kill.values()), at_kill
