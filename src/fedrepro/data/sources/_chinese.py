"""Shared code of FedSUMM's five Chinese corpora: CSL, NLPCC2017, LCSTS, THUCNews, EDUCATION.

FedSUMM (Pan et al., §IV-A "Datasets", Table I) trains and evaluates on five Chinese corpora, one
client per corpus in the natural split, so every record's ``client`` is the source name. Each has
its own module with its download and parser (:mod:`~fedrepro.data.sources.csl`,
:mod:`~fedrepro.data.sources.nlpcc2017`, :mod:`~fedrepro.data.sources.lcsts`,
:mod:`~fedrepro.data.sources.thucnews`, :mod:`~fedrepro.data.sources.education`); this module holds
what they share (field checks, the record builder, UTF-8 line reading, split names from file
names, the hub download and the registration). Records are

    {"id", "source", "client", "split", "input", "target", "meta"}

with the Chinese text kept as it is (no word segmentation, no whitespace tokenisation; only the
ends of each text are stripped) and ``meta`` holding lengths in characters.

==========  ===========================================  ========================================
source      raw layout read by ``parse``                 ``download`` (pinned upstream)
==========  ===========================================  ========================================
csl         ``<split>.tsv``, no header:                  ``ydli-ai/CSL`` ``benchmark/ts`` at
            ``to title \\t abstract \\t title``          commit :data:`CSL_COMMIT` (raw GitHub)
nlpcc2017   JSON lines ``{"summarization", "article"}``  hub dataset ``supremezxc/nlpcc_2017``
            (``train_with_summ.txt``, ...) or the hub    @ :data:`NLPCC2017_REVISION`
            copy's ``{"data": [{"title", "content"}]}``  (``nlpcc_data.json``)
lcsts       ``<split>.src.txt`` + ``<split>.tgt.txt``    hub dataset ``aligeniewcp22/LCSTS``
            (parallel lines) or JSON lines               @ :data:`LCSTS_REVISION`
            ``{"text", "summary"[, "human_label"]}``     (``train/valid/test_public.jsonl``)
thucnews    ``THUCNews/<类别>/<n>.txt``: line 1 title,   the THUCTC release archive
            then the body (title used as the summary)    :data:`THUCNEWS_URL`
education   ``<split>.jsonl``: ``{"id", "content",       none: not public (``download`` raises
            "summary"}`` (format defined here)           :class:`~fedrepro.io.InputError`)
==========  ===========================================  ========================================

Splits are inferred from file names and normalised to ``train``/``val``/``test`` (``dev``,
``valid`` and ``validation`` mean ``val``). THUCNews has no official split: a document's split is
a fixed hash of ``<category>/<file stem>`` (90 % train, 5 % val, 5 % test, see
:func:`~fedrepro.data.sources.thucnews.thucnews_split`), so it does not depend on which files are
parsed together.

A malformed record (missing field, wrong type, empty text) raises :class:`~fedrepro.io.InputError`
naming the file, the line (or record index / id) and the field; with ``skip_malformed=True`` it is
left out and listed in :attr:`Records.skipped <fedrepro.data.sources.Records>` instead.

Each source has a deterministic sample generator writing a small copy in the raw layout
(``resources/samples/<name>/``), in :mod:`fedrepro.data.samples.chinese`; regenerate them all
with ``python -m fedrepro.data.samples.chinese resources/samples``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fedrepro.data.download import DownloadError
from fedrepro.data.download import check_reachable as _check_reachable
from fedrepro.data.sources import SPLIT_ALIASES, split_token
from fedrepro.io import InputError, atomic_dir, iter_text_lines, read_text

log = logging.getLogger(__name__)

NAMES: tuple[str, ...] = ("csl", "nlpcc2017", "lcsts", "thucnews", "education")

_SPLIT_WORDS: dict[str, str] = SPLIT_ALIASES


def _config_key(name: str) -> str:
    return f"data.{name}.local_dir"


# == shared helpers ==============================================================================
class _Malformed:
    """Raise (or, with ``skip``, record) one malformed record of ``path``."""

    def __init__(self, path: Path, skip: bool) -> None:
        self.path = path
        self.skip = skip
        self.skipped: list[tuple[str, str]] = []

    def __call__(self, loc: int | str, field: str, problem: str) -> None:
        reason = f"field `{field}`: {problem}"
        if self.skip:
            self.skipped.append((str(loc), reason))
            return
        where = f"{self.path}:{loc}" if isinstance(loc, int) else f"{self.path}: {loc}"
        raise InputError(
            f"{where}: {reason}; fix or remove this record (or parse with skip_malformed=True)"
        )


def _text(obj: dict, key: str, bad: _Malformed, loc: int | str) -> str | None:
    """``obj[key]`` as a non-empty string with its ends stripped, else report it and return None."""
    if key not in obj or obj[key] is None:
        bad(loc, key, "missing")
        return None
    value = obj[key]
    if not isinstance(value, str):
        bad(loc, key, f"expected a string, got {type(value).__name__}")
        return None
    value = value.strip()
    if not value:
        bad(loc, key, "empty")
        return None
    return value


def _record(name: str, split: str, key: str, text: str, target: str, **meta: Any) -> dict:
    return {
        "id": f"{name}-{split}-{key}",
        "source": name,
        "client": name,
        "split": split,
        "input": text,
        "target": target,
        "meta": {"input_chars": len(text), "target_chars": len(target), **meta},
    }


def _split_from_name(path: Path, stem: str) -> str:
    """The normalised split named by a word of ``stem`` (``test_public`` -> test, ``dev`` -> val)."""
    token = split_token(stem)
    if token is not None:
        return _SPLIT_WORDS[token]
    raise InputError(
        f"{path}: cannot tell the split from the file name; name the file after its split "
        f"(train, val/valid/dev or test, e.g. `train.jsonl`)"
    )


def _read_text(path: Path) -> str:
    """The UTF-8 text of ``path``; bad bytes raise :class:`InputError` naming the file and line."""
    return read_text(path)


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` streamed from a UTF-8 file, split on ``\\n`` only (Weibo and news
    text may hold U+2028 and other characters ``str.splitlines`` would break on); ``\\r`` and a
    leading byte-order mark are dropped; bad bytes raise :class:`InputError` naming the line."""
    return iter_text_lines(path)


