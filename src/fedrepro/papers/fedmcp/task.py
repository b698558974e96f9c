"""FedMCP cells (FedMCP §V): one GLUE task per client, a frozen RoBERTa, the methods of
:mod:`fedrepro.papers.fedmcp.methods`.

This is the FedMCP *task* of the federated runner (:mod:`fedrepro.fl.tasks`): what one client
does in one round, what the server starts from, what a finished cell keeps.

Per client and round (:func:`client_train_round`):

1. build the client's model: a fresh copy of the frozen encoder wrapped by the method
   (:func:`fedrepro.papers.fedmcp.methods.build_model`); its private parts (private adapter,
   heads g1/g2, LoRA/FT head) are drawn from ``derive_seed(seed, "fedmcp-init", client)`` in
   the client's first round and loaded afterwards from its own file of the last round it took
   part in (the previous round with full participation; with ``clients_per_round`` a client
   keeps its state unchanged over the rounds it is not sampled in);
2. run :func:`fedmcp_methods.local_update` with the server's average (the shared tensors);
3. evaluate the model the client now holds on its own test split (accuracy, every round: the
   curve of Fig. 3 and the final number of Table I);
4. write ``clients/<client>/round_<r>.safetensors`` = ``sent.*`` (its post-update shared tensors,
   also MOON's "previous model") + ``private.*`` (every other trainable tensor), and return the
   shared tensors for aggregation.

Which model is tested (the paper is silent): the model each client holds after its local update
in the last round -- its private parts with its own locally updated copy of the shared ones (with
``clients_per_round``: after the last round it was sampled in; a client never sampled: its
initial private parts with the final global tensors).
This is the personalised model FedMCP (and FedRep, MOON, FedMatch) end with, and the same rule
applies to every method, Local included (docs/decisions.md).

Nothing here knows about Flower; the same function is called by the Flower ClientApp, by the
in-process engine and (for Local) by the plain loop of :func:`run_local`.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections import OrderedDict
from pathlib import Path

import torch

from fedrepro.papers.fedmcp.methods import LocalHParams, build_model, get_method, local_update
from fedrepro.data.seq2seq import derive_seed
from fedrepro.data.sources.glue import LABEL_NAMES
from fedrepro.devices import cell_device, configure_torch, cpu_state, model_device, to_device
from fedrepro.precision import Precision
from fedrepro.fl.limits import rehearsal_limit
from fedrepro.fl.strategy import is_measurement
from fedrepro.io import InputError, read_jsonl
from fedrepro.logs import RoundProgress

log = logging.getLogger(__name__)


# -- model --------------------------------------------------------------------------------
def num_labels(client: str) -> int:
    try:
        return len(LABEL_NAMES[client])
    except KeyError:
        raise InputError(f"FedMCP client {client!r} is not a GLUE task; known: {sorted(LABEL_NAMES)}") from None


def _encoder(backbone_dir: str, seed: int):
    """The backbone encoder, resident once per process (:mod:`fedrepro.models.resident`); every
    client model is a deep copy of it (:func:`build_client_model`), so Full FT's training never
    reaches the resident one."""
    from fedrepro.models.backbones import load_encoder
    from fedrepro.models.resident import resident

    return resident("encoder", backbone_dir, lambda: load_encoder(backbone_dir, seed).eval(), seed)


@functools.lru_cache(maxsize=2)
def _tokenizer(backbone_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(backbone_dir)


def build_client_model(cell: dict, client: str, labels: int | None = None):
    """A fresh model of ``cell['method']`` for ``client`` (private parts seeded per client).

    ``fedmcp.frozen_dtype: bf16``: the copied backbone's frozen tensors are stored in bfloat16
    (:meth:`fedrepro.precision.Precision.cast_frozen`); adapters, heads and LoRA tensors -- what
    trains -- stay float32, and Full FT (nothing frozen) is unchanged."""
    base = copy.deepcopy(_encoder(str(cell["backbone_dir"]), int(cell["seed"])))
    torch.manual_seed(derive_seed(int(cell["seed"]), "fedmcp-init", client))
    model = build_model(cell["method"], base, labels or num_labels(client), cell.get("model") or {})
    Precision.from_cell(cell).cast_frozen(model.backbone_module())
    return model.to(cell_device(cell))


def method_spec(cell: dict):
    """The cell's method at its baseline sizing (``model.baseline_adapters``, default paper)."""
    return get_method(cell["method"], str((cell.get("model") or {}).get("baseline_adapters", "paper")))


