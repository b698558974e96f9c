"""CSL: FedSUMM's Chinese scientific-literature client (§IV-A): a paper's abstract -> its title.

Raw layout read by :func:`parse_csl`: ``<split>.tsv``, no header, ``to title \\t abstract \\t
title``. :func:`download_csl` fetches ``ydli-ai/CSL`` ``benchmark/ts`` at commit :data:`CSL_COMMIT`
(raw GitHub). 
Record layout, split names and the code shared with the other Chinese corpora are in
:mod:`fedrepro.data.sources._chinese`.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedrepro.data.download import DownloadError, fetch_url
from fedrepro.data.sources import Records, sample_writer
from fedrepro.data.sources._chinese import (
    _config_key,
    _iter_lines,
    _Malformed,
    _record,
    _split_from_name,
    _text,
    _url_download_error,
    register_source,
)
from fedrepro.io import atomic_dir

__all__ = [
    "CSL_COMMIT",
    "CSL_URL_TEMPLATE",
    "download_csl",
    "parse_csl",
]

CSL_REPO = "ydli-ai/CSL"
CSL_COMMIT = "7533806e5946f22d7a8bc601c15758632a21a9c3"
"""Commit of ``ydli-ai/CSL`` holding the CSL benchmark's ``benchmark/ts/{dev,test}.tsv``. Verified
offline only for ``dev.tsv`` and ``test.tsv`` (their content equals the project's real copy);
``train.tsv`` is the README's training file of the same benchmark commit."""
CSL_URL_TEMPLATE = "https://raw.githubusercontent.com/ydli-ai/CSL/{commit}/benchmark/ts/{file}"
CSL_FILES: tuple[str, ...] = ("train.tsv", "dev.tsv", "test.tsv")
CSL_PROMPT = "to title"


def download_csl(
    dest_dir: str | os.PathLike, timeout: float = 10.0, commit: str = CSL_COMMIT
) -> Path:
    """Download the CSL title-summarization benchmark (``benchmark/ts``) into ``dest_dir``.

    CSL (Li et al., COLING 2022) is FedSUMM's Chinese scientific-literature client (§IV-A):
    predict a paper's title from its abstract. The benchmark samples 10,000 papers split
    8:1:1; each split is a header-less TSV ``to title \\t <abstract> \\t <title>``.

    Parameters
    ----------
    dest_dir:
        Target folder; receives ``train.tsv``, ``dev.tsv`` and ``test.tsv`` (staged in a sibling
        temporary folder and renamed into place only when all three arrived).
    timeout:
        Seconds for connecting and for each read; offline, the call fails within about this time.
    commit:
        Commit of ``ydli-ai/CSL`` (default :data:`CSL_COMMIT`).

    Raises
    ------
    DownloadError
        Naming the dataset, the URL (with the commit) and the config key ``data.csl.local_dir``.
    """
    dest_dir = Path(dest_dir)
    layout = "train.tsv, dev.tsv, test.tsv from CSL's benchmark/ts"
    with atomic_dir(dest_dir) as staging:
        for filename in CSL_FILES:
            url = CSL_URL_TEMPLATE.format(commit=commit, file=filename)
            try:
                fetch_url(
                    url,
                    staging / filename,
                    timeout=timeout,
                    config_key=_config_key("csl"),
                    dataset=f"CSL title summarization ({CSL_REPO}@{commit})",
                )
            except DownloadError as exc:
                raise _url_download_error(exc, layout) from exc.__cause__
    return dest_dir


def parse_csl(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Records of one CSL ``benchmark/ts`` split file (``train.tsv``, ``dev.tsv``, ``test.tsv``).

    Each non-blank line is ``to title \\t <abstract> \\t <title>`` (no header, no quoting: the
    text contains ``"`` characters); input = abstract, target = title. Ids are
    ``csl-<split>-<line>``.
    """
    path = Path(path)
    split = _split_from_name(path, path.stem)
    bad = _Malformed(path, skip_malformed)
    records: list[dict] = []
    for lineno, line in _iter_lines(path):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 3:
            bad(
                lineno,
                "<columns>",
                f"expected 3 tab-separated columns (prompt, abstract, title), got {len(cols)}",
            )
            continue
        if cols[0].strip() != CSL_PROMPT:
            bad(
                lineno,
                "prompt",
                f"expected {CSL_PROMPT!r} (the title-summarization task), got {cols[0][:30]!r}",
            )
            continue
        abstract = _text({"abstract": cols[1]}, "abstract", bad, lineno)
        title = abstract and _text({"title": cols[2]}, "title", bad, lineno)
        if not (abstract and title):  # one report per record
            continue
        records.append(_record("csl", split, f"{lineno:06d}", abstract, title, line=lineno))
    return Records(records, bad.skipped)


register_source(
    "csl",
    parse_csl,
    download_csl,
    sample_writer("chinese", "write_csl_samples"),
    upstream=f"https://github.com/{CSL_REPO} (benchmark/ts) @ {CSL_COMMIT}",
    splits=("train", "val", "test"),
)
