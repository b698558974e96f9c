"""AdaFedSelecKD's client round as a ClientApp calls it (``adafedseleckd.task.client_train_round``),
over several rounds: what each round starts from, what it is handed and what it keeps.

The step tests (``test_step_adafedseleckd.py``) check that one call of ``local_update`` is one
AdamW step of each method's total loss, and that round 1's reply is that step from W^r.  The
mutation run of ``adafedseleckd.task`` (issue 24) showed that nothing checked the rounds after it
(Algorithm 1, lines 4-5; Fig. 3 and §III-B's persistent local adapter; Table VII's post-addition;
partial participation).  Here ``local_update`` is wrapped to record what each round hands it:

* the KD methods: the global adapter (teacher) holds the round's W^r; the local adapter
  (student) starts round 1 from W^r, later rounds from the client's own file of the last round it
  trained in (not from W^r, and not from a later round's file); a client first sampled after
  round 1 starts from W^1 (``initial_state``); ``local_start: aggregate`` starts every round from
  W^r; a post-addition cell's initial client continues the baseline's local adapter in round 1
  and its own file afterwards; a joining client starts from W^r;
* the other methods: the local adapter is W^r every round; AdaFedProx's proximal point is W^r;
* the round's hyperparameters, examples (AdaFedHardKD: with their noun/verb masks), seed, client,
  round, special token ids, optimizer and the torch seed ``derive_seed(seed, client, round, "torch")``;
* the file the round writes equals what it returns, and the trace file equals its KD decisions.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from transformers import BartConfig

from fedrepro.data.seq2seq import derive_seed
from fedrepro.fl.checkpoint import load_state, save_state
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd import task
from fedrepro.papers.adafedseleckd.methods import METHODS, TrainHParams
from fedrepro.papers.adafedseleckd.model import initial_adapter_state

import test_step_adafedseleckd as step  # noqa: E402

SEED = 11
TRAIN = {"lr": 0.02, "weight_decay": 0.07, "batch_size": 3, "local_epochs": 2, "lam": 0.3,
         "tau": 1.7, "prox_mu": 0.4}


def _clone(state) -> OrderedDict:
    return OrderedDict((k, v.detach().clone()) for k, v in state.items())


def _equal(a, b) -> bool:
    """Same names in the same order, same bits."""
    return a is not None and b is not None and list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def _same(a, b) -> bool:
    """Same names (a safetensors file comes back sorted), same bits."""
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def backbone_dir(tmp_path) -> Path:
    """The tiny BART's config (``initial_state`` reads d_model from it)."""
    folder = tmp_path / "backbone"
    BartConfig(vocab_size=step.V, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
               decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
               max_position_embeddings=32, pad_token_id=step.PAD, bos_token_id=step.BOS,
               eos_token_id=step.EOS, decoder_start_token_id=step.START).save_pretrained(folder)
    return folder


def _cell(tmp_path: Path, backbone_dir: Path, method: str, **extra) -> dict:
    clients = ["Academic", "Committee", "Product"]
    return {"paper": "adafedseleckd", "method": method, "seed": SEED, "clients": clients,
            "client_data": {c: str(tmp_path / c) for c in clients}, "out_dir": str(tmp_path / "cell"),
            "backbone_dir": str(backbone_dir), "bottleneck": 8, "adapter_top_k": 1, "threads": 1,
            "max_target_length": 24, "pos_tags": {c: f"{c}.tags.jsonl" for c in clients},
            "train": dict(TRAIN), **extra}


EXAMPLES = {c: tuple(step._examples()[i:] + step._examples()[:i]) for i, c in
            enumerate(["Academic", "Committee", "Product", "samsum"])}
TOKENIZER = "the cell's tokenizer"  # what get_model returns beside the model (a stand-in)
MASK_CALLS: list[tuple] = []  # the arguments of every _hard_kd_masks call
MASKS = {e["id"]: tuple((i + j) % 3 == 1 for j in range(len(e["labels"])))
         for i, e in enumerate(step._examples())}


