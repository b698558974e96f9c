"""FedSum cells (FedSum §5): BERTSUM on the data-scarcity splits, FedSum and its seven baselines,
ROUGE F1 and recall after every round.

This is the FedSum *task* of the federated runner (:mod:`fedrepro.fl.tasks`); the server side of
each method is a strategy of :mod:`fedrepro.papers.fedsum.strategy` (its :func:`make_strategy`).  The
math is :mod:`fedrepro.papers.fedsum.algorithm` (Algorithms 1-3) and
:mod:`fedrepro.papers.fedsum.baselines`; this module moves it over Flower messages and files.

What one client does in round t (:func:`client_train_round`), per method
--------------------------------------------------------------------------
============  ====================================================================================
FedSum*       receives Ω_g (``arrays``), ``fedsum`` (ConfigRecord: t, T, ε̄, Q̄, the PK_i senders
              and their weights ζ_p = PDT[i][p]), ``fedsum-prototypes`` (P̄_c^0, P̄_c^1) and
              ``fedsum-heads`` (the perturbed heads ω̃_p); runs Alg. 2; replies Ω_i, the means of
              ε and Q over its batches (MetricRecord) and ``fedsum-upload`` (P_(i,c)^0/1, SP_i).
              Before round 1 (``pdt_init: portraits``) a ``phase: initial-portrait`` message asks
              for SP_i under the initial model instead.
FedAvg        receives Ω_g; replies Ω_i.
FedProx       as FedAvg, with μ in the ``fedprox`` ConfigRecord (Flower's ``FedProx`` also writes
              ``proximal-mu`` into the round's ``config`` record, which the shared ClientApp does
              not hand to tasks).
SCAFFOLD      receives x (``arrays``) and c (``scaffold-c``); keeps c_i in
              ``clients/<client>/round_<t>.safetensors``; replies y_i and Δc_i
              (``scaffold-delta-c``).
FedNova       receives x; replies y_i and its local step count τ_i (``local-steps`` metric).
FedDC         receives the model it holds (the server puts it in ``arrays``: the daisy chain's
              permuted model, or the last aggregate); replies its trained model.
FedProto      receives only C̄ (``fedproto-prototypes``); trains its own model (kept in
              ``clients/<client>/round_<t>.safetensors``); replies no model, its class prototypes
              (``fedproto-upload``) with their sentence counts, and its test evaluation
              (ROUGE metrics + ``fedsum-eval`` selections).
Separate      no server: :func:`run_local` trains every client every round.
============  ====================================================================================

Evaluation (FedSum §5.1: "the most optimal testing records (with better R-R-1 values) among
different communication rounds"): after every round, on the dataset's test set (the same for
every client: ``test.jsonl`` of the cell's data folder), top-n sentences with trigram blocking,
ROUGE-1/2/L F1 and recall.  The model evaluated is the aggregated global model Ω_g for FedAvg,
FedProx, SCAFFOLD, FedNova and the FedSum variants (evaluated by the server once per round:
every client would test the same model on the same documents), the n_i/n average of the
returned models for FedDC (the aggregate at aggregation rounds), and every participating
client's own model for the personalised methods FedProto and Separate (their ROUGE averaged
over those clients).  :func:`fedrepro.papers.fedsum.report.write_cell_scores` then picks the round.

Client data (``results/fedsum/data/<setting>/seed~<seed>/``, :func:`write_data_folder`): the
setting's manifest joined with the oracle labels -- ``clients/<client>/train.jsonl`` records carry
``labels`` -- and ``test.jsonl``.
"""

from __future__ import annotations

import copy
import functools
import logging
import random
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord

from fedrepro.papers.fedsum.algorithm import (
    CLASSES,
    VARIANTS,
    FedSumBroadcast,
    FedSumHParams,
    fedsum_local_update,
    get_variant,
    initial_semantic_portrait,
)
from fedrepro.papers.fedsum.baselines import (
    BASELINES,
    BaselineHParams,
    baseline_local_update,
    get_baseline,
)
from fedrepro.devices import cell_device, configure_torch, cpu_state
from fedrepro.precision import Precision
from fedrepro.fl.limits import rehearsal_limit
from fedrepro.io import InputError, read_json, read_jsonl, write_json_atomic, write_jsonl_atomic
from fedrepro.logs import RoundProgress

log = logging.getLogger(__name__)

WANTS_RECORDS = True
"""The Flower ClientApp hands :func:`client_train_round` the message's extra records."""

METHODS = tuple(BASELINES) + tuple(VARIANTS)
"""Every method a FedSum cell can run: the seven baselines and the FedSum variants (Table 4)."""

PERSONALISED = ("Separate", "FedProto")
"""Methods whose clients keep their own models (evaluated per client)."""


# -- methods and hyperparameters ---------------------------------------------------------------
def check_method(method: str) -> str:
    if method not in METHODS:
        raise InputError(
            f"unknown FedSum method {method!r}; known: {list(METHODS)} (config key fedsum.methods)"
        )
    return method


def is_fedsum_variant(method: str) -> bool:
    return check_method(method) in VARIANTS


def evaluated_model(method: str) -> str:
    """``"global"`` (one model per round) or ``"clients"`` (each participant's own model)."""
    return "clients" if check_method(method) in PERSONALISED else "global"


