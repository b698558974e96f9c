"""Config validation with messages that name the config key and say what is wrong."""

from __future__ import annotations

from pathlib import Path

import yaml

from fedrepro.io import InputError


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
    train = a.get("train") if isinstance(a.get("train"), dict) else {}
    if train.get("prefix_cache", "off") not in ("off", False) and train.get("backbone_dropout", False):
        out.append(
            f"config keys adafedseleckd.train.prefix_cache ({train['prefix_cache']}) and "
            "adafedseleckd.train.backbone_dropout (true) exclude each other: with the backbone's "
            "dropout on the frozen prefix is random at every step and cannot be reused; set "
            "backbone_dropout: false or prefix_cache: off"
        )
    fedsum_parts = (config.get("partitions") or {}).get("fedsum")
    if isinstance(fedsum_parts, dict) and "oracle_sentences" in fedsum_parts:
        out.append(
            "config key partitions.fedsum.oracle_sentences: renamed -- the test-time count is "
            "partitions.fedsum.extract_sentences, the oracle label count "
            "partitions.fedsum.label_sentences (BertSum's 3)"
        )
    return out
