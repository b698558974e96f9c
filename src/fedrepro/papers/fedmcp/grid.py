"""FedMCP's grid: one cell per (method, seed) over the six GLUE-task clients of the cross-task
split, and the cells each table and figure reads.
"""

from __future__ import annotations

from fedrepro.grid import RESULTS, backbone_dir, backbone_settings, rehearsal_cell, section
from fedrepro.io import InputError
from fedrepro.papers.fedmcp.methods import get_method
from fedrepro.precision import precision_cell


SETTING = "fedmcp-crosstask"


TABLE_METHODS = [
    "Local",
    "FedAvg-FT",
    "FedAvg-PEFT",
    "FedLR",
    "FedAP",
    "MOON",
    "FedRep",
    "FedMatch",
    "FedMCP",
]


TARGET_METHODS = {
    "table1": TABLE_METHODS,
    "table2": ["FedMCP-noLc", "FedMCP-noLb", "FedMCP"],
    "figure3": ["FedAvg-PEFT", "FedMCP"],
    "figure4": ["FedMCP", "FedMCP-cos"],
    "figure5": ["FedMCP", "FedMCP-cls"],
}


TARGETS = {
    "table1": "table",
    "table2": "table",
    "figure3": "figure",
    "figure4": "figure",
    "figure5": "figure",
}


def cfg(config: dict) -> dict:
    return section(config, "fedmcp")


def seeds(config: dict) -> list[int]:
    return list(cfg(config).get("seeds") or config["seeds"])


def clients_dir(config: dict) -> str:
    """The cross-task split used by every FedMCP run (one split; runs differ by training seed)."""
    return f"{RESULTS}/partitions/{SETTING}/seed~{cfg(config).get('split_seed', 1)}/clients"


def cell_dir(backbone: str, method: str, seed: int | str) -> str:
    return f"{RESULTS}/fedmcp/crosstask/{backbone}/{method}/seed~{seed}"


def target_cells(config: dict, target: str) -> list[str]:
    f = cfg(config)
    try:
        methods = TARGET_METHODS[target]
    except KeyError:
        raise InputError(
            f"unknown FedMCP target {target!r}; known: {sorted(TARGET_METHODS)}"
        ) from None
    missing = [m for m in methods if m not in f["methods"]]
    if missing:
        raise InputError(f"fedmcp_{target} needs methods {missing}; add them to fedmcp.methods")
    return [cell_dir(f["backbone"], m, s) for m in methods for s in seeds(config)]


def target_files(config: dict, target: str, name: str) -> list[str]:
    """``<cell>/<name>`` of every cell a table or figure reads (its Snakemake inputs)."""
    return [f"{cell}/{name}" for cell in target_cells(config, target)]


def make_cell(config: dict, backbone: str, method: str, seed: int | str) -> dict:
    """One FedMCP run: six GLUE-task clients, one method, one training seed."""
    f = cfg(config)
    sizing = str(f.get("baseline_adapters", "paper"))
    spec = get_method(method, sizing)
    bb = backbone_settings(config, backbone)
    clients = list(section(section(config, "partitions"), "fedmcp")["tasks"])
    root = clients_dir(config)
    return {
        "paper": "fedmcp",
        "scale": config["scale"],
        "backbone": backbone,
        "backbone_dir": backbone_dir(backbone),
        "method": method,
        "federated": spec.federated,
        "seed": int(seed),
        "setting": SETTING,
        "clients": clients,
        "eval_clients": clients,
        "client_data": {c: f"{root}/{c}" for c in clients},
        "max_length": int(min(f["max_length"], bb["max_source_length"])),
        "model": {"bottleneck": int(bb["bottleneck"]), **dict(f.get("lora") or {}),
                  "baseline_adapters": sizing},
        "train": dict(f["train"]),
        "eval_batch_size": int(f["eval_batch_size"]),
        "eval_every_round": bool(f.get("eval_every_round", True)),
        "threads": int(f["threads_per_cell"]),
        "engine": f.get("engine", "simulation"),
        "device": f.get("device", "auto"),
        **precision_cell(f, "fedmcp"),  # only when not fp32: fedrepro.precision
        "gpus_per_client": float(f.get("gpus_per_client", 0.0)),
        "keep_round_checkpoints": bool(f.get("keep_round_checkpoints", False)),
        "round_timeout_s": float(f.get("round_timeout_s", 3600)),
        "out_dir": cell_dir(backbone, method, seed),
        **rehearsal_cell(config),
    }