def fedsum_hparams(cell: Mapping) -> FedSumHParams:
    """FedSumHParams from the cell (``fedsum`` = the config's ``fedsum.method`` block, λ included)."""
    train = cell["train"]
    return FedSumHParams.from_config(
        {**(cell.get("fedsum") or {}), "lr": train["lr"], "local_epochs": train["local_epochs"]}
    )


def baseline_hparams(cell: Mapping) -> BaselineHParams:
    train = cell["train"]
    return BaselineHParams.from_config(
        {**(cell.get("baselines") or {}), "lr": train["lr"], "local_epochs": train["local_epochs"]}
    )


# -- client data -------------------------------------------------------------------------------
def write_data_folder(
    manifest_path: str,
    records_path: str,
    oracle_path: str,
    out_dir: str,
    seed: int,
    max_test_docs: int | None = None,
    heldout_test_docs: int = 0,
) -> dict:
    """Build a FedSum cell's data folder (atomically): ``clients/<c>/train.jsonl`` (the manifest's
    training records with their oracle ``labels``) and ``test.jsonl``.

    The test set is the manifest's shared ``test`` split (the dataset's own test set).  A source
    without one (Reddit TIFU has no official split) gets ``heldout_test_docs`` records drawn
    (seeded) from its training records that no client holds.  ``max_test_docs`` keeps a seeded
    sample of that many (demo scale; ``None`` keeps all).
    """
    from fedrepro.io import atomic_dir
    from fedrepro.papers.fedsum.model import load_oracle_labels

    manifest = read_json(manifest_path)
    clients = manifest.get("clients")
    if not isinstance(clients, dict) or not clients:
        raise InputError(f"{manifest_path}: no clients; rebuild it with the partition_setting rule")
    records = {r["id"]: r for r in read_jsonl(records_path)}
    oracle = load_oracle_labels(oracle_path)
    rng = random.Random(f"fedsum-test/{seed}")
    test_ids = sorted(((manifest.get("meta") or {}).get("shared") or {}).get("test") or [])
    held = {i for splits in clients.values() for ids in splits.values() for i in ids}
    if not test_ids:
        if heldout_test_docs < 1:
            raise InputError(
                f"{manifest_path}: the source has no test split; set fedsum.eval.heldout_test_docs "
                f"to hold out training records for testing"
            )
        pool = sorted(i for i, r in records.items() if r.get("split") == "train" and i not in held)
        if len(pool) < heldout_test_docs:
            raise InputError(
                f"{records_path}: only {len(pool)} training records outside the clients' data, "
                f"fedsum.eval.heldout_test_docs asks for {heldout_test_docs}"
            )
        test_ids = sorted(rng.sample(pool, heldout_test_docs))
    if max_test_docs is not None and len(test_ids) > int(max_test_docs):
        test_ids = sorted(rng.sample(test_ids, int(max_test_docs)))
    if held & set(test_ids):
        raise InputError(f"{manifest_path}: test documents also in a client's training data")

    def row(i: str, with_labels: bool) -> dict:
        if i not in records:
            raise InputError(f"{manifest_path}: record {i} not in {records_path}")
        rec = dict(records[i])
        if with_labels:
            if i not in oracle:
                raise InputError(
                    f"{oracle_path}: no oracle labels for record {i}; rerun the oracle_labels rule"
                )
            rec["labels"] = list(oracle[i]["labels"])
            if list(oracle[i]["sentences"]) != list((rec.get("meta") or {}).get("sentences") or []):
                raise InputError(
                    f"{oracle_path}: record {i}: oracle sentences differ from meta.sentences "
                    f"(stale oracle file); rerun the oracle_labels rule"
                )
        return rec

    counts = {}
    with atomic_dir(out_dir) as tmp:
        for client in sorted(clients):
            ids = sorted(clients[client].get("train") or [])
            if not ids:
                raise InputError(f"{manifest_path}: client {client} has no training records")
            counts[client] = write_jsonl_atomic(
                Path(tmp) / "clients" / client / "train.jsonl", [row(i, True) for i in ids]
            )
        counts["test"] = write_jsonl_atomic(
            Path(tmp) / "test.jsonl", [row(i, False) for i in test_ids]
        )
        # the clients' data sizes n_i (the split's, as the manifest has them): what a server
        # sampling clients by size knows (client_selection: proportional) without their data
        write_json_atomic(
            Path(tmp) / SIZES_FILE,
            {"train": {c: counts[c] for c in sorted(clients)}, "test": counts["test"]},
        )
    return counts


SIZES_FILE = "sizes.json"


def client_sizes(cell: Mapping) -> dict[str, int]:
    """``{client: n_i}``: the number of training documents of each of the cell's clients, from the
    data folder's ``sizes.json`` (written with the folder from the manifest; a folder built before
    it existed: the line counts of the clients' ``train.jsonl``, counted without parsing a record).
    A rehearsal cell counts the documents its clients keep (:func:`rehearsal_limit`)."""
    out: dict[str, int] = {}
    tables: dict[Path, dict] = {}
    for client in cell["clients"]:
        train = client_split_path(cell, client)
        sizes_path = train.parent.parent.parent / SIZES_FILE  # <folder>/clients/<client>/train.jsonl
        if sizes_path not in tables:
            tables[sizes_path] = (
                (read_json(sizes_path).get("train") or {}) if sizes_path.exists() else {}
            )
        n = tables[sizes_path].get(client)
        if n is None:
            if not train.exists():
                raise InputError(f"{train}: FedSum data file missing; run the fedsum_client_data rule")
            with open(train, "rb") as fh:
                n = sum(1 for line in fh if line.strip())
        out[client] = len(rehearsal_limit(cell, range(int(n)), "train"))
    return out


