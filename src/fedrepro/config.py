"""Config validation with messages that name the config key and say what is wrong."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import yaml

from fedrepro.io import InputError


def canonical(value: Any) -> Any:
    """``value`` with every mapping's keys in sorted order, recursively: the form of every rule's
    ``params`` (rules/*.smk).

    Snakemake decides whether a job's params changed by comparing ``repr(value)`` with the one it
    recorded, and a dict's ``repr`` follows insertion order: the same config saved with its keys in
    another order (``yaml.safe_dump`` sorts them) made every job look changed (issue 17, item 7).
    Lists keep their order (it can mean something: the order of clients is their partition ids).
    Numbers need no rewriting: YAML parses every spelling of a float (``0.003``, ``3.0e-3``,
    ``0.0030``) to the same value, whose ``repr`` is canonical; ``1`` and ``1.0`` stay different,
    since an int and a float are different values to the code (a count, a ``range``) and in file
    names (``alpha~1`` vs ``alpha~1.0``).  The job receives exactly this canonical value, so what
    Snakemake recorded is what the job computed from.
    """
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value, key=lambda k: (type(k).__name__, str(k)))}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, tuple):
        return tuple(canonical(v) for v in value)
    return value


def validate_config(config: dict, schema_path: str | Path, source: str = "the config") -> None:
    """Validate ``config`` against the JSON schema; raise :class:`InputError` listing every problem.

    Each message names the dotted config key, e.g.
    ``adafedseleckd.train.lr: 'fast' is not of type 'number'``.
    """
    stat = Path(schema_path).stat()
    validator = _validator(str(Path(schema_path).resolve()), stat.st_mtime_ns, stat.st_size)
    problems = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        problems.append(f"  config key {key}: {err.message}")
    semantic = _semantic_checks(config) if isinstance(config, dict) else []
    semantic.extend(
        f"config key {key}: {value!r} is not a number (NaN)" for key, value in _nan_keys(config)
    )
    problems.extend(f"  {p}" for p in semantic)
    if problems:
        raise InputError(
            f"invalid configuration in {source} (schema {schema_path}):\n" + "\n".join(problems)
        )


@functools.lru_cache(maxsize=4)
def _validator(schema_path: str, mtime_ns: int, size: int):
    """The schema's validator, parsed once per schema file version (parsing the YAML schema
    takes ~10x longer than validating a config)."""
    import jsonschema

    return jsonschema.Draft202012Validator(yaml.safe_load(Path(schema_path).read_text()))


def _nan_keys(obj, prefix: str = ""):
    """``(dotted key, value)`` of every float that is NaN (YAML ``.nan``): JSON-schema bounds do
    not catch it (every comparison with NaN is false). ``.inf`` is left to the schema's bounds
    (FedSum's ``alpha: .inf`` is the uniform split)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nan_keys(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nan_keys(v, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(obj, float) and math.isnan(obj):
        yield prefix or "(top level)", obj


def _mapping(value) -> dict:
    """``value`` if it is a mapping, else ``{}`` (its wrong type is the schema's error to report)."""
    return value if isinstance(value, dict) else {}


def _semantic_checks(config: dict) -> list[str]:
    out = []
    a = _mapping(config.get("adafedseleckd"))
    for name, d in sorted(_mapping(config.get("data")).items()):
        if isinstance(d, dict) and d.get("source") == "local" and not d.get("local_dir"):
            out.append(f"config key data.{name}.local_dir: required when data.{name}.source is 'local'")
    for name in a.get("backbones", []) if isinstance(a.get("backbones"), list) else []:
        bb = _mapping(_mapping(config.get("backbones")).get(name)) if isinstance(name, str) else {}
        if bb.get("kind") == "tiny" and "tiny" not in bb:
            out.append(f"config key backbones.{name}.tiny: required when kind is 'tiny'")
    train = _mapping(a.get("train"))
    if train.get("prefix_cache", "off") not in ("off", False) and train.get("backbone_dropout", False):
        out.append(
            f"config keys adafedseleckd.train.prefix_cache ({train['prefix_cache']}) and "
            "adafedseleckd.train.backbone_dropout (true) exclude each other: with the backbone's "
            "dropout on the frozen prefix is random at every step and cannot be reused; set "
            "backbone_dropout: false or prefix_cache: off"
        )
    fedsum_parts = _mapping(config.get("partitions")).get("fedsum")
    if isinstance(fedsum_parts, dict) and "oracle_sentences" in fedsum_parts:
        out.append(
            "config key partitions.fedsum.oracle_sentences: renamed -- the test-time count is "
            "partitions.fedsum.extract_sentences, the oracle label count "
            "partitions.fedsum.label_sentences (BertSum's 3)"
        )
    return out
