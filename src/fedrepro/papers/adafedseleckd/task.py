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
from fedrepro.io import InputError, read_jsonl, torch_save_atomic, write_json_atomic
from fedrepro.logs import RoundProgress
from fedrepro.precision import Precision

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _cached_model(backbone_dir: str, top_k: int, bottleneck: int, roles: tuple[str, ...], seed: int,
                  device: str = "cpu", backbone_dropout: bool = False, frozen_dtype: str = "fp32"):
    """:func:`~fedrepro.papers.adafedseleckd.model.build_summarizer` over the process's resident
    backbone: the folder is read once per process (:func:`fedrepro.models.resident.resident`) and
    every summarizer (AdaFedAvg's one role, the KD methods' two, another top-k) wraps its own module
    tree over the same frozen tensors (:func:`~fedrepro.models.resident.share_frozen`).
    ``frozen_dtype: bf16`` (``adafedseleckd.frozen_dtype``): a resident bfloat16 copy of the
    backbone of its own (the float32 one, if loaded, is never cast); the adapters stay float32."""
    from fedrepro.models.backbones import load_backbone
    from fedrepro.models.resident import resident, share_frozen
    from fedrepro.papers.adafedseleckd.model import AdapterSummarizer, initial_adapter_state
    from fedrepro.precision import Precision

    precision = Precision(frozen_dtype=frozen_dtype, paper="adafedseleckd")
    if precision.frozen_dtype == "fp32":
        tokenizer, backbone = resident("seq2seq", backbone_dir, lambda: load_backbone(backbone_dir))
    else:
        def load_cast():
            tok, bb = load_backbone(backbone_dir)
            bb.requires_grad_(False)  # frozen (AdapterSummarizer would do it), then cast
            precision.cast_frozen(bb)
            return tok, bb

        tokenizer, backbone = resident("seq2seq", backbone_dir, load_cast, extra=(frozen_dtype,))
    model = AdapterSummarizer(share_frozen(backbone), top_k, bottleneck, roles, backbone_dropout)
    init = initial_adapter_state(backbone.config.d_model, bottleneck, top_k, seed)
    for role in roles:  # as build_summarizer: every role starts from the same initial adapters
        model.load_adapter_state(role, init)
    return tokenizer, model.to(device)


def get_model(cell: dict):
    """(tokenizer, AdapterSummarizer) for a cell; cached per process (Ray actors reuse it), the
    backbone resident once per process whatever the method."""
    spec = get_method(cell["method"])
    return _cached_model(
        str(cell["backbone_dir"]),
        int(cell["adapter_top_k"]),
        int(cell["bottleneck"]),
        spec.roles,
        int(cell["seed"]),
        str(cell_device(cell)),
        bool(cell["train"].get("backbone_dropout", False)),
        Precision.from_cell(cell).frozen_dtype,
    )


@functools.lru_cache(maxsize=1)
def _cached_prefix_store(model, mode: str, budget: int):
    from fedrepro.papers.adafedseleckd.prefix_cache import PrefixCache

    return PrefixCache(mode, budget)


