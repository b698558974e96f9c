"""Run one training cell (paper, method, backbone, setting, seed) end to end.

* AdaSingle / AdaCentralized: a plain local loop (no server exists in these methods).
* AdaFedAvg / AdaFedKD / AdaFedSelectKD: Flower's simulation engine with one virtual SuperNode per
  client, the ServerApp of :mod:`fedrepro.fl.server_app` and the ClientApp of
  :mod:`fedrepro.fl.client_app`.  Each run gets its own ``FLWR_HOME`` and its own Ray temp dir
  and CPU budget, so two cells can run at once.

Both kinds checkpoint after every round into ``<cell>/checkpoints`` and resume from the last
finished round when rerun (a checkpoint made under a different cell config is discarded).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections import OrderedDict
from importlib import metadata
from pathlib import Path

import torch

from fedrepro.algorithms.adafedseleckd import TrainHParams, get_method, local_update, make_optimizer
from fedrepro.fl.strategy import checkpoint_paths, latest_round, read_failure, round_log
from fedrepro.fl.task import (
    client_examples,
    client_state_path,
    configure_torch,
    get_model,
    load_state,
    save_state,
    special_ids,
)
from fedrepro.io import InputError, atomic_path, read_json, write_json_atomic
from fedrepro.models.summarizer import initial_adapter_state

log = logging.getLogger(__name__)

PACKAGES = ("torch", "transformers", "tokenizers", "flwr", "ray", "numpy", "rouge-score", "snakemake")

# keys that do not change what a cell computes (excluded from the config hash)
_NON_SEMANTIC = ("out_dir", "round_timeout_s")


def config_hash(cell: dict) -> str:
    semantic = {k: v for k, v in cell.items() if k not in _NON_SEMANTIC}
    return hashlib.sha256(json.dumps(semantic, sort_keys=True).encode()).hexdigest()[:16]


def _package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _git_commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _machine() -> dict:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "cuda": torch.cuda.is_available(),
    }


def _prepare_checkpoints(cell: dict) -> int:
    """Return the last finished round, discarding checkpoints made under another config."""
    out = Path(cell["out_dir"])
    stamp = out / "checkpoints" / "cell_config.json"
    h = config_hash(cell)
    if stamp.exists() and read_json(stamp).get("config_hash") != h:
        log.warning("discarding checkpoints of a different cell config in %s", out)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        shutil.rmtree(out / "clients", ignore_errors=True)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    failure = out / "checkpoints" / "failure.json"
    if failure.exists():
        failure.unlink()
    write_json_atomic(stamp, {"config_hash": h, "cell": cell})
    return latest_round(out)


def _initial_state(cell: dict) -> OrderedDict[str, torch.Tensor]:
    from transformers import AutoConfig

    d_model = AutoConfig.from_pretrained(cell["backbone_dir"]).d_model
    return initial_adapter_state(
        d_model, int(cell["bottleneck"]), int(cell["adapter_top_k"]), int(cell["seed"])
    )


# -- non-federated methods ----------------------------------------------------------------
def run_local(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """AdaSingle / AdaCentralized: train one local adapter on the pooled data of ``cell['clients']``.

    To give every method the same optimisation budget, a local run does ``rounds × local_epochs``
    epochs; it checkpoints adapter *and* AdamW state after every ``local_epochs`` so that a resumed
    run continues bit-identically.
    """
    configure_torch(cell["threads"])
    spec = get_method(cell["method"])
    hp = TrainHParams.from_config(cell["train"])
    rounds = int(cell["train"]["rounds"])
    _, model = get_model(cell)
    examples = [e for c in cell["clients"] for e in client_examples(cell, c, "train")]
    optimizer = make_optimizer(model, hp)
    done = _prepare_checkpoints(cell)
    if done:
        state_path, meta_path = checkpoint_paths(cell["out_dir"], done)
        model.load_adapter_state("local", load_state(state_path))
        optimizer.load_state_dict(torch.load(Path(cell["out_dir"]) / "checkpoints" / f"optimizer_round_{done:03d}.pt"))
        log.info("resuming %s from round %d", cell["out_dir"], done)
    else:
        model.load_adapter_state("local", _initial_state(cell))
    name = "+".join(cell["clients"]) if len(cell["clients"]) > 1 else cell["clients"][0]
    pad_id, start_id = special_ids(model)
    for r in range(done + 1, rounds + 1):
        t0 = time.perf_counter()
        torch.manual_seed(0)  # no randomness is drawn in training; fixed for safety
        stats = local_update(model, spec, examples, hp, optimizer, int(cell["seed"]), name, r, pad_id, start_id)
        state_path, meta_path = checkpoint_paths(cell["out_dir"], r)
        save_state(state_path, model.adapter_state("local"))
        with atomic_path(Path(cell["out_dir"]) / "checkpoints" / f"optimizer_round_{r:03d}.pt") as tmp:
            torch.save(optimizer.state_dict(), tmp)
        write_json_atomic(
            meta_path,
            {"round": r, "clients": [{"client": name, "num_examples": len(examples), **stats}],
             "bytes_down": 0, "bytes_up": 0, "seconds": time.perf_counter() - t0},
        )
        log.info("round %d/%d: loss %.4f", r, rounds, stats["train_loss"])
    final = load_state(checkpoint_paths(cell["out_dir"], rounds)[0])
    return {c: final for c in cell["eval_clients"]}


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


def run_federated(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """AdaFedAvg / AdaFedKD / AdaFedSelectKD through Flower's simulation engine."""
    from flwr.simulation import run_simulation

    from fedrepro.fl.client_app import app as client_app
    from fedrepro.fl.server_app import make_server_app

    spec = get_method(cell["method"])
    rounds = int(cell["train"]["rounds"])
    done = _prepare_checkpoints(cell)
    if done < rounds:
        if done:
            log.info("resuming %s from round %d", cell["out_dir"], done)
            initial = load_state(checkpoint_paths(cell["out_dir"], done)[0])
        else:
            initial = _initial_state(cell)
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
    if spec.server_role == "local":  # AdaFedAvg: every client uses the aggregated adapter
        final = load_state(checkpoint_paths(cell["out_dir"], rounds)[0])
        return {c: final for c in cell["eval_clients"]}
    # KD methods: each client uses its own local adapter after the last round
    return {c: load_state(client_state_path(cell, c, rounds)) for c in cell["eval_clients"]}


