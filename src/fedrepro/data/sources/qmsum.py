"""QMSum: download and parse the three domain clients of AdaFedSelecKD.

AdaFedSelecKD (Feng et al., §II-A) runs federated meeting summarization on QMSum (Zhong et al.,
NAACL 2021) with one client per QMSum domain: **Academic** (ICSI), **Committee** (Welsh / Canadian
parliamentary committees) and **Product** (AMI remote-control design). One training pair is one
*specific* query of a meeting (the general "summarize the whole meeting" queries are not used):
Table II's pair counts (Academic 218/45/49, Committee 284/67/66, Product 593/125/129) are exactly the
specific queries of each split. Following §II-B, the model input is

    <query> #SEP# <speaker>: <turn> <speaker>: <turn> ...

over the turns of the query's ``relevant_text_span`` ranges, with speaker roles ("Project Manager",
"PhD A", ...) kept as ordinary tokens, and the target is the query's answer.

Raw schema (one meeting per JSON line, upstream ``data/<Domain>/jsonl/<split>.jsonl``)::

    {"topic_list": [{"topic", "relevant_text_span"}], "general_query_list": [{"query", "answer"}],
     "specific_query_list": [{"query", "answer", "relevant_text_span": [["start", "end"], ...]}],
     "meeting_transcripts": [{"speaker", "content"}]}

Spans are lists of ``[start, end]`` pairs of decimal strings, inclusive turn indices (upstream
README). Sources, in the order a user would try them: the pinned upstream commit
(:func:`download`), a local copy (config key ``data.qmsum.local_dir``, see :func:`resolve_raw_dir`),
or the project's generated samples (:mod:`fedrepro.data.samples.qmsum`), which use the same raw
schema. The Table II statistics of the parsed pairs are :func:`fedrepro.data.qmsum.table2_stats`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedrepro.data.download import DownloadError, fetch_url
from fedrepro.io import InputError, atomic_dir, iter_jsonl

__all__ = [
    "CONFIG_KEY",
    "DOMAINS",
    "QMSUM_COMMIT",
    "QMSUM_REPO",
    "QMSUM_URL_TEMPLATE",
    "SPLITS",
    "DownloadError",
    "download",
    "iter_meetings",
    "load_pairs",
    "parse_meeting",
    "raw_file",
    "resolve_raw_dir",
]

log = logging.getLogger(__name__)

DOMAINS: tuple[str, ...] = ("Academic", "Committee", "Product")
"""The three QMSum domains = the three AdaFedSelecKD clients (§II-A)."""

SPLITS: tuple[str, ...] = ("train", "val", "test")
"""Split file names as in the QMSum release (Table II calls ``val`` "Valid")."""

QMSUM_REPO = "Yale-LILY/QMSum"
QMSUM_COMMIT = "80a490fd504bce28f7e446fae5cef38f8807c290"
"""The pinned upstream commit of ``Yale-LILY/QMSum`` that :func:`download` fetches (config key
``data.qmsum.commit``). Pinning the commit keeps reruns on identical data."""

QMSUM_URL_TEMPLATE = (
    "https://raw.githubusercontent.com/Yale-LILY/QMSum/{commit}/data/{domain}/jsonl/{split}.jsonl"
)

CONFIG_KEY = "data.qmsum.local_dir"
"""Config key that points the pipeline at a local copy of QMSum instead of downloading it."""

SEP = "#SEP#"
"""The separator token between query and transcript (§II-B)."""


# Raw-copy layouts accepted by resolve_raw_dir, tried in this order.
_LAYOUTS: tuple[str, ...] = (
    "{domain}/{split}.jsonl",  # flat copy (like this project's samples)
    "{domain}/jsonl/{split}.jsonl",  # the upstream data/ folder
    "data/{domain}/jsonl/{split}.jsonl",  # the upstream repository root
)


# -- download --------------------------------------------------------------------------------
def qmsum_url(domain: str, split: str, commit: str = QMSUM_COMMIT) -> str:
    """Raw-file URL of one domain/split jsonl at ``commit`` of the upstream repository."""
    _check_domain_split(domain, split)
    return QMSUM_URL_TEMPLATE.format(commit=commit, domain=domain, split=split)


def download(
    dest_dir: str | os.PathLike, commit: str | None = QMSUM_COMMIT, timeout: float = 10.0
) -> Path:
    """Download the 9 per-domain QMSum jsonl files of the pinned commit into ``dest_dir``.

    Files land in ``dest_dir/<Domain>/<split>.jsonl`` (the flat layout :func:`resolve_raw_dir`
    accepts), each written atomically (streamed into a temporary file in the same folder, then
    renamed), so an interrupted download leaves no partial file.

    Parameters
    ----------
    dest_dir:
        Target folder (created if needed).
    commit:
        Upstream commit; ``None`` means :data:`QMSUM_COMMIT`.
    timeout:
        Seconds for connecting and for each read. Offline, the first file fails within about this
        time.

    Returns
    -------
    Path
        ``dest_dir``.

    Raises
    ------
    DownloadError
        Naming the dataset, the URL and the config key ``data.qmsum.local_dir`` that lets the user
        point at a local copy instead.
    """
    dest_dir = Path(dest_dir)
    commit = commit or QMSUM_COMMIT
    # all nine files land in a temporary sibling folder that becomes dest_dir only when complete
    with atomic_dir(dest_dir) as staging:
        _download_into(staging, commit, timeout)
    return dest_dir


def _download_into(dest_dir: Path, commit: str, timeout: float) -> None:
    for domain in DOMAINS:
        for split in SPLITS:
            url = qmsum_url(domain, split, commit)
            dest = dest_dir / domain / f"{split}.jsonl"
            log.info("downloading %s -> %s", url, dest)
            try:
                fetch_url(
                    url,
                    dest,
                    timeout=timeout,
                    config_key=CONFIG_KEY,
                    dataset=f"QMSum ({QMSUM_REPO}@{commit[:12]})",
                )
            except DownloadError as exc:
                raise DownloadError(
                    f"{exc} In the pipeline config that is `data.qmsum.source: local` plus "
                    f"`{CONFIG_KEY}: /path/to/QMSum` (a folder with <Domain>/<split>.jsonl or the repository's "
                    f"data/ folder), or `data.qmsum.source: samples` for the generated samples."
                ) from exc.__cause__


# -- locating a local copy ---------------------------------------------------------------------
def _check_domain_split(domain: str, split: str) -> None:
    if domain not in DOMAINS:
        raise InputError(f"unknown QMSum domain {domain!r}; expected one of {', '.join(DOMAINS)}")
    if split not in SPLITS:
        raise InputError(f"unknown QMSum split {split!r}; expected one of {', '.join(SPLITS)}")


def raw_file(root: str | os.PathLike, domain: str, split: str) -> Path:
    """The raw jsonl of ``domain``/``split`` under ``root`` in any accepted layout (see :func:`resolve_raw_dir`)."""
    _check_domain_split(domain, split)
    root = Path(root)
    candidates = [root / pattern.format(domain=domain, split=split) for pattern in _LAYOUTS]
    for cand in candidates:
        if cand.is_file():
            return cand
    if not root.is_dir():
        raise InputError(
            f"QMSum folder {root} does not exist; set the config key `{CONFIG_KEY}` to a local copy of "
            f"QMSum (a folder with <Domain>/<split>.jsonl, or the repository's data/ folder or root)"
        )
    raise InputError(
        f"QMSum file for {domain}/{split} not found: expected {candidates[0]} "
        f"(or {candidates[1]}, or {candidates[2]}); check the config key `{CONFIG_KEY}`"
    )


def resolve_raw_dir(local_dir: str | os.PathLike | None) -> dict[tuple[str, str], Path]:
    """Map every (domain, split) to its raw jsonl inside a local copy of QMSum.

    Accepted layouts (per file, first match wins):

    * ``<root>/<Domain>/<split>.jsonl`` — a flat copy, e.g. this project's samples or
      :func:`download`'s output;
    * ``<root>/<Domain>/jsonl/<split>.jsonl`` — the upstream ``data/`` folder;
    * ``<root>/data/<Domain>/jsonl/<split>.jsonl`` — the upstream repository root.

    Raises
    ------
    InputError
        When ``local_dir`` is unset or a file is missing; the message names the expected path and
        the config key ``data.qmsum.local_dir``.
    """
    if local_dir is None or str(local_dir).strip() == "":
        raise InputError(f"no local QMSum copy configured: set the config key `{CONFIG_KEY}`")
    return {(d, s): raw_file(local_dir, d, s) for d in DOMAINS for s in SPLITS}


# -- parsing ---------------------------------------------------------------------------------
def iter_meetings(path: str | os.PathLike) -> Iterator[tuple[int, int, dict]]:
    """Yield ``(lineno, meeting_index, meeting)`` for each JSON line of a raw QMSum file.

    Same rules and messages as :func:`fedrepro.io.read_jsonl` (blank lines skipped; a bad line raises
    :class:`InputError` naming file and line), but keeps the line numbers so that later field errors
    can name them too. ``meeting_index`` counts meetings (0-based) in file order.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found; check the config key `{CONFIG_KEY}`")
    for index, (lineno, obj) in enumerate(iter_jsonl(path, what="a JSON object (one meeting)")):
        yield lineno, index, obj


