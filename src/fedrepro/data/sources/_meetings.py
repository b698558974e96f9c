"""Shared code of AMI, ICSI, ELITR and MeetingBank: the four long-meeting clients of AdaFedSelecKD.

AdaFedSelecKD's "long meeting setting" (§V-B4) sets up **four clients, one per dataset** — AMI [35],
ICSI [36], ELITR [37] and MeetingBank [9] — and trains LongT5 (16,384 input tokens) on whole-meeting
transcript → abstractive summary pairs; Fig. 9 reports the average ROUGE per client. Each source
is therefore one client (``client`` = the source name) with the dataset's natural split; its
download and parser are in :mod:`~fedrepro.data.sources.ami`, :mod:`~fedrepro.data.sources.icsi`,
:mod:`~fedrepro.data.sources.elitr` and :mod:`~fedrepro.data.sources.meetingbank`.

Every record is ``{id, source, client, split, input, target, meta}``. ``input`` is the transcript
with the speaker kept as an ordinary token in front of each turn (``"<speaker>: <text> <speaker>:
<text> ..."``, as §II-B does for QMSum) and ``target`` the abstractive summary. Whitespace runs are
collapsed; transcript mark-up (``<vocalsound>``, ``<laugh/>``, ``[PERSON5]`` ...) is kept as it is.

The four sources, their pinned upstream (see each ``download_*``) and the raw form parsed:

* ``ami`` — GitHub ``gcunhase/AMICorpusXML``, transcript and abstract files at two pinned commits,
  assembled into ``ami_abstractive.jsonl``: one meeting a line ``{meeting_id, transcript, abstract,
  abstract_sentences}``. The split comes from the AMI scenario-only partition (``AMI_SPLIT``).
* ``icsi`` — hub ``YuanPJ/icsi_summ`` at commit ``5c004d8…``: ``data/<split>.json``, a list of
  ``{sample_id, dialogue: [{id, speaker, text, attributes: {role, participant, ...}, ...}],
  summary: [{id, text, type}]}``.
* ``elitr`` — ELITR Minuting Corpus v1.0, LINDAT handle ``11234/1-4692`` (REST bitstream, SHA-256
  checked): ``elitr-minuting-corpus-en/<split>/<meeting>/transcript_*.txt`` and
  ``minutes_GENER_annot*.txt``.
* ``meetingbank`` — hub ``huuuyeah/meetingbank`` at ``main``: ``*.parquet`` with columns
  ``{id, uid, summary, transcript}``.

Sources, in the order a user would try them: the pinned upstream (``download_<name>``), a local copy
(config key ``data.<name>.local_dir``), or the project's generated samples
(``resources/samples/<name>/``, written by ``write_<name>_samples`` in
:mod:`fedrepro.data.samples.meetings`), which use the raw layout and are parsed by the same
code.

This module holds what the four share: split names, field checks, the record builder, the collector
of malformed records, JSON-lines reading, staged (all-or-nothing) downloads and the registration.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fedrepro.data.download import DownloadError
from fedrepro.data.sources import SPLIT_ALIASES, Records, split_token
from fedrepro.io import InputError, atomic_dir, iter_text_lines

log = logging.getLogger(__name__)

SOURCES: tuple[str, ...] = ("ami", "icsi", "elitr", "meetingbank")
"""The four long-meeting clients of AdaFedSelecKD §V-B4, in the order of Fig. 9."""


def _config_key(name: str) -> str:
    return f"data.{name}.local_dir"


_SPLIT_ALIASES: dict[str, str] = SPLIT_ALIASES


def _split_of(path: Path) -> str:
    """The normalised split (train/val/test) named by a file or folder name (or its folder's)."""
    for part in (path.stem, path.parent.name):
        token = split_token(part)
        if token is not None:
            return _SPLIT_ALIASES[token]
    raise InputError(
        f"{path}: cannot tell the split from the file or folder name; name it after the split "
        f"(one of {', '.join(sorted(_SPLIT_ALIASES))})"
    )


def _raw_split_of(path: Path) -> str:
    """The raw split token (e.g. ``test2``, ``dev``) named by ``path`` (kept in ``meta``)."""
    for part in (path.stem, path.parent.name):
        token = split_token(part)
        if token is not None:
            return token
    return _split_of(path)


def _clean(text: str) -> str:
    """Collapse whitespace runs (incl. newlines and non-breaking spaces) to single spaces."""
    return " ".join(text.split())


def _fail(path: Any, where: Any, field: str, problem: str) -> InputError:
    return InputError(f"{path}:{where}: field `{field}`: {problem}")


def _req(obj: dict, key: str, kind: type | tuple[type, ...], path: Any, where: Any, field: str):
    if not isinstance(obj, dict):
        raise _fail(path, where, field.rsplit(".", 1)[0], f"expected an object, got {obj!r:.60}")
    if key not in obj or obj[key] is None:
        raise _fail(path, where, field, "missing")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise _fail(path, where, field, f"expected {names}, got {type(value).__name__}")
    return value


def _req_text(obj: dict, key: str, path: Any, where: Any, field: str | None = None) -> str:
    field = field or key
    value = _req(obj, key, str, path, where, field)
    if not value.strip():
        raise _fail(path, where, field, "empty")
    return value


def _render(turns: Sequence[tuple[str, str]]) -> str:
    """``"<speaker>: <text> <speaker>: <text> ..."`` (§II-B: speaker roles kept as tokens)."""
    return " ".join(f"{speaker}: {text}" for speaker, text in turns)


def _merge_turns(utterances: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Join consecutive utterances of the same speaker into one turn (empty texts dropped)."""
    turns: list[tuple[str, str]] = []
    for speaker, text in utterances:
        text = _clean(text)
        if not text:
            continue
        if turns and turns[-1][0] == speaker:
            turns[-1] = (speaker, f"{turns[-1][1]} {text}")
        else:
            turns.append((speaker, text))
    return turns


def _record(
    name: str,
    split: str,
    raw_id: str,
    turns: Sequence[tuple[str, str]],
    target: str,
    meta: dict,
) -> dict:
    target = _clean(target)
    base = {
        "n_turns": len(turns),
        "n_speakers": len({s for s, _ in turns}),
        "n_words": sum(len(t.split()) for _, t in turns),
        "summary_words": len(target.split()),
    }
    return {
        "id": f"{name}-{split}-{raw_id}",
        "source": name,
        "client": name,
        "split": split,
        "input": _render(turns),
        "target": target,
        "meta": {**base, **meta},
    }


class _Collector:
    """Collects records; a malformed one raises, or with ``skip_malformed`` is listed as skipped."""

    def __init__(self, skip_malformed: bool, path: Path) -> None:
        self.skip = skip_malformed
        self.path = path
        self.records: list[dict] = []
        self.skipped: list[tuple[str, str]] = []
        self._ids: dict[str, str] = {}

    def add(self, where: str, build: Callable[[], dict | list[dict]]) -> None:
        try:
            built = build()
            recs = built if isinstance(built, list) else [built]
            for rec in recs:
                if rec["id"] in self._ids:
                    raise InputError(
                        f"{self.path}:{where}: duplicate record id {rec['id']!r} (first seen "
                        f"at {self._ids[rec['id']]}); ids must be unique"
                    )
        except InputError as exc:
            if not self.skip:
                raise
            log.warning("skipping malformed record: %s", exc)
            self.skipped.append((where, str(exc)))
            return
        for rec in recs:
            self._ids[rec["id"]] = where
            self.records.append(rec)

    def result(self) -> Records:
        return Records(self.records, skipped=self.skipped)


def _iter_json_lines(path: Path, collector: _Collector) -> Iterator[tuple[int, dict]]:
    """``(line, object)`` per non-blank line; a bad line raises or is skipped like a bad record."""
    for lineno, line in iter_text_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise InputError(
                    f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}"
                )
        except json.JSONDecodeError as exc:
            err = InputError(f"{path}:{lineno}: not valid JSON ({exc.msg}); fix or remove it")
            if not collector.skip:
                raise err from exc
            collector.skipped.append((str(lineno), str(err)))
            continue
        except InputError as err:
            if not collector.skip:
                raise
            collector.skipped.append((str(lineno), str(err)))
            continue
        yield lineno, obj


def _require_file(path: Path, name: str) -> None:
    if not path.is_file():
        raise InputError(
            f"{path}: file not found; set the config key `{_config_key(name)}` to a local copy "
            f"or use the generated samples in resources/samples/{name}/"
        )


def _staged_download(
    dest_dir: str | os.PathLike, fill: Callable[[Path], None], cleanup: Sequence[str] = ()
) -> Path:
    """Run ``fill(staging)`` in a fresh sibling folder that becomes ``dest_dir`` only on success."""
    dest_dir = Path(dest_dir)
    parent_existed = dest_dir.parent.exists()
    try:
        with atomic_dir(dest_dir) as staging:
            fill(staging)
            for rel in cleanup:
                target = staging / rel
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
    except BaseException:
        if not parent_existed and dest_dir.parent.is_dir() and not any(dest_dir.parent.iterdir()):
            dest_dir.parent.rmdir()
        raise
    return dest_dir


def _hub_download(
    staging: Path,
    *,
    dataset: str,
    repo_id: str,
    revision: str,
    patterns: Sequence[str],
    timeout: float,
    config_key: str,
) -> list[str]:
    """Download the files of hub dataset ``repo_id@revision`` matching ``patterns``.

    The file list comes from the hub (``dataset_info``, with ``timeout``); each file is fetched with
    ``hf_hub_download(..., etag_timeout=timeout)`` into ``staging`` under its repository path.
    Any failure (offline, ``HF_HUB_OFFLINE=1``, unknown revision, no matching file) becomes a
    :class:`DownloadError` naming the dataset, ``repo_id@revision`` and ``config_key``.
    """
    try:
        from huggingface_hub import HfApi, hf_hub_download

        info = HfApi().dataset_info(repo_id, revision=revision, timeout=timeout)
        files = sorted(
            s.rfilename
            for s in (info.siblings or [])
            if any(fnmatch.fnmatch(s.rfilename, p) for p in patterns)
        )
        if not files:
            raise FileNotFoundError(f"no file matching {list(patterns)} at that revision")
        resolved = info.sha or revision  # every file from the same commit, even for a branch
        log.info("downloading %s from %s@%s", files, repo_id, resolved)
        for name in files:
            hf_hub_download(
                repo_id,
                name,
                repo_type="dataset",
                revision=resolved,
                local_dir=staging,
                etag_timeout=timeout,
            )
    except DownloadError:
        raise
    except Exception as exc:
        raise DownloadError(
            f"{dataset}: could not download hub dataset {repo_id} at revision {revision} "
            f"(https://huggingface.co/datasets/{repo_id}; {type(exc).__name__}: {exc}). "
            f"If this machine has no internet access, fetch the files elsewhere and set the config "
            f"key `{config_key}` to the folder holding your local copy."
        ) from exc
    return files


def register_source(name: str, parse, download, write_samples, **fields) -> None:
    """Register one of the four meeting sources (``data.<name>.local_dir``, language ``en``)."""
    from fedrepro.data import sources

    sources.register_seq2seq(name, parse, download, write_samples, lang="en", **fields)
