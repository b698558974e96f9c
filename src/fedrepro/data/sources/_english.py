"""Shared machinery of the English summarization sources (SAMSum, CNN/DM, PubMed, WikiHow, Reddit TIFU).

Each of :mod:`~fedrepro.data.sources.samsum`, :mod:`~fedrepro.data.sources.cnndm`,
:mod:`~fedrepro.data.sources.pubmed`, :mod:`~fedrepro.data.sources.wikihow` and
:mod:`~fedrepro.data.sources.reddit_tifu` only knows its own raw schema (a ``convert`` function from
one raw record to one normalized record); everything else lives here:

* reading one raw split file in any of the formats the releases and their hub copies use — a JSON
  list, JSON lines (``.jsonl``/``.json``/``.txt``), CSV with a header, or Parquet — as a stream of
  :class:`RawRow` (``line N`` / ``record N`` / ``row N`` locators for the error messages);
* inferring the split from the file name (``frank_cnndm_test.jsonl`` → ``test``,
  ``pubmed_validation_sample.armancohan.jsonl`` → ``val``, ``long/train/0000.parquet`` → ``train``);
* the parse driver (:func:`parse_path`): malformed records raise :class:`fedrepro.io.InputError`
  naming the file, the line/record and the field, or, with ``skip_malformed=True``, are listed in
  :attr:`fedrepro.data.sources.Records.skipped`;
* text helpers (whitespace clean-up, a simple sentence splitter for sources without sentence
  annotations, used for FedSum's extractive labels);
* the hub download (:func:`hub_download`): a reachability probe that fails within ``timeout``
  offline, then ``huggingface_hub.snapshot_download`` of the data files into a staging folder that
  is renamed onto the destination only when complete (:func:`fedrepro.io.atomic_dir`);
* an atomic CSV writer (WikiHow's split files); the sample generators' own helpers are in
  :mod:`fedrepro.data.samples._english`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from fedrepro.data.download import DownloadError, check_reachable
from fedrepro.data.sources import SPLIT_ALIASES, Records
from fedrepro.io import InputError, atomic_dir, iter_text_lines, read_text, write_text_atomic

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")
DATA_SUFFIXES: tuple[str, ...] = (".json", ".jsonl", ".txt", ".csv", ".parquet")


# -- errors ------------------------------------------------------------------------------------
class FieldError(ValueError):
    """A problem with one field of one raw record (turned into an :class:`InputError` by the driver)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field `{field}`: {problem}")
        self.field = field
        self.problem = problem


