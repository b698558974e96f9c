"""Kill a training process at a chosen or random moment, rerun it, compare whole outputs (issue 17).

A job (``fedrepro.fl.cell:run_cell`` with its arguments, or a paper's row function) runs in a
child Python process in its own session, in a working folder of its own, with the cell's
``out_dir`` relative to it -- so a reference run and a killed-and-rerun run write the same
relative paths and :func:`compare_results.compare` can compare the two trees (``provenance.json``
without its times and commit).

Faults (:func:`kill_and_rerun`):

* ``start``: SIGKILL once the cell has written ``checkpoints/cell_config.json`` and before its
  first round checkpoint (a round of these tiny cells takes ~0.1-2 s; the poll is every 5 ms);
* ``after_round``: SIGKILL ``delay`` seconds after round ``nth``'s checkpoint appeared (mid-round);
* ``random``: SIGKILL at a seeded uniform time after the job's first cell started (its checkpoint
  stamp), within 1.1 x the cells' training time in the reference run (the start-up of Python,
  torch and Flower, longer than these tiny cells' training, is left out);
* ``write``: the child kills itself *inside* an atomic write: at the ``nth`` ``os.replace`` onto a
  path containing ``match`` it truncates the temporary file to half (a torn write) and sends
  itself SIGKILL before the rename -- a real checkpoint write at a time a poll from outside
  cannot hit reliably.  The hook lives only in the child's bootstrap code below (the env var
  ``FEDREPRO_TEST_FAULT``); nothing in ``src/`` knows about it.

Every child records the paths it renamed into place (``FEDREPRO_TEST_WRITES``), from which
:func:`trained_rounds` reads the rounds a process checkpointed: a rerun that trains only the rounds
after the last finished one proves no finished round (or run) was retrained.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from compare_results import compare

BOOT = r"""
import importlib, json, logging, os, signal, sys
logging.basicConfig(level=logging.INFO)
_writes = open(os.environ["FEDREPRO_TEST_WRITES"], "a", buffering=1)
_fault = json.loads(os.environ.get("FEDREPRO_TEST_FAULT") or "null")
_replace, _seen = os.replace, [0]

def _hooked(src, dst, *args, **kwargs):
    if _fault and _fault["match"] in os.path.abspath(str(dst)):
        _seen[0] += 1
        if _seen[0] == _fault["nth"]:
            os.truncate(src, os.path.getsize(src) // 2)  # a torn write, then death before rename
            os.kill(os.getpid(), signal.SIGKILL)
    out = _replace(src, dst, *args, **kwargs)
    _writes.write(os.path.abspath(str(dst)) + "\n")
    return out

os.replace = _hooked
job = json.loads(open(sys.argv[1]).read())
module, name = job["call"].split(":")
getattr(importlib.import_module(module), name)(*job["args"])
"""

ROUND_FILE = re.compile(r"/checkpoints/server_round_(\d+)\.json$")


def start(workdir: Path, call: str, args: list, tag: str, fault: dict | None = None) -> subprocess.Popen:
    """Start ``call(*args)`` (``"module:function"``) in a child process with cwd ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    job = workdir / f"{tag}.job.json"
    job.write_text(json.dumps({"call": call, "args": args}))
    env = {**os.environ, "FEDREPRO_TEST_WRITES": str(workdir / f"{tag}.writes")}
    env.pop("FEDREPRO_TEST_FAULT", None)
    if fault:
        env["FEDREPRO_TEST_FAULT"] = json.dumps(fault)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parent), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(
        [sys.executable, "-c", BOOT, str(job)], cwd=workdir, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=open(workdir / f"{tag}.err", "w"),
    )


def finish(proc: subprocess.Popen, workdir: Path, tag: str, timeout: float = 300) -> float:
    """Wait for a child; fail with its log tail unless it exited 0.  Returns its wall time."""
    t0 = time.monotonic()
    rc = proc.wait(timeout=timeout)
    assert rc == 0, f"{tag} exited {rc}:\n" + (workdir / f"{tag}.err").read_text()[-4000:]
    return time.monotonic() - t0


def run(workdir: Path, call: str, args: list, tag: str = "reference") -> float:
    t0 = time.monotonic()
    finish(start(workdir, call, args, tag), workdir, tag)
    return time.monotonic() - t0


def writes(workdir: Path, tag: str) -> list[str]:
    path = workdir / f"{tag}.writes"
    return path.read_text().splitlines() if path.exists() else []


def trained_rounds(workdir: Path, tag: str, out_dir: str = "") -> list[int]:
    """Rounds whose checkpoint the process ``tag`` wrote (under ``out_dir`` when given)."""
    out = []
    for p in writes(workdir, tag):
        m = ROUND_FILE.search(p)
        if m and (not out_dir or f"/{out_dir.strip('/')}/checkpoints/" in p):
            out.append(int(m[1]))
    return out


