"""Download jobs run on the login node under the SLURM executor (rules/common.smk `localrules`,
config key cluster_local_downloads), and submitted jobs carry the hub cache (config key hub_cache ->
HF_HOME, exported by sbatch --export=ALL).  No cluster needed: fake SLURM commands on PATH record
every call and refuse, so a job that Snakemake submits fails at sbatch and one it runs itself does
not call sbatch at all.  tests/cluster/slurm_smoke.sh checks the same on a real SLURM cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, SNAKEMAKE, write_config

FAKE = """#!/bin/sh
echo "$(basename "$0") HF_HOME=$HF_HOME $*" >> {calls}
echo "fake $(basename "$0"): no cluster here" >&2
exit 1
"""


def _run(tmp: Path, *extra: str) -> tuple[subprocess.CompletedProcess, str]:
    bin_dir, calls = tmp / "bin", tmp / "slurm_calls.log"
    bin_dir.mkdir(exist_ok=True)
    for name in ("sbatch", "squeue", "sacct", "sacctmgr", "scontrol", "sinfo", "scancel", "srun"):
        (bin_dir / name).write_text(FAKE.format(calls=calls))
        (bin_dir / name).chmod(0o755)
    calls.unlink(missing_ok=True)
    cfg = write_config(tmp, {"hub_cache": str(tmp / "hub")})
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PATH": os.pathsep.join([str(bin_dir), str(Path(SNAKEMAKE).parent), os.environ["PATH"]])}
    res = subprocess.run(
        [SNAKEMAKE, "--profile", str(ROOT / "profiles" / "slurm-ci"),
         "--directory", str(tmp / "work"), "resources/downloads/samsum", *extra,
         "--configfile", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    return res, calls.read_text() if calls.exists() else ""


@pytest.mark.slow
def test_download_jobs_run_on_the_login_node_under_the_slurm_profile(tmp_path):
    res, calls = _run(tmp_path)
    out = res.stdout + res.stderr
    assert "localrule download_source:" in out, out[-3000:]
    assert "sbatch" not in calls, calls  # never submitted
    # the download itself ran here (offline: it fails at once, naming the config key to use)
    log = (tmp_path / "work" / "logs" / "download_source" / "samsum.log").read_text()
    assert "data.samsum.local_dir" in log

    # the control: with cluster_local_downloads false the same job goes to sbatch, with HF_HOME
    res, calls = _run(tmp_path, "--config", "cluster_local_downloads=False")
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "localrule download_source:" not in out
    submitted = [line for line in calls.splitlines() if line.startswith("sbatch ")]
    assert submitted and all("rule_download_source" in line for line in submitted), calls
    assert all(f"HF_HOME={tmp_path / 'hub'} " in line for line in submitted), calls
