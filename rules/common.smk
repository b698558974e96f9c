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

# glibc's malloc limited to one arena in every job (MALLOC_ARENA_MAX=1, unless set already): jobs
# inherit Snakemake's environment (local and sbatch --export=ALL), and glibc reads the variable
# when a process starts.  SCAFFOLD's rehearsal cell: peak RSS 17.3 -> 11.5 GB with the round's
# replies freed early, same wall time (fedrepro.host_memory)
import os as _os
from fedrepro.host_memory import one_arena_environment

one_arena_environment(_os.environ)

# The hub cache (HF_HOME) of every job: config key hub_cache, on a path the login node and the
# compute nodes share (jobs inherit this environment, sbatch --export=ALL); null keeps the
# environment's own. docs/cluster.md
wf.use_hub_cache(config, workflow.basedir)

# Jobs that fetch from the internet (data sources, hub checkpoints) run where Snakemake runs: under
# the SLURM executor that is the login node, since compute nodes of many clusters have no internet.
# No effect on a local run (every job is local). Config key cluster_local_downloads (docs/cluster.md)
if config.get("cluster_local_downloads", True):

    localrules:
        download_qmsum,
        download_source,
        backbone,
        fedsum_backbone,
        fedsumm_backbone,


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
