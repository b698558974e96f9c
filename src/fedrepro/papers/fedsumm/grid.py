"""The FedSUMM grid for the Snakemake workflow (rules/fedsumm.smk): cells, jobs, targets.

Plain Python over the config (no file inspection), so that a dry run of the paper grid is fast.

Layout: one cell per (corpus, N, model, regime, seed) at
``results/fedsumm/<corpus>/n<N>/<model>/<regime>/seed~<seed>/`` holding ``adapters.safetensors``
(the final model), ``train_log.json`` (per round: losses per step, ρ, DP, the evaluation on every
client), ``provenance.json``, ``predictions.jsonl`` and ``scores.json``.

Jobs: one Snakemake job trains *and* evaluates the cells of a table row, i.e. every regime of a
(corpus, N, model, seed) at the tables' N (``fedsumm_row``: single, all, FedAvg, FedSUMM), and
the two federated regimes at the other N of Fig. 5(b) (``fedsumm_federated_row``).  A FedSUMM demo
cell computes for a second or two while a Python job that imports torch, transformers and Flower
spends about four seconds starting: one job per cell plus an evaluation job per cell would take
the demo's FedSUMM share well past its three minutes.  Each cell still checkpoints every round and
resumes on its own; at paper scale a row job runs its four trainings one after the other (give it
the runtime in ``fedsumm.resources.train``).

Which cells each artefact needs (:func:`target_cells`):

* ``table1``: every available corpus x {bart, ct} x {single, all, FedAvg, FedSUMM} at N =
  ``fedsumm.clients``; ``table2``: ``fedsumm.table2_corpora`` x (bart single, bart-cd single /
  FedAvg / FedSUMM; the bart-cd ``all`` cell comes with its job and is shown as an extra row);
* ``figure3`` (perplexity per round), ``figure4`` (training loss per step) and ``figure6`` (ρ
  per round) read the Table I cells' round logs;
* ``figure5``: the federated cells of ``fedsumm.figure5.corpus`` at every N of
  ``fedsumm.figure5.clients`` (ROUGE-L per round from the table N's logs; the final ROUGE-L per N).
* ``dp_tradeoff`` (not in the paper; issue 14): ROUGE vs ε on ``fedsumm.dp_tradeoff.corpus`` for
  its ``model`` at the tables' N: one DP cell per noise multiplier σ
  (``<corpus>/n<N>/<model>/<regime>-dp/sigma~<σ>/seed~<seed>/``, all σ of a seed trained by one
  ``fedsumm_dp_row`` job) plus the tables' cell of the same regime without DP (ε = ∞).

A corpus without data (EDUCATION is not public: ``data.education.source: download`` cannot work;
``local`` without ``local_dir``) gets no cells; its table rows say "data not available".
"""

from __future__ import annotations

from fedrepro.fl.privacy import DPSettings
from fedrepro.grid import rehearsal_cell
from fedrepro.io import InputError
from fedrepro.models.backbones import builds_locally
from fedrepro.papers.fedsumm.bart import CHINESE_BART_HUB_ID, CHINESE_BART_REVISION
from fedrepro.precision import precision_cell

RESULTS = "results"
MODELS = ("bart", "ct", "bart-cd")
REGIMES = ("single", "all", "FedAvg", "FedSUMM")
ROW_REGIMES = {"table": REGIMES, "federated": ("FedAvg", "FedSUMM")}
"""Regimes of a ``fedsumm_row`` job (at the tables' N) and a ``fedsumm_federated_row`` job (other N)."""
CELL_FILES = (
    "adapters.safetensors",
    "train_log.json",
    "provenance.json",
    "predictions.jsonl",
    "scores.json",
)
TARGETS = {
    "table1": "table",
    "table2": "table",
    "figure3": "figure",
    "figure4": "figure",
    "figure5": "figure",
    "figure6": "figure",
    "dp_tradeoff": "figure",
}
CORPORA = ("csl", "nlpcc2017", "lcsts", "thucnews", "education")
NOT_PUBLIC = {"education"}
"""Corpora with no download (FedSUMM §IV-A's EDUCATION): usable only from a local copy."""
BACKBONE_DIR = f"{RESULTS}/fedsumm/backbone/bart-base-chinese"


OPTIMIZERS = ("sgd", "adamw")
"""``fedsumm.train.optimizer``: ``sgd`` (eq. 3, Algorithm 1's ``w ← w − δ∇``) or ``adamw`` (ours)."""