def _count_lines(path: Path) -> int:
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def _iter_json_lines(path: Path, bad: _Malformed) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of each non-blank JSON line; bad JSON is a malformed record."""
    for lineno, line in _iter_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            bad(lineno, "<line>", f"not valid JSON ({exc.msg})")
            continue
        if not isinstance(obj, dict):
            bad(lineno, "<line>", f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield lineno, obj


# == downloads ===================================================================================
def _hub_download(
    *,
    dataset: str,
    name: str,
    repo_id: str,
    revision: str,
    files: Sequence[str],
    dest_dir: str | os.PathLike,
    timeout: float,
    layout: str,
) -> Path:
    """Download ``files`` of hub dataset ``repo_id`` at ``revision`` into ``dest_dir`` atomically."""
    dest_dir = Path(dest_dir)
    config_key = _config_key(name)

    def failure(detail: str) -> DownloadError:
        return DownloadError(
            f"{dataset}: could not download {', '.join(files)} from the Hugging Face hub dataset "
            f"{repo_id} at revision {revision} (https://huggingface.co/datasets/{repo_id}) "
            f"({detail}). If this machine has no internet access, fetch the files elsewhere and set "
            f"the config key `{config_key}` to the folder holding your local copy ({layout})."
        )

    from huggingface_hub import constants, hf_hub_download

    if constants.HF_HUB_OFFLINE:
        raise failure("HF_HUB_OFFLINE is set")
    try:
        _check_reachable(constants.ENDPOINT, timeout)
        with atomic_dir(dest_dir) as staging:
            for filename in files:
                log.info("downloading %s@%s:%s -> %s", repo_id, revision, filename, dest_dir)
                hf_hub_download(
                    repo_id,
                    filename,
                    repo_type="dataset",
                    revision=revision,
                    local_dir=staging,
                    etag_timeout=timeout,
                )
            shutil.rmtree(staging / ".cache", ignore_errors=True)  # hub bookkeeping, not data
    except DownloadError:
        raise
    except Exception as exc:
        raise failure(f"{type(exc).__name__}: {exc}") from exc
    return dest_dir


def _url_download_error(exc: DownloadError, layout: str) -> DownloadError:
    return DownloadError(f"{exc} Expected layout of that folder: {layout}.")


# == registration ================================================================================
def register_source(name: str, parse, download, write_samples, **fields) -> None:
    """Register one of the five Chinese sources (``data.<name>.local_dir``, language ``zh``)."""
    from fedrepro.data import sources

    sources.register_seq2seq(name, parse, download, write_samples, lang="zh", **fields)
