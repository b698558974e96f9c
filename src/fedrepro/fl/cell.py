"""Run one training cell (paper, method, backbone, setting, seed) end to end.

The paper-specific work (model, client round, what the server starts from, what is evaluated)
lives in the paper's task module, :func:`fedrepro.fl.tasks.task_for`; this module is shared:

* methods without a server (AdaSingle, AdaCentralized, FedMCP's Local): the task's ``run_local``;
* federated methods: Flower with one virtual SuperNode per client, the ServerApp of
  :mod:`fedrepro.fl.server_app` and the ClientApp of :mod:`fedrepro.fl.client_app`, on the
  cell's ``engine``: ``simulation`` (Flower's Ray simulation engine; each run gets its own
  ``FLWR_HOME``, Ray temp dir and CPU budget, so two cells can run at once) or ``inprocess``
  (:class:`fedrepro.fl.engine.InProcessGrid`: the same apps without Ray; same bits; the
  clients' checkpoint files are written in the background while the next client trains, and
  joined before each round checkpoint: :func:`fedrepro.fl.checkpoint.deferred_client_writes`).

Both kinds checkpoint after every round into ``<cell>/checkpoints`` and resume from the last
finished round when rerun (a checkpoint made under a different cell config is discarded).
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import tempfile
import time
from collections import OrderedDict

import torch

from fedrepro.devices import cell_device
from fedrepro.fl.checkpoint import (
    config_hash,
    deferred_client_writes,
    discard_checkpoints,
    latest_round,
    load_state,
    read_failure,
    round_log,
    save_state,
    timing_log,
)
from fedrepro.fl.server_app import make_server_app, run_server, start_point
from fedrepro.fl.strategy import is_measurement, peak_rss_mb
from fedrepro.fl.tasks import task_for
from fedrepro.host_memory import ARENA_ENV
from fedrepro.io import InputError, write_json_atomic
from fedrepro.precision import Precision
from fedrepro.provenance import git_commit, package_versions

log = logging.getLogger(__name__)

PACKAGES = ("torch", "transformers", "tokenizers", "flwr", "ray", "numpy", "rouge-score", "snakemake")

def _machine() -> dict:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "cuda": torch.cuda.is_available(),
        # the device's name: the rehearsal report's MFU takes the peak from it (fedrepro.flops)
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        # glibc's arena limit this process started with (fedrepro.host_memory; null: glibc's own)
        "malloc_arena_max": os.environ.get(ARENA_ENV),
    }


# -- federated methods --------------------------------------------------------------------
def _backend_config(cell: dict, ray_tmp: str) -> dict:
    threads = int(cell["threads"])
    gpus = float(cell.get("gpus_per_client", 0.0))
    return {
        "client_resources": {"num_cpus": threads, "num_gpus": gpus},
        "init_args": {
            "_temp_dir": ray_tmp,
            "include_dashboard": False,
            "num_cpus": threads,
            "num_gpus": int(gpus > 0),
            "logging_level": logging.WARNING,
            "log_to_driver": True,
        },
    }


# "deployment": a loopback SuperLink + one SuperNode per client, TLS and SuperNode auth
# (fedrepro.fl.deploy; docs/federation.md)
ENGINES = ("simulation", "inprocess", "deployment")


def run_federated(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """A federated method through Flower, on the cell's ``engine``."""
    from fedrepro.fl.client_app import app as client_app

    task = task_for(cell)
    engine = cell.get("engine", "simulation")
    if engine not in ENGINES:
        raise InputError(f"cell engine {engine!r} unknown; choose one of {ENGINES} (config key <paper>.engine)")
    rounds = int(cell["train"]["rounds"])
    done, initial = start_point(cell)
    if done < rounds and engine == "inprocess":
        from fedrepro.fl.engine import InProcessGrid, server_identity

        # clients' checkpoint writes in the background, joined before each round checkpoint and
        # when the run ends (fedrepro.fl.checkpoint.deferred_client_writes)
        with server_identity(), deferred_client_writes():
            grid = InProcessGrid(client_app, len(cell["clients"]), client_names=list(cell["clients"]))
            run_server(grid, cell, initial, done)
    elif done < rounds and engine == "deployment":
        from fedrepro.fl.deploy import run_deployment

        run_deployment(cell)
    elif done < rounds:
        from flwr.simulation import run_simulation

        # Short private temp dirs: Ray's socket paths must stay under 107 characters.
        ray_tmp = tempfile.mkdtemp(prefix="fr-ray-", dir="/tmp")
        flwr_home = tempfile.mkdtemp(prefix="fr-flwr-", dir="/tmp")
        saved_env = {k: os.environ.get(k) for k in ("FLWR_HOME", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION")}
        os.environ["FLWR_HOME"] = flwr_home
        os.environ["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        try:
            run_simulation(
                server_app=make_server_app(cell, initial, done),
                client_app=client_app,
                num_supernodes=len(cell["clients"]),
                backend_config=_backend_config(cell, ray_tmp),
            )
        finally:
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(ray_tmp, ignore_errors=True)
            shutil.rmtree(flwr_home, ignore_errors=True)
    reached = latest_round(cell["out_dir"])
    if reached < rounds:
        raise RuntimeError(
            f"federated run of {cell['out_dir']} stopped after round {reached} of {rounds}: "
            f"{read_failure(cell['out_dir']) or 'see the log above for the Flower error'}"
        )
    return task.final_states(cell)


# -- a whole cell -------------------------------------------------------------------------
def _emulated_bf16(cell: dict, task, precision: Precision) -> str | None:
    """:meth:`Precision.emulation_warning` for the cell's device, logged -- asked where this
    process trains on that device (the CPU, a local regime, the in-process engine), so a process
    whose clients train elsewhere (Ray's workers, the deployment's SuperNodes) opens no CUDA
    context for it; None there."""
    if precision.is_default:
        return None
    device = cell_device(cell)
    here = device.type == "cpu" or not task.is_federated(cell) or cell.get("engine", "simulation") == "inprocess"
    warning = precision.emulation_warning(device) if here else None
    if warning:
        log.warning("%s: %s", cell.get("out_dir", "cell"), warning)
    return warning


def run_cell(cell: dict, adapters_out: str, log_out: str, provenance_out: str) -> None:
    """Train a cell and write its final client states, round log and provenance atomically."""
    t0 = time.time()
    task = task_for(cell)
    precision = Precision.from_cell(cell)
    emulated = _emulated_bf16(cell, task, precision)
    finals = run_federated(cell) if task.is_federated(cell) else task.run_local(cell)
    rounds = int(cell["train"]["rounds"])
    save_state(
        adapters_out,
        OrderedDict((f"{c}::{k}", v) for c in sorted(finals) for k, v in finals[c].items()),
    )
    rounds_log = round_log(cell["out_dir"], rounds)
    timing = {t["round"]: t for t in timing_log(cell["out_dir"], rounds)}
    for entry in rounds_log:
        seconds = entry.pop("seconds", None)  # timing is provenance, not a result
        if seconds is not None and entry["round"] not in timing:  # a local run's round
            timing[entry["round"]] = {"round": entry["round"], "seconds": seconds, "clients": [
                {k: v for k, v in c.items() if is_measurement(k)} for c in entry.get("clients", [])
            ]}
        for c in entry.get("clients", []):
            for key in [k for k in c if is_measurement(k)]:
                c.pop(key)
    write_json_atomic(log_out, {"rounds": rounds_log})
    # a task may turn what its clients left in the cell folder into outputs before the cleanup
    # (AdaFedSelecKD: the per-token KD record, the selected rounds)
    finish = getattr(task, "before_cleanup", None)
    extras = finish(cell) if finish else {}
    write_json_atomic(
        provenance_out,
        {
            "cell": cell,
            "config_hash": config_hash(cell),
            "seed": cell["seed"],
            "engine": cell.get("engine", "simulation") if task.is_federated(cell) else "none",
            # <paper>.precision / frozen_dtype (fedrepro.precision): in the cell only when not fp32
            # and, where this process trains, why its bf16 is emulated (Precision.emulation_warning)
            "precision": {**precision.record(), **({"emulated_bf16": emulated} if emulated else {})},
            "git_commit": git_commit(),
            "packages": package_versions(PACKAGES),
            "machine": _machine(),
            "wall_time_s": round(time.time() - t0, 3),
            "timing": {"rounds": [timing[r] for r in sorted(timing)], "peak_rss_mb": peak_rss_mb(),
                       "note": "rounds resumed from a checkpoint have no timing entry"},
            "parameters": task.parameter_report(cell),
            "bytes_per_round": [
                {"round": e["round"], "down": e["bytes_down"], "up": e["bytes_up"]} for e in rounds_log
            ],
            **extras,
        },
    )
    if not cell.get("keep_round_checkpoints", False):
        discard_checkpoints(cell["out_dir"])


def load_final_adapters(path: str | os.PathLike, allow_empty: bool = False) -> dict[str, OrderedDict[str, torch.Tensor]]:
    flat = load_state(path)
    out: dict[str, OrderedDict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        client, name = key.split("::", 1)
        out.setdefault(client, OrderedDict())[name] = value
    if not out and not allow_empty:
        raise InputError(f"{path}: holds no adapters")
    return out
