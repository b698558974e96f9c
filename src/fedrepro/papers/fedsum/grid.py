"""The FedSum grid for the Snakemake workflow (``rules/fedsum.smk``): settings, cells, targets.

Plain Python over the config (no file inspection), so a dry run of the paper grid stays fast.

* A *setting* is a client split: the data layer's ``fedsum-<dataset>-a<α>`` (``partitions.fedsum``:
  ``total`` examples over ``num_clients`` clients, Dirichlet quantity skew), or, for Fig. 3's
  other data quantities, ``fedsum-<dataset>-a<α>-n<total>`` (built by ``fedsum_scaling_manifest``
  with the data layer's own partition function).
* A *cell* is one run: (setting, method, seed) -> ``results/fedsum/<setting>/<backbone>/<method>/seed~<seed>``.
  The method directory is the method name, or ``FedSum-lam<λ>`` for Fig. 5's λ sweep when λ is
  not ``fedsum.method.lam``.
* Targets: ``table1`` (CNN/DM), ``table2`` (PubMed), ``table_wikihow``, ``table_reddit``,
  ``table3`` (α sweep on CNN/DM), ``table4`` (ablation), ``figure3`` (data quantity), ``figure4``
  (positions vs the Oracle), ``figure5`` (λ sweep).
"""

from __future__ import annotations

import math
import re

from fedrepro.data.settings import fedsum_empty_clients
from fedrepro.grid import rehearsal_cell
from fedrepro.io import InputError
from fedrepro.models.backbones import builds_locally
from fedrepro.precision import precision_cell

RESULTS = "results"
BACKBONE = "bert-base"
BERT_HUB_ID = "google-bert/bert-base-uncased"

TABLE_DATASETS = {
    "table1": "cnndm",
    "table2": "pubmed",
    "table_wikihow": "wikihow",
    "table_reddit": "reddit_tifu",
}
TARGETS = {
    "table1": "table",
    "table2": "table",
    "table_wikihow": "table",
    "table_reddit": "table",
    "table3": "table",
    "table4": "table",
    "figure3": "figure",
    "figure4": "figure",
    "figure5": "figure",
}
SWEEP_DATASET = "cnndm"  # Table 3, Table 4, Fig. 3 and Fig. 5 are on CNN/DM
ABLATION = ["FedAvg", "FedSum-depth", "FedSum"]  # Table 4's rows
ROUGE_SCORERS = ("rouge", "rouge-score")  # fedrepro.metrics.rouge.ROUGE_SCORERS (not imported: fast parse)


def fedsum_cfg(config: dict) -> dict:
    try:
        return config["fedsum"]
    except KeyError:
        raise InputError("config has no 'fedsum' section (see config/config.yaml)") from None


def _partitions(config: dict) -> dict:
    try:
        return config["partitions"]["fedsum"]
    except KeyError:
        raise InputError(
            "config has no partitions.fedsum section (the FedSum client splits)"
        ) from None


def alpha_name(alpha: float) -> str:
    """As the data layer names settings: ``0.1``, ``8``, ``inf``."""
    return "inf" if math.isinf(float(alpha)) else f"{float(alpha):g}"


def seeds(config: dict) -> list[int]:
    f = fedsum_cfg(config)
    out = list(f.get("seeds") or config["seeds"])
    split = list((config.get("partitions") or {}).get("seeds", config["seeds"]))
    missing = [s for s in out if s not in split]
    if missing:
        raise InputError(
            f"fedsum.seeds {missing} have no client split: add them to partitions.seeds "
            f"(each FedSum run uses the split drawn with its own seed)"
        )
    return out


# -- settings ----------------------------------------------------------------------------------
def setting_name(config: dict, dataset: str, alpha: float, total: int | None = None) -> str:
    p = _partitions(config)
    if dataset not in p["datasets"]:
        raise InputError(f"FedSum needs dataset {dataset!r} in partitions.fedsum.datasets")
    if alpha_name(alpha) not in {alpha_name(a) for a in p["alphas"]}:
        raise InputError(
            f"FedSum needs Dir = {alpha} in partitions.fedsum.alphas (the client splits)"
        )
    base = f"fedsum-{dataset}-a{alpha_name(alpha)}"
    if total is None or int(total) == int(p["total"]):
        return base
    if int(total) < int(p["num_clients"]):
        raise InputError(
            f"fedsum.figure3_totals: {total} examples cannot cover {p['num_clients']} clients"
        )
    return f"{base}-n{int(total)}"


_SETTING = re.compile(r"^fedsum-(?P<dataset>[a-z_]+)-a(?P<alpha>inf|[0-9.]+)(?:-n(?P<total>\d+))?$")


