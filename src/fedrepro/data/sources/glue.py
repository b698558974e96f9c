"""GLUE: the six FedMCP clients (MRPC, RTE, SST-2, QNLI, QQP, MNLI), one NLU task per client.

FedMCP (§V-A, "Datasets" and "Cross-task Cross-silo Setting") follows FedPETuning and takes six
GLUE tasks (Wang et al., ICLR 2019): RTE, MRPC, SST-2, QNLI, QQP and MNLI; each task is one client.
Because GLUE does not release test labels, the paper merges each task's training and validation
sets and re-partitions them 6:2:2 (after subsampling the larger tasks to MRPC's size); that split
is :func:`fedrepro.data.partition.fedmcp_cross_task`, this module only reads the raw splits.

Two raw forms are accepted by :func:`parse`, each one split file at a time:

* **The GLUE release layout** ``<TASK>/<split>.tsv`` (``TASK`` one of ``MRPC RTE SST-2 QNLI QQP
  MNLI``; ``split`` ``train``, ``dev`` -> ``val``, ``test``; MNLI has ``dev_matched`` -> ``val``,
  ``dev_mismatched`` -> ``val_mismatched``, ``test_matched`` -> ``test`` and ``test_mismatched`` ->
  ``test_mismatched``). Tab-separated with a header row; columns are found by header name:

  ===== ============================================================ ====================
  task  text columns (text_a, text_b)                                label column
  ===== ============================================================ ====================
  MRPC  ``#1 String``, ``#2 String`` (+ ``Quality #1 ID #2 ID``)     ``Quality`` (0/1)
  RTE   ``sentence1``, ``sentence2`` (+ ``index``)                   ``label`` (names)
  SST-2 ``sentence``                                                 ``label`` (0/1)
  QNLI  ``question``, ``sentence`` (+ ``index``)                     ``label`` (names)
  QQP   ``question1``, ``question2`` (+ ``id qid1 qid2``)            ``is_duplicate`` (0/1)
  MNLI  ``sentence1``, ``sentence2`` (+ ``genre promptID pairID``    ``gold_label`` (names)
        and the parse columns, ignored)
  ===== ============================================================ ====================

  The MRPC train/dev files start with a UTF-8 byte-order mark. The files are *not* CSV-quoted:
  many texts contain ``"`` characters, so rows are split on tabs only (what GLUE's own readers do
  with ``quoting=QUOTE_NONE``); a quote never merges lines. GLUE's test files have no label column.

* **The Hugging Face hub form** of ``nyu-mll/glue`` (parquet):
  ``<config>/<split>-NNNNN-of-NNNNN.parquet`` with ``config`` ``mrpc rte sst2 qnli qqp mnli``
  (also ``mnli_matched``/``mnli_mismatched``) and ``split`` ``train``, ``validation`` -> ``val``,
  ``test`` (MNLI: ``validation_matched`` -> ``val``, ``validation_mismatched`` ->
  ``val_mismatched``, ``test_matched`` -> ``test``, ``test_mismatched`` -> ``test_mismatched``).
  Fields: ``sentence`` (SST-2), ``sentence1,sentence2`` (MRPC, RTE), ``question,sentence`` (QNLI),
  ``question1,question2`` (QQP), ``premise,hypothesis`` (MNLI), ``label`` (int; ``-1`` on the
  unlabelled test splits, while the hub's MRPC test split carries the MSR labels) and ``idx``.
  :func:`download` writes this form as ``<dest>/<TASK>/<hub split>.parquet``, which :func:`parse`
  also reads.

Records (``kind="classification"``)::

    {"id": "glue-<TASK>-<split>-<n>", "source": "glue", "task": "<TASK>",
     "split": "train|val|test|val_mismatched|test_mismatched",
     "text_a": str, "text_b": str | None, "label": int, "meta": {...}}

``n`` is the 0-based data-row number of the TSV (blank lines not counted) or the hub's ``idx``; for
every task but MRPC the two coincide (the hub's MRPC ``idx`` numbers rows of the original MSR
training file). Texts are stripped of surrounding whitespace (SST-2 rows end in a space). ``label``
follows the hub's ``ClassLabel`` order, :data:`LABEL_NAMES`:

* MRPC ``0 not_equivalent, 1 equivalent``; RTE and QNLI ``0 entailment, 1 not_entailment``;
  SST-2 ``0 negative, 1 positive``; QQP ``0 not_duplicate, 1 duplicate``;
  MNLI ``0 entailment, 1 neutral, 2 contradiction``.

Unlabelled test rows get ``label = -1`` (:data:`UNLABELLED`), as on the hub.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fedrepro.data.download import DownloadError
from fedrepro.data.sources import Records
from fedrepro.io import InputError, atomic_dir, iter_text_lines

__all__ = [
    "CONFIG_KEY",
    "GLUE_HUB_ID",
    "GLUE_REVISION",
    "LABEL_NAMES",
    "TASKS",
    "UNLABELLED",
    "DownloadError",
    "download",
    "hub_filename",
    "parse",
    "split_files",
]

log = logging.getLogger(__name__)

NAME = "glue"
CONFIG_KEY = "data.glue.local_dir"
"""Config key that points the pipeline at a local copy of GLUE instead of downloading it."""

GLUE_HUB_ID = "nyu-mll/glue"
GLUE_REVISION = "bcdcba79d07bc864c1c254ccfcedcce55bcc9a8c"
"""Pinned commit of the hub dataset ``nyu-mll/glue`` (parquet files only, no loading script).

