"""AdaFedSelecKD's grid: config -> training cells, their folders and the main tables' cells.

Kept free of file inspection so that ``snakemake -n`` over the full paper grid takes seconds.
"""

from __future__ import annotations

from fedrepro.grid import RESULTS, backbone_dir, backbone_settings, rehearsal_cell, section
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd.methods import get_method


TABLE_BACKBONES = {"table3": "bart-large", "table4": "bart-base", "table6": "led-large"}


TABLE_NAMES = {"table3": "Table III", "table4": "Table IV", "table6": "Table VI"}


def clients_dir(partition: str, seed: int | str) -> str:
    """Per-client files of an AdaFedSelecKD split setting (re-drawn per seed where it is random)."""
    return f"{RESULTS}/partitions/adafedseleckd-{partition}/seed~{seed}/clients"


def partition_dir(partition: str, client: str, seed: int | str) -> str:
    return f"{clients_dir(partition, seed)}/{client}"


def ada_cfg(config: dict) -> dict:
    return section(config, "adafedseleckd")


def scopes(config: dict, method: str) -> list[str]:
    """AdaSingle trains one cell per client; every other method one cell over all clients."""
    if get_method(method).setting == "single":
        return list(ada_cfg(config)["clients"])
    return ["all"]


def cell_dir(partition: str, backbone: str, method: str, scope: str, seed: int | str) -> str:
    return f"{RESULTS}/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}"


def cells(config: dict, backbones: list[str] | None = None) -> list[str]:
    a = ada_cfg(config)
    out = []
    for backbone in backbones or a["backbones"]:
        for method in a["methods"]:
            for scope in scopes(config, method):
                for seed in config["seeds"]:
                    out.append(cell_dir(a["partition"], backbone, method, scope, seed))
    return out


def table_cells(config: dict, table: str) -> list[str]:
    backbone = TABLE_BACKBONES[table]
    if backbone not in ada_cfg(config)["backbones"]:
        raise InputError(
            f"adafedseleckd_{table} needs backbone {backbone!r}; add it to adafedseleckd.backbones"
        )
    return cells(config, [backbone])


def make_cell(
    config: dict, partition: str, backbone: str, method: str, scope: str, seed: int | str
) -> dict:
    """The full, JSON-able description of one training cell (what its config hash covers)."""
    a = ada_cfg(config)
    spec = get_method(method)
    bb = backbone_settings(config, backbone)
    clients = list(a["clients"]) if scope == "all" else [scope]
    if scope != "all" and scope not in a["clients"]:
        raise InputError(f"unknown client {scope!r}; adafedseleckd.clients is {a['clients']}")
    return {
        "paper": "adafedseleckd",
        "scale": config["scale"],
        "backbone": backbone,
        "backbone_dir": backbone_dir(backbone),
        "method": method,
        "setting": spec.setting,
        "seed": int(seed),
        "partition": partition,
        "clients": clients,
        "eval_clients": clients,
        "client_data": {c: partition_dir(partition, c, seed) for c in clients},
        "adapter_top_k": int(bb["adapter_top_k"]),
        "bottleneck": int(bb["bottleneck"]),
        "max_source_length": int(min(a["max_source_length"], bb["max_source_length"])),
        "max_target_length": int(a["max_target_length"]),
        "train": dict(a["train"]),
        "generation": dict(a["generation"]),
        "threads": int(a["threads_per_cell"]),
        "engine": a.get("engine", "simulation"),
        "device": a.get("device", "auto"),
        "gpus_per_client": float(a.get("gpus_per_client", 0.0)),
        "clients_per_round": a.get("clients_per_round"),
        "keep_round_checkpoints": bool(a.get("keep_round_checkpoints", False)),
        "round_timeout_s": float(a.get("round_timeout_s", 3600)),
        "out_dir": cell_dir(partition, backbone, method, scope, seed),
        **rehearsal_cell(config),
    }


def table_title(config: dict, table: str) -> str:
    backbone = TABLE_BACKBONES[table]
    name = TABLE_NAMES[table]
    return f"AdaFedSelecKD {name}: main results with the {backbone} backbone"
