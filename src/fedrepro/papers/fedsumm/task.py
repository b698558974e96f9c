"""FedSUMM cells (Pan et al., §III-IV): Chinese summarization over an N-client split, two models
(Chinese BART, CopyTransformer) plus BART + CD, four training regimes.

This is the FedSUMM *task* of the federated runner (:mod:`fedrepro.fl.tasks`): what one client does
in one round, what the server starts from, what a finished cell is evaluated with.  The server side
(Algorithm 1's memory gradients, ρ, gradient adapter, plain mean, DP) is
:class:`fedrepro.papers.fedsumm.strategy.FedSummStrategy`, returned by its :func:`~fedrepro.papers.fedsumm.strategy.make_strategy`.

Cell keys (built by :func:`fedrepro.papers.fedsumm.grid.make_cell`): ``corpus``, ``num_clients``
(N), ``model`` (``bart`` | ``ct`` | ``bart-cd``), ``regime`` (``single`` | ``all`` | ``FedAvg`` |
``FedSUMM``), ``clients`` (the clients whose data trains: the N clients for the federated regimes
and ``all``, the first client for ``single``), ``eval_clients`` (always the N clients),
``client_data`` ({client: folder}), ``algorithm`` (:class:`FedSummConfig` keys), ``dp``, ``train``,
``generation``, ``rouge_every_round``.

Regimes
-------
* ``single``: one client's data (the first of the N-client split), no server (:func:`run_local`).
* ``all``: the N clients' training data pooled, no server (:func:`run_local`).
* ``FedAvg``: Flower; the client runs plain local training from w_t; the server takes the plain mean
  of the returned models and records ρ (eq. 5-6) for Fig. 6 (it sends no guidance).
* ``FedSUMM``: Flower; the server sends each client its guidance (Algorithm 1's ClientUpdate(c, w,
  g, l): the modulated gradient as an extra ``ArrayRecord``, ρ / previous loss / ε as a
  ``ConfigRecord``), the client trains with eq. 7's objective, the server updates MG, ρ, the
  adapter and takes the plain mean (or the DP mean, eq. 9-10).

The FedAvg and FedSUMM clients run the same function (:func:`client_train_round`, i.e.
:func:`fedrepro.papers.fedsumm.algorithm.fedsumm_local_update`); they differ only by what the server
does and sends.  Clients are stateless: a fresh optimizer (``fedsumm.train.optimizer``: plain SGD,
eq. 3 and Algorithm 1's ``w ← w − δ∇``, or AdamW) every round, w_t loaded whole.

Wire format: the shared tensors are every trainable parameter, sent in *sorted name order* (the
order the runner's checkpoints load back in), on the CPU.

Evaluation
----------
* Per round (federated): after aggregating round t the server sends w_{t+1} to *every* client in a
  Flower ``evaluate`` message; each client returns the summed token NLL of its validation split
  (perplexity, Fig. 3) and, when ``rouge_every_round``, the summed character ROUGE-L F1 of greedy /
  beam summaries of its test split (Fig. 5a).  The server pools them: perplexity
  ``exp(Σ NLL / Σ tokens)``, ROUGE-L the mean over all test examples.  Per round (local regimes):
  the same numbers, computed directly on the N clients' files after each round.
* A client without a validation split (NLPCC2017 is released without one) reports the perplexity
  on its test split; the log records which split was used.
* Final (:func:`evaluate_cell`): the model each regime ends with -- the final global model w_T for
  FedAvg / FedSUMM (the guidance personalises training, not the deployed model), the trained model
  for ``single`` / ``all`` -- generates a summary for every test example of the N clients; character
  ROUGE-1/2/L F1 (:func:`fedrepro.metrics.rouge.rouge_scores` with ``lang="zh"``) averaged over all
  those examples (= the corpus test set), plus per client.

Rehearsal
---------
A rehearsal cell (``cell["rehearsal"]``, :func:`fedrepro.grid.rehearsal_cell`) reads only the first
``examples_per_client`` training and ``eval_examples`` validation / test records of every client
(:func:`client_records`, through :func:`fedrepro.fl.limits.rehearsal_limit`): the same code path on
a few examples, in every regime.  Every optimizer step is timed
(:class:`fedrepro.devices.StepTimer`, in :func:`~fedrepro.papers.fedsumm.algorithm.fedsumm_local_update`);
the ``seconds_*`` / ``peak_*`` statistics a client round returns are measurements, which the
runner moves out of the round log into the cell's provenance (``timing``).  A normal cell has no
``rehearsal`` key and reads, trains and logs exactly as before.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

from fedrepro.papers.fedsumm.algorithm import (
    ClientGuidance,
    FedSummConfig,
    fedsumm_local_update,
    load_trainable_state,
    trainable_state,
)
from fedrepro.data.seq2seq import IGNORE_INDEX, derive_seed
from fedrepro.devices import cell_device, configure_torch, cpu_state, model_device, to_device
from fedrepro.precision import Precision
from fedrepro.fl.limits import rehearsal_limit
from fedrepro.io import InputError, atomic_path, read_jsonl, write_json_atomic
from fedrepro.logs import RoundProgress

log = logging.getLogger(__name__)

MODELS = ("bart", "ct", "bart-cd")
"""``bart``: Chinese BART; ``ct``: CopyTransformer; ``bart-cd``: BART + copy distribution (Table II)."""
REGIMES = ("single", "all", "FedAvg", "FedSUMM")
FEDERATED_REGIMES = ("FedAvg", "FedSUMM")
LOCAL_REGIMES = ("single", "all")

WANTS_RECORDS = True
"""The runner passes this task the extra records of a train message (the FedSUMM guidance)."""

GUIDANCE_ARRAYS = "fedsumm-guidance"
"""Train-message record: the modulated gradient g̃ sent to a client (Algorithm 1's g)."""
GUIDANCE_CONFIG = "fedsumm-guidance-config"
"""Train-message record: ``rho``, ``previous-loss``, ``epsilon``, ``has-gradient`` (Algorithm 1's l, ρ)."""
REPLY_STEPS = "fedsumm-steps"
"""Reply record: the client's per-step training losses (``step-losses``)."""
REPLY_GRADIENT = "fedsumm-gradient"
"""Reply record (``client_gradient: mean_batch_gradient`` only): the client's gradient g^c."""


def _check_cell(cell: Mapping) -> None:
    if cell.get("model") not in MODELS:
        raise InputError(f"FedSUMM cell model must be one of {MODELS}, got {cell.get('model')!r}")
    if cell.get("regime") not in REGIMES:
        raise InputError(
            f"FedSUMM cell regime must be one of {REGIMES}, got {cell.get('regime')!r}"
        )


# -- models ---------------------------------------------------------------------------------------
def _backbone(backbone_dir: str):
    """(tokenizer, Chinese BART), resident once per process (:mod:`fedrepro.models.resident`);
    :func:`build_model` deep-copies it for every model that trains."""
    from fedrepro.models.resident import resident
    from fedrepro.papers.fedsumm.bart import load_chinese_bart

    # eager attention: eq. 7's inner product needs a double backward, which PyTorch's CPU
    # scaled-dot-product (flash) kernel does not implement; every regime uses the same kernel
    return resident("chinese-bart", backbone_dir,
                    lambda: load_chinese_bart(backbone_dir, attn_implementation="eager"))


def prepare_backbone(settings: dict, record_files: list[str], out_dir: str, seed: int = 0) -> Path:
    """The Chinese BART folder of every FedSUMM cell (rule ``fedsumm_backbone``): the pinned hub
    checkpoint (``kind: hub``; or a link to ``local_dir``), or at demo scale a tiny model whose
    character vocabulary is built from the *training* inputs and summaries of ``record_files``
    (``kind: shape``: the checkpoint's architecture at true size, random weights, the vocabulary
    from the same text)."""
    from fedrepro.papers.fedsumm.bart import prepare_chinese_bart

    texts: list[str] = []
    if settings.get("kind") in ("tiny", "shape"):
        for path in record_files:
            for r in read_jsonl(path):
                if r.get("split") == "train":
                    texts += [r["input"], r["target"]]
        if not texts:
            raise InputError(
                f"no training records in {record_files} to build the demo vocabulary from"
            )
    return prepare_chinese_bart(settings, texts, out_dir, seed)


def tokenizer(cell: Mapping):
    return _backbone(str(cell["backbone_dir"]))[0]


def build_model(cell: Mapping) -> torch.nn.Module:
    """A fresh model of ``cell['model']``: the same initial weights in every process (the BART
    weights come from the backbone folder; new parameters -- CT, the copy head -- are drawn from
    ``derive_seed(seed, "fedsumm-init", model)``)."""
    from fedrepro.papers.fedsumm.copy_transformer import BartWithCopy, CopyTransformer

    _check_cell(cell)
    tok, bart = _backbone(str(cell["backbone_dir"]))
    torch.manual_seed(derive_seed(int(cell["seed"]), "fedsumm-init", cell["model"]))
    if cell["model"] == "bart":
        model = copy.deepcopy(bart)
    elif cell["model"] == "bart-cd":
        model = BartWithCopy(
            copy.deepcopy(bart), attention=cell.get("copy_attention", "cross_attention")
        )
    else:
        model = CopyTransformer.from_tokenizer(tok, **dict(cell["copy_transformer"]))
    return model.to(cell_device(cell))


_WORKING: dict = {}
"""The resident *working* model of :func:`client_model`: ``{"key", "model", "rng", "lock"}``
(at most one: the model a process's clients train and evaluate in turn)."""
_WORKING_LOCK = threading.Lock()


def _working_key(cell: Mapping) -> tuple:
    """What a freshly built model of ``cell`` depends on besides the weights a client loads."""
    from fedrepro.models.resident import folder_identity

    _, bart = _backbone(str(cell["backbone_dir"]))
    folder = Path(cell["backbone_dir"]).resolve()
    return (
        id(bart),  # the resident backbone (a rebuilt folder is loaded again: a new object)
        # ...and its folder: an id is reused once its object is freed (a backbone dropped from the
        # resident cache), so the id alone could match a model built from another folder
        str(folder),
        folder_identity(folder),
        cell["model"],
        int(cell["seed"]),
        cell.get("copy_attention", "cross_attention"),
        json.dumps(cell.get("copy_transformer"), sort_keys=True) if cell["model"] == "ct" else None,
        str(cell_device(cell)),
    )


@contextlib.contextmanager
def client_model(cell: Mapping, state: Mapping[str, torch.Tensor], where: str):
    """A model of ``cell`` holding ``state`` (the received w_t) for one client's train or evaluate
    call: what ``load_shared_state(build_model(cell), state, where)`` gives, without building a
    116 M-parameter model per call (issue 25).

    The first call builds the model (:func:`build_model`) and keeps it, with the CPU random state
    :func:`build_model` leaves behind; a later call with the same :func:`_working_key` reuses it:
    it loads ``state`` into every trainable parameter (all of w_t: nothing of the previous client
    survives -- the frozen tensors are never trained, so they still hold the fresh build's values),
    drops the previous call's gradients and restores the random state a fresh build leaves, so
    what follows (dropout, the seeded training) draws the same numbers.  The model is lent to one
    call at a time: a call that finds it in use (a timed-out client still running) builds its own.
    """
    key = _working_key(cell)
    entry = _WORKING.get("entry")
    lock = entry["lock"] if entry is not None and entry["key"] == key else None
    if lock is None or not lock.acquire(blocking=False):
        if lock is not None:  # in use: a model of this call's own
            model = build_model(cell)
            load_shared_state(model, state, where)
            yield model
            return
        with _WORKING_LOCK:
            model = build_model(cell)
            entry = {"key": key, "model": model, "rng": torch.get_rng_state(),
                     "lock": threading.Lock()}
            _WORKING["entry"] = entry  # replaces (frees) the model of another cell
            entry["lock"].acquire()
    else:
        model = entry["model"]
        torch.manual_seed(derive_seed(int(cell["seed"]), "fedsumm-init", cell["model"]))
        torch.set_rng_state(entry["rng"])  # the CPU state a fresh build leaves
        for p in model.parameters():
            p.grad = None
    try:
        load_shared_state(model, state, where)
        yield model
    finally:
        entry["lock"].release()


def vocab_size(model) -> int:
    return int(model.config.vocab_size) if hasattr(model, "get_encoder") else int(model.vocab_size)


def shared_state(model) -> OrderedDict[str, torch.Tensor]:
    """The tensors on the wire: every trainable parameter, sorted by name, on the CPU."""
    return OrderedDict(sorted(cpu_state(trainable_state(model)).items()))


def load_shared_state(model, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Load received tensors (any key order) into the model's trainable parameters."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if set(names) != set(state):
        missing = sorted(set(names) - set(state))[:3]
        extra = sorted(set(state) - set(names))[:3]
        raise InputError(
            f"{where}: tensors do not match the model (missing {missing}, unexpected {extra})"
        )
    device = model_device(model)
    load_trainable_state(model, OrderedDict((n, state[n].to(device)) for n in names))


# -- data -----------------------------------------------------------------------------------------
def client_split_path(cell: Mapping, client: str, split: str) -> Path:
    try:
        folder = Path(cell["client_data"][client])
    except KeyError:
        raise InputError(f"FedSUMM cell has no data folder for client {client!r}") from None
    return folder / f"{split}.jsonl"


@functools.lru_cache(maxsize=64)
def _records(path: str) -> tuple:
    if not Path(path).is_file():
        raise InputError(f"{path}: missing, and so is the client's folder; build the client files "
                         f"first (rule client_files)")
    out = []
    for i, r in enumerate(read_jsonl(path)):
        for key in ("input", "target"):
            if not isinstance(r.get(key), str) or not r[key].strip():
                raise InputError(f"{path}: record {i + 1} ({r.get('id')}) has no text in '{key}'")
        out.append({"id": r.get("id"), "input": r["input"], "target": r["target"]})
    return tuple(out)


def client_records(cell: Mapping, client: str, split: str) -> tuple:
    """The records of one client's split, in file order (every record is checked).  A rehearsal
    cell keeps the first few (:func:`fedrepro.fl.limits.rehearsal_limit`: ``examples_per_client``
    of ``train``, ``eval_examples`` of ``val`` / ``test``); every training and evaluation read of
    this task goes through here."""
    path = client_split_path(cell, client, split)
    if not path.is_file() and path.parent.is_dir():  # the client files exist, this split does not
        have = sorted(p.stem for p in path.parent.glob("*.jsonl"))
        corpus = cell.get("corpus", "the corpus")
        raise InputError(
            f"{path}: client {client!r} has no {split!r} split file (its folder holds {have}): the "
            f"client split gave it no {split} records because the prepared {corpus} records have no "
            f"{split} split (see results/data/{corpus}/prepare_report.json, `counts`). NLPCC2017's "
            f"download has only train: set data.nlpcc2017.heldout_test_fraction to hold out a test "
            f"split, then rebuild the records, the client split and the client files"
        )
    return rehearsal_limit(cell, _records(str(path)), split)


def validation_split(cell: Mapping, client: str) -> str:
    """``val`` when the client has validation records, else ``test`` (NLPCC2017 ships no dev set)."""
    path = client_split_path(cell, client, "val")
    return "val" if path.is_file() and path.stat().st_size > 0 else "test"


def make_batch(cell: Mapping, model, tok, records, with_targets: bool = True) -> dict:
    from fedrepro.papers.fedsumm.copy_transformer import make_copy_batch

    t = cell["train"]
    batch = make_copy_batch(
        tok,
        [r["input"] for r in records],
        [r["target"] for r in records] if with_targets else None,
        vocab_size(model),
        int(t["max_source_length"]),
        int(t["max_target_length"]),
    )
    batch["unk_token_id"] = int(tok.unk_token_id)
    return to_device(batch, model_device(model))


def epoch_batches(cell: Mapping, model, tok, records, name: str, round_index: int):
    """``batches(epoch)``: a seeded shuffle per (seed, name, round, epoch), then batches."""
    bs = int(cell["train"]["batch_size"])

    def batches(epoch: int):
        g = torch.Generator().manual_seed(
            derive_seed(int(cell["seed"]), name, round_index, epoch, "fedsumm-batches")
        )
        order = torch.randperm(len(records), generator=g).tolist()
        return [
            make_batch(cell, model, tok, [records[i] for i in order[s : s + bs]])
            for s in range(0, len(order), bs)
        ]

    return batches


# -- losses and metrics ---------------------------------------------------------------------------
def _bart_logits_and_labels(model, batch: dict):
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
        use_cache=False,
    )
    # an extended (source-only) id is [UNK] for a model without copying; -100 (padding) stays
    labels = batch["labels"].masked_fill(
        batch["labels"] >= out.logits.shape[-1], int(batch["unk_token_id"])
    )
    return out.logits.float(), labels


def data_loss(model, batch: dict) -> torch.Tensor:
    """L_b: mean token NLL of the summary (BART's cross-entropy; the copy mixture's NLL for CT and
    BART + CD), over non-padding target tokens."""
    if hasattr(model, "get_encoder"):
        logits, labels = _bart_logits_and_labels(model, batch)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX
        )
    from fedrepro.papers.fedsumm.copy_transformer import copy_loss

    return copy_loss(model, batch)


