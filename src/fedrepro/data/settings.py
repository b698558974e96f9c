"""The client-split settings of the four papers, enumerated from the config.

A *setting* is a named client split (``adafedseleckd-iid``, ``fedsum-cnndm-a0.1``, …) built from
prepared records of one or more sources by a function of :mod:`fedrepro.data.partition`, per seed.
:func:`settings` lists them (plain Python over the config, so a dry run stays fast) and
:func:`build_manifest` builds one.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from fedrepro.data import partition as P
from fedrepro.io import InputError, read_jsonl

QMSUM_DOMAINS = ("Academic", "Committee", "Product")


def _alpha_name(alpha: float) -> str:
    return "inf" if math.isinf(float(alpha)) else f"{float(alpha):g}"


def fedsum_empty_clients(f: dict) -> dict:
    """How a FedSum Dirichlet split keeps every client non-empty (``partitions.fedsum``):
    ``empty_clients`` (``redraw``, the authors' rule, or ``add_one``) and ``max_redraws``."""
    mode = f.get("empty_clients", "redraw")
    if mode not in P.EMPTY_CLIENTS:
        raise InputError(
            f"partitions.fedsum.empty_clients must be one of {list(P.EMPTY_CLIENTS)}, got {mode!r}"
        )
    limit = f.get("max_redraws", P.DEFAULT_MAX_REDRAWS)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InputError(f"partitions.fedsum.max_redraws must be a positive integer, got {limit!r}")
    return {"empty_clients": mode, "max_redraws": int(limit)}


DEFAULT_FEDSUMM_ALPHA = 0.5
DEFAULT_LENGTH_BUCKETS = 5


def fedsumm_split(s: dict) -> dict:
    """How a FedSUMM N-client split is drawn (``partitions.fedsumm``): ``{}`` for ``split: iid``
    (the default: :func:`fedrepro.data.partition.fedsumm_clients`, and setting parameters as before
    the key existed, so an i.i.d. split is not redrawn), else ``split``, ``alpha`` and
    ``length_buckets`` of :func:`fedrepro.data.partition.fedsumm_length_skew_clients`.  They are part
    of the setting, so the partition rule's params change with them and the split is redrawn."""
    split = s.get("split", "iid")
    if split not in P.FEDSUMM_SPLITS:
        raise InputError(
            f"partitions.fedsumm.split must be one of {list(P.FEDSUMM_SPLITS)}, got {split!r}"
        )
    alpha = s.get("alpha", DEFAULT_FEDSUMM_ALPHA)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (
        math.isfinite(alpha) and alpha > 0
    ):
        raise InputError(f"partitions.fedsumm.alpha must be a finite number > 0, got {alpha!r}")
    buckets = s.get("length_buckets", DEFAULT_LENGTH_BUCKETS)
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 2:
        raise InputError(
            f"partitions.fedsumm.length_buckets must be an integer >= 2, got {buckets!r}"
        )
    if split == "iid":
        return {}
    return {"split": split, "alpha": float(alpha), "length_buckets": int(buckets)}


def settings(config: dict) -> dict[str, dict]:
    """``{setting name: {"sources": [...], "kind": ..., params}}`` for every split in the config."""
    p = config.get("partitions") or {}
    out: dict[str, dict] = {}
    if "qmsum" in (config.get("data") or {}):  # AdaFedSelecKD's main setting needs no parameters
        out["adafedseleckd-domains"] = {"sources": ["qmsum"], "kind": "natural_qmsum"}
    if "adafedseleckd" in p:
        a = p["adafedseleckd"]
        out["adafedseleckd-iid"] = {"sources": ["qmsum"], "kind": "iid", "num_clients": int(a["iid_clients"])}
        out["adafedseleckd-noniid"] = {"sources": ["qmsum"], "kind": "noniid", "sizes": dict(a["noniid_sizes"])}
        out["adafedseleckd-extreme"] = {"sources": ["qmsum", "samsum"], "kind": "natural_plus"}
        out["adafedseleckd-long"] = {"sources": list(a["long_meetings"]), "kind": "natural_sources"}
    if "fedsum" in p:
        f = p["fedsum"]
        for ds in f["datasets"]:
            for alpha in f["alphas"]:
                out[f"fedsum-{ds}-a{_alpha_name(alpha)}"] = {
                    "sources": [ds], "kind": "dirichlet", "alpha": float(alpha),
                    "total": int(f["total"]), "num_clients": int(f["num_clients"]),
                    **fedsum_empty_clients(f),
                }
    if "fedmcp" in p:
        out["fedmcp-crosstask"] = {"sources": ["glue"], "kind": "fedmcp", "tasks": list(p["fedmcp"]["tasks"])}
    if "fedsumm" in p:
        s = p["fedsumm"]
        how = fedsumm_split(s)  # {} for the i.i.d. default
        for corpus in s["corpora"]:
            for n in s["num_clients"]:
                out[f"fedsumm-{corpus}-n{n}"] = {"sources": [corpus], "kind": "fedsumm", "num_clients": int(n), **how}
                # FedSUMM's non-federated regimes over the same N-client split: "single" trains on
                # one client's data (the first client), "all" on the union of every client's data
                out[f"fedsumm-{corpus}-n{n}-single"] = {"sources": [corpus], "kind": "fedsumm_single", "num_clients": int(n), **how}
                out[f"fedsumm-{corpus}-n{n}-all"] = {"sources": [corpus], "kind": "fedsumm_all", "num_clients": int(n), **how}
    return out


def _ids_by(records: list[dict], key: str) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        out[r[key]][r["split"]].append(r["id"])
    return {k: dict(v) for k, v in out.items()}


def _source_ids(recs: dict[str, list[dict]], record_files: dict[str, str], name: str
                ) -> dict[str, list[str]]:
    """``{split: [ids]}`` of source ``name``'s prepared records; a setting that needs a source
    whose records file is missing from the inputs, or holds none of its records, is an
    :class:`InputError` naming the file (it used to surface as a bare ``KeyError: 'csl'``)."""
    if name not in recs:
        raise InputError(
            f"the setting needs the prepared records of source {name!r}, but no records file of "
            f"{name!r} is among its inputs ({sorted(record_files)})"
        )
    by_source = _ids_by(recs[name], "source")
    if name not in by_source:
        raise InputError(
            f"{record_files[name]}: no records of source {name!r} (found "
            f"{sorted(by_source) or 'none'}); the raw copy of {name!r} gave no record -- check "
            f"data.{name}.local_dir and rerun its prepare step"
        )
    return by_source[name]


def _split(by_split: dict[str, list[str]], split: str, name: str, path: str) -> list[str]:
    if not by_split.get(split):
        raise InputError(f"{path}: source {name!r} has no {split} records (splits: "
                         f"{sorted(by_split)}); this setting needs them")
    return by_split[split]


def build_manifest(setting: dict, record_files: dict[str, str], seed: int) -> P.Manifest:
    """Build one setting's manifest ``{client: {split: [ids]}}`` from prepared record files."""
    recs = {name: read_jsonl(path) for name, path in record_files.items()}
    if setting["kind"] in ("natural_qmsum", "iid", "noniid", "natural_plus"):
        _source_ids(recs, record_files, "qmsum")  # present and not empty
    kind = setting["kind"]
    if kind == "natural_qmsum":
        return P.natural(_ids_by(recs["qmsum"], "client"))
    if kind == "iid":
        return P.iid_balanced(_ids_by(recs["qmsum"], "client"), setting["num_clients"], seed)
    if kind == "noniid":
        return P.noniid_balanced(_ids_by(recs["qmsum"], "client"), setting["sizes"], seed)
    if kind == "natural_plus":  # the three QMSum domains plus one client per extra source
        ids = _ids_by(recs["qmsum"], "client")
        for name in setting["sources"][1:]:
            ids[name] = _source_ids(recs, record_files, name)
        return P.natural(ids)
    if kind == "natural_sources":
        ids = {}
        for name in setting["sources"]:
            ids[name] = _source_ids(recs, record_files, name)
        return P.natural(ids)
    if kind == "dirichlet":
        (name,) = setting["sources"]
        by_split = _source_ids(recs, record_files, name)
        clients = P.fedsum_scarcity(
            _split(by_split, "train", name, record_files[name]), setting["total"], setting["num_clients"], setting["alpha"], seed,
            setting.get("empty_clients", "redraw"), int(setting.get("max_redraws", P.DEFAULT_MAX_REDRAWS)),
        )
        return {c: {"train": ids} for c, ids in clients.items()}
    if kind == "fedmcp":
        by_task = _ids_by(recs["glue"], "task")
        missing = [t for t in setting["tasks"] if t not in by_task]
        if missing:
            raise InputError(f"FedMCP split needs GLUE tasks {missing}, not in the prepared GLUE records")
        return P.fedmcp_cross_task({t: by_task[t] for t in setting["tasks"]}, seed)
    if kind in ("fedsumm", "fedsumm_single", "fedsumm_all"):
        (name,) = setting["sources"]
        by_split = _source_ids(recs, record_files, name)
        if setting.get("split", "iid") == "dirichlet_length":
            lengths = {r["id"]: len(r["input"]) for r in recs[name] if r.get("source") == name}
            clients = P.fedsumm_length_skew_clients(
                by_split, lengths, setting["num_clients"], seed, name, float(setting["alpha"]),
                int(setting["length_buckets"]),
            )
        else:
            clients = P.fedsumm_clients(by_split, setting["num_clients"], seed, name)
        if kind == "fedsumm_single":
            first = sorted(clients)[0]
            return {first: clients[first]}
        if kind == "fedsumm_all":
            union: dict[str, list[str]] = defaultdict(list)
            for splits in clients.values():
                for split, ids in splits.items():
                    union[split].extend(ids)
            return {f"{name}-all": {k: sorted(v) for k, v in union.items()}}
        return clients
    raise InputError(f"unknown partition kind {kind!r}")


def shared_splits(setting: dict, record_files: dict[str, str]) -> dict[str, list[str]]:
    """Splits every client is evaluated on (FedSum: the dataset's own validation and test sets)."""
    if setting["kind"] != "dirichlet":
        return {}
    (name,) = setting["sources"]
    by_split = _source_ids({name: read_jsonl(record_files[name])}, record_files, name)
    return {s: sorted(v) for s, v in by_split.items() if s != "train"}


def write_setting(setting_name: str, setting: dict, record_files: dict[str, str], seed: int,
                  out_path: str) -> P.Manifest:
    """Build and write one setting's manifest (clients, shared evaluation splits, parameters)."""
    manifest = build_manifest(setting, record_files, seed)
    meta = {"setting": setting_name, "seed": seed, **setting,
            "shared": shared_splits(setting, record_files)}
    P.write_manifest(manifest, out_path, meta)
    return manifest


def records_path(source: str) -> str:
    return str(Path("results") / "data" / source / "records.jsonl")
