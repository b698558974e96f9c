"""What a rehearsal runs: the config reduced to a few steps, and the cells that cover the grid.

:func:`apply` rewrites the workflow config in place when ``rehearsal: true`` (``rules/common.smk``
calls it before any grid is read), :func:`cells` lists the cells of the reduced grid.

Reduction (``rehearsal_settings``; every other value stays the paper's):

* one seed (the first of each ``seeds`` list);
* ``rounds`` federated rounds (local methods: as many epochs-per-round blocks) and, in every cell,
  the first ``examples_per_client`` training and ``eval_examples`` evaluation examples of each
  client (:func:`fedrepro.fl.limits.rehearsal_limit`): ``ceil(examples / batch_size)`` optimizer
  steps per local epoch, at batch ``min(batch_size, examples_per_client)``;
* generation keeps the paper's beams, penalties and n-gram blocking; only ``max_new_tokens`` is
  capped (``min_new_tokens`` with it);
* FedSum's partition is drawn at the paper's ``partitions.fedsum.total`` (2,000) over its 20
  clients (``fedsum_total: paper``; an integer overrides it), so the split's rule (the authors'
  Dirichlet re-draw) runs where it is feasible -- at 80 documents Dir(0.1) accepts one draw in
  ~4·10^13 -- and the cells train on the first ``examples_per_client`` of each client's documents
  as every other paper's cells do; Reddit keeps a small held-out test set; FedSUMM keeps its N
  clients;
* ``data: samples`` (a machine without the data hubs): every source comes from raw-schema samples
  written by the project's generators at ``sample_scale`` times the committed size (enough records
  for the paper's client counts; FedSum's datasets at the scale whose train split holds the
  partition's total, :func:`min_train_records`) and read by the real parsers; ``data: configured`` keeps the
  config's sources (downloads or ``local`` copies: the paper path on a cluster);
* ``backbones: fetch_or_shape``: each backbone is fetched as configured; where that fails it is
  built at its true dimensions with random weights (``kind: shape``, logged);
  ``backbones: configured`` never falls back;
* ``precision``: ``paper`` (default) keeps each paper's ``precision`` and ``frozen_dtype``;
  ``fp32`` runs every cell in fp32; ``auto`` (this CPU machine's overlay, config/rehearsal.yaml)
  keeps the paper's where the machine computes bfloat16 natively
  (:func:`fedrepro.precision.native_bf16`: visible GPUs of compute capability >= 8.0, or a CPU
  with AVX512-BF16/AMX) and runs fp32 where bf16 autocast is emulated -- 13x fp32's step on an
  AVX2-only CPU, hours instead of minutes for AdaFedSelecKD's and FedMCP's cells.  The bf16 code
  paths themselves are tested on every CPU by ``make test`` (CPU autocast).  ``auto`` decides
  once, in the Snakemake process, and pins the answer in ``FEDREPRO_REHEARSAL_PRECISION``
  (``paper`` | ``fp32``) for every process started under it, so a job that re-reads the workflow
  decides as its parent did; a value set beforehand wins (set it to ``paper`` on a cluster whose
  submitting node has no GPU, or use ``precision: paper``).  The plan (``plan.json``) and the
  report say which cells ran fp32 and why.

Coverage (``coverage``): ``cover`` runs every method, every backbone and every kind of setting at
least once -- AdaFedSelecKD: the five methods on the first backbone (AdaSingle on its first client)
and AdaFedSelectKD, the method with every part (global + local adapters, selective KD), on each
other backbone; FedMCP: every method (one backbone); FedSum: every method and the depth ablation
on Table 1's setting, FedSum on every other dataset and on the uniform (α = ∞) split
(``fedsum_settings: every``; ``first`` -- this CPU's overlay -- builds and checks those settings'
client data but trains no cell on them); FedSUMM:
every model (bart, ct, bart-cd) with all four regimes (one row job each) on the first available
corpus at the tables' N, and the client split of every other corpus.  A method's code does not
depend on the backbone beyond the model class, which the backbone cells cover.  ``cross`` runs
every method on every backbone (AdaFedSelecKD) and every FedSUMM corpus.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, MutableMapping
from pathlib import Path

from fedrepro import grid as wf
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd import grid as ada
from fedrepro.papers.fedmcp import grid as fedmcp
from fedrepro.papers.fedsum import grid as fedsum
from fedrepro.papers.fedsumm import grid as fedsumm
from fedrepro.precision import DEFAULT as PRECISION_DEFAULT
from fedrepro.precision import native_bf16, precision_cell

WORKDIR = "results/rehearsal"
"""Snakemake's working directory during a rehearsal (relative to the repository)."""