def train_optimizer(train: dict) -> str:
    """``fedsumm.train.optimizer`` of a train block (``adamw`` when absent); an unknown value is an
    InputError naming the key."""
    name = train.get("optimizer", "adamw")
    if name not in OPTIMIZERS:
        raise InputError(f"fedsumm.train.optimizer must be one of {list(OPTIMIZERS)}, got {name!r}")
    return name


def fedsumm_cfg(config: dict) -> dict:
    try:
        return config["fedsumm"]
    except KeyError:
        raise InputError("config has no 'fedsumm' section (see config/config.yaml)") from None


def _split_cfg(config: dict) -> dict:
    try:
        return config["partitions"]["fedsumm"]
    except KeyError:
        raise InputError(
            "config has no 'partitions.fedsumm' section (the N-client split)"
        ) from None


def seeds(config: dict) -> list[int]:
    return [int(s) for s in (fedsumm_cfg(config).get("seeds") or config["seeds"])]


def split_seed(config: dict) -> int:
    return int(fedsumm_cfg(config).get("split_seed", 1))


# -- data availability ----------------------------------------------------------------------
def corpus_status(config: dict, corpus: str) -> str | None:
    """``None`` when the corpus can be built from the config, else why not (for the tables)."""
    d = (config.get("data") or {}).get(corpus)
    if d is None:
        return f"data not available (no data.{corpus} in the config)"
    source = d.get("source", "samples")
    if source == "download" and corpus in NOT_PUBLIC:
        return f"data not available (not public; set data.{corpus}.source: local and data.{corpus}.local_dir)"
    if source == "local" and not d.get("local_dir"):
        return f"data not available (data.{corpus}.source is local but data.{corpus}.local_dir is not set)"
    return None


def corpora(config: dict) -> list[str]:
    """The corpora of the split config (table rows), in the paper's order."""
    listed = list(_split_cfg(config)["corpora"])
    return [c for c in CORPORA if c in listed]


def available_corpora(config: dict) -> list[str]:
    return [c for c in corpora(config) if corpus_status(config, c) is None]


def statuses(config: dict) -> dict[str, str | None]:
    return {c: corpus_status(config, c) for c in corpora(config)}


def table_clients(config: dict) -> int:
    """N of Tables I-II (the paper's 50): ``fedsumm.clients``, one of ``partitions.fedsumm.num_clients``."""
    n = int(fedsumm_cfg(config)["clients"])
    if n not in [int(x) for x in _split_cfg(config)["num_clients"]]:
        raise InputError(
            f"fedsumm.clients = {n} is not in partitions.fedsumm.num_clients "
            f"{_split_cfg(config)['num_clients']}; add it there (the split must exist)"
        )
    return n


def figure5_settings(config: dict) -> tuple[str, list[int]]:
    fig = fedsumm_cfg(config).get("figure5") or {}
    corpus = fig.get("corpus", "csl")
    ns = [int(n) for n in fig.get("clients", [table_clients(config)])]
    missing = [n for n in ns if n not in [int(x) for x in _split_cfg(config)["num_clients"]]]
    if missing:
        raise InputError(
            f"fedsumm.figure5.clients {missing} are not in partitions.fedsumm.num_clients; "
            "add them there (each N needs its split)"
        )
    if corpus not in available_corpora(config):
        raise InputError(
            f"fedsumm.figure5.corpus = {corpus!r} has no data "
            f"({corpus_status(config, corpus) or 'not in partitions.fedsumm.corpora'})"
        )
    return corpus, ns


def table2_corpora(config: dict) -> list[str]:
    listed = list(fedsumm_cfg(config).get("table2_corpora", ["csl", "thucnews", "education"]))
    unknown = [c for c in listed if c not in corpora(config)]
    if unknown:
        raise InputError(f"fedsumm.table2_corpora {unknown} are not in partitions.fedsumm.corpora")
    return [c for c in CORPORA if c in listed]


# -- paths ----------------------------------------------------------------------------------
def clients_dir(config: dict, corpus: str, n: int | str) -> str:
    return f"{RESULTS}/partitions/fedsumm-{corpus}-n{n}/seed~{split_seed(config)}/clients"


def client_names(corpus: str, n: int) -> list[str]:
    """The N clients of :func:`fedrepro.data.partition.fedsumm_clients` (``<corpus>-001`` …)."""
    return [f"{corpus}-{k + 1:03d}" for k in range(int(n))]


def cell_dir(corpus: str, n: int | str, model: str, regime: str, seed: int | str) -> str:
    return f"{RESULTS}/fedsumm/{corpus}/n{n}/{model}/{regime}/seed~{seed}"


