"""Shared grid helpers for the Snakemake workflow: backbones, job resources, raw-data folders.

Plain Python over the config lists (no file inspection), so ``snakemake -n`` over the full paper
grid takes seconds. Each paper's own grid (cells, paths, targets) is ``fedrepro.papers.<paper>.grid``.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedrepro.io import InputError
from fedrepro.models.backbones import builds_locally, get_spec

RESULTS = "results"


def section(config: dict, key: str) -> dict:
    """``config[key]``, or an error naming the missing section."""
    try:
        return config[key]
    except KeyError:
        raise InputError(f"config has no '{key}' section") from None


def backbone_settings(config: dict, name: str) -> dict:
    """Registry defaults (paper values) overridden by ``config['backbones'][name]``."""
    spec = get_spec(name)
    user = (config.get("backbones") or {}).get(name) or {}
    merged = {
        "name": name,
        "kind": "hub",
        "hub_id": spec.hub_id,
        "revision": "main",
        "local_dir": None,
        "model_class": spec.model_class,
        "adapter_top_k": spec.adapter_top_k,
        "bottleneck": spec.bottleneck,
        "max_source_length": spec.max_source_length,
    }
    merged.update(user)
    if merged["kind"] not in ("hub", "tiny", "shape"):
        raise InputError(
            f"config key backbones.{name}.kind must be 'hub', 'tiny' or 'shape', "
            f"got {merged['kind']!r}"
        )
    if merged["kind"] == "tiny" and not merged.get("tiny"):
        raise InputError(f"config key backbones.{name}.tiny is required when kind is 'tiny'")
    if merged["kind"] == "tiny" and spec.model_class != "RobertaForMaskedLM":
        missing = [k for k in ("decoder_layers", "max_target_length") if k not in merged["tiny"]]
        if missing:
            raise InputError(
                f"config key backbones.{name}.tiny needs {missing} (an encoder-decoder backbone)"
            )
    return merged


JOB_RESOURCES = {
    "train": {"gpu": 0, "mem_mb": 6000, "runtime": 600},
    "evaluate": {"gpu": 0, "mem_mb": 4000, "runtime": 240},
}
"""Defaults of ``backbones.<name>.resources`` (demo scale: CPU only)."""


def job_resources(config: dict, backbone: str, job: str) -> dict:
    """Scheduler resources of a cell's ``train`` / ``evaluate`` job with ``backbone``:
    ``gpu`` (GPUs per job), ``mem_mb``, ``runtime`` (minutes), from
    ``backbones.<name>.resources.<job>`` over :data:`JOB_RESOURCES`."""
    if job not in JOB_RESOURCES:
        raise InputError(f"unknown job kind {job!r}; known: {sorted(JOB_RESOURCES)}")
    user = (((config.get("backbones") or {}).get(backbone) or {}).get("resources") or {}).get(
        job
    ) or {}
    return {**JOB_RESOURCES[job], **user}


def job_mem_mb(config: dict, backbone: str, job: str, method: str | None = None) -> int:
    """The host memory (MB) a cell job of ``method`` declares: its entry in
    ``backbones.<name>.resources.<job>.mem_mb_by_method`` if it has one (a variant such as
    ``AdaFedSelectKD~post`` falls back to its method's entry), else the job's ``mem_mb``.

    Methods of one backbone can differ severalfold -- FedMCP's full fine-tuning (FedAvg-FT) beside
    its PEFT methods, FedSum's SCAFFOLD (the control variates) beside FedAvg -- and a scheduler
    given ``--resources mem_mb=...`` runs side by side only the jobs whose declarations fit
    (``make rehearse``; config/rehearsal.yaml holds this machine's measured peaks)."""
    res = job_resources(config, backbone, job)
    by = res.get("mem_mb_by_method") or {}
    if not isinstance(by, dict):
        raise InputError(
            f"config key backbones.{backbone}.resources.{job}.mem_mb_by_method: a mapping of "
            f"method to MB, got {by!r}"
        )
    if method is None:
        value = res["mem_mb"]
    elif method in by:
        value = by[method]
    else:  # a variant (AdaFedSelectKD~post) declares as its method unless named itself
        value = by.get(str(method).split("~")[0], res["mem_mb"])
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(
            f"config key backbones.{backbone}.resources.{job}: mem_mb of {method or 'every method'} "
            f"must be a positive number of MB, got {value!r}"
        )
    return value


def gpu_mem_mb(resources: dict) -> int:
    """The GPU memory (MB per device) a job declares, ``gpu_mem_mb`` of its resources: jobs whose
    declared memory fits share a GPU (:mod:`fedrepro.gpu_slots`); 0, the default, asks for whole
    GPUs -- one job per GPU."""
    value = resources.get("gpu_mem_mb") or 0
    if not isinstance(value, int) or value < 0:
        raise InputError(
            f"gpu_mem_mb must be a whole number of MB >= 0 (0 = a whole GPU), got {value!r}"
        )
    return value


def rule_priority(config: dict, rule: str) -> int:
    """Snakemake's ``priority`` of ``rule``'s jobs: the config's ``priority.<rule>`` (default 0).

    Higher starts first among the jobs that are ready.  ``config/rehearsal.yaml`` puts the long
    poles first (FedSUMM's rows, FedSum's 20-client cells): on the H100 the greedy scheduler had
    started them last and the budget cut them (docs/rehearsal.md)."""
    table = config.get("priority") or {}
    if not isinstance(table, dict):
        raise InputError(f"config key priority: a mapping of rule name to integer, got {table!r}")
    value = table.get(rule, 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"config key priority.{rule}: an integer, got {value!r}")
    return value


def hub_cache_dir(config: dict, basedir) -> str | None:
    """``HF_HOME`` for every job: the config's ``hub_cache`` (relative to the repository,
    ``basedir``), or None to leave the environment's.  On a cluster it must be a path the login
    node (where downloads run) and the compute nodes share; docs/cluster.md."""
    value = config.get("hub_cache")
    if value in (None, ""):
        return None
    return str((Path(basedir) / Path(str(value)).expanduser()).resolve())


def use_hub_cache(config: dict, basedir, env=None) -> str | None:
    """Set ``HF_HOME`` in ``env`` (default: this process's environment, which every job inherits)
    to :func:`hub_cache_dir`; return it (None: ``env`` left as it is)."""
    path = hub_cache_dir(config, basedir)
    if path is not None:
        (os.environ if env is None else env)["HF_HOME"] = path
    return path


def backbone_dir(name: str) -> str:
    return f"{RESULTS}/backbones/{name}"


def source_raw_dir(config: dict, name: str) -> str:
    """Where a source's raw files come from: the committed samples, a local copy or the download."""
    d = section(section(config, "data"), name)
    source = d.get("source", "samples")
    if source == "samples":
        return d.get("samples_dir") or f"resources/samples/{name}"
    if source == "local":
        if not d.get("local_dir"):
            raise InputError(f"data.{name}.source is 'local' but data.{name}.local_dir is not set")
        return d["local_dir"]
    if source == "download":
        return f"resources/downloads/{name}"
    raise InputError(f"data.{name}.source must be samples, local or download; got {source!r}")


def parse_options(config: dict, name: str) -> dict:
    """Source-specific parser options taken from the config (QMSum: inclusive span ends)."""
    if name == "qmsum":
        return {"end_inclusive": bool(config["data"]["qmsum"].get("span_end_inclusive", True))}
    return {}


def prepare_options(config: dict, name: str) -> dict:
    """Keyword arguments of :func:`fedrepro.data.prepare.prepare_source` for source ``name``:
    ``skip_malformed`` (``data.<name>.skip_malformed``), the parser options and ``heldout_test``
    (``data.<name>.heldout_test_fraction`` / ``heldout_test_seed``; ``None`` when not set)."""
    d = config["data"][name]
    fraction = d.get("heldout_test_fraction")
    return {
        "skip_malformed": bool(d.get("skip_malformed", False)),
        "parse_options": parse_options(config, name),
        "heldout_test": None if fraction is None
        else {"fraction": float(fraction), "seed": int(d.get("heldout_test_seed", 0))},
    }


def qmsum_raw_dir(config: dict) -> str:
    return source_raw_dir(config, "qmsum")


def data_sources(config: dict) -> list[str]:
    """Sources listed under ``data`` in the config (each gets a prepare rule run)."""
    return sorted(section(config, "data"))


def setting_seeds(config: dict) -> list[int]:
    return list((config.get("partitions") or {}).get("seeds", config["seeds"]))


def backbone_train_files(config: dict, backbone: str) -> list[str]:
    """Text a tiny backbone learns its vocabulary (and warm-up) from, and a shape backbone its
    tokenizer; none for a hub backbone."""
    if not builds_locally(backbone_settings(config, backbone)):
        return []
    if get_spec(backbone).model_class == "RobertaForMaskedLM":
        return [f"{RESULTS}/data/glue/records.jsonl"]
    sources = backbone_settings(config, backbone).get("train_sources") or ["qmsum"]
    return [f"{RESULTS}/data/{s}/records.jsonl" for s in sources]


def rehearsal_cell(config: dict) -> dict:
    """``{"rehearsal": {examples_per_client, eval_examples}}`` for a cell of a rehearsal
    (``rehearsal: true``, :mod:`fedrepro.rehearsal`), ``{}`` otherwise -- so a normal cell's
    description, and its config hash, are unchanged.  Spread it into a paper's ``make_cell``."""
    if not config.get("rehearsal"):
        return {}
    s = section(config, "rehearsal_settings")
    return {"rehearsal": {"examples_per_client": int(s["examples_per_client"]),
                          "eval_examples": int(s["eval_examples"])}}
