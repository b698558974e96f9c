"""One job per GPU, or several when their declared memory fits: a lock-file slot allocator.

Without it every cell job on an N-GPU machine opens ``cuda`` -- GPU 0 -- and the other N-1 idle.
A job that asked for GPUs (the rule's ``gpu`` resource, and optionally ``gpu_mem_mb``: the GPU
memory it needs on each device; 0 or absent = a whole device) calls :func:`claim_job_gpus` at the
start of its script, before anything touches CUDA.  That claims devices under a lock shared by
every job on the machine and sets ``CUDA_VISIBLE_DEVICES`` to them, so ``torch`` sees only its own
device(s) as ``cuda:0``...; the claim is released when the job's process exits.

Which devices (:func:`visible_gpus`), first match wins:

* ``FEDREPRO_GPUS`` -- ids as ``CUDA_VISIBLE_DEVICES`` takes them (``0,1,2,3``; empty = none;
  MIG slices by their ``MIG-...`` UUIDs from ``nvidia-smi -L``, with ``FEDREPRO_GPU_MEM_MB``);
* ``CUDA_VISIBLE_DEVICES`` as the job inherited it from Snakemake (empty or ``-1`` = none);
* ``nvidia-smi`` (indices, UUIDs and total memory; no CUDA initialised in this process);
* ``torch`` in a child process (``device_count`` and ``get_device_properties``): a child, because
  once this process initialised CUDA, ``CUDA_VISIBLE_DEVICES`` could no longer be changed.

No device found: nothing happens (a CPU-only machine, the demo).  Each device's memory comes from
``FEDREPRO_GPU_MEM_MB`` (one number for all, or one per device) or from the probe; a device of
unknown memory is only ever given whole.

How jobs share (:func:`choose_devices`): a job asking for a whole device gets an idle one; a job
declaring ``gpu_mem_mb`` goes where the declared memory of the jobs already there plus its own
fits the device's, never beside a whole-device job.  Among the devices that fit, the least used
first (fewest jobs, then least memory declared): four small jobs on four GPUs get one each, the
fifth shares.  A job that does not fit now waits (polling, logged once) until a claim is released;
a request that could never fit (more GPUs than the machine has, more memory than a device) fails
at once.

The claims live in a lock directory (``FEDREPRO_GPU_LOCK_DIR``, default
``/tmp/fedrepro-gpu-slots-<uid>``: node-local, so ``flock`` works and every checkout of the
project on the machine shares it), one subfolder per host (per host and SLURM allocation inside
one): ``claims.lock`` is ``flock``-ed while a job reads the claims and writes its own,
``claim-<pid>-<n>.json`` (devices, declared memory, pid and the pid's start time).  A claim whose
process is gone (killed, crashed: no ``atexit``) is removed by the next job that looks.

SLURM (docs/cluster.md): a job that SLURM gave its own GPUs (``SLURM_JOB_ID`` with
``CUDA_VISIBLE_DEVICES``/``SLURM_JOB_GPUS``/``SLURM_STEP_GPUS``, no more devices than the job asked
for -- what ``sbatch --gpus`` of the executor plugin does) is left alone: the scheduler assigned
them.  Inside one allocation holding more GPUs than the job asked for (``snakemake --cores all``
in an ``salloc --gpus 4`` shell) the jobs divide the allocation's devices among themselves, under
a lock folder of that allocation.  A SLURM job that asked for a GPU and got none is left alone too
(logged): it must not take a device the scheduler did not give it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import json
import logging
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from fedrepro.io import InputError

log = logging.getLogger(__name__)

ENV_GPUS = "FEDREPRO_GPUS"
ENV_GPU_MEM_MB = "FEDREPRO_GPU_MEM_MB"
ENV_LOCK_DIR = "FEDREPRO_GPU_LOCK_DIR"
SLURM_GPU_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
LOCK_FILE = "claims.lock"
POLL_S = 5.0

_counter = itertools.count()


@dataclass(frozen=True)
class Gpu:
    """One device: ``id`` as ``CUDA_VISIBLE_DEVICES`` takes it, ``mem_mb`` its memory (None:
    unknown; from nvidia-smi in MiB, so a declared ``gpu_mem_mb`` in MB errs on the safe side)."""

    id: str
    mem_mb: int | None = None


@dataclass(frozen=True)
class Claim:
    """A job's hold on ``devices``: ``mem_mb`` declared per device (None: the whole device)."""

    devices: tuple[str, ...]
    mem_mb: int | None
    pid: int
    started: str | None = None
    label: str = ""