def client_split_path(cell: Mapping, client: str) -> Path:
    try:
        return Path(cell["client_data"][client]) / "train.jsonl"
    except KeyError:
        raise InputError(f"FedSum cell has no data folder for client {client!r}") from None


def _tokenizer_and_model(backbone_dir: str, seed: int):
    """(tokenizer, BERTSUM), resident once per process (:mod:`fedrepro.models.resident`); every
    model that trains is a deep copy (:func:`fresh_model`)."""
    from fedrepro.models.resident import resident
    from fedrepro.papers.fedsum.model import load_bertsum

    return resident("bertsum", backbone_dir, lambda: load_bertsum(backbone_dir, seed), seed)


def fresh_model(cell: Mapping):
    """(tokenizer, BERTSUM with the initial Ω) -- the same for the server and every client: the
    backbone's encoder and a head drawn from the cell seed."""
    tok, model = _tokenizer_and_model(str(cell["backbone_dir"]), int(cell["seed"]))
    return tok, copy.deepcopy(model).to(cell_device(cell))


_BATCH_TENSORS = (
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "cls_positions",
    "cls_mask",
    "labels",
)


def on_device(batch, device: torch.device):
    """A BertSumBatch with its tensors on ``device`` (the same object when already there)."""
    import dataclasses

    if batch.input_ids.device == device:
        return batch
    return dataclasses.replace(batch, **{f: getattr(batch, f).to(device) for f in _BATCH_TENSORS})


def to_device(state: Mapping[str, torch.Tensor] | None, device: torch.device) -> OrderedDict | None:
    """Received tensors (CPU, from the wire or a file) moved to the model's device."""
    if state is None:
        return None
    return OrderedDict((k, v.to(device)) for k, v in state.items())


@functools.lru_cache(maxsize=64)
def _encoded(
    path: str,
    backbone_dir: str,
    seed: int,
    max_tokens: int,
    max_sentence_tokens: int,
    short_sentence_tokens: int,
    labelled: bool,
) -> tuple:
    from fedrepro.papers.fedsum.model import encode_records

    if not Path(path).exists():
        raise InputError(f"{path}: FedSum data file missing; run the fedsum_client_data rule")
    records = read_jsonl(path)
    if not records:
        raise InputError(f"{path}: no records")
    oracle = None
    if labelled:
        oracle = {}
        for n, r in enumerate(records, start=1):
            if "labels" not in r:
                raise InputError(
                    f"{path}: record {n} ({r.get('id')}) has no oracle labels; rebuild the folder "
                    f"with the fedsum_client_data rule"
                )
            oracle[r["id"]] = {
                "sentences": (r.get("meta") or {}).get("sentences"),
                "labels": r["labels"],
            }
    tok, _ = _tokenizer_and_model(backbone_dir, seed)
    try:
        return tuple(
            encode_records(
                records, tok, oracle, max_tokens, max_sentence_tokens, short_sentence_tokens
            )
        )
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def _encode_args(cell: Mapping) -> tuple:
    train = cell["train"]
    return (
        str(cell["backbone_dir"]),
        int(cell["seed"]),
        int(train["max_tokens"]),
        int(train["max_sentence_tokens"]),
        int(cell.get("short_sentence_tokens", 0)),  # BertSum's filter (partitions.fedsum)
    )


def client_docs(cell: Mapping, client: str) -> tuple:
    """A client's encoded training documents (a rehearsal cell keeps the first few,
    :func:`fedrepro.fl.limits.rehearsal_limit`)."""
    docs = _encoded(str(client_split_path(cell, client)), *_encode_args(cell), True)
    return rehearsal_limit(cell, docs, "train")


def test_docs(cell: Mapping) -> tuple:
    """The encoded test documents every round is evaluated on (a rehearsal cell keeps the first
    ``eval_examples``; predictions, references and selections all come from these)."""
    docs = _encoded(str(cell["test_file"]), *_encode_args(cell), False)
    return rehearsal_limit(cell, docs, "test")


def client_batches(cell: Mapping, client: str, round_index: int):
    """``batches(epoch)``: the client's documents shuffled per (seed, client, round, epoch)."""
    from fedrepro.papers.fedsum.model import epoch_batches

    tok, _ = _tokenizer_and_model(str(cell["backbone_dir"]), int(cell["seed"]))
    on_cpu = epoch_batches(
        client_docs(cell, client),
        int(cell["train"]["batch_size"]),
        int(cell["seed"]),
        "fedsum-batches",
        client,
        round_index,
        pad_token_id=int(tok.pad_token_id),
    )
    device = cell_device(cell)

    def batches(epoch: int):
        return [on_device(b, device) for b in on_cpu(epoch)]

    return batches


