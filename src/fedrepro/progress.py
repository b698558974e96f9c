"""Which cells of a run are done: per paper and target, cells done / total and whether the
target's output exists -- from the files present and the grids (:mod:`fedrepro.catalog`), without
building Snakemake's DAG, so it is cheap to run beside a long ``snakemake`` run.

    python -m fedrepro.progress [--configfile config/paper.yaml ...] [--root DIR]
    make progress
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedrepro import catalog
from fedrepro.io import InputError

DEFAULT_CONFIG = "config/config.yaml"
"""The Snakefile's ``configfile:``; ``--configfile`` files override it."""


@dataclass(frozen=True)
class TargetProgress:
    paper: str
    target: str
    kind: str
    done: int
    total: int
    built: bool
    """The target's main output file exists."""


def output_path(paper: str, target: str, kind: str) -> str:
    folder, ext = ("tables", "csv") if kind == "table" else ("figures", "png")
    return f"results/{folder}/{paper}_{target}.{ext}"


def progress(config: dict, root: str | Path = ".") -> list[TargetProgress]:
    """One :class:`TargetProgress` per target of the run; ``root`` is the workflow directory."""
    out = []
    for paper, ts in catalog.targets(config).items():
        for target, kind in ts.items():
            cells = catalog.target_cells(config, paper, target)
            done = sum(catalog.is_done(c, root) for c in cells)
            built = (Path(root) / output_path(paper, target, kind)).is_file()
            out.append(TargetProgress(paper, target, kind, done, len(cells), built))
    return out


def distinct_cells(config: dict, root: str | Path = ".") -> tuple[int, int]:
    """``(done, total)`` over the run's distinct cells (a cell several targets read counts once)."""
    cells = {c for paper, ts in catalog.targets(config).items() for t in ts
             for c in catalog.target_cells(config, paper, t)}
    return sum(catalog.is_done(c, root) for c in cells), len(cells)


def render(rows: list[TargetProgress], distinct: tuple[int, int] | None = None) -> str:
    """A plain-text table: paper, target, cells done/total, built; then the totals."""
    lines = [f"{'paper':<14} {'target':<14} {'cells':>11}  output"]
    for r in rows:
        mark = "built" if r.built else ("ready" if r.done == r.total else "-")
        lines.append(f"{r.paper:<14} {r.target:<14} {f'{r.done}/{r.total}':>11}  {mark}")
    done = sum(r.done for r in rows)
    total = sum(r.total for r in rows)
    built = sum(r.built for r in rows)
    lines.append(f"targets built {built}/{len(rows)}; cell reads done {done}/{total} "
                 "(a cell read by several targets counts once per target)")
    if distinct is not None:
        lines.append(f"distinct cells done {distinct[0]}/{distinct[1]}")
    return "\n".join(lines) + "\n"


def load_config(paths: list[str]) -> dict:
    """The config files merged in order (later keys override earlier ones, deep), as Snakemake."""
    config: dict = {}
    for p in paths:
        try:
            data = yaml.safe_load(Path(p).read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise InputError(f"{p}: config file not found") from None
        _merge(config, data)
    return config


def _merge(base: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedrepro.progress", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", nargs="+", default=[],
                    help="config file(s) as given to snakemake; like the Snakefile, "
                         "config/config.yaml is read first and these override it")
    ap.add_argument("--root", default=".", help="the workflow directory (default: .)")
    args = ap.parse_args(argv)
    root = Path(args.root)
    files = [root / DEFAULT_CONFIG] + [Path(p) if Path(p).is_absolute() else root / p
                                      for p in args.configfile]
    config = load_config([str(p) for p in dict.fromkeys(files)])
    sys.stdout.write(render(progress(config, root), distinct_cells(config, root)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