def parse_setting(config: dict, setting: str) -> dict:
    m = _SETTING.match(setting)
    if not m:
        raise InputError(f"not a FedSum setting name: {setting!r}")
    p = _partitions(config)
    alpha = math.inf if m["alpha"] == "inf" else float(m["alpha"])
    return {
        "dataset": m["dataset"],
        "alpha": alpha,
        "alpha_name": m["alpha"],
        "total": int(m["total"]) if m["total"] else int(p["total"]),
        "scaled": bool(m["total"]),
    }


def manifest_path(config: dict, setting: str, seed: int | str) -> str:
    """The data layer's manifest, or ours for Fig. 3's other data quantities."""
    if parse_setting(config, setting)["scaled"]:
        return f"{RESULTS}/fedsum/partitions/{setting}/seed~{seed}/manifest.json"
    return f"{RESULTS}/partitions/{setting}/seed~{seed}/manifest.json"


def scaled_setting(config: dict, setting: str) -> dict:
    """The data-layer setting dict of a Fig. 3 quantity (for ``settings.write_setting``)."""
    s = parse_setting(config, setting)
    return {
        "sources": [s["dataset"]],
        "kind": "dirichlet",
        "alpha": float(s["alpha"]),
        "total": s["total"],
        "num_clients": int(_partitions(config)["num_clients"]),
        **fedsum_empty_clients(_partitions(config)),
    }


def data_dir(setting: str, seed: int | str) -> str:
    return f"{RESULTS}/fedsum/data/{setting}/seed~{seed}"


def clients(config: dict) -> list[str]:
    """``client01`` … as :func:`fedrepro.data.partition.fedsum_scarcity` names them."""
    return [f"client{k + 1:02d}" for k in range(int(_partitions(config)["num_clients"]))]


# -- methods -----------------------------------------------------------------------------------
def default_lam(config: dict) -> float:
    return float((fedsum_cfg(config).get("method") or {}).get("lam", 0.5))


def method_dir(config: dict, method: str, lam: float | None = None) -> str:
    if lam is None or math.isclose(float(lam), default_lam(config)):
        return method
    return f"{method}-lam{float(lam):g}"


def parse_method_dir(config: dict, name: str) -> tuple[str, float]:
    m = re.match(r"^(?P<method>.+?)-lam(?P<lam>[0-9.]+)$", name)
    if m:
        return m["method"], float(m["lam"])
    return name, default_lam(config)


SELECTION_RULES = ("uniform", "proportional")
AUTHORS_CLIENT_SELECTION = {
    "default": "uniform",
    "FedProx": "proportional",
    "FedSum": "proportional",
    "FedSum-depth": "proportional",
    "FedSum-breadth": "proportional",
}
"""The FedSum authors' per-round client selection (``algorithm/client_selection.py``): their FedSum
(all its variants: ``FederatedSum*.py``) and FedProx call it with ``style="FedProx"`` --
``np.random.choice(K, 4, replace=False, p=n_i/n)`` --, every other baseline with ``"FedAvg"``
(uniform without replacement).  ``fedsum.client_selection`` in the config replaces this table."""


def client_selection(config: dict, method: str) -> str:
    """``fedsum.client_selection``'s rule for ``method``: its own entry, else ``default``
    (``uniform`` if none); no key at all: the authors' table :data:`AUTHORS_CLIENT_SELECTION`."""
    from fedrepro.papers.fedsum.task import METHODS

    table = fedsum_cfg(config).get("client_selection")
    if table is None:
        table = AUTHORS_CLIENT_SELECTION
    if not isinstance(table, dict):
        raise InputError(
            f"config key fedsum.client_selection must map methods (and 'default') to one of "
            f"{list(SELECTION_RULES)}, got {table!r}"
        )
    for key, rule in table.items():
        if key != "default" and (key not in METHODS or key == "Separate"):
            raise InputError(
                f"config key fedsum.client_selection.{key}: not a federated FedSum method "
                f"(use 'default' or one of {[m for m in METHODS if m != 'Separate']})"
            )
        if rule not in SELECTION_RULES:
            raise InputError(
                f"config key fedsum.client_selection.{key} must be one of {list(SELECTION_RULES)}, "
                f"got {rule!r}"
            )
    return table.get(method, table.get("default", "uniform"))


def _need(config: dict, key: str, methods: list[str], target: str) -> None:
    have = set(fedsum_cfg(config).get(key) or [])
    missing = [m for m in methods if m not in have]
    if missing:
        raise InputError(f"fedsum_{target} needs {missing} in fedsum.{key}")


