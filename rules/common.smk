# Shared helpers and wildcard constraints. Logic lives in fedrepro.grid and in each paper's
# fedrepro.papers.<paper>.grid (plain Python over the config lists, so a dry run of the full paper
# grid stays fast). Each paper's rule file, rules/<paper>.smk, starts with its own helpers.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

# canonical(): every rule's params value, keys sorted (a reordered config reruns nothing)
from fedrepro.config import canonical, validate_config
from fedrepro import grid as wf

validate_config(
    config,
    Path(workflow.basedir) / "config" / "schema.yaml",
    source=", ".join(map(str, workflow.configfiles)) or "the config",
)

from fedrepro.models.backbones import BACKBONES

if config.get("rehearsal"):
    # the paper grid reduced to its code paths, a few steps each (fedrepro.rehearsal.plan)
    from fedrepro.rehearsal.plan import apply as _rehearsal

    _rehearsal(config, workflow.basedir)


SPLITS = ["train", "val", "test"]


wildcard_constraints:
    backbone="|".join(BACKBONES),
    seed=r"\d+",
    split="|".join(SPLITS),


def backbone_inputs(wildcards):
    """A tiny backbone is trained on the demo's training text; a hub backbone needs no input."""
    return wf.backbone_train_files(config, wildcards.backbone)


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
