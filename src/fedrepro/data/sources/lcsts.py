"""LCSTS (Hu et al., EMNLP 2015; Weibo post -> headline): one of FedSUMM's Chinese clients (§IV-A).

Raw layout read by :func:`parse_lcsts`: ``<split>.src.txt`` + ``<split>.tgt.txt`` (parallel lines)
or JSON lines ``{"text", "summary"[, "human_label"]}``. :func:`download_lcsts` fetches the hub
dataset ``aligeniewcp22/LCSTS`` @ :data:`LCSTS_REVISION` (``train/valid/test_public.jsonl``).

Record layout, split names and the code shared with the other Chinese corpora are in
:mod:`fedrepro.data.sources._chinese`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fedrepro.data.sources import Records, sample_writer
from fedrepro.data.sources._chinese import (
    _count_lines,
    _hub_download,
    _iter_json_lines,
    _iter_lines,
    _Malformed,
    _record,
    _split_from_name,
    _text,
    register_source,
)
from fedrepro.io import InputError

__all__ = [
    "LCSTS_HUB_ID",
    "LCSTS_REVISION",
    "download_lcsts",
    "parse_lcsts",
]

LCSTS_HUB_ID = "aligeniewcp22/LCSTS"
LCSTS_REVISION = "0056707cbf6a5ece8a70c550ed00a451a7449903"
LCSTS_HUB_FILES: tuple[str, ...] = ("train.jsonl", "valid.jsonl", "test_public.jsonl")


def download_lcsts(
    dest_dir: str | os.PathLike, timeout: float = 10.0, revision: str = LCSTS_REVISION
) -> Path:
    """Download LCSTS (Hu et al., EMNLP 2015) from the hub copy ``aligeniewcp22/LCSTS``.

    Files ``train.jsonl`` (2,400,591 pairs), ``valid.jsonl`` (8,685) and ``test_public.jsonl``
    (725), JSON lines ``{"text", "summary"[, "human_label"]}`` (the copy's README), at
    ``revision``. The parallel-line copy of the 10,666 human-scored pairs
    (``test.src.txt``/``test.tgt.txt``, as distributed with benchmark suites) is read by the same
    parser; point ``data.lcsts.local_dir`` at it to use it instead.

    Raises
    ------
    DownloadError
        Naming the dataset, the hub id and revision and the config key ``data.lcsts.local_dir``.
    """
    return _hub_download(
        dataset="LCSTS (Large-scale Chinese Short Text Summarization)",
        name="lcsts",
        repo_id=LCSTS_HUB_ID,
        revision=revision,
        files=LCSTS_HUB_FILES,
        dest_dir=dest_dir,
        timeout=timeout,
        layout="<split>.src.txt + <split>.tgt.txt parallel lines, or <split>.jsonl with text/summary",
    )


def _lcsts_pair(path: Path) -> tuple[Path, Path, str]:
    """(src file, tgt file, split prefix) for either file of a pair or their common prefix."""
    for suffix in (".src.txt", ".tgt.txt"):
        if path.name.endswith(suffix):
            prefix = path.name[: -len(suffix)]
            break
    else:
        prefix = path.name
    src = path.with_name(f"{prefix}.src.txt")
    tgt = path.with_name(f"{prefix}.tgt.txt")
    missing = [str(p) for p in (src, tgt) if not p.is_file()]
    if missing:
        raise InputError(
            f"LCSTS parallel files {src} and {tgt}: {', '.join(missing)} not found; a split is a pair "
            f"<split>.src.txt (texts) + <split>.tgt.txt (summaries), one pair per line"
        )
    return src, tgt, prefix


def _parse_lcsts_jsonl(path: Path, bad: _Malformed) -> list[dict]:
    split = _split_from_name(path, path.name.split(".")[0])
    records: list[dict] = []
    for lineno, obj in _iter_json_lines(path, bad):
        text = _text(obj, "text", bad, lineno)
        summary = text and _text(obj, "summary", bad, lineno)
        if not (text and summary):
            continue
        meta: dict[str, Any] = {"line": lineno}
        label = obj.get("human_label")
        if label is not None:
            if isinstance(label, bool) or not isinstance(label, int):
                bad(lineno, "human_label", f"expected an integer score, got {label!r}")
                continue
            meta["human_label"] = label
        records.append(_record("lcsts", split, f"{lineno:07d}", text, summary, **meta))
    return records


def parse_lcsts(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Records of one LCSTS split.

    ``path`` is either file of a parallel pair ``<split>.src.txt`` / ``<split>.tgt.txt`` (or
    their common prefix ``<split>``): line *i* of the ``.src`` file (the Weibo text) pairs with
    line *i* of the ``.tgt`` file (its summary), and both files are read. Files of different
    lengths are an :class:`~fedrepro.io.InputError` naming both, even with ``skip_malformed``.
    A ``.jsonl`` file holds ``{"text", "summary"[, "human_label"]}`` lines (the hub copy).
    Ids are ``lcsts-<split>-<line>``.
    """
    path = Path(path)
    bad = _Malformed(path, skip_malformed)
    if path.suffix.lower() in (".jsonl", ".json"):
        return Records(_parse_lcsts_jsonl(path, bad), bad.skipped)
    src, tgt, prefix = _lcsts_pair(path)
    split = _split_from_name(path, prefix)
    n_src, n_tgt = _count_lines(src), _count_lines(tgt)
    if n_src != n_tgt:
        longer, shorter = (src, tgt) if n_src > n_tgt else (tgt, src)
        raise InputError(
            f"LCSTS parallel files differ in length: {src} has {n_src} lines but {tgt} has "
            f"{n_tgt} ({longer}:{min(n_src, n_tgt) + 1} and the lines after it have no partner "
            f"in {shorter.name}); line i of the .src file must pair with line i of the .tgt file"
        )
    bad_src, bad_tgt = _Malformed(src, skip_malformed), _Malformed(tgt, skip_malformed)
    records: list[dict] = []
    for (lineno, text), (_, summary) in zip(_iter_lines(src), _iter_lines(tgt), strict=True):
        text_s = _text({"text": text}, "text", bad_src, lineno)
        if text_s is None:
            continue
        summary_s = _text({"summary": summary}, "summary", bad_tgt, lineno)
        if summary_s is not None:
            records.append(_record("lcsts", split, f"{lineno:07d}", text_s, summary_s, line=lineno))
    skipped = sorted(bad_src.skipped + bad_tgt.skipped, key=lambda s: int(s[0]))
    return Records(records, skipped)


register_source(
    "lcsts",
    parse_lcsts,
    download_lcsts,
    sample_writer("chinese", "write_lcsts_samples"),
    upstream=f"hf://datasets/{LCSTS_HUB_ID} @ {LCSTS_REVISION}",
    splits=("train", "val", "test"),
)
