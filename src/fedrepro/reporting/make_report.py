"""``make report``: Snakemake's report of what the last run wrote, as one self-contained HTML file.

Two Snakemake calls (run from the workflow's root):

1. build what the report shows that a run does not write -- each table's HTML rendering, the
   provenance page (always redone: benchmarks change without the tables changing) and the
   scorecard of the tables on disk (``report_scorecard``; the tables not built yet are printed) --
   with only the report's own rules allowed, so
   that a stale or missing cell is never retrained here (Snakemake's ``--allowed-rules``: the
   tables and figures already on disk are taken as they are);
2. ``snakemake report_contents --report results/report.html``.

``report_contents`` lists only the tables and figures on disk when Snakemake parses the workflow
(``rules/report.smk``), so the report covers whatever was run: the whole demo, the paper grid or
one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPORT_RULE_PREFIXES = ("report_", "scorecard")


def _snakemake() -> str:
    exe = Path(sys.executable).parent / "snakemake"
    return str(exe) if exe.exists() else "snakemake"


def _run(args: list[str], cwd: Path) -> str:
    res = subprocess.run([_snakemake(), *args], check=False, cwd=cwd, capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise SystemExit(
            f"snakemake {' '.join(args)} failed (exit {res.returncode}):\n"
            f"{(res.stdout + res.stderr)[-4000:]}"
        )
    return res.stdout


def build(root: Path, out: Path, configfiles: list[str], directory: str | None,
          cores: str = "all") -> Path:
    """Build the report's pages and write the report to ``out`` (relative to the working
    directory of the run: ``directory`` or ``root``); return its path."""
    if out.suffix != ".html":
        raise SystemExit(f"{out}: the report must be a .html file (one self-contained page)")
    common = (["--configfile", *configfiles] if configfiles else []) + (
        ["--directory", directory] if directory else []
    )
    rules = [
        r.strip() for r in _run(["--list-rules", *common], root).splitlines()
        if r.strip().startswith(REPORT_RULE_PREFIXES)
    ]
    # targets first: --configfile takes every word after it
    _run(["report_contents", "--cores", cores, "--forcerun", "report_provenance", *common,
          "--allowed-rules", *rules], root)
    _run(["report_contents", "--report", str(out), *common], root)
    written = Path(directory or root) / out
    if not written.is_file():
        raise SystemExit(f"{written}: Snakemake reported success but wrote no report")
    prov = json.loads((Path(directory or root) / "results/report/provenance.json").read_text())
    if not prov["entries"]:
        print("no table or figure of this config is on disk yet: the report shows provenance "
              "only (run `make demo`, or a table's target, first)")
    missing = prov.get("scorecard_missing")
    if missing:
        print(f"the scorecard covers the tables on disk; {len(missing)} tables of the config are "
              f"not built yet: {', '.join(missing)}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", nargs="*", default=[])
    parser.add_argument("--directory", default=None, help="the run's working directory")
    parser.add_argument("--out", default="results/report.html")
    parser.add_argument("--cores", default="all")
    args = parser.parse_args(argv)
    root = Path(os.getcwd())  # the workflow's root (``make report`` runs there)
    if not (root / "Snakefile").is_file():
        root = Path(__file__).resolve().parents[3]
    path = build(root, Path(args.out), args.configfile, args.directory, args.cores)
    print(f"{path} written: open it in a browser")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