# -- sentences and scoring ---------------------------------------------------------------------
def extract_sentences(config: dict, dataset: str) -> int:
    """n, the sentences BERTSUM extracts per test document (``partitions.fedsum.extract_sentences``;
    the oracle's label count is ``label_sentences``, a separate number)."""
    counts = _partitions(config).get("extract_sentences") or {}
    if dataset not in counts:
        raise InputError(
            f"config key partitions.fedsum.extract_sentences has no count for {dataset!r} "
            f"(sentences extracted per test document; the FedSum code: cnndm 3, pubmed 6, "
            f"wikihow 4, reddit_tifu 3)"
        )
    return int(counts[dataset])


def short_sentence_tokens(config: dict) -> int:
    """BertSum's short-sentence filter (``partitions.fedsum.short_sentence_tokens``, default 5):
    the same threshold drops sentences from the oracle labels and from the model's input."""
    from fedrepro.data.oracle import SHORT_SENTENCE_TOKENS

    return int(_partitions(config).get("short_sentence_tokens", SHORT_SENTENCE_TOKENS))


def rouge_scorer(config: dict) -> str:
    """``fedsum.eval.rouge_scorer``: ``rouge`` (the authors' scorer, default) or ``rouge-score``."""
    name = (fedsum_cfg(config).get("eval") or {}).get("rouge_scorer", "rouge")
    if name not in ROUGE_SCORERS:
        raise InputError(
            f"config key fedsum.eval.rouge_scorer must be one of {list(ROUGE_SCORERS)}, got {name!r}"
        )
    return name


# -- cells and targets -------------------------------------------------------------------------
def cell_dir(setting: str, method: str, seed: int | str) -> str:
    return f"{RESULTS}/fedsum/{setting}/{BACKBONE}/{method}/seed~{seed}"


def target_runs(config: dict, target: str) -> list[dict]:
    """The runs a target reads: ``{setting, method (dir name), label, ...}`` per seed."""
    f = fedsum_cfg(config)
    alpha = float(f["alpha"])
    runs: list[dict] = []
    if target in TABLE_DATASETS:
        ds = TABLE_DATASETS[target]
        if ds not in f["datasets"]:
            raise InputError(f"fedsum_{target} needs {ds!r} in fedsum.datasets")
        runs = [{"setting": setting_name(config, ds, alpha), "method": m} for m in f["methods"]]
    elif target == "table3":
        runs = [
            {"setting": setting_name(config, SWEEP_DATASET, a), "method": m, "alpha": float(a)}
            for a in f["table3_alphas"]
            for m in f["methods"]
        ]
    elif target == "table4":
        _need(config, "methods", ["FedAvg", "FedSum"], target)
        _need(config, "ablation", ["FedSum-depth"], target)
        runs = [
            {"setting": setting_name(config, SWEEP_DATASET, alpha), "method": m} for m in ABLATION
        ]
    elif target == "figure3":
        _need(config, "methods", ["FedAvg", "FedSum"], target)
        runs = [
            {
                "setting": setting_name(config, SWEEP_DATASET, a, n),
                "method": m,
                "alpha": float(a),
                "total": int(n),
            }
            for a in (alpha, float(f["uniform_alpha"]))
            for n in f["figure3_totals"]
            for m in ("FedAvg", "FedSum")
        ]
    elif target == "figure4":
        _need(config, "methods", ["FedAvg", "FedSum"], target)
        runs = [
            {"setting": setting_name(config, ds, alpha), "method": m, "dataset": ds}
            for ds in f["figure4_datasets"]
            for m in ("FedAvg", "FedSum")
        ]
    elif target == "figure5":
        _need(config, "methods", ["FedSum"], target)
        runs = [
            {
                "setting": setting_name(config, SWEEP_DATASET, a),
                "method": method_dir(config, "FedSum", lam),
                "alpha": float(a),
                "lam": float(lam),
            }
            for a in (alpha, float(f["uniform_alpha"]))
            for lam in f["figure5_lambdas"]
        ]
    else:
        raise InputError(f"unknown FedSum target {target!r}; known: {sorted(TARGETS)}")
    return [
        dict(r, seed=int(s), cell=cell_dir(r["setting"], r["method"], s))
        for r in runs
        for s in seeds(config)
    ]


def target_cells(config: dict, target: str) -> list[str]:
    return list(dict.fromkeys(r["cell"] for r in target_runs(config, target)))


def all_cells(config: dict) -> list[str]:
    return list(dict.fromkeys(c for t in TARGETS for c in target_cells(config, t)))


def all_settings(config: dict) -> list[str]:
    return sorted({r["setting"] for t in TARGETS for r in target_runs(config, t)})