# -- evaluation --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _reference_sentences(path: str) -> dict[str, list[str]]:
    """``{id: the reference summary's sentences}`` of a test file (for the ``<q>`` join)."""
    from fedrepro.papers.fedsum.model import reference_sentences

    return {r["id"]: reference_sentences(r) for r in read_jsonl(path)}


def rouge_scorer(cell: Mapping) -> str:
    """The cell's ROUGE scorer (``fedsum.eval.rouge_scorer``; the authors' ``rouge`` by default)."""
    return str(cell.get("rouge_scorer", "rouge"))


@torch.no_grad()
def evaluate_model(cell: Mapping, model) -> dict:
    """ROUGE-1/2/L F1 and recall (%) of ``model`` on the cell's test set: top-n sentences by score
    with trigram blocking (BertSum's selection); ``selected`` = the chosen sentence indices per
    document (in ``meta.sentences``), in selection order.  Scored with the cell's
    ``rouge_scorer``: ``rouge`` (the authors': the selected sentences and the reference's
    sentences each joined by ``<q>``) or ``rouge-score`` (joined by spaces, Porter stemmer)."""
    from fedrepro.metrics.rouge import rouge_f1_recall
    from fedrepro.papers.fedsum.model import make_batches, predict_extractive

    configure_torch(cell["threads"])
    tok, _ = _tokenizer_and_model(str(cell["backbone_dir"]), int(cell["seed"]))
    docs = test_docs(cell)
    device = next(model.parameters()).device
    # tf32 applies; bf16-mixed does not: bfloat16 scores (8 significant bits) would tie sentences
    # in the top-n selection, so the extractive scoring stays float32 (docs/decisions.md)
    with Precision.from_cell(cell).region(device):
        preds = predict_extractive(
            model,
            (
                on_device(b, device)
                for b in make_batches(docs, int(cell["eval_batch_size"]), int(tok.pad_token_id))
            ),
            int(cell["extract_sentences"]),
            bool(cell.get("block_trigrams", True)),
        )
    scorer = rouge_scorer(cell)
    if scorer == "rouge":
        refs = _reference_sentences(str(cell["test_file"]))
        metrics = rouge_f1_recall(
            [p["sentences"] for p in preds],
            [refs.get(p["id"], [p["target"]]) for p in preds],
            scorer="rouge",
        )
    else:
        metrics = rouge_f1_recall(
            [p["summary"] for p in preds], [p["target"] for p in preds], scorer=scorer
        )
    return {"metrics": metrics, "selected": {p["id"]: list(p["selected"]) for p in preds}}


def evaluate_state(cell: Mapping, state: Mapping[str, torch.Tensor]) -> dict:
    """:func:`evaluate_model` of a fresh BERTSUM holding Ω = ``state``."""
    _, model = fresh_model(cell)
    model.load_federated_state(state)
    return evaluate_model(cell, model)


METRICS = ("rouge1_f1", "rouge2_f1", "rougeL_f1", "rouge1_recall", "rouge2_recall", "rougeL_recall")


def personalised_evaluation(per_client: Mapping[str, dict], selected: Mapping[str, dict]) -> dict:
    """The round record of a personalised method: each metric averaged over the evaluated
    clients (their own models), with the per-client numbers and selections kept."""
    if not per_client:
        raise InputError("no client evaluated this round")
    clients = sorted(per_client)
    mean = {m: sum(float(per_client[c][m]) for c in clients) / len(clients) for m in METRICS}
    mean["n"] = int(per_client[clients[0]]["n"])
    return {
        "evaluated": "clients",
        "metrics": mean,
        "per_client": {c: dict(per_client[c]) for c in clients},
        "selected": {c: selected[c] for c in clients},
    }


def selections_record(selected: Mapping[str, list[int]]) -> ConfigRecord:
    """A client's test selections for the wire (``fedsum-eval``): doc ids and "i,j,k" strings."""
    ids = sorted(selected)
    return ConfigRecord(
        {"doc-ids": ids, "selected": [",".join(str(j) for j in selected[i]) for i in ids]}
    )


def selections_from_record(rec: Mapping) -> dict[str, list[int]]:
    ids, sel = list(rec["doc-ids"]), list(rec["selected"])
    if len(ids) != len(sel):
        raise InputError("fedsum-eval record: doc-ids and selected differ in length")
    return {i: [int(j) for j in s.split(",") if j] for i, s in zip(ids, sel)}


# -- per-client files (SCAFFOLD's c_i, FedProto's and Separate's own models) -------------------
_ROUND_FILE = re.compile(r"^round_(\d{3})\.safetensors$")


def client_state_path(cell: Mapping, client: str, round_index: int) -> Path:
    return Path(cell["out_dir"]) / "clients" / client / f"round_{round_index:03d}.safetensors"


def latest_client_state(cell: Mapping, client: str, before_round: int) -> OrderedDict | None:
    """The client's newest saved state of a round < ``before_round`` (None if it never saved
    one: a client that has not taken part yet)."""
    from fedrepro.fl.checkpoint import load_state

    folder = Path(cell["out_dir"]) / "clients" / client
    rounds = (
        sorted(
            int(m.group(1))
            for f in folder.glob("round_*.safetensors")
            if (m := _ROUND_FILE.match(f.name)) and int(m.group(1)) < before_round
        )
        if folder.exists()
        else []
    )
    return load_state(client_state_path(cell, client, rounds[-1])) if rounds else None