This SHA could not be verified from this offline machine: it is the commit the hub resolved ``main``
to in public download logs and pinned code found while writing this module. Pass ``revision=`` to
:func:`download` to use another commit (or ``"main"``)."""

TASKS: tuple[str, ...] = ("MRPC", "RTE", "SST-2", "QNLI", "QQP", "MNLI")
"""The six FedMCP clients, spelled as the GLUE release folders."""

UNLABELLED = -1
"""Label of the rows of GLUE's unlabelled test splits (the hub's convention)."""


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Columns and labels of one GLUE task in both raw forms."""

    name: str
    hub_config: str
    labels: tuple[str, ...]
    tsv_a: str
    tsv_b: str | None
    tsv_label: str
    hub_a: str
    hub_b: str | None
    tsv_meta: tuple[tuple[str, str], ...]  # (TSV column, meta key)


_SPECS: dict[str, TaskSpec] = {
    s.name: s
    for s in (
        TaskSpec(
            name="MRPC",
            hub_config="mrpc",
            labels=("not_equivalent", "equivalent"),
            tsv_a="#1 String",
            tsv_b="#2 String",
            tsv_label="Quality",
            hub_a="sentence1",
            hub_b="sentence2",
            tsv_meta=(("#1 ID", "id1"), ("#2 ID", "id2"), ("index", "index")),
        ),
        TaskSpec(
            name="RTE",
            hub_config="rte",
            labels=("entailment", "not_entailment"),
            tsv_a="sentence1",
            tsv_b="sentence2",
            tsv_label="label",
            hub_a="sentence1",
            hub_b="sentence2",
            tsv_meta=(("index", "index"),),
        ),
        TaskSpec(
            name="SST-2",
            hub_config="sst2",
            labels=("negative", "positive"),
            tsv_a="sentence",
            tsv_b=None,
            tsv_label="label",
            hub_a="sentence",
            hub_b=None,
            tsv_meta=(("index", "index"),),
        ),
        TaskSpec(
            name="QNLI",
            hub_config="qnli",
            labels=("entailment", "not_entailment"),
            tsv_a="question",
            tsv_b="sentence",
            tsv_label="label",
            hub_a="question",
            hub_b="sentence",
            tsv_meta=(("index", "index"),),
        ),
        TaskSpec(
            name="QQP",
            hub_config="qqp",
            labels=("not_duplicate", "duplicate"),
            tsv_a="question1",
            tsv_b="question2",
            tsv_label="is_duplicate",
            hub_a="question1",
            hub_b="question2",
            tsv_meta=(("id", "pair_id"), ("qid1", "qid1"), ("qid2", "qid2")),
        ),
        TaskSpec(
            name="MNLI",
            hub_config="mnli",
            labels=("entailment", "neutral", "contradiction"),
            tsv_a="sentence1",
            tsv_b="sentence2",
            tsv_label="gold_label",
            hub_a="premise",
            hub_b="hypothesis",
            tsv_meta=(
                ("index", "index"),
                ("promptID", "prompt_id"),
                ("pairID", "pair_id"),
                ("genre", "genre"),
            ),
        ),
    )
}

LABEL_NAMES: dict[str, tuple[str, ...]] = {t: s.labels for t, s in _SPECS.items()}
"""Label names per task in the hub's ``ClassLabel`` order: ``label`` indexes this tuple."""