@torch.no_grad()
def nll_sums(cell: Mapping, model, tok, records) -> tuple[float, int]:
    """Σ token NLL and the number of target tokens of ``records`` (perplexity = exp(Σ/n))."""
    from fedrepro.papers.fedsumm.copy_transformer import PROB_FLOOR, copy_probs

    model.eval()
    total, count = 0.0, 0
    bs = int(cell["generation"]["batch_size"])
    precision, device = Precision.from_cell(cell), model_device(model)
    for s in range(0, len(records), bs):
        batch = make_batch(cell, model, tok, records[s : s + bs])
        if hasattr(model, "get_encoder"):
            with precision.region(device), precision.autocast(device):
                logits, labels = _bart_logits_and_labels(model, batch)  # float32 logits
            logp = torch.log_softmax(logits, dim=-1)
            mask = labels != IGNORE_INDEX
            picked = logp.gather(2, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
            nll = -picked
        else:
            with precision.region(device), precision.autocast(device):
                probs = copy_probs(model, batch)
            labels = batch["labels"]
            mask = labels != IGNORE_INDEX
            picked = probs.gather(2, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
            nll = -torch.log(picked.clamp_min(PROB_FLOOR))
        total += float(nll[mask].double().sum())
        count += int(mask.sum())
    return total, count


@torch.no_grad()
def generate(cell: Mapping, model, tok, records) -> list[str]:
    """Summaries of ``records`` (beam search per ``cell['generation']``; copy models decode over the
    extended vocabulary with :func:`~fedrepro.papers.fedsumm.copy_transformer.generate_with_copy`),
    under the cell's precision (``fedsumm.precision``: bf16-mixed decodes under autocast)."""
    gen = cell["generation"]
    model.eval()
    out: list[str] = []
    bs = int(gen["batch_size"])
    precision, device = Precision.from_cell(cell), model_device(model)
    with precision.region(device), precision.autocast(device):
        for s in range(0, len(records), bs):
            out.extend(_generate_batch(cell, model, tok, records[s : s + bs], gen))
    return out


def _generate_batch(cell: Mapping, model, tok, records, gen: Mapping) -> list[str]:
    from fedrepro.papers.fedsumm.bart import decode_text
    from fedrepro.papers.fedsumm.copy_transformer import generate_with_copy

    batch = make_batch(cell, model, tok, records, with_targets=False)
    if hasattr(model, "get_encoder"):
        cfg = model.config
        ids = model.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            num_beams=int(gen["beam_size"]),
            max_new_tokens=int(gen["max_new_tokens"]),
            min_new_tokens=int(gen.get("min_new_tokens", 0)),
            no_repeat_ngram_size=int(gen.get("no_repeat_ngram_size", 0)),
            length_penalty=float(gen.get("length_penalty", 1.0)),
            early_stopping=int(gen["beam_size"]) > 1,
            do_sample=False,
            decoder_start_token_id=cfg.decoder_start_token_id,
            eos_token_id=cfg.eos_token_id,
            pad_token_id=cfg.pad_token_id,
        )
        return [decode_text(tok, row.tolist()) for row in ids]
    return generate_with_copy(
        model,
        tok,
        batch,
        max_new_tokens=int(gen["max_new_tokens"]),
        beam_size=int(gen["beam_size"]),
        min_new_tokens=int(gen.get("min_new_tokens", 0)),
        length_penalty=float(gen.get("length_penalty", 1.0)),
        no_repeat_ngram_size=int(gen.get("no_repeat_ngram_size", 0)),
    )


def evaluate_client(cell: Mapping, model, client: str, rouge: bool) -> dict:
    """One client's numbers for the round log: summed NLL / tokens on its validation split (or test,
    see :func:`validation_split`) and, with ``rouge``, the summed ROUGE-L F1 over its test split."""
    from fedrepro.metrics.rouge import rouge_scores

    tok = tokenizer(cell)
    split = validation_split(cell, client)
    nll, tokens = nll_sums(cell, model, tok, client_records(cell, client, split))
    out = {
        "nll_sum": nll,
        "tokens": tokens,
        "perplexity_split": split,
        "perplexity": math.exp(nll / tokens) if tokens else math.nan,
    }
    if rouge:
        test = client_records(cell, client, "test")
        scores = rouge_scores(
            generate(cell, model, tok, test), [r["target"] for r in test], lang="zh"
        )
        out["rougeL_sum"] = float(sum(scores["per_example"]["rougeL"]))
        out["test_examples"] = len(test)
    return out


def pool_evaluation(per_client: Mapping[str, dict]) -> dict:
    """Pooled numbers over clients: perplexity ``exp(Σ NLL / Σ tokens)``, ROUGE-L mean over examples."""
    nll = sum(e["nll_sum"] for e in per_client.values())
    tokens = sum(e["tokens"] for e in per_client.values())
    out = {
        "perplexity": math.exp(nll / tokens) if tokens else None,
        "nll_sum": nll,
        "tokens": tokens,
        "perplexity_splits": sorted({e["perplexity_split"] for e in per_client.values()}),
        "per_client": {c: dict(e) for c, e in sorted(per_client.items())},
    }
    if all("rougeL_sum" in e for e in per_client.values()) and per_client:
        n = sum(e["test_examples"] for e in per_client.values())
        out["rougeL"] = sum(e["rougeL_sum"] for e in per_client.values()) / n
    return out


# -- the runner protocol --------------------------------------------------------------------------
def is_federated(cell: dict) -> bool:
    _check_cell(cell)
    return cell["regime"] in FEDERATED_REGIMES


def initial_state(cell: dict) -> OrderedDict[str, torch.Tensor]:
    """w_0: the model's trainable parameters (BART: the backbone's; CT: seeded initialisation)."""
    return shared_state(build_model(cell))


def guidance_from_records(records: Mapping | None, model, where: str) -> ClientGuidance | None:
    """Algorithm 1's guidance for this client from the train message's extra records (None in a
    client's first round, and always for FedAvg)."""
    records = records or {}
    if GUIDANCE_CONFIG not in records:
        if GUIDANCE_ARRAYS in records:
            raise InputError(
                f"{where}: record {GUIDANCE_ARRAYS!r} came without {GUIDANCE_CONFIG!r}"
            )
        return None
    cfg = records[GUIDANCE_CONFIG]
    for key in ("rho", "previous-loss", "epsilon", "has-gradient"):
        if key not in cfg:
            raise InputError(f"{where}: record {GUIDANCE_CONFIG!r} lacks {key!r}")
    gradient = None
    if bool(cfg["has-gradient"]):
        if GUIDANCE_ARRAYS not in records:
            raise InputError(
                f"{where}: has-gradient is set but record {GUIDANCE_ARRAYS!r} is missing"
            )
        received = records[GUIDANCE_ARRAYS].to_torch_state_dict()
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        if set(received) != set(names):
            raise InputError(f"{where}: the modulated gradient's tensors do not match the model")
        device = model_device(model)
        gradient = OrderedDict((n, received[n].to(device)) for n in names)
    return ClientGuidance(
        gradient, float(cfg["rho"]), float(cfg["previous-loss"]), float(cfg["epsilon"])
    )


def _optimizer(cell: Mapping, model) -> torch.optim.Optimizer:
    """The local optimizer of ``fedsumm.train.optimizer`` over the trainable parameters, lr δ =
    ``fedsumm.train.lr``.

    ``sgd``: plain SGD, FedSUMM's local update -- eq. 3 ``w_k ← w_{k−1} − (η/batch) Σ_{i∈batch}
    ∇f_i(w)`` and Algorithm 1's ClientUpdate ``w ← w − δ∇M(w, b)`` (no momentum; ``weight_decay``
    adds ``weight_decay·w`` to the gradient).  ``adamw`` (default when the key is absent):
    ``torch.optim.AdamW`` (decoupled weight decay), not in the paper.  Federated clients build a
    fresh one every round; ``single`` / ``all`` keep one across rounds (checkpointed).
    """
    from fedrepro.papers.fedsumm.grid import train_optimizer

    t = cell["train"]
    params = [p for p in model.parameters() if p.requires_grad]
    lr, decay = float(t["lr"]), float(t.get("weight_decay", 0.0))
    if train_optimizer(t) == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=decay)


