"""CNN/DailyMail (version 3.0.0, non-anonymized): news articles with bullet-point highlights (FedSum).

FedSum (§5, "Datasets and Distributions", Tables 1, 3, 4 and Fig. 4-5) trains an extractive
BERTSUM-style summarizer federatedly on CNN/DailyMail (Nallapati et al., 2017), with 2K training
samples spread over the clients by a Dirichlet quantity skew; its extractive labels need the
article's sentence list, which every record keeps in ``meta["sentences"]``.

Raw schemas accepted (one record per article):

* the hub release ``abisee/cnn_dailymail``, config ``3.0.0`` (Parquet, ``3.0.0/{train-0000k-of-00003,
  validation-00000-of-00001,test-00000-of-00001}.parquet``; 287,113 / 13,368 / 11,490 articles)::

      {"article": "(CNN) -- ...", "highlights": "First bullet .\\nSecond bullet .", "id": "<40 hex>"}

* the FRANK copy of the test set (``frank_cnndm_test.jsonl``), which adds the sentence-split article
  and puts the highlights on one line::

      {"id": "dm-test-<hash>", "hash": ..., "url": ..., "article": ..., "article_lines": [...],
       "highlights": "First bullet . Second bullet .", "highlights_lower_tok": ...}

Normalized record: ``input`` = the article (whitespace collapsed); ``target`` = the highlights
joined by spaces; ``meta`` = ``original_id``, ``sentences`` (``article_lines`` where present, else the
simple splitter of :func:`fedrepro.data.sources._english.split_sentences`), ``highlights`` (list), ``url``
(where present), ``input_words``, ``summary_words``.

Upstream for :func:`download`: ``abisee/cnn_dailymail`` at commit
``3adf6249f0cc8409a97a4d38471529ef5f7dc496`` (a revision of the Parquet-only repository whose
``3.0.0/test-00000-of-00001.parquet`` has 11,490 rows, as recorded by another project that pinned
it; not re-verified from this offline machine, hence the ``revision`` parameter).
"""

from __future__ import annotations

import os
from pathlib import Path

from fedrepro.data.sources import _english as en
from fedrepro.data.sources import Records, sample_writer

NAME = "cnndm"
CONFIG_KEY = "data.cnndm.local_dir"
HUB_ID = "abisee/cnn_dailymail"
REVISION = "3adf6249f0cc8409a97a4d38471529ef5f7dc496"
CONFIG = "3.0.0"


# -- parsing -----------------------------------------------------------------------------------------
def _highlight_list(highlights: str) -> list[str]:
    if "\n" in highlights.strip():
        lines = [en.clean(h) for h in highlights.split("\n")]
    else:
        lines = en.split_sentences(highlights)
    return [h for h in lines if h]


def convert(obj: dict, ctx: en.RowContext) -> dict:
    """One raw CNN/DM article (hub or FRANK schema) → one normalized record."""
    raw_id = en.get_str(obj, "id").strip()
    article = en.get_str(obj, "article")
    highlights = en.get_str(obj, "highlights")
    if "article_lines" in obj and obj["article_lines"] is not None:
        sentences = [en.clean(s) for s in en.get_str_list(obj, "article_lines")]
        sentences = [s for s in sentences if s]
    else:
        sentences = en.split_sentences(article)
    hl = _highlight_list(highlights)
    text = en.clean(article)
    target = " ".join(hl)
    meta: dict = {
        "original_id": raw_id,
        "sentences": sentences,
        "highlights": hl,
        "input_words": len(text.split()),
        "summary_words": len(target.split()),
    }
    if isinstance(obj.get("url"), str):
        meta["url"] = obj["url"]
    return en.record(ctx, raw_id, text, target, meta)


def parse(
    path: str | os.PathLike, skip_malformed: bool = False, split: str | None = None
) -> Records:
    """Normalized records of one CNN/DM split file (or a folder of one split's shards).

    The split comes from the file name (``test-00000-of-00001.parquet``, ``frank_cnndm_test.jsonl``,
    ``validation.jsonl``).

    Raises
    ------
    fedrepro.io.InputError
        Malformed record (missing/empty ``id``, ``article`` or ``highlights``, non-string
        ``article_lines`` items, bad JSON line), naming file, line/row, id and field — unless
        ``skip_malformed``.
    """
    return en.parse_path(path, NAME, convert, skip_malformed=skip_malformed, split=split)


def load_split(root: str | os.PathLike, split: str, skip_malformed: bool = False) -> Records:
    """All records of ``split`` in a local copy (e.g. the three train shards of the hub release)."""
    return en.load_split(root, split, parse, skip_malformed)


# -- download -----------------------------------------------------------------------------------------
def download(
    dest_dir: str | os.PathLike,
    timeout: float = 10.0,
    revision: str = REVISION,
    config: str = CONFIG,
) -> Path:
    """Download the Parquet files of ``abisee/cnn_dailymail`` config ``3.0.0`` at ``revision``.

    Files land in ``dest_dir/3.0.0/`` with their hub names, via a staging folder renamed onto
    ``dest_dir`` once all three splits are there; nothing partial is left behind.

    Raises
    ------
    fedrepro.data.download.DownloadError
        Offline within ``timeout`` seconds; the message names CNN/DailyMail, the hub id and revision
        and the config key ``data.cnndm.local_dir``.
    """
    return en.hub_download(
        dest_dir,
        dataset="CNN/DailyMail",
        repo_id=HUB_ID,
        revision=revision,
        allow_patterns=(f"{config}/*.parquet",),
        config_key=CONFIG_KEY,
        timeout=timeout,
    )


en.register_source(
    NAME, parse, download, sample_writer(NAME), CONFIG_KEY,
    upstream=f"https://huggingface.co/datasets/{HUB_ID} (config {CONFIG}) @ {REVISION}",
    splits=en.SPLITS,
)