@pytest.fixture
def world(monkeypatch):
    """The process's model per method (as ``get_model``'s cache: one object for every round), the
    clients' examples (rotated per client), and every ``local_update`` call recorded."""
    models: dict[str, object] = {}
    seen: list[dict] = []
    real = task.local_update

    def get_model(cell):
        spec = METHODS[cell["method"]]
        if cell["method"] not in models:
            models[cell["method"]] = step._model(spec.roles)
        return TOKENIZER, models[cell["method"]]

    def spy(model, spec, examples, hp, optimizer, seed, client, round_index, pad_id, start_id,
            proximal_to=None, trace=None, prefix_cache=None, precision=None):
        entry = {
            "local_in": _clone(model.adapter_state("local")),
            "global_in": _clone(model.adapter_state("global")) if "global" in model.stacks else None,
            "examples": list(examples), "hp": hp, "seed": seed, "client": client, "round": round_index,
            "ids": (pad_id, start_id), "torch_seed": torch.initial_seed(),
            "proximal_to": None if proximal_to is None else _clone(proximal_to),
            "opt_params": [p for g in optimizer.param_groups for p in g["params"]],
            "opt_hp": [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups],
            "opt_steps": sum(len(s) for s in optimizer.state.values()),
            "model": model, "precision": precision, "prefix_cache": prefix_cache,
        }
        stats = real(model, spec, examples, hp, optimizer, seed, client, round_index, pad_id, start_id,
                     proximal_to=proximal_to, trace=trace, prefix_cache=prefix_cache, precision=precision)
        entry["local_out"] = _clone(model.adapter_state("local"))
        entry["trace"] = {k: [list(b) for b in v] for k, v in trace.items()}
        entry["stats"] = dict(stats)
        seen.append(entry)
        return stats

    monkeypatch.setattr(task, "get_model", get_model)
    monkeypatch.setattr(task, "client_examples", lambda cell, client, split: EXAMPLES[client])
    monkeypatch.setattr(task, "_hard_kd_masks", lambda *a: MASK_CALLS.append(a) or MASKS)
    monkeypatch.setattr(task, "local_update", spy)
    MASK_CALLS.clear()
    return seen


def _server(cell: dict, k: int) -> OrderedDict:
    """A W^r for round k: the model's adapter shapes, values of its own (≠ W^1, ≠ other rounds)."""
    g = torch.Generator().manual_seed(100 + k)
    return OrderedDict((n, torch.randn(v.shape, generator=g)) for n, v in task.initial_state(cell).items())


@pytest.mark.parametrize("method", ["AdaFedSelectKD", "AdaFedKD", "AdaFedHardKD"])
def test_kd_rounds_continue_the_clients_own_local_adapter(method, backbone_dir, tmp_path, world):
    cell = _cell(tmp_path, backbone_dir, method)
    w1 = task.initial_state(cell)
    s = {k: _server(cell, k) for k in range(1, 5)}

    sent1, stats1 = task.client_train_round(cell, "Committee", 1, s[1])
    sent2, _ = task.client_train_round(cell, "Committee", 2, s[2])
    # round 3: Committee not sampled; Product first sampled
    sentp, _ = task.client_train_round(cell, "Product", 3, s[3])
    # a file of a later round (a run killed inside round 5) must not be where round 4 starts
    save_state(task.client_state_path(cell, "Committee", 5), _server(cell, 55))
    sent4, _ = task.client_train_round(cell, "Committee", 4, s[4])
    c1, c2, p3, c4 = world

    # round 1: student and teacher both W^1 = the server's tensors
    assert _equal(c1["local_in"], s[1]) and _equal(c1["global_in"], s[1])
    # round 2: the teacher is W^2; the student continues round 1's local adapter
    assert _equal(c2["global_in"], s[2])
    assert _equal(c2["local_in"], c1["local_out"]) and not _equal(c2["local_in"], s[2])
    # first sampled in round 3: the student starts from W^1 (initial_state), not from W^3
    assert _equal(p3["global_in"], s[3])
    assert _equal(p3["local_in"], w1) and not _equal(p3["local_in"], s[3])
    assert _equal(w1, initial_adapter_state(16, 8, 1, SEED))
    # round 4 after a skipped round 3: round 2's file, not round 5's, not W^4
    assert _equal(c4["global_in"], s[4]) and _equal(c4["local_in"], c2["local_out"])
    # each round returns and keeps exactly its trained local adapter
    for (sent, r, c), call in zip(((sent1, 1, "Committee"), (sent2, 2, "Committee"),
                                   (sentp, 3, "Product"), (sent4, 4, "Committee")), world):
        assert _equal(sent, call["local_out"]) and not _equal(sent, call["local_in"])
        assert _same(load_state(task.client_state_path(cell, c, r)), sent)
        trace = json.loads(task.trace_path(cell, c, r).read_text())
        assert trace == {k: ["".join("1" if b else "0" for b in bits) for bits in v]
                         for k, v in sorted(call["trace"].items())}
        # every example trained once per local epoch (2), a decision per label token
        assert sorted(trace) == sorted(e["id"] for e in EXAMPLES[c])
        assert all(len(v) == TRAIN["local_epochs"] for v in trace.values())
    assert stats1["num_examples"] == len(EXAMPLES["Committee"])
    assert any("1" in bits for v in json.loads(task.trace_path(cell, "Committee", 1).read_text()).values()
               for bits in v)