def _finite(stats: Mapping) -> dict:
    return {k: v for k, v in stats.items() if not (isinstance(v, float) and not math.isfinite(v))}


def client_train_round(
    cell: dict,
    client: str,
    round_index: int,
    server_state: dict[str, torch.Tensor],
    records: Mapping | None = None,
):
    """Algorithm 1, ClientUpdate(c, w, g, l) for FedSUMM; plain local training for FedAvg.

    Returns the trained parameters (sorted names), the round statistics and the extra reply
    records (per-step losses; the gradient when ``client_gradient`` is ``mean_batch_gradient``).
    """
    configure_torch(cell["threads"])
    where = f"round {round_index}, client {client}"
    with client_model(cell, server_state, where) as model:
        return _train_round(cell, client, round_index, model, records, where)


def flop_key(cell: Mapping) -> str:
    """The rehearsal's FLOP-count key of a cell's steps (:class:`fedrepro.devices.StepTimer`:
    one counted step per key and process): ``fedsumm:<model>:<regime>`` -- a row job trains its
    model's four regimes in one process, and each cell's report row needs its own count."""
    return f"fedsumm:{cell['model']}:{cell['regime']}"


def _train_round(cell: dict, client: str, round_index: int, model, records, where: str):
    from flwr.app import ArrayRecord, MetricRecord

    guidance = guidance_from_records(records, model, where)
    if guidance is not None and cell["regime"] != "FedSUMM":
        raise InputError(f"{where}: a {cell['regime']} client received FedSUMM guidance")
    config = FedSummConfig.from_config(cell["algorithm"])
    tok = tokenizer(cell)
    train = client_records(cell, client, "train")
    batches = epoch_batches(cell, model, tok, train, client, round_index)
    optimizer = _optimizer(cell, model)
    torch.manual_seed(derive_seed(int(cell["seed"]), client, round_index, "fedsumm-torch"))
    res = fedsumm_local_update(
        model,
        batches,
        data_loss,
        optimizer,
        guidance,
        config,
        local_epochs=int(cell["train"]["local_epochs"]),
        max_grad_norm=cell["train"].get("max_grad_norm"),
        precision=Precision.from_cell(cell),
        flop_key=flop_key(cell),
    )
    stats = _finite(
        {
            "num_examples": len(train),
            "train_loss": res.loss,
            "n_steps": res.n_steps,
            "objective_term": res.mean_objective_term,
            "grad_norm": res.mean_grad_norm,
            "guided": int(guidance is not None),
            **res.timing,  # seconds_* / peak_*: moved to provenance timing by the strategy
        }
    )
    reply = {REPLY_STEPS: MetricRecord({"step-losses": [float(x) for x in res.step_losses]})}
    if config.client_gradient == "mean_batch_gradient":
        reply[REPLY_GRADIENT] = ArrayRecord(OrderedDict(sorted(cpu_state(res.gradient).items())))
    return shared_state(model), stats, reply


