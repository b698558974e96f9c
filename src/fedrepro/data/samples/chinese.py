"""FedSUMM's five Chinese summarization corpora: CSL, NLPCC2017, LCSTS, THUCNews and EDUCATION.

FedSUMM (Pan et al., §IV-A "Datasets", Table I) trains and evaluates on five Chinese corpora, one
client per corpus in the natural split, so every record's ``client`` is the source name. Records are

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
:func:`thucnews_split`), so it does not depend on which files are parsed together.

A malformed record (missing field, wrong type, empty text) raises :class:`~fedrepro.io.InputError`
naming the file, the line (or record index / id) and the field; with ``skip_malformed=True`` it is
left out and listed in :attr:`Records.skipped <fedrepro.data.sources.Records>` instead.

Each source has a deterministic sample generator writing a small copy in the raw layout
(``resources/samples/<name>/``); regenerate them all with
``python -m fedrepro.data.chinese resources/samples``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import re
import shutil
import sys
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fedrepro.data.download import DownloadError, fetch_url
from fedrepro.data.download import check_reachable as _check_reachable
from fedrepro.data.sources import SPLIT_ALIASES, Records, split_token
from fedrepro.io import InputError, atomic_dir, write_text_atomic

__all__ = [
    "CSL_COMMIT",
    "CSL_URL_TEMPLATE",
    "LCSTS_HUB_ID",
    "LCSTS_REVISION",
    "NAMES",
    "NLPCC2017_HUB_ID",
    "NLPCC2017_REVISION",
    "THUCNEWS_CATEGORIES",
    "THUCNEWS_URL",
    "download_csl",
    "download_education",
    "download_lcsts",
    "download_nlpcc2017",
    "download_thucnews",
    "main",
    "parse_csl",
    "parse_education",
    "parse_lcsts",
    "parse_nlpcc2017",
    "parse_thucnews",
    "thucnews_split",
    "write_csl_samples",
    "write_education_samples",
    "write_lcsts_samples",
    "write_nlpcc2017_samples",
    "write_thucnews_samples",
]

log = logging.getLogger(__name__)

NAMES: tuple[str, ...] = ("csl", "nlpcc2017", "lcsts", "thucnews", "education")

CSL_REPO = "ydli-ai/CSL"
CSL_COMMIT = "7533806e5946f22d7a8bc601c15758632a21a9c3"
"""Commit of ``ydli-ai/CSL`` holding the CSL benchmark's ``benchmark/ts/{dev,test}.tsv``. Verified
offline only for ``dev.tsv`` and ``test.tsv`` (their content equals the project's real copy);
``train.tsv`` is the README's training file of the same benchmark commit."""
CSL_URL_TEMPLATE = "https://raw.githubusercontent.com/ydli-ai/CSL/{commit}/benchmark/ts/{file}"
CSL_FILES: tuple[str, ...] = ("train.tsv", "dev.tsv", "test.tsv")
CSL_PROMPT = "to title"

NLPCC2017_HUB_ID = "supremezxc/nlpcc_2017"
NLPCC2017_REVISION = "aadf712d40e83f2061b9fe06b9d30ff3f091a494"
"""The hub commit that uploaded ``nlpcc_data.json`` (the later ``main`` commit only edits the
README)."""
NLPCC2017_HUB_FILE = "nlpcc_data.json"
NLPCC2017_FILE_SPLITS: dict[str, str] = {
    "train_with_summ.txt": "train",  # official training release (toutiao4nlpcc/)
    "evaluation_with_ground_truth.txt": "test",  # official evaluation set with references
    NLPCC2017_HUB_FILE: "train",  # hub copy of the 50,000 training pairs
}

LCSTS_HUB_ID = "aligeniewcp22/LCSTS"
LCSTS_REVISION = "0056707cbf6a5ece8a70c550ed00a451a7449903"
LCSTS_HUB_FILES: tuple[str, ...] = ("train.jsonl", "valid.jsonl", "test_public.jsonl")

THUCNEWS_URL = "http://thuctc.thunlp.org/source/THUCNews.zip"
"""The THUCTC release archive (~1.5 GB zip, 836,075 Sina news documents in 14 category folders).
It is an unversioned, unchanged-since-release file; the URL is its only identifier."""
THUCNEWS_CATEGORIES: dict[str, str] = {
    "体育": "sports",
    "娱乐": "entertainment",
    "家居": "home",
    "彩票": "lottery",
    "房产": "realestate",
    "教育": "education",
    "时尚": "fashion",
    "时政": "politics",
    "星座": "horoscope",
    "游戏": "games",
    "社会": "society",
    "科技": "technology",
    "股票": "stocks",
    "财经": "finance",
}
"""The 14 THUCNews category folders and the ASCII slugs used in record ids."""

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
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc}); convert the file to UTF-8") from exc
    return text.removeprefix("\ufeff")


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` streamed from a UTF-8 file, split on ``\\n`` only (Weibo and news
    text may hold U+2028 and other characters ``str.splitlines`` would break on); ``\\r`` and a
    leading byte-order mark are dropped."""
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    lineno = 0
    try:
        with open(path, encoding="utf-8", newline="\n") as fh:
            for lineno, line in enumerate(fh, start=1):
                line = line.removesuffix("\n").removesuffix("\r")
                yield lineno, line.removeprefix("\ufeff") if lineno == 1 else line
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}:{lineno + 1}: not UTF-8 text ({exc.reason}); convert the file to UTF-8"
        ) from exc


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


def download_nlpcc2017(
    dest_dir: str | os.PathLike, timeout: float = 10.0, revision: str = NLPCC2017_REVISION
) -> Path:
    """Download the NLPCC 2017 shared task 3 (single-document summarization) training pairs.

    The official release (``tcci.ccf.org.cn``, Toutiao news, JSON lines ``{"summarization",
    "article"}``; 50,000 training pairs) has no stable download address; this fetches the hub
    copy ``supremezxc/nlpcc_2017`` (``nlpcc_data.json``, a JSON document
    ``{"data": [{"title": <summary>, "content": <article>}, ...]}``) at ``revision``, which
    :func:`parse_nlpcc2017` reads as the ``train`` split. Not verified offline: the hub file's
    layout is taken from the code that uses it (``load_dataset("json", field="data")``).

    Raises
    ------
    DownloadError
        Naming the dataset, the hub id and revision and the config key
        ``data.nlpcc2017.local_dir``.
    """
    return _hub_download(
        dataset="NLPCC 2017 shared task 3 (single-document summarization)",
        name="nlpcc2017",
        repo_id=NLPCC2017_HUB_ID,
        revision=revision,
        files=(NLPCC2017_HUB_FILE,),
        dest_dir=dest_dir,
        timeout=timeout,
        layout="the official train_with_summ.txt / evaluation_with_ground_truth.txt JSON lines, "
        "or nlpcc_data.json",
    )


def download_lcsts(
    dest_dir: str | os.PathLike, timeout: float = 10.0, revision: str = LCSTS_REVISION
) -> Path:
    """Download LCSTS (Hu et al., EMNLP 2015) from the hub copy ``aligeniewcp22/LCSTS``.

    Files ``train.jsonl`` (2,400,591 pairs), ``valid.jsonl`` (8,685) and ``test_public.jsonl``
    (725), JSON lines ``{"text", "summary"[, "human_label"]}`` (the copy's README), at
    ``revision``. The parallel-line copy of the 10,666 human-scored pairs
    (``test.src.txt``/``test.tgt.txt``, as distributed with benchmark suites) is read by the same
    parser; point ``data.lcsts.local_dir`` at it to use it instead.

    Raises
    ------
    DownloadError
        Naming the dataset, the hub id and revision and the config key ``data.lcsts.local_dir``.
    """
    return _hub_download(
        dataset="LCSTS (Large-scale Chinese Short Text Summarization)",
        name="lcsts",
        repo_id=LCSTS_HUB_ID,
        revision=revision,
        files=LCSTS_HUB_FILES,
        dest_dir=dest_dir,
        timeout=timeout,
        layout="<split>.src.txt + <split>.tgt.txt parallel lines, or <split>.jsonl with text/summary",
    )


def _zip_member_name(info: zipfile.ZipInfo) -> str:
    """Member name, re-decoded as GBK when the archive did not flag it as UTF-8 (Windows zips)."""
    if info.flag_bits & 0x800:
        return info.filename
    try:
        return info.filename.encode("cp437").decode("gbk")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return info.filename


def _extract_thucnews(archive: Path, out_dir: Path) -> int:
    """Extract ``THUCNews/<category>/<n>.txt`` members of ``archive`` below ``out_dir``."""
    n = 0
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            parts = [p for p in _zip_member_name(info).replace("\\", "/").split("/") if p]
            if not parts or "__MACOSX" in parts or any(p in (".", "..") for p in parts):
                continue
            if not parts[-1].endswith(".txt") or len(parts) < 2:
                continue
            target = out_dir / "THUCNews" / parts[-2] / parts[-1]
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            n += 1
    return n


def download_thucnews(
    dest_dir: str | os.PathLike, timeout: float = 10.0, url: str = THUCNEWS_URL
) -> Path:
    """Download and unpack THUCNews (Sun et al., THUCTC) into ``dest_dir/THUCNews/<类别>/<n>.txt``.

    THUCNews has no summaries; FedSUMM's THUCNEWS client ("0.74 million news documents", §IV-A)
    is read here as title generation: the body is the input and the news title (line 1 of every
    document) the summary, the usual way this corpus is used for Chinese summarization. The archive
    is unversioned (``url`` is the release's only identifier); it is fetched into a staging folder,
    unpacked there (GBK member names decoded) and deleted, and the folder is renamed into place.

    Raises
    ------
    DownloadError
        Naming the dataset, the URL and the config key ``data.thucnews.local_dir``.
    """
    dest_dir = Path(dest_dir)
    layout = "THUCNews/<category>/<n>.txt (the unpacked THUCNews.zip)"
    with atomic_dir(dest_dir) as staging:
        archive = staging / "THUCNews.zip"
        try:
            fetch_url(
                url,
                archive,
                timeout=timeout,
                config_key=_config_key("thucnews"),
                dataset="THUCNews (THUCTC release)",
            )
        except DownloadError as exc:
            raise _url_download_error(exc, layout) from exc.__cause__
        try:
            n = _extract_thucnews(archive, staging)
        except (zipfile.BadZipFile, OSError) as exc:
            raise DownloadError(
                f"THUCNews: the archive from {url} could not be unpacked ({exc}); set the config key "
                f"`{_config_key('thucnews')}` to an unpacked local copy ({layout})"
            ) from exc
        archive.unlink()
        if n == 0:
            raise DownloadError(
                f"THUCNews: the archive from {url} holds no <category>/<n>.txt documents; set the "
                f"config key `{_config_key('thucnews')}` to a local copy ({layout})"
            )
    return dest_dir


def download_education(dest_dir: str | os.PathLike, timeout: float = 10.0) -> Path:
    """EDUCATION cannot be downloaded: it is not public. Raises at once, touching nothing.

    FedSUMM (§IV-A) describes EDUCATION as "a dataset about mainstream vertical media in the
    education and training industry, which consists of over 2 million real Chinese short texts"; no
    release, address or licence is given anywhere.

    Raises
    ------
    InputError
        Always, explaining the local-copy format and the config key ``data.education.local_dir``.
    """
    raise InputError(
        "EDUCATION (FedSUMM §IV-A: short texts from education and training industry media) is not "
        "publicly available, so it cannot be downloaded. Obtain a copy from the authors and set the "
        f"config key `{_config_key('education')}` to a folder holding `train.jsonl`, `val.jsonl` "
        'and `test.jsonl`: JSON lines `{"id": <string or integer, unique per file>, '
        '"content": <text>, "summary": <summary>}`, UTF-8.'
    )