def save_client_state(
    cell: Mapping, client: str, round_index: int, state: Mapping[str, torch.Tensor]
) -> None:
    """Save round ``round_index``'s state; keep only it and the newest older one (a rerun of this
    round after a kill needs that one) -- or an older one while the previous round's checkpoint
    is still being written (:func:`fedrepro.fl.checkpoint.client_files_needed_from`) -- unless
    ``keep_round_checkpoints``."""
    from fedrepro.fl.checkpoint import client_files_needed_from, save_state

    save_state(client_state_path(cell, client, round_index), state)
    if cell.get("keep_round_checkpoints", False):
        return
    folder = client_state_path(cell, client, round_index).parent
    older = sorted(
        int(m.group(1))
        for f in folder.glob("round_*.safetensors")
        if (m := _ROUND_FILE.match(f.name)) and int(m.group(1)) < round_index
    )
    if not older:
        return
    keep = client_files_needed_from(cell["out_dir"], folder, "round_", older[-1])
    for r in older:
        if r < keep:
            client_state_path(cell, client, r).unlink(missing_ok=True)


# -- records <-> library objects ---------------------------------------------------------------
def prototypes_record(prototypes: Mapping[int, torch.Tensor | None] | None) -> ArrayRecord:
    """Class prototypes as an ArrayRecord ``class-0`` / ``class-1`` (a missing class is absent)."""
    out = OrderedDict()
    for xi in CLASSES:
        p = (prototypes or {}).get(xi)
        if p is not None:
            out[f"class-{xi}"] = p.detach().float().cpu()
    return ArrayRecord(out)


def prototypes_from_record(
    rec: ArrayRecord | None, device: torch.device | None = None
) -> dict[int, torch.Tensor | None]:
    """Inverse of :func:`prototypes_record` (tensors moved to ``device`` when given)."""
    state = rec.to_torch_state_dict() if rec is not None and len(rec) else {}
    return {
        xi: (state[f"class-{xi}"].to(device) if device is not None else state[f"class-{xi}"])
        if f"class-{xi}" in state
        else None
        for xi in CLASSES
    }


def broadcast_from_records(
    records: Mapping, client: str, device: torch.device | None = None
) -> FedSumBroadcast:
    """Rebuild Alg. 1 line 4's message (plus PK_i and P̄_c) from the ``fedsum*`` records."""
    try:
        cfg = records["fedsum"]
    except KeyError:
        raise InputError(
            f"FedSum client {client}: the server's message has no 'fedsum' record"
        ) from None
    senders = list(cfg.get("knowledge-clients", []))
    weights = [float(w) for w in cfg.get("knowledge-weights", [])]
    if len(senders) != len(weights):
        raise InputError(
            f"FedSum client {client}: {len(senders)} PK senders for {len(weights)} weights"
        )
    heads = records["fedsum-heads"].to_torch_state_dict() if senders else {}
    knowledge = []
    for p, zeta in zip(senders, weights):
        head = OrderedDict(
            (k.split("/", 1)[1], v) for k, v in heads.items() if k.split("/", 1)[0] == p
        )
        if not head:
            raise InputError(f"FedSum client {client}: no perturbed head of {p} in 'fedsum-heads'")
        knowledge.append((zeta, head))
    return FedSumBroadcast(
        round=int(cfg["round"]),
        total_rounds=int(cfg["total-rounds"]),
        global_significance=float(cfg["global-significance"]),
        global_bias_level=float(cfg["global-bias-level"]),
        global_class_prototypes=prototypes_from_record(records.get("fedsum-prototypes"), device),
        parameter_knowledge=knowledge,
    )


def broadcast_records(bc: FedSumBroadcast, variant: str, senders: list[str]) -> dict:
    """The ``fedsum*`` records of one client's round-t message (inverse of
    :func:`broadcast_from_records`); prototypes / heads only when the variant uses them."""
    v = get_variant(variant)
    cfg = {
        "phase": "train",
        "round": int(bc.round),
        "total-rounds": int(bc.total_rounds),
        "global-significance": float(bc.global_significance),
        "global-bias-level": float(bc.global_bias_level),
    }
    out = {}
    if bc.parameter_knowledge:
        cfg["knowledge-clients"] = list(senders)
        cfg["knowledge-weights"] = [float(z) for z, _ in bc.parameter_knowledge]
        heads = OrderedDict()
        for p, (_, head) in zip(senders, bc.parameter_knowledge):
            for k, t in head.items():
                heads[f"{p}/{k}"] = t.detach().float().cpu()
        out["fedsum-heads"] = ArrayRecord(heads)
    if v.prototype_knowledge:
        out["fedsum-prototypes"] = prototypes_record(bc.global_class_prototypes)
    out["fedsum"] = ConfigRecord(cfg)
    return out


# -- the runner protocol -----------------------------------------------------------------------
def is_federated(cell: Mapping) -> bool:
    return check_method(cell["method"]) != "Separate"