SAMPLES_DIR = "samples"
"""Generated raw-schema samples of ``data: samples`` (relative to :data:`WORKDIR`)."""

DEFAULTS = {
    "rounds": 2,
    "examples_per_client": 2,
    "eval_examples": 2,
    "max_new_tokens": 8,
    "coverage": "cover",
    "data": "configured",
    "sample_scale": 4,
    "backbones": "fetch_or_shape",
    "fedsum_total": "paper",
    "fedsum_heldout_test_docs": 16,
    "fedsum_settings": "every",
    "gpu_mem_mb": 16000,
    "precision": "paper",
}

PRECISIONS = ("paper", "fp32", "auto")
"""``rehearsal_settings.precision`` (module docstring)."""

PRECISION_ENV = "FEDREPRO_REHEARSAL_PRECISION"
"""Where ``precision: auto`` pins its answer (``paper`` | ``fp32``) for the processes below it."""

PAPERS = ("adafedseleckd", "fedmcp", "fedsum", "fedsumm")


def settings(config: dict) -> dict:
    """``rehearsal_settings`` over :data:`DEFAULTS`, checked (errors name the key)."""
    s = {**DEFAULTS, **(config.get("rehearsal_settings") or {})}
    unknown = sorted(set(s) - set(DEFAULTS))
    if unknown:
        raise InputError(f"config key rehearsal_settings: unknown entries {unknown}; known: {sorted(DEFAULTS)}")
    for key in ("rounds", "examples_per_client", "eval_examples", "max_new_tokens", "sample_scale",
                "fedsum_heldout_test_docs"):
        if not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < 1:
            raise InputError(f"config key rehearsal_settings.{key}: a positive integer, got {s[key]!r}")
    if not isinstance(s["gpu_mem_mb"], int) or isinstance(s["gpu_mem_mb"], bool) or s["gpu_mem_mb"] < 0:
        raise InputError(f"config key rehearsal_settings.gpu_mem_mb: MB >= 0 (0: the config's own "
                         f"resources), got {s['gpu_mem_mb']!r}")
    if s["fedsum_total"] != "paper" and (
            not isinstance(s["fedsum_total"], int) or isinstance(s["fedsum_total"], bool) or s["fedsum_total"] < 1):
        raise InputError(f"config key rehearsal_settings.fedsum_total: 'paper' (partitions.fedsum.total) or a "
                         f"positive integer, got {s['fedsum_total']!r}")
    choices = {"coverage": ("cover", "cross"), "data": ("configured", "samples"),
               "backbones": ("fetch_or_shape", "configured"), "fedsum_settings": ("every", "first"),
               "precision": PRECISIONS}
    for key, allowed in choices.items():
        if s[key] not in allowed:
            raise InputError(f"config key rehearsal_settings.{key}: one of {allowed}, got {s[key]!r}")
    return s


def _first(values):
    return [list(values)[0]]


def _cap_generation(gen: dict, cap: int) -> None:
    gen["max_new_tokens"] = min(int(gen.get("max_new_tokens", cap)), cap)
    for key in ("min_new_tokens",):
        if key in gen:
            gen[key] = min(int(gen[key]), gen["max_new_tokens"])


def _absolute(path: str | None, basedir: Path) -> str | None:
    if path is None or Path(path).is_absolute():
        return path
    return str((basedir / path).resolve())