def prefix_store(cell: dict, model):
    """The process's frozen-prefix cache for ``model`` (``adafedseleckd.train.prefix_cache``,
    ``prefix_cache_budget_mb``), kept across the clients and rounds this process trains, or
    ``None`` when the backbone's dropout runs (the prefix is then computed per padded batch, and
    a cache is an InputError naming both keys).  With the backbone in eval mode every batch's
    prefix is the canonical per-example one, stored or not (mode ``off``), so the cache never
    changes a bit of the result (:mod:`fedrepro.papers.adafedseleckd.prefix_cache`)."""
    from fedrepro.papers.adafedseleckd.prefix_cache import prefix_cache_settings

    mode, budget = prefix_cache_settings(cell["train"])
    if model.backbone_dropout:
        return None
    if not model.supports_example_prefix:
        if mode != "off":
            raise InputError(
                f"adafedseleckd.train.prefix_cache: {mode} supports BART and LED backbones, not "
                f"{type(model.backbone).__name__}; set prefix_cache: off"
            )
        return None
    return _cached_prefix_store(model, mode, budget)


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
        inherited = None if local_start(cell) == "aggregate" or prev else inherited_local(cell, client)
        if local_start(cell) == "aggregate":  # Algorithm 1, line 4 read literally: W from W^r
            model.load_adapter_state("local", server_state)
        elif prev:
            model.load_adapter_state("local", load_state(client_state_path(cell, client, prev)))
        elif inherited is not None:  # Table VII post-addition: an initial client continues
            model.load_adapter_state("local", inherited)
        elif round_index == 1:
            model.load_adapter_state("local", server_state)
        else:  # first sampled after round 1 (partial participation): W^1, as in round 1
            log.info("client %s: first round %d, local adapter from W^1", client, round_index)
            model.load_adapter_state("local", initial_state(cell))
    else:
        model.load_adapter_state("local", server_state)
    hp = TrainHParams.from_config(cell["train"])
    examples = client_examples(cell, client, "train")
    if spec.hard_kd:
        examples = hard_kd_examples(cell, client, examples, tokenizer)
    torch.manual_seed(derive_seed(cell["seed"], client, round_index, "torch"))
    optimizer = make_optimizer(model, hp)
    pad_id, start_id = special_ids(model)
    trace: dict = {}
    proximal_to = None
    if spec.proximal:  # FedProx: w^r, fixed during the round, on the model's device
        device = next(model.parameters()).device
        proximal_to = {k: v.to(device) for k, v in server_state.items()}
    stats = local_update(
        model, spec, examples, hp, optimizer, int(cell["seed"]), client, round_index, pad_id,
        start_id, proximal_to=proximal_to, trace=trace, prefix_cache=prefix_store(cell, model),
        precision=Precision.from_cell(cell),
    )
    state = OrderedDict(cpu_state(model.adapter_state("local")))
    write_trace(trace_path(cell, client, round_index), trace)
    save_state(client_state_path(cell, client, round_index), state)
    stats["num_examples"] = len(examples)
    return state, stats


def hard_kd_examples(cell: dict, client: str, examples, tokenizer) -> list[dict]:
    """Fig. 12's noun–verb hard KD: each example gains ``kd_allowed``, one bool per label token,
    True where the token belongs to a target word spaCy tagged with one of ``hard_kd_tags``
    (:func:`fedrepro.papers.adafedseleckd.pos.hard_kd_token_mask`; tags from the client's
    ``pos_tags`` file, made by the workflow's ``adafedseleckd_pos_tags`` rule)."""
    path = (cell.get("pos_tags") or {}).get(client)
    if not path:
        raise InputError(f"AdaFedHardKD cell has no POS tags for client {client!r} (cell key pos_tags)")
    masks = _hard_kd_masks(str(path), tokenizer, int(cell["max_target_length"]),
                           tuple(cell.get("hard_kd_tags", ("NOUN", "VERB"))))
    out = []
    for e in examples:
        mask = masks.get(e["id"])
        if mask is None:
            raise InputError(f"{path}: no POS tags for training example {e['id']!r}; rerun the tagging rule")
        if len(mask) != len(e["labels"]):
            raise InputError(f"{path}: example {e['id']!r} has {len(mask)} label tokens in the tags "
                             f"and {len(e['labels'])} in training; the target text differs")
        out.append({**e, "kd_allowed": list(mask)})
    return out


@functools.lru_cache(maxsize=16)
def _hard_kd_masks(path: str, tokenizer, max_target_length: int, tags: tuple[str, ...]) -> dict:
    """``{example id: label-token mask}`` of one client's POS file, computed once per process
    (every round of a cell, and every cell of a row job, reuses it)."""
    from fedrepro.papers.adafedseleckd import pos

    out = {}
    for rec in read_jsonl(path):
        word_ids = pos.word_ids_for_targets(rec["target"], rec["words"], tokenizer, max_target_length)
        out[rec["id"]] = tuple(pos.hard_kd_token_mask(word_ids, rec["words"], tags))
    return out


# -- the per-token KD record (§V-C, Fig. 11) --------------------------------------------------
TRACE_PREFIX = "kd_trace_round_"


def trace_path(cell: dict, client: str, round_index: int) -> Path:
    return client_state_path(cell, client, round_index).with_name(f"{TRACE_PREFIX}{round_index:03d}.json")


def write_trace(path: Path, trace: dict) -> None:
    """One round's KD decisions of one client: ``{example id: ["0110…", …]}`` (a bit per label
    token, one string per time the example was trained that round)."""
    write_json_atomic(path, {k: ["".join("1" if b else "0" for b in bits) for bits in v]
                             for k, v in sorted(trace.items())})