def initial_state(cell: Mapping) -> OrderedDict[str, torch.Tensor]:
    """The server's first broadcast: Ω⁰ = {θ⁰, ω⁰} (pre-trained encoder, head from the cell
    seed); nothing for FedProto, whose models never leave the clients (each starts from the same
    Ω⁰, built locally)."""
    if check_method(cell["method"]) == "FedProto":
        return OrderedDict()
    return cpu_state(fresh_model(cell)[1].federated_state())


def client_train_round(
    cell: Mapping,
    client: str,
    round_index: int,
    server_state: Mapping[str, torch.Tensor],
    records: Mapping | None = None,
):
    """One client round of ``cell['method']`` (see the module docstring for what crosses the
    wire); returns (tensors to send, statistics, extra reply records)."""
    records = dict(records or {})
    configure_torch(cell["threads"])
    method = check_method(cell["method"])
    seed = int(cell["seed"])
    if method in VARIANTS:
        if "fedsum" not in records:
            raise InputError(f"FedSum client {client}: the server's message has no 'fedsum' record")
        phase = str(records["fedsum"].get("phase", ""))
        if phase == "initial-portrait":
            return _initial_portrait(cell, client, server_state)
        if phase != "train":
            raise InputError(
                f"FedSum client {client}: unknown phase {phase!r} in the 'fedsum' record"
            )
        return _fedsum_round(cell, client, round_index, server_state, records)
    spec = get_baseline(method)
    if spec.server_rule == "none":
        raise InputError(f"{method} has no server; it runs through run_local, not Flower")
    hp = baseline_hparams(cell)
    _, model = fresh_model(cell)
    batches = client_batches(cell, client, round_index)
    kwargs: dict = {"client": client, "t": round_index, "seed": seed}
    reply: dict = {}
    if spec.receives_global_model:
        if not server_state:
            raise InputError(
                f"{method} client {client}: the server sent no model in round {round_index}"
            )
        kwargs["global_state"] = server_state
    if method == "FedProx":
        try:
            kwargs["mu"] = float(records["fedprox"]["proximal-mu"])
        except KeyError:
            raise InputError(
                f"FedProx client {client}: no proximal-mu in the server's 'fedprox' record"
            ) from None
    if method == "SCAFFOLD":
        if "scaffold-c" not in records:
            raise InputError(
                f"SCAFFOLD client {client}: the server sent no control variate c ('scaffold-c')"
            )
        device = cell_device(cell)
        kwargs["server_control"] = to_device(records["scaffold-c"].to_torch_state_dict(), device)
        # c_i: the client's own, None = 0 before its first round
        kwargs["client_control"] = to_device(latest_client_state(cell, client, round_index), device)
    if method == "FedProto":
        own = latest_client_state(cell, client, round_index)
        if own is not None:
            model.load_federated_state(own)
        protos = prototypes_from_record(records.get("fedproto-prototypes"), cell_device(cell))
        kwargs["global_prototypes"] = (
            protos if any(p is not None for p in protos.values()) else None
        )
    upload = baseline_local_update(model, method, batches, hp, precision=Precision.from_cell(cell),
                                   **kwargs)
    stats = {"num_examples": upload.num_examples, "local_steps": upload.local_steps, **upload.stats}
    if method == "SCAFFOLD":
        save_client_state(cell, client, round_index, upload.client_control)
        reply["scaffold-delta-c"] = ArrayRecord(cpu_state(upload.control_delta))
    if method == "FedProto":
        save_client_state(cell, client, round_index, upload.federated_state)
        reply["fedproto-upload"] = prototypes_record(upload.class_prototypes)
        for xi in CLASSES:
            stats[f"class_{xi}_count"] = int((upload.class_counts or {}).get(xi, 0))
        ev = evaluate_model(cell, model)
        stats.update({k: float(v) for k, v in ev["metrics"].items() if k != "n"})
        stats["test_docs"] = int(ev["metrics"]["n"])
        reply["fedsum-eval"] = selections_record(ev["selected"])
        return OrderedDict(), stats, reply  # FedProto never sends its model
    return upload.federated_state, stats, reply


def _initial_portrait(cell: Mapping, client: str, server_state: Mapping[str, torch.Tensor]):
    """Before round 1 (``pdt_init: portraits``): SP_i (eq. 6) under the initial global model."""
    from fedrepro.papers.fedsum.model import make_batches

    if not server_state:
        raise InputError(f"FedSum client {client}: no initial model in the portrait request")
    tok, model = fresh_model(cell)
    model.load_federated_state(server_state)
    docs = client_docs(cell, client)
    hp = fedsum_hparams(cell)
    device = cell_device(cell)
    batches = [
        on_device(b, device)
        for b in make_batches(docs, int(cell["train"]["batch_size"]), int(tok.pad_token_id))
    ]
    sp = initial_semantic_portrait(model, batches, hp.prediction_threshold)
    return (
        OrderedDict(),
        {"num_examples": len(docs)},
        {"fedsum-portrait": ArrayRecord(OrderedDict([("portrait", sp.detach().float().cpu())]))},
    )


