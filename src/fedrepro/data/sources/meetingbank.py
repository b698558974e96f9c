"""MeetingBank: one of the four long-meeting clients of AdaFedSelecKD (§V-B4, Fig. 9).

Upstream: the hub dataset ``huuuyeah/meetingbank`` at ``main`` (:func:`download_meetingbank`):
``*.parquet`` with columns ``{id, uid, summary, transcript}``, which :func:`parse_meetingbank`
reads. The record layout and the code shared with AMI, ICSI and ELITR are in
:mod:`fedrepro.data.sources._meetings`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedrepro.data.sources import Records, sample_writer
from fedrepro.data.sources._meetings import (
    _clean,
    _Collector,
    _config_key,
    _hub_download,
    _iter_json_lines,
    _record,
    _req_text,
    _require_file,
    _split_of,
    _staged_download,
    register_source,
)
from fedrepro.io import InputError

__all__ = [
    "MEETINGBANK_HUB_ID",
    "MEETINGBANK_REVISION",
    "download_meetingbank",
    "parse_meetingbank",
]


MEETINGBANK_HUB_ID = "huuuyeah/meetingbank"
MEETINGBANK_REVISION = "main"
"""Branch pinned for ``huuuyeah/meetingbank``: no commit SHA of this repository could be verified
offline, so :func:`download_meetingbank` takes ``revision`` as a parameter — set it to a commit SHA
for byte-stable reruns."""
MEETINGBANK_FIELDS: tuple[str, ...] = ("id", "uid", "summary", "transcript")
_MB_SPEAKER = re.compile(r"(?:^|(?<=\s))(Speaker \d+):\s*")


def download_meetingbank(
    dest_dir: str | os.PathLike, timeout: float = 10.0, *, revision: str = MEETINGBANK_REVISION
) -> Path:
    """Download the parquet files of hub dataset ``huuuyeah/meetingbank`` (Hu et al., ACL 2023).

    Every ``*.parquet`` of the revision lands under ``dest_dir`` at its repository path (e.g.
    ``data/train-00000-of-00001.parquet``); :func:`parse_meetingbank` reads one such file.

    Raises
    ------
    DownloadError
        Naming the dataset, ``huuuyeah/meetingbank`` and the revision, and
        ``data.meetingbank.local_dir``.
    """
    return _staged_download(
        dest_dir,
        lambda staging: _hub_download(
            staging,
            dataset="MeetingBank",
            repo_id=MEETINGBANK_HUB_ID,
            revision=revision,
            patterns=("*.parquet",),
            timeout=timeout,
            config_key=_config_key("meetingbank"),
        ),
        cleanup=(".cache",),
    )


def _meetingbank_rows(path: Path, out: _Collector) -> Iterator[tuple[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:
            raise InputError(f"{path}: not a readable parquet file ({exc})") from exc
        for i, row in enumerate(rows, start=1):
            yield f"row {i}", row
    else:
        for lineno, obj in _iter_json_lines(path, out):
            yield f"{lineno}", obj


def parse_meetingbank(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Parse one MeetingBank split file (parquet as on the hub, or JSON lines with the same fields).

    AdaFedSelecKD §V-B4 uses MeetingBank [9] (city-council meetings) as one long-meeting client.
    Each row ``{id, uid, summary, transcript}`` is one meeting *segment* (an agenda item) with its
    reference summary; ``uid`` (e.g. ``SeattleCityCouncil_06132016_Res 31669``) is the record's
    original id. The transcript already carries its diarized speaker labels (``"Speaker 0: ..."``),
    which are kept as tokens; ``meta.n_turns`` counts them. The split is the file name's
    (``train``/``validation``/``test``).

    Raises
    ------
    InputError
        For a row with a missing/empty ``uid``, ``summary`` or ``transcript`` (or a duplicate
        ``uid``), naming the file, the row (and ``uid``) and the field.
    """
    path = Path(path)
    _require_file(path, "meetingbank")
    split = _split_of(path)
    out = _Collector(skip_malformed, path)
    for where, row in _meetingbank_rows(path, out):
        uid = row.get("uid") if isinstance(row, dict) else None
        label = f"{where} (uid={uid})" if isinstance(uid, str) else where
        out.add(label, lambda row=row, label=label: _meetingbank_record(row, path, label, split))
    return out.result()


def _meetingbank_record(row: Any, path: Path, where: str, split: str) -> dict:
    uid = _req_text(row, "uid", path, where)
    summary = _req_text(row, "summary", path, where)
    transcript = _req_text(row, "transcript", path, where)
    text = _clean(transcript)
    pieces = _MB_SPEAKER.split(text)
    turns: list[tuple[str, str]] = []
    if pieces[0].strip():
        turns.append(("", pieces[0].strip()))
    for speaker, said in zip(pieces[1::2], pieces[2::2]):
        turns.append((speaker, said.strip()))
    rec = _record(
        "meetingbank",
        split,
        uid,
        [t for t in turns if t[0]],
        summary,
        {"uid": uid, "meetingbank_id": row.get("id")},
    )
    rec["input"] = text  # the labelled transcript as released (labels already in place)
    rec["meta"]["n_words"] = len(_MB_SPEAKER.sub(" ", text).split())
    return rec


register_source(
    "meetingbank",
    parse_meetingbank,
    download_meetingbank,
    sample_writer("meetings", "write_meetingbank_samples"),
    upstream=f"hf://datasets/{MEETINGBANK_HUB_ID} @ {MEETINGBANK_REVISION}",
    splits=("train", "validation", "test"),
)