def sigma_tag(sigma: float | str) -> str:
    """σ in a folder name: ``format(σ, 'g')`` (1.0 → ``1``, 0.5 → ``0.5``)."""
    return format(float(sigma), "g")


def dp_cell_dir(
    corpus: str, n: int | str, model: str, regime: str, sigma: float | str, seed: int | str
) -> str:
    """A cell of ``fedsumm_dp_tradeoff``: DP on, noise multiplier σ (its ``{regime}-dp`` folder
    keeps it apart from the tables' cell of the same regime)."""
    tag = sigma if isinstance(sigma, str) and sigma.startswith("{") else sigma_tag(sigma)
    return f"{RESULTS}/fedsumm/{corpus}/n{n}/{model}/{regime}-dp/sigma~{tag}/seed~{seed}"


def row_outputs(kind: str) -> list[str]:
    """Output patterns of a row job (wildcards fs_corpus, fs_n, fs_model, seed)."""
    return [
        f"{cell_dir('{fs_corpus}', '{fs_n}', '{fs_model}', regime, '{seed}')}/{name}"
        for regime in ROW_REGIMES[kind]
        for name in CELL_FILES
    ]


def row_clients_constraint(config: dict, kind: str) -> str:
    """Wildcard constraint on ``fs_n``: the tables' N for table rows, the other N of Fig. 5(b) for
    federated-only rows (a pattern that matches nothing when there are none)."""
    n = table_clients(config)
    if kind == "table":
        return str(n)
    others = [str(k) for k in figure5_settings(config)[1] if k != n]
    return "|".join(others) if others else "(?!)"


def dp_settings(config: dict) -> DPSettings:
    return DPSettings.from_config(fedsumm_cfg(config).get("dp"))


def dp_tradeoff_settings(config: dict) -> dict:
    """``fedsumm.dp_tradeoff``: corpus, model, regimes and the noise multipliers σ of the
    ROUGE-vs-ε target (each σ checked with the rest of ``fedsumm.dp``)."""
    t = dict(fedsumm_cfg(config).get("dp_tradeoff") or {})
    key = "fedsumm.dp_tradeoff"
    out = {
        "corpus": t.get("corpus", "csl"),
        "model": t.get("model", "ct"),
        "regimes": list(t.get("regimes", ["FedSUMM"])),
        "noise_multipliers": [float(s) for s in t.get("noise_multipliers", [0.5, 1.0])],
    }
    bad = [x for x in out["noise_multipliers"] if not x > 0]
    if bad:
        raise InputError(f"config key {key}.noise_multipliers: σ must be > 0, got {bad}")
    if out["corpus"] not in available_corpora(config):
        raise InputError(
            f"config key {key}.corpus = {out['corpus']!r} has no data "
            f"({corpus_status(config, out['corpus']) or 'not in partitions.fedsumm.corpora'})"
        )
    if out["model"] not in MODELS:
        raise InputError(f"config key {key}.model: must be one of {MODELS}, got {out['model']!r}")
    if not out["noise_multipliers"]:
        raise InputError(f"config key {key}.noise_multipliers: give at least one σ")
    tags = [sigma_tag(x) for x in out["noise_multipliers"]]
    if len(set(tags)) != len(tags):
        raise InputError(f"config key {key}.noise_multipliers: {tags} repeat a value")
    base = fedsumm_cfg(config).get("dp") or {}
    m = (fedsumm_cfg(config).get("algorithm") or {}).get("clients_per_round") or table_clients(config)
    for regime in out["regimes"]:
        for x in out["noise_multipliers"]:
            _dp_block(base, regime, x, m, key=f"{key}.noise_multipliers")
    return out


def _dp_block(base: dict, regime: str, sigma: float | None, clients_per_round: int,
              key: str = "fedsumm.dp") -> dict:
    """The cell's ``dp``: ``fedsumm.dp`` checked, on for this regime when σ is given (a tradeoff
    cell), else as configured."""
    raw = dict(base)
    if sigma is not None:
        raw.update(enabled=True, noise_multiplier=float(sigma), regimes=[regime])
    try:
        dp = DPSettings.from_config(raw)
        if dp.enabled and regime in dp.regimes:
            dp.check(int(clients_per_round))
    except InputError as err:
        if sigma is None:
            raise
        raise InputError(f"{key}: σ = {sigma}: {err}") from None
    out = dp.as_dict()
    out["enabled"] = dp.enabled and regime in dp.regimes
    return out