def test_the_round_hands_local_update_its_settings(backbone_dir, tmp_path, world):
    cell = _cell(tmp_path, backbone_dir, "AdaFedSelectKD")
    task.client_train_round(cell, "Academic", 1, _server(cell, 1))
    task.client_train_round(cell, "Product", 2, _server(cell, 2))
    for call, client, r in zip(world, ("Academic", "Product"), (1, 2)):
        assert call["hp"] == TrainHParams.from_config(TRAIN)
        assert (call["client"], call["round"], call["seed"]) == (client, r, SEED)
        assert call["examples"] == list(EXAMPLES[client])
        assert call["ids"] == (step.PAD, step.START)
        # the round's torch stream: a function of (seed, client, round)
        assert call["torch_seed"] == derive_seed(SEED, client, r, "torch")
        # a fresh AdamW over the local adapter only, with the configured lr and weight decay
        model = call["model"]
        assert [id(p) for p in call["opt_params"]] == [id(p) for p in model.stacks["local"].parameters()]
        assert call["opt_hp"] == [(TRAIN["lr"], TRAIN["weight_decay"])]
        assert call["opt_steps"] == 0
        assert call["proximal_to"] is None
        assert str(call["precision"].mode) == "fp32"
        # the process's frozen-prefix cache for this model (same bits with or without; the speed)
        assert call["prefix_cache"] is not None and call["prefix_cache"] is task.prefix_store(cell, model)
    assert world[0]["torch_seed"] != world[1]["torch_seed"]


def test_local_start_aggregate_starts_every_round_from_the_servers_tensors(backbone_dir, tmp_path, world):
    cell = _cell(tmp_path, backbone_dir, "AdaFedSelectKD")
    cell["train"]["local_start"] = "aggregate"
    s1, s2, s3 = (_server(cell, k) for k in (1, 2, 3))
    task.client_train_round(cell, "Committee", 1, s1)
    task.client_train_round(cell, "Committee", 2, s2)
    task.client_train_round(cell, "Product", 3, s3)  # first sampled late: W^3 as well, not W^1
    for call, s in zip(world, (s1, s2, s3)):
        assert _equal(call["local_in"], s) and _equal(call["global_in"], s)


def test_an_unknown_local_start_is_refused(backbone_dir, tmp_path, world):
    cell = _cell(tmp_path, backbone_dir, "AdaFedSelectKD")
    cell["train"]["local_start"] = "server"
    with pytest.raises(InputError, match=r"adafedseleckd\.train\.local_start.*'server'"):
        task.client_train_round(cell, "Committee", 1, _server(cell, 1))
    assert world == []


@pytest.mark.parametrize("method", ["AdaFedAvg", "AdaFedProx", "AdaFedOPT", "AdaFedNova"])
def test_other_methods_start_every_round_from_the_servers_tensors(method, backbone_dir, tmp_path, world):
    cell = _cell(tmp_path, backbone_dir, method)
    s1, s2, s3 = (_server(cell, k) for k in (1, 2, 3))
    sent1, _ = task.client_train_round(cell, "Committee", 1, s1)
    sent2, _ = task.client_train_round(cell, "Committee", 2, s2)
    task.client_train_round(cell, "Product", 3, s3)
    for call, s in zip(world, (s1, s2, s3)):
        assert call["global_in"] is None
        assert _equal(call["local_in"], s)
        if METHODS[method].proximal:  # FedProx's w^r: the round's received tensors
            assert _equal(call["proximal_to"], s)
        else:
            assert call["proximal_to"] is None
    assert _equal(sent1, world[0]["local_out"]) and _equal(sent2, world[1]["local_out"])
    assert _same(load_state(task.client_state_path(cell, "Committee", 2)), sent2)


def test_post_addition_clients_continue_the_baseline(backbone_dir, tmp_path, world):
    """Table VII: an initial client's student continues the baseline run's local adapter in the
    first round, then its own file; a joining client (samsum) starts from W^r."""
    probe = _cell(tmp_path, backbone_dir, "AdaFedSelectKD")
    base_local = _server(probe, 77)
    server_final = _server(probe, 78)
    base = tmp_path / "baseline"
    save_state(base / "adapters.safetensors",
               {**{f"Committee::{k}": v for k, v in base_local.items()},
                **{f"{task.SERVER_KEY}::{k}": v for k, v in server_final.items()}})
    cell = _cell(tmp_path, backbone_dir, "AdaFedSelectKD", init_from=str(base))
    cell["clients"].append("samsum")
    cell["client_data"]["samsum"] = str(tmp_path / "samsum")
    assert _equal(task.initial_state(cell), OrderedDict(sorted(server_final.items())))
    s1, s2 = _server(probe, 1), _server(probe, 2)
    task.client_train_round(cell, "Committee", 1, s1)
    task.client_train_round(cell, "samsum", 1, s1)
    task.client_train_round(cell, "Committee", 2, s2)
    c1, j1, c2 = world
    assert _same(c1["local_in"], base_local) and _equal(c1["global_in"], s1)
    assert _equal(j1["local_in"], s1)
    assert _equal(c2["local_in"], c1["local_out"]) and not _same(c2["local_in"], base_local)


