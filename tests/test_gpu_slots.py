"""One job per GPU, or several when their memory fits (fedrepro.gpu_slots), on the CPU with fake
device ids (``FEDREPRO_GPUS``/``FEDREPRO_GPU_MEM_MB``); the rules and scripts that use it; the
download rules that run on the login node under SLURM (rules/common.smk)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import re
import signal
from pathlib import Path

import pytest
import yaml

from fedrepro import gpu_slots as gs
from fedrepro import grid as wf
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]

def no_smi():
    return None


def no_probe():
    return []


def fake_env(lock_dir: Path, gpus: str, mem: str | None = None, **more) -> dict:
    env = {gs.ENV_GPUS: gpus, gs.ENV_LOCK_DIR: str(lock_dir), **more}
    if mem is not None:
        env[gs.ENV_GPU_MEM_MB] = mem
    return env


def claim(env: dict, gpu=1, gpu_mem_mb=0, **kw):
    kw.setdefault("timeout_s", 0)
    kw.setdefault("poll_s", 0.01)
    return gs.claim_job_gpus({"gpu": gpu, "gpu_mem_mb": gpu_mem_mb}, env=env, smi=no_smi,
                             probe=no_probe, release_at_exit=False, **kw)


# -- the pure part ------------------------------------------------------------------------------
def test_choose_spreads_then_shares_and_never_beside_a_whole_job():
    gpus = [gs.Gpu("0", 80000), gs.Gpu("1", 80000)]
    small = gs.Claim(("0",), 30000, 1)
    assert gs.choose_devices(gpus, [], 1, None) == ["0"]
    assert gs.choose_devices(gpus, [small], 1, 30000) == ["1"]  # spread first
    assert gs.choose_devices(gpus, [small, gs.Claim(("1",), 30000, 2)], 1, 30000) == ["0"]
    assert gs.choose_devices(gpus, [small], 1, None) == ["1"]  # whole: only an idle device
    assert gs.choose_devices(gpus, [small, gs.Claim(("1",), None, 2)], 1, None) is None
    assert gs.choose_devices(gpus, [gs.Claim(("0",), None, 1)], 1, 10) == ["1"]
    assert gs.choose_devices(gpus, [gs.Claim(("0",), 60000, 1), gs.Claim(("1",), 60000, 2)],
                             1, 30000) is None
    assert gs.choose_devices(gpus, [], 2, None) == ["0", "1"]
    # unknown memory: a device is only ever given whole
    assert gs.choose_devices([gs.Gpu("0")], [gs.Claim(("0",), 1, 1)], 1, 1) is None


def test_impossible_requests_fail_at_once(tmp_path):
    env = fake_env(tmp_path, "0", "16000")
    with pytest.raises(InputError, match="asks for 2 GPUs but this machine has 1"):
        claim(env, gpu=2)
    with pytest.raises(InputError, match="gpu_mem_mb=20000"):
        claim(env, gpu_mem_mb=20000)
    with pytest.raises(InputError, match="one per device"):
        claim(fake_env(tmp_path, "0,1", "1,2,3"))


def test_device_discovery_order():
    smi = lambda: [("0", "GPU-a", 81559), ("1", "GPU-b", 40960)]  # noqa: E731
    assert gs.visible_gpus({}, smi=smi) == [gs.Gpu("0", 81559), gs.Gpu("1", 40960)]
    assert gs.visible_gpus({"CUDA_VISIBLE_DEVICES": "1"}, smi=smi) == [gs.Gpu("1", 40960)]
    assert gs.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a"}, smi=smi) == [gs.Gpu("GPU-a", 81559)]
    assert gs.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, smi=smi) == []
    assert gs.visible_gpus({gs.ENV_GPUS: "2,3", gs.ENV_GPU_MEM_MB: "1000"}, smi=smi) == [
        gs.Gpu("2", 1000), gs.Gpu("3", 1000)]
    assert gs.visible_gpus({}, smi=no_smi, probe=lambda: [24000]) == [gs.Gpu("0", 24000)]
    assert gs.visible_gpus({}, smi=no_smi, probe=no_probe) == []
    rows = gs.parse_nvidia_smi("0, GPU-4f3e, 81559\n1, GPU-77aa, 81559\n")
    assert rows == [("0", "GPU-4f3e", 81559), ("1", "GPU-77aa", 81559)]


# -- claims under the lock ----------------------------------------------------------------------
def test_no_op_without_a_gpu_request_or_without_gpus(tmp_path):
    env = fake_env(tmp_path, "0,1")
    assert claim(env, gpu=0) is None and "CUDA_VISIBLE_DEVICES" not in env
    assert gs.claim_job_gpus(None, env=env) is None
    cpu = {gs.ENV_LOCK_DIR: str(tmp_path)}  # a CPU-only machine: no nvidia-smi, torch sees none
    assert claim(cpu) is None and "CUDA_VISIBLE_DEVICES" not in cpu
    assert claim({**cpu, "CUDA_VISIBLE_DEVICES": ""}) is None
    assert not any(tmp_path.rglob("claim-*"))


def test_claim_sets_the_environment_and_release_frees_the_device(tmp_path):
    env = fake_env(tmp_path, "0,1")
    first = claim(env, label="train_cell logs/x.log")
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    record = json.loads(first.path.read_text())
    assert record["devices"] == ["0"] and record["mem_mb"] is None and record["pid"] == os.getpid()
    assert first.path.parent == gs.lock_dir_for(env)
    second = claim(dict(env))
    assert second.devices == ("1",)
    with pytest.raises(TimeoutError, match="no 1 GPU"):
        claim(dict(env))
    first.release()
    with claim(dict(env)) as third:
        assert third.devices == ("0",)
    assert not third.path.exists()
    second.release()
    assert not list(gs.lock_dir_for(env).glob("claim-*"))


def test_four_small_jobs_share_one_gpu_while_their_memory_fits(tmp_path):
    env = fake_env(tmp_path, "0", "80000")
    slots = [claim(dict(env), gpu_mem_mb=20000) for _ in range(4)]
    assert [s.devices for s in slots] == [("0",)] * 4
    with pytest.raises(TimeoutError):  # a fifth does not fit in 80 GB
        claim(dict(env), gpu_mem_mb=20000)
    with pytest.raises(TimeoutError):  # nor does a whole-GPU job
        claim(dict(env))
    slots[0].release()
    assert claim(dict(env), gpu_mem_mb=20000).devices == ("0",)


def test_four_small_jobs_on_two_gpus_spread_two_each(tmp_path):
    env = fake_env(tmp_path, "0,1", "40000,40000")
    devices = [claim(dict(env), gpu_mem_mb=20000).devices[0] for _ in range(4)]
    assert devices == ["0", "1", "0", "1"]


def test_a_two_gpu_job_gets_two_devices(tmp_path):
    env = fake_env(tmp_path, "0,1,2,3")
    claim(dict(env))
    slot = claim(env, gpu=2)
    assert slot.devices == ("1", "2") and env["CUDA_VISIBLE_DEVICES"] == "1,2"


def _hold(env: dict, resources: dict, out, release):
    """A job: claim, report the devices, hold them until told."""
    os.environ.update(env)
    slot = gs.claim_job_gpus(resources, smi=no_smi, probe=no_probe, poll_s=0.02)
    out.put((os.getpid(), os.environ["CUDA_VISIBLE_DEVICES"]))
    release.wait(20)
    slot.release()


def _claim_and_die(env: dict, out):
    """A job that is killed while it holds its GPU: no release, no atexit."""
    os.environ.update(env)
    slot = gs.claim_job_gpus({"gpu": 1}, smi=no_smi, probe=no_probe, release_at_exit=False)
    out.put(slot.cuda_visible_devices)
    out.close()
    out.join_thread()  # the report is sent before the kill
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture
def ctx():
    return mp.get_context("fork")


def test_concurrent_jobs_get_different_gpus(tmp_path, ctx):
    env = fake_env(tmp_path, "0,1,2,3")
    out, release = ctx.Queue(), ctx.Event()
    jobs = [ctx.Process(target=_hold, args=(env, {"gpu": 1}, out, release)) for _ in range(4)]
    for p in jobs:
        p.start()
    got = [out.get(timeout=20) for _ in jobs]
    release.set()
    for p in jobs:
        p.join(20)
    assert sorted(d for _, d in got) == ["0", "1", "2", "3"]
    assert all(p.exitcode == 0 for p in jobs)
    assert not list(gs.lock_dir_for(env).glob("claim-*"))  # every job released its GPU


def test_concurrent_small_jobs_share_and_a_waiting_job_gets_a_released_gpu(tmp_path, ctx):
    env = fake_env(tmp_path, "0", "80000")
    out, release = ctx.Queue(), ctx.Event()
    small = [ctx.Process(target=_hold, args=(env, {"gpu": 1, "gpu_mem_mb": 20000}, out, release))
             for _ in range(4)]
    for p in small:
        p.start()
    assert sorted(d for _, d in (out.get(timeout=20) for _ in small)) == ["0"] * 4
    big_release = ctx.Event()
    big = ctx.Process(target=_hold, args=(env, {"gpu": 1}, out, big_release))
    big.start()  # a whole-GPU job waits for all four
    with pytest.raises(queue.Empty):
        out.get(timeout=0.5)
    release.set()
    for p in small:
        p.join(20)
    assert out.get(timeout=20)[1] == "0"
    big_release.set()
    big.join(20)
    assert big.exitcode == 0


def test_a_dead_jobs_claim_is_reclaimed(tmp_path, ctx):
    env = fake_env(tmp_path, "0")
    out = ctx.Queue()
    dead = ctx.Process(target=_claim_and_die, args=(env, out))
    dead.start()
    assert out.get(timeout=20) == "0"
    dead.join(20)
    assert dead.exitcode == -signal.SIGKILL
    stale = list(gs.lock_dir_for(env).glob("claim-*"))
    assert len(stale) == 1 and json.loads(stale[0].read_text())["pid"] == dead.pid
    slot = claim(dict(env))  # at once: the dead pid's claim does not count
    assert slot.devices == ("0",) and not stale[0].exists()


def test_a_reused_pid_does_not_keep_a_claim(tmp_path):
    env = fake_env(tmp_path, "0")
    lock = gs.lock_dir_for(env)
    lock.mkdir(parents=True)
    # this process's pid, but another start time: the claimer is gone and the pid was reused
    (lock / "claim-1-0.json").write_text(json.dumps(
        {"devices": ["0"], "mem_mb": None, "pid": os.getpid(), "started": "1"}))
    (lock / "claim-2-0.json").write_text("{not json")
    assert claim(dict(env)).devices == ("0",)
    assert not (lock / "claim-1-0.json").exists()
    assert not (lock / "claim-2-0.json").exists()


# -- SLURM -------------------------------------------------------------------------------------
def test_slurm_assignment_is_respected(tmp_path):
    env = {gs.ENV_LOCK_DIR: str(tmp_path), "SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "0"}
    assert claim(env) is None and env["CUDA_VISIBLE_DEVICES"] == "0"
    env = {gs.ENV_LOCK_DIR: str(tmp_path), "SLURM_JOB_ID": "43", "SLURM_JOB_GPUS": "5,6"}
    assert claim(env, gpu=2) is None and "CUDA_VISIBLE_DEVICES" not in env
    # a SLURM job that asked for a GPU and got none: it must not take one of the node's
    env = {gs.ENV_LOCK_DIR: str(tmp_path), "SLURM_JOB_ID": "44"}
    assert claim(env) is None and "CUDA_VISIBLE_DEVICES" not in env
    assert not any(tmp_path.rglob("claim-*"))
    assert gs.slurm_assigned({}) is None


def test_jobs_inside_one_multi_gpu_allocation_divide_it(tmp_path):
    """`snakemake --cores all` inside `salloc --gpus 4`: SLURM gave 4, each job asks for 1."""
    env = {gs.ENV_LOCK_DIR: str(tmp_path), "SLURM_JOB_ID": "77", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    got = [claim(dict(env)).devices[0] for _ in range(4)]
    assert got == ["0", "1", "2", "3"]
    assert gs.lock_dir_for(env).name.endswith("-slurm77")  # never mixed with another allocation
    other = {**env, "SLURM_JOB_ID": "78"}
    assert claim(other).devices == ("0",)


# -- the workflow: rules, scripts, config ----------------------------------------------------
def _rules(text: str):
    """(name, body) of every rule in a .smk file."""
    parts = re.split(r"^\s*rule (\w+):\s*$", text, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_every_gpu_rule_declares_gpu_mem_mb_and_its_script_claims_a_slot():
    gpu_rules = 0
    for smk in sorted((ROOT / "rules").glob("*.smk")):
        for name, body in _rules(smk.read_text()):
            body = re.split(r"^\s*(?:rule|ruleorder|if|localrules)\b", body, flags=re.MULTILINE)[0]
            if not re.search(r"^\s+gpu=", body, flags=re.MULTILINE):
                continue
            gpu_rules += 1
            assert re.search(r"^\s+gpu_mem_mb=", body, flags=re.MULTILINE), f"{smk.name}: {name}"
            script = re.search(r'"\.\./(workflow_scripts/\w+\.py)"', body).group(1)
            code = (ROOT / script).read_text()
            assert "claim_job_gpus(snakemake.resources" in code, f"{script} ({name})"
            # before anything that could import torch and start CUDA
            heavy = r"^(from|import) (fedrepro\.(?!logs|gpu_slots)|torch)"
            later = [m.start() for m in re.finditer(heavy, code, re.MULTILINE)]
            assert all(code.index("claim_job_gpus(") < i for i in later), script
    assert gpu_rules >= 11


def test_gpu_mem_mb_from_the_config():
    paper = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    assert wf.gpu_mem_mb(wf.job_resources(paper, "bart-large", "train")) == 0  # a whole GPU
    paper["backbones"]["bart-base"]["resources"]["train"]["gpu_mem_mb"] = 20000
    assert wf.gpu_mem_mb(wf.job_resources(paper, "bart-base", "train")) == 20000
    with pytest.raises(InputError, match="gpu_mem_mb"):
        wf.gpu_mem_mb({"gpu_mem_mb": -1})


def test_download_rules_run_on_the_login_node_and_the_hub_cache_is_configured(tmp_path):
    common = (ROOT / "rules" / "common.smk").read_text()
    block = re.search(r'if config\.get\("cluster_local_downloads", True\):\s*localrules:\s*'
                      r"((?:\s*\w+,)+)", common)
    local = set(re.findall(r"\w+", block.group(1)))
    fetching = set()
    for smk in sorted((ROOT / "rules").glob("*.smk")):
        for name, body in _rules(smk.read_text()):
            if re.search(r'workflow_scripts/(download_\w+|\w*backbone)\.py"', body):
                fetching.add(name)
    assert fetching == local == {"download_qmsum", "download_source", "backbone",
                                 "fedsum_backbone", "fedsumm_backbone"}
    for name in ("config", "paper"):
        cfg = yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())
        assert cfg["cluster_local_downloads"] is True
    paper = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    assert wf.hub_cache_dir(paper, tmp_path) == str((tmp_path / "resources/huggingface").resolve())
    assert wf.hub_cache_dir({"hub_cache": "/shared/hf"}, tmp_path) == "/shared/hf"
    assert wf.hub_cache_dir({"hub_cache": None}, tmp_path) is None
    env = {"HF_HOME": "/home/me/hf"}
    assert wf.use_hub_cache({"hub_cache": None}, tmp_path, env) is None
    assert env["HF_HOME"] == "/home/me/hf"
    wf.use_hub_cache({"hub_cache": "cache/hf"}, tmp_path, env)
    assert env["HF_HOME"] == str((tmp_path / "cache/hf").resolve())
