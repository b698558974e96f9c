"""The GPU slot allocator's real probes and its bookkeeping, on the CPU (from the mutation run of
``fedrepro.gpu_slots``, docs/mutation.md).

``tests/test_gpu_slots.py`` drives the allocator with fake device ids; the probes behind them
(``nvidia-smi`` and a child ``torch``) were never run.  Here they run as real child processes --
a fake ``nvidia-smi`` on ``PATH`` and a fake interpreter that check the arguments they are given
and answer as the real ones do -- and this machine's own torch answers "no GPU".  Also: the
claim files' fields, the lock folder's place, the order of devices among equally busy ones, the
wait and its log, what a claim of 0 MB means, and Snakemake's resources object."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

from fedrepro import gpu_slots as gs
from fedrepro.io import InputError


PYTHON = sys.executable  # the fakes' interpreter, whatever a test sets sys.executable to


def _executable(path: Path, body: str) -> Path:
    path.write_text(f"#!{PYTHON}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _with_timeout_cap(run, cap: float):
    """``subprocess.run`` whose timeout is at most ``cap`` s (and must be given: a probe that
    could hang forever is a bug)."""
    def capped(*args, **kw):
        assert kw.get("timeout") is not None, "a probe without a timeout"
        return run(*args, **{**kw, "timeout": min(kw["timeout"], cap)})
    return capped


# -- nvidia-smi ---------------------------------------------------------------------------------
SMI_ARGS = ["--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"]


def test_nvidia_smi_is_asked_for_index_uuid_and_memory(tmp_path, monkeypatch):
    _executable(tmp_path / "nvidia-smi", f"""import sys
if sys.argv[1:] != {SMI_ARGS!r}:
    sys.exit("unexpected arguments: " + repr(sys.argv[1:]))
print("0, GPU-aaaa, 81559")
print("1, GPU-bbbb, 40960")
""")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gs.nvidia_smi() == [("0", "GPU-aaaa", 81559), ("1", "GPU-bbbb", 40960)]
    # and it is what visible_gpus asks when nothing names the devices
    assert gs.visible_gpus({}, probe=lambda: pytest.fail("torch asked")) == [gs.Gpu("0", 81559), gs.Gpu("1", 40960)]


def test_nvidia_smi_failing_or_absent_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gs.nvidia_smi() is None  # not installed
    _executable(tmp_path / "nvidia-smi", "import sys\nprint('0, GPU-a, 1')\nsys.exit(9)\n")
    assert gs.nvidia_smi() is None  # installed, no driver: whatever it printed
    _executable(tmp_path / "nvidia-smi", "import time\ntime.sleep(3)\n")
    monkeypatch.setattr(gs.subprocess, "run", _with_timeout_cap(gs.subprocess.run, 0.5))
    assert gs.nvidia_smi() is None  # hung


def test_parse_nvidia_smi_keeps_only_device_rows():
    out = ("index, uuid, memory.total [MiB]\n"  # a header (csv without noheader)
           "0, GPU-a, 81559\n"
           "1, GPU-b, [N/A]\n"  # MIG mode or no memory report
           "2, GPU-c, 40960.0\n"
           "3, GPU-d, 1.2.3\n"
           "No devices were found\n"
           "4, GPU-e\n")
    assert gs.parse_nvidia_smi(out) == [("0", "GPU-a", 81559), ("1", "GPU-b", 0), ("2", "GPU-c", 40960),
                                        ("3", "GPU-d", 0)]


# -- torch in a child process -------------------------------------------------------------------
def test_torch_probe_asks_a_child_interpreter(tmp_path, monkeypatch):
    fake = _executable(tmp_path / "python", """import sys
if sys.argv[1] != "-c" or "get_device_properties" not in sys.argv[2] or "total_memory" not in sys.argv[2]:
    sys.exit("unexpected arguments")
