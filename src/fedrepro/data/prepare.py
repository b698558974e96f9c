"""Source-agnostic preparation: raw release folder → one normalized records file per source.

Every data file below the raw folder is handed to the source's registered parser
(:mod:`fedrepro.data.sources`); records carry their own split, so the raw layout of each release
(``val.json``, ``<TASK>/dev.tsv``, ``test.src.txt`` …) needs no per-source bookkeeping here.

Two things happen here, over all files of a release, rather than in each file's parser:

* malformed records skipped with ``skip_malformed`` are listed one by one in the report
  (``skipped_records``: file, record, id, field, problem);
* a release without a test split (NLPCC2017's pinned download holds only the training pairs) can
  get a seeded held-out test split of its train records (:func:`hold_out_test`, config keys
  ``data.<source>.heldout_test_fraction`` / ``heldout_test_seed``); a release that has a test split
  is left as it is.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

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


_FIELD = re.compile(r"field `(?P<field>[^`]+)`: (?P<problem>.*)$", re.S)
_ID = re.compile(r"\(id (?P<id>[^)]+)\)")


def skipped_entry(path: str, item: str, why: str) -> dict:
    """One skipped record for the report: ``{file, record, id, field, problem}`` (``id`` and
    ``field`` are ``None`` where the parser's reason does not name them)."""
    field = _FIELD.search(why)
    rec_id = _ID.search(why)
    return {"file": path, "record": item, "id": rec_id["id"] if rec_id else None,
            "field": field["field"] if field else None,
            "problem": field["problem"] if field else why}


def hold_out_test(records: list[dict], name: str, fraction: float, seed: int) -> tuple[list[dict], dict]:
    """Move a seeded ``fraction`` of the train records to a new ``test`` split.

    ``round(fraction * #train)`` records (at least one) are drawn without replacement from the
    train ids (sorted, then permuted by a generator seeded from ``(seed, "heldout-test", name)``),
    so the held-out set depends only on the train ids, the fraction and the seed. A moved record
    gets ``split: test``, the id ``<name>-test-…`` for ``<name>-train-…`` and its former id in
    ``meta.heldout_from``. Returns the records (sorted by id) and the report entry.
    """
    from fedrepro.data.seq2seq import derive_seed

    if not 0 < fraction < 1:
        raise InputError(f"data.{name}.heldout_test_fraction must be in (0, 1), got {fraction}")
    train = sorted(r["id"] for r in records if r["split"] == "train")
    if len(train) < 2:
        raise InputError(f"{name}: {len(train)} train record(s), too few to hold out a test split "
                         f"(data.{name}.heldout_test_fraction)")
    n = max(1, round(fraction * len(train)))
    order = np.random.default_rng(derive_seed(seed, "heldout-test", name)).permutation(len(train))
    held = {train[i] for i in order[:n]}
    out = []
    for rec in records:
        if rec["id"] in held:
            old = rec["id"]
            new_id = f"{name}-test-{old[len(name) + 7:]}" if old.startswith(f"{name}-train-") else f"{old}-test"
            rec = {**rec, "id": new_id, "split": "test", "meta": {**rec.get("meta", {}), "heldout_from": old}}
        out.append(rec)
    if len({r["id"] for r in out}) != len(out):
        raise InputError(f"{name}: held-out test ids collide with existing ids")
    entry = {"from": "train", "fraction": fraction, "seed": seed, "count": n,
             "why": "the raw data has no test split"}
    return sorted(out, key=lambda r: r["id"]), entry


def prepare_source(name: str, raw_dir: str | Path, out_path: str, report_path: str,
                   skip_malformed: bool = False, parse_options: dict | None = None,
                   heldout_test: dict | None = None) -> dict:
    """Parse every data file of ``raw_dir`` with source ``name``; write records and a report.

    Records parsed twice (a parser that reads a pair of files, e.g. LCSTS's ``.src``/``.tgt``) are
    kept once; two *different* records with one id are an error. ``heldout_test``
    (``{"fraction", "seed"}``) draws a test split from the train records (:func:`hold_out_test`)
    when the parsed records have no test split; otherwise it is ignored. The report holds the
    counts per split, ``heldout_test`` (the draw, or ``None``), ``skipped`` (how many malformed
    records were left out) and ``skipped_records`` (each of them: file, record, id, field, problem).
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
    if not records:
        raise InputError(
            f"{raw_dir}: no {name} records in {len(files)} data file(s)"
            + (f" ({len(skipped)} malformed record(s) skipped)" if skipped else "")
            + f"; check the raw copy (config key {source.config_key})"
        )
    heldout = None
    if heldout_test and source.kind == "seq2seq" and not any(r["split"] == "test" for r in records):
        records, heldout = hold_out_test(records, name, float(heldout_test["fraction"]),
                                         int(heldout_test.get("seed", 0)))
        log.info("%s: no test split in %s; held out %d train records as test (fraction %s, seed %s)",
                 name, raw_dir, heldout["count"], heldout["fraction"], heldout["seed"])
    write_jsonl_atomic(out_path, records)
    counts: dict[str, int] = {}
    for rec in records:
        key = rec["split"] if source.kind == "seq2seq" else f"{rec['task']}/{rec['split']}"
        counts[key] = counts.get(key, 0) + 1
    report = {"source": name, "raw_dir": str(raw_dir), "files": [str(p) for p in files],
              "counts": counts, "heldout_test": heldout, "skipped": len(skipped),
              "skipped_records": [skipped_entry(f, item, why) for (item, why), f in skipped.items()]}
    write_json_atomic(report_path, report)
    log.info("%s: %s (skipped %d)", name, counts, len(skipped))
    return report
