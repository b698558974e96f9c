"""ELITR: one of the four long-meeting clients of AdaFedSelecKD (§V-B4, Fig. 9).

Upstream: the ELITR Minuting Corpus v1.0, LINDAT handle ``11234/1-4692`` (REST bitstream, SHA-256
checked; :func:`download_elitr`): ``elitr-minuting-corpus-en/<split>/<meeting>/transcript_*.txt``
and ``minutes_GENER_annot*.txt``; :func:`parse_elitr` reads the folder tree at once. The record
layout and the code shared with AMI, ICSI and MeetingBank are in
:mod:`fedrepro.data.sources._meetings`.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from pathlib import Path

from fedrepro.data.download import DownloadError, fetch_url
from fedrepro.data.sources import Records, sample_writer
from fedrepro.data.sources._meetings import (
    _Collector,
    _config_key,
    _fail,
    _merge_turns,
    _raw_split_of,
    _record,
    _split_of,
    _staged_download,
    register_source,
)
from fedrepro.io import InputError, read_text

__all__ = [
    "ELITR_SHA256",
    "ELITR_URL",
    "download_elitr",
    "parse_elitr",
]


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
    for line in read_text(path).splitlines():
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
        lines = [ln.strip() for ln in read_text(mf).splitlines() if ln.strip()]
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


register_source(
    "elitr",
    parse_elitr,
    download_elitr,
    sample_writer("meetings", "write_elitr_samples"),
    upstream=f"{ELITR_HANDLE} ({ELITR_URL}) @ sha256:{ELITR_SHA256}",
    splits=ELITR_SPLITS,
    whole_folder=True,
)