def _fail(path: Any, lineno: int, field: str, problem: str) -> InputError:
    return InputError(f"{path}:{lineno}: field `{field}`: {problem}")


def _get(obj: dict, key: str, kind: type, path: Any, lineno: int, field: str) -> Any:
    if key not in obj:
        raise _fail(path, lineno, field, "missing")
    value = obj[key]
    if not isinstance(value, kind):
        raise _fail(path, lineno, field, f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def _span_index(value: Any, path: Any, lineno: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _fail(
            path,
            lineno,
            field,
            f'turn index must be an integer (a string like "12"), got {value!r}',
        )
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            raise _fail(
                path, lineno, field, f"turn index must be a non-negative integer, got {value!r}"
            )
        return int(text)
    if value < 0:
        raise _fail(path, lineno, field, f"turn index must be non-negative, got {value}")
    return value


def _spans(obj: dict, n: int, path: Any, lineno: int, field: str) -> list[tuple[int, int]]:
    """``obj["relevant_text_span"]``: a non-empty list of inclusive ``[start, end]`` turn pairs
    with ``0 <= start <= end < n`` (``n`` turns in the meeting)."""
    raw_spans = _get(obj, "relevant_text_span", list, path, lineno, field)
    if not raw_spans:
        raise _fail(path, lineno, field, "empty (no supporting turns)")
    spans: list[tuple[int, int]] = []
    for si, span in enumerate(raw_spans):
        sfield = f"{field}[{si}]"
        if not isinstance(span, (list, tuple)) or len(span) != 2:
            raise _fail(path, lineno, sfield, f"expected a [start, end] pair, got {span!r:.80}")
        start = _span_index(span[0], path, lineno, sfield)
        end = _span_index(span[1], path, lineno, sfield)
        if start > end:
            raise _fail(path, lineno, sfield, f"start {start} is after end {end}")
        if end >= n:
            raise _fail(
                path,
                lineno,
                sfield,
                f"span [{start}, {end}] out of range: the meeting has {n} turns (0..{n - 1})",
            )
        spans.append((start, end))
    return spans


def _objects(obj: dict, key: str, path: Any, lineno: int):
    """``obj[key]`` must be a list of objects: yield ``(field, item)`` for each, in order, failing
    at the first item that is not an object (``field`` is ``key[i]``, for the item's errors)."""
    for i, item in enumerate(_get(obj, key, list, path, lineno, key)):
        field = f"{key}[{i}]"
        if not isinstance(item, dict):
            raise _fail(path, lineno, field, f"expected an object, got {type(item).__name__}")
        yield field, item


def _validate_meeting(
    obj: dict, path: Any, lineno: int
) -> tuple[list[tuple[str, str]], list[dict]]:
    """Check one raw meeting; return its turns and its specific queries with integer spans.

    Spans are checked against the release's *inclusive* semantics: ``0 <= start <= end < n_turns``.
    """
    if not _get(obj, "meeting_transcripts", list, path, lineno, "meeting_transcripts"):
        raise _fail(path, lineno, "meeting_transcripts", "empty")
    turns: list[tuple[str, str]] = []
    for field, turn in _objects(obj, "meeting_transcripts", path, lineno):
        speaker = _get(turn, "speaker", str, path, lineno, f"{field}.speaker")
        content = _get(turn, "content", str, path, lineno, f"{field}.content")
        turns.append((speaker, content))
    n = len(turns)
    # topic_list and general_query_list are not rendered, but a meeting whose topics point outside
    # its transcript (or whose lists are mistyped) is a damaged copy: checked like the queries
    if "topic_list" in obj:
        for field, topic in _objects(obj, "topic_list", path, lineno):
            _get(topic, "topic", str, path, lineno, f"{field}.topic")
            _spans(topic, n, path, lineno, f"{field}.relevant_text_span")
    if "general_query_list" in obj:
        for field, q in _objects(obj, "general_query_list", path, lineno):
            _get(q, "query", str, path, lineno, f"{field}.query")
            _get(q, "answer", str, path, lineno, f"{field}.answer")
    out: list[dict] = []
    for field, q in _objects(obj, "specific_query_list", path, lineno):
        query = _get(q, "query", str, path, lineno, f"{field}.query")
        answer = _get(q, "answer", str, path, lineno, f"{field}.answer")
        if not query.strip():
            raise _fail(path, lineno, f"{field}.query", "empty")
        if not answer.strip():
            raise _fail(path, lineno, f"{field}.answer", "empty")
        spans = _spans(q, n, path, lineno, f"{field}.relevant_text_span")
        out.append({"query": query, "answer": answer, "spans": spans})
    return turns, out


def _clean(text: str) -> str:
    """Collapse whitespace runs (incl. non-breaking spaces and newlines) to single spaces."""
    return " ".join(text.split())


def _span_turns(spans: list[tuple[int, int]], end_inclusive: bool) -> list[int]:
    idx: list[int] = []
    for start, end in spans:  # spans in the order given; overlapping spans repeat their turns
        idx.extend(range(start, end + 1 if end_inclusive else end))
    return idx


def parse_meeting(
    obj: dict,
    domain: str,
    split: str,
    meeting_index: int,
    path: str | os.PathLike,
    lineno: int,
    end_inclusive: bool = True,
) -> list[dict]:
    """Normalize one raw meeting into one record per *specific* query (§II-A/B).

    Parameters
    ----------
    obj:
        The meeting (one JSON line of the raw release).
    domain, split:
        Client (QMSum domain) and split the meeting belongs to.
    meeting_index:
        0-based position of the meeting in its split file (part of the record id).
    path, lineno:
        Source file and line, named in error messages.
    end_inclusive:
        ``True`` (default) reads ``[start, end]`` as inclusive turn indices, as the QMSum release
        documents. ``False`` takes the Python slice ``turns[start:end]``, which is what the paper's
        Table II statistics were computed with (see :func:`fedrepro.data.qmsum.table2_stats`).

    Returns
    -------
    list of dict
        ``{"id", "source": "qmsum", "client", "split", "input", "target", "meta"}`` where ``input``
        is ``<query> #SEP# <speaker>: <content> ...`` over the span turns (spans in the order
        given; overlapping spans repeat turns; whitespace runs collapsed), ``target`` the answer and
        ``meta`` holds ``n_turns`` / ``n_speakers`` (turns and distinct speakers rendered),
        ``n_words`` (whitespace words of ``input``), ``summary_words`` (of ``target``) and
        ``meeting_index``.

    Raises
    ------
    InputError
        Missing field, wrong type, empty query/answer, or a span that is not a pair of non-negative
        integers inside the transcript; the message names file, line and field.
    """
    _check_domain_split(domain, split)
    turns, queries = _validate_meeting(obj, path, lineno)
    records: list[dict] = []
    for qi, q in enumerate(queries):
        idx = _span_turns(q["spans"], end_inclusive)
        rendered = [f"{_clean(turns[i][0])}: {_clean(turns[i][1])}".rstrip() for i in idx]
        query = _clean(q["query"])
        target = _clean(q["answer"])
        text = f"{query} {SEP} {' '.join(rendered)}".rstrip()
        records.append(
            {
                "id": f"qmsum-{domain}-{split}-{meeting_index:04d}-{qi:02d}",
                "source": "qmsum",
                "client": domain,
                "split": split,
                "input": text,
                "target": target,
                "meta": {
                    "n_turns": len(idx),
                    "n_speakers": len({turns[i][0] for i in idx}),
                    "n_words": len(text.split()),
                    "summary_words": len(target.split()),
                    "meeting_index": meeting_index,
                },
            }
        )
    return records


def load_pairs(
    raw_root: str | os.PathLike, domain: str, split: str, end_inclusive: bool = True
) -> list[dict]:
    """All normalized query–summary pairs of one domain/split (see :func:`parse_meeting`).

    ``raw_root`` may be in any layout :func:`resolve_raw_dir` accepts.
    """
    return parse_file(raw_file(raw_root, domain, split), end_inclusive=end_inclusive)


# -- registry entry ----------------------------------------------------------------------------
def parse_file(
    path: str | os.PathLike, end_inclusive: bool = True, skip_malformed: bool = False
):
    """Pairs of one raw split file ``.../<Domain>[/jsonl]/<split>.jsonl`` (domain from the folder).

    With ``skip_malformed`` a malformed meeting is dropped (all its queries) and listed in the
    returned :class:`~fedrepro.data.sources.Records`' ``skipped``; otherwise it raises.
    """
    from fedrepro.data.sources import Records

    path = Path(path)
    domain = path.parent.name if path.parent.name != "jsonl" else path.parent.parent.name
    split = path.stem
    if domain not in DOMAINS or split not in SPLITS:
        raise InputError(
            f"{path}: expected <Domain>/<split>.jsonl with Domain in {DOMAINS} and split in {SPLITS}"
        )
    out = Records()
    for lineno, index, obj in iter_meetings(path):
        try:
            out.extend(parse_meeting(obj, domain, split, index, path, lineno, end_inclusive=end_inclusive))
        except InputError as exc:
            if not skip_malformed:
                raise
            out.skipped.append((f"line {lineno}", str(exc)))
    return out


def _register() -> None:
    from fedrepro.data import sources

    sources.register(
        sources.Source(
            name="qmsum",
            kind="seq2seq",
            parse=parse_file,
            download=lambda dest, timeout=10.0: download(dest, timeout=timeout),
            write_samples=sources.sample_writer("qmsum", "write_qmsum_samples"),
            config_key=CONFIG_KEY,
            upstream=f"https://github.com/{QMSUM_REPO} @ {QMSUM_COMMIT}",
        )
    )


_register()