# -- which devices ---------------------------------------------------------------------------------
def _ids(text: str) -> list[str]:
    text = text.strip()
    if text in ("", "-1", "none", "NoDevFiles"):
        return []
    return [t.strip() for t in text.split(",") if t.strip()]


def nvidia_smi() -> list[tuple[str, str, int]] | None:
    """``(index, uuid, memory MB)`` of every GPU ``nvidia-smi`` lists; None without nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out)


def parse_nvidia_smi(out: str) -> list[tuple[str, str, int]]:
    rows = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            mem = int(float(parts[2])) if parts[2].replace(".", "", 1).isdigit() else 0
            rows.append((parts[0], parts[1], mem))
    return rows


_TORCH_PROBE = (
    "import torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "mem = [torch.cuda.get_device_properties(i).total_memory // 2**20 for i in range(n)]\n"
    "print(' '.join(map(str, mem)))\n"
)


def torch_probe() -> list[int] | None:
    """Memory (MiB) of each device ``torch`` sees, asked in a child process (this one must not
    initialise CUDA before ``CUDA_VISIBLE_DEVICES`` is set); None if the child fails."""
    try:
        out = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True,
                             timeout=120, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [int(x) for x in out.split()]


def _memory_override(env: Mapping[str, str], n: int) -> list[int | None] | None:
    text = env.get(ENV_GPU_MEM_MB, "").strip()
    if not text:
        return None
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise InputError(f"{ENV_GPU_MEM_MB}={text!r}: give one memory size in MB, or one per "
                         f"device (comma-separated)") from None
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise InputError(f"{ENV_GPU_MEM_MB}={text!r} gives {len(values)} sizes for {n} devices; "
                         f"give one for all or one per device")
    return values


def visible_gpus(env: Mapping[str, str] | None = None,
                 smi: Callable[[], list[tuple[str, str, int]] | None] = nvidia_smi,
                 probe: Callable[[], list[int] | None] = torch_probe) -> list[Gpu]:
    """The devices this job may be given (see the module docstring for the order)."""
    env = os.environ if env is None else env
    smi_rows: list[tuple[str, str, int]] | None = None
    probed: list[int] | None = None
    if ENV_GPUS in env:
        ids = _ids(env[ENV_GPUS])
    elif "CUDA_VISIBLE_DEVICES" in env:
        ids = _ids(env["CUDA_VISIBLE_DEVICES"])
    else:
        smi_rows = smi()
        if smi_rows is None:
            probed = probe() or []
            ids = [str(i) for i in range(len(probed))]
        else:
            ids = [index for index, _, _ in smi_rows]
    if not ids:
        return []
    override = _memory_override(env, len(ids))
    if override is not None:
        return [Gpu(i, m) for i, m in zip(ids, override, strict=True)]
    if probed is not None:
        return [Gpu(i, m or None) for i, m in zip(ids, probed, strict=True)]
    if smi_rows is None:
        smi_rows = smi() or []
    by_key = {key: mem for index, uuid, mem in smi_rows for key in (index, uuid)}
    return [Gpu(i, by_key.get(i) or None) for i in ids]


def slurm_assigned(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPUs SLURM gave this job ([] for none), or None outside a SLURM job."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return None
    for var in SLURM_GPU_VARS:
        if var in env:
            return _ids(env[var])
    return []


# -- who holds what -----------------------------------------------------------------------------
def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot) from /proc: tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int, started: str | None = None) -> bool:
    """Is ``pid`` running (and, when ``started`` is known, still the process that claimed)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if started is None:
        return True
    now = _start_time(pid)
    return now is None or now == started


def _fits(gpu: Gpu, held: Sequence[Claim], mem_mb: int | None) -> bool:
    if any(c.mem_mb is None for c in held):
        return False  # someone holds it whole
    if mem_mb is None or gpu.mem_mb is None:
        return not held  # a whole device, or a device whose memory nobody knows: only if idle
    return sum(c.mem_mb or 0 for c in held) + mem_mb <= gpu.mem_mb