def resolve_precision(setting: str, environ: MutableMapping[str, str] | None = None,
                      probe: Callable[[], tuple[bool, str]] = native_bf16) -> dict:
    """``{"setting", "ran", "reason"}``: what ``rehearsal_settings.precision`` (``setting``) means on
    this machine -- ``ran`` is ``paper`` (each paper's own precision) or ``fp32``.  ``auto`` reads
    :data:`PRECISION_ENV` from ``environ`` (``os.environ`` by default) when it holds ``paper`` or
    ``fp32``; otherwise asks ``probe`` (:func:`fedrepro.precision.native_bf16`) and writes the answer
    there, so the processes started below decide the same way.  Any other value in the variable
    is an error naming it."""
    if setting != "auto":
        return {"setting": setting, "ran": setting, "reason": f"rehearsal_settings.precision: {setting}"}
    environ = os.environ if environ is None else environ
    pinned = environ.get(PRECISION_ENV)
    if pinned:
        if pinned not in ("paper", "fp32"):
            raise InputError(f"environment variable {PRECISION_ENV}={pinned!r}: 'paper' or 'fp32' "
                             f"(what rehearsal_settings.precision: auto decided), or unset it")
        return {"setting": setting, "ran": pinned, "reason": f"{PRECISION_ENV}={pinned} in the environment"}
    native, why = probe()
    ran = "paper" if native else "fp32"
    environ[PRECISION_ENV] = ran
    return {"setting": setting, "ran": ran, "reason": ("bf16 is native here: " if native else "") + why}


def _apply_precision(config: dict, decision: dict) -> dict:
    """Set every paper's ``precision`` and ``frozen_dtype`` to fp32 when ``decision`` says so;
    the record of what changed (``fp32_instead_of``: paper -> its own non-fp32 values)."""
    changed: dict[str, dict] = {}
    if decision["ran"] == "fp32":
        for paper in PAPERS:
            sec = config.get(paper)
            if not sec:
                continue
            was = precision_cell(sec, paper)  # the section's keys that are not fp32
            if was:
                changed[paper] = was
                sec.update(dict.fromkeys(was, PRECISION_DEFAULT))
    return {**decision, "fp32_instead_of": changed}


def apply(config: dict, basedir: str | Path, *, environ: MutableMapping[str, str] | None = None,
          probe: Callable[[], tuple[bool, str]] = native_bf16) -> dict:
    """Reduce ``config`` (in place, and returned) for a rehearsal; see the module docstring.

    ``basedir`` is the repository: relative data and checkpoint folders of the config are made
    absolute, because Snakemake's working directory moves to :data:`WORKDIR`.  ``environ`` and
    ``probe``: :func:`resolve_precision`'s (tests pass their own)."""
    basedir = Path(basedir)
    s = settings(config)
    config["rehearsal_settings"] = s
    original = copy.deepcopy({k: v for k, v in config.items() if k != "rehearsal_original"})
    config["rehearsal_original"] = original  # the unreduced config: the report's full grid
    config["seeds"] = _first(config["seeds"])
    parts = config.get("partitions") or {}
    if parts.get("seeds"):
        parts["seeds"] = _first(parts["seeds"])
    for paper in PAPERS:
        sec = config.get(paper)
        if not sec:
            continue
        if sec.get("seeds"):
            sec["seeds"] = _first(sec["seeds"])
        sec["train"]["rounds"] = int(s["rounds"])
        if "generation" in sec:
            _cap_generation(sec["generation"], int(s["max_new_tokens"]))
    if "fedsum" in config:
        fs = config["fedsum"]
        fs_parts = parts.get("fedsum") or {}
        if fs_parts and s["fedsum_total"] != "paper":
            fs_parts["total"] = int(s["fedsum_total"])
        fs.setdefault("eval", {})["heldout_test_docs"] = min(
            int(fs.get("eval", {}).get("heldout_test_docs") or s["fedsum_heldout_test_docs"]),
            int(s["fedsum_heldout_test_docs"]),
        )
    ada_parts = parts.get("adafedseleckd") or {}
    if ada_parts.get("noniid_sizes") and s["data"] == "samples":
        # Fig. 7 draws 200/40/40 per domain; the generated samples hold fewer
        ada_parts["noniid_sizes"] = {k: min(int(v), 2) for k, v in ada_parts["noniid_sizes"].items()}
    table7 = ((config.get("adafedseleckd") or {}).get("experiments") or {}).get("table7")
    if table7 and table7.get("post_rounds"):
        table7["post_rounds"] = int(s["rounds"])
    for name, d in (config.get("data") or {}).items():
        if s["data"] == "samples":
            d["source"] = "samples"
            d["samples_dir"] = f"{SAMPLES_DIR}/{name}"
        else:
            for key in ("samples_dir", "local_dir"):
                if d.get(key):
                    d[key] = _absolute(d[key], basedir)
    for name, b in (config.get("backbones") or {}).items():
        if b.get("local_dir"):
            b["local_dir"] = _absolute(b["local_dir"], basedir)
        if s["backbones"] == "fetch_or_shape" and b.get("kind", "hub") == "hub":
            b["fallback"] = "shape"
    _share_gpus(config, int(s["gpu_mem_mb"]))
    config["rehearsal_precision"] = _apply_precision(config, resolve_precision(s["precision"], environ, probe))
    fb = (config.get("fedsumm") or {}).get("backbone")
    if fb:
        if fb.get("local_dir"):
            fb["local_dir"] = _absolute(fb["local_dir"], basedir)
        if s["backbones"] == "fetch_or_shape" and fb.get("kind", "hub") == "hub":
            fb["fallback"] = "shape"
    return config


