"""ICSI: one of the four long-meeting clients of AdaFedSelecKD (§V-B4, Fig. 9).

Upstream: the hub dataset ``YuanPJ/icsi_summ`` at commit ``5c004d8…`` (:func:`download_icsi`):
``data/<split>.json``, a list of ``{sample_id, dialogue: [{id, speaker, text, attributes: {role,
participant, ...}, ...}], summary: [{id, text, type}]}``, which :func:`parse_icsi` reads. The record
layout and the code shared with AMI, ELITR and MeetingBank are in
:mod:`fedrepro.data.sources._meetings`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedrepro.data.sources import Records, sample_writer
from fedrepro.data.sources._meetings import (
    _clean,
    _Collector,
    _config_key,
    _fail,
    _hub_download,
    _iter_json_lines,
    _merge_turns,
    _record,
    _req,
    _req_text,
    _require_file,
    _split_of,
    _staged_download,
    register_source,
)
from fedrepro.io import InputError, read_text

__all__ = [
    "ICSI_HUB_ID",
    "ICSI_REVISION",
    "ICSI_TEST_MEETINGS",
    "download_icsi",
    "parse_icsi",
]


ICSI_HUB_ID = "YuanPJ/icsi_summ"
ICSI_REVISION = "5c004d83f3a78036a706f3d47dbce9c176248f32"
"""Hub commit "add loading script" (30 Mar 2023), the head of ``YuanPJ/icsi_summ`` as recorded by
the hub pages in the project's search index; the data files (``data/<split>.json``) were uploaded in
its parent ``b234f478``. The release lists ``dev.json`` and ``test.json``; :func:`download_icsi`
takes every ``data/*.json`` present (a ``train.json`` too, should the revision have one)."""
ICSI_SUMMARY_TYPES: tuple[str, ...] = ("abstract",)
"""Summary items used as the target: the ``abstract`` part of the ICSI abstractive summaries (the
``decisions``/``problems``/``progress`` parts are not part of the abstract)."""
ICSI_TEST_MEETINGS: tuple[str, ...] = ("Bed004", "Bed009", "Bed016", "Bmr005", "Bmr019", "Bro018")
"""The traditional ICSI test meetings (Shang et al., ACL 2018)."""


def download_icsi(
    dest_dir: str | os.PathLike, timeout: float = 10.0, *, revision: str = ICSI_REVISION
) -> Path:
    """Download the ICSI abstractive-summary release ``YuanPJ/icsi_summ`` (``data/*.json``).

    The release (CC BY 4.0, the ICSI corpus licence) is the ICSI Meeting Corpus (Janin et al., 2003)
    with its AMI-project abstractive summaries in the JSON form of ``guokan-shang/ami-and-icsi-
    corpora``: per meeting ``{sample_id, dialogue: [dialogue acts], summary: [sentences]}``. Files
    land under ``dest_dir/data/`` with their hub names; nothing is left behind on failure.

    Raises
    ------
    DownloadError
        Naming the dataset, ``YuanPJ/icsi_summ`` and the revision, and ``data.icsi.local_dir``.
    """
    return _staged_download(
        dest_dir,
        lambda staging: _hub_download(
            staging,
            dataset="ICSI meeting summaries",
            repo_id=ICSI_HUB_ID,
            revision=revision,
            patterns=("data/*.json",),
            timeout=timeout,
            config_key=_config_key("icsi"),
        ),
        cleanup=(".cache",),
    )


def _load_json_records(path: Path, out: _Collector) -> Iterator[tuple[str, Any]]:
    """``(where, object)`` per meeting of a JSON list, ``{"data": [...]}``, object or JSON lines."""
    if path.suffix == ".jsonl":
        yield from ((f"{n}", o) for n, o in _iter_json_lines(path, out))
        return
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("["):
            raise InputError(
                f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); the file is a JSON list, "
                f"fix or remove the broken meeting"
            ) from exc
        yield from ((f"{n}", o) for n, o in _iter_json_lines(path, out))
        return
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of meetings, got {type(data).__name__}")
    for i, obj in enumerate(data):
        yield f"record {i}", obj


def parse_icsi(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Parse one ICSI split file (``data/train.json``, ``dev.json`` or ``test.json``).

    AdaFedSelecKD §V-B4 uses ICSI (Janin et al., 2003) as one long-meeting client. Each meeting
    ``{sample_id, dialogue, summary}`` becomes one record: consecutive dialogue acts of a speaker
    are one turn, rendered ``"<role> <speaker>: <text>"`` (e.g. ``"PhD F: ..."``, like QMSum's
    Academic domain; just the channel letter when ``attributes.role`` is absent); the target is the
    summary items of type ``abstract`` (:data:`ICSI_SUMMARY_TYPES`). The split comes from the file
    name (``dev`` → ``val``). The file may be a JSON list (the release), ``{"data": [...]}`` or
    JSON lines.

    Raises
    ------
    InputError
        For a malformed meeting (missing/mistyped ``sample_id``, ``dialogue``, a dialogue act's
        ``speaker``/``text``, ``summary``; no non-empty turn; no ``abstract`` item), naming the
        file, the record (and ``sample_id``) and the field.
    """
    path = Path(path)
    _require_file(path, "icsi")
    split = _split_of(path)
    out = _Collector(skip_malformed, path)
    for where, obj in _load_json_records(path, out):
        sid = obj.get("sample_id") if isinstance(obj, dict) else None
        label = f"{where} (sample_id={sid})" if isinstance(sid, str) else where
        out.add(label, lambda obj=obj, label=label: _icsi_record(obj, path, label, split))
    return out.result()


def _icsi_attributes(da: dict, path: Path, where: str, field: str) -> dict:
    attrs = da.get("attributes")
    if attrs is None or attrs == "":
        return {}
    if isinstance(attrs, str):
        try:
            attrs = json.loads(attrs)
        except json.JSONDecodeError:
            raise _fail(path, where, field, "not a JSON object") from None
    if not isinstance(attrs, dict):
        raise _fail(path, where, field, f"expected an object, got {type(attrs).__name__}")
    return attrs


def _icsi_record(obj: Any, path: Path, where: str, split: str) -> dict:
    if not isinstance(obj, dict):
        raise _fail(path, where, "(meeting)", f"expected an object, got {type(obj).__name__}")
    sid = _req_text(obj, "sample_id", path, where)
    dialogue = _req(obj, "dialogue", list, path, where, "dialogue")
    utterances = []
    for j, da in enumerate(dialogue):
        field = f"dialogue[{j}]"
        if not isinstance(da, dict):
            raise _fail(path, where, field, f"expected an object, got {type(da).__name__}")
        speaker = _req_text(da, "speaker", path, where, f"{field}.speaker")
        text = _req(da, "text", str, path, where, f"{field}.text")
        role = _icsi_attributes(da, path, where, f"{field}.attributes").get("role")
        label = f"{role} {speaker}" if isinstance(role, str) and role.strip() else speaker
        utterances.append((_clean(label), text))
    turns = _merge_turns(utterances)
    if not turns:
        raise _fail(path, where, "dialogue", "no dialogue act with text")
    summary = _req(obj, "summary", list, path, where, "summary")
    parts: list[str] = []
    types: dict[str, int] = {}
    for k, item in enumerate(summary):
        field = f"summary[{k}]"
        if not isinstance(item, dict):
            raise _fail(path, where, field, f"expected an object, got {type(item).__name__}")
        text = _req(item, "text", str, path, where, f"{field}.text")
        kind = _req(item, "type", str, path, where, f"{field}.type")
        types[kind] = types.get(kind, 0) + 1
        if kind in ICSI_SUMMARY_TYPES and text.strip():
            parts.append(text.strip())
    if not parts:
        raise _fail(path, where, "summary", f"no non-empty item of type {ICSI_SUMMARY_TYPES}")
    return _record(
        "icsi",
        split,
        sid,
        turns,
        " ".join(parts),
        {"meeting_id": sid, "n_dialogue_acts": len(dialogue), "summary_items": types},
    )


register_source(
    "icsi",
    parse_icsi,
    download_icsi,
    sample_writer("meetings", "write_icsi_samples"),
    upstream=f"hf://datasets/{ICSI_HUB_ID} @ {ICSI_REVISION}",
    splits=("train", "dev", "test"),
)