def collect_trace(cell: dict, out_path: str) -> None:
    """Bundle the clients' per-round KD records into the cell's ``kd_trace.json``:
    ``{"rounds": R, "clients": {client: {round: {example id: [bits, …]}}}}`` (read by Fig. 11)."""
    from fedrepro.io import read_json

    out: dict = {}
    root = Path(cell["out_dir"]) / "clients"
    for folder in sorted(root.glob("*")) if root.is_dir() else []:
        rounds = {}
        for path in sorted(folder.glob(f"{TRACE_PREFIX}*.json")):
            r = int(path.stem.rsplit("_", 1)[1])
            if r <= int(cell["train"]["rounds"]):
                rounds[str(r)] = read_json(path)
        out[folder.name] = rounds
    write_json_atomic(out_path, {"rounds": int(cell["train"]["rounds"]), "clients": out})


def before_cleanup(cell: dict) -> dict:
    """After training, before the runner deletes ``clients/`` and ``checkpoints/``: write the
    cell's ``kd_trace.json`` and return the selected rounds for the provenance."""
    from fedrepro.io import read_json

    collect_trace(cell, str(Path(cell["out_dir"]) / "kd_trace.json"))
    selected = Path(cell["out_dir"]) / "selected_rounds.json"
    return {"selected_rounds": read_json(selected)} if selected.exists() else {}


def inherited_local(cell: dict, client: str) -> OrderedDict[str, torch.Tensor] | None:
    """Table VII post-addition (``cell['init_from']``): the local adapter an initial client ends
    the baseline run with; None for a client that joins (it starts from the received W^r)."""
    src = cell.get("init_from")
    if not src:
        return None
    from fedrepro.fl.cell import load_final_adapters

    finals = load_final_adapters(Path(src) / "adapters.safetensors")
    return finals.get(client)


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


SERVER_KEY = "__server__"
"""Client name under which a federated cell's adapters file keeps the server's final tensors."""


def initial_state(cell: dict) -> OrderedDict[str, torch.Tensor]:
    """W^1: a function of the seed; for a post-addition cell (``init_from``, Table VII) the
    baseline run's final server tensors, from which the four clients continue."""
    from transformers import AutoConfig

    if cell.get("init_from"):
        from fedrepro.fl.cell import load_final_adapters

        path = Path(cell["init_from"]) / "adapters.safetensors"
        finals = load_final_adapters(path)
        if SERVER_KEY not in finals:
            raise InputError(f"{path}: holds no server state ({SERVER_KEY}); rerun that cell")
        return OrderedDict(sorted(finals[SERVER_KEY].items()))

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
        saved = Path(cell["out_dir"]) / "checkpoints" / f"optimizer_round_{done:03d}.pt"
        optimizer.load_state_dict(torch.load(saved, weights_only=True))
        log.info("resuming %s from round %d", cell["out_dir"], done)
    else:
        model.load_adapter_state("local", initial_state(cell))
    name = "+".join(cell["clients"]) if len(cell["clients"]) > 1 else cell["clients"][0]
    pad_id, start_id = special_ids(model)
    progress = RoundProgress(rounds, len(cell["clients"]), start_round=done, logger=log)
    for r in range(done + 1, rounds + 1):
        t0 = time.perf_counter()
        torch.manual_seed(0)  # no randomness is drawn in training; fixed for safety
        trace: dict = {}
        stats = local_update(model, spec, examples, hp, optimizer, int(cell["seed"]), name, r, pad_id,
                             start_id, trace=trace, prefix_cache=prefix_store(cell, model),
                             precision=Precision.from_cell(cell))
        write_trace(trace_path(cell, name, r), trace)
        state_path, meta_path = checkpoint_paths(cell["out_dir"], r)
        save_state(state_path, model.adapter_state("local"))
        torch_save_atomic(optimizer.state_dict(),
                          Path(cell["out_dir"]) / "checkpoints" / f"optimizer_round_{r:03d}.pt")
        write_json_atomic(
            meta_path,
            {"round": r, "clients": [{"client": name, "num_examples": len(examples), **stats}],
             "bytes_down": 0, "bytes_up": 0, "seconds": time.perf_counter() - t0},
        )
        progress.log(r, extra=f"loss {stats['train_loss']:.4f}")
    return final_states(cell)