def _share_gpus(config: dict, mem_mb: int) -> None:
    """Every cell job of the rehearsal declares ``gpu_mem_mb = mem_mb`` unless its resources
    declare one: the rehearsal's few-step cells (peak GPU memory 0.6-2.9 GB measured on an H100)
    then share a GPU (:mod:`fedrepro.gpu_slots`: 5 on an 80 GB H100, as many as Snakemake's ``gpu``
    resource lets run) instead of each waiting for a whole one -- the paper config's jobs, which
    declare none, claim whole GPUs.  0: the config's resources unchanged."""
    if not mem_mb:
        return
    jobs = [(b, wf.JOB_RESOURCES) for b in (config.get("backbones") or {}).values()]
    if config.get("fedsumm") is not None:
        jobs.append((config["fedsumm"], ("train",)))
    for section, names in jobs:
        res = section.setdefault("resources", {})
        for job in names:
            res[job] = {"gpu_mem_mb": mem_mb, **(res.get(job) or {})}


# -- the cells ------------------------------------------------------------------------------
def _ada_cells(config: dict, cover: bool) -> list[dict]:
    a = ada.ada_cfg(config)
    seed = config["seeds"][0]
    backbones = list(a["backbones"])
    methods = list(a["methods"])
    full = [(backbones[0], m) for m in methods] if cover else [(b, m) for b in backbones for m in methods]
    if cover:
        richest = "AdaFedSelectKD" if "AdaFedSelectKD" in methods else methods[-1]
        full += [(b, richest) for b in backbones[1:]]
    full = [(a["partition"], b, m, ada.scopes(config, m)[0]) for b, m in full]
    full += _ada_experiment_cells(config, seed, {(a["partition"], b, m) for _, b, m, _ in full}, cover)
    out = []
    for partition, backbone, method, scope in full:
        cell = ada.cell_dir(partition, backbone, method, scope, seed)
        key = f"adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}"
        out.append({"paper": "adafedseleckd", "cell": cell, "method": method, "backbone": backbone,
                    "setting": f"{partition}/{scope}",
                    "files": [f"{cell}/{n}" for n in ("provenance.json", "scores.json")],
                    "jobs": {j: _job(f"{j}_cell", key, _method_resources(config, backbone, j, method))
                             for j in ("train", "evaluate")}})
    return out


def _ada_experiment_cells(config: dict, seed, have: set, cover: bool) -> list[tuple[str, str, str, str]]:
    """The experiments' cells (Tables V, VII, Figs. 4, 6-10, 12) that add a code path: with
    ``cover``, one per new method, per split setting, per backbone and per kind of variant
    (τ, sampling, post-addition); all of them with ``cross``."""
    seen_bases = {ada.split_method(m)[0] for _, _, m in have}
    seen_kinds = {(p, b, "") for p, b, _ in have}
    out = []
    for cell in ada.all_experiment_cells(config):
        *_, partition, backbone, method, scope, seed_dir = Path(cell).parts
        if seed_dir != f"seed~{seed}" or (partition, backbone, method) in have:
            continue
        base, variant = ada.split_method(method)
        kind = (partition, backbone, variant.rstrip("0123456789."))
        if cover and base in seen_bases and kind in seen_kinds:
            continue
        seen_bases.add(base)
        seen_kinds.add(kind)
        have.add((partition, backbone, method))
        out.append((partition, backbone, method, scope))
    return out


def _fedmcp_cells(config: dict) -> list[dict]:
    f = fedmcp.cfg(config)
    seed = fedmcp.seeds(config)[0]
    out = []
    for method in f["methods"]:
        cell = fedmcp.cell_dir(f["backbone"], method, seed)
        key = f"{f['backbone']}/{method}/seed~{seed}"
        out.append({"paper": "fedmcp", "cell": cell, "method": method, "backbone": f["backbone"],
                    "setting": "crosstask",
                    "files": [f"{cell}/{n}" for n in ("provenance.json", "scores.json")],
                    "jobs": {j: _job(f"fedmcp_{j}_cell", key, _method_resources(config, f["backbone"], j, method))
                             for j in ("train", "evaluate")}})
    return out


