"""AMI, ICSI, ELITR, MeetingBank: the four long-meeting clients of AdaFedSelecKD (§V-B4, Fig. 9).

AdaFedSelecKD's "long meeting setting" (§V-B4) sets up **four clients, one per dataset** — AMI [35],
ICSI [36], ELITR [37] and MeetingBank [9] — and trains LongT5 (16,384 input tokens) on whole-meeting
transcript → abstractive summary pairs; Fig. 9 reports the average ROUGE per client. Each source
below is therefore one client (``client`` = the source name) with the dataset's natural split.

Every record is ``{id, source, client, split, input, target, meta}``. ``input`` is the transcript
with the speaker kept as an ordinary token in front of each turn (``"<speaker>: <text> <speaker>:
<text> ..."``, as §II-B does for QMSum) and ``target`` the abstractive summary. Whitespace runs are
collapsed; transcript mark-up (``<vocalsound>``, ``<laugh/>``, ``[PERSON5]`` ...) is kept as it is.

The four sources, their pinned upstream (see each ``download_*``) and the raw form parsed here:

* ``ami`` — GitHub ``gcunhase/AMICorpusXML``, transcript and abstract files at two pinned commits,
  assembled into ``ami_abstractive.jsonl``: one meeting a line ``{meeting_id, transcript, abstract,
  abstract_sentences}``. The split comes from the AMI scenario-only partition (:data:`AMI_SPLIT`).
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
(``resources/samples/<name>/``, written by ``write_<name>_samples``), which use the raw layout and
are parsed by the same code.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import random
import re
import shutil
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fedrepro.data.download import DownloadError, fetch_url
from fedrepro.data.sources import SPLIT_ALIASES, Records, split_token
from fedrepro.io import InputError, atomic_dir, atomic_path, write_text_atomic

__all__ = [
    "AMI_FILE",
    "AMI_MEETINGS",
    "AMI_SCENARIO_PARTITION",
    "AMI_SPLIT",
    "AMI_SUMMARIES_COMMIT",
    "AMI_TRANSCRIPTS_COMMIT",
    "ELITR_SHA256",
    "ELITR_URL",
    "ICSI_HUB_ID",
    "ICSI_REVISION",
    "ICSI_TEST_MEETINGS",
    "MEETINGBANK_HUB_ID",
    "MEETINGBANK_REVISION",
    "SOURCES",
    "DownloadError",
    "ami_split",
    "download_ami",
    "download_elitr",
    "download_icsi",
    "download_meetingbank",
    "parse_ami",
    "parse_elitr",
    "parse_icsi",
    "parse_meetingbank",
    "write_ami_samples",
    "write_elitr_samples",
    "write_icsi_samples",
    "write_meetingbank_samples",
]

log = logging.getLogger(__name__)

SOURCES: tuple[str, ...] = ("ami", "icsi", "elitr", "meetingbank")
"""The four long-meeting clients of AdaFedSelecKD §V-B4, in the order of Fig. 9."""


def _config_key(name: str) -> str:
    return f"data.{name}.local_dir"


# ==================================================================================================
# shared helpers
# ==================================================================================================
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
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
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


# ==================================================================================================
# AMI
# ==================================================================================================
AMI_REPO = "gcunhase/AMICorpusXML"
AMI_TRANSCRIPTS_COMMIT = "015f92aa758f9285faf22e5a948cf441f2a8e89f"
"""Commit of ``gcunhase/AMICorpusXML`` whose ``data/ami-transcripts/<id>.transcript.txt`` files
:func:`download_ami` fetches (one paragraph per speaker channel A, B, C, D, ...)."""
AMI_SUMMARIES_COMMIT = "0729d8c48f00fa8c19db6b3348d11072377dbf9f"
"""Commit of ``gcunhase/AMICorpusXML`` whose ``data/ami-summary/abstractive/<id>.abssumm.txt``
files :func:`download_ami` fetches (the ``<abstract>`` sentences of the AMI 1.6.2 manual
annotations)."""
AMI_TRANSCRIPT_URL = (
    "https://raw.githubusercontent.com/{repo}/{commit}/data/ami-transcripts/"
    "{meeting}.transcript.txt"
)
AMI_SUMMARY_URL = (
    "https://raw.githubusercontent.com/{repo}/{commit}/data/ami-summary/abstractive/"
    "{meeting}.abssumm.txt"
)
AMI_FILE = "ami_abstractive.jsonl"
"""File name of the assembled AMI copy (the form of ``shared/data/ami`` and of the samples)."""

AMI_SCENARIO_PARTITION: dict[str, tuple[str, ...]] = {
    "train": (
        *(f"ES20{n:02d}" for n in (2, 5, 6, 7, 8, 9, 10, 12, 13, 15, 16)),
        *(f"IS100{n}" for n in range(8)),
        *(f"TS30{n:02d}" for n in (5, 8, 9, 10, 11, 12)),
    ),
    "val": ("ES2003", "ES2011", "IS1008", "TS3004", "TS3006"),
    "test": ("ES2004", "ES2014", "IS1009", "TS3003", "TS3007"),
}
"""The AMI **scenario-only partition** (AMI corpus documentation, "Training, Test and Evaluation
Sets": SA = training, SB = development, SC = unseen evaluation; 98/20/20 meetings), the split
used for AMI abstractive summarization since Shang et al. (ACL 2018) and in HMNet / DialogLM. Keys
are meeting *series*; a series' meetings a-d share its split."""

_AMI_SCENARIO_MEETINGS = tuple(
    f"{series}{part}"
    for series in sorted(s for ss in AMI_SCENARIO_PARTITION.values() for s in ss)
    for part in "abcd"
    if f"{series}{part}" not in ("IS1002a", "IS1005d")  # not recorded (AMI meeting-id docs)
)
AMI_MEETINGS: tuple[str, ...] = tuple(
    sorted(_AMI_SCENARIO_MEETINGS + ("IB4003", "IB4005", "IB4010", "IB4011"))
)
"""The 142 AMI meetings with an abstractive summary (138 scenario meetings + 4 IB meetings), as
in ``gcunhase/AMICorpusXML`` and ``shared/data/ami/ami_abstractive.jsonl``."""


def ami_split(meeting_id: str) -> str:
    """Split of an AMI meeting under :data:`AMI_SCENARIO_PARTITION`.

    The four non-scenario IB meetings (ISSCO office-move / movie-club elicitations) that also carry
    abstractive summaries are not in the scenario-only partition; they go to ``train`` so that
    ``val``/``test`` stay exactly the standard 20/20 meetings. Any other id not in the partition
    is also ``train``.
    """
    series = meeting_id[:6]
    for split in ("val", "test"):
        if series in AMI_SCENARIO_PARTITION[split]:
            return split
    return "train"


AMI_SPLIT: dict[str, str] = {m: ami_split(m) for m in AMI_MEETINGS}
"""Meeting id → split for the 142 summarized AMI meetings (train 102 = 98 scenario + 4 IB,
val 20, test 20). Partitioning code can use it directly."""

_AMI_ID = re.compile(r"[A-Z]{2}\d{4}[a-z]?")


def download_ami(
    dest_dir: str | os.PathLike,
    timeout: float = 10.0,
    *,
    transcripts_commit: str = AMI_TRANSCRIPTS_COMMIT,
    summaries_commit: str = AMI_SUMMARIES_COMMIT,
    meetings: Sequence[str] = AMI_MEETINGS,
) -> Path:
    """Download the AMI transcripts and abstracts and assemble ``ami_abstractive.jsonl``.

    Upstream is ``gcunhase/AMICorpusXML`` (MIT; the AMI text is CC BY 4.0), the extraction from the
    AMI 1.6.2 manual annotations that ``shared/data/ami`` was built from: per meeting one
    ``data/ami-transcripts/<id>.transcript.txt`` (one paragraph per speaker channel) and one
    ``data/ami-summary/abstractive/<id>.abssumm.txt``. Both folders are pinned to the commit at
    which the project's source index holds them (:data:`AMI_TRANSCRIPTS_COMMIT`,
    :data:`AMI_SUMMARIES_COMMIT`); a single commit holding both could not be verified offline, hence
    two parameters. (The index lists 141 of the 142 abstract files at that commit — not
    ``ES2002a.abssumm.txt``, possibly a crawl gap; a file missing upstream fails the download
    cleanly, and ``data.ami.local_dir`` then points at a local copy.) The result is ``dest_dir/ami_abstractive.jsonl`` with one line per meeting
    ``{meeting_id, transcript, abstract, abstract_sentences}`` (sentences split after ``.``/``!``/
    ``?`` — this reproduces the shared copy's ``abstract_sentences`` exactly), which
    :func:`parse_ami` reads. Everything is fetched into a staging folder renamed onto ``dest_dir``
    only when complete.

    Raises
    ------
    DownloadError
        Naming the dataset, the URL (with the commit) and the config key ``data.ami.local_dir``.
    """

    def fill(staging: Path) -> None:
        lines = []
        for meeting in meetings:
            texts = {}
            for kind, template, commit in (
                ("transcript", AMI_TRANSCRIPT_URL, transcripts_commit),
                ("summary", AMI_SUMMARY_URL, summaries_commit),
            ):
                url = template.format(repo=AMI_REPO, commit=commit, meeting=meeting)
                dest = staging / "raw" / kind / f"{meeting}.txt"
                fetch_url(
                    url,
                    dest,
                    timeout=timeout,
                    config_key=_config_key("ami"),
                    dataset=f"AMI abstractive summaries ({AMI_REPO}@{commit})",
                )
                texts[kind] = dest.read_text(encoding="utf-8")
            abstract = _clean(texts["summary"])
            lines.append(
                json.dumps(
                    {
                        "meeting_id": meeting,
                        "transcript": texts["transcript"].strip("\n"),
                        "abstract": abstract,
                        "abstract_sentences": _sentences(abstract),
                    },
                    ensure_ascii=False,
                )
            )
        (staging / AMI_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")

    return _staged_download(dest_dir, fill, cleanup=("raw",))


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def parse_ami(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Parse ``ami_abstractive.jsonl`` (or a folder holding it) into one record per meeting.

    AdaFedSelecKD §V-B4 uses AMI (Carletta et al., 2005) as one long-meeting client. The raw form is
    the ``gcunhase/AMICorpusXML`` extraction: one JSON object a line with ``meeting_id``,
    ``transcript`` (one paragraph per speaker channel, separated by newlines — the channel's words
    in time order) and ``abstract_sentences`` (or, if absent, ``abstract``). The input renders each
    paragraph as ``"Speaker A: ..."``, ``"Speaker B: ..."`` (channel letters in file order; the AMI
    role of a channel is not in this release), the target is the joined abstract. The file carries
    no split: each meeting's split comes from :func:`ami_split` (the scenario-only partition).

    Raises
    ------
    InputError
        For a malformed line (bad JSON, missing/empty ``meeting_id``/``transcript``/abstract, an id
        that is not an AMI meeting id, a duplicate id), naming the file, the line and the field;
        with ``skip_malformed=True`` such lines are listed in ``Records.skipped`` instead.
    """
    path = Path(path)
    if path.is_dir():
        path = path / AMI_FILE
    _require_file(path, "ami")
    out = _Collector(skip_malformed, path)
    for lineno, obj in _iter_json_lines(path, out):
        out.add(str(lineno), lambda obj=obj, lineno=lineno: _ami_record(obj, path, lineno))
    return out.result()


def _ami_record(obj: dict, path: Path, lineno: int) -> dict:
    meeting = _req_text(obj, "meeting_id", path, lineno)
    if not _AMI_ID.fullmatch(meeting):
        raise _fail(path, lineno, "meeting_id", f"{meeting!r} is not an AMI meeting id (ES2002a)")
    transcript = _req_text(obj, "transcript", path, lineno)
    if "abstract_sentences" in obj and obj["abstract_sentences"] is not None:
        sentences = _req(obj, "abstract_sentences", list, path, lineno, "abstract_sentences")
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise _fail(
                    path,
                    lineno,
                    f"abstract_sentences[{i}]",
                    f"expected str, got {type(s).__name__}",
                )
        target = " ".join(s.strip() for s in sentences if s.strip())
        if not target:
            raise _fail(path, lineno, "abstract_sentences", "empty")
    else:
        target = _req_text(obj, "abstract", path, lineno, "abstract_sentences/abstract")
    paragraphs = [p for p in transcript.split("\n") if p.strip()]
    turns = [(f"Speaker {_channel(i)}", _clean(p)) for i, p in enumerate(paragraphs)]
    return _record(
        "ami",
        ami_split(meeting),
        meeting,
        turns,
        target,
        {"meeting_id": meeting, "summary_sentences": len(_sentences(_clean(target)))},
    )


def _channel(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"S{i + 1}"


# ==================================================================================================
# ICSI
# ==================================================================================================
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
    text = path.read_text(encoding="utf-8")
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


# ==================================================================================================
# ELITR
# ==================================================================================================
ELITR_HANDLE = "http://hdl.handle.net/11234/1-4692"
"""LINDAT/CLARIAH-CZ item of the ELITR Minuting Corpus v1.0 (CC BY-NC-SA 4.0 per the item page).
LINDAT items are immutable — a new version gets a new handle — so the handle pins the release."""
ELITR_URL = (
    "https://lindat.mff.cuni.cz/repository/server/api/core/bitstreams/"
    "76466f35-1bac-47bf-958b-c235b1fb4966/content"
)
"""DSpace-7 REST content URL of ``ELITR-minuting-corpus.zip`` in item 11234/1-4692 (the old XMLUI
bitstream URL serves an HTML interstitial)."""
ELITR_SHA256 = "34868d54a983b46841c8a8c14153d48c913f40bd92e37b23a85f628be737cbe1"
"""SHA-256 of ``ELITR-minuting-corpus.zip`` as recorded by a public fetch script for this item;
:func:`download_elitr` checks it (pass ``sha256=None`` to skip)."""
ELITR_LANG_DIR = "elitr-minuting-corpus-en"
ELITR_SPLITS: tuple[str, ...] = ("train", "dev", "test", "test2")


def download_elitr(
    dest_dir: str | os.PathLike,
    timeout: float = 10.0,
    *,
    url: str = ELITR_URL,
    sha256: str | None = ELITR_SHA256,
) -> Path:
    """Download the ELITR Minuting Corpus v1.0 and keep its English part.

    Fetches ``ELITR-minuting-corpus.zip`` (LINDAT handle :data:`ELITR_HANDLE`) into a staging
    folder, checks its SHA-256, extracts it (refusing members that would land outside the folder)
    and keeps ``dest_dir/elitr-minuting-corpus-en/{train,dev,test,test2}/<meeting>/`` — the layout
    :func:`parse_elitr` reads. The Czech part and the archive are dropped.

    Raises
    ------
    DownloadError
        Naming the dataset, the URL and handle, and the config key ``data.elitr.local_dir`` (also
        for a checksum mismatch or an archive without ``elitr-minuting-corpus-en/``).
    """
    dataset = f"ELITR Minuting Corpus v1.0 ({ELITR_HANDLE})"

    def fill(staging: Path) -> None:
        archive = fetch_url(
            url,
            staging / "ELITR-minuting-corpus.zip",
            timeout=timeout,
            config_key=_config_key("elitr"),
            dataset=dataset,
        )
        hint = (
            f" Download it by hand from {ELITR_HANDLE} and set the config key "
            f"`{_config_key('elitr')}` to the folder holding {ELITR_LANG_DIR}/."
        )
        if sha256 is not None:
            digest = hashlib.sha256(archive.read_bytes()).hexdigest()
            if digest != sha256:
                raise DownloadError(
                    f"{dataset}: {url} returned a file with SHA-256 {digest}, expected {sha256}."
                    + hint
                )
        extract = staging / "extract"
        try:
            _safe_extract(archive, extract)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise DownloadError(f"{dataset}: {url} is not a readable zip archive ({exc})." + hint)
        found = sorted(p for p in extract.rglob(ELITR_LANG_DIR) if p.is_dir())
        if not found:
            raise DownloadError(f"{dataset}: no {ELITR_LANG_DIR}/ folder inside {url}." + hint)
        os.replace(found[0], staging / ELITR_LANG_DIR)

    return _staged_download(dest_dir, fill, cleanup=("extract", "ELITR-minuting-corpus.zip"))


def _safe_extract(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
            target = (dest / member).resolve()
            if target != root and root not in target.parents:
                raise ValueError(f"archive member {member!r} would be written outside {dest}")
        zf.extractall(dest)


def _elitr_meeting_dirs(path: Path) -> list[tuple[Path, str, str]]:
    """``(meeting folder, split, raw split)`` for a meeting, split, language or corpus folder."""
    if any(path.glob("transcript_*.txt")):
        return [(path, _split_of(path), _raw_split_of(path))]
    if (path / ELITR_LANG_DIR).is_dir():
        path = path / ELITR_LANG_DIR
    split_dirs = [path / s for s in ELITR_SPLITS if (path / s).is_dir()]
    if not split_dirs:
        split_dirs = [path]
    out = []
    for split_dir in split_dirs:
        split, raw = _split_of(split_dir), _raw_split_of(split_dir)
        out.extend((m, split, raw) for m in sorted(p for p in split_dir.iterdir() if p.is_dir()))
    return out


_ELITR_SPEAKER = re.compile(r"^\(([^()\s]+)\)\s*(.*)$")


def _elitr_transcript(path: Path) -> list[tuple[str, str]]:
    """ELITR transcript utterances: ``(SPEAKER) text`` starts a turn, a bare line continues it."""
    utterances = []
    speaker = "UNKNOWN"
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        m = _ELITR_SPEAKER.match(line)
        if m:
            speaker, line = m.group(1).rstrip("."), m.group(2)
        utterances.append((speaker, line))
    return utterances


def parse_elitr(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Parse the English ELITR Minuting Corpus: a split folder (or a meeting, language or corpus
    folder) into one record per (meeting, annotator minutes) pair.

    AdaFedSelecKD §V-B4 uses ELITR (Nedoluzhko et al., LREC 2022) as one long-meeting client. Raw
    layout (upstream README): ``<split>/<meeting_id>/transcript_MAN[X]_annotYY.txt`` — one
    utterance a line, ``(PERSONn) text`` for a new speaker, a bare line for the same speaker — and
    one or more ``minutes_GENER_annotYY.txt`` (bullet-point minutes by annotator YY);
    ``minutes_ORIG.txt`` (the organiser's agenda/minutes) and alignments are not used. Each
    annotator's minutes are one target (AutoMin practice: several references per meeting), so a
    meeting yields one record per ``minutes_GENER`` file. The split is the folder name: ``dev`` →
    ``val``, ``test`` and ``test2`` → ``test`` (``meta.raw_split`` keeps the original).

    Raises
    ------
    InputError
        For a meeting without transcript, an empty transcript, no ``minutes_GENER_*`` file or an
        empty minutes file, naming the file (or meeting folder) and the field.
    """
    path = Path(path)
    if not path.is_dir():
        raise InputError(
            f"{path}: not a folder; ELITR is read from the release's folders (e.g. "
            f"{ELITR_LANG_DIR}/train); set the config key `{_config_key('elitr')}`"
        )
    out = _Collector(skip_malformed, path)
    for meeting_dir, split, raw_split in _elitr_meeting_dirs(path):
        out.add(
            str(meeting_dir),
            lambda m=meeting_dir, s=split, r=raw_split: _elitr_records(m, s, r),
        )
    return out.result()


def _elitr_records(meeting_dir: Path, split: str, raw_split: str) -> list[dict]:
    meeting = meeting_dir.name
    transcripts = sorted(meeting_dir.glob("transcript_*.txt"))
    if not transcripts:
        raise _fail(meeting_dir, "meeting", "transcript", "no transcript_*.txt file")
    turns = _merge_turns(_elitr_transcript(transcripts[0]))
    if not turns:
        raise _fail(transcripts[0], "1", "transcript", "empty")
    minutes_files = sorted(meeting_dir.glob("minutes_GENER_*.txt"))
    if not minutes_files:
        raise _fail(meeting_dir, "meeting", "minutes", "no minutes_GENER_*.txt file")
    records = []
    for mf in minutes_files:
        lines = [ln.strip() for ln in mf.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if not lines:
            raise _fail(mf, "1", "minutes", "empty")
        annot = mf.stem.removeprefix("minutes_GENER_")
        records.append(
            _record(
                "elitr",
                split,
                f"{meeting}-{annot}",
                turns,
                " ".join(lines),
                {
                    "meeting_id": meeting,
                    "raw_split": raw_split,
                    "transcript_file": transcripts[0].name,
                    "minutes_file": mf.name,
                },
            )
        )
    return records


# ==================================================================================================
# MeetingBank
# ==================================================================================================
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


# ==================================================================================================
# generated samples (raw layouts; deterministic; parsed by the same code as the real data)
# ==================================================================================================
def _say(rng: random.Random, text: str, fillers: Sequence[str], p: float = 0.35) -> str:
    """Sprinkle spoken fillers (``um``, ``uh``, ...) in front of clauses."""
    out = []
    for clause in re.split(r"(?<=[,.?!]) ", text):
        if rng.random() < p:
            first = clause.split(" ", 1)[0]
            if first.lower().strip(",.") in _LOWER_OK:
                clause = f"{clause[0].lower()}{clause[1:]}"
            filler = rng.choice(fillers)
            if out and out[-1].endswith(","):  # mid-sentence: "..., uh I like ..."
                filler = filler.lower()
            clause = f"{filler} {clause}"
        out.append(clause)
    return " ".join(out)


# fmt: off
_LOWER_OK = frozenset([
    "the", "this", "that", "these", "our", "my", "as", "here", "we", "it", "on", "not", "yes",
    "can", "please", "thank", "maybe", "hi", "what", "there", "so", "and", "for", "okay", "ok",
    "then", "let's", "let", "'s", "people", "it's", "is", "are",
])
# fmt: on
"""First words that a filler in front of them may lower-case (not "I", names or acronyms)."""


def _number_words(n: int) -> str:
    ones = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    ones += "fifteen sixteen seventeen eighteen nineteen"
    small = ones.split()
    tens = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
    if n < 20:
        return small[n]
    return tens[n // 10] + ("" if n % 10 == 0 else f" {small[n % 10]}")


# -- AMI ------------------------------------------------------------------------------------------
_AMI_ROLES = {
    "PM": "project manager",
    "ME": "marketing expert",
    "UI": "user interface designer",
    "ID": "industrial designer",
}
# fmt: off
_AMI_NAMES = [
    "Laura", "Craig", "Andrew", "David", "Sarah", "Rose", "Iain", "Mark", "Agnes", "Tom", "Nathan",
    "Corinne",
]
_AMI_ANIMALS = [
    "monkey", "beagle", "whale", "cat", "dolphin", "owl", "horse", "penguin", "tiger", "rabbit",
]
# fmt: on
_AMI_FEATURES = [
    "a locator beep",
    "a scroll wheel",
    "an LCD screen",
    "voice recognition",
    "a backlight for the buttons",
    "a child lock",
    "teletext buttons",
    "a sleep timer",
]
_AMI_MATERIALS = ["rubber", "plastic", "wood", "titanium", "latex"]
_AMI_ENERGY = ["a kinetic battery", "solar cells", "standard batteries", "a docking station"]
_AMI_SHAPES = ["banana", "curved", "double-curved", "flat", "egg"]
_AMI_COLOURS = ["yellow", "lime green", "dark blue", "silver", "bright red"]
_AMI_FILLERS = ["Um", "Uh", "So", "Well", "Yeah,"]
_AMI_BACKCHANNEL = ["Mm-hmm.", "Okay.", "Yeah.", "Right.", "Uh-huh.", "Mm.", "Sure."]


def _ami_meeting(rng: random.Random, meeting: str) -> dict:
    series_rng = random.Random(f"ami-series-{meeting[:6]}")
    letters = list("ABCD")
    roles = list(_AMI_ROLES)
    series_rng.shuffle(roles)
    names = series_rng.sample(_AMI_NAMES, 4)
    who = dict(zip(roles, zip(letters, names)))
    stage = meeting[6:] or "x"
    said: dict[str, list[str]] = {r: [] for r in roles}
    summary: list[str] = []

    def talk(role: str, text: str) -> None:
        said[role].append(_say(rng, text, _AMI_FILLERS))
        for other in roles:
            if other != role and rng.random() < 0.5:
                said[other].append(rng.choice(_AMI_BACKCHANNEL))

    price = rng.choice([25, 20, 30, 35])
    cost = rng.choice([12, 15, 10])
    if stage == "a" or stage == "x":
        animals = {r: rng.choice(_AMI_ANIMALS) for r in roles}
        f1, f2 = rng.sample(_AMI_FEATURES, 2)
        for r in roles:
            talk(r, f"Hi, I'm {who[r][1]} and I'm the {_AMI_ROLES[r]}.")
        talk(
            "PM",
            "Okay, this is the kick-off meeting for our project, we're designing a new remote "
            "control.",
        )
        for r in roles:
            talk(
                r, f"My favourite animal is a {animals[r]}, I like that it is friendly and clever."
            )
        talk(
            "PM",
            f"For the finances, we're selling it for {_number_words(price)} Euro and it "
            f"should not cost more than {_number_words(cost)} Euro to produce.",
        )
        talk("ME", f"I think people would like {f1} on it.")
        talk("ID", f"And maybe {f2} as well, if the budget allows it.")
        summary += [
            (
                "The project manager introduced the upcoming project to the team members and "
                "the team members introduced themselves and drew their favourite animals."
            ),
            (
                f"The project manager discussed the project finances: a selling price of "
                f"{_number_words(price)} Euro and a production cost of at most "
                f"{_number_words(cost)} Euro."
            ),
            f"The team discussed features to include, such as {f1} and {f2}.",
        ]
    elif stage == "b":
        f1, f2 = rng.sample(_AMI_FEATURES, 2)
        pct = rng.choice([50, 60, 75, 80])
        low, high = rng.choice([(15, 35), (20, 40), (25, 45)])
        talk(
            "PM",
            "This is the functional design meeting, there are new requirements from "
            "management: the remote is only for the television.",
        )
        talk(
            "UI", f"As user interface designer I looked at existing products, and I'd suggest {f1}."
        )
        talk(
            "ME",
            f"Our survey shows that {_number_words(pct)} percent of users find their remote "
            f"ugly, and they want {f2}.",
        )
        talk(
            "ID", "As industrial designer I looked at the inside, the chip and the infrared sender."
        )
        talk(
            "PM",
            f"So we decide to target people from {_number_words(low)} to "
            f"{_number_words(high)}, and to include {f1}.",
        )
        summary += [
            (
                "The project manager presented the new requirements: the remote is only for the "
                "television."
            ),
            f"The user interface designer presented existing products and suggested {f1}.",
            (
                f"The marketing expert reported that {_number_words(pct)} percent of users find "
                f"their remote ugly and want {f2}."
            ),
            (
                f"The team decided to target people from {_number_words(low)} to "
                f"{_number_words(high)} and to include {f1}."
            ),
        ]
    elif stage == "c":
        material = rng.choice(_AMI_MATERIALS)
        energy = rng.choice(_AMI_ENERGY)
        colour = rng.choice(_AMI_COLOURS)
        f1 = rng.choice(_AMI_FEATURES)
        talk("PM", "This is the conceptual design meeting, we'll hear the three presentations.")
        talk("ID", f"As industrial designer I'd use {energy} and a {material} case.")
        talk("UI", f"For the interface I'd go with {f1} and few buttons.")
        talk("ME", f"The trend watching says fancy colours, so maybe {colour}.")
        talk("PM", f"Okay, so we go for {energy}, a {material} case in {colour}, with {f1}.")
        summary += [
            f"The industrial designer proposed {energy} and a {material} case.",
            f"The user interface designer presented an interface with {f1}.",
            f"The marketing expert reported the current trends and suggested the colour {colour}.",
            f"The team decided on {energy}, a {material} case in {colour} and {f1}.",
        ]
    else:  # d: detailed design
        shape = rng.choice(_AMI_SHAPES)
        material = rng.choice(_AMI_MATERIALS)
        total = rng.choice([11, 12, 13, 14, 16])
        verdict = "within" if total <= cost else "over"
        score = rng.choice([5, 6, 7])
        talk("PM", "This is the detailed design meeting, we evaluate the prototype and the costs.")
        talk("ID", f"Here is the prototype, it has a {shape} shape and a {material} case.")
        talk("UI", "The buttons are on the front and the menu is on the screen.")
        talk("ME", f"On our criteria the prototype scores {_number_words(score)} out of seven.")
        talk(
            "PM",
            f"The cost comes to {_number_words(total)} Euro, which is {verdict} our budget of "
            f"{_number_words(cost)} Euro.",
        )
        summary += [
            (
                f"The industrial designer and user interface designer presented the prototype "
                f"with a {shape} shape and a {material} case."
            ),
            (
                f"The marketing expert led the evaluation and the prototype scored "
                f"{_number_words(score)} out of seven."
            ),
            (
                f"The project manager calculated a cost of {_number_words(total)} Euro, "
                f"{verdict} the budget of {_number_words(cost)} Euro."
            ),
        ]
    paragraphs = [" ".join(said[r]) for r in sorted(roles, key=lambda r: who[r][0])]
    abstract = " ".join(summary)
    return {
        "meeting_id": meeting,
        "transcript": "\n".join(paragraphs),
        "abstract": abstract,
        "abstract_sentences": _sentences(abstract),
    }


AMI_SAMPLE_COUNTS: dict[str, int] = {"train": 24, "val": 8, "test": 8}


def write_ami_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``<out_dir>/ami_abstractive.jsonl``: :data:`AMI_SAMPLE_COUNTS` meetings per split.

    Meeting ids are drawn from the real partition (so :func:`ami_split` gives each its split), the
    four channel paragraphs follow the AMI scenario stages (a kick-off, b functional, c conceptual,
    d detailed design) and every abstract sentence restates facts (prices, features, materials, the
    decision) that one speaker says in the transcript. Byte-identical for the same ``seed``.
    """
    rng = random.Random(f"ami-samples-{seed}")
    meetings = []
    for split, n in AMI_SAMPLE_COUNTS.items():
        pool = sorted(m for m in _AMI_SCENARIO_MEETINGS if ami_split(m) == split)
        meetings += rng.sample(pool, n)
    lines = [
        json.dumps(_ami_meeting(random.Random(f"ami-{seed}-{m}"), m), ensure_ascii=False)
        for m in sorted(meetings)
    ]
    write_text_atomic(Path(out_dir) / AMI_FILE, "\n".join(lines) + "\n")
    return dict(AMI_SAMPLE_COUNTS)


# -- ICSI -----------------------------------------------------------------------------------------
_ICSI_TOPICS = {
    "Bro": [
        ("spectral subtraction", "word error rate", "percent"),
        ("the new voice activity detector", "word error rate", "percent"),
        ("on-line normalization", "error rate on the Italian data", "percent"),
        ("the neural net features", "error rate on Aurora", "percent"),
    ],
    "Bmr": [
        ("the digits recordings", "number of speakers recorded", "speakers"),
        ("the transcription pipeline", "hours transcribed", "hours"),
        ("forced alignment", "alignment errors per meeting", "errors"),
        ("the disk backup", "gigabytes used", "gigabytes"),
    ],
    "Bed": [
        ("the belief-net for the tourist domain", "number of nodes", "nodes"),
        ("construction grammar parsing", "number of constructions", "constructions"),
        ("the SmartKom dialogue data", "number of dialogues", "dialogues"),
        ("the intention recognizer", "accuracy", "percent"),
    ],
}
_ICSI_GROUPS = {
    "Bro": "the robust speech recognition group",
    "Bmr": "the Meeting Recorder group",
    "Bed": "the EDU group",
}
_ICSI_ROLES = ["Professor", "PhD", "PhD", "Grad", "Postdoc", "Grad"]
_ICSI_ROLE_NOUNS = {
    "Professor": "The professor",
    "PhD": "One of the PhD students",
    "Grad": "A grad student",
    "Postdoc": "The postdoc",
}
_ICSI_FILLERS = ["uh ,", "um ,", "so", "well ,", "I mean"]
_ICSI_BACKCHANNEL = ["Yeah .", "Uh - huh .", "OK .", "Right .", "Mm - hmm ."]
_ICSI_MEETINGS = {
    "Bro": [f"Bro{n:03d}" for n in range(3, 29) if n not in (9, 20, 22, 27)],
    "Bmr": [f"Bmr{n:03d}" for n in range(1, 32) if n not in (4, 17, 23)],
    "Bed": [f"Bed{n:03d}" for n in range(2, 18) if n not in (7,)],
}


def _icsi_tok(text: str) -> str:
    """ICSI transcript style: punctuation split off (``OK , so .``)."""
    return re.sub(r"\s+", " ", re.sub(r"([,?!]|\.(?!\d))", r" \1 ", text)).strip()


def _icsi_meeting(rng: random.Random, mid: str) -> dict:
    series = mid[:3]
    n_speakers = rng.randint(4, 6)
    letters = rng.sample(list("ABCDEFGH"), n_speakers)
    roles = ["Professor", *rng.sample(_ICSI_ROLES[1:], n_speakers - 1)]
    people = {
        letter: (role, f"{rng.choice('mf')}e{rng.randint(10, 60):03d}", f"c{rng.randint(0, 9)}")
        for letter, role in zip(letters, roles)
    }
    prof, reporter, other = letters[0], letters[1], letters[2]
    topic, measure, unit = rng.choice(_ICSI_TOPICS[series])
    before = rng.randint(10, 40) + rng.choice([0, 0.5])
    after = round(before * rng.choice([0.7, 0.8, 0.85]), 1)
    if unit not in ("percent",):
        before, after = int(before * 3), int(before * 3 + rng.randint(5, 30))
    next_step = rng.choice(
        [
            "run it on the full test set",
            "write it up for the report",
            "try it on the far mike",
            "check it with the transcribers",
            "compare it with last year's system",
        ]
    )
    problem = rng.choice(
        [
            "the far-field microphones are still noisy",
            "the scripts are slow",
            "some channels are missing",
            "the labels are inconsistent",
        ]
    )
    acts: list[tuple[str, str, str]] = []  # (speaker, text, label)

    def act(speaker: str, text: str, label: str = "s") -> None:
        text = _say(rng, text, _ICSI_FILLERS, 0.3)
        if rng.random() < 0.3:
            text = text.replace(" the ", " the <disfmarker> the ", 1)
        acts.append((speaker, _icsi_tok(text), label))
        if rng.random() < 0.4:
            acts.append((rng.choice(letters), rng.choice(_ICSI_BACKCHANNEL), "b"))

    act(prof, f"OK , so today we should talk about {topic} .")
    act(reporter, f"I 've been working on {topic} this week .")
    act(reporter, f"the {measure} was {before} {unit} before and now it 's {after} {unit} .")
    act(prof, "<vocalsound> that 's good , is that on the whole set ?", "qy")
    act(reporter, f"not yet , the problem is that {problem} .")
    act(other, f"we could {next_step} .")
    act(prof, f"OK , let 's {next_step} then , and talk about it next week .")
    act(letters[-1], "I 'll send around the numbers after the meeting .")
    dialogue, t = [], rng.uniform(0, 20)
    for i, (spk, text, label) in enumerate(acts):
        dur = 0.3 * len(text.split()) + rng.uniform(0, 1)
        role, participant, channel = people[spk]
        dialogue.append(
            {
                "id": f"{mid}.{spk}.dialogueact{i * 3 + 1}",
                "speaker": spk,
                "starttime": f"{t:.3f}",
                "startwordid": f"{mid}.w.{i * 20 + 1}",
                "endtime": f"{t + dur:.3f}",
                "endwordid": f"{mid}.w.{i * 20 + 15}",
                "text": text,
                "label": label,
                "original_label": label,
                "attributes": {"role": role, "participant": participant, "channel": channel},
            }
        )
        t += dur + rng.uniform(0.1, 2.0)
    r_role = _ICSI_ROLE_NOUNS[people[reporter][0]]
    abstract = [
        f"{_ICSI_GROUPS[series][0].upper()}{_ICSI_GROUPS[series][1:]} discussed {topic}.",
        f"{r_role} reported that the {measure} changed from {before} to {after} {unit}.",
        f"It was noted that {problem}.",
    ]
    summary = [
        {"id": f"{mid}.s.{k + 1}", "text": s, "type": "abstract"} for k, s in enumerate(abstract)
    ]
    summary.append(
        {
            "id": f"{mid}.s.{len(summary) + 1}",
            "text": f"The group will {next_step}.",
            "type": "decisions",
        }
    )
    summary.append(
        {
            "id": f"{mid}.s.{len(summary) + 1}",
            "text": f"{problem[0].upper()}{problem[1:]}.",
            "type": "problems",
        }
    )
    return {"sample_id": mid, "dialogue": dialogue, "summary": summary}


ICSI_SAMPLE_COUNTS: dict[str, int] = {"train": 20, "dev": 6, "test": 6}


def write_icsi_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``<out_dir>/data/{train,dev,test}.json`` in the ``YuanPJ/icsi_summ`` form.

    The test file holds the six traditional test meetings (:data:`ICSI_TEST_MEETINGS`); train/dev
    draw from the other ICSI meeting ids. Each meeting is a research-group discussion (robust ASR,
    Meeting Recorder or EDU series) whose abstract restates the topic, the reported numbers and the
    problem raised in the dialogue acts. Byte-identical for the same ``seed``.
    """
    rng = random.Random(f"icsi-samples-{seed}")
    pool = sorted(m for ms in _ICSI_MEETINGS.values() for m in ms if m not in ICSI_TEST_MEETINGS)
    picked = rng.sample(pool, ICSI_SAMPLE_COUNTS["train"] + ICSI_SAMPLE_COUNTS["dev"])
    by_split = {
        "train": sorted(picked[: ICSI_SAMPLE_COUNTS["train"]]),
        "dev": sorted(picked[ICSI_SAMPLE_COUNTS["train"] :]),
        "test": list(ICSI_TEST_MEETINGS),
    }
    for split, mids in by_split.items():
        meetings = [_icsi_meeting(random.Random(f"icsi-{seed}-{m}"), m) for m in mids]
        text = "[\n" + ",\n".join(json.dumps(m, ensure_ascii=False) for m in meetings) + "\n]\n"
        write_text_atomic(Path(out_dir) / "data" / f"{split}.json", text)
    return {s: len(m) for s, m in by_split.items()}


# -- ELITR ----------------------------------------------------------------------------------------
_ELITR_ITEMS = [
    ("the ASR evaluation", "WER", "%"),
    ("the MT system for [LANGUAGE1]", "BLEU", "points"),
    ("the subtitling demo", "latency", "seconds"),
    ("the deliverable for [PROJECT2]", "page count", "pages"),
    ("the data collection at [ORGANIZATION4]", "amount of recordings", "hours"),
    ("the paper for [OTHER3]", "page count", "pages"),
]
_ELITR_ACTIONS = [
    "send the results by email",
    "prepare the slides for the review",
    "update the document on the shared drive",
    "contact [ORGANIZATION2] about the data",
    "rerun the experiments on the new test set",
]
_ELITR_FILLERS = ["Uh,", "So", "Yeah,", "Okay,", "Well,"]
_ELITR_TAGS = ["<laugh/>", "<unintelligible/>", "<typing/>", "<other_noise/>"]


def _elitr_meeting(rng: random.Random) -> tuple[str, list[str], list[tuple[str, str]]]:
    """``(transcript text, speakers, [(annotator, minutes text)])`` of one meeting."""
    people = [f"PERSON{n}" for n in rng.sample(range(1, 20), rng.randint(3, 5))]
    chair = people[0]
    items = rng.sample(_ELITR_ITEMS, 3)
    facts = []
    lines = [f"({chair}) Hello, hello.", "Can you hear me?"]
    for p in people[1:]:
        lines.append(f"({p}) Yes, hi.")
    lines.append(f"({chair}) Okay, so let's go on agenda. We have three points today.")
    for (item, metric, unit), owner in zip(items, rng.sample(people[1:] * 2, 3)):
        value = rng.randint(3, 40) + (0.5 if unit == "%" else 0)
        action = rng.choice(_ELITR_ACTIONS)
        facts.append((item, metric, unit, owner, value, action))
        question = _say(rng, f"[{owner}], what is the status of {item}?", _ELITR_FILLERS)
        lines.append(f"({chair}) {question}")
        status = _say(rng, f"So for {item}, the {metric} is now {value} {unit}.", _ELITR_FILLERS)
        lines.append(f"({owner}) {status}")
        if rng.random() < 0.5:
            tag = rng.choice(_ELITR_TAGS)
            lines.append(
                f"It's <parallel_talk>better than last time</parallel_talk>, I think. {tag}"
            )
        lines.append(f"({rng.choice(people)}) {_say(rng, 'Okay, good.', _ELITR_FILLERS)}")
        lines.append(f"({chair}) {_say(rng, f'So [{owner}] will {action}.', _ELITR_FILLERS)}")
        lines.append(f"({owner}) Yes, I will {action}.")
    day, month = rng.randint(1, 28), rng.randint(1, 12)
    lines.append(f"({chair}) Okay, the next call is on {day}. {month}. Thank you, bye.")
    lines.append(f"({people[-1]}) Bye.")
    minutes = []
    annotators = [f"annot{n:02d}" for n in rng.sample(range(1, 25), rng.choice([1, 2, 2]))]
    for k, annot in enumerate(annotators):
        out = [
            f"Date: 2020-{month:02d}-{day:02d}",
            f"Attendees: {', '.join(f'[{p}]' for p in sorted(people))}",
            "Purpose of meeting: project status",
            "",
        ]
        for item, metric, unit, owner, value, action in facts:
            if k == 0:
                out.append(f"- {item}: {metric} is {value} {unit} ([{owner}])")
                out.append(f"  - [{owner}] will {action}")
            else:
                out.append(f"- [{owner}] reported on {item}, the {metric} is now {value} {unit}.")
                out.append(f"- Action: [{owner}] to {action}.")
        out += [f"- next call on {day}. {month}.", "", f"Minuted by: [ANNOTATOR{k + 1}]"]
        minutes.append((annot, "\n".join(out) + "\n"))
    return "\n".join(lines) + "\n", people, minutes


ELITR_SAMPLE_COUNTS: dict[str, int] = {"train": 16, "dev": 5, "test": 5}


def write_elitr_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``<out_dir>/elitr-minuting-corpus-en/{train,dev,test}/meeting_en_<split>_NNN/`` with a
    ``transcript_MAN_annotYY.txt`` and one or two ``minutes_GENER_annotYY.txt`` per meeting (plus a
    ``minutes_ORIG.txt`` agenda for some), the English ELITR release layout.

    Meetings are project calls with de-identified speakers (``(PERSON3) ...``); the minutes list
    each agenda item's owner, metric value and action, all said in the transcript. Returns the
    number of *meetings* per split. Byte-identical for the same ``seed``.
    """
    rng = random.Random(f"elitr-samples-{seed}")
    root = Path(out_dir) / ELITR_LANG_DIR
    for split, n in ELITR_SAMPLE_COUNTS.items():
        n_real = {"train": 84, "dev": 10, "test": 18}[split]  # upstream README's meeting ids
        for idx in sorted(rng.sample(range(1, n_real + 1), n)):
            meeting = f"meeting_en_{split}_{idx:03d}"
            transcript, _people, minutes = _elitr_meeting(random.Random(f"elitr-{seed}-{meeting}"))
            folder = root / split / meeting
            write_text_atomic(folder / f"transcript_MAN_{minutes[0][0]}.txt", transcript)
            for annot, text in minutes:
                write_text_atomic(folder / f"minutes_GENER_{annot}.txt", text)
            if idx % 3 == 0:
                write_text_atomic(folder / "minutes_ORIG.txt", "Agenda\n1. status\n2. next call\n")
    return dict(ELITR_SAMPLE_COUNTS)


# -- MeetingBank ----------------------------------------------------------------------------------
_MB_CITIES = {
    "SeattleCityCouncil": "seattle",
    "DenverCityCouncil": "denver",
    "BostonCC": "boston",
    "LongBeachCC": "longbeach",
    "AlamedaCC": "alameda",
    "KingCountyCC": "kingcounty",
}
_MB_SUBJECTS = [
    ("the Seattle Department of Transportation", "street improvements on {street}"),
    ("the Office of Housing", "affordable housing at {street}"),
    ("Parks and Recreation", "the renovation of {park}"),
    ("the Police Department", "the purchase of body-worn cameras"),
    ("Public Utilities", "a water main replacement on {street}"),
    ("the Department of Finance", "the 2017 budget for {park}"),
]
_MB_STREETS = ["Rainier Avenue", "Colfax Avenue", "Main Street", "Pine Street", "Federal Boulevard"]
_MB_PARKS = ["Green Lake Park", "City Park", "Franklin Park", "Lincoln Park"]


def _meetingbank_row(rng: random.Random, idx: int) -> dict:
    city = rng.choice(sorted(_MB_CITIES))
    dept, what = rng.choice(_MB_SUBJECTS)
    what = what.format(street=rng.choice(_MB_STREETS), park=rng.choice(_MB_PARKS))
    amount = f"${rng.randint(1, 90) * 25_000:,}"
    date = f"{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}{rng.randint(2014, 2022)}"
    if city == "SeattleCityCouncil":
        item = f"CB {rng.randint(118000, 119999)}"
        kind = "AN ORDINANCE"
    elif city == "DenverCityCouncil":
        item = f"{rng.randint(14, 22)}-{rng.randint(100, 1500):04d}"
        kind = "A bill for an ordinance"
    else:
        item = f"Res {rng.randint(31000, 32999)}"
        kind = "A RESOLUTION"
    vote = rng.randint(5, 9)
    summary = f"{kind} relating to {dept}; authorizing {amount} for {what}."
    turns = [
        ("Speaker 0", f"Agenda item {rng.randint(1, 30)}, {item}, {summary}"),
        ("Speaker 1", f"Thank you. I move to adopt {item}."),
        ("Speaker 2", "Second."),
        (
            "Speaker 1",
            (
                f"This item provides {amount} to {dept} for {what}. "
                "It was discussed in committee last week."
            ),
        ),
    ]
    if rng.random() < 0.6:
        turns.append(("Speaker 3", f"I just want to thank staff for the work on {what}."))
    turns += [
        ("Speaker 0", "Please call the roll."),
        ("Speaker 4", f"Aye. Aye. Aye. {_number_words(vote).capitalize()} in favor, none opposed."),
        ("Speaker 0", f"The motion carries and {item} is adopted."),
    ]
    return {
        "id": idx,
        "uid": f"{city}_{date}_{item}",
        "summary": summary,
        "transcript": " ".join(f"{s}: {t}" for s, t in turns),
    }


MEETINGBANK_SAMPLE_COUNTS: dict[str, int] = {"train": 30, "validation": 10, "test": 10}


def write_meetingbank_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``<out_dir>/data/<split>-00000-of-00001.parquet`` (split = train/validation/test) with
    the ``huuuyeah/meetingbank`` columns ``id`` (int64), ``uid``, ``summary``, ``transcript``.

    Each row is a council agenda item: the clerk reads the item (whose text the reference summary
    restates), a motion, a short discussion and the roll call. Byte-identical for the same ``seed``
    and pyarrow version (no timestamps are stored).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(f"meetingbank-samples-{seed}")
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("uid", pa.string()),
            ("summary", pa.string()),
            ("transcript", pa.string()),
        ]
    )
    next_id = 0
    for split, n in MEETINGBANK_SAMPLE_COUNTS.items():
        rows, uids = [], set()
        while len(rows) < n:
            row = _meetingbank_row(rng, next_id)
            next_id += 1
            if row["uid"] not in uids:
                uids.add(row["uid"])
                rows.append(row)
        table = pa.Table.from_pylist(rows, schema=schema)
        dest = Path(out_dir) / "data" / f"{split}-00000-of-00001.parquet"
        with atomic_path(dest, suffix=".parquet") as tmp:
            pq.write_table(table, tmp, compression="zstd", write_statistics=False)
    return dict(MEETINGBANK_SAMPLE_COUNTS)


# ==================================================================================================
# registration
# ==================================================================================================
def _register() -> None:
    from fedrepro.data import sources

    for name, parse, download, write, upstream, splits in (
        (
            "ami",
            parse_ami,
            download_ami,
            write_ami_samples,
            (
                f"https://github.com/{AMI_REPO} @ {AMI_TRANSCRIPTS_COMMIT} (transcripts), "
                f"{AMI_SUMMARIES_COMMIT} (abstracts); split: AMI scenario-only partition"
            ),
            ("train", "val", "test"),
        ),
        (
            "icsi",
            parse_icsi,
            download_icsi,
            write_icsi_samples,
            f"hf://datasets/{ICSI_HUB_ID} @ {ICSI_REVISION}",
            ("train", "dev", "test"),
        ),
        (
            "elitr",
            parse_elitr,
            download_elitr,
            write_elitr_samples,
            f"{ELITR_HANDLE} ({ELITR_URL}) @ sha256:{ELITR_SHA256}",
            ELITR_SPLITS,
        ),
        (
            "meetingbank",
            parse_meetingbank,
            download_meetingbank,
            write_meetingbank_samples,
            f"hf://datasets/{MEETINGBANK_HUB_ID} @ {MEETINGBANK_REVISION}",
            ("train", "validation", "test"),
        ),
    ):
        sources.register(
            sources.Source(
                name=name,
                kind="seq2seq",
                parse=parse,
                download=download,
                write_samples=write,
                config_key=_config_key(name),
                upstream=upstream,
                splits=splits,
                lang="en",
                whole_folder=name in ("elitr", "thucnews"),
            )
        )


_register()