def _fedsum_round(cell: Mapping, client: str, round_index: int, server_state, records: Mapping):
    """FedSum Alg. 2 (with Alg. 3 per batch) for one client."""
    if not server_state:
        raise InputError(
            f"FedSum client {client}: the server sent no global model in round {round_index}"
        )
    bc = broadcast_from_records(records, client, cell_device(cell))
    if bc.round != round_index:
        raise InputError(
            f"FedSum client {client}: message for round {bc.round} received in round {round_index}"
        )
    _, model = fresh_model(cell)
    upload = fedsum_local_update(
        model,
        client_batches(cell, client, round_index),
        bc,
        fedsum_hparams(cell),
        cell["method"],
        client=client,
        seed=int(cell["seed"]),
        global_state=server_state,
        precision=Precision.from_cell(cell),
    )
    stats = {
        "num_examples": upload.num_examples,
        "mean_significance": upload.mean_significance,
        "mean_bias_level": upload.mean_bias_level,
        **upload.stats,
    }
    reply = {}
    if upload.semantic_portrait is not None:  # breadth: P_(i,c)^0/1 (eq. 3) and SP_i (eq. 6)
        sent = prototypes_record(upload.class_prototypes).to_torch_state_dict()
        sent["portrait"] = upload.semantic_portrait.detach().float().cpu()
        reply["fedsum-upload"] = ArrayRecord(sent)
    return upload.federated_state, stats, reply


def run_local(cell: Mapping) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """Separate (FedSum §5.1: "each client only trains their model locally"): every client trains
    its own model every round (T·E epochs in all) and is evaluated after every round; one round
    at a time with checkpoints, so a killed run resumes."""
    from fedrepro.fl.checkpoint import checkpoint_paths, prepare_checkpoints
    from fedrepro.fl.checkpoint import save_state
    from fedrepro.io import write_json_atomic

    if check_method(cell["method"]) != "Separate":
        raise InputError(f"{cell['method']} is federated; run_local serves Separate only")
    configure_torch(cell["threads"])
    hp = baseline_hparams(cell)
    rounds = int(cell["train"]["rounds"])
    done = prepare_checkpoints(dict(cell))
    progress = RoundProgress(rounds, len(cell["clients"]), start_round=done, logger=log)
    for r in range(done + 1, rounds + 1):
        t0 = time.perf_counter()
        entries, per_client, selected = [], {}, {}
        for pid, client in enumerate(cell["clients"]):
            _, model = fresh_model(cell)
            own = latest_client_state(cell, client, r)
            if own is not None:
                model.load_federated_state(own)
            upload = baseline_local_update(
                model,
                "Separate",
                client_batches(cell, client, r),
                hp,
                client=client,
                t=r,
                seed=int(cell["seed"]),
                precision=Precision.from_cell(cell),
            )
            save_client_state(cell, client, r, upload.federated_state)
            ev = evaluate_model(cell, model)
            per_client[client], selected[client] = ev["metrics"], ev["selected"]
            entries.append(
                {
                    "partition_id": pid,
                    "client": client,
                    "num_examples": upload.num_examples,
                    "local_steps": upload.local_steps,
                    **upload.stats,
                    **{k: v for k, v in ev["metrics"].items() if k != "n"},
                }
            )
        state_path, meta_path = checkpoint_paths(cell["out_dir"], r)
        save_state(state_path, {})
        write_json_atomic(
            meta_path,
            {
                "round": r,
                "clients": entries,
                "bytes_down": 0,
                "bytes_up": 0,
                "evaluation": personalised_evaluation(per_client, selected),
                "seconds": time.perf_counter() - t0,
            },
        )
        progress.log(r)
    return final_states(cell)


def final_states(cell: Mapping) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """What the cell keeps (``fedsum.save_models``): ``global`` -- Ω_g after the last round (for
    FedDC the last round's n_i/n average); personalised methods with ``all`` -- each client's own
    last model (clients that never took part have none).  ``none`` keeps nothing (bert-base
    models are 440 MB each)."""
    from fedrepro.fl.checkpoint import checkpoint_paths
    from fedrepro.fl.checkpoint import load_state

    save = cell.get("save_models", "all")
    rounds = int(cell["train"]["rounds"])
    if evaluated_model(cell["method"]) == "clients":
        if save != "all":
            return {}
        out = {}
        for c in cell["clients"]:
            state = latest_client_state(cell, c, rounds + 1)
            if state is not None:
                out[c] = state
        return out
    if save == "none":
        return {}
    return {"global": load_state(checkpoint_paths(cell["out_dir"], rounds)[0])}


def parameter_report(cell: Mapping) -> dict:
    """|θ| (representation), |ω| (head) and |Ω| of the run's BERTSUM, and ``shared_per_round``:
    the entries of the model tensors one client sends per round (its federated state; 0 for
    Separate, which has no server, and FedProto, which sends class prototypes as records, never its
    model) -- what the rehearsal's payload check compares with the bytes on the wire."""
    _, model = fresh_model(cell)
    theta = sum(p.numel() for p in model.representation.parameters())
    omega = sum(p.numel() for p in model.head.parameters())
    method = check_method(cell["method"])
    sends_model = method in VARIANTS or get_baseline(method).server_rule not in ("none", "prototypes")
    shared = sum(v.numel() for v in model.federated_state().values()) if sends_model else 0
    return {
        "representation": theta,
        "head": omega,
        "model": theta + omega,
        "hidden_size": int(model.representation.hidden_size),
        "shared_per_round": shared,
    }


