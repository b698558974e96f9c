"""What a run builds, per paper: its targets (tables and figures), the training cells each reads,
and the papers' scorecard specs -- read from the papers' grids, plain Python over the config lists
(no Snakemake DAG), so it answers in a fraction of a second even for the paper grid.

The targets are the ones the Snakefile's ``rule all`` asks for (``rules/<paper>.smk``):
AdaFedSelecKD's main tables whose backbone is configured and the experiments configured under
``adafedseleckd.experiments``; every FedMCP target; every FedSum and FedSUMM target when the
paper's section is in the config. A cell is *done* when its ``scores.json`` exists (the file every
table and figure rule reads; it is written last, atomically).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from fedrepro.papers.adafedseleckd import grid as ada
from fedrepro.papers.fedmcp import grid as fedmcp
from fedrepro.papers.fedsum import grid as fedsum
from fedrepro.papers.fedsumm import grid as fedsumm

PAPERS = ("adafedseleckd", "fedmcp", "fedsum", "fedsumm")
DONE_FILE = "scores.json"
"""A cell's completeness marker."""


def targets(config: dict) -> dict[str, dict[str, str]]:
    """``{paper: {target: "table" | "figure"}}`` of the targets ``rule all`` builds."""
    out: dict[str, dict[str, str]] = {p: {} for p in PAPERS}
    a = config.get("adafedseleckd") or {}
    for t, backbone in ada.TABLE_BACKBONES.items():
        if backbone in a.get("backbones", []):
            out["adafedseleckd"][t] = "table"
    for e in ada.EXPERIMENTS:
        if e in (a.get("experiments") or {}):
            out["adafedseleckd"][e] = "table" if e in ada.TABLE_EXPERIMENTS else "figure"
    if "fedmcp" in config:
        out["fedmcp"] = dict(fedmcp.TARGETS)
    if "fedsum" in config:
        out["fedsum"] = dict(fedsum.TARGETS)
    if "fedsumm" in config:
        out["fedsumm"] = dict(fedsumm.TARGETS)
    return out


def table_files(config: dict) -> list[str]:
    """``results/tables/<paper>_<target>.csv`` of every table target."""
    return [f"results/tables/{p}_{t}.csv" for p, ts in targets(config).items()
            for t, kind in ts.items() if kind == "table"]


def target_cells(config: dict, paper: str, target: str) -> list[str]:
    """The training-cell folders ``paper``'s ``target`` reads."""
    if paper == "adafedseleckd":
        if target in ada.TABLE_BACKBONES:
            return ada.table_cells(config, target)
        return list(dict.fromkeys(c for cs in ada.experiment_cells(config, target).values()
                                  for c in cs))
    if paper == "fedmcp":
        return fedmcp.target_cells(config, target)
    if paper == "fedsum":
        return fedsum.target_cells(config, target)
    if paper == "fedsumm":
        return list(dict.fromkeys(fedsumm.target_cells(config, target)))
    raise KeyError(f"unknown paper {paper!r}; known: {list(PAPERS)}")


def is_done(cell: str, root: str | Path = ".") -> bool:
    return (Path(root) / cell / DONE_FILE).is_file()


def scorecard_specs() -> tuple[list, list]:
    """``(table specs, headlines)`` of every paper (``fedrepro.papers.<paper>.scorecard``)."""
    specs, headlines = [], []
    for paper in PAPERS:
        module = importlib.import_module(f"fedrepro.papers.{paper}.scorecard")
        specs += list(module.TABLES)
        headlines += list(module.HEADLINES)
    return specs, headlines