def _fedsum_other_settings(config: dict) -> list[tuple[str, float]]:
    """FedSum's (dataset, alpha) beyond Table 1's: every other dataset at ``fedsum.alpha`` and the
    uniform split (alpha = infinity) of the sweep dataset."""
    f = fedsum.fedsum_cfg(config)
    others = [(ds, float(f["alpha"])) for ds in list(f["datasets"])[1:]]
    return others + [(fedsum.SWEEP_DATASET, float(f["uniform_alpha"]))]


def _fedsum_cells(config: dict) -> list[dict]:
    """Every method and the depth ablation on Table 1's setting; with ``fedsum_settings: every``
    also FedSum on each other setting (:func:`_fedsum_other_settings`).  With ``first`` those
    settings' client data (split, oracle labels, test set) is still built and checked
    (:func:`data_files`): the training code is the same as on Table 1's setting, and on a
    2-core CPU their four 20-client cells cost ~13 of make rehearse's minutes."""
    f = fedsum.fedsum_cfg(config)
    seed = fedsum.seeds(config)[0]
    alpha = float(f["alpha"])
    datasets = list(f["datasets"])
    runs = [(datasets[0], alpha, m) for m in list(f["methods"]) + list(f.get("ablation") or [])]
    if settings(config)["fedsum_settings"] == "every":
        runs += [(ds, a, "FedSum") for ds, a in _fedsum_other_settings(config)]
    out = []
    for ds, a, method in runs:
        setting = fedsum.setting_name(config, ds, a)
        cell = fedsum.cell_dir(setting, method, seed)
        job = ("fedsum_train_row", f"{setting}/seed~{seed}") if fedsum.rows_enabled(config) else (
            "fedsum_train_cell", f"{setting}/{method}/seed~{seed}")
        out.append({"paper": "fedsum", "cell": cell, "method": method, "backbone": fedsum.BACKBONE,
                    "setting": setting,
                    "files": [f"{cell}/{n}" for n in ("provenance.json", "scores.json")],
                    "jobs": {"train": _job(*job, _method_resources(config, fedsum.BACKBONE, "train", method))}})
    return out


def _fedsumm_cells(config: dict, cover: bool) -> list[dict]:
    seed = fedsumm.seeds(config)[0]
    n = fedsumm.table_clients(config)
    corpora = fedsumm.available_corpora(config)
    if not corpora:
        return []
    out = []
    for corpus in corpora[:1] if cover else corpora:
        for model in fedsumm.MODELS:
            for regime in fedsumm.REGIMES:
                cell = fedsumm.cell_dir(corpus, n, model, regime, seed)
                out.append({"paper": "fedsumm", "cell": cell, "method": regime,
                            "backbone": model, "setting": f"{corpus}/n{n}",
                            "files": [f"{cell}/{x}" for x in ("provenance.json", "scores.json")],
                            "jobs": {"train": _job("fedsumm_row", f"{corpus}/n{n}/{model}/seed~{seed}",
                                                   fedsumm.job_resources(config, "train"),
                                                   shared_by=len(fedsumm.REGIMES))}})
    return out


def _method_resources(config: dict, backbone: str, job: str, method: str) -> dict:
    """A cell job's declared resources with its method's ``mem_mb`` (:func:`fedrepro.grid.job_mem_mb`)."""
    res = {k: v for k, v in wf.job_resources(config, backbone, job).items() if k != "mem_mb_by_method"}
    return {**res, "mem_mb": wf.job_mem_mb(config, backbone, job, method)}


def _job(rule: str, key: str, resources: dict, shared_by: int = 1) -> dict:
    """A cell's Snakemake job: its log, its benchmark file and its declared resources
    (``shared_by``: how many cells one job trains, e.g. a FedSUMM row's four regimes)."""
    return {"rule": rule, "log": f"logs/{rule}/{key}.log", "benchmark": f"benchmarks/{rule}/{key}.tsv",
            "resources": dict(resources), "shared_by": shared_by}