def _received_ids(model) -> set[int]:
    return {id(p) for p in model._received_parameters().values()}


def private_state(model) -> OrderedDict[str, torch.Tensor]:
    """Every trainable tensor the server's average does not replace (private adapter, heads...;
    FedMatch's patch, uploaded but kept, is both sent and private)."""
    shared = _received_ids(model)
    return OrderedDict(
        (name, p.detach().clone())
        for name, p in model.named_parameters()
        if p.requires_grad and id(p) not in shared
    )


def load_private_state(model, state: dict[str, torch.Tensor], where: str) -> None:
    own = private_state(model)
    if set(own) != set(state):
        raise InputError(
            f"{where}: private tensors do not match method {model.spec.name}: missing "
            f"{sorted(set(own) - set(state))[:3]}, unexpected {sorted(set(state) - set(own))[:3]}"
        )
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, v in state.items():
            params[k].copy_(v)


def load_client_state(model, state: dict[str, torch.Tensor], where: str) -> None:
    """Load a saved client file (``sent.*`` + ``private.*``) into a fresh model."""
    sent = {k[len("sent."):]: v for k, v in state.items() if k.startswith("sent.")}
    private = {k[len("private."):]: v for k, v in state.items() if k.startswith("private.")}
    if sent or model.shared_state():
        model.load_shared_state(sent)
    load_private_state(model, private, where)


# -- data ---------------------------------------------------------------------------------
def client_split_path(cell: dict, client: str, split: str) -> Path:
    try:
        folder = Path(cell["client_data"][client])
    except KeyError:
        raise InputError(f"cell has no data folder for client {client!r}") from None
    return folder / f"{split}.jsonl"


@functools.lru_cache(maxsize=32)
def _examples(path: str, backbone_dir: str, max_length: int, n_labels: int) -> tuple:
    records = read_jsonl(path)
    if not records:
        raise InputError(f"{path}: no records; the client's partition is empty")
    tok = _tokenizer(backbone_dir)
    out = []
    for i, r in enumerate(records):
        label = r.get("label")
        if not isinstance(label, int) or not 0 <= label < n_labels:
            raise InputError(
                f"{path}: record {i + 1} ({r.get('id')}) has label {label!r}; FedMCP needs labelled "
                f"records with 0 <= label < {n_labels} (official GLUE test rows are unlabelled)"
            )
        if r.get("text_b"):
            ids = tok(r["text_a"], r["text_b"], truncation=True, max_length=max_length)["input_ids"]
        else:
            ids = tok(r["text_a"], truncation=True, max_length=max_length)["input_ids"]
        out.append((tuple(ids), label))
    return tuple(out)


def client_examples(cell: dict, client: str, split: str) -> tuple:
    """Tokenised examples of one client's split (a rehearsal cell keeps the first few,
    :func:`fedrepro.fl.limits.rehearsal_limit`)."""
    examples = _examples(
        str(client_split_path(cell, client, split)), str(cell["backbone_dir"]),
        int(cell["max_length"]), num_labels(client),
    )
    return rehearsal_limit(cell, examples, split)