def dp_row_outputs(config: dict) -> list[str]:
    """Output patterns of a ``fedsumm_dp_row`` job (wildcards fs_corpus, fs_n, fs_model, fs_regime,
    seed): every σ of the tradeoff."""
    sigmas = (fedsumm_cfg(config).get("dp_tradeoff") or {}).get("noise_multipliers", [0.5, 1.0])
    return [
        f"{dp_cell_dir('{fs_corpus}', '{fs_n}', '{fs_model}', '{fs_regime}', s, '{seed}')}/{name}"
        for s in sigmas
        for name in CELL_FILES
    ]


def dp_row_cells(
    config: dict, corpus: str, n: int | str, model: str, regime: str, seed: int | str
) -> list[dict]:
    """The DP cells one ``fedsumm_dp_row`` job trains and evaluates, one per σ."""
    return [
        make_cell(config, corpus, n, model, regime, seed, dp_sigma=s)
        for s in dp_tradeoff_settings(config)["noise_multipliers"]
    ]


def backbone_inputs(config: dict) -> list[str]:
    """Text the demo (or shape) backbone's character vocabulary is built from (none for the hub
    checkpoint)."""
    if not builds_locally(backbone_settings(config)):
        return []
    return [f"{RESULTS}/data/{c}/records.jsonl" for c in available_corpora(config)]


def backbone_settings(config: dict) -> dict:
    b = dict(fedsumm_cfg(config).get("backbone") or {})
    b.setdefault("kind", "tiny")
    b.setdefault("hub_id", CHINESE_BART_HUB_ID)
    b.setdefault("revision", CHINESE_BART_REVISION)
    if b["kind"] not in ("tiny", "hub", "shape"):
        raise InputError(
            f"fedsumm.backbone.kind must be 'tiny', 'hub' or 'shape', got {b['kind']!r}"
        )
    return b


# -- cells ----------------------------------------------------------------------------------
def target_cells(config: dict, target: str) -> list[str]:
    """The cell folders one artefact reads (module docstring)."""
    if target not in TARGETS:
        raise InputError(f"unknown FedSUMM target {target!r}; known: {sorted(TARGETS)}")
    n = table_clients(config)
    out: list[str] = []
    if target == "dp_tradeoff":
        t = dp_tradeoff_settings(config)
        for r in t["regimes"]:
            for s in seeds(config):
                out.append(cell_dir(t["corpus"], n, t["model"], r, s))  # no DP: ε = ∞
                out += [dp_cell_dir(t["corpus"], n, t["model"], r, x, s)
                        for x in t["noise_multipliers"]]
    elif target in ("table1", "figure3", "figure4", "figure6"):
        regimes = ("FedAvg", "FedSUMM") if target == "figure6" else REGIMES
        out = [
            cell_dir(c, n, m, r, s)
            for c in available_corpora(config)
            for m in ("bart", "ct")
            for r in regimes
            for s in seeds(config)
        ]
    elif target == "table2":
        for c in table2_corpora(config):
            if corpus_status(config, c) is not None:
                continue
            out += [cell_dir(c, n, "bart", "single", s) for s in seeds(config)]
            out += [cell_dir(c, n, "bart-cd", r, s) for r in REGIMES for s in seeds(config)]
    else:
        corpus, ns = figure5_settings(config)
        out = [
            cell_dir(corpus, k, m, r, s)
            for k in ns
            for m in ("bart", "ct")
            for r in ("FedAvg", "FedSUMM")
            for s in seeds(config)
        ]
    return out


def target_files(config: dict, target: str, name: str) -> list[str]:
    return [f"{cell}/{name}" for cell in target_cells(config, target)]


def all_cells(config: dict) -> list[str]:
    return sorted({c for t in TARGETS for c in target_cells(config, t)})


