"""NLPCC 2017 shared task 3 (Toutiao news -> summary): one of FedSUMM's Chinese clients (§IV-A).

Raw layout read by :func:`parse_nlpcc2017`: JSON lines ``{"summarization", "article"}``
(``train_with_summ.txt``, ...) or the hub copy's ``{"data": [{"title", "content"}]}``.
:func:`download_nlpcc2017` fetches the hub dataset ``supremezxc/nlpcc_2017`` @
:data:`NLPCC2017_REVISION` (``nlpcc_data.json``). 
Record layout, split names and the code shared with the other Chinese corpora are in
:mod:`fedrepro.data.sources._chinese`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from fedrepro.data.sources import Records, sample_writer
from fedrepro.data.sources._chinese import (
    _hub_download,
    _iter_json_lines,
    _Malformed,
    _read_text,
    _record,
    _split_from_name,
    _text,
    register_source,
)
from fedrepro.io import InputError

__all__ = [
    "NLPCC2017_HUB_ID",
    "NLPCC2017_REVISION",
    "download_nlpcc2017",
    "parse_nlpcc2017",
]

NLPCC2017_HUB_ID = "supremezxc/nlpcc_2017"
NLPCC2017_REVISION = "aadf712d40e83f2061b9fe06b9d30ff3f091a494"
"""The hub commit that uploaded ``nlpcc_data.json`` (the later ``main`` commit only edits the
README)."""
NLPCC2017_HUB_FILE = "nlpcc_data.json"
NLPCC2017_FILE_SPLITS: dict[str, str] = {
    "train_with_summ.txt": "train",  # official training release (toutiao4nlpcc/)
    "evaluation_with_ground_truth.txt": "test",  # official evaluation set with references
    NLPCC2017_HUB_FILE: "train",  # hub copy of the 50,000 training pairs
}


def download_nlpcc2017(
    dest_dir: str | os.PathLike, timeout: float = 10.0, revision: str = NLPCC2017_REVISION
) -> Path:
    """Download the NLPCC 2017 shared task 3 (single-document summarization) training pairs.

    The official release (``tcci.ccf.org.cn``, Toutiao news, JSON lines ``{"summarization",
    "article"}``; 50,000 training pairs) has no stable download address; this fetches the hub
    copy ``supremezxc/nlpcc_2017`` (``nlpcc_data.json``, a JSON document
    ``{"data": [{"title": <summary>, "content": <article>}, ...]}``) at ``revision``, which
    :func:`parse_nlpcc2017` reads as the ``train`` split. Not verified offline: the hub file's
    layout is taken from the code that uses it (``load_dataset("json", field="data")``).

    Raises
    ------
    DownloadError
        Naming the dataset, the hub id and revision and the config key
        ``data.nlpcc2017.local_dir``.
    """
    return _hub_download(
        dataset="NLPCC 2017 shared task 3 (single-document summarization)",
        name="nlpcc2017",
        repo_id=NLPCC2017_HUB_ID,
        revision=revision,
        files=(NLPCC2017_HUB_FILE,),
        dest_dir=dest_dir,
        timeout=timeout,
        layout="the official train_with_summ.txt / evaluation_with_ground_truth.txt JSON lines, "
        "or nlpcc_data.json",
    )


def _nlpcc_split(path: Path) -> str:
    if path.name in NLPCC2017_FILE_SPLITS:
        return NLPCC2017_FILE_SPLITS[path.name]
    return _split_from_name(path, path.name.split(".")[0])


def _nlpcc_document(path: Path, bad: _Malformed) -> Iterator[tuple[int, dict]]:
    """Records of a whole-file JSON document: ``{"data": [...]}`` or a list."""
    try:
        doc = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
    items = doc.get("data") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise InputError(
            f'{path}: expected a JSON list of records or {{"data": [...]}}, got '
            f"{type(doc).__name__}{' without a `data` list' if isinstance(doc, dict) else ''}"
        )
    for index, obj in enumerate(items):
        if not isinstance(obj, dict):
            bad(f"record {index}", "<record>", f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield index, obj


def _paragraphs(article: str) -> list[str]:
    """Paragraphs of an NLPCC article (``<Paragraph>`` markers or newlines), blanks dropped."""
    return [p.strip() for p in re.split(r"<Paragraph>|\n", article) if p.strip()]


def parse_nlpcc2017(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Records of one NLPCC 2017 task 3 file: input = article, target = reference summary.

    Accepted files:

    * the official JSON lines ``{"summarization": ..., "article": ...}`` (``train_with_summ.txt``
      -> train, ``evaluation_with_ground_truth.txt`` -> test, or any ``<split>.jsonl``); the
      article's ``<Paragraph>`` markers become newlines;
    * the hub copy ``nlpcc_data.json`` (``{"data": [{"title": <summary>, "content": <article>}]}``,
      the training pairs) or any ``<split>.json`` in that layout.

    Ids are ``nlpcc2017-<split>-<line or record index>``.
    """
    path = Path(path)
    split = _nlpcc_split(path)
    bad = _Malformed(path, skip_malformed)
    items: Iterator[tuple[int | str, str, dict, dict]]
    if path.suffix.lower() == ".json":  # whole-file document (the hub copy)
        items = (
            (f"record {i}", f"r{i:06d}", {"record_index": i}, obj)
            for i, obj in _nlpcc_document(path, bad)
        )
    else:  # JSON lines (the official release)
        items = (
            (lineno, f"{lineno:06d}", {"line": lineno}, obj)
            for lineno, obj in _iter_json_lines(path, bad)
        )
    records: list[dict] = []
    for loc, key, where, obj in items:
        # official field names, or the hub copy's (title = the reference summary)
        summary_key = "title" if "summarization" not in obj and "title" in obj else "summarization"
        article_key = "content" if "article" not in obj and "content" in obj else "article"
        summary = _text(obj, summary_key, bad, loc)
        article = summary and _text(obj, article_key, bad, loc)
        if not (summary and article):
            continue
        paragraphs = _paragraphs(article)
        records.append(
            _record(
                "nlpcc2017",
                split,
                key,
                "\n".join(paragraphs),
                summary,
                paragraphs=len(paragraphs),
                **where,
            )
        )
    return Records(records, bad.skipped)


register_source(
    "nlpcc2017",
    parse_nlpcc2017,
    download_nlpcc2017,
    sample_writer("chinese", "write_nlpcc2017_samples"),
    upstream=f"hf://datasets/{NLPCC2017_HUB_ID} @ {NLPCC2017_REVISION}",
    splits=("train", "test"),
)