def cells(config: dict) -> list[dict]:
    """The rehearsal's cells: ``{paper, cell, method, backbone, setting, files}`` each."""
    cover = settings(config)["coverage"] == "cover"
    out: list[dict] = []
    if "adafedseleckd" in config:
        out += _ada_cells(config, cover)
    if "fedmcp" in config:
        out += _fedmcp_cells(config)
    if "fedsum" in config:
        out += _fedsum_cells(config)
    if "fedsumm" in config:
        out += _fedsumm_cells(config, cover)
    return out


def data_files(config: dict) -> list[str]:
    """Besides the cells: every configured source prepared by its real parser, the FedSUMM
    client split of every available corpus at the tables' N, and (``fedsum_settings: first``)
    the client data of FedSum's settings that train no cell."""
    out = [f"results/data/{name}/prepare_report.json" for name in sorted(wf.section(config, "data"))]
    if "fedsum" in config and settings(config)["fedsum_settings"] == "first":
        seed = fedsum.seeds(config)[0]
        out += [fedsum.data_dir(fedsum.setting_name(config, ds, a), seed)
                for ds, a in _fedsum_other_settings(config)]
    if "fedsumm" in config:
        n = fedsumm.table_clients(config)
        out += [fedsumm.clients_dir(config, c, n) for c in fedsumm.available_corpora(config)]
    return out



def full_grids(original: dict) -> dict[str, dict[str, list[str]]]:
    """paper -> table/figure -> the cell folders of the *unreduced* config that build it (for the
    report's device-hours per table).  A target the config cannot build is left out."""
    targets = {
        "adafedseleckd": (lambda t: ada.table_cells(original, t), list(ada.TABLE_BACKBONES)),
        "fedmcp": (lambda t: fedmcp.target_cells(original, t), sorted(fedmcp.TARGET_METHODS)),
        "fedsum": (lambda t: fedsum.target_cells(original, t), sorted(fedsum.TARGETS)),
        "fedsumm": (lambda t: fedsumm.target_cells(original, t), sorted(fedsumm.TARGETS)),
    }
    out: dict[str, dict[str, list[str]]] = {}
    for paper, (cells_of, names) in targets.items():
        if paper not in original:
            continue
        for name in names:
            try:
                out.setdefault(paper, {})[name] = list(cells_of(name))
            except InputError:
                continue
    return out


def backbone_dirs(config: dict) -> dict[str, str]:
    out = {b: wf.backbone_dir(b) for b in (config.get("adafedseleckd") or {}).get("backbones", [])}
    fig9 = ((config.get("adafedseleckd") or {}).get("experiments") or {}).get("figure9")
    if fig9:
        out[fig9.get("backbone", "longt5")] = wf.backbone_dir(fig9.get("backbone", "longt5"))
    if "fedmcp" in config:
        out[config["fedmcp"]["backbone"]] = wf.backbone_dir(config["fedmcp"]["backbone"])
    if "fedsum" in config:
        out[fedsum.BACKBONE] = wf.backbone_dir(fedsum.BACKBONE)
    if "fedsumm" in config:
        out["bart-base-chinese"] = fedsumm.BACKBONE_DIR
    return out


def min_train_records(config: dict) -> dict[str, int]:
    """Per FedSum dataset: the training records the rehearsal's generated sample must hold --
    the partition's ``partitions.fedsum.total`` plus ``fedsum.eval.heldout_test_docs`` (Reddit
    TIFU's test set comes out of its train split).  ``data: samples`` only; other sources: none."""
    if settings(config)["data"] != "samples":
        return {}
    fs_parts = (config.get("partitions") or {}).get("fedsum") or {}
    if not fs_parts or "fedsum" not in config:
        return {}
    held = int(((config.get("fedsum") or {}).get("eval") or {}).get("heldout_test_docs") or 0)
    return {ds: int(fs_parts["total"]) + held for ds in fs_parts.get("datasets", [])}


def document(config: dict) -> dict:
    """The rehearsal plan written to ``plan.json`` (what the report reads)."""
    original = config.get("rehearsal_original") or {}
    return {
        "settings": settings(config),
        "min_train_records": min_train_records(config),
        "cells": cells(config),
        "data_files": data_files(config),
        "full_rounds": {p: int(original[p]["train"]["rounds"]) for p in PAPERS if p in original},
        "grids": full_grids(original),
        "backbone_dirs": backbone_dirs(config),
        "precision": config.get("rehearsal_precision"),
    }