# -- backbone ----------------------------------------------------------------------------------
def prepare_bert_backbone(settings: Mapping, train_files: list[str], out_dir: str) -> Path:
    """BERTSUM's backbone folder (rule ``fedsum_backbone``): ``kind: tiny`` -- a WordPiece
    tokenizer trained on the training records' documents and summaries of the FedSum datasets and
    a small random ``BertModel``; ``kind: hub`` -- a local copy (``local_dir``, linked) or the
    download of ``hub_id`` (``google-bert/bert-base-uncased``), failing fast offline; ``kind:
    shape`` -- ``hub_id`` at its true dimensions with random weights and a tokenizer learnt from
    the same training text (:func:`~fedrepro.papers.fedsum.model.build_shape_bert_backbone`)."""
    from fedrepro.models.backbones import hub_snapshot
    from fedrepro.papers.fedsum.model import BERT_HUB_ID, build_tiny_bert_backbone

    kind = settings.get("kind")
    if kind == "tiny":
        tiny = settings.get("tiny") or {}
        mapping = {
            "vocab_size": "vocab_size",
            "d_model": "hidden_size",
            "encoder_layers": "num_hidden_layers",
            "heads": "num_attention_heads",
            "ffn_dim": "intermediate_size",
            "max_source_length": "max_position_embeddings",
        }
        unknown = set(tiny) - set(mapping) - {"dropout"}
        if unknown:
            raise InputError(
                f"config key backbones.bert-base.tiny: unsupported keys {sorted(unknown)} for a "
                f"BERT backbone; use {sorted(mapping) + ['dropout']}"
            )
        cfg = {mapping[k]: int(v) for k, v in tiny.items() if k in mapping}
        if "dropout" in tiny:
            cfg["hidden_dropout_prob"] = cfg["attention_probs_dropout_prob"] = float(
                tiny["dropout"]
            )
        texts = []
        for f in train_files:
            for r in read_jsonl(f):
                if r.get("split", "train") == "train":
                    texts += [r.get("input", ""), r.get("target", "")]
        return build_tiny_bert_backbone(texts, out_dir, cfg, seed=int(settings.get("seed", 0)))
    if kind == "shape":
        from fedrepro.papers.fedsum.model import build_shape_bert_backbone

        texts = [
            t
            for f in train_files
            for r in read_jsonl(f)
            if r.get("split", "train") == "train"
            for t in (r.get("input", ""), r.get("target", ""))
        ]
        return build_shape_bert_backbone(
            texts, out_dir, settings.get("hub_id") or BERT_HUB_ID, int(settings.get("seed", 0))
        )
    if kind != "hub":
        raise InputError(
            f"config key backbones.bert-base.kind must be 'tiny', 'hub' or 'shape', got {kind!r}"
        )
    return hub_snapshot(
        out_dir,
        settings.get("hub_id") or BERT_HUB_ID,
        settings.get("revision") or "main",
        settings.get("local_dir"),
        "backbones.bert-base.local_dir",
    )


# -- a whole cell ------------------------------------------------------------------------------
def run_fedsum_cell(
    cell: Mapping,
    adapters_out: str,
    log_out: str,
    provenance_out: str,
    scores_out: str,
    predictions_out: str,
    test_file: str,
) -> dict:
    """Train a FedSum cell through the shared runner (:func:`fedrepro.fl.cell.run_cell`: Flower,
    or :func:`run_local` for Separate), then write its reported record: the round with the best
    R-R-1 (``scores.json``) and that round's extracted sentences (``predictions.jsonl``).  One job
    does both because every round is already evaluated during training; selecting the round
    needs no model."""
    from fedrepro.fl.cell import run_cell
    from fedrepro.papers.fedsum.scores import write_cell_scores

    run_cell(dict(cell), adapters_out, log_out, provenance_out)
    return write_cell_scores(cell, log_out, test_file, scores_out, predictions_out)


def run_fedsum_row(cells: list[Mapping], test_file: str) -> list[dict]:
    """Train several cells one after the other in this process (a row job: every method of one
    setting and seed); each writes the files of :func:`run_fedsum_cell` into its own folder.  What
    a killed earlier run of the job finished is restored, not run again: a trained cell's
    training files, a scored cell's scores too (:func:`fedrepro.fl.rows.run_row`).  Returns each
    cell's ``scores.json`` record."""
    from fedrepro.fl.cell import run_cell
    from fedrepro.fl.rows import run_row
    from fedrepro.io import read_json
    from fedrepro.papers.fedsum.scores import write_cell_scores

    def train(cell: dict) -> None:
        folder = Path(cell["out_dir"])
        run_cell(cell, str(folder / "adapters.safetensors"), str(folder / "train_log.json"),
                 str(folder / "provenance.json"))

    def score(cell: dict) -> None:
        folder = Path(cell["out_dir"])
        write_cell_scores(cell, str(folder / "train_log.json"), test_file,
                          str(folder / "scores.json"), str(folder / "predictions.jsonl"))

    cells = [dict(c) for c in cells]
    run_row(cells, [(("adapters.safetensors", "train_log.json", "provenance.json"), train),
                    (("scores.json", "predictions.jsonl"), score)])
    return [read_json(Path(c["out_dir"]) / "scores.json") for c in cells]