def test_hard_kd_examples_carry_their_noun_verb_masks(backbone_dir, tmp_path, world):
    cell = _cell(tmp_path, backbone_dir, "AdaFedHardKD")
    task.client_train_round(cell, "Academic", 1, _server(cell, 1))
    handed = world[0]["examples"]
    # the client's tag file, the cell's tokenizer and target length, the default tags
    assert MASK_CALLS == [("Academic.tags.jsonl", TOKENIZER, 24, ("NOUN", "VERB"))]
    assert [e["id"] for e in handed] == [e["id"] for e in EXAMPLES["Academic"]]
    for e, orig in zip(handed, EXAMPLES["Academic"]):
        assert e["kd_allowed"] == list(MASKS[e["id"]])
        assert {k: v for k, v in e.items() if k != "kd_allowed"} == orig
    # the KD decisions are limited to the masked tokens
    trace = world[0]["trace"]
    assert any(any(b) for v in trace.values() for b in v)
    for ex_id, bits_list in trace.items():
        for bits in bits_list:
            assert all(m or not b for b, m in zip(bits, MASKS[ex_id]))


def test_hard_kd_examples_refuse_missing_or_mismatched_tags(monkeypatch, tmp_path):
    examples = step._examples()
    cell = {"max_target_length": 24, "pos_tags": {"Committee": "c.jsonl"}}
    with pytest.raises(InputError, match="no POS tags for client 'Academic'"):
        task.hard_kd_examples(cell, "Academic", examples, None)
    with pytest.raises(InputError, match="no POS tags for client 'Academic'"):
        task.hard_kd_examples({"max_target_length": 24}, "Academic", examples, None)
    seen = []
    monkeypatch.setattr(task, "_hard_kd_masks",
                        lambda *a: seen.append(a) or {e["id"]: MASKS[e["id"]] for e in examples[:2]})
    with pytest.raises(InputError, match=r"c\.jsonl: no POS tags for training example 'ex2'"):
        task.hard_kd_examples(cell, "Committee", examples, "tok")
    assert seen[0] == ("c.jsonl", "tok", 24, ("NOUN", "VERB"))
    monkeypatch.setattr(task, "_hard_kd_masks",
                        lambda *a: {e["id"]: MASKS[e["id"]][:-1] if e["id"] == "ex1" else MASKS[e["id"]]
                                    for e in examples})
    with pytest.raises(InputError, match=r"example 'ex1' has 5 label tokens in the tags and 6 in training"):
        task.hard_kd_examples(cell, "Committee", examples, "tok")
    seen.clear()
    monkeypatch.setattr(task, "_hard_kd_masks", lambda *a: seen.append(a) or MASKS)
    out = task.hard_kd_examples({**cell, "hard_kd_tags": ["NOUN"]}, "Committee", examples, "tok")
    assert seen[0] == ("c.jsonl", "tok", 24, ("NOUN",))
    assert [e["kd_allowed"] for e in out] == [list(MASKS[e["id"]]) for e in examples]


def test_hard_kd_masks_follow_the_tagged_words(tmp_path, monkeypatch):
    """``_hard_kd_masks`` maps each record's tagged words onto its label tokens (the real POS
    helpers, a word-level tokenizer stand-in)."""
    from fedrepro.papers.adafedseleckd import pos

    recs = [{"id": "a", "target": "cats eat fish", "words": [["cats", "NOUN"], ["eat", "VERB"], ["fish", "NOUN"]]},
            {"id": "b", "target": "very good", "words": [["very", "ADV"], ["good", "ADJ"]]}]
    path = tmp_path / "tags.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    calls = []

    def word_ids(target, words, tokenizer, max_len):
        calls.append((target, tokenizer, max_len))
        return list(range(len(words))) + [None]

    def token_mask(ids, words, tags):
        return [i is not None and words[i][1] in tags for i in ids]

    monkeypatch.setattr(pos, "word_ids_for_targets", word_ids)
    monkeypatch.setattr(pos, "hard_kd_token_mask", token_mask)
    task._hard_kd_masks.cache_clear()
    try:
        out = task._hard_kd_masks(str(path), "tok", 9, ("NOUN",))
    finally:
        task._hard_kd_masks.cache_clear()
    assert out == {"a": (True, False, True, False), "b": (False, False, False)}
    assert calls == [("cats eat fish", "tok", 9), ("very good", "tok", 9)]