def collate(examples, pad_id: int) -> dict:
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (x, _) in enumerate(examples):
        ids[row, : len(x)] = torch.tensor(x)
        mask[row, : len(x)] = 1
    labels = torch.tensor([y for _, y in examples], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def epoch_batches(examples, batch_size: int, seed: int, client: str, round_index: int, pad_id: int):
    """``batches(epoch)``: a seeded shuffle per (seed, client, round, epoch), then fixed-size batches."""

    def batches(epoch: int):
        g = torch.Generator().manual_seed(derive_seed(seed, client, round_index, epoch, "fedmcp-batches"))
        order = torch.randperm(len(examples), generator=g).tolist()
        return [
            collate([examples[i] for i in order[s : s + batch_size]], pad_id)
            for s in range(0, len(order), batch_size)
        ]

    return batches


@torch.no_grad()
def accuracy(model, examples, batch_size: int, pad_id: int,
             precision=None) -> tuple[float, list[int]]:
    """Accuracy (%) of the evaluated model on ``examples`` and its predictions (forward passes
    under ``precision``, :class:`fedrepro.precision.Precision`; ``None``: fp32)."""
    model.eval()
    device = model_device(model)
    precision = Precision.of(precision)
    preds: list[int] = []
    for s in range(0, len(examples), batch_size):
        batch = to_device(collate(examples[s : s + batch_size], pad_id), device)
        with precision.region(device), precision.autocast(device):
            logits, _ = model(batch["input_ids"], batch["attention_mask"])
        preds.extend(logits.argmax(-1).tolist())
    correct = sum(int(p == y) for p, (_, y) in zip(preds, examples))
    return 100.0 * correct / len(examples), preds


# -- the runner protocol ------------------------------------------------------------------
def is_federated(cell: dict) -> bool:
    return method_spec(cell).federated


CLIENT_STATE_PREFIX = "round_"


def client_state_path(cell: dict, client: str, round_index: int) -> Path:
    return Path(cell["out_dir"]) / "clients" / client / f"{CLIENT_STATE_PREFIX}{round_index:03d}.safetensors"


def initial_state(cell: dict) -> OrderedDict[str, torch.Tensor]:
    """θ⁰ of the shared tensors, the same for every client (seeded by the cell seed)."""
    model = build_client_model(cell, "server", labels=2)
    return OrderedDict(cpu_state(model.shared_state()))


def client_train_round(
    cell: dict, client: str, round_index: int, server_state: dict[str, torch.Tensor]
) -> tuple[OrderedDict[str, torch.Tensor], dict]:
    """One client round (FedMCP Algorithm 1, LocalUpdate, or the method's equivalent)."""
    from fedrepro.fl.checkpoint import latest_client_round, load_state, save_state

    configure_torch(cell["threads"])
    model = build_client_model(cell, client)
    spec = model.spec
    prev_sent = None
    folder = client_state_path(cell, client, round_index).parent
    prev_round = latest_client_round(folder, CLIENT_STATE_PREFIX, round_index - 1) if round_index > 1 else 0
    if prev_round:  # else: the client's first round (round 1, or first sampled later)
        prev = client_state_path(cell, client, prev_round)
        saved = load_state(prev)
        load_private_state(
            model, {k[len("private."):]: v for k, v in saved.items() if k.startswith("private.")}, str(prev)
        )
        prev_sent = OrderedDict((k[len("sent."):], v) for k, v in saved.items() if k.startswith("sent."))
        if not spec.federated:  # Local: its "shared" part is empty; everything is private
            prev_sent = None
    hp = LocalHParams.from_config(cell["train"])
    pad_id = int(model_pad_id(cell))
    train = client_examples(cell, client, "train")
    on_cpu = epoch_batches(train, int(cell["train"]["batch_size"]), int(cell["seed"]), client, round_index, pad_id)
    device = model_device(model)

    def batches(epoch: int):
        return [to_device(b, device) for b in on_cpu(epoch)]

    torch.manual_seed(derive_seed(int(cell["seed"]), client, round_index, "fedmcp-torch"))
    stats = local_update(
        model, spec, batches, hp,
        server_state if spec.federated else None,
        prev_sent if spec.objective == "moon" else None,
        precision=Precision.from_cell(cell),
    )
    out = {
        "num_examples": len(train),
        "train_loss": float(stats["loss"]),
        "n_steps": int(stats["n_steps"]),
    }
    out.update({k: float(v) for k, v in stats.items() if k.startswith("L_")})
    out.update({k: float(v) for k, v in stats.items() if is_measurement(k)})  # provenance only
    if cell.get("eval_every_round", True):
        acc, _ = accuracy(model, client_examples(cell, client, "test"), int(cell["eval_batch_size"]), pad_id,
                          Precision.from_cell(cell))
        out["test_accuracy"] = acc
    sent = OrderedDict(cpu_state(model.shared_state()))
    state = OrderedDict([(f"sent.{k}", v) for k, v in sent.items()]
                        + [(f"private.{k}", v) for k, v in cpu_state(private_state(model)).items()])
    save_state(client_state_path(cell, client, round_index), state)
    if prev_round > 1 and not cell.get("keep_round_checkpoints", False):
        # a resume needs the file this round started from (prev_round), or an older one while the
        # previous round's checkpoint is still being written (fedrepro.fl.checkpoint)
        from fedrepro.fl.checkpoint import client_files_needed_from

        keep = client_files_needed_from(cell["out_dir"], client_state_path(cell, client, 1).parent,
                                        CLIENT_STATE_PREFIX, prev_round)
        for r in range(1, keep):
            old = client_state_path(cell, client, r)
            if old.exists():
                old.unlink()
    return sent, out


def model_pad_id(cell: dict) -> int:
    return int(_tokenizer(str(cell["backbone_dir"])).pad_token_id)


def run_local(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """Local: every client trains alone for ``rounds × epochs`` epochs (same budget as the
    federated methods), one round at a time so that a killed run resumes."""
    from fedrepro.fl.checkpoint import checkpoint_paths, prepare_checkpoints
    from fedrepro.fl.checkpoint import save_state
    from fedrepro.io import write_json_atomic

    rounds = int(cell["train"]["rounds"])
    done = prepare_checkpoints(cell)
    progress = RoundProgress(rounds, len(cell["clients"]), start_round=done, logger=log)
    for r in range(done + 1, rounds + 1):
        t0 = time.perf_counter()
        entries = []
        for pid, client in enumerate(cell["clients"]):
            _, stats = client_train_round(cell, client, r, {})
            entries.append({"partition_id": pid, "client": client, **stats})
        state_path, meta_path = checkpoint_paths(cell["out_dir"], r)
        save_state(state_path, {})
        write_json_atomic(meta_path, {"round": r, "clients": entries, "bytes_down": 0, "bytes_up": 0,
                                      "seconds": time.perf_counter() - t0})
        progress.log(r)
    return final_states(cell)


def final_states(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """Each evaluated client's file of the last round it took part in (every round with full
    participation; with ``clients_per_round``, which round is read from the server's round log).
    A client never sampled: its initial private parts (as drawn for its first round) with the
    final global tensors (the last server checkpoint) as its shared ones (docs/decisions.md)."""
    from fedrepro.fl.checkpoint import checkpoint_paths, last_participation, load_state

    rounds = int(cell["train"]["rounds"])
    last = last_participation(cell["out_dir"], cell["clients"], rounds)
    out = {}
    for c in cell["eval_clients"]:
        if last.get(c):
            out[c] = load_state(client_state_path(cell, c, last[c]))
            continue
        log.warning("client %s was never sampled: initial private parts, final global tensors", c)
        server = load_state(checkpoint_paths(cell["out_dir"], rounds)[0])
        private = cpu_state(private_state(build_client_model(cell, c)))
        out[c] = OrderedDict(sorted([(f"sent.{k}", v) for k, v in server.items()]
                                    + [(f"private.{k}", v) for k, v in private.items()]))
    return out


def parameter_report(cell: dict) -> dict:
    """Trainable and communicated parameters of the run's model, relative to full fine-tuning
    of the same backbone (backbone + one linear head), for a 2-class client."""
    model = build_client_model(cell, "count", labels=2)
    backbone = sum(p.numel() for p in _encoder(str(cell["backbone_dir"]), int(cell["seed"])).parameters())
    hidden = _encoder(str(cell["backbone_dir"]), int(cell["seed"])).config.hidden_size
    full_ft = backbone + hidden * 2 + 2
    trainable = sum(p.numel() for p in model.trainable_parameters())
    shared = sum(v.numel() for v in model.shared_state().values()) if model.spec.federated else 0
    return {"full_finetune": full_ft, "trainable": trainable, "trainable_share": trainable / full_ft,
            "shared_per_round": shared, "shared_share": shared / full_ft}


def evaluate_cell(cell: dict, finals_path: str, predictions_out: str, scores_out: str) -> dict:
    """Accuracy of each client's final model on its own test split (Table I); writes the
    per-example predictions and ``scores.json`` (``{client: {"accuracy", "n"}}``) atomically."""
    from fedrepro.fl.cell import load_final_adapters
    from fedrepro.io import write_json_atomic, write_jsonl_atomic

    configure_torch(cell["threads"])
    finals = load_final_adapters(finals_path, allow_empty=True)
    scores, rows = {}, []
    pad_id = model_pad_id(cell)
    for client in cell["eval_clients"]:
        if client not in finals:
            raise InputError(f"{finals_path}: no final state for client {client}")
        model = build_client_model(cell, client)
        load_client_state(model, finals[client], f"{finals_path}[{client}]")
        test = client_examples(cell, client, "test")
        acc, preds = accuracy(model, test, int(cell["eval_batch_size"]), pad_id, Precision.from_cell(cell))
        records = rehearsal_limit(cell, read_jsonl(client_split_path(cell, client, "test")), "test")
        rows.extend({"client": client, "id": r["id"], "label": y, "prediction": p}
                    for r, (_, y), p in zip(records, test, preds))
        scores[client] = {"accuracy": acc, "n": len(test)}
    write_jsonl_atomic(predictions_out, rows)
    write_json_atomic(scores_out, {"paper": "fedmcp", "method": cell["method"], "seed": cell["seed"],
                                   "scale": cell["scale"], "clients": scores})
    return scores
