"""SAMSum: messenger-style dialogues with abstractive summaries (AdaFedSelecKD's fourth client).

AdaFedSelecKD (§IV, "Extreme Non-IID and Unbalanced Data Setting", Fig. 8 and Table VII) adds a
fourth client holding SAMSum (Gliwa et al., 2019) to the three QMSum domain clients: short chat
dialogues (~120 tokens, ~11 turns) with one- or two-sentence third-person summaries (~23 tokens),
so the client differs from QMSum in topic, length and style. One client per dataset: records carry
``client = "samsum"``.

Raw schema (the official ``corpus.7z`` files ``train.json``/``val.json``/``test.json``: one JSON
list)::

    [{"id": "13818513", "summary": "Amanda baked cookies ...", "dialogue": "Amanda: I baked cookies.\\r\\nJerry: Sure!"}, ...]

Turns are separated by ``\\r\\n`` (train) or ``\\n``; each turn is ``<speaker>: <text>``. The parser
also accepts JSON lines, CSV with the same columns (the hub copy) and Parquet. Official sizes:
train 14,732 / val 818 / test 819.

Normalized record: ``input`` = the turns, whitespace-cleaned, joined by ``\\n``; ``target`` = the
summary (whitespace collapsed); ``meta`` = ``original_id``, ``sentences`` (the turns: the natural
extractive units of a dialogue), ``n_turns``, ``speakers`` (in order of first appearance),
``input_words``, ``summary_words``.

Upstream for :func:`download`: the hub dataset ``knkarthick/samsum`` (a plain data-file copy of the
corpus — CSV with columns ``id, dialogue, summary`` — that needs no loading script). The original
``Samsung/samsum`` repository ships a loading script plus ``corpus.7z`` (7-Zip, would need an extra
dependency), so it is not used. The revision is the branch ``main``: no commit SHA could be verified
from this offline machine, so it is a parameter (:data:`REVISION`).
"""

from __future__ import annotations

import os
from pathlib import Path

from fedrepro.data.sources import _english as en
from fedrepro.data.sources import Records, sample_writer

NAME = "samsum"
CONFIG_KEY = "data.samsum.local_dir"
HUB_ID = "knkarthick/samsum"
REVISION = "main"
"""Hub revision of :data:`HUB_ID` (a branch name: no commit SHA verifiable offline)."""
ALLOW_PATTERNS: tuple[str, ...] = ("*.csv", "*.json", "*.jsonl", "*.parquet")


# -- parsing -----------------------------------------------------------------------------------------
def _raw_id(obj: dict) -> str:
    value = obj.get("id")
    if value is None:
        raise en.FieldError("id", "missing")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise en.FieldError("id", f"expected a string, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise en.FieldError("id", "empty")
    return text


def _speaker(turn: str) -> str | None:
    head, sep, _ = turn.partition(":")
    return head.strip() if sep and 0 < len(head.strip()) <= 40 else None


def convert(obj: dict, ctx: en.RowContext) -> dict:
    """One raw SAMSum dialogue → one normalized record (see the module docstring)."""
    raw_id = _raw_id(obj)
    dialogue = en.get_str(obj, "dialogue")
    summary = en.get_str(obj, "summary")
    turns = [en.clean(t) for t in dialogue.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    turns = [t for t in turns if t]
    speakers: list[str] = []
    for t in turns:
        s = _speaker(t)
        if s and s not in speakers:
            speakers.append(s)
    text = "\n".join(turns)
    target = en.clean(summary)
    return en.record(
        ctx,
        raw_id,
        text,
        target,
        {
            "original_id": raw_id,
            "sentences": turns,
            "n_turns": len(turns),
            "speakers": speakers,
            "input_words": len(text.split()),
            "summary_words": len(target.split()),
        },
    )


def parse(
    path: str | os.PathLike, skip_malformed: bool = False, split: str | None = None
) -> Records:
    """Normalized records of one raw SAMSum split file (``train.json``, ``val.json``, ``test.json``,
    or the hub copy's ``*.csv``/``*.parquet``); the split comes from the file name.

    Raises
    ------
    fedrepro.io.InputError
        A malformed record (missing/empty ``id``, ``dialogue`` or ``summary``, wrong type, bad JSON
        line), naming the file, the line or record index, the id and the field — unless
        ``skip_malformed``, which lists it in ``Records.skipped`` instead.
    """
    return en.parse_path(path, NAME, convert, skip_malformed=skip_malformed, split=split)


def load_split(root: str | os.PathLike, split: str, skip_malformed: bool = False) -> Records:
    """All records of ``split`` in a local copy (any file under ``root`` whose name names the split)."""
    return en.load_split(root, split, parse, skip_malformed)


# -- download -----------------------------------------------------------------------------------------
def download(dest_dir: str | os.PathLike, timeout: float = 10.0, revision: str = REVISION) -> Path:
    """Download the SAMSum data files of ``knkarthick/samsum`` at ``revision`` into ``dest_dir``.

    The hub files keep their names (one file per split; :func:`parse` reads CSV, JSON and Parquet).
    Everything lands in a staging folder renamed onto ``dest_dir`` once all three splits are there.

    Raises
    ------
    fedrepro.data.download.DownloadError
        Offline within ``timeout`` seconds (nothing is left behind); the message names SAMSum, the
        hub id and revision and the config key ``data.samsum.local_dir``.
    """
    return en.hub_download(
        dest_dir,
        dataset="SAMSum",
        repo_id=HUB_ID,
        revision=revision,
        allow_patterns=ALLOW_PATTERNS,
        config_key=CONFIG_KEY,
        timeout=timeout,
    )


en.register_source(
    NAME, parse, download, sample_writer(NAME), CONFIG_KEY,
    upstream=f"https://huggingface.co/datasets/{HUB_ID} @ {REVISION}",
    splits=en.SPLITS,
)