print("81559 40960")
""")
    monkeypatch.setattr(sys, "executable", str(fake))
    assert gs.torch_probe() == [81559, 40960]
    _executable(fake, "import sys\nprint('81559')\nsys.exit(1)\n")
    assert gs.torch_probe() is None  # a child that fails is no answer, whatever it printed
    _executable(fake, "import time\ntime.sleep(3)\n")
    monkeypatch.setattr(gs.subprocess, "run", _with_timeout_cap(gs.subprocess.run, 0.5))
    assert gs.torch_probe() is None  # a child that hangs past the timeout: no answer


def test_torch_probe_of_this_machine_sees_no_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert gs.torch_probe() == []


def test_visible_gpus_from_the_torch_probe_and_from_os_environ(monkeypatch):
    assert gs.visible_gpus({}, smi=lambda: None, probe=lambda: [16000, 0]) == [gs.Gpu("0", 16000), gs.Gpu("1", None)]
    assert gs.visible_gpus({}, smi=lambda: None, probe=lambda: None) == []
    monkeypatch.setenv(gs.ENV_GPUS, "4,5")
    monkeypatch.setenv(gs.ENV_GPU_MEM_MB, "24000")
    assert gs.visible_gpus() == [gs.Gpu("4", 24000), gs.Gpu("5", 24000)]
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_JOB_GPUS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_STEP_GPUS", raising=False)
    assert gs.slurm_assigned() == ["2"]


@pytest.mark.parametrize("text", ["", "  ", "-1", "none", "NoDevFiles"])
def test_no_device_spellings(text):
    assert gs._ids(text) == []


def test_device_ids_are_trimmed():
    assert gs._ids(" 0, 1 ,,2 ") == ["0", "1", "2"]


# -- who holds what ---------------------------------------------------------------------------------
def test_start_time_is_the_processes_start_in_clock_ticks_since_boot():
    btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                 if line.startswith("btime"))
    before = time.time()
    started = float(gs._start_time(os.getpid())) / os.sysconf("SC_CLK_TCK") + btime
    assert started <= before + 1  # this process started before now, and since boot
    assert gs._start_time(2**22 + 12345) is None  # no such process


def test_start_time_survives_a_process_name_with_parentheses_and_spaces(tmp_path):
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "try:\n"
        "    open('/proc/self/comm', 'w').write('a) b) c')\n"
        "    print('ready', flush=True)\n"
        "except OSError:\n"
        "    print('no comm', flush=True)\n"
        "time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    try:
        if child.stdout.readline().strip() != "ready":
            pytest.skip("this system does not let a process rename itself (/proc/self/comm)")
        assert "(a) b) c)" in Path(f"/proc/{child.pid}/stat").read_text()
        parent = float(gs._start_time(os.getpid()))
        mine = float(gs._start_time(child.pid))
        assert parent <= mine < parent + 100 * os.sysconf("SC_CLK_TCK") * 3600
        assert gs.alive(child.pid, gs._start_time(child.pid))
    finally:
        child.kill()
        child.wait()
    assert not gs.alive(child.pid)


def test_alive_tells_a_reused_pid_apart():
    me = os.getpid()
    assert gs.alive(me) and gs.alive(me, gs._start_time(me))
    assert not gs.alive(me, "1")


def test_devices_equally_busy_go_to_the_one_with_less_memory_declared():
    gpus = [gs.Gpu("0", 80000), gs.Gpu("1", 80000)]
    claims = [gs.Claim(("0",), 30000, 1), gs.Claim(("1",), 10000, 2)]
    assert gs.choose_devices(gpus, claims, 1, 10000) == ["1"]
    assert gs.choose_devices(gpus, claims[::-1], 1, 10000) == ["1"]


def test_a_request_of_exactly_a_device_s_memory_fits_and_the_refusal_names_the_devices(tmp_path):
    gpus = [gs.Gpu("0", 16000), gs.Gpu("1")]
    gs.check_request(gpus[:1], 1, 16000)  # fits exactly
    with pytest.raises(InputError, match=r"\(0 \(16000 MB\), 1\)"):
        gs.check_request(gpus, 3, None)
    with pytest.raises(InputError, match=r"gpu_mem_mb=16001 per GPU, more than 2 of this machine's GPUs have "
                                         r"\(0 \(16000 MB\), 1\)"):
        gs.check_request(gpus, 2, 16001)


def test_lock_folders_per_host_and_slurm_allocation(monkeypatch):
    import socket

    assert gs.default_lock_dir() == Path("/tmp") / f"fedrepro-gpu-slots-{os.getuid()}"
    host = socket.gethostname()
    assert gs.lock_dir_for({}) == gs.default_lock_dir() / host
    assert gs.lock_dir_for({"SLURM_JOB_ID": "12"}) == gs.default_lock_dir() / f"{host}-slurm12"
    assert gs.lock_dir_for({gs.ENV_LOCK_DIR: "/x", "SLURM_JOB_ID": "12"}) == Path("/x") / f"{host}-slurm12"
    monkeypatch.setenv(gs.ENV_LOCK_DIR, "/y")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert gs.lock_dir_for() == Path("/y") / host
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert gs.lock_dir_for({gs.ENV_LOCK_DIR: "/x"}) == Path("/x/localhost")


def test_live_claims_reads_every_claim_after_an_unreadable_one(tmp_path, caplog):
    me = os.getpid()
    (tmp_path / "claim-0-bad.json").write_text("{not json")
    (tmp_path / "claim-1-ok.json").write_text(json.dumps(
        {"devices": ["1"], "mem_mb": 8000, "pid": me, "started": gs._start_time(me), "label": "train x"}))
    (tmp_path / "claim-2-nolabel.json").write_text(json.dumps({"devices": ["2"], "mem_mb": None, "pid": me}))
    (tmp_path / "claim-3-gone.json").write_text(json.dumps({"devices": ["3"], "mem_mb": None, "pid": me,
                                                            "started": "1", "label": "old job"}))
    with caplog.at_level(logging.INFO, logger="fedrepro.gpu_slots"):
        claims = gs.live_claims(tmp_path)
    assert claims == [gs.Claim(("1",), 8000, me, gs._start_time(me), "train x"), gs.Claim(("2",), None, me, None, "")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claim-1-ok.json", "claim-2-nolabel.json"]
    assert "reclaiming 3 of pid" in caplog.text and "(old job)" in caplog.text


def test_a_slot_releases_once_and_says_what_it_holds(tmp_path):
    lock = tmp_path / "lock"
    slot = gs.claim([gs.Gpu("0", 80000)], mem_mb=20000, lock_dir=lock, timeout_s=0)
    assert slot.mem_mb == 20000 and repr(slot) == "GpuSlot(devices=0, 20000 MB)"
    assert slot.released is False and slot.path.exists()
    slot.release()
    assert slot.released is True and not slot.path.exists()
    other = gs.claim([gs.Gpu("0", 80000)], lock_dir=lock, timeout_s=0)  # the device is free again
    slot.release()  # a second release does nothing: it must not touch the new claim's lock or file
    assert other.path.exists() and repr(other) == "GpuSlot(devices=0, whole)"
    other.release()
    # a claim file someone else removed (a job that took the pid's claim for dead): no error
    gone = gs.claim([gs.Gpu("0", 80000)], lock_dir=lock, timeout_s=0)
    gone.path.unlink()
    gone.release()


def test_a_claim_file_records_the_job(tmp_path):
    lock = tmp_path / "lock"
    slot = gs.claim([gs.Gpu("0", 80000), gs.Gpu("1", 80000)], lock_dir=lock, timeout_s=0)  # count 1
    rec = json.loads(slot.path.read_text())
    assert rec["devices"] == ["0"] and rec["label"] == "" and rec["pid"] == os.getpid()
    assert rec["started"] == gs._start_time(os.getpid()) and abs(rec["time"] - time.time()) < 60
    assert not list(lock.glob("*.tmp"))
    # 0 MB (or less) declared means the whole device
    whole = gs.claim([gs.Gpu("1", 80000)], mem_mb=0, lock_dir=lock, timeout_s=0, label="eval y")
    rec = json.loads(whole.path.read_text())
    assert rec["mem_mb"] is None and whole.mem_mb is None and rec["label"] == "eval y"
    assert gs.claim([gs.Gpu("2", 80000)], mem_mb=1, lock_dir=lock, timeout_s=0).mem_mb == 1


def test_a_waiting_claim_logs_once_whom_it_waits_for_and_gets_the_device_when_freed(tmp_path, caplog):
    lock = tmp_path / "lock"
    gpus = [gs.Gpu("0", 80000)]
    held = gs.claim(gpus, lock_dir=lock, timeout_s=0)
    threading.Timer(0.4, held.release).start()
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="fedrepro.gpu_slots"):
        got = gs.claim(gpus, mem_mb=1000, lock_dir=lock, timeout_s=20, poll_s=0.05)
    waited = time.monotonic() - t0
    assert got.devices == ("0",) and 0.3 < waited < 5
    waits = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert waits == [f"GPU slots: waiting for 1 GPU(s) (1000 MB): busy 0: pid {os.getpid()} (whole)"]
    assert any("GPU slots: got 0 after" in r.getMessage() for r in caplog.records)
    got.release()
    # two holders: the log names each, its devices and what it declared
    two = [gs.Gpu("0", 80000), gs.Gpu("1", 80000)]
    a = gs.claim(two[:1], lock_dir=lock, timeout_s=0)
    b = gs.claim(two[1:], mem_mb=70000, lock_dir=lock, timeout_s=0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedrepro.gpu_slots"), pytest.raises(TimeoutError):
        gs.claim(two, lock_dir=lock, timeout_s=0)
    pid = os.getpid()
    assert f"busy 0: pid {pid} (whole); 1: pid {pid} (70000 MB)" in caplog.text
    a.release(), b.release()
    pair = gs.claim(two, count=2, lock_dir=lock, timeout_s=0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedrepro.gpu_slots"), pytest.raises(TimeoutError):
        gs.claim(two, lock_dir=lock, timeout_s=0)
    assert f"busy 0,1: pid {pid} (whole)" in caplog.text
    pair.release()
    # nothing frees it: the claim gives up after its timeout, not before
    held = gs.claim(gpus, lock_dir=lock, timeout_s=0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no 1 GPU\(s\) free \(whole\) within 0.3 s"):
        gs.claim(gpus, lock_dir=lock, timeout_s=0.3, poll_s=0.05)
    assert 0.3 <= time.monotonic() - t0 < 5
    held.release()


# -- the job's side ---------------------------------------------------------------------------------
def test_resources_from_snakemake_s_object_or_a_mapping():
    res = types.SimpleNamespace(gpu=2, gpu_mem_mb="")
    assert gs._resource(res, "gpu") == 2 and gs._resource(res, "gpu_mem_mb") == 0
    assert gs._resource(res, "absent", 7) == 7 and gs._resource(None, "gpu") == 0
    assert gs._resource({"gpu": None}, "gpu", 3) == 3 and gs._resource({}, "gpu") == 0


def test_cuda_initialised_reads_torch_without_importing_it(monkeypatch):
    assert gs._cuda_initialised() is (torch.cuda.is_initialized())
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert gs._cuda_initialised() is True

    def broken():
        raise RuntimeError("half-imported")

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=broken)))
    assert gs._cuda_initialised() is False
    monkeypatch.delitem(sys.modules, "torch")
    assert gs._cuda_initialised() is False


def test_claim_job_gpus_end_to_end_with_snakemake_resources(tmp_path, monkeypatch, caplog):
    registered = []
    monkeypatch.setattr(gs.atexit, "register", registered.append)
    monkeypatch.setattr(gs, "_cuda_initialised", lambda: True)
    env = {gs.ENV_LOCK_DIR: str(tmp_path)}  # no ids named: nvidia-smi decides
    smi = lambda: [("0", "GPU-a", 81559), ("1", "GPU-b", 81559)]  # noqa: E731
    res = types.SimpleNamespace(gpu=1, gpu_mem_mb=8000)
    with caplog.at_level(logging.INFO, logger="fedrepro.gpu_slots"):
        slot = gs.claim_job_gpus(res, env=env, label="train_cell logs/a.log", timeout_s=0, smi=smi,
                                 probe=lambda: pytest.fail("torch asked"))
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and slot.mem_mb == 8000
    assert json.loads(slot.path.read_text())["label"] == "train_cell logs/a.log"
    assert registered == [slot.release]  # released when the process exits
    assert "CUDA was initialised before the claim" in caplog.text
    assert "train_cell logs/a.log -> CUDA_VISIBLE_DEVICES=0 (of 0,1)" in caplog.text
    slot.release()
    # a job's default: one whole device, released at exit; the poll interval reaches the wait
    env2 = {gs.ENV_LOCK_DIR: str(tmp_path), gs.ENV_GPUS: "0"}
    first = gs.claim_job_gpus({"gpu": 1}, env=env2, timeout_s=0)
    assert first.mem_mb is None and registered[-1] == first.release
    assert json.loads(first.path.read_text())["label"] == ""
    threading.Timer(0.3, first.release).start()
    t0 = time.monotonic()
    second = gs.claim_job_gpus({"gpu": 1}, env=dict(env2), timeout_s=20, poll_s=0.05)
    assert second.devices == ("0",) and time.monotonic() - t0 < 3  # polled at 0.05 s, not 5 s
    second.release()


def test_claim_job_gpus_asks_torch_where_nvidia_smi_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(gs.atexit, "register", lambda f: None)
    env = {gs.ENV_LOCK_DIR: str(tmp_path)}
    slot = gs.claim_job_gpus({"gpu": 1, "gpu_mem_mb": 8000}, env=env, timeout_s=0, smi=lambda: None,
                             probe=lambda: [16000])
    assert slot.devices == ("0",) and env["CUDA_VISIBLE_DEVICES"] == "0"
    slot.release()
    # a device of 16,000 MB cannot take 20,000 (the probed memory reached the check)
    with pytest.raises(InputError, match="gpu_mem_mb=20000"):
        gs.claim_job_gpus({"gpu": 1, "gpu_mem_mb": 20000}, env={gs.ENV_LOCK_DIR: str(tmp_path)}, timeout_s=0,
                          smi=lambda: None,
                          probe=lambda: [16000])


def test_job_label_names_the_rule_and_its_log():
    assert gs.job_label(types.SimpleNamespace(rule="train_cell", log=["logs/a.log", "logs/b.log"])) == (
        "train_cell logs/a.log")
    assert gs.job_label(types.SimpleNamespace(rule="x", log=[])) == ""
    assert gs.job_label(object()) == ""