def client_evaluate(
    cell: dict, client: str, round_index: int, server_state: dict[str, torch.Tensor]
) -> dict:
    """The global model of round ``round_index`` on this client's data (a Flower evaluate message)."""
    configure_torch(cell["threads"])
    where = f"evaluation after round {round_index}, client {client}"
    with client_model(cell, server_state, where) as model:
        out = evaluate_client(cell, model, client, bool(cell.get("rouge_every_round", False)))
    split = out.pop("perplexity_split")
    out["split_is_val"] = int(split == "val")
    out["num_examples"] = len(client_records(cell, client, split))
    return out


def _local_state_paths(cell: Mapping, round_index: int) -> Path:
    return Path(cell["out_dir"]) / "checkpoints" / f"optimizer_round_{round_index:03d}.pt"


def run_local(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """``single`` / ``all``: train one model on the pooled training data of ``cell['clients']`` for
    ``rounds × local_epochs`` epochs (the federated regimes' budget), one round at a time with the
    model and optimizer state checkpointed, so that a killed run resumes bit-identically; the model is
    evaluated on the N clients' data after every round (the curves of Fig. 3-5)."""
    from fedrepro.fl.checkpoint import checkpoint_paths, prepare_checkpoints
    from fedrepro.fl.checkpoint import load_state, save_state

    configure_torch(cell["threads"])
    if cell["regime"] not in LOCAL_REGIMES:
        raise InputError(f"run_local is for {LOCAL_REGIMES}, not {cell['regime']!r}")
    rounds = int(cell["train"]["rounds"])
    model = build_model(cell)
    optimizer = _optimizer(cell, model)
    done = prepare_checkpoints(cell)
    if done:
        load_shared_state(
            model,
            load_state(checkpoint_paths(cell["out_dir"], done)[0]),
            f"{cell['out_dir']} round {done}",
        )
        optimizer.load_state_dict(torch.load(_local_state_paths(cell, done), weights_only=True))
        log.info("resuming %s from round %d", cell["out_dir"], done)
    tok = tokenizer(cell)
    train = tuple(r for c in cell["clients"] for r in client_records(cell, c, "train"))
    name = cell["clients"][0] if cell["regime"] == "single" else f"{cell['corpus']}-all"
    config = FedSummConfig.from_config(cell["algorithm"])
    progress = RoundProgress(rounds, len(cell["clients"]), start_round=done, logger=log)
    for r in range(done + 1, rounds + 1):
        t0 = time.perf_counter()
        torch.manual_seed(derive_seed(int(cell["seed"]), name, r, "fedsumm-torch"))
        res = fedsumm_local_update(
            model,
            epoch_batches(cell, model, tok, train, name, r),
            data_loss,
            optimizer,
            None,
            config,
            local_epochs=int(cell["train"]["local_epochs"]),
            max_grad_norm=cell["train"].get("max_grad_norm"),
            precision=Precision.from_cell(cell),
            flop_key=flop_key(cell),
        )
        rouge = bool(cell.get("rouge_every_round", False))
        evaluation = pool_evaluation(
            {c: evaluate_client(cell, model, c, rouge) for c in cell["eval_clients"]}
        )
        state_path, meta_path = checkpoint_paths(cell["out_dir"], r)
        save_state(state_path, shared_state(model))
        with atomic_path(_local_state_paths(cell, r), suffix=".pt") as tmp:
            torch.save(optimizer.state_dict(), tmp)
        old = _local_state_paths(cell, r - 2)
        if r > 2 and old.exists() and not cell.get("keep_round_checkpoints", False):
            old.unlink()
        write_json_atomic(
            meta_path,
            {
                "round": r,
                "regime": cell["regime"],
                "clients": [
                    {
                        "client": name,
                        "num_examples": len(train),
                        "train_loss": res.loss,
                        "n_steps": res.n_steps,
                        **res.timing,  # measurements: run_cell moves them to provenance timing
                    }
                ],
                "step_losses": {name: res.step_losses},
                "evaluation": evaluation,
                "bytes_down": 0,
                "bytes_up": 0,
                "seconds": time.perf_counter() - t0,
            },
        )
        progress.log(r, extra=f"{cell['regime']} loss {res.loss:.4f}, perplexity "
                              f"{evaluation['perplexity'] or math.nan:.3f}")
    return final_states(cell)


def final_states(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """The one model every regime is evaluated with: w_T (FedAvg, FedSUMM) or the trained model."""
    from fedrepro.fl.checkpoint import checkpoint_paths
    from fedrepro.fl.checkpoint import load_state

    return {"model": load_state(checkpoint_paths(cell["out_dir"], int(cell["train"]["rounds"]))[0])}


def parameter_report(cell: dict) -> dict:
    n = sum(p.numel() for p in build_model(cell).parameters() if p.requires_grad)
    federated = cell["regime"] in FEDERATED_REGIMES
    return {
        "trainable": n,
        "shared_per_round": n if federated else 0,
        "guidance_per_round": n if cell["regime"] == "FedSUMM" else 0,
        "trainable_share": 1.0,
        "shared_share": 1.0 if federated else 0.0,
    }


def dp_caveat(cell: Mapping) -> str | None:
    """Where the accounting's premise -- each client's clipped update is a function of its own
    data and of released models only -- does not hold exactly for this cell (None: it holds)."""
    algorithm = FedSummConfig.from_config(cell.get("algorithm"))
    if cell["regime"] != "FedSUMM" or algorithm.epsilon == 0:  # ε = 0: the adapter is the identity
        return None
    reasons = []
    if algorithm.memory_assignment == "rank":
        reasons.append("memory_assignment rank adds another client's unclipped memory gradient to "
                       "client c's update")
    if algorithm.rho_reference == "round_mean":
        reasons.append("rho_reference round_mean makes rho_c (the scale 1 + eps*rho_c of client c's "
                       "update, and the rho_c sent to client c) depend on the other clients' "
                       "unreleased models")
    if not reasons:
        return None
    return ("epsilon assumes per-client sensitivity C_t, which FedSUMM's adapter weakens here: "
            + "; ".join(reasons) + " (docs/decisions-fedsumm.md, Differential privacy)")


def before_cleanup(cell: dict) -> dict:
    """The privacy accounting of a DP cell for its provenance (``dp``): the settings, ε after every
    round (:func:`fedrepro.fl.privacy.accounting_report`) and the clip norm of every round; {} for
    a cell without DP."""
    from fedrepro.fl.checkpoint import round_log
    from fedrepro.fl.privacy import DPSettings, accounting_report

    dp = DPSettings.from_config(cell.get("dp"), key="cell dp")
    if not (is_federated(cell) and dp.enabled and cell["regime"] in dp.regimes):
        return {}
    rounds = int(cell["train"]["rounds"])
    m = FedSummConfig.from_config(cell.get("algorithm")).clients_per_round or len(cell["clients"])
    report = accounting_report(dp, rounds, m, len(cell["clients"]))
    report["clip_norm_per_round"] = [e["dp"]["clip_norm"] for e in round_log(cell["out_dir"], rounds)]
    report["caveat"] = dp_caveat(cell)
    return {"dp": report}


EVALUATED_MODEL = {
    "single": "the model trained on the first client's data",
    "all": "the model trained on the pooled data of the N clients",
    "FedAvg": "the final global model w_T",
    "FedSUMM": "the final global model w_T",
}


def evaluate_cell(cell: dict, finals_path: str, predictions_out: str, scores_out: str) -> dict:
    """Character ROUGE-1/2/L F1 (and perplexity) of the cell's final model on the test data of the
    N clients; writes predictions (jsonl) and ``scores.json`` atomically."""
    from fedrepro.fl.cell import load_final_adapters
    from fedrepro.io import write_jsonl_atomic
    from fedrepro.metrics.rouge import ROUGE_TYPES, rouge_scores

    configure_torch(cell["threads"])
    finals = load_final_adapters(finals_path)
    if "model" not in finals:
        raise InputError(f"{finals_path}: no 'model' state (not a FedSUMM cell's output)")
    model = build_model(cell)
    load_shared_state(model, finals["model"], finals_path)
    tok = tokenizer(cell)
    preds, refs, owners, rows = [], [], [], []
    ppl = {}
    for client in cell["eval_clients"]:
        test = client_records(cell, client, "test")
        out = generate(cell, model, tok, test)
        preds += out
        refs += [r["target"] for r in test]
        owners += [client] * len(test)
        rows += [
            {"client": client, "id": r["id"], "prediction": p, "reference": r["target"]}
            for r, p in zip(test, out)
        ]
        split = validation_split(cell, client)
        nll, tokens = nll_sums(cell, model, tok, client_records(cell, client, split))
        ppl[client] = {"nll_sum": nll, "tokens": tokens, "perplexity_split": split}
    scores = rouge_scores(preds, refs, lang="zh")
    per_client = {}
    for client in cell["eval_clients"]:
        idx = [i for i, o in enumerate(owners) if o == client]
        per_client[client] = {
            t: sum(scores["per_example"][t][i] for i in idx) / len(idx) for t in ROUGE_TYPES
        }
        per_client[client]["n"] = len(idx)
        per_client[client]["perplexity"] = math.exp(ppl[client]["nll_sum"] / ppl[client]["tokens"])
    nll = sum(p["nll_sum"] for p in ppl.values())
    tokens = sum(p["tokens"] for p in ppl.values())
    result = {
        "paper": "fedsumm",
        "scale": cell["scale"],
        "corpus": cell["corpus"],
        "num_clients": int(cell["num_clients"]),
        "model": cell["model"],
        "regime": cell["regime"],
        "seed": int(cell["seed"]),
        "evaluated_model": EVALUATED_MODEL[cell["regime"]],
        "rouge": "character ROUGE F1 x 100 (fedrepro.metrics.rouge, lang=zh), mean over test examples",
        **{t: scores[t] for t in ROUGE_TYPES},
        "n": scores["n"],
        "perplexity": math.exp(nll / tokens),
        "perplexity_splits": sorted({p["perplexity_split"] for p in ppl.values()}),
        "per_client": per_client,
    }
    write_jsonl_atomic(predictions_out, rows)
    write_json_atomic(scores_out, result)
    return result


def run_row(cells: list[dict]) -> None:
    """Train and evaluate the cells of one workflow job (a table row's regimes), in order; each
    cell resumes from its own checkpoints (:func:`fedrepro.fl.cell.run_cell`), and what a killed
    earlier run of the job finished is restored, not run again: a trained cell is only
    evaluated, an evaluated one skipped (:func:`fedrepro.fl.rows.run_row`)."""
    from fedrepro.fl.cell import run_cell
    from fedrepro.fl.rows import run_row as run_stages

    def train(cell: dict) -> None:
        out = Path(cell["out_dir"])
        t0 = time.perf_counter()
        run_cell(cell, str(out / "adapters.safetensors"), str(out / "train_log.json"),
                 str(out / "provenance.json"))
        log.info("%s trained in %.1f s", out, time.perf_counter() - t0)

    def evaluate(cell: dict) -> None:
        out = Path(cell["out_dir"])
        evaluate_cell(cell, str(out / "adapters.safetensors"), str(out / "predictions.jsonl"),
                      str(out / "scores.json"))

    run_stages(cells, [(("adapters.safetensors", "train_log.json", "provenance.json"), train),
                       (("predictions.jsonl", "scores.json"), evaluate)])
