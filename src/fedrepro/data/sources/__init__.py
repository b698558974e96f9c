"""Registry of data sources: ``fedrepro.data.sources.get(name).parse(path)`` returns normalized records.

Each source has one module in this package, ``fedrepro.data.sources.<name>``, with its download and
its parser (shared code in the private ``_english``, ``_meetings`` and ``_chinese`` modules); it
calls :func:`register` at import time with a :class:`Source`.  The generators of the committed
samples live apart, in :mod:`fedrepro.data.samples`.  Records are normalized as

* seq2seq (summarization): ``{id, source, client, split, input, target, meta}``
* classification (GLUE): ``{id, source, task, split, text_a, text_b, label, meta}``

``parse(path)`` takes one split file (or, where the raw release is a folder, that folder) and
returns a list of records; malformed records raise :class:`fedrepro.io.InputError` naming the
file, the line or record id and the field (or are skipped and counted where the config says so),
and so does a file that holds no record at all (an empty file is an error, not 0 records).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedrepro.io import InputError

# module that registers each source (imported lazily by get())
SOURCE_MODULES: dict[str, str] = {
    "qmsum": "fedrepro.data.sources.qmsum",
    "samsum": "fedrepro.data.sources.samsum",
    "cnndm": "fedrepro.data.sources.cnndm",
    "pubmed": "fedrepro.data.sources.pubmed",
    "wikihow": "fedrepro.data.sources.wikihow",
    "reddit_tifu": "fedrepro.data.sources.reddit_tifu",
    "glue": "fedrepro.data.sources.glue",
    "csl": "fedrepro.data.sources.csl",
    "nlpcc2017": "fedrepro.data.sources.nlpcc2017",
    "lcsts": "fedrepro.data.sources.lcsts",
    "thucnews": "fedrepro.data.sources.thucnews",
    "education": "fedrepro.data.sources.education",
    "ami": "fedrepro.data.sources.ami",
    "icsi": "fedrepro.data.sources.icsi",
    "elitr": "fedrepro.data.sources.elitr",
    "meetingbank": "fedrepro.data.sources.meetingbank",
}


@dataclasses.dataclass(frozen=True)
class Source:
    """One dataset source.

    Attributes
    ----------
    name : registry name (``SOURCE_MODULES`` key)
    kind : ``"seq2seq"`` or ``"classification"``
    parse : ``parse(path, skip_malformed=False) -> list[dict]`` for one split file/folder
    download : ``download(dest_dir, timeout) -> Path``; fails within ``timeout`` seconds offline with
        a message naming the dataset, the URL or hub id and ``config_key``; leaves nothing behind
    write_samples : ``write_samples(out_dir) -> None`` writes the committed sample in the raw schema
    config_key : where a user points at a local copy (``data.<name>.local_dir``)
    upstream : hub id or URL and the pinned revision, for provenance and messages
    splits : the raw split names
    lang : ``"en"`` or ``"zh"``
    whole_folder : the release is a folder tree that ``parse`` reads at once (ELITR's meeting
        folders, THUCNews' one-file-per-article categories) instead of file by file
    """

    name: str
    kind: str
    parse: Callable[..., list[dict]]
    download: Callable[..., Path]
    write_samples: Callable[..., None]
    config_key: str
    upstream: str
    splits: tuple[str, ...] = ("train", "val", "test")
    lang: str = "en"
    whole_folder: bool = False


SPLIT_ALIASES: dict[str, str] = {
    "train": "train",
    "training": "train",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "dev": "val",
    "test": "test",
    "testing": "test",
    "test2": "test",  # ELITR's second test set
}
"""Raw split names of the releases → the normalized split of a record."""


def split_token(name: str) -> str | None:
    """The first word of ``name`` (cut at non-alphanumerics) that names a split, e.g. ``test2`` in
    ``meeting_en_test2_001``; ``None`` if none does.  ``SPLIT_ALIASES[token]`` normalizes it."""
    for token in re.split(r"[^a-z0-9]+", name.lower()):
        if token in SPLIT_ALIASES:
            return token
    return None


class Records(list):
    """The records ``parse`` returns; ``skipped`` lists ``(record id or line, reason)`` for the
    malformed records dropped when the caller asked for ``skip_malformed=True``."""

    def __init__(self, records=(), skipped=None) -> None:
        super().__init__(records)
        self.skipped: list[tuple[str, str]] = list(skipped or [])


_REGISTRY: dict[str, Source] = {}


def _nonempty(parse: Callable[..., list[dict]], name: str) -> Callable[..., list[dict]]:
    """``parse`` that raises :class:`InputError` for a file (or folder) that yields no record and
    skips none: an empty file, one of blank lines only, or an empty JSON list. Without this check
    an empty raw file gave 0 records silently and the setting built from them failed much later
    (``KeyError: 'csl'`` in the partition step)."""

    @functools.wraps(parse)
    def checked(path, *args, **kwargs):
        records = parse(path, *args, **kwargs)
        if not records and not getattr(records, "skipped", None):
            raise InputError(
                f"{path}: no {name} records (the file is empty or holds no record); check that it "
                f"is the {name} split file you meant, or remove it from the raw folder"
            )
        return records

    return checked


def register(source: Source) -> Source:
    """Add ``source`` to the registry; its ``parse`` is wrapped to reject inputs with no record."""
    if source.name not in SOURCE_MODULES:
        raise ValueError(f"add {source.name!r} to SOURCE_MODULES before registering it")
    source = dataclasses.replace(source, parse=_nonempty(source.parse, source.name))
    _REGISTRY[source.name] = source
    return source


def register_seq2seq(
    name: str,
    parse: Callable[..., Records],
    download: Callable[..., Path],
    write_samples: Callable[..., Any],
    *,
    upstream: str,
    splits: tuple[str, ...] | list[str],
    lang: str,
    config_key: str | None = None,
    whole_folder: bool = False,
) -> Source:
    """Register a summarization source (``kind: seq2seq``); ``config_key`` (the key of a local
    copy) defaults to ``data.<name>.local_dir``."""
    return register(
        Source(
            name=name,
            kind="seq2seq",
            parse=parse,
            download=download,
            write_samples=write_samples,
            config_key=config_key or f"data.{name}.local_dir",
            upstream=upstream,
            splits=tuple(splits),
            lang=lang,
            whole_folder=whole_folder,
        )
    )


def get(name: str) -> Source:
    """The registered source ``name`` (importing its module on first use)."""
    if name not in SOURCE_MODULES:
        raise InputError(f"unknown data source {name!r}; known: {sorted(SOURCE_MODULES)}")
    if name not in _REGISTRY:
        importlib.import_module(SOURCE_MODULES[name])
    if name not in _REGISTRY:
        raise InputError(f"module {SOURCE_MODULES[name]} did not register source {name!r}")
    return _REGISTRY[name]


def names() -> list[str]:
    return sorted(SOURCE_MODULES)


def sample_writer(module: str, function: str = "write_samples") -> Callable[..., Any]:
    """``fedrepro.data.samples.<module>.<function>``, the generator of a source's committed samples,
    imported on first call (the generators use the parsers' constants, so a source module names its
    generator for :attr:`Source.write_samples` instead of importing it)."""
    target = f"fedrepro.data.samples.{module}"

    def write_samples(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(target), function)(*args, **kwargs)

    write_samples.__name__ = write_samples.__qualname__ = function
    write_samples.__doc__ = f"Calls ``{target}.{function}`` (see there)."
    return write_samples


def train_records(name: str, folder: str | Path) -> int:
    """How many ``train`` records the real parser of source ``name`` reads from a raw folder
    (each file parsed on its own: a folder may hold several splits)."""
    src = get(name)
    return sum(
        sum(1 for r in src.parse(str(f)) if r.get("split") == "train")
        for f in sorted(Path(folder).iterdir()) if f.is_file()
    )


def write_samples_for(name: str, out_dir: str | Path, seed: int = 0, scale: int = 1,
                      min_train: int = 0) -> int:
    """Generated raw-schema samples of ``name`` at ``scale`` times the committed size, or at the
    smallest larger scale whose train split holds ``min_train`` records (a rehearsal's FedSum
    partition is drawn at the paper's 2,000 documents).  The records per copy come from the
    parser's count of the committed (``scale=1``) sample.  Returns the scale used."""
    import math
    import tempfile

    from fedrepro.data.samples import check_scale

    scale = check_scale(scale)
    if min_train > 0:
        with tempfile.TemporaryDirectory() as tmp:
            get(name).write_samples(tmp, seed=seed, scale=1)
            per_copy = train_records(name, tmp)
        if per_copy < 1:
            raise InputError(f"source {name!r}: its generated sample has no train records; it cannot "
                             f"hold the {min_train} the rehearsal's partition needs")
        scale = max(scale, math.ceil(min_train / per_copy))
    get(name).write_samples(str(out_dir), seed=seed, scale=scale)
    return scale
