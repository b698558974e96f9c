"""AMI: one of the four long-meeting clients of AdaFedSelecKD (§V-B4, Fig. 9).

Upstream: GitHub ``gcunhase/AMICorpusXML``, transcript and abstract files at two pinned commits,
assembled by :func:`download_ami` into ``ami_abstractive.jsonl``: one meeting a line
``{meeting_id, transcript, abstract, abstract_sentences}``, which :func:`parse_ami` reads. The split
comes from the AMI scenario-only partition (:data:`AMI_SPLIT`). The record layout and the code
shared with ICSI, ELITR and MeetingBank are in :mod:`fedrepro.data.sources._meetings`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from fedrepro.data.download import fetch_url
from fedrepro.data.sources import Records, sample_writer
from fedrepro.data.sources._meetings import (
    _clean,
    _Collector,
    _config_key,
    _fail,
    _iter_json_lines,
    _record,
    _req,
    _req_text,
    _require_file,
    _staged_download,
    register_source,
)

__all__ = [
    "AMI_FILE",
    "AMI_MEETINGS",
    "AMI_SCENARIO_PARTITION",
    "AMI_SPLIT",
    "AMI_SUMMARIES_COMMIT",
    "AMI_TRANSCRIPTS_COMMIT",
    "ami_split",
    "download_ami",
    "parse_ami",
]


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


register_source(
    "ami",
    parse_ami,
    download_ami,
    sample_writer("meetings", "write_ami_samples"),
    upstream=(
        f"https://github.com/{AMI_REPO} @ {AMI_TRANSCRIPTS_COMMIT} (transcripts), "
        f"{AMI_SUMMARIES_COMMIT} (abstracts); split: AMI scenario-only partition"
    ),
    splits=("train", "val", "test"),
)
