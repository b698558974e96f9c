"""Config validation with messages that name the config key and say what is wrong."""

from __future__ import annotations

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
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        problems.append(f"  config key {key}: {err.message}")
    semantic = _semantic_checks(config)
    problems.extend(f"  {p}" for p in semantic)
    if problems:
        raise InputError(
            f"invalid configuration in {source} (schema {schema_path}):\n" + "\n".join(problems)
        )


def _semantic_checks(config: dict) -> list[str]:
    out = []
    a = config.get("adafedseleckd") or {}
    for name, d in sorted((config.get("data") or {}).items()):
        if isinstance(d, dict) and d.get("source") == "local" and not d.get("local_dir"):
            out.append(f"config key data.{name}.local_dir: required when data.{name}.source is 'local'")
    for name in a.get("backbones", []) if isinstance(a.get("backbones"), list) else []:
        bb = (config.get("backbones") or {}).get(name) or {}
        if bb.get("kind") == "tiny" and "tiny" not in bb:
            out.append(f"config key backbones.{name}.tiny: required when kind is 'tiny'")
    fedsum_parts = (config.get("partitions") or {}).get("fedsum")
    if isinstance(fedsum_parts, dict) and "oracle_sentences" in fedsum_parts:
        out.append(
            "config key partitions.fedsum.oracle_sentences: renamed -- the test-time count is "
            "partitions.fedsum.extract_sentences, the oracle label count "
            "partitions.fedsum.label_sentences (BertSum's 3)"
        )
    return out
