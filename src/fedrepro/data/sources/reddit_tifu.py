"""Reddit TIFU (Kim, Kim & Kim, NAACL 2019), "long" version: r/tifu posts with their TL;DR (FedSum appendix).

FedSum (§5, "Datasets and Distributions") lists Reddit (Kim et al. 2019, "Abstractive Summarization
of Reddit Posts with Multi-level Memory Networks") among its test beds. The "long" version pairs a
post's text (TL;DR line removed) with its TL;DR; the "short" version would use the title. Extractive
labels need sentences, which the dataset does not annotate: ``meta["sentences"]`` comes from a simple
splitter that also splits before lower-case words (Reddit posts are often written in lower case).

Raw schema (the hub loader's "long" config, Parquet)::

    {"ups": 115.0, "num_comments": 23.0, "upvote_ratio": 0.88, "score": 115.0,
     "documents": "so this happened yesterday ...", "tldr": "tried to ..., ...", "title": "forgetting ..."}

The original ``tifu_all_tokenized_and_filtered.json`` (JSON lines) is accepted too: there the text is
``selftext_without_tldr``, the title ``trimmed_title`` and each post has an ``id``. The release has a
single split, ``train`` (42,139 posts in "long"); FedSum-style experiments sample and split it
themselves.

Normalized record: ``input`` = the post text (whitespace collapsed); ``target`` = the TL;DR;
``meta`` = ``title``, ``ups``, ``num_comments``, ``score``, ``upvote_ratio``, ``sentences``,
``input_words``, ``summary_words``. Ids are ``reddit_tifu-train-<post id>`` where the raw record has
an ``id``, else ``reddit_tifu-train-<shard>-<row index>``.

Upstream for :func:`download`: the hub dataset ``ctr4si/reddit_tifu`` is a loading script (it reads
a Google-Drive file), so the data files come from the hub's automatic Parquet conversion of it, the
branch ``refs/convert/parquet`` (``long/train/0000.parquet``). That branch is rewritten by the hub's
converter, so it is a name rather than a commit; no commit SHA could be verified from this offline
machine, and the revision is a parameter.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fedrepro.data.sources import _english as en
from fedrepro.data.sources import Records, sample_writer

NAME = "reddit_tifu"
CONFIG_KEY = "data.reddit_tifu.local_dir"
HUB_ID = "ctr4si/reddit_tifu"
REVISION = "refs/convert/parquet"
CONFIG = "long"
SPLITS: tuple[str, ...] = ("train",)
_LOOSE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


# -- parsing -----------------------------------------------------------------------------------------
def split_post(text: str) -> list[str]:
    """Sentences of a Reddit post: newlines and ``.``/``!``/``?`` + whitespace end a sentence,
    whatever the case of the next word."""
    out: list[str] = []
    for para in re.split(r"\s*\n\s*", text):
        out.extend(s for s in (en.clean(x) for x in _LOOSE_END.split(para)) if s)
    return out


def convert(obj: dict, ctx: en.RowContext) -> dict:
    """One raw post (hub "long" row or original JSON line) → one normalized record."""
    if "documents" in obj or "selftext_without_tldr" not in obj:
        documents = en.get_str(obj, "documents")
        title_key = "title"
    else:
        documents = en.get_str(obj, "selftext_without_tldr")
        title_key = "trimmed_title"
    tldr = en.get_str(obj, "tldr")
    title = obj.get(title_key)
    if title is not None and not isinstance(title, str):
        raise en.FieldError(title_key, f"expected a string, got {type(title).__name__}")
    raw_id = obj.get("id")
    if raw_id is not None and (not isinstance(raw_id, str) or not raw_id.strip()):
        raise en.FieldError("id", "expected a non-empty string")
    text = en.clean(documents)
    target = en.clean(tldr)
    meta: dict = {"title": en.clean(title or "")}
    for key in ("ups", "num_comments", "score", "upvote_ratio"):
        meta[key] = en.get_number(obj, key)
    meta.update(
        sentences=split_post(documents),
        input_words=len(text.split()),
        summary_words=len(target.split()),
    )
    return en.record(ctx, raw_id.strip() if raw_id else ctx.index_id, text, target, meta)


def parse(
    path: str | os.PathLike, skip_malformed: bool = False, split: str | None = None
) -> Records:
    """Normalized records of one Reddit TIFU file (``long/train/0000.parquet`` of the hub conversion,
    ``train.jsonl`` of the samples, or the original JSON lines named ``*train*``; pass ``split`` for a
    file whose name does not say it).

    Raises
    ------
    fedrepro.io.InputError
        Malformed record (missing/empty ``documents`` or ``tldr``, non-numeric ``ups``/``score``, bad
        JSON line), naming file, line/row and field — unless ``skip_malformed``.
    """
    return en.parse_path(path, NAME, convert, skip_malformed=skip_malformed, split=split)


def load_split(
    root: str | os.PathLike, split: str = "train", skip_malformed: bool = False
) -> Records:
    """All records of ``split`` (only ``train`` exists upstream) in a local copy."""
    return en.load_split(root, split, parse, skip_malformed)


# -- download -----------------------------------------------------------------------------------------
def download(
    dest_dir: str | os.PathLike,
    timeout: float = 10.0,
    revision: str = REVISION,
    config: str = CONFIG,
) -> Path:
    """Download the Parquet conversion of ``ctr4si/reddit_tifu`` (config ``long``) into ``dest_dir``.

    Files keep the hub layout (``long/train/0000.parquet``); they are written into a staging folder
    renamed onto ``dest_dir`` once the train split is there.

    Raises
    ------
    fedrepro.data.download.DownloadError
        Offline within ``timeout`` seconds (nothing left behind); the message names Reddit TIFU, the
        hub id and revision and the config key ``data.reddit_tifu.local_dir``.
    """
    return en.hub_download(
        dest_dir,
        dataset="Reddit TIFU",
        repo_id=HUB_ID,
        revision=revision,
        allow_patterns=(f"{config}/*.parquet",),
        config_key=CONFIG_KEY,
        timeout=timeout,
        expect_splits=SPLITS,
    )


en.register_source(
    NAME, parse, download, sample_writer(NAME), CONFIG_KEY,
    upstream=f"https://huggingface.co/datasets/{HUB_ID} (config {CONFIG}) @ {REVISION}",
    splits=SPLITS,
)