def check_request(gpus: Sequence[Gpu], count: int, mem_mb: int | None) -> None:
    """Raise :class:`InputError` for a request no state of the machine could satisfy."""
    names = ", ".join(g.id + (f" ({g.mem_mb} MB)" if g.mem_mb else "") for g in gpus)
    if count > len(gpus):
        raise InputError(f"the job asks for {count} GPUs but this machine has {len(gpus)} "
                         f"({names}); lower the rule's `gpu` resource (backbones.<name>.resources)")
    if mem_mb is not None and sum(g.mem_mb is None or mem_mb <= g.mem_mb for g in gpus) < count:
        raise InputError(f"the job declares gpu_mem_mb={mem_mb} per GPU, more than {count} of "
                         f"this machine's GPUs have ({names}); lower gpu_mem_mb "
                         f"(backbones.<name>.resources.<job>.gpu_mem_mb) or use a larger GPU")


def choose_devices(gpus: Sequence[Gpu], claims: Iterable[Claim], count: int,
                   mem_mb: int | None) -> list[str] | None:
    """The ``count`` devices a new job gets, or None when they are not free now.

    Pure: ``claims`` are the live claims.  Least used first (jobs, then declared memory, then the
    order of ``gpus``), so jobs spread before they share.
    """
    held: dict[str, list[Claim]] = {g.id: [] for g in gpus}
    for c in claims:
        for d in c.devices:
            if d in held:
                held[d].append(c)
    free = [g for g in gpus if _fits(g, held[g.id], mem_mb)]
    if len(free) < count:
        return None
    order = {g.id: i for i, g in enumerate(gpus)}
    free.sort(key=lambda g: (len(held[g.id]), sum(c.mem_mb or 0 for c in held[g.id]), order[g.id]))
    return [g.id for g in free[:count]]


def default_lock_dir() -> Path:
    base = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    return base / f"fedrepro-gpu-slots-{os.getuid()}"


def lock_dir_for(env: Mapping[str, str] | None = None) -> Path:
    """This machine's (or SLURM allocation's) claims folder under ``FEDREPRO_GPU_LOCK_DIR``."""
    env = os.environ if env is None else env
    root = Path(env[ENV_LOCK_DIR]) if env.get(ENV_LOCK_DIR) else default_lock_dir()
    scope = socket.gethostname() or "localhost"
    if env.get("SLURM_JOB_ID"):
        scope += f"-slurm{env['SLURM_JOB_ID']}"
    return root / scope


@contextlib.contextmanager
def _locked(lock_dir: Path):
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / LOCK_FILE, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def live_claims(lock_dir: Path) -> list[Claim]:
    """The claims in ``lock_dir`` whose process still runs; the others' files are removed.
    Call with the lock held."""
    out = []
    for path in sorted(lock_dir.glob("claim-*.json")):
        try:
            rec = json.loads(path.read_text())
            claim = Claim(tuple(rec["devices"]), rec["mem_mb"], int(rec["pid"]),
                          rec.get("started"), rec.get("label", ""))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("GPU slots: removing unreadable claim %s (%s)", path, exc)
            path.unlink(missing_ok=True)
            continue
        if alive(claim.pid, claim.started):
            out.append(claim)
        else:
            log.info("GPU slots: reclaiming %s of pid %d (%s), which is gone",
                     ",".join(claim.devices), claim.pid, claim.label or "no label")
            path.unlink(missing_ok=True)
    return out


class GpuSlot:
    """A held claim: ``devices`` (ids for ``CUDA_VISIBLE_DEVICES``); :meth:`release` (also on
    leaving a ``with`` block) removes it.  Made by :func:`claim`."""

    def __init__(self, devices: Sequence[str], mem_mb: int | None, path: Path, lock_dir: Path):
        self.devices = tuple(devices)
        self.mem_mb = mem_mb
        self.path = path
        self.lock_dir = lock_dir
        self.released = False

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.devices)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        with _locked(self.lock_dir):
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"GpuSlot(devices={self.cuda_visible_devices}, {_what(self.mem_mb)})"


def _what(mem_mb: int | None) -> str:
    return "whole" if mem_mb is None else f"{mem_mb} MB"