def make_cell(
    config: dict,
    corpus: str,
    n: int | str,
    model: str,
    regime: str,
    seed: int | str,
    dp_sigma: float | str | None = None,
) -> dict:
    """The full, JSON-able description of one FedSUMM cell (what its config hash covers); a
    rehearsal's cell also carries ``rehearsal`` (:func:`fedrepro.grid.rehearsal_cell`), a normal
    cell has no such key.  ``dp_sigma``: a ``fedsumm_dp_tradeoff`` cell (DP on with that σ, in
    :func:`dp_cell_dir`)."""
    f = fedsumm_cfg(config)
    n = int(n)
    if model not in MODELS:
        raise InputError(f"unknown FedSUMM model {model!r}; known: {MODELS}")
    if regime not in REGIMES:
        raise InputError(f"unknown FedSUMM regime {regime!r}; known: {REGIMES}")
    if corpus_status(config, corpus) is not None:
        raise InputError(f"FedSUMM corpus {corpus}: {corpus_status(config, corpus)}")
    clients = client_names(corpus, n)
    train = dict(f["train"])
    train_optimizer(train)
    algorithm = dict(f.get("algorithm") or {})
    dp = _dp_block(
        dict(f.get("dp") or {}),
        regime,
        None if dp_sigma is None else float(dp_sigma),
        algorithm.get("clients_per_round") or n,
    )
    ct = dict(f["copy_transformer"])
    bb = backbone_settings(config)
    limit = int(ct.get("max_positions", 1024))
    if bb["kind"] == "tiny":
        limit = min(limit, int((bb.get("tiny") or {}).get("max_position_embeddings", 512)))
    if max(int(train["max_source_length"]), int(train["max_target_length"])) > limit:
        raise InputError(
            f"fedsumm.train.max_source_length / max_target_length exceed the models' "
            f"{limit} positions (fedsumm.copy_transformer.max_positions, "
            f"fedsumm.backbone.tiny.max_position_embeddings)"
        )
    fig_corpus = (f.get("figure5") or {}).get("corpus", "csl")
    return {
        "paper": "fedsumm",
        "scale": config["scale"],
        "corpus": corpus,
        "num_clients": n,
        "model": model,
        "regime": regime,
        "seed": int(seed),
        "backbone": "bart-base-chinese",
        "backbone_dir": BACKBONE_DIR,
        "clients": clients[:1] if regime == "single" else clients,
        "eval_clients": clients,
        "client_data": {c: f"{clients_dir(config, corpus, n)}/{c}" for c in clients},
        "copy_transformer": ct,
        "copy_attention": (f.get("copy_distribution") or {}).get(
            "bart_attention", "cross_attention"
        ),
        "algorithm": algorithm,
        "dp": dp,
        "train": train,
        "generation": dict(f["generation"]),
        "rouge_every_round": bool((f.get("evaluation") or {}).get("rouge_every_round", True))
        and corpus == fig_corpus
        and model in ("bart", "ct")
        and regime in ROW_REGIMES["federated"],
        "threads": int(f.get("threads_per_cell", 1)),
        "engine": f.get("engine", "simulation"),
        "device": f.get("device", "auto"),
        **precision_cell(f, "fedsumm"),  # only when not fp32: fedrepro.precision
        "gpus_per_client": float(f.get("gpus_per_client", 0.0)),
        "clients_per_round": algorithm.get("clients_per_round"),
        "server_state": {
            "storage": "memory",
            "dtype": "float32",
            **dict(f.get("server_state") or {}),
        },
        "keep_round_checkpoints": bool(f.get("keep_round_checkpoints", False)),
        "round_timeout_s": float(f.get("round_timeout_s", 3600)),
        "out_dir": cell_dir(corpus, n, model, regime, seed)
        if dp_sigma is None
        else dp_cell_dir(corpus, n, model, regime, dp_sigma, seed),
        **rehearsal_cell(config),
    }


def row_cells(
    config: dict, kind: str, corpus: str, n: int | str, model: str, seed: int | str
) -> list[dict]:
    """The cells one row job trains and evaluates (built by :func:`make_cell`, so a rehearsal's
    cells carry their limits)."""
    if kind not in ROW_REGIMES:
        raise InputError(f"unknown FedSUMM row kind {kind!r}; known: {sorted(ROW_REGIMES)}")
    return [make_cell(config, corpus, n, model, r, seed) for r in ROW_REGIMES[kind]]


def job_resources(config: dict, job: str) -> dict:
    """``gpu``, ``mem_mb``, ``runtime`` (minutes) of a row job from ``fedsumm.resources.<job>``."""
    defaults = {
        "train": {"gpu": 0, "mem_mb": 4000, "runtime": 120},
        "backbone": {"gpu": 0, "mem_mb": 4000, "runtime": 60},
    }
    if job not in defaults:
        raise InputError(f"unknown FedSUMM job kind {job!r}")
    return {**defaults[job], **((fedsumm_cfg(config).get("resources") or {}).get(job) or {})}


def report_params(config: dict) -> dict:
    corpus, ns = figure5_settings(config)
    return {
        "scale": config["scale"],
        "clients": table_clients(config),
        "statuses": statuses(config),
        "table2_corpora": table2_corpora(config),
        "figure5_corpus": corpus,
        "figure5_clients": ns,
    }