def read_json_file(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def state_at_kill(workdir: Path, out_dir: str) -> dict:
    """What a cell had on disk when its job died: ``rounds`` complete (as the runner reads them),
    ``trained`` (a row job's receipt of its training stage, :mod:`fedrepro.fl.rows`) and
    ``outputs`` (its final adapters written: killed after the run, before the process ended --
    Snakemake deletes them and the run is redone)."""
    from fedrepro.fl.checkpoint import latest_round
    from fedrepro.fl.rows import receipt_dir

    trained = (receipt_dir({"out_dir": str(workdir / out_dir)}) / "stage_0.json").exists()
    return {"rounds": latest_round(workdir / out_dir), "trained": trained,
            "outputs": (workdir / out_dir / "adapters.safetensors").exists()}


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def fault_plan(kind: str, seed: int, rounds: int, reference_s: float, writes_per_round: int = 0,
               round_s: float | None = None) -> dict:
    """The seeded parameters of a fault of ``kind`` (see :func:`kill_and_rerun`);
    ``writes_per_round``: files a round writes under ``<cell>/clients/`` (0: none, the ``write``
    fault then always hits a server checkpoint); ``round_s``: a round's time in the reference run
    (``after_round`` kills within the next round)."""
    rng = random.Random(f"{kind}/{seed}")
    if kind == "start":
        return {}
    if kind == "after_round":  # a seeded moment inside one of the rounds after the first
        return {"nth": rng.randint(1, rounds - 1),
                "delay": rng.uniform(0.0, 0.9) * (round_s or reference_s / (rounds + 2))}
    if kind == "random":  # reference_s: here the cells' training time in the reference run
        return {"at": rng.uniform(0.0, 1.0) * reference_s}
    if kind == "write":  # inside the nth checkpoint write (server round file or a client's state)
        if seed % 2 == 0 or not writes_per_round:
            return {"match": "/checkpoints/server_round_", "nth": rng.randint(1, 2 * rounds)}
        return {"match": "/clients/", "nth": rng.randint(1, rounds * writes_per_round)}
    raise ValueError(kind)


def kill_and_rerun(workdir: Path, call: str, args: list, out_dirs: list[str], kind: str, *,
                   nth: int = 1, match: str = "/checkpoints/server_round_", delay: float = 0.0,
                   at: float = 1.0, timeout: float = 240) -> dict:
    """Run the job in ``workdir``, kill it as ``kind`` says (module docstring), rerun it to the end.

    Returns ``{"killed_rc", "at_kill": {out_dir: state_at_kill}, "rerun": {out_dir: rounds the
    rerun checkpointed}}``; ``rerun`` is ``None`` when the job had finished before the kill
    (Snakemake would not run it again)."""
    ckpt = workdir / out_dirs[0] / "checkpoints"
    fault = {"match": match, "nth": nth} if kind == "write" else None
    ran_s = None
    proc = start(workdir, call, args, "killed", fault)
    deadline = time.monotonic() + timeout
    if kind == "start":
        while not (ckpt / "cell_config.json").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the cell never started"
            time.sleep(0.005)
        _kill(proc)
    elif kind == "after_round":
        target = ckpt / f"server_round_{nth:03d}.json"
        while not target.exists() and proc.poll() is None:
            assert time.monotonic() < deadline, f"round {nth} never finished"
            time.sleep(0.005)
        time.sleep(delay)
        _kill(proc)
    elif kind == "random":
        while not (ckpt / "cell_config.json").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the cell never started"
            time.sleep(0.005)
        t0 = time.monotonic()
        try:
            proc.wait(timeout=at)
        except subprocess.TimeoutExpired:
            pass
        ran_s = time.monotonic() - t0
        _kill(proc)
    elif kind == "write":
        proc.wait(timeout=timeout)
        assert proc.returncode == -signal.SIGKILL, (
            f"the write fault did not fire (rc {proc.returncode}):\n"
            + (workdir / "killed.err").read_text()[-3000:])
    else:
        raise ValueError(kind)
    at_kill = {d: state_at_kill(workdir, d) for d in out_dirs}
    if proc.returncode == 0:  # finished before the kill: nothing to rerun (see check_kill_and_rerun)
        return {"killed_rc": 0, "at_kill": at_kill, "rerun": None, "ran_s": ran_s}
    assert proc.returncode == -signal.SIGKILL, (workdir / "killed.err").read_text()[-3000:]
    finish(start(workdir, call, args, "rerun"), workdir, "rerun", timeout)
    return {"killed_rc": proc.returncode, "at_kill": at_kill,
            "rerun": {d: trained_rounds(workdir, "rerun", d) for d in out_dirs}}


def assert_same_tree(reference: Path, other: Path) -> None:
    """Every file of one tree is in the other, byte-identical (provenance: without its times)."""
    diffs = compare(reference, other)
    assert diffs == [], diffs


def cell_job(cell: dict, out_dir: str = "out") -> tuple[str, list]:
    """``run_cell`` of ``cell`` writing into ``out_dir`` (relative to the child's working folder)."""
    cell = dict(cell, out_dir=out_dir)
    return "fedrepro.fl.cell:run_cell", [
        cell, f"{out_dir}/adapters.safetensors", f"{out_dir}/train_log.json", f"{out_dir}/provenance.json"]


RESEEDS = 2  # re-drawn moments for a kill that came after the job had finished


def _check_state_at_kill(work: Path, kind: str, plan: dict, res: dict, out_dirs: list[str]) -> None:
    """The disk state each cell was killed in is the one the fault aimed at.

    For every kind: the rounds the runner reads as complete are exactly the server checkpoints
    the killed process finished writing (nothing lost, nothing half-written read as complete),
    for each cell whose outputs were not yet written (a finished cell may have cleared them).
    ``start``: no round of the first cell; ``after_round``: at least round ``nth`` of it;
    ``write``: the killed process completed exactly ``nth - 1`` writes onto ``match`` paths (it
    died inside the ``nth``)."""
    for d in out_dirs:
        if res["at_kill"][d]["outputs"]:  # finished: its round checkpoints may be cleared already
            continue
        done = trained_rounds(work, "killed", d)
        assert res["at_kill"][d]["rounds"] == max(done, default=0), (d, done, res["at_kill"][d])
    first = res["at_kill"][out_dirs[0]]
    if kind == "start":
        assert first["rounds"] == 0 and not first["outputs"], first
    elif kind == "after_round":
        assert first["rounds"] >= plan["nth"] and not res["at_kill"][out_dirs[-1]]["outputs"], (plan, first)
    elif kind == "write":
        hits = [p for p in writes(work, "killed") if plan["match"] in p]
        assert len(hits) == plan["nth"] - 1, (plan, hits)


def check_kill_and_rerun(root: Path, job: tuple[str, list], out_dirs: list[str], rounds: int,
                         kind: str, seed: int, reference_s: float, writes_per_round: int = 0) -> dict:
    """Kill ``job`` (a fault of ``kind`` drawn with ``seed``) in a fresh folder under ``root``,
    rerun it, and check that every file of each of ``out_dirs`` (the job's cell folders) equals
    the reference run's (``root/reference``), that nothing else is left there, and that the
    rerun trained no finished round: a cell whose training had finished (its row receipt) is not
    trained again, any other resumes after its last complete round."""
    provenance = [read_json_file(root / "reference" / d / "provenance.json") for d in out_dirs]
    timing = provenance[0]["timing"]["rounds"]
    round_s = sum(t["seconds"] for t in timing) / max(len(timing), 1)
    if kind == "random":  # a moment in the cells' training (the process's start-up excluded)
        reference_s = 1.1 * sum(p["wall_time_s"] for p in provenance)
    plan = fault_plan(kind, seed, rounds, reference_s, writes_per_round, round_s)
    rng = random.Random(f"reseed/{kind}/{seed}")
    for attempt in range(1 + RESEEDS):
        work = root / (f"{kind}-{seed}" if attempt == 0 else f"{kind}-{seed}-reseed{attempt}")
        res = kill_and_rerun(work, *job, out_dirs, kind, **plan)
        late = kind == "after_round" and res["at_kill"][out_dirs[-1]]["outputs"]
        if res["rerun"] is not None and not late:  # after_round aims inside training
            break
        # The job finished before the planned moment (this run was faster than the reference):
        # a kill that did not happen proves nothing, so the moment is re-drawn inside this run.
        if kind == "random" and res.get("ran_s"):
            plan = {"at": rng.uniform(0.0, 0.9) * res["ran_s"]}
        elif kind == "after_round":
            plan = {**plan, "delay": rng.uniform(0.0, 0.5) * plan["delay"]}
        else:
            break
    assert res["rerun"] is not None, (
        f"the {kind} kill (seed {seed}, plan {plan}) never happened: the job finished first "
        f"{1 + RESEEDS} times -- the case tested nothing")
    res["plan"] = plan
    _check_state_at_kill(work, kind, plan, res, out_dirs)
    for out_dir in out_dirs:
        assert_same_tree(root / "reference" / out_dir, work / out_dir)
    for out_dir in out_dirs:
        state = res["at_kill"][out_dir]
        expected = [] if state["trained"] else list(range(state["rounds"] + 1, rounds + 1))
        assert res["rerun"][out_dir] == expected, (out_dir, res)
    report = os.environ.get("FEDREPRO_FAULT_REPORT")  # one JSON line per case, for a summary
    if report:
        with open(report, "a") as fh:
            fh.write(json.dumps({"root": str(root), "kind": kind, "seed": seed, **res,
                                 "identical": True}) + "\n")
    return res