def claim(gpus: Sequence[Gpu], count: int = 1, mem_mb: int | None = None, *,
          lock_dir: Path, label: str = "", timeout_s: float | None = None,
          poll_s: float = POLL_S) -> GpuSlot:
    """Claim ``count`` of ``gpus`` (``mem_mb`` each; None = whole devices), waiting while they are
    busy; :class:`TimeoutError` after ``timeout_s`` (None: wait as long as it takes)."""
    count = int(count)
    if count < 1:
        raise InputError(f"a GPU claim needs count >= 1, got {count}")
    if mem_mb is not None and int(mem_mb) <= 0:
        mem_mb = None
    mem_mb = None if mem_mb is None else int(mem_mb)
    check_request(gpus, count, mem_mb)
    lock_dir = Path(lock_dir)
    pid = os.getpid()
    t0 = time.monotonic()
    waited = False
    while True:
        with _locked(lock_dir):
            claims = live_claims(lock_dir)
            devices = choose_devices(gpus, claims, count, mem_mb)
            if devices is not None:
                path = lock_dir / f"claim-{pid}-{next(_counter)}.json"
                record = {"devices": devices, "mem_mb": mem_mb, "pid": pid,
                          "started": _start_time(pid), "label": label, "time": time.time()}
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(record))
                tmp.replace(path)
                if waited:
                    log.info("GPU slots: got %s after %.0f s", ",".join(devices),
                             time.monotonic() - t0)
                return GpuSlot(devices, mem_mb, path, lock_dir)
        if not waited:
            busy = "; ".join(f"{','.join(c.devices)}: pid {c.pid} ({_what(c.mem_mb)})"
                             for c in claims)
            log.info("GPU slots: waiting for %d GPU(s) (%s): busy %s", count, _what(mem_mb),
                     busy or "-")
            waited = True
        if timeout_s is not None and time.monotonic() - t0 >= timeout_s:
            raise TimeoutError(f"no {count} GPU(s) free ({_what(mem_mb)}) within {timeout_s} s "
                               f"(claims in {lock_dir})")
        time.sleep(poll_s * (0.5 + random.random()))


def _resource(resources, name: str, default=0):
    if resources is None:
        return default
    if isinstance(resources, Mapping):
        value = resources.get(name, default)
    else:
        value = getattr(resources, name, default)
    return default if value in (None, "") else value


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported torch: assume not
        return False


def claim_job_gpus(resources, *, env: MutableMapping[str, str] | None = None,
                   label: str = "", timeout_s: float | None = None,
                   poll_s: float = POLL_S, smi=nvidia_smi, probe=torch_probe,
                   release_at_exit: bool = True) -> GpuSlot | None:
    """Give this job its GPU(s): claim them and set ``CUDA_VISIBLE_DEVICES`` in ``env``.

    ``resources``: the job's Snakemake resources (``snakemake.resources``) or a mapping with
    ``gpu`` (count) and ``gpu_mem_mb`` (per device; 0/absent = whole devices).  Returns the slot,
    released when the process exits (``release_at_exit``), or None when there is nothing to do: no
    GPU asked for, none on the machine, or SLURM assigned them (module docstring).  Call it before
    anything initialises CUDA.
    """
    env = os.environ if env is None else env
    count = int(_resource(resources, "gpu", 0) or 0)
    if count <= 0:
        return None
    mem_mb = int(_resource(resources, "gpu_mem_mb", 0) or 0) or None
    assigned = slurm_assigned(env)
    if assigned is not None and len(assigned) <= count:
        if assigned:
            log.info("GPU slots: SLURM assigned %s to job %s; using them as they are",
                     ",".join(assigned), env.get("SLURM_JOB_ID"))
        else:
            log.warning("GPU slots: the job asks for %d GPU(s) but SLURM job %s was given none "
                        "(no CUDA_VISIBLE_DEVICES/SLURM_JOB_GPUS); check the profile's gpu/gres",
                        count, env.get("SLURM_JOB_ID"))
        return None
    gpus = visible_gpus(env, smi=smi, probe=probe)
    if not gpus:
        log.info("GPU slots: the job asks for %d GPU(s) but none is visible; nothing to assign",
                 count)
        return None
    if _cuda_initialised():
        log.warning("GPU slots: CUDA was initialised before the claim; CUDA_VISIBLE_DEVICES "
                    "cannot take effect in this process")
    slot = claim(gpus, count, mem_mb, lock_dir=lock_dir_for(env), label=label,
                 timeout_s=timeout_s, poll_s=poll_s)
    env["CUDA_VISIBLE_DEVICES"] = slot.cuda_visible_devices
    # nvidia-smi numbers devices by PCI bus; make CUDA number them the same way
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if release_at_exit:
        atexit.register(slot.release)
    log.info("GPU slots: %s -> CUDA_VISIBLE_DEVICES=%s (of %s)", label or "job",
             slot.cuda_visible_devices, ",".join(g.id for g in gpus))
    return slot


def job_label(snakemake) -> str:
    """A claim's label: the job's rule and log file (what a waiting job's log names)."""
    try:
        return f"{snakemake.rule} {snakemake.log[0]}"
    except (AttributeError, IndexError):
        return ""