# -- a whole cell -------------------------------------------------------------------------
def run_cell(cell: dict, adapters_out: str, log_out: str, provenance_out: str) -> None:
    """Train a cell and write its final adapters, round log and provenance record atomically."""
    t0 = time.time()
    spec = get_method(cell["method"])
    finals = run_federated(cell) if spec.federated else run_local(cell)
    rounds = int(cell["train"]["rounds"])
    save_state(
        adapters_out,
        OrderedDict((f"{c}::{k}", v) for c in sorted(finals) for k, v in finals[c].items()),
    )
    rounds_log = round_log(cell["out_dir"], rounds)
    for entry in rounds_log:
        entry.pop("seconds", None)  # timing is provenance, not a result
    write_json_atomic(log_out, {"rounds": rounds_log})
    _, model = get_model(cell)
    n_total = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.trainable_parameters())
    n_shared = sum(v.numel() for v in next(iter(finals.values())).values()) if spec.federated else 0
    write_json_atomic(
        provenance_out,
        {
            "cell": cell,
            "config_hash": config_hash(cell),
            "seed": cell["seed"],
            "git_commit": _git_commit(),
            "packages": _package_versions(),
            "machine": _machine(),
            "wall_time_s": round(time.time() - t0, 3),
            "parameters": {
                "total": n_total,
                "trainable": n_trainable,
                "trainable_share": n_trainable / n_total,
                "shared_per_round": n_shared,
                "shared_share": n_shared / n_total,
            },
            "bytes_per_round": [
                {"round": e["round"], "down": e["bytes_down"], "up": e["bytes_up"]} for e in rounds_log
            ],
        },
    )
    if not cell.get("keep_round_checkpoints", False):
        shutil.rmtree(Path(cell["out_dir"]) / "checkpoints", ignore_errors=True)
        shutil.rmtree(Path(cell["out_dir"]) / "clients", ignore_errors=True)


def load_final_adapters(path: str | os.PathLike) -> dict[str, OrderedDict[str, torch.Tensor]]:
    flat = load_state(path)
    out: dict[str, OrderedDict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        client, name = key.split("::", 1)
        out.setdefault(client, OrderedDict())[name] = value
    if not out:
        raise InputError(f"{path}: holds no adapters")
    return out
