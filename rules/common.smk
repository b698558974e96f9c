# Grid helpers and wildcard constraints. Logic lives in fedrepro.workflow (plain Python over the
# config lists, so a dry run of the full paper grid stays fast).
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from fedrepro.config import validate_config
from fedrepro import workflow as wf

validate_config(
    config,
    Path(workflow.basedir) / "config" / "schema.yaml",
    source=", ".join(map(str, workflow.configfiles)) or "the config",
)

ADA = config["adafedseleckd"]
QMSUM_DOMAINS = ["Academic", "Committee", "Product"]
SPLITS = ["train", "val", "test"]
TABLES = [t for t, b in wf.TABLE_BACKBONES.items() if b in ADA["backbones"]]
ADAFEDSELECKD_TABLES = expand(
    "results/tables/adafedseleckd_{table}.{ext}", table=TABLES, ext=["csv", "md", "tex"]
)


wildcard_constraints:
    backbone="|".join(ADA["backbones"]),
    method="|".join(ADA["methods"]),
    partition=ADA["partition"],
    client="|".join(QMSUM_DOMAINS),
    scope="|".join(["all"] + QMSUM_DOMAINS),
    seed=r"\d+",
    split="|".join(SPLITS),
    table="|".join(wf.TABLE_BACKBONES),


def cell_params(wildcards):
    return wf.make_cell(
        config,
        wildcards.partition,
        wildcards.backbone,
        wildcards.method,
        wildcards.scope,
        wildcards.seed,
    )


def cell_partition_inputs(wildcards):
    return wf.clients_dir(wildcards.partition, wildcards.seed)


def backbone_inputs(wildcards):
    """A tiny backbone is trained on the demo's training text; a hub backbone needs no input."""
    if wf.backbone_settings(config, wildcards.backbone)["kind"] == "tiny":
        return ["results/data/qmsum/records.jsonl"]
    return []


def table_scores(wildcards):
    return [f"{cell}/scores.json" for cell in wf.table_cells(config, wildcards.table)]


# -- every source and split setting (data layer) --------------------------------------------
from fedrepro.data.sources import SOURCE_MODULES
from fedrepro.data.settings import settings as _settings

ALL_SOURCES = sorted(SOURCE_MODULES)
DATA_SOURCES = wf.data_sources(config)
SETTINGS = _settings(config)
ALL_MANIFESTS = expand(
    "results/partitions/{setting}/seed~{seed}/manifest.json",
    setting=list(SETTINGS),
    seed=wf.setting_seeds(config),
)


wildcard_constraints:
    source="|".join(ALL_SOURCES),
    setting="|".join(SETTINGS) if SETTINGS else "^$",


def setting_record_files(wildcards):
    return {
        name: f"results/data/{name}/records.jsonl"
        for name in SETTINGS[wildcards.setting]["sources"]
    }
