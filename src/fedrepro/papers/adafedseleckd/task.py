"""AdaFedSelecKD cells: client-side work shared by the Flower ClientApp and the non-federated
runner (the AdaFedSelecKD *task* of :mod:`fedrepro.fl.tasks`).

A *cell* (one training run) is described by a plain JSON-able dict, built by the workflow from
the config and the wildcards (see :func:`fedrepro.fl.cell.make_cell`).  Everything a client does
reads only that client's own partition folder.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from pathlib import Path

import torch

from fedrepro.papers.adafedseleckd.methods import (
    TrainHParams,
    get_method,
    local_update,
    make_optimizer,
)
from fedrepro.data.seq2seq import derive_seed, tokenize_records
from fedrepro.devices import cell_device, configure_torch, cpu_state
from fedrepro.fl.checkpoint import last_participation, latest_client_round, load_state, save_state
from fedrepro.fl.checkpoint import checkpoint_paths, prepare_checkpoints
from fedrepro.fl.limits import rehearsal_limit
from fedrepro.io import InputError, atomic_path, read_jsonl, write_json_atomic

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _cached_model(backbone_dir: str, top_k: int, bottleneck: int, roles: tuple[str, ...], seed: int,
                  device: str = "cpu", backbone_dropout: bool = False):
    from fedrepro.papers.adafedseleckd.model import build_summarizer

    tokenizer, model = build_summarizer(backbone_dir, top_k, bottleneck, roles, seed, backbone_dropout)
    return tokenizer, model.to(device)


def get_model(cell: dict):
    """(tokenizer, AdapterSummarizer) for a cell; cached per process (Ray actors reuse it)."""
    spec = get_method(cell["method"])
    return _cached_model(
        str(cell["backbone_dir"]),
        int(cell["adapter_top_k"]),
        int(cell["bottleneck"]),
        spec.roles,
        int(cell["seed"]),
        str(cell_device(cell)),
        bool(cell["train"].get("backbone_dropout", False)),
    )


def client_split_path(cell: dict, client: str, split: str) -> Path:
    try:
        folder = Path(cell["client_data"][client])
    except KeyError:
        raise InputError(f"cell has no data folder for client {client!r}") from None
    return folder / f"{split}.jsonl"


@functools.lru_cache(maxsize=16)
def _cached_examples(path: str, tokenizer_dir: str, max_source: int, max_target: int) -> tuple:
    tokenizer = _tokenizer(tokenizer_dir)
    records = read_jsonl(path)
    if not records:
        raise InputError(f"{path}: no records; the client's partition is empty")
    return tuple(tokenize_records(records, tokenizer, max_source, max_target))


@functools.lru_cache(maxsize=4)
def _tokenizer(backbone_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(backbone_dir)


def client_examples(cell: dict, client: str, split: str) -> tuple:
    """Tokenised examples of one client's split (read from that client's folder only; a
    rehearsal cell keeps the first few, :func:`fedrepro.fl.limits.rehearsal_limit`)."""
    examples = _cached_examples(
        str(client_split_path(cell, client, split)),
        str(cell["backbone_dir"]),
        int(cell["max_source_length"]),
        int(cell["max_target_length"]),
    )
    return rehearsal_limit(cell, examples, split)


def special_ids(model) -> tuple[int, int]:
    cfg = model.backbone.config
    return int(cfg.pad_token_id), int(cfg.decoder_start_token_id)


CLIENT_STATE_PREFIX = "local_round_"


def client_state_path(cell: dict, client: str, round_index: int) -> Path:
    return Path(cell["out_dir"]) / "clients" / client / f"{CLIENT_STATE_PREFIX}{round_index:03d}.safetensors"


def client_train_round(
    cell: dict, client: str, round_index: int, server_state: dict[str, torch.Tensor]
) -> tuple[OrderedDict[str, torch.Tensor], dict]:
    """One federated round on one client (Algorithm 1, lines 4–5 and 11–27).

    The server's tensors go into the method's ``server_role`` adapter; for the KD methods the
    local adapter continues from this client's own state of the last round before
    ``round_index`` in which it trained -- the previous round with full participation; with
    ``clients_per_round`` a client keeps its local adapter unchanged over the rounds it is not
    sampled in -- and starts from W^1 if it has not trained yet (the server's tensors in round 1,
    :func:`initial_state` when first sampled later).  Returns the local adapter tensors to send
    and the metrics.
    """
    configure_torch(cell["threads"])
    spec = get_method(cell["method"])
    tokenizer, model = get_model(cell)
    if spec.server_role == "global":
        model.load_adapter_state("global", server_state)
        folder = client_state_path(cell, client, round_index).parent
        prev = latest_client_round(folder, CLIENT_STATE_PREFIX, round_index - 1) if round_index > 1 else 0
        if local_start(cell) == "aggregate":  # Algorithm 1, line 4 read literally: W from W^r
            model.load_adapter_state("local", server_state)
        elif prev:
            model.load_adapter_state("local", load_state(client_state_path(cell, client, prev)))
        elif round_index == 1:
            model.load_adapter_state("local", server_state)
        else:  # first sampled after round 1 (partial participation): W^1, as in round 1
            log.info("client %s: first round %d, local adapter from W^1", client, round_index)
            model.load_adapter_state("local", initial_state(cell))
    else:
        model.load_adapter_state("local", server_state)
    hp = TrainHParams.from_config(cell["train"])
    examples = client_examples(cell, client, "train")
    torch.manual_seed(derive_seed(cell["seed"], client, round_index, "torch"))
    optimizer = make_optimizer(model, hp)
    pad_id, start_id = special_ids(model)
    stats = local_update(
        model, spec, examples, hp, optimizer, int(cell["seed"]), client, round_index, pad_id, start_id
    )
    state = OrderedDict(cpu_state(model.adapter_state("local")))
    save_state(client_state_path(cell, client, round_index), state)
    stats["num_examples"] = len(examples)
    return state, stats


LOCAL_STARTS = ("persistent", "aggregate")


def local_start(cell: dict) -> str:
    """Where a KD method's local adapter starts a round (``adafedseleckd.train.local_start``):
    ``persistent`` (default; Fig. 3 and §III-B: "instead of directly adopting server parameters as
    local adapter parameters") continues the client's own local adapter; ``aggregate`` reads
    Algorithm 1 line 4 literally, ``AdaFedSelectKD(i, W^r)``: every round the local adapter starts
    from the server's aggregate W^r, like the teacher (docs/decisions.md)."""
    value = cell["train"].get("local_start", "persistent")
    if value not in LOCAL_STARTS:
        raise InputError(
            f"adafedseleckd.train.local_start must be one of {LOCAL_STARTS}, got {value!r}"
        )
    return value


# -- the runner protocol (see fedrepro.fl.tasks) --------------------------------------------
def is_federated(cell: dict) -> bool:
    return get_method(cell["method"]).federated


def initial_state(cell: dict) -> OrderedDict[str, torch.Tensor]:
    from transformers import AutoConfig

    from fedrepro.papers.adafedseleckd.model import initial_adapter_state

    d_model = AutoConfig.from_pretrained(cell["backbone_dir"]).d_model
    return initial_adapter_state(
        d_model, int(cell["bottleneck"]), int(cell["adapter_top_k"]), int(cell["seed"])
    )


# -- non-federated methods ----------------------------------------------------------------
def run_local(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """AdaSingle / AdaCentralized: train one local adapter on the pooled data of ``cell['clients']``.

    To give every method the same optimisation budget, a local run does ``rounds × local_epochs``
    epochs; it checkpoints adapter *and* AdamW state after every ``local_epochs`` so that a resumed
    run continues bit-identically.
    """
    configure_torch(cell["threads"])
    spec = get_method(cell["method"])
    hp = TrainHParams.from_config(cell["train"])
    rounds = int(cell["train"]["rounds"])
    _, model = get_model(cell)
    examples = [e for c in cell["clients"] for e in client_examples(cell, c, "train")]
    optimizer = make_optimizer(model, hp)
    done = prepare_checkpoints(cell)
    if done:
        state_path, meta_path = checkpoint_paths(cell["out_dir"], done)
        model.load_adapter_state("local", load_state(state_path))
        optimizer.load_state_dict(torch.load(Path(cell["out_dir"]) / "checkpoints" / f"optimizer_round_{done:03d}.pt"))
        log.info("resuming %s from round %d", cell["out_dir"], done)
    else:
        model.load_adapter_state("local", initial_state(cell))
    name = "+".join(cell["clients"]) if len(cell["clients"]) > 1 else cell["clients"][0]
    pad_id, start_id = special_ids(model)
    for r in range(done + 1, rounds + 1):
        t0 = time.perf_counter()
        torch.manual_seed(0)  # no randomness is drawn in training; fixed for safety
        stats = local_update(model, spec, examples, hp, optimizer, int(cell["seed"]), name, r, pad_id, start_id)
        state_path, meta_path = checkpoint_paths(cell["out_dir"], r)
        save_state(state_path, model.adapter_state("local"))
        with atomic_path(Path(cell["out_dir"]) / "checkpoints" / f"optimizer_round_{r:03d}.pt") as tmp:
            torch.save(optimizer.state_dict(), tmp)
        write_json_atomic(
            meta_path,
            {"round": r, "clients": [{"client": name, "num_examples": len(examples), **stats}],
             "bytes_down": 0, "bytes_up": 0, "seconds": time.perf_counter() - t0},
        )
        log.info("round %d/%d: loss %.4f", r, rounds, stats["train_loss"])
    return final_states(cell)


def final_states(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """The adapter each evaluated client uses: AdaSingle/AdaCentralized and AdaFedAvg the one
    trained / aggregated adapter; the KD methods each client's own local adapter.

    KD methods with ``clients_per_round``: a client's local adapter after the last round it was
    sampled in (which round, from the server's round log; its file must exist).  A client never
    sampled keeps W^1 (:func:`initial_state`) as its local adapter, beside the final global
    adapter (the last server checkpoint); evaluation decodes through the local adapter only, so
    that is what is kept for it (docs/decisions.md, AdaFedSelecKD)."""
    spec = get_method(cell["method"])
    rounds = int(cell["train"]["rounds"])
    if not spec.federated or spec.server_role == "local":
        final = load_state(checkpoint_paths(cell["out_dir"], rounds)[0])
        return {c: final for c in cell["eval_clients"]}
    last = last_participation(cell["out_dir"], cell["clients"], rounds)
    out = {}
    for c in cell["eval_clients"]:
        if last.get(c):
            out[c] = load_state(client_state_path(cell, c, last[c]))
        else:
            log.warning("client %s was never sampled: it keeps its initial local adapter W^1", c)
            out[c] = OrderedDict(sorted(initial_state(cell).items()))
    return out


def parameter_report(cell: dict) -> dict:
    spec = get_method(cell["method"])
    _, model = get_model(cell)
    n_total = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.trainable_parameters())
    n_shared = sum(v.numel() for v in initial_state(cell).values()) if spec.federated else 0
    return {
        "total": n_total,
        "trainable": n_trainable,
        "trainable_share": n_trainable / n_total,
        "shared_per_round": n_shared,
        "shared_share": n_shared / n_total,
    }