# folder name (lower-case, without "-"/"_") -> (task, split override for validation/test files)
_FOLDERS: dict[str, tuple[str, str | None]] = {
    "mrpc": ("MRPC", None),
    "rte": ("RTE", None),
    "sst2": ("SST-2", None),
    "qnli": ("QNLI", None),
    "qqp": ("QQP", None),
    "mnli": ("MNLI", None),
    "mnlimatched": ("MNLI", ""),  # hub config mnli_matched: validation/test are the matched ones
    "mnlimismatched": ("MNLI", "_mismatched"),
}

# raw split name (TSV file stem or hub split) -> normalized split
_SPLITS: dict[str, str] = {
    "train": "train",
    "dev": "val",
    "validation": "val",
    "val": "val",
    "test": "test",
    "dev_matched": "val",
    "validation_matched": "val",
    "dev_mismatched": "val_mismatched",
    "validation_mismatched": "val_mismatched",
    "test_matched": "test",
    "test_mismatched": "test_mismatched",
}
_MNLI_ONLY = {k for k in _SPLITS if k.endswith("matched")}

# normalized split -> hub split name, per task (what download() fetches)
_HUB_SPLITS: dict[str, dict[str, str]] = {
    t: (
        {
            "train": "train",
            "val": "validation_matched",
            "test": "test_matched",
            "val_mismatched": "validation_mismatched",
            "test_mismatched": "test_mismatched",
        }
        if t == "MNLI"
        else {"train": "train", "val": "validation", "test": "test"}
    )
    for t in TASKS
}


def _task_of_folder(folder: str) -> tuple[str, str | None] | None:
    return _FOLDERS.get(folder.lower().replace("-", "").replace("_", ""))


def _task_and_split(path: Path) -> tuple[str, str]:
    """``(task, split)`` of a raw split file from its folder and file name (module docstring)."""
    name = path.name
    suffix = path.suffix.lower()
    if suffix not in (".tsv", ".parquet"):
        raise InputError(
            f"{path}: not a GLUE split file: expected <TASK>/<split>.tsv (GLUE release) or "
            f"<config>/<split>-*.parquet (hub {GLUE_HUB_ID})"
        )
    folder = path.parent
    stem = name[: -len(suffix)]
    if suffix == ".parquet":
        if stem.isdigit():  # datasets-server layout <config>/<split>/0000.parquet
            stem, folder = folder.name, folder.parent
        stem = re.sub(r"-\d{5}-of-\d{5}$", "", stem)
    found = _task_of_folder(folder.name)
    if found is None:
        raise InputError(
            f"{path}: cannot tell the GLUE task from the folder name {folder.name!r}: expected "
            f"one of {', '.join(TASKS)} (GLUE release) or "
            f"{', '.join(s.hub_config for s in _SPECS.values())} (hub {GLUE_HUB_ID})"
        )
    task, mnli_variant = found
    raw_split = stem.lower()
    if mnli_variant is not None and raw_split in ("validation", "dev", "test"):
        raw_split = ("dev" if raw_split != "test" else "test") + (mnli_variant or "_matched")
    if raw_split not in _SPLITS or (raw_split in _MNLI_ONLY and task != "MNLI"):
        allowed = sorted(k for k in _SPLITS if task == "MNLI" or k not in _MNLI_ONLY)
        raise InputError(
            f"{path}: cannot tell the {task} split from the file name {name!r}: expected one of "
            f"{', '.join(allowed)} (.tsv, or .parquet with an optional -NNNNN-of-NNNNN suffix)"
        )
    return task, _SPLITS[raw_split]