def method_dirs(config: dict) -> list[str]:
    return sorted({r["method"] for t in TARGETS for r in target_runs(config, t)})


def target_outputs(target: str) -> list[str]:
    if TARGETS[target] == "table":
        return [f"{RESULTS}/tables/fedsum_{target}.{ext}" for ext in ("csv", "md", "tex")]
    return [f"{RESULTS}/figures/fedsum_{target}.{ext}" for ext in ("png", "csv")]


def make_fedsum_cell(config: dict, setting: str, method_name: str, seed: int | str) -> dict:
    """The full, JSON-able description of one FedSum run (what its config hash covers): only the
    hyperparameters its method uses, so changing e.g. FedProx's μ reruns FedProx alone."""
    from fedrepro.papers.fedsum.task import BASELINES, VARIANTS, check_method

    f = fedsum_cfg(config)
    s = parse_setting(config, setting)
    method, lam = parse_method_dir(config, method_name)
    check_method(method)
    names = clients(config)
    folder = data_dir(setting, seed)
    train = dict(f["train"])
    cell = {
        "paper": "fedsum",
        "scale": config["scale"],
        "backbone": BACKBONE,
        "backbone_dir": f"{RESULTS}/backbones/{BACKBONE}",
        "method": method,
        "seed": int(seed),
        "setting": setting,
        "dataset": s["dataset"],
        "alpha": s["alpha_name"],
        "total": s["total"],
        "clients": names,
        "eval_clients": names,
        "client_data": {c: f"{folder}/clients/{c}" for c in names},
        "test_file": f"{folder}/test.jsonl",
        "extract_sentences": extract_sentences(config, s["dataset"]),
        "short_sentence_tokens": short_sentence_tokens(config),
        "rouge_scorer": rouge_scorer(config),
        "block_trigrams": bool(f.get("block_trigrams", True)),
        "report_round": f.get("report_round", "best_rr1"),
        "train": train,
        "clients_per_round": int(f.get("clients_per_round") or len(names)),
        "eval_batch_size": int(f["eval"]["batch_size"]),
        "save_models": f.get("save_models", "global"),
        "threads": int(f["threads_per_cell"]),
        "engine": f.get("engine", "simulation"),
        "device": f.get("device", "auto"),
        **precision_cell(f, "fedsum"),  # only when not fp32: fedrepro.precision
        "gpus_per_client": float(f.get("gpus_per_client", 0.0)),
        "keep_round_checkpoints": bool(f.get("keep_round_checkpoints", False)),
        "round_timeout_s": float(f.get("round_timeout_s", 3600)),
        "out_dir": cell_dir(setting, method_name, seed),
        **rehearsal_cell(config),
    }
    if cell["clients_per_round"] > len(names):
        raise InputError(
            f"fedsum.clients_per_round = {cell['clients_per_round']} > {len(names)} clients "
            f"(partitions.fedsum.num_clients)"
        )
    if method != "Separate":  # Separate trains every client every round
        cell["client_selection"] = client_selection(config, method)
    if method in VARIANTS:
        cell["fedsum"] = {**dict(f.get("method") or {}), "lam": float(lam)}
    elif method_name != method:
        raise InputError(f"{method_name}: a λ sweep applies to FedSum variants only")
    b = dict(f.get("baselines") or {})
    keys = {
        "FedProx": ["mu"],
        "FedProto": ["fedproto_lambda"],
        "SCAFFOLD": ["scaffold_global_lr"],
        "FedDC": ["daisy_period", "aggregation_period"],
    }.get(method, [])
    if method in BASELINES and keys:
        cell["baselines"] = {k: b[k] for k in keys if k in b}
    return cell


# -- backbone ----------------------------------------------------------------------------------
def bert_settings(config: dict) -> dict:
    """``backbones.bert-base`` over the defaults (the hub checkpoint of BERTSUM)."""
    user = dict((config.get("backbones") or {}).get(BACKBONE) or {})
    user.pop("resources", None)
    merged = {
        "name": BACKBONE,
        "kind": "hub",
        "hub_id": BERT_HUB_ID,
        "revision": "main",
        "local_dir": None,
        **user,
    }
    if merged["kind"] not in ("hub", "tiny", "shape"):
        raise InputError(
            f"config key backbones.{BACKBONE}.kind must be 'hub', 'tiny' or 'shape', "
            f"got {merged['kind']!r}"
        )
    if merged["kind"] == "tiny" and not merged.get("tiny"):
        raise InputError(f"config key backbones.{BACKBONE}.tiny is required when kind is 'tiny'")
    return merged