# == parsers =====================================================================================
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


def _nlpcc_split(path: Path) -> str:
    if path.name in NLPCC2017_FILE_SPLITS:
        return NLPCC2017_FILE_SPLITS[path.name]
    return _split_from_name(path, path.name.split(".")[0])


def _nlpcc_document(path: Path, bad: _Malformed) -> Iterator[tuple[int, dict]]:
    """Records of a whole-file JSON document: ``{"data": [...]}`` or a list."""
    try:
        doc = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
    items = doc.get("data") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise InputError(
            f'{path}: expected a JSON list of records or {{"data": [...]}}, got '
            f"{type(doc).__name__}{' without a `data` list' if isinstance(doc, dict) else ''}"
        )
    for index, obj in enumerate(items):
        if not isinstance(obj, dict):
            bad(f"record {index}", "<record>", f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield index, obj


def _paragraphs(article: str) -> list[str]:
    """Paragraphs of an NLPCC article (``<Paragraph>`` markers or newlines), blanks dropped."""
    return [p.strip() for p in re.split(r"<Paragraph>|\n", article) if p.strip()]


def parse_nlpcc2017(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Records of one NLPCC 2017 task 3 file: input = article, target = reference summary.

    Accepted files:

    * the official JSON lines ``{"summarization": ..., "article": ...}`` (``train_with_summ.txt``
      -> train, ``evaluation_with_ground_truth.txt`` -> test, or any ``<split>.jsonl``); the
      article's ``<Paragraph>`` markers become newlines;
    * the hub copy ``nlpcc_data.json`` (``{"data": [{"title": <summary>, "content": <article>}]}``,
      the training pairs) or any ``<split>.json`` in that layout.

    Ids are ``nlpcc2017-<split>-<line or record index>``.
    """
    path = Path(path)
    split = _nlpcc_split(path)
    bad = _Malformed(path, skip_malformed)
    items: Iterator[tuple[int | str, str, dict, dict]]
    if path.suffix.lower() == ".json":  # whole-file document (the hub copy)
        items = (
            (f"record {i}", f"r{i:06d}", {"record_index": i}, obj)
            for i, obj in _nlpcc_document(path, bad)
        )
    else:  # JSON lines (the official release)
        items = (
            (lineno, f"{lineno:06d}", {"line": lineno}, obj)
            for lineno, obj in _iter_json_lines(path, bad)
        )
    records: list[dict] = []
    for loc, key, where, obj in items:
        # official field names, or the hub copy's (title = the reference summary)
        summary_key = "title" if "summarization" not in obj and "title" in obj else "summarization"
        article_key = "content" if "article" not in obj and "content" in obj else "article"
        summary = _text(obj, summary_key, bad, loc)
        article = summary and _text(obj, article_key, bad, loc)
        if not (summary and article):
            continue
        paragraphs = _paragraphs(article)
        records.append(
            _record(
                "nlpcc2017",
                split,
                key,
                "\n".join(paragraphs),
                summary,
                paragraphs=len(paragraphs),
                **where,
            )
        )
    return Records(records, bad.skipped)


def _lcsts_pair(path: Path) -> tuple[Path, Path, str]:
    """(src file, tgt file, split prefix) for either file of a pair or their common prefix."""
    for suffix in (".src.txt", ".tgt.txt"):
        if path.name.endswith(suffix):
            prefix = path.name[: -len(suffix)]
            break
    else:
        prefix = path.name
    src = path.with_name(f"{prefix}.src.txt")
    tgt = path.with_name(f"{prefix}.tgt.txt")
    missing = [str(p) for p in (src, tgt) if not p.is_file()]
    if missing:
        raise InputError(
            f"LCSTS parallel files {src} and {tgt}: {', '.join(missing)} not found; a split is a pair "
            f"<split>.src.txt (texts) + <split>.tgt.txt (summaries), one pair per line"
        )
    return src, tgt, prefix


def _parse_lcsts_jsonl(path: Path, bad: _Malformed) -> list[dict]:
    split = _split_from_name(path, path.name.split(".")[0])
    records: list[dict] = []
    for lineno, obj in _iter_json_lines(path, bad):
        text = _text(obj, "text", bad, lineno)
        summary = text and _text(obj, "summary", bad, lineno)
        if not (text and summary):
            continue
        meta: dict[str, Any] = {"line": lineno}
        label = obj.get("human_label")
        if label is not None:
            if isinstance(label, bool) or not isinstance(label, int):
                bad(lineno, "human_label", f"expected an integer score, got {label!r}")
                continue
            meta["human_label"] = label
        records.append(_record("lcsts", split, f"{lineno:07d}", text, summary, **meta))
    return records


def parse_lcsts(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Records of one LCSTS split.

    ``path`` is either file of a parallel pair ``<split>.src.txt`` / ``<split>.tgt.txt`` (or
    their common prefix ``<split>``): line *i* of the ``.src`` file (the Weibo text) pairs with
    line *i* of the ``.tgt`` file (its summary), and both files are read. Files of different
    lengths are an :class:`~fedrepro.io.InputError` naming both, even with ``skip_malformed``.
    A ``.jsonl`` file holds ``{"text", "summary"[, "human_label"]}`` lines (the hub copy).
    Ids are ``lcsts-<split>-<line>``.
    """
    path = Path(path)
    bad = _Malformed(path, skip_malformed)
    if path.suffix.lower() in (".jsonl", ".json"):
        return Records(_parse_lcsts_jsonl(path, bad), bad.skipped)
    src, tgt, prefix = _lcsts_pair(path)
    split = _split_from_name(path, prefix)
    n_src, n_tgt = _count_lines(src), _count_lines(tgt)
    if n_src != n_tgt:
        raise InputError(
            f"LCSTS parallel files differ in length: {src} has {n_src} lines but {tgt} has "
            f"{n_tgt}; line i of the .src file must pair with line i of the .tgt file"
        )
    bad_src, bad_tgt = _Malformed(src, skip_malformed), _Malformed(tgt, skip_malformed)
    records: list[dict] = []
    for (lineno, text), (_, summary) in zip(_iter_lines(src), _iter_lines(tgt), strict=True):
        text_s = _text({"text": text}, "text", bad_src, lineno)
        if text_s is None:
            continue
        summary_s = _text({"summary": summary}, "summary", bad_tgt, lineno)
        if summary_s is not None:
            records.append(_record("lcsts", split, f"{lineno:07d}", text_s, summary_s, line=lineno))
    skipped = sorted(bad_src.skipped + bad_tgt.skipped, key=lambda s: int(s[0]))
    return Records(records, skipped)


def thucnews_split(category: str, stem: str) -> str:
    """The fixed split of THUCNews document ``<category>/<stem>.txt``: 90 % train, 5 % val, 5 % test.

    THUCNews has no official split. The bucket is ``int(sha1("<category>/<stem>")[:8], 16) % 100``
    (train < 90 <= val < 95 <= test), so it is the same whichever files are parsed, on any machine.
    """
    bucket = int(hashlib.sha1(f"{category}/{stem}".encode()).hexdigest()[:8], 16) % 100
    return "train" if bucket < 90 else "val" if bucket < 95 else "test"


def _thucnews_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"{path}: not found; expected a THUCNews folder or one <n>.txt document")
    if (path / "THUCNews").is_dir():
        path = path / "THUCNews"
    direct = [p for p in path.glob("*.txt") if p.is_file()]
    files = direct or [p for p in path.glob("*/*.txt") if p.is_file()]
    if not files:
        raise InputError(
            f"{path}: no THUCNews documents; expected THUCNews/<category>/<n>.txt (the unpacked "
            f"THUCNews.zip) — check the config key `{_config_key('thucnews')}`"
        )

    def order(p: Path) -> tuple[str, int, str]:
        return (p.parent.name, int(p.stem) if p.stem.isdigit() else -1, p.stem)

    return sorted(files, key=order)


def _thucnews_document(path: Path, bad: _Malformed) -> dict | None:
    category = path.parent.name
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        try:
            text = raw.decode("gb18030")
        except UnicodeDecodeError:
            bad(1, "<encoding>", "neither UTF-8 nor GB18030 text")
            return None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    title = lines[0].strip() if lines else ""
    if not title:
        bad(1, "title", "empty (line 1 of a THUCNews document is its title)")
        return None
    paragraphs = [line.strip() for line in lines[1:] if line.strip()]
    if not paragraphs:
        bad(2, "content", "empty (no text after the title line)")
        return None
    body = "\n".join(paragraphs)
    slug = THUCNEWS_CATEGORIES.get(category, category)
    split = thucnews_split(category, path.stem)
    return _record(
        "thucnews",
        split,
        f"{slug}-{path.stem}",
        body,
        title,
        category=category,
        file=f"{category}/{path.name}",
        paragraphs=len(paragraphs),
    )


def parse_thucnews(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Records of THUCNews: input = news body, target = news title.

    ``path`` is the unpacked release (a folder holding ``THUCNews/`` or the ``THUCNews`` folder
    itself, with one sub-folder per category), one category folder, or one ``<n>.txt`` document.
    A document is line 1 = title, then the body (paragraphs indented with U+3000, kept as
    newline-separated stripped paragraphs). The split comes from :func:`thucnews_split`; ids are
    ``thucnews-<split>-<category slug>-<n>``; ``meta.category`` is the Chinese category name.
    """
    records: list[dict] = []
    skipped: list[tuple[str, str]] = []
    for doc in _thucnews_files(Path(path)):
        bad = _Malformed(doc, skip_malformed)
        rec = _thucnews_document(doc, bad)
        if rec is not None:
            records.append(rec)
        skipped.extend((f"{doc.parent.name}/{doc.name}:{loc}", why) for loc, why in bad.skipped)
    return Records(records, skipped)


def parse_education(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Records of one EDUCATION split file ``<split>.jsonl`` (the local-copy format).

    Each line is ``{"id": <string or integer>, "content": <text>, "summary": <summary>}``; ids must
    be unique within the file. Record ids are ``education-<split>-<id>``.
    """
    path = Path(path)
    split = _split_from_name(path, path.name.split(".")[0])
    bad = _Malformed(path, skip_malformed)
    seen: dict[str, int] = {}
    records: list[dict] = []
    for lineno, obj in _iter_json_lines(path, bad):
        raw_id = obj.get("id")
        if raw_id is None:
            bad(lineno, "id", "missing")
            continue
        if (
            isinstance(raw_id, bool)
            or not isinstance(raw_id, (str, int))
            or not str(raw_id).strip()
        ):
            bad(lineno, "id", f"expected a non-empty string or an integer, got {raw_id!r}")
            continue
        doc_id = str(raw_id).strip()
        if doc_id in seen:
            bad(lineno, "id", f"duplicate id {doc_id!r} (first on line {seen[doc_id]})")
            continue
        content = _text(obj, "content", bad, lineno)
        summary = content and _text(obj, "summary", bad, lineno)
        if not (content and summary):
            continue
        seen[doc_id] = lineno
        records.append(_record("education", split, doc_id, content, summary, line=lineno))
    return Records(records, bad.skipped)


# == sample generators ===========================================================================
# Each generator writes a small copy in the source's *raw* layout (so the real parser reads it)
# from a seeded ``random.Random`` per file: the same arguments give byte-identical files. Texts are
# built from templates whose target is composed of phrases stated in the input (a summarizer can
# learn the mapping; copying the first sentence is not enough).
Pair = tuple[str, str]


def _rng(name: str, split: str, seed: int) -> random.Random:
    return random.Random(f"fedrepro.chinese/{name}/{split}/{seed}")


def _pick(rng: random.Random, items: Sequence[Any]) -> Any:
    return items[rng.randrange(len(items))]


_HALF_WIDTH = str.maketrans(
    {"，": ",", "。": ".", "；": ";", "：": ":", "（": "(", "）": ")", "＜": "<"}
)


def _month_day(rng: random.Random) -> tuple[int, int]:
    return rng.randint(1, 12), rng.randint(1, 28)


# -- CSL: scientific abstract -> paper title ----------------------------------------------------
_CSL_ENG = {
    "obj": (
        "永磁同步电机",
        "锂离子电池",
        "配电网",
        "无线传感器网络",
        "风力发电机组",
        "数控机床主轴",
        "光伏并网逆变器",
        "城市轨道交通车辆",
    ),
    "method": (
        "改进粒子群算法",
        "卷积神经网络",
        "模糊PID控制",
        "滑模变结构控制",
        "小波包分解",
        "长短期记忆网络",
        "自适应遗传算法",
        "扩展卡尔曼滤波",
    ),
    "task": ("故障诊断", "参数辨识", "状态估计", "优化调度", "振动抑制", "剩余寿命预测"),
    "problem": ("精度低、收敛速度慢", "实时性差", "鲁棒性不足", "计算量大、易陷入局部最优"),
    "step": (
        "建立了{obj}的数学模型",
        "分析了影响{obj}{task}的主要因素",
        "采集了{obj}运行过程中的振动与电流信号",
    ),
    "step2": ("对模型参数进行寻优", "提取特征并建立{task}模型", "实现关键参数的在线更新"),
    "valid": ("仿真实验", "现场试验", "MATLAB/Simulink仿真和样机实验"),
    "result": (
        "具有更高的准确率和更快的收敛速度",
        "有效降低了计算复杂度",
        "具有较好的鲁棒性和工程应用价值",
    ),
}
_CSL_MED = {
    "drug": ("补肾活血汤", "丹参注射液", "阿托伐他汀", "黄芪颗粒", "针刺联合艾灸", "益气活血方"),
    "disease": (
        "老年高血压",
        "2型糖尿病",
        "慢性心力衰竭",
        "急性脑梗死",
        "慢性阻塞性肺疾病",
        "膝骨关节炎",
    ),
    "outcome": ("血管内皮功能", "炎症因子水平", "血脂水平", "生活质量", "中医证候积分"),
}
_CSL_AGRI = {
    "crop": {
        "水稻": "龙粳31",
        "玉米": "郑单958",
        "冬小麦": "扬麦16",
        "马铃薯": "费乌瑞它",
        "大豆": "中黄13",
        "棉花": "鲁棉研28",
    },
    "treat": (
        ("氮肥施用量", "施氮量180 kg/hm2"),
        ("种植密度", "密度6.0万株/hm2"),
        ("灌溉定额", "灌水量2400 m3/hm2"),
        ("有机肥替代比例", "有机肥替代30%化肥"),
        ("播期", "10月15日播种"),
    ),
    "trait": ("产量及品质", "光合特性", "干物质积累", "根系形态", "氮素利用效率"),
    "region": ("黄淮海地区", "东北地区", "长江中下游地区", "西北旱作区"),
}
_CSL_ECON = {
    "subj": ("数字普惠金融", "环境规制", "产业集聚", "人口老龄化", "营商环境优化", "农村电子商务"),
    "effect": ("居民消费", "企业技术创新", "城乡收入差距", "绿色全要素生产率", "农民增收"),
    "data": (
        ("2011—2020年中国30个省份的面板数据", "省级面板数据"),
        ("2010—2019年A股上市公司数据", "上市公司数据"),
        ("中国家庭金融调查（CHFS）数据", "CHFS数据"),
    ),
    "model": ("双向固定效应模型", "中介效应模型", "空间杜宾模型", "双重差分法"),
    "channel": ("缓解融资约束", "促进人力资本积累", "推动产业结构升级", "降低交易成本"),
    "group": ("中西部地区", "东部地区", "非国有企业", "农村家庭"),
    "policy": ("进一步完善相关政策", "推动经济高质量发展", "优化区域协调发展政策"),
}


def _csl_engineering(rng: random.Random) -> Pair:
    v = {
        k: _pick(rng, _CSL_ENG[k]) for k in ("obj", "method", "task", "problem", "valid", "result")
    }
    step = _pick(rng, _CSL_ENG["step"]).format(**v)
    step2 = _pick(rng, _CSL_ENG["step2"]).format(**v)
    abstract = (
        f"针对{v['obj']}{v['task']}中存在的{v['problem']}等问题，提出了一种基于{v['method']}的"
        f"{v['obj']}{v['task']}方法。首先，{step}；然后，利用{v['method']}{step2}；最后，通过"
        f"{v['valid']}对所提方法进行了验证。结果表明，与传统方法相比，该方法{v['result']}，"
        f"{v['task']}误差降低了{rng.randint(8, 46)}.{rng.randint(0, 9)}%。"
    )
    suffix = _pick(rng, ("方法", "研究", "方法研究"))
    return abstract, f"基于{v['method']}的{v['obj']}{v['task']}{suffix}"


def _csl_medicine(rng: random.Random) -> Pair:
    drug, disease, outcome = (_pick(rng, _CSL_MED[k]) for k in ("drug", "disease", "outcome"))
    n = 2 * rng.randint(30, 60)
    e1 = rng.randint(86, 96)
    abstract = (
        f"目的 观察{drug}治疗{disease}的临床疗效及对患者{outcome}的影响。方法 将{n}例{disease}患者"
        f"按随机数字表法分为对照组和治疗组，各{n // 2}例。对照组给予常规西医治疗，治疗组在对照组"
        f"基础上加用{drug}，疗程{rng.choice((4, 8, 12))}周。比较两组治疗前后{outcome}的变化。"
        f"结果 治疗组总有效率为{e1}.{rng.randint(0, 9)}%，高于对照组的{e1 - rng.randint(10, 20)}."
        f"{rng.randint(0, 9)}%；治疗后治疗组{outcome}改善程度优于对照组，差异有统计学意义"
        f"（P＜0.05）。结论 {drug}治疗{disease}疗效确切，能够改善患者{outcome}。"
    )
    title = _pick(rng, (f"{drug}治疗{disease}的临床观察", f"{drug}对{disease}患者{outcome}的影响"))
    return abstract, title


def _csl_agriculture(rng: random.Random) -> Pair:
    crop = _pick(rng, sorted(_CSL_AGRI["crop"]))
    treat, level = _pick(rng, _CSL_AGRI["treat"])
    trait, region = _pick(rng, _CSL_AGRI["trait"]), _pick(rng, _CSL_AGRI["region"])
    y1 = rng.randint(2012, 2019)
    abstract = (
        f"为明确不同{treat}对{crop}{trait}的影响，以{crop}品种{_CSL_AGRI['crop'][crop]}为材料，于"
        f"{y1}—{y1 + 1}年在{region}开展田间试验，设置{rng.randint(4, 6)}个{treat}处理，研究了各处理下"
        f"{crop}{trait}的变化规律。结果表明：随{treat}的增加，{crop}{trait}各指标呈先升高后降低的趋势，"
        f"以{level}处理表现最优，产量较对照提高{rng.randint(6, 25)}.{rng.randint(0, 9)}%。综合考虑，"
        f"{level}为{region}{crop}生产中适宜的{treat}。"
    )
    title = _pick(
        rng, (f"不同{treat}对{crop}{trait}的影响", f"{treat}对{region}{crop}{trait}的影响")
    )
    return abstract, title


def _csl_economics(rng: random.Random) -> Pair:
    v = {
        k: _pick(rng, _CSL_ECON[k])
        for k in ("subj", "effect", "model", "channel", "group", "policy")
    }
    data, data_short = _pick(rng, _CSL_ECON["data"])
    verb = _pick(rng, ("促进", "抑制"))
    abstract = (
        f"本文利用{data}，采用{v['model']}实证检验了{v['subj']}对{v['effect']}的影响及其作用机制。"
        f"研究发现：{v['subj']}显著{verb}了{v['effect']}，在经过一系列稳健性检验后该结论依然成立；"
        f"异质性分析表明，这一影响在{v['group']}更为明显；机制检验显示，{v['subj']}主要通过"
        f"{v['channel']}作用于{v['effect']}。本文为{v['policy']}提供了经验证据。"
    )
    title = _pick(
        rng,
        (
            f"{v['subj']}对{v['effect']}的影响研究",
            f"{v['subj']}与{v['effect']}——基于{data_short}的实证分析",
        ),
    )
    return abstract, title


_CSL_FAMILIES: tuple[Callable[[random.Random], Pair], ...] = (
    _csl_engineering,
    _csl_medicine,
    _csl_agriculture,
    _csl_economics,
)
CSL_SAMPLE_SIZES: dict[str, int] = {"train.tsv": 40, "dev.tsv": 20, "test.tsv": 20}


def write_csl_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``train.tsv``/``dev.tsv``/``test.tsv`` in CSL's raw ``to title \\t abstract \\t title``
    layout (engineering, medicine, agriculture and economics abstracts; mixed full- and half-width
    punctuation as in the real files). Returns ``{file name: rows}``."""
    out_dir = Path(out_dir)
    for filename, n in CSL_SAMPLE_SIZES.items():
        rng = _rng("csl", filename, seed)
        lines = []
        for _ in range(n):
            abstract, title = _pick(rng, _CSL_FAMILIES)(rng)
            if rng.random() < 0.6:  # most CSL abstracts use half-width punctuation
                abstract = abstract.translate(_HALF_WIDTH)
            lines.append(f"{CSL_PROMPT}\t{abstract}\t{title}\n")
        write_text_atomic(out_dir / filename, "".join(lines))
    return dict(CSL_SAMPLE_SIZES)


# -- LCSTS: Weibo post -> headline ---------------------------------------------------------------
_LCSTS_CITIES = ("北京", "上海", "广州", "深圳", "杭州", "成都", "武汉", "南京", "西安", "重庆")
_LCSTS_COMPANIES = ("小米", "华为", "阿里巴巴", "腾讯", "京东", "百度", "联想", "格力电器")


def _lcsts_rrr(rng: random.Random) -> Pair:
    m, d = _month_day(rng)
    cut = _pick(rng, ("0.5", "0.25", "1"))
    amount = rng.randint(5, 15) * 1000
    text = (
        f"中国人民银行{m}月{d}日宣布，决定自{m}月{d + 1}日起下调金融机构存款准备金率{cut}个百分点，"
        f"此次降准共计释放长期资金约{amount}亿元。分析人士认为，此举有助于缓解"
        f"{_pick(rng, ('小微企业', '实体经济', '民营企业'))}融资难题，稳定市场预期。"
    )
    return text, f"央行宣布降准{cut}个百分点 释放资金约{amount}亿元"


def _lcsts_house(rng: random.Random) -> Pair:
    city, m = _pick(rng, _LCSTS_CITIES), rng.randint(1, 12)
    verb = _pick(rng, ("上涨", "下降"))
    p, q = f"{rng.randint(1, 9)}.{rng.randint(0, 9)}", f"{rng.randint(2, 15)}.{rng.randint(0, 9)}"
    text = (
        f"国家统计局今日发布{m}月70个大中城市住宅销售价格统计数据。数据显示，{city}新建商品住宅价格"
        f"环比{verb}{p}%，同比{verb}{q}%，涨跌幅均居一线城市前列。业内人士表示，"
        f"{_pick(rng, ('调控政策效果正在逐步显现', '市场观望情绪依然较浓', '刚需入市节奏有所加快'))}。"
    )
    return text, f"{m}月{city}新房价格环比{verb}{p}%"


def _lcsts_earnings(rng: random.Random) -> Pair:
    company = _pick(rng, _LCSTS_COMPANIES)
    period = _pick(rng, ("一季度", "上半年", "前三季度", "全年"))
    profit, growth = rng.randint(20, 400), rng.randint(5, 80)
    text = (
        f"{company}昨晚发布财报，{period}实现营业收入{rng.randint(300, 3000)}亿元，同比增长"
        f"{rng.randint(3, 40)}%；净利润{profit}亿元，同比增长{growth}%。{company}表示，业绩增长主要"
        f"得益于{_pick(rng, ('海外市场的快速扩张', '高端产品销量提升', '成本控制成效显著'))}。"
    )
    return text, f"{company}{period}净利润{profit}亿 同比增长{growth}%"


def _lcsts_weather(rng: random.Random) -> Pair:
    city = _pick(rng, _LCSTS_CITIES)
    weather = _pick(rng, ("特大暴雨", "强降雪", "大范围雾霾", "强台风"))
    flights = rng.randint(80, 600)
    text = (
        f"受{weather}影响，{city}今日全市{rng.randint(20, 90)}个路段出现积水或拥堵，机场已有{flights}"
        f"个航班延误或取消。气象部门预计，未来{rng.randint(2, 4)}天{city}仍将出现"
        f"{_pick(rng, ('持续降水', '大风降温', '低能见度天气'))}，提醒市民尽量减少外出。"
    )
    return text, f"{city}遭遇{weather} {flights}个航班延误或取消"


def _lcsts_product(rng: random.Random) -> Pair:
    company = _pick(rng, _LCSTS_COMPANIES[:3] + ("魅族", "vivo", "OPPO"))
    product = _pick(rng, ("旗舰手机", "平板电脑", "智能手表", "笔记本电脑"))
    price = rng.randint(9, 59) * 100 - 1
    text = (
        f"{company}今天下午在{_pick(rng, _LCSTS_CITIES)}发布新款{product}，搭载"
        f"{_pick(rng, ('自研芯片', '2K高刷屏幕', '超长续航电池'))}，售价{price}元起。{company}相关负责人"
        f"表示，新品将于下周正式开售，首批备货量超过{rng.randint(10, 90)}万台。"
    )
    return text, f"{company}发布新款{product} 售价{price}元起"


def _lcsts_health(rng: random.Random) -> Pair:
    habit = _pick(rng, ("喝咖啡", "步行30分钟", "吃坚果", "熬夜", "久坐"))
    disease = _pick(rng, ("心脏病", "糖尿病", "抑郁症", "肝癌"))
    verb = "增加" if habit in ("熬夜", "久坐") else "降低"
    p = rng.randint(12, 45)
    text = (
        f"{_pick(rng, ('美国', '英国', '日本', '瑞典'))}一项最新研究发现，每天{habit}的人患{disease}的风险比"
        f"普通人{verb}{p}%。研究人员对{rng.randint(2, 9)}万名志愿者进行了为期{rng.randint(5, 20)}年的"
        f"跟踪调查，结果发表在最新一期医学期刊上。"
    )
    return text, f"研究称每天{habit}患{disease}风险{verb}{p}%"


def _lcsts_jobs(rng: random.Random) -> Pair:
    year = rng.randint(2014, 2016)
    n = rng.randint(700, 780)
    industry = _pick(rng, ("互联网", "金融", "教育培训", "房地产"))
    text = (
        f"教育部日前发布数据，{year}届全国高校毕业生人数将达到{n}万人，再创历史新高。调查显示，"
        f"{industry}行业对毕业生的需求最为旺盛，平均起薪约为{rng.randint(35, 80)}00元，专家建议毕业生"
        f"调整就业预期，积极到基层就业。"
    )
    return text, f"{year}届高校毕业生达{n}万人 再创新高"


_LCSTS_FAMILIES: tuple[Callable[[random.Random], Pair], ...] = (
    _lcsts_rrr,
    _lcsts_house,
    _lcsts_earnings,
    _lcsts_weather,
    _lcsts_product,
    _lcsts_health,
    _lcsts_jobs,
)
LCSTS_SAMPLE_SIZES: dict[str, int] = {"train": 40, "val": 20, "test": 20}


def write_lcsts_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``<split>.src.txt`` (Weibo-style posts, ~100 characters) and ``<split>.tgt.txt``
    (headline summaries) for train/val/test, one pair per line. Returns ``{split: pairs}``."""
    out_dir = Path(out_dir)
    for split, n in LCSTS_SAMPLE_SIZES.items():
        rng = _rng("lcsts", split, seed)
        pairs = [_pick(rng, _LCSTS_FAMILIES)(rng) for _ in range(n)]
        write_text_atomic(out_dir / f"{split}.src.txt", "".join(f"{t}\n" for t, _ in pairs))
        write_text_atomic(out_dir / f"{split}.tgt.txt", "".join(f"{s}\n" for _, s in pairs))
    return dict(LCSTS_SAMPLE_SIZES)


# -- NLPCC 2017: Toutiao news article -> summary ---------------------------------------------------
_NLPCC_MEDIA = ("四海网讯", "中新网", "澎湃新闻", "新京报讯", "央视新闻", "华西都市报讯")
_NLPCC_PLACES = ("河南郑州", "四川成都", "湖南长沙", "江苏苏州", "广东东莞", "浙江温州", "山东济南")
P = "<Paragraph>"


_NLPCC_BACKGROUND = (
    (
        "记者注意到,这已是今年以来当地发生的第{n}起同类事件,相关话题在社交媒体上引发大量讨论,"
        "不少网友呼吁有关部门进一步完善管理制度,加强日常监督检查。"
    ),
    (
        "据了解,相关部门近年来持续开展专项整治行动,累计排查各类隐患{n}00余处,"
        "但仍有部分问题尚未得到根本解决。"
    ),
    (
        "对此,有专家表示,应当从制度层面入手,明确各方责任,同时加强宣传引导,"
        "提高公众的参与意识,形成长效机制。本报将持续关注后续进展。"
    ),
)


def _nlpcc_background(rng: random.Random) -> str:
    return _pick(rng, _NLPCC_BACKGROUND).format(n=rng.randint(2, 9))


def _nlpcc_accident(rng: random.Random) -> Pair:
    m, d = _month_day(rng)
    place = _pick(rng, _NLPCC_PLACES)
    spot = _pick(rng, ("一化工厂", "一居民楼", "高速公路收费站附近", "一建筑工地"))
    kind = _pick(rng, ("火灾", "爆炸事故", "坍塌事故", "多车追尾事故"))
    dead, hurt = rng.randint(1, 9), rng.randint(2, 30)
    article = (
        f"{_pick(rng, _NLPCC_MEDIA)},{m}月{d}日{rng.randint(1, 23)}时许,{place}{spot}发生{kind},"
        f"事故已造成{dead}人死亡、{hurt}人受伤。{P}据现场目击者介绍,事发时现场传出巨大声响,"
        f"随后冒出浓烟,附近居民纷纷撤离。{P}事故发生后,当地消防、公安、医疗等部门迅速赶到现场"
        f"开展救援,伤者已被送往附近医院救治,其中{rng.randint(1, hurt)}人伤势较重。{P}"
        f"当地政府已成立事故调查组,目前事故原因正在进一步调查中。"
    )
    summary = (
        f"{m}月{d}日,{place}{spot}发生{kind},造成{dead}人死亡{hurt}人受伤,事故原因正在调查中。"
    )
    return article, summary


def _nlpcc_economy(rng: random.Random) -> Pair:
    region = _pick(rng, ("全国", "广东省", "浙江省", "江苏省"))
    indicator = _pick(
        rng, ("社会消费品零售总额", "规模以上工业增加值", "固定资产投资", "外贸进出口总额")
    )
    period = _pick(rng, ("一季度", "上半年", "前三季度", "1至5月"))
    g = f"{rng.randint(3, 15)}.{rng.randint(0, 9)}"
    trend = _pick(rng, ("增速比上年同期加快", "增速比上年同期有所回落", "继续保持平稳增长"))
    article = (
        f"{_pick(rng, _NLPCC_MEDIA)},记者从{region}统计部门获悉,{period}{region}{indicator}达到"
        f"{rng.randint(2, 90)}.{rng.randint(0, 9)}万亿元,同比增长{g}%,{trend}。{P}统计部门负责人介绍,"
        f"{period}以来,{_pick(rng, ('消费市场逐步回暖', '新兴产业保持较快增长', '重点项目建设加快推进'))},"
        f"为经济平稳运行提供了有力支撑。{P}专家分析认为,下一阶段仍需{_pick(rng, ('扩大有效需求', '稳定市场预期', '加大政策支持力度'))},"
        f"推动经济持续健康发展。"
    )
    summary = f"{period}{region}{indicator}同比增长{g}%,{trend}。"
    return article, summary


def _nlpcc_sports(rng: random.Random) -> Pair:
    teams = ("广州恒大", "上海上港", "北京国安", "山东鲁能", "江苏苏宁", "天津权健")
    a, b = rng.sample(teams, 2)
    s1 = rng.randint(2, 5)
    s2 = rng.randint(0, s1 - 1)
    star = _pick(rng, ("郜林", "武磊", "于大宝", "张稀哲", "杨旭", "王永珀"))
    rnd = rng.randint(3, 28)
    article = (
        f"{_pick(rng, _NLPCC_MEDIA)},北京时间昨晚,中超联赛第{rnd}轮展开角逐,{a}主场迎战{b}。{P}"
        f"上半场第{rng.randint(5, 40)}分钟,{star}接队友传中头球破门,帮助{a}取得领先。下半场{b}"
        f"一度扳平比分,但{star}随后再入一球。{P}最终{a}以{s1}比{s2}战胜{b},{star}梅开二度,"
        f"{a}积分升至联赛第{rng.randint(1, 5)}位。{P}赛后{a}主帅表示,球队的表现令人满意。"
    )
    summary = f"中超第{rnd}轮,{a}主场{s1}比{s2}战胜{b},{star}梅开二度。"
    return article, summary


def _nlpcc_policy(rng: random.Random) -> Pair:
    city = _pick(rng, ("杭州", "南京", "郑州", "长沙", "合肥", "昆明"))
    policy, rule = _pick(
        rng,
        (
            ("垃圾分类管理条例", "生活垃圾须按四类分类投放,违者最高罚款200元"),
            ("电动自行车管理办法", "电动自行车须上牌并佩戴头盔"),
            ("养犬管理规定", "市区内禁止饲养大型犬和烈性犬"),
            ("控烟条例", "室内公共场所和工作场所全面禁止吸烟"),
        ),
    )
    m = rng.randint(1, 12)
    article = (
        f"{_pick(rng, _NLPCC_MEDIA)},近日,{city}市正式公布《{city}市{policy}》,自{m}月1日起施行。{P}"
        f"根据规定,{rule}。相关部门将加强日常检查,对违规行为依法处理。{P}市民王女士表示,"
        f"新规出台后{_pick(rng, ('环境会变得更好', '出行更加安全', '生活更有秩序'))},"
        f"希望大家都能自觉遵守。{P}据了解,{city}此前已在部分区域开展试点,效果良好。"
    )
    summary = f"《{city}市{policy}》{m}月1日起施行,{rule}。"
    return article, summary


_NLPCC_FAMILIES: tuple[Callable[[random.Random], Pair], ...] = (
    _nlpcc_accident,
    _nlpcc_economy,
    _nlpcc_sports,
    _nlpcc_policy,
)
NLPCC2017_SAMPLE_SIZES: dict[str, int] = {
    "train_with_summ.txt": 30,
    "evaluation_with_ground_truth.txt": 20,
}


def write_nlpcc2017_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``train_with_summ.txt`` and ``evaluation_with_ground_truth.txt`` in the official JSON
    lines layout ``{"summarization": ..., "article": ...}`` (articles with ``<Paragraph>`` markers).
    Returns ``{file name: pairs}``."""
    out_dir = Path(out_dir)
    for filename, n in NLPCC2017_SAMPLE_SIZES.items():
        rng = _rng("nlpcc2017", filename, seed)
        lines = []
        for _ in range(n):
            article, summary = _pick(rng, _NLPCC_FAMILIES)(rng)
            article = f"{article}{P}{_nlpcc_background(rng)}"
            obj = {"summarization": summary, "article": article}
            lines.append(json.dumps(obj, ensure_ascii=False) + "\n")
        write_text_atomic(out_dir / filename, "".join(lines))
    return dict(NLPCC2017_SAMPLE_SIZES)


# -- THUCNews: Sina news body -> title ----------------------------------------------------------
_IND = "\u3000\u3000"  # THUCNews indents every paragraph with two ideographic spaces


def _thuc_sports(rng: random.Random) -> Pair:
    teams = ("湖人", "火箭", "凯尔特人", "马刺", "热火", "魔术", "小牛", "太阳")
    a, b = rng.sample(teams, 2)
    star = _pick(rng, ("科比", "姚明", "加内特", "邓肯", "韦德", "霍华德", "诺维茨基", "纳什"))
    pts = rng.randint(25, 45)
    s1 = rng.randint(95, 120)
    s2 = s1 - rng.randint(2, 18)
    m, d = _month_day(rng)
    shots = rng.randint(16, 28)
    body = [
        (
            f"新浪体育讯　北京时间{m}月{d}日，NBA常规赛继续进行，{a}主场迎战{b}。凭借{star}的出色发挥，"
            f"{a}最终以{s1}-{s2}战胜{b}。"
        ),
        (
            f"{star}全场出战{rng.randint(34, 44)}分钟，{shots}投{rng.randint(8, shots - 4)}中，"
            f"砍下{pts}分{rng.randint(4, 12)}个篮板，是球队获胜的最大功臣。"
        ),
        (
            f"{b}方面，主力球员手感不佳，全队三分球{rng.randint(15, 25)}投仅{rng.randint(3, 7)}中，"
            f"末节虽一度将分差迫近，但最终未能完成逆转。"
        ),
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{star}{pts}分{a}{s1}-{s2}胜{b}"


def _thuc_finance(rng: random.Random) -> Pair:
    org = _pick(rng, ("央行", "银监会", "财政部", "证监会", "国家发改委"))
    measure = _pick(
        rng,
        (
            "加强地方融资平台贷款管理",
            "规范银行理财产品发行",
            "扩大小额贷款公司试点",
            "严格控制新增房地产贷款",
        ),
    )
    body = [
        f"新浪财经讯　{org}今日发布通知，要求各地{measure}，进一步防范金融风险。",
        (
            f"通知指出，当前{_pick(rng, ('信贷增长偏快', '部分领域风险有所积累', '市场流动性较为充裕'))}，"
            f"各地要按照稳健的原则，切实落实相关监管要求。"
        ),
        (
            f"分析人士认为，{org}此举释放出{_pick(rng, ('收紧', '规范', '审慎'))}信号，"
            f"预计对市场的影响将在未来{rng.randint(2, 6)}个月内逐步显现。"
        ),
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{org}要求各地{measure}"


def _thuc_tech(rng: random.Random) -> Pair:
    company = _pick(rng, ("诺基亚", "摩托罗拉", "联想", "中兴", "索尼爱立信", "三星"))
    product = _pick(rng, ("3G手机", "上网本", "智能手机", "触屏手机"))
    price = rng.randint(12, 49) * 100 - 1
    body = [
        (
            f"新浪科技讯　{rng.randint(1, 12)}月{rng.randint(1, 28)}日消息，{company}今天在北京发布了"
            f"一款{product}，该产品售价{price}元，将于本月底正式上市。"
        ),
        (
            f"据介绍，这款{product}采用{rng.randint(3, 4)}.{rng.randint(0, 9)}英寸触摸屏，内置"
            f"{rng.randint(3, 8)}00万像素摄像头，支持{_pick(rng, ('WiFi', 'GPS导航', '手机电视'))}功能。"
        ),
        f"业内人士分析，{company}希望借此款产品进一步提升在国内{product}市场的份额。",
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{company}发布{product} 售价{price}元"


def _thuc_education(rng: random.Random) -> Pair:
    prov = _pick(rng, ("北京", "江苏", "广东", "山东", "湖北", "四川"))
    year = rng.randint(2008, 2011)
    exam = _pick(rng, ("高考", "中考", "研究生入学考试"))
    what = _pick(rng, ("分数线公布", "志愿填报启动", "成绩开始查询", "报名工作启动"))
    body = [
        (
            f"新浪教育讯　记者从{prov}省教育考试院获悉，{year}年{prov}{exam}{what}，"
            f"考生可通过考试院网站或声讯电话办理相关事宜。"
        ),
        (
            f"考试院提醒，今年共有{rng.randint(20, 90)}万名考生参加{exam}，考生务必在规定时间内完成操作，"
            f"逾期将不再受理。"
        ),
        f"有关负责人表示，今年{prov}将继续加强考试安全管理，确保考试公平公正。",
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{year}年{prov}{exam}{what}"


def _thuc_entertainment(rng: random.Random) -> Pair:
    star = _pick(rng, ("周杰伦", "刘德华", "章子怡", "周迅", "王菲", "成龙"))
    work = _pick(rng, ("新专辑", "新片", "演唱会", "新剧"))
    city = _pick(rng, ("北京", "上海", "香港", "台北"))
    body = [
        f"新浪娱乐讯　{star}昨日现身{city}，为{work}宣传造势，现场吸引了数百名粉丝和媒体。",
        (
            f"谈及{work}，{star}表示自己投入了很多心血，"
            f"{_pick(rng, ('希望大家喜欢', '这次有不少新尝试', '拍摄过程非常辛苦'))}。"
        ),
        f"据悉，{star}的{work}将于{rng.randint(1, 12)}月正式与观众见面。",
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{star}现身{city}为{work}造势"


def _thuc_realestate(rng: random.Random) -> Pair:
    city = _pick(rng, ("北京", "上海", "深圳", "杭州", "天津"))
    m = rng.randint(1, 12)
    verb = _pick(rng, ("上涨", "下跌"))
    p = f"{rng.randint(1, 19)}.{rng.randint(0, 9)}"
    body = [
        (
            f"新浪房产讯　据{city}市房地产交易管理网统计，{m}月{city}新建商品住宅成交"
            f"{rng.randint(5, 20)}000余套，成交均价环比{verb}{p}%。"
        ),
        (
            f"业内人士认为，{_pick(rng, ('调控政策持续发力', '开发商加大推盘力度', '年底购房需求集中释放'))}"
            f"是成交变化的主要原因。"
        ),
        f"专家预计，未来一段时间{city}楼市仍将以平稳为主。",
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{m}月{city}新房成交均价环比{verb}{p}%"


_THUC_FAMILIES: dict[str, Callable[[random.Random], Pair]] = {
    "体育": _thuc_sports,
    "财经": _thuc_finance,
    "科技": _thuc_tech,
    "教育": _thuc_education,
    "娱乐": _thuc_entertainment,
    "房产": _thuc_realestate,
}
# first file number of each category, as in the release (numbers run on across categories)
_THUC_BASE = {
    "体育": 0,
    "娱乐": 131604,
    "房产": 264410,
    "教育": 284454,
    "科技": 481650,
    "财经": 798977,
}
THUCNEWS_SAMPLE_SIZES: dict[str, int] = {"train": 30, "val": 20, "test": 20}


def write_thucnews_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``THUCNews/<类别>/<n>.txt`` documents (title line, then U+3000-indented paragraphs) for
    six categories, choosing file numbers so that :func:`thucnews_split` gives
    :data:`THUCNEWS_SAMPLE_SIZES` documents per split. Returns ``{split: documents}``."""
    out_dir = Path(out_dir)
    rng = _rng("thucnews", "all", seed)
    want = dict(THUCNEWS_SAMPLE_SIZES)
    categories = list(_THUC_FAMILIES)
    used: set[tuple[str, int]] = set()
    i = 0
    while any(want.values()):
        category = categories[i % len(categories)]
        number = _THUC_BASE[category] + rng.randrange(20000)
        split = thucnews_split(category, str(number))
        if want[split] == 0 or (category, number) in used:
            continue
        used.add((category, number))
        want[split] -= 1
        i += 1
        body, title = _THUC_FAMILIES[category](rng)
        write_text_atomic(out_dir / "THUCNews" / category / f"{number}.txt", f"{title}\n{body}\n")
    return dict(THUCNEWS_SAMPLE_SIZES)


# -- EDUCATION: education-industry short text -> summary (documented local format) --------------
def _edu_policy(rng: random.Random) -> Pair:
    org = _pick(rng, ("教育部", "北京市教委", "上海市教委", "广东省教育厅", "浙江省教育厅"))
    doc, goal = _pick(
        rng,
        (
            ("关于进一步减轻义务教育阶段学生作业负担的通知", "小学一二年级不布置书面家庭作业"),
            ("校外培训机构管理办法", "培训机构不得占用国家法定节假日组织学科类培训"),
            ("中小学教师减负清单", "严格控制面向教师的各类检查评比"),
            ("职业教育提质培优行动计划", "到2023年建设一批高水平职业院校"),
        ),
    )
    text = (
        f"近日，{org}印发《{doc}》，明确提出{goal}。文件要求各地各校"
        f"{_pick(rng, ('加强统筹管理', '建立监测机制', '落实主体责任'))}，"
        f"并将落实情况纳入年度督导评估。业内人士认为，这将对{_pick(rng, ('中小学生', '家长', '培训行业'))}产生深远影响。"
    )
    return text, f"{org}印发{doc.removeprefix('关于')}：{goal}"


def _edu_exam(rng: random.Random) -> Pair:
    exam = _pick(rng, ("考研", "教师资格证考试", "英语四六级考试", "公务员考试"))
    year = rng.randint(2019, 2022)
    n = rng.randint(100, 480)
    text = (
        f"{year}年{exam}报名人数公布，全国共有{n}万人报考，比上年增加{rng.randint(5, 60)}万人，"
        f"再创历史新高。分析人士指出，{_pick(rng, ('就业压力加大', '学历提升需求旺盛', '政策利好持续释放'))}"
        f"是报考人数增长的主要原因，预计竞争将更加激烈，建议考生尽早规划备考。"
    )
    return text, f"{year}年{exam}报名人数达{n}万 再创新高"


def _edu_company(rng: random.Random) -> Pair:
    company = _pick(rng, ("新东方", "好未来", "中公教育", "猿辅导", "作业帮", "网易有道"))
    action, short = _pick(
        rng,
        (
            ("完成新一轮融资，金额达{x}亿元", "完成{x}亿元融资"),
            ("发布财报，季度营收同比增长{x}%", "季度营收同比增长{x}%"),
            ("宣布进军职业教育赛道，计划投入{x}亿元", "投入{x}亿元进军职业教育"),
        ),
    )
    x = rng.randint(3, 40)
    text = (
        f"{company}日前{action.format(x=x)}。公司相关负责人表示，未来将重点布局"
        f"{_pick(rng, ('素质教育', '在线直播课程', '智能学习硬件', '成人职业培训'))}，"
        f"持续加大教研投入，为学员提供更优质的学习服务。"
    )
    return text, f"{company}{short.format(x=x)}"


def _edu_school(rng: random.Random) -> Pair:
    city = _pick(rng, ("成都", "武汉", "深圳", "苏州", "青岛", "西安"))
    n = rng.randint(10, 60)
    kind = _pick(rng, ("中小学", "公办幼儿园", "普通高中"))
    seats = rng.randint(2, 9)
    text = (
        f"记者从{city}市教育局获悉，今年{city}将新建、改扩建{kind}{n}所，新增学位{seats}万个，"
        f"以缓解{_pick(rng, ('新城区入学难', '学位供给紧张', '大班额'))}问题。目前相关项目已陆续开工，"
        f"预计将于明年秋季学期前投入使用。"
    )
    return text, f"{city}今年将新建改扩建{kind}{n}所 新增学位{seats}万个"


_EDU_FAMILIES: tuple[Callable[[random.Random], Pair], ...] = (
    _edu_policy,
    _edu_exam,
    _edu_company,
    _edu_school,
)
EDUCATION_SAMPLE_SIZES: dict[str, int] = {"train": 40, "val": 20, "test": 20}


def write_education_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``train.jsonl``/``val.jsonl``/``test.jsonl`` in the local-copy format
    ``{"id", "content", "summary"}`` (education-industry news briefs). Returns ``{split: records}``.
    """
    out_dir = Path(out_dir)
    offset = 0
    for split, n in EDUCATION_SAMPLE_SIZES.items():
        rng = _rng("education", split, seed)
        lines = []
        for k in range(n):
            content, summary = _pick(rng, _EDU_FAMILIES)(rng)
            obj = {"id": f"edu{offset + k:06d}", "content": content, "summary": summary}
            lines.append(json.dumps(obj, ensure_ascii=False) + "\n")
        offset += n
        write_text_atomic(out_dir / f"{split}.jsonl", "".join(lines))
    return dict(EDUCATION_SAMPLE_SIZES)


# == registry ====================================================================================
SAMPLE_WRITERS: dict[str, Callable[..., dict[str, int]]] = {
    "csl": write_csl_samples,
    "nlpcc2017": write_nlpcc2017_samples,
    "lcsts": write_lcsts_samples,
    "thucnews": write_thucnews_samples,
    "education": write_education_samples,
}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedrepro.data.chinese OUT_ROOT [--seed N] [--only NAME ...]``: write the samples
    of the five sources to ``OUT_ROOT/<name>/``."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out_root", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES))
    args = parser.parse_args(argv)
    for name in args.only:
        counts = SAMPLE_WRITERS[name](args.out_root / name, seed=args.seed)
        print(f"{name}: {counts}", file=sys.stderr)
    return 0


def _register() -> None:
    from fedrepro.data import sources

    specs = (
        (
            "csl",
            parse_csl,
            download_csl,
            f"https://github.com/{CSL_REPO} (benchmark/ts) @ {CSL_COMMIT}",
            ("train", "val", "test"),
        ),
        (
            "nlpcc2017",
            parse_nlpcc2017,
            download_nlpcc2017,
            f"hf://datasets/{NLPCC2017_HUB_ID} @ {NLPCC2017_REVISION}",
            ("train", "test"),
        ),
        (
            "lcsts",
            parse_lcsts,
            download_lcsts,
            f"hf://datasets/{LCSTS_HUB_ID} @ {LCSTS_REVISION}",
            ("train", "val", "test"),
        ),
        (
            "thucnews",
            parse_thucnews,
            download_thucnews,
            f"{THUCNEWS_URL} @ unversioned release",
            ("train", "val", "test"),
        ),
        (
            "education",
            parse_education,
            download_education,
            "not public (local copy only, see download_education)",
            ("train", "val", "test"),
        ),
    )
    for name, parse, download, upstream, splits in specs:
        sources.register(
            sources.Source(
                name=name,
                kind="seq2seq",
                parse=parse,
                download=download,
                write_samples=SAMPLE_WRITERS[name],
                config_key=_config_key(name),
                upstream=upstream,
                splits=splits,
                lang="zh",
                whole_folder=name in ("elitr", "thucnews"),
            )
        )


_register()

if __name__ == "__main__":
    sys.exit(main())