def get_str(obj: dict, key: str, *, allow_empty: bool = False, field: str | None = None) -> str:
    """``obj[key]`` as a string; missing, non-string or (unless allowed) blank values raise."""
    field = field or key
    if key not in obj or obj[key] is None:
        raise FieldError(field, "missing")
    value = obj[key]
    if not isinstance(value, str):
        raise FieldError(field, f"expected a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise FieldError(field, "empty")
    return value


def get_str_list(obj: dict, key: str, *, field: str | None = None) -> list[str]:
    """``obj[key]`` as a non-empty list of strings (items may be blank; callers drop those)."""
    field = field or key
    if key not in obj or obj[key] is None:
        raise FieldError(field, "missing")
    value = obj[key]
    if hasattr(value, "tolist") and not isinstance(
        value, (str, bytes)
    ):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, list):
        raise FieldError(field, f"expected a list of strings, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise FieldError(f"{field}[{i}]", f"expected a string, got {type(item).__name__}")
    if not any(item.strip() for item in value):
        raise FieldError(field, "empty")
    return value


def get_number(obj: dict, key: str) -> float | None:
    """Optional numeric metadata (``None`` when absent); a non-number raises."""
    if key not in obj or obj[key] is None:
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(key, f"expected a number, got {type(value).__name__}")
    return float(value)


# -- text helpers --------------------------------------------------------------------------------
def clean(text: str) -> str:
    """Collapse whitespace runs (newlines, tabs, non-breaking spaces) to single spaces."""
    return " ".join(text.split())


_SENT_END = re.compile(r"[.!?][\"'’”)\]]*(?=\s+[\"'‘“(\[]*[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """A simple rule-based sentence splitter (for sources whose raw schema has no sentence list).

    Splits after ``.``, ``!`` or ``?`` (plus closing quotes/brackets) followed by whitespace and an
    upper-case letter or digit; newlines always end a sentence. Good enough for the extractive
    oracle labels of FedSum; sources that ship sentences (CNN/DM ``article_lines``, PubMed
    ``article_text``) use those instead.
    """
    out: list[str] = []
    for para in re.split(r"\s*\n\s*", text):
        para = clean(para)
        if not para:
            continue
        start = 0
        for m in _SENT_END.finditer(para):
            out.append(para[start : m.end()].strip())
            start = m.end()
        if para[start:].strip():
            out.append(para[start:].strip())
    return out


# -- split inference -----------------------------------------------------------------------------
def infer_split(path: str | os.PathLike) -> str:
    """The split (``train``/``val``/``test``) a raw file belongs to, from its name or its folder.

    The file stem is cut at non-alphanumeric characters and the tokens are matched against
    :data:`SPLIT_ALIASES` (``validation``/``valid``/``dev`` → ``val``); a stem with no split token
    (``0000.parquet``) falls back to its folder name (``long/train/0000.parquet``).

    Raises
    ------
    InputError
        No split or more than one split named.
    """
    path = Path(path)
    stem = path.name.split(".")[0]
    tokens = {SPLIT_ALIASES[t] for t in re.split(r"[^a-z0-9]+", stem.lower()) if t in SPLIT_ALIASES}
    if len(tokens) == 1:
        return tokens.pop()
    if len(tokens) > 1:
        raise InputError(f"{path}: file name names several splits {sorted(tokens)}; rename it")
    if (
        path.parent.name.lower() in SPLIT_ALIASES
    ):  # hub parquet layout: <config>/<split>/0000.parquet
        return SPLIT_ALIASES[path.parent.name.lower()]
    raise InputError(
        f"{path}: cannot tell the split from the file name; name it <split>.<ext> (or put it in a "
        f"<split>/ folder) with split one of train, val/validation/dev, test"
    )


def _split_token_only(stem: str) -> bool:
    return stem.lower() in SPLIT_ALIASES


def file_tag(path: Path) -> str:
    """Part of an index-based record id that keeps shards of one split apart (empty for ``train.csv``)."""
    stem = path.name.split(".")[0]
    return "" if _split_token_only(stem) else re.sub(r"[^A-Za-z0-9_]+", "_", stem) + "-"


def split_files(root: str | os.PathLike) -> dict[str, list[Path]]:
    """Map each split to the raw data files under ``root`` (recursively; hidden, licence and readme
    files skipped), e.g. for a downloaded or local copy of a release."""
    root = Path(root)
    if not root.exists():
        raise InputError(f"{root}: folder not found")
    out: dict[str, list[Path]] = {}
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for p in files:
        rel = p.relative_to(root) if root.is_dir() else Path(p.name)
        if any(part.startswith(".") for part in rel.parts) or p.suffix.lower() not in DATA_SUFFIXES:
            continue
        if p.name.lower().startswith(("license", "readme", "notice")):
            continue
        out.setdefault(infer_split(p), []).append(p)
    return out


# -- raw readers -----------------------------------------------------------------------------------
@dataclasses.dataclass
class RawRow:
    """One raw record: ``locator`` (``line 3``, ``record 0``, ``row 7``) for messages, its 0-based
    ``index`` among the file's records, the object or the reason it could not be read."""

    locator: str
    index: int
    obj: dict | None
    error: str | None = None


def _iter_json_lines(path: Path, text: str) -> Iterator[RawRow]:
    index = 0
    # lines end at "\n" only: JSON strings may hold U+2028 and others str.splitlines breaks on
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        loc = f"line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield RawRow(loc, index, None, f"not valid JSON ({exc.msg})")
        else:
            if isinstance(obj, dict):
                yield RawRow(loc, index, obj)
            else:
                yield RawRow(loc, index, None, f"expected a JSON object, got {type(obj).__name__}")
        index += 1


def _iter_json(path: Path) -> Iterator[RawRow]:
    text = read_text(path)
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
        for i, obj in enumerate(data):
            if isinstance(obj, dict):
                yield RawRow(f"record {i}", i, obj)
            else:
                yield RawRow(
                    f"record {i}", i, None, f"expected a JSON object, got {type(obj).__name__}"
                )
        return
    yield from _iter_json_lines(path, text)


def csv_reader(path: Path, strict: bool = True):
    """A ``csv.reader`` over the UTF-8 lines of ``path`` (bytes that are not UTF-8: an
    :class:`InputError` naming the file and line). Long articles are valid fields, so the csv
    module's 128 KiB field limit is lifted (process-wide). ``strict``: a file cut inside a quoted
    field, or text after a closing quote, is a ``csv.Error`` instead of a silently shortened or
    merged field."""
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
    return csv.reader((line for _, line in iter_text_lines(path, keepends=True)), strict=strict)


def _iter_csv(path: Path) -> Iterator[RawRow]:
    reader = csv_reader(path)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as exc:
        raise InputError(f"{path}:1: bad CSV header ({exc})") from exc
    header = [h.strip() for h in header]
    index = 0
    start = reader.line_num + 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield RawRow(f"line {start}", index, None, f"field `<csv row>`: bad CSV ({exc})")
            index += 1
            start = reader.line_num + 1
            continue
        loc = f"line {start}"
        start = reader.line_num + 1
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) < len(header):
            yield RawRow(
                loc, index, None,
                f"field `{header[len(row)]}`: missing (the row has {len(row)} CSV fields, the "
                f"header {len(header)}: {header})",
            )
        elif len(row) > len(header):
            yield RawRow(
                loc, index, None,
                f"field `<column {len(header) + 1}>`: not in the header (the row has {len(row)} "
                f"CSV fields, the header {len(header)}: {header}; an unquoted comma?)",
            )
        else:
            yield RawRow(loc, index, dict(zip(header, row)))
        index += 1


def _iter_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc
    index = 0
    for batch in pf.iter_batches(batch_size=1024):
        for obj in batch.to_pylist():
            yield RawRow(f"row {index}", index, obj)
            index += 1


def iter_raw(path: str | os.PathLike) -> Iterator[RawRow]:
    """Raw records of one file: ``.parquet``, ``.csv`` (header row), ``.json`` (a JSON list or JSON
    lines) or ``.jsonl``/``.txt`` (JSON lines)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _iter_parquet(path)
    elif suffix == ".csv":
        yield from _iter_csv(path)
    elif suffix == ".json":
        yield from _iter_json(path)
    elif suffix in (".jsonl", ".txt"):
        yield from _iter_json_lines(path, read_text(path))
    else:
        raise InputError(
            f"{path}: unsupported file type {suffix!r}; expected one of {DATA_SUFFIXES}"
        )


# -- parse driver ------------------------------------------------------------------------------------
Converter = Callable[[dict, "RowContext"], dict]


@dataclasses.dataclass(frozen=True)
class RowContext:
    """What a converter needs besides the raw object: source name, split, and an index-based id part."""

    name: str
    split: str
    index_id: str  # e.g. "000012" or "0000-000012" for a shard


def record(ctx: RowContext, raw_id: str, input_text: str, target: str, meta: dict) -> dict:
    """A normalized seq2seq record ``{id, source, client, split, input, target, meta}``."""
    return {
        "id": f"{ctx.name}-{ctx.split}-{raw_id}",
        "source": ctx.name,
        "client": ctx.name,
        "split": ctx.split,
        "input": input_text,
        "target": target,
        "meta": meta,
    }


def _parse_file(
    path: Path, name: str, convert: Converter, split: str | None, skip_malformed: bool
) -> tuple[list[dict], list[tuple[str, str]]]:
    split = split or infer_split(path)
    if split not in SPLITS:
        raise InputError(f"{path}: unknown split {split!r}; expected one of {SPLITS}")
    tag = file_tag(path)
    records: list[dict] = []
    skipped: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for row in iter_raw(path):
        reason = row.error
        rec = None
        if reason is None:
            assert row.obj is not None
            ctx = RowContext(name, split, f"{tag}{row.index:06d}")
            try:
                rec = convert(row.obj, ctx)
            except FieldError as exc:
                raw_id = row.obj.get("id", row.obj.get("article_id"))
                what = f" (id {raw_id})" if isinstance(raw_id, (str, int)) else ""
                reason = f"record{what}: {exc}"
        if reason is not None:
            msg = f"{path}:{row.locator}: {reason}"
            if not skip_malformed:
                raise InputError(
                    f"{msg}; fix or remove the record, or parse with skip_malformed=True"
                )
            log.warning("skipping malformed record %s", msg)
            skipped.append((row.locator, reason))
            continue
        assert rec is not None
        if rec["id"] in seen:  # a repeated upstream id: keep both, the later one with a suffix
            log.warning("%s:%s: id %s repeats %s", path, row.locator, rec["id"], seen[rec["id"]])
            rec["id"] = f"{rec['id']}-dup{row.index}"
        seen[rec["id"]] = row.locator
        records.append(rec)
    return records, skipped


def parse_path(
    path: str | os.PathLike,
    name: str,
    convert: Converter,
    *,
    skip_malformed: bool = False,
    split: str | None = None,
) -> Records:
    """Parse one raw split file, or a folder holding the files (shards) of one split.

    Parameters
    ----------
    path:
        A data file (split from its name, see :func:`infer_split`) or a folder whose data files all
        belong to one split (e.g. the Parquet shards of CNN/DM's train split).
    name:
        Source name (record ``source``/``client`` and id prefix).
    convert:
        ``convert(raw_object, RowContext) -> record``; raises :class:`FieldError` for a bad field.
    skip_malformed:
        Skip malformed records (listed in ``Records.skipped`` as ``(locator, reason)``) instead of
        raising.
    split:
        Override the split inferred from the file name.

    Raises
    ------
    InputError
        Missing file, unreadable file, unknown split, or (without ``skip_malformed``) a malformed
        record; the message names the file, the line/record/row and the field.
    """
    path = Path(path)
    if path.is_dir():
        groups = split_files(path)
        if not groups:
            raise InputError(f"{path}: no data files ({', '.join(DATA_SUFFIXES)}) in this folder")
        if split is None and len(groups) > 1:
            raise InputError(
                f"{path}: folder holds files of several splits {sorted(groups)}; parse one file or "
                f"one split's folder at a time"
            )
        files = [p for ps in groups.values() for p in ps]
    elif path.is_file():
        files = [path]
    else:
        raise InputError(f"{path}: file not found")
    out = Records()
    for p in files:
        records, skipped = _parse_file(p, name, convert, split, skip_malformed)
        out.extend(records)
        out.skipped.extend(
            skipped if len(files) == 1 else [(f"{p.name}:{loc}", why) for loc, why in skipped]
        )
    ids = [r["id"] for r in out]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InputError(f"{path}: record id {dup} occurs in more than one file of this split")
    return out


def load_split(
    root: str | os.PathLike, split: str, parse: Callable[..., Records], skip_malformed: bool = False
) -> Records:
    """All records of ``split`` under ``root`` (every file whose name says that split)."""
    files = split_files(root).get(split, [])
    if not files:
        raise InputError(f"{root}: no data files for split {split!r}")
    out = Records()
    for p in files:
        recs = parse(p, skip_malformed=skip_malformed)
        out.extend(recs)
        out.skipped.extend(recs.skipped)
    return out


# -- downloads -------------------------------------------------------------------------------------
def _offline_env() -> bool:
    """``HF_HUB_OFFLINE`` as the hub client saw it at import, or as the environment says now."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    return bool(constants.HF_HUB_OFFLINE) or env


def probe(url: str, timeout: float) -> None:
    """Connect to ``url``'s host within ``timeout`` seconds or raise (see download.check_reachable)."""
    check_reachable(url, timeout)


def hub_download(
    dest_dir: str | os.PathLike,
    *,
    dataset: str,
    repo_id: str,
    revision: str,
    allow_patterns: Sequence[str],
    config_key: str,
    timeout: float = 10.0,
    expect_splits: Iterable[str] = SPLITS,
    postprocess: Callable[[Path], None] | None = None,
) -> Path:
    """Download the data files of a Hugging Face dataset repo at ``revision`` into ``dest_dir``.

    The files (``allow_patterns``, keeping the repo's layout) go into a staging folder beside
    ``dest_dir`` (``huggingface_hub.snapshot_download`` with ``etag_timeout=timeout``); the hub's
    ``.cache`` bookkeeping is removed, ``postprocess(staging)`` runs, every split in
    ``expect_splits`` must be present, and only then is the folder renamed onto ``dest_dir``.
    Before anything is created, the hub endpoint must answer within ``timeout`` seconds, so an
    offline machine fails fast and leaves nothing behind.

    Raises
    ------
    DownloadError
        Naming the dataset, ``https://huggingface.co/datasets/<repo_id>`` at ``revision`` and the
        config key for a local copy.
    """
    from huggingface_hub import constants

    url = f"{constants.ENDPOINT}/datasets/{repo_id}"
    where = f"{url} (hub id {repo_id!r}, revision {revision!r}, files {list(allow_patterns)})"
    advice = (
        f"If this machine has no internet access, download the files elsewhere and set the config key "
        f"`{config_key}` to the folder holding your local copy."
    )
    if _offline_env():
        raise DownloadError(f"{dataset}: cannot download {where}: HF_HUB_OFFLINE is set. {advice}")
    try:
        probe(constants.ENDPOINT, timeout)
    except (OSError, TimeoutError) as exc:
        raise DownloadError(
            f"{dataset}: could not download {where} ({type(exc).__name__}: {exc}). {advice}"
        ) from exc
    from huggingface_hub import snapshot_download

    dest_dir = Path(dest_dir)
    try:
        with atomic_dir(dest_dir) as staging:
            snapshot_download(
                repo_id,
                repo_type="dataset",
                revision=revision,
                allow_patterns=list(allow_patterns),
                local_dir=staging,
                etag_timeout=timeout,
            )
            shutil.rmtree(staging / ".cache", ignore_errors=True)
            if postprocess is not None:
                postprocess(staging)
            found = split_files(staging)
            missing = [s for s in expect_splits if s not in found]
            if missing:
                files = sorted(str(p.relative_to(staging)) for ps in found.values() for p in ps)
                raise DownloadError(
                    f"{dataset}: {where} gave no files for split(s) {missing} (got {files}); "
                    f"check the revision. {advice}"
                )
    except DownloadError:
        raise
    except Exception as exc:
        raise DownloadError(
            f"{dataset}: could not download {where} ({type(exc).__name__}: {exc}). {advice}"
        ) from exc
    return dest_dir


# -- writers -------------------------------------------------------------------------------------------
def write_csv_atomic(
    path: str | os.PathLike, header: Sequence[str], rows: Iterable[Sequence[str]]
) -> int:
    """Write a CSV (header + rows, ``\\n`` line ends, minimal quoting) atomically; return the row count."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(list(header))
    n = 0
    for row in rows:
        writer.writerow(list(row))
        n += 1
    write_text_atomic(path, buf.getvalue())
    return n


def register_source(name, parse, download, write_samples, config_key, upstream, splits) -> None:
    """Register one English summarization source (every module of this family has the same shape)."""
    from fedrepro.data import sources

    sources.register_seq2seq(
        name, parse, download, write_samples,
        upstream=upstream, splits=splits, lang="en", config_key=config_key,
    )
