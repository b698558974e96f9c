"""EDUCATION (education-industry short text -> summary): a FedSUMM Chinese client (§IV-A).

Not public: :func:`download_education` raises :class:`~fedrepro.io.InputError` at once and explains
the local-copy format that :func:`parse_education` reads, ``<split>.jsonl`` with ``{"id", "content",
"summary"}`` lines (a format defined here). 
Record layout, split names and the code shared with the other Chinese corpora are in
:mod:`fedrepro.data.sources._chinese`.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedrepro.data.sources import Records, sample_writer
from fedrepro.data.sources._chinese import (
    _config_key,
    _iter_json_lines,
    _Malformed,
    _record,
    _split_from_name,
    _text,
    register_source,
)
from fedrepro.io import InputError

__all__ = [
    "download_education",
    "parse_education",
]

def download_education(dest_dir: str | os.PathLike, timeout: float = 10.0) -> Path:
    """EDUCATION cannot be downloaded: it is not public. Raises at once, touching nothing.

    FedSUMM (§IV-A) describes EDUCATION as "a dataset about mainstream vertical media in the
    education and training industry, which consists of over 2 million real Chinese short texts"; no
    release, address or licence is given anywhere.

    Raises
    ------
    InputError
        Always, explaining the local-copy format and the config key ``data.education.local_dir``.
    """
    raise InputError(
        "EDUCATION (FedSUMM §IV-A: short texts from education and training industry media) is not "
        "publicly available, so it cannot be downloaded. Obtain a copy from the authors and set the "
        f"config key `{_config_key('education')}` to a folder holding `train.jsonl`, `val.jsonl` "
        'and `test.jsonl`: JSON lines `{"id": <string or integer, unique per file>, '
        '"content": <text>, "summary": <summary>}`, UTF-8.'
    )


def parse_education(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Records of one EDUCATION split file ``<split>.jsonl`` (the local-copy format).

    Each line is ``{"id": <string or integer>, "content": <text>, "summary": <summary>}``; ids must
    be unique within the file. Record ids are ``education-<split>-<id>``.
    """
    path = Path(path)
    split = _split_from_name(path, path.name.split(".")[0])
    bad = _Malformed(path, skip_malformed)
    seen: dict[str, int] = {}
    records: list[dict] = []
    for lineno, obj in _iter_json_lines(path, bad):
        raw_id = obj.get("id")
        if raw_id is None:
            bad(lineno, "id", "missing")
            continue
        if (
            isinstance(raw_id, bool)
            or not isinstance(raw_id, (str, int))
            or not str(raw_id).strip()
        ):
            bad(lineno, "id", f"expected a non-empty string or an integer, got {raw_id!r}")
            continue
        doc_id = str(raw_id).strip()
        if doc_id in seen:
            bad(lineno, "id", f"duplicate id {doc_id!r} (first on line {seen[doc_id]})")
            continue
        content = _text(obj, "content", bad, lineno)
        summary = content and _text(obj, "summary", bad, lineno)
        if not (content and summary):
            continue
        seen[doc_id] = lineno
        records.append(_record("education", split, doc_id, content, summary, line=lineno))
    return Records(records, bad.skipped)


register_source(
    "education",
    parse_education,
    download_education,
    sample_writer("chinese", "write_education_samples"),
    upstream="not public (local copy only, see download_education)",
    splits=("train", "val", "test"),
)