# -- parsing -------------------------------------------------------------------------------------
class _Malformed(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field `{field}`: {problem}")


def _label_index(value: Any, spec: TaskSpec, field: str, split: str) -> int:
    """Label value (name, digit string or int) -> index into ``spec.labels``."""
    n = len(spec.labels)
    if isinstance(value, str):
        text = value.strip()
        if text in spec.labels:
            return spec.labels.index(text)
        if re.fullmatch(r"-?\d+", text):
            value = int(text)
        else:
            raise _Malformed(
                field,
                f"unknown label {value!r}; expected one of {', '.join(spec.labels)} or 0..{n - 1}",
            )
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Malformed(field, f"expected an integer label, got {type(value).__name__}")
    if value == UNLABELLED and split.startswith("test"):
        return UNLABELLED
    if not 0 <= value < n:
        raise _Malformed(field, f"label {value} out of range 0..{n - 1} ({', '.join(spec.labels)})")
    return value


def _text(value: Any, field: str) -> str:
    if value is None:
        raise _Malformed(field, "missing (null)")
    if not isinstance(value, str):
        raise _Malformed(field, f"expected a string, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise _Malformed(field, "empty")
    return text


def _record(
    spec: TaskSpec, split: str, n: int, text_a: str, text_b: str | None, label: int, meta: dict
) -> dict:
    meta["label_name"] = spec.labels[label] if label != UNLABELLED else None
    return {
        "id": f"{NAME}-{spec.name}-{split}-{n}",
        "source": NAME,
        "task": spec.name,
        "split": split,
        "text_a": text_a,
        "text_b": text_b,
        "label": label,
        "meta": meta,
    }


def _iter_tsv_rows(path: Path) -> Iterable[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank line, split on tabs only (no CSV quoting)."""
    # the reader drops MRPC's byte-order mark; lines end at "\n" only (a stray "\r" inside a line
    # stays); bytes that are not UTF-8 raise InputError naming the file and the line
    for lineno, line in iter_text_lines(path):
        line = line.rstrip("\r")
        if line.strip():
            yield lineno, line.split("\t")


def _parse_tsv(path: Path, spec: TaskSpec, split: str, skip_malformed: bool) -> Records:
    rows = iter(_iter_tsv_rows(path))
    try:
        _, header = next(rows)
    except StopIteration:
        raise InputError(
            f"{path}: empty file: expected a header row and {spec.name} rows"
        ) from None
    header = [h.strip() for h in header]
    labelled = spec.tsv_label in header
    required = [c for c in (spec.tsv_a, spec.tsv_b) if c] + (
        [] if split.startswith("test") else [spec.tsv_label]
    )
    missing = [c for c in required if c not in header]
    if missing:
        raise InputError(
            f"{path}:1: header lacks the {spec.name} column(s) "
            f"{', '.join(repr(c) for c in missing)} (found: {', '.join(repr(h) for h in header)}); "
            f"is this the GLUE {spec.name} {split} file?"
        )
    col = {name: i for i, name in enumerate(header)}
    out = Records()
    for n, (lineno, fields) in enumerate(rows):
        rec_id = f"{NAME}-{spec.name}-{split}-{n}"
        try:
            if len(fields) != len(header):
                field = header[len(fields)] if len(fields) < len(header) else header[-1]
                raise _Malformed(
                    field,
                    f"row has {len(fields)} tab-separated fields, the header has {len(header)}"
                    + (" (missing)" if len(fields) < len(header) else " (a text contains a tab?)"),
                )
            text_a = _text(fields[col[spec.tsv_a]], spec.tsv_a)
            text_b = _text(fields[col[spec.tsv_b]], spec.tsv_b) if spec.tsv_b else None
            label = (
                _label_index(fields[col[spec.tsv_label]], spec, spec.tsv_label, split)
                if labelled
                else UNLABELLED
            )
        except _Malformed as exc:
            msg = f"{path}:{lineno}: record {rec_id}: {exc}"
            if not skip_malformed:
                raise InputError(
                    msg + "; fix or remove this line (or skip malformed records)"
                ) from None
            out.skipped.append((rec_id, msg))
            continue
        meta: dict[str, Any] = {"format": "tsv", "line": lineno}
        meta.update({key: fields[col[c]].strip() for c, key in spec.tsv_meta if c in col})
        out.append(_record(spec, split, n, text_a, text_b, label, meta))
    return out


def _parse_parquet(path: Path, spec: TaskSpec, split: str, skip_malformed: bool) -> Records:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # any reader failure means a bad input file
        raise InputError(
            f"{path}: not a readable parquet file ({type(exc).__name__}: {exc})"
        ) from exc
    names = table.column_names
    required = [c for c in (spec.hub_a, spec.hub_b, "label") if c]
    missing = [c for c in required if c not in names]
    if missing:
        raise InputError(
            f"{path}: lacks the {spec.name} field(s) {', '.join(repr(c) for c in missing)} "
            f"(found: {', '.join(repr(c) for c in names)}); expected the {GLUE_HUB_ID} "
            f"{spec.hub_config} schema"
        )
    col_a = table.column(spec.hub_a).to_pylist()
    col_b = table.column(spec.hub_b).to_pylist() if spec.hub_b else [None] * len(col_a)
    labels = table.column("label").to_pylist()
    idxs = table.column("idx").to_pylist() if "idx" in names else list(range(len(col_a)))
    out = Records()
    seen: set[int] = set()
    for row, (a, b, label, idx) in enumerate(zip(col_a, col_b, labels, idxs)):
        rec_id = f"{NAME}-{spec.name}-{split}-{idx if isinstance(idx, int) else f'row{row}'}"
        try:
            if isinstance(idx, bool) or not isinstance(idx, int):
                raise _Malformed("idx", f"expected an integer, got {idx!r}")
            if idx in seen:
                raise _Malformed("idx", f"duplicate idx {idx}")
            text_a = _text(a, spec.hub_a)
            text_b = _text(b, spec.hub_b) if spec.hub_b else None
            if label is None:
                raise _Malformed("label", "missing (null)")
            label_i = _label_index(label, spec, "label", split)
        except _Malformed as exc:
            msg = f"{path}: row {row}: record {rec_id}: {exc}"
            if not skip_malformed:
                raise InputError(msg + "; fix the file or skip malformed records") from None
            out.skipped.append((rec_id, msg))
            continue
        seen.add(idx)
        meta = {"format": "parquet", "idx": idx}
        out.append(_record(spec, split, idx, text_a, text_b, label_i, meta))
    return out


def parse(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Normalize one raw GLUE split file (release TSV or hub parquet) into classification records.

    Parameters
    ----------
    path:
        ``<TASK>/<split>.tsv`` of the GLUE release or
        ``<config>/<split>[-NNNNN-of-NNNNN].parquet`` of the hub dataset ``nyu-mll/glue`` (see the
        module docstring); the task comes from the folder name, the split from the file name.
    skip_malformed:
        Skip malformed rows (listed in ``Records.skipped`` as ``(record id, reason)``) instead of
        raising.

    Returns
    -------
    Records
        One record per row, in file order (schema in the module docstring).

    Raises
    ------
    InputError
        Unknown task/split, missing file or column, or a malformed row (wrong number of fields,
        empty text, unknown label): the message names the file, the line (TSV) or row (parquet), the
        record id and the field.
    """
    path = Path(path)
    task, split = _task_and_split(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found; check the config key `{CONFIG_KEY}`")
    spec = _SPECS[task]
    if path.suffix.lower() == ".tsv":
        return _parse_tsv(path, spec, split, skip_malformed)
    return _parse_parquet(path, spec, split, skip_malformed)


def split_files(root: str | os.PathLike, task: str) -> dict[str, Path]:
    """The raw split files of ``task`` under a local GLUE copy ``root``: ``{split: path}``.

    Looks for the GLUE release layout (``<root>/<TASK>/<split>.tsv``), :func:`download`'s layout
    (``<root>/<TASK>/<hub split>.parquet``) and the hub layout
    (``<root>/<config>/<split>-*.parquet``); for one split the first form found wins, in that
    order. Raises :class:`InputError` naming the config key when nothing is found.
    """
    if task not in _SPECS:
        raise InputError(f"unknown GLUE task {task!r}; expected one of {', '.join(TASKS)}")
    root = Path(root)
    spec = _SPECS[task]
    found: dict[str, Path] = {}
    candidates = sorted((root / task).glob("*.tsv")) + sorted((root / task).glob("*.parquet"))
    candidates += sorted((root / spec.hub_config).glob("*.parquet"))
    for cand in candidates:
        try:
            _, split = _task_and_split(cand)
        except InputError:
            continue
        found.setdefault(split, cand)
    if not found:
        raise InputError(
            f"no GLUE {task} files under {root}: expected {root / task}/<split>.tsv (GLUE "
            f"release) or {root / spec.hub_config}/<split>-*.parquet (hub {GLUE_HUB_ID}); "
            f"check the config key `{CONFIG_KEY}`"
        )
    return found


# -- download ------------------------------------------------------------------------------------
def hub_filename(task: str, split: str) -> str:
    """Path of ``task``'s ``split`` (normalized name) inside the hub repository ``nyu-mll/glue``."""
    if task not in _SPECS:
        raise InputError(f"unknown GLUE task {task!r}; expected one of {', '.join(TASKS)}")
    if split not in _HUB_SPLITS[task]:
        raise InputError(
            f"unknown {task} split {split!r}; expected one of {', '.join(_HUB_SPLITS[task])}"
        )
    return f"{_SPECS[task].hub_config}/{_HUB_SPLITS[task][split]}-00000-of-00001.parquet"


def _download_error(what: str, revision: str, exc: BaseException | str) -> DownloadError:
    reason = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return DownloadError(
        f"GLUE ({GLUE_HUB_ID}@{revision}): could not download {what} from the Hugging Face hub "
        f"(https://huggingface.co/datasets/{GLUE_HUB_ID}/tree/{revision}) ({reason}). If this "
        f"machine has no internet access, fetch the GLUE files elsewhere and set the config key "
        f"`{CONFIG_KEY}` to the folder holding your local copy (<TASK>/<split>.tsv of the GLUE "
        f"release, or <config>/<split>-*.parquet of {GLUE_HUB_ID})."
    )


def _probe(repo_file: str, revision: str, timeout: float) -> None:
    """Fail within ``timeout`` seconds when the hub is unreachable (no retries, nothing written).

    ``hf_hub_download`` retries a failed request five times with back-off (more than 20 s offline),
    and name resolution is not covered by socket timeouts, so one metadata request is made first in
    a helper thread that the caller stops waiting for after ``timeout`` seconds.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(GLUE_HUB_ID, repo_file, repo_type="dataset", revision=revision)
    result: dict[str, BaseException] = {}

    def worker() -> None:
        try:
            get_hf_file_metadata(url, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
            result["exc"] = exc

    thread = threading.Thread(target=worker, name="fedrepro-glue-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise _download_error(url, revision, f"no answer within {timeout:g} s")
    if "exc" in result:
        raise _download_error(url, revision, result["exc"])


def download(
    dest_dir: str | os.PathLike,
    timeout: float = 10.0,
    revision: str = GLUE_REVISION,
    splits: Sequence[str] = ("train", "val"),
    tasks: Sequence[str] = TASKS,
) -> Path:
    """Download the six FedMCP GLUE tasks from the hub dataset ``nyu-mll/glue`` at a pinned commit.

    Files land in ``dest_dir/<TASK>/<hub split>.parquet`` (e.g.
    ``MNLI/validation_matched.parquet``), a layout :func:`parse` and :func:`split_files` read.
    Everything is fetched into a staging folder beside ``dest_dir`` that is renamed onto it only
    when complete (:func:`fedrepro.io.atomic_dir`), so nothing partial is left behind.

    Parameters
    ----------
    dest_dir:
        Target folder (replaced when the download completes).
    timeout:
        Seconds allowed for the first (probe) request and for each metadata request
        (``etag_timeout``); offline, the call fails within about this time.
    revision:
        Hub revision; default :data:`GLUE_REVISION` (see there for how it was chosen).
    splits:
        Normalized splits to fetch. FedMCP merges train and val and re-partitions them (GLUE's test
        labels are private), so the default is ``("train", "val")``; add ``"test"`` for the
        unlabelled test sets.
    tasks:
        GLUE tasks to fetch, default the six FedMCP clients.

    Raises
    ------
    DownloadError
        Naming the dataset, the hub id and revision, the file and the config key
        ``data.glue.local_dir`` for a local copy.
    """
    from huggingface_hub import hf_hub_download

    dest_dir = Path(dest_dir)
    files = [(t, s, hub_filename(t, s)) for t in tasks for s in splits]
    _probe(files[0][2], revision, timeout)
    with atomic_dir(dest_dir) as staging:
        hub_tmp = staging / ".hub"
        for task, split, repo_file in files:
            log.info("downloading %s@%s/%s", GLUE_HUB_ID, revision, repo_file)
            try:
                got = hf_hub_download(
                    GLUE_HUB_ID,
                    repo_file,
                    repo_type="dataset",
                    revision=revision,
                    local_dir=hub_tmp,
                    etag_timeout=timeout,
                )
            except Exception as exc:  # network, HTTP and file-system failures
                raise _download_error(repo_file, revision, exc) from exc
            target = staging / task / f"{_HUB_SPLITS[task][split]}.parquet"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(got, target)
        shutil.rmtree(hub_tmp, ignore_errors=True)
    return dest_dir


def _register() -> None:
    from fedrepro.data import sources

    sources.register(
        sources.Source(
            name=NAME,
            kind="classification",
            parse=parse,
            download=lambda dest, timeout=10.0: download(dest, timeout=timeout),
            write_samples=sources.sample_writer("glue"),
            config_key=CONFIG_KEY,
            upstream=f"{GLUE_HUB_ID} @ {GLUE_REVISION}",
            splits=("train", "val", "test"),
            lang="en",
        )
    )


_register()