def final_states(cell: dict) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """The adapter each evaluated client uses: AdaSingle/AdaCentralized and AdaFedAvg (and the
    Table V methods) the one trained / aggregated adapter; the KD methods each client's own local
    adapter -- of the last round, or of the round :func:`report_round` selects.  A federated cell
    also keeps the server's final tensors (under :data:`SERVER_KEY`), from which Table VII's
    post-addition run continues.

    KD methods with ``clients_per_round``: a client's local adapter after the last round it was
    sampled in (which round, from the server's round log; its file must exist).  A client never
    sampled keeps W^1 (:func:`initial_state`) as its local adapter, beside the final global
    adapter (the last server checkpoint); evaluation decodes through the local adapter only, so
    that is what is kept for it (docs/decisions.md, AdaFedSelecKD)."""
    spec = get_method(cell["method"])
    rounds = int(cell["train"]["rounds"])
    out: dict[str, OrderedDict[str, torch.Tensor]] = {}
    selected: dict[str, int] = {}
    losses: dict[str, list[float]] = {}
    for c in cell["eval_clients"]:
        if report_round(cell) == "last":
            selected[c] = rounds
        else:
            losses[c] = [validation_loss(cell, c, state_at(cell, c, r)) for r in range(1, rounds + 1)]
            best = min(losses[c])
            selected[c] = max(r for r, v in enumerate(losses[c], 1) if v == best)  # ties: later
        out[c] = state_at(cell, c, selected[c])
    write_json_atomic(Path(cell["out_dir"]) / "selected_rounds.json",
                      {"rule": report_round(cell), "rounds": selected, "validation_loss": losses})
    if spec.federated:
        out[SERVER_KEY] = load_state(checkpoint_paths(cell["out_dir"], rounds)[0])
    return out


def state_at(cell: dict, client: str, round_index: int) -> OrderedDict[str, torch.Tensor]:
    """The adapter ``client`` would be evaluated with had the run stopped after ``round_index``."""
    spec = get_method(cell["method"])
    if not spec.federated or spec.server_role == "local":
        return load_state(checkpoint_paths(cell["out_dir"], round_index)[0])
    last = last_participation(cell["out_dir"], cell["clients"], round_index)
    if last.get(client):
        return load_state(client_state_path(cell, client, last[client]))
    log.warning("client %s was never sampled up to round %d: it keeps its initial local adapter W^1",
                client, round_index)
    return OrderedDict(sorted(initial_state(cell).items()))


REPORT_ROUNDS = ("last", "best_val_loss")


def report_round(cell: dict) -> str:
    """Which round's adapters a cell reports (``adafedseleckd.report_round``): ``last``, or
    ``best_val_loss`` -- per client, the round whose adapter has the lowest teacher-forced
    cross-entropy on that client's validation split (§V-C: "the final, optimally-performing
    round"; ROUGE on validation would need a beam search per round; docs/decisions.md)."""
    value = cell.get("report_round", "last")
    if value not in REPORT_ROUNDS:
        raise InputError(f"adafedseleckd.report_round must be one of {REPORT_ROUNDS}, got {value!r}")
    return value


def validation_loss(cell: dict, client: str, state: dict[str, torch.Tensor]) -> float:
    """Token-mean cross-entropy of the local path with ``state`` on ``client``'s ``val`` split."""
    from fedrepro.data.seq2seq import iterate_batches
    from fedrepro.devices import model_device, to_device
    from fedrepro.papers.adafedseleckd.kd import cross_entropy_loss

    configure_torch(cell["threads"])
    _, model = get_model(cell)
    model.load_adapter_state("local", state)
    model.eval()
    pad_id, start_id = special_ids(model)
    total, count = 0.0, 0
    hp = TrainHParams.from_config(cell["train"])
    precision, device = Precision.from_cell(cell), model_device(model)
    with torch.no_grad(), precision.region(device):
        for batch in iterate_batches(client_examples(cell, client, "val"), hp.batch_size, pad_id, start_id):
            batch = to_device(batch, device)
            with precision.autocast(device):
                logits, _ = model.path_logits(batch["input_ids"], batch["attention_mask"],
                                              batch["decoder_input_ids"], student="local")
            n = int((batch["labels"] != -100).sum())
            total += float(cross_entropy_loss(logits, batch["labels"])) * n
            count += n
    return total / max(count, 1)


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