def bert_train_files(config: dict) -> list[str]:
    """Text the tiny (or shape) BERT's WordPiece vocabulary is trained on (the FedSum datasets'
    training records); none for the hub checkpoint."""
    if not builds_locally(bert_settings(config)):
        return []
    return [f"{RESULTS}/data/{ds}/records.jsonl" for ds in fedsum_cfg(config)["datasets"]]


# -- report inputs -----------------------------------------------------------------------------
def report_options(config: dict, target: str) -> dict:
    """What the report of ``target`` needs besides the scores (plain JSON for ``params``)."""
    f = fedsum_cfg(config)
    opts: dict = {"alpha": float(f["alpha"])}
    if target in TABLE_DATASETS:
        opts["dataset"] = TABLE_DATASETS[target]
    if target == "table3":
        opts["alphas"] = [float(a) for a in f["table3_alphas"]]
    if target == "figure4":
        runs = target_runs(config, target)
        opts["oracle"] = {
            ds: f"{RESULTS}/data/{ds}/oracle_labels.jsonl" for ds in f["figure4_datasets"]
        }
        opts["tests"] = {
            ds: sorted(
                {
                    f"{data_dir(r['setting'], r['seed'])}/test.jsonl"
                    for r in runs
                    if r["dataset"] == ds
                }
            )
            for ds in f["figure4_datasets"]
        }
        opts["bins"] = int(f.get("figure4_positions", 10))
    return opts


def target_files(config: dict, target: str, name: str) -> list[str]:
    """``<cell>/<name>`` of every cell a table or figure reads (its Snakemake inputs)."""
    return [f"{cell}/{name}" for cell in target_cells(config, target)]


def dataset_file(config: dict, setting: str, name: str) -> str:
    """A prepared file (``records.jsonl``, ``oracle_labels.jsonl``) of the setting's dataset."""
    return f"results/data/{parse_setting(config, setting)['dataset']}/{name}"


def figure_extra_inputs(config: dict, target: str) -> list[str]:
    """Fig. 4 also reads the oracle labels and the test sets (for the Oracle histogram)."""
    return figure4_inputs(config) if target == "figure4" else []


def figure4_inputs(config: dict) -> list[str]:
    """The oracle files and data folders Fig. 4's Oracle histogram reads."""
    runs = target_runs(config, "figure4")
    f = fedsum_cfg(config)
    return [f"{RESULTS}/data/{ds}/oracle_labels.jsonl" for ds in f["figure4_datasets"]] + sorted(
        {data_dir(r["setting"], r["seed"]) for r in runs}
    )


def wildcard_pattern(values: list[str]) -> str:
    """An alternation matching exactly ``values`` (escaped), for ``wildcard_constraints``."""
    return "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True)) if values else "^$"


# -- rows: one job trains every method of a table setting (demo) -------------------------------
CELL_FILES = (
    "adapters.safetensors",
    "train_log.json",
    "provenance.json",
    "scores.json",
    "predictions.jsonl",
)


def rows_enabled(config: dict) -> bool:
    """``fedsum.cells_per_job``: ``cell`` -- one job per run (paper scale: every run is a GPU/CPU
    job of its own); ``row`` -- one job per (setting, seed) trains all of ``fedsum.methods`` in
    one process (demo scale: dozens of sub-second runs, where starting Python, torch,
    transformers and Flower -- about 3 s -- would cost more than the training).  Each run keeps
    its own folder, checkpoints and outputs either way."""
    mode = fedsum_cfg(config).get("cells_per_job", "cell")
    if mode not in ("cell", "row"):
        raise InputError(f"fedsum.cells_per_job must be 'cell' or 'row', got {mode!r}")
    return mode == "row"


def row_settings(config: dict) -> list[str]:
    """Settings whose runs include every method of ``fedsum.methods`` (the table settings)."""
    methods = set(fedsum_cfg(config)["methods"])
    have: dict[str, set] = {}
    for t in TARGETS:
        for r in target_runs(config, t):
            have.setdefault(r["setting"], set()).add(r["method"])
    return sorted(s for s, m in have.items() if methods <= m)


def row_outputs(config: dict) -> list[str]:
    """Output patterns of a row job: every file of every ``fedsum.methods`` run."""
    methods = (config.get("fedsum") or {}).get("methods") or ["FedAvg"]  # no block: never matched
    return [
        f"{RESULTS}/fedsum/{{fsum_setting}}/{BACKBONE}/{m}/seed~{{seed}}/{f}"
        for m in methods
        for f in CELL_FILES
    ]


def row_cells(config: dict, setting: str, seed: int | str) -> list[dict]:
    return [make_fedsum_cell(config, setting, m, seed) for m in fedsum_cfg(config)["methods"]]
