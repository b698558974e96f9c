"""Source-agnostic preparation: raw release folder → one normalized records file per source.

Every data file below the raw folder is handed to the source's registered parser
(:mod:`fedrepro.data.sources`); records carry their own split, so the raw layout of each release
(``val.json``, ``<TASK>/dev.tsv``, ``test.src.txt`` …) needs no per-source bookkeeping here.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fedrepro.data import sources
from fedrepro.io import InputError, write_json_atomic, write_jsonl_atomic

log = logging.getLogger(__name__)

DATA_SUFFIXES = (".jsonl", ".json", ".tsv", ".csv", ".parquet", ".txt")
_SKIP_NAMES = ("license", "readme", "notice")


def data_files(raw_dir: str | Path) -> list[Path]:
    """The data files of a raw release folder (licences, readmes and hidden files left out)."""
    raw_dir = Path(raw_dir)
    if not raw_dir.exists():
        raise InputError(f"{raw_dir}: raw data folder not found")
    files = [raw_dir] if raw_dir.is_file() else sorted(p for p in raw_dir.rglob("*") if p.is_file())
    return [
        p
        for p in files
        if p.suffix.lower() in DATA_SUFFIXES
        and not p.name.startswith(".")
        and not p.name.lower().startswith(_SKIP_NAMES)
    ]


def prepare_source(name: str, raw_dir: str | Path, out_path: str, report_path: str,
                   skip_malformed: bool = False, parse_options: dict | None = None) -> dict:
    """Parse every data file of ``raw_dir`` with source ``name``; write records and a report.

    Records parsed twice (a parser that reads a pair of files, e.g. LCSTS's ``.src``/``.tgt``) are
    kept once; two *different* records with one id are an error.
    """
    source = sources.get(name)
    by_id: dict[str, dict] = {}
    skipped: dict[tuple[str, str], str] = {}  # (item, reason) -> file; a file pair parsed twice counts once
    files = [Path(raw_dir)] if source.whole_folder else data_files(raw_dir)
    if not files:
        raise InputError(f"{raw_dir}: no data files for source {name!r} (config key {source.config_key})")
    for path in files:
        records = source.parse(path, skip_malformed=skip_malformed, **(parse_options or {}))
        for item, why in getattr(records, "skipped", []):
            skipped.setdefault((str(item), why), str(path))
        for rec in records:
            old = by_id.get(rec["id"])
            if old is not None and old != rec:
                raise InputError(f"{path}: record id {rec['id']} occurs twice with different content")
            by_id[rec["id"]] = rec
    records = [by_id[k] for k in sorted(by_id)]
    write_jsonl_atomic(out_path, records)
    counts: dict[str, int] = {}
    for rec in records:
        key = rec["split"] if source.kind == "seq2seq" else f"{rec['task']}/{rec['split']}"
        counts[key] = counts.get(key, 0) + 1
    report = {"source": name, "raw_dir": str(raw_dir), "files": [str(p) for p in files],
              "counts": counts, "skipped": len(skipped),
              "skipped_examples": [[f, item, why] for (item, why), f in list(skipped.items())[:20]]}
    write_json_atomic(report_path, report)
    log.info("%s: %s (skipped %d)", name, counts, len(skipped))
    return report
