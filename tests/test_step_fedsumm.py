"""FedSUMM (Pan et al., "Personalized Federated Learning via Gradient Modulation for Heterogeneous
Text Summarization"): one local step and one server round, each against the paper's equations
written out here.

Client (§III-A eq. 3, Algorithm 1's ClientUpdate ``w ← w − δ∇M(w, b)``, §III-C eq. 4 and 7): one
call of the task's real client code (:func:`fedrepro.papers.fedsumm.task.client_train_round` for
FedAvg / FedSUMM, :func:`~fedrepro.papers.fedsumm.task.run_local` for single / all) on one fixed
batch must move every trainable parameter exactly as one optimizer step (``sgd``: eq. 3; ``adamw``:
Loshchilov & Hutter's AdamW, the ``fedsumm.train.optimizer`` option) on the *total* loss

    J(θ) = L_b(θ) + ε·ρ·dL/dt·max(‖∇_θ L_b(θ)‖₂, 1),        dL/dt = ⟨∇_θ L_b(θ), θ̇⟩,  θ̇ = −MG[v]

(eq. 7 with eq. 4; the server sends g̃ = MG[v]·ε·ρ, docs/decisions-fedsumm.md "dL/dt"), built in
this file from the model's output distribution (cross-entropy for BART, the copy mixture's NLL for
CT and BART + CD), with the Hessian-vector product left to
``torch.autograd.grad(create_graph=True)`` on a separate copy of the model.  ε = 0.3 and ρ = 1.7 (never 0, 1/2 or 1), lr 0.37.

Server (Algorithm 1, eq. 5-6 under the configs' reading ``update_direction_rank``): three clients
with 1, 4 and 9 examples through :class:`~fedrepro.papers.fedsumm.strategy.FedSummStrategy` for two
rounds: ρ per client and tensor from the rank-based normal scores of the update directions (σ of
eq. 6), the cumulative sums of eq. 5, the adapter g̃ = MG·ε·ρ sent in round 2, the server step
``w^c − g̃^c`` and Algorithm 1's unweighted ``(1/C) Σ_c`` (not Flower's example-weighted mean);
FedAvg's server: the unweighted mean and the same ρ (Fig. 6).
"""

from __future__ import annotations

import copy
import math
import random
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from torch.nn.attention import SDPBackend, sdpa_kernel

from fedrepro.data.seq2seq import derive_seed
from fedrepro.io import InputError, write_jsonl_atomic
from fedrepro.papers.fedsumm import task
from fedrepro.papers.fedsumm.bart import build_tiny_chinese_bart
from fedrepro.papers.fedsumm.strategy import FedSummStrategy

CLIENTS = ("csl-001", "csl-002", "csl-003")
TRAIN_SIZES = (3, 4, 2)
CLIENT = "csl-002"  # the federated client of the step tests (4 training examples)
ROUND = 2  # a FedSUMM client's first guided round
EPS, RHO = 0.3, 1.7  # ε and the receiving client's ρ (eq. 7)
L_PREV = 2.9  # the client's previous loss l^c (``loss_difference`` reading of dL/dt)
LR = 0.37  # δ of Algorithm 1 / η of eq. 3
DECAY = {"sgd": 0.0, "adamw": 0.013}  # eq. 3 has none; AdamW's decoupled weight decay
W_NOISE = 0.2  # w_t = the initial model + this much seeded noise
MG_SCALE = 0.05  # the memory entry's size: ε·ρ·s·‖H·MG‖ comparable to ‖∇L_b‖ (asserted)
ADAMW_BETAS, ADAMW_EPS = (0.9, 0.999), 1e-8  # torch.optim.AdamW's defaults (the task sets none)
IGNORE = -100

CHARS = "网络故障诊断问题提出方法结果表明误差降低人口老龄化农民增收影响数据检验无线传感器新一种本文利用年的了该"
RARE = "甲乙丙"  # in csl-002's texts only and left out of the vocabulary: extended (copy) ids
TOPICS = ["网络故障", "人口老龄", "农民增收", "无线传感", "数据检验"]


def _records(client: str, split: str, n: int, k: int) -> list[dict]:
    rng = random.Random(f"step/{client}/{split}")
    out = []
    for i in range(n):
        topic = TOPICS[(k + i) % len(TOPICS)]
        body = "".join(rng.choice(CHARS) for _ in range(14 + 3 * i))  # unequal lengths: padding
        rare = RARE[i % len(RARE)] if client == CLIENT else ""
        out.append({"id": f"{client}-{split}-{i}", "source": "csl", "client": client,
                    "split": split, "input": f"{topic}{rare}{body}，{topic}。",
                    "target": f"{topic}{rare}的{body[:3 + i]}", "meta": {}})
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedsumm_step")
    folders, texts = {}, []
    for k, (c, n_train) in enumerate(zip(CLIENTS, TRAIN_SIZES)):
        for split, n in (("train", n_train), ("val", 2), ("test", 1)):
            recs = _records(c, split, n, k)
            write_jsonl_atomic(root / "clients" / c / f"{split}.jsonl", recs)
            if split == "train":
                texts += [r["input"] for r in recs] + [r["target"] for r in recs]
        folders[c] = str(root / "clients" / c)
    texts = ["".join(ch for ch in t if ch not in RARE) for t in texts]
    build_tiny_chinese_bart(texts, root / "backbone", {
        "d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1,
        "max_position_embeddings": 64})
    return root, folders


def _cell(world, tmp: Path, model: str, regime: str, optimizer: str, **over) -> dict:
    root, folders = world
    cell = {
        "paper": "fedsumm", "scale": "demo", "corpus": "csl", "num_clients": 3, "model": model,
        "regime": regime, "seed": 1, "backbone": "bart-base-chinese",
        "backbone_dir": str(root / "backbone"),
        "clients": list(CLIENTS[:1]) if regime == "single" else list(CLIENTS),
        "eval_clients": list(CLIENTS), "client_data": dict(folders),
        # dropout 0.1 as both configs: the reference below redraws the same masks
        "copy_transformer": {"d_model": 16, "heads": 2, "encoder_layers": 1, "decoder_layers": 1,
                             "ffn_dim": 32, "dropout": 0.1, "max_positions": 64},
        "copy_attention": "cross_attention",
        "algorithm": {"epsilon": EPS, "dldt": "inner_product", "reading": "update_direction_rank"},
        "dp": {"enabled": False},
        "train": {"rounds": 1, "local_epochs": 1, "optimizer": optimizer, "lr": LR,
                  "weight_decay": DECAY[optimizer], "batch_size": 16, "max_grad_norm": None,
                  "max_source_length": 48, "max_target_length": 16},
        "generation": {"beam_size": 1, "max_new_tokens": 4, "min_new_tokens": 1,
                       "length_penalty": 1.0, "no_repeat_ngram_size": 3, "batch_size": 8},
        "rouge_every_round": False, "threads": 1, "engine": "inprocess", "device": "cpu",
        "clients_per_round": None, "keep_round_checkpoints": False, "round_timeout_s": 300,
        "out_dir": str(tmp / f"{model}-{regime}-{optimizer}"),
    }
    for key, value in over.items():
        cell[key] = {**cell[key], **value} if isinstance(value, dict) else value
    return cell


# ----------------------------------------------------------------------------- the paper's loss
def _data_loss(model, batch: dict) -> torch.Tensor:
    """L_b: the mean over the batch's non-padding target tokens of −log P(y_t) (eq. 2-3's f_i).

    BART: P = softmax of the LM logits, a target outside the vocabulary counts as [UNK]; CT and
    BART + CD: P = the model's pointer-generator mixture over the extended vocabulary (§III-B),
    floored at 1e-12 before the log."""
    labels = batch["labels"]
    mask = labels != IGNORE
    if hasattr(model, "get_encoder"):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=batch["decoder_input_ids"], use_cache=False).logits
        labels = torch.where(labels >= logits.shape[-1], batch["unk_token_id"], labels)
        log_p = torch.log_softmax(logits.float(), dim=-1)
    else:
        probs = model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"],
                      batch["src_ext_ids"], batch["n_oov"])
        log_p = torch.log(probs.clamp_min(1e-12))
    picked = log_p.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return -(picked * mask).sum() / mask.sum()


def _eq7(model, batch: dict, memory: dict | None, dldt: str) -> tuple[torch.Tensor, dict]:
    """Eq. 7's total loss J = L_b + ε·ρ·dL/dt·max(‖∇L_b‖, 1) (the max detached) with eq. 4's
    dL/dt = ⟨∇L_b, −MG⟩ (``inner_product``) or L_b − l_prev (``loss_difference``); J = L_b
    without a memory entry (FedAvg, first rounds, local regimes)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    loss = _data_loss(model, batch)
    if memory is None:
        return loss, {"loss": float(loss.detach()), "term": 0.0}
    grads = torch.autograd.grad(loss, [p for _, p in named], create_graph=True,
                                allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for (_, p), g in zip(named, grads)]
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    scale = max(float(norm.detach()), 1.0)
    if dldt == "inner_product":
        rate = -sum((g * memory[n]).sum() for (n, _), g in zip(named, grads))
    else:
        rate = loss - L_PREV
    term = EPS * RHO * rate * scale
    return loss + term, {"loss": float(loss.detach()), "term": float(term.detach()),
                         "norm": float(norm.detach()), "scale": scale}


def _optimizer_step(w: dict, grads: dict, optimizer: str) -> dict:
    """One step from a fresh optimizer: eq. 3 ``w − η·g`` (SGD, plus ``λw`` in g when decayed) or
    AdamW's first step ``w·(1 − ηλ) − η·m̂/(√v̂ + eps)``, m = (1−β1)g, v = (1−β2)g²,
    m̂ = m/(1−β1), v̂ = v/(1−β2)."""
    lam = DECAY[optimizer]
    out = {}
    for n, g in grads.items():
        w0 = w[n].double()
        g = g.double()
        if optimizer == "sgd":
            out[n] = w0 - LR * (g + lam * w0)
        else:
            b1, b2 = ADAMW_BETAS
            m, v = (1 - b1) * g, (1 - b2) * g * g  # the moments after one step from 0
            m_hat, v_hat = m / (1 - b1), v / (1 - b2)  # bias-corrected (step 1)
            out[n] = w0 * (1 - LR * lam) - LR * m_hat / (v_hat.sqrt() + ADAMW_EPS)
    return out


def _start(cell: dict) -> OrderedDict:
    """w_t: the cell's initial model moved by seeded noise (a generic point; ‖∇L_b‖ > 1 there)."""
    g = torch.Generator().manual_seed(11)
    return OrderedDict((n, t + W_NOISE * torch.randn(t.shape, generator=g))
                       for n, t in task.initial_state(cell).items())


def _memory(w_t: dict) -> dict:
    """A memory entry MG[v] (seeded), keyed like the trainable parameters."""
    g = torch.Generator().manual_seed(7)
    return {n: MG_SCALE * torch.randn(t.shape, generator=g) for n, t in w_t.items()}


def _guidance_records(memory: dict, epsilon: float = EPS, rho: float = RHO) -> dict:
    """The train message's extra records as the server sends them: g̃ = MG·ε·ρ, and ρ, l, ε."""
    scale = epsilon * rho
    return {
        task.GUIDANCE_CONFIG: ConfigRecord({"rho": rho, "previous-loss": L_PREV,
                                            "epsilon": epsilon, "has-gradient": True,
                                            "round": ROUND}),
        task.GUIDANCE_ARRAYS: ArrayRecord(OrderedDict(sorted(
            (n, m * scale) for n, m in memory.items()))),
    }


def _reference(cell: dict, w_t: dict, records: list, name: str, round_index: int,
               memory: dict | None, dldt: str = "inner_product"):
    """On a separate model holding w_t: the client's one batch (the task's seeded order: the
    dropout masks depend on it), the same dropout seed, J of eq. 7 and its gradient by backprop."""
    ref = task.build_model(cell)
    task.load_shared_state(ref, w_t, "reference")
    ref = copy.deepcopy(ref).train()
    batches = task.epoch_batches(cell, ref, task.tokenizer(cell), records, name, round_index)(0)
    assert len(batches) == 1 and batches[0]["labels"].shape[0] == len(records)
    torch.manual_seed(derive_seed(int(cell["seed"]), name, round_index, "fedsumm-torch"))
    with sdpa_kernel(SDPBackend.MATH):  # the attention kernel that has a double backward
        total, parts = _eq7(ref, batches[0], memory, dldt)
    total.backward()
    grads = {n: (torch.zeros_like(p) if p.grad is None else p.grad.detach().clone())
             for n, p in ref.named_parameters() if p.requires_grad}
    frozen = [n for n, p in ref.named_parameters() if not p.requires_grad]
    return grads, parts, frozen, batches[0]


def _assert_step(got: dict, w_t: dict, expected: dict) -> None:
    """Every parameter's change equals the hand step's (float32 client vs float64 formula)."""
    assert set(got) == set(expected)
    for n in expected:
        want = (expected[n] - w_t[n].double()).float()
        have = got[n] - w_t[n]
        torch.testing.assert_close(have, want, rtol=2e-4, atol=2e-6 * LR, msg=n)


def _assert_adamw_step(sent: dict, w_t: dict, grads: dict, applied: dict) -> None:
    """AdamW's first step is ≈ −η·sign(g) wherever |g| ≫ eps, so entries whose gradient is float
    noise (e.g. attention key biases: exactly 0 in arithmetic, ~1e-9 after backprop) move by ±η
    on either computation.  So: the gradient the step applied (the reply) equals ∇J of eq. 7 up
    to float32 noise (1e-5 of the largest gradient entry); the step is AdamW's on that gradient,
    every entry; and AdamW's on ∇J computed here wherever both gradients are exactly 0 (rows of
    tokens not in the batch: decay only) or above the noise (1e-5 of the largest entry)."""
    assert list(applied) == sorted(grads)
    top = max(float(g.abs().max()) for g in grads.values())
    for n, g in grads.items():
        torch.testing.assert_close(applied[n], g, rtol=2e-4, atol=1e-5 * top, msg=n)
    _assert_step(sent, w_t, _optimizer_step(w_t, applied, "adamw"))
    noise = 0
    for n, g in grads.items():
        keep = ((g == 0) & (applied[n] == 0)) | (g.abs() > 1e-5 * top)
        want = (_optimizer_step(w_t, {n: g}, "adamw")[n] - w_t[n].double()).float()
        torch.testing.assert_close((sent[n] - w_t[n])[keep], want[keep], rtol=2e-4,
                                   atol=2e-6 * LR, msg=n)
        noise += int((~keep).sum())
    assert noise < 0.02 * sum(g.numel() for g in grads.values())


def _norm(tensors) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors))


MODELS = ("bart", "ct", "bart-cd")


# ----------------------------------------------------------------------------- client step
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("regime", ["FedSUMM", "FedAvg"])
@pytest.mark.parametrize("model", MODELS)
def test_federated_client_round_is_one_step_on_eq7_total_loss(world, tmp_path, model, regime,
                                                               optimizer):
    """FedSUMM eq. 7 + eq. 4 (FedSUMM) or the data loss alone (FedAvg), one step of eq. 3's SGD
    or of AdamW, through ``client_train_round`` (Algorithm 1's ClientUpdate): the sent tensors
    are w_t moved by exactly that step, all of them and only the trainable ones, sorted; the
    stats and the reply carry L_b (not J) and eq. 7's term."""
    # AdamW: the client also returns the gradient its step applied (mean_batch_gradient)
    algorithm = {"client_gradient": "mean_batch_gradient"} if optimizer == "adamw" else {}
    cell = _cell(world, tmp_path, model, regime, optimizer, algorithm=algorithm)
    w_t = _start(cell)
    memory = _memory(w_t) if regime == "FedSUMM" else None
    records = _guidance_records(memory) if memory is not None else {}
    sent, stats, reply = task.client_train_round(cell, CLIENT, ROUND, w_t, records)

    train = task.client_records(cell, CLIENT, "train")
    grads, parts, frozen, batch = _reference(cell, w_t, train, CLIENT, ROUND, memory)
    if optimizer == "sgd":
        _assert_step(sent, w_t, _optimizer_step(w_t, grads, optimizer))
    else:
        _assert_adamw_step(sent, w_t, grads, reply[task.REPLY_GRADIENT].to_torch_state_dict())

    assert frozen == []  # full fine-tuning: nothing frozen, every parameter is sent ...
    assert list(sent) == sorted(w_t) == sorted(grads)  # ... sorted by name (the wire order)
    assert stats["n_steps"] == 1 and stats["num_examples"] == len(train) == 4
    assert stats["train_loss"] == pytest.approx(parts["loss"], rel=1e-5)  # l^c = L_b, not J
    assert list(reply[task.REPLY_STEPS]["step-losses"]) == [stats["train_loss"]]
    assert stats["guided"] == int(regime == "FedSUMM")
    assert (batch["labels"] >= task.vocab_size(task.build_model(cell))).any()  # copy ids in use
    if regime == "FedSUMM":
        assert stats["objective_term"] == pytest.approx(parts["term"], rel=1e-4)
        assert stats["grad_norm"] == pytest.approx(parts["norm"], rel=1e-5)
        assert parts["scale"] > 1.1  # max(‖∇L_b‖, 1) is not 1: the factor is tested
        # the guided term's gradient ε·ρ·s·H·MG is not small next to ∇L_b (non-vacuous)
        plain, _, _, _ = _reference(cell, w_t, train, CLIENT, ROUND, None)
        assert _norm(grads[n] - plain[n] for n in grads) > 0.3 * _norm(plain.values())
    else:  # a FedAvg client never takes guidance
        with pytest.raises(InputError, match="FedAvg client received FedSUMM guidance"):
            task.client_train_round(cell, CLIENT, ROUND, w_t, _guidance_records(_memory(w_t)))


@pytest.mark.parametrize("regime", ["single", "all"])
@pytest.mark.parametrize("model", MODELS)
def test_local_regime_round_is_one_step_on_the_data_loss(world, tmp_path, model, regime):
    """single / all (Table I's rows without a server): one round of ``run_local`` with one batch
    (the first client's, or the three clients' pooled 9 examples) is one eq. 3 SGD step on L_b;
    the round's checkpoint (the model the regime is evaluated with) is that step."""
    cell = _cell(world, tmp_path, model, regime, "sgd")
    w_t = task.initial_state(cell)
    finals = task.run_local(cell)["model"]
    train = tuple(r for c in cell["clients"] for r in task.client_records(cell, c, "train"))
    assert len(train) == (3 if regime == "single" else sum(TRAIN_SIZES))
    name = cell["clients"][0] if regime == "single" else "csl-all"
    grads, _, frozen, _ = _reference(cell, w_t, train, name, 1, None)
    assert frozen == [] and list(finals) == sorted(w_t)
    _assert_step(finals, w_t, _optimizer_step(w_t, grads, "sgd"))


def test_ct_without_dropout_takes_its_guided_step(world, tmp_path):
    """Eq. 7's Hessian-vector product through CT's ``nn.Transformer`` with ``dropout: 0``: on the
    CPU, PyTorch then picks its flash attention kernel, which has no double backward, and the
    client crashed in its first guided round ("derivative for
    aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented") until the
    local update ran guided forwards on the math kernel.  Now: one step on J, as above."""
    cell = _cell(world, tmp_path, "ct", "FedSUMM", "sgd", copy_transformer={"dropout": 0.0})
    w_t = _start(cell)
    memory = _memory(w_t)
    sent, stats, _ = task.client_train_round(cell, CLIENT, ROUND, w_t, _guidance_records(memory))
    train = task.client_records(cell, CLIENT, "train")
    grads, parts, _, _ = _reference(cell, w_t, train, CLIENT, ROUND, memory)
    _assert_step(sent, w_t, _optimizer_step(w_t, grads, "sgd"))
    assert stats["objective_term"] == pytest.approx(parts["term"], rel=1e-4)


def test_loss_difference_reading_is_one_step_on_its_eq7(world, tmp_path):
    """Eq. 7 with ``dldt: loss_difference`` (dL/dt ≈ L_b − l_prev per round): J's gradient is
    ∇L_b·(1 + ε·ρ·s), so one unclipped SGD step of the CT client is w_t − η·(1 + ε·ρ·s)·∇L_b."""
    cell = _cell(world, tmp_path, "ct", "FedSUMM", "sgd", algorithm={"dldt": "loss_difference"})
    w_t = _start(cell)
    memory = _memory(w_t)
    sent, stats, _ = task.client_train_round(cell, CLIENT, ROUND, w_t, _guidance_records(memory))
    train = task.client_records(cell, CLIENT, "train")
    grads, parts, _, _ = _reference(cell, w_t, train, CLIENT, ROUND, memory, "loss_difference")
    _assert_step(sent, w_t, _optimizer_step(w_t, grads, "sgd"))
    assert parts["scale"] > 1.1 and stats["guided"] == 1
    assert stats["objective_term"] == pytest.approx(
        EPS * RHO * (parts["loss"] - L_PREV) * parts["scale"], rel=1e-4)


def test_clipped_step_and_the_mean_batch_gradient_reply(world, tmp_path):
    """Eq. 7 (``inner_product``) with gradient clipping to 0.7 before the SGD step
    (``max_grad_norm``, ours) and ``client_gradient: mean_batch_gradient``: the step is −η·∇J·0.7/‖∇J‖ and the reply's
    ``fedsumm-gradient`` is that clipped ∇J (the gradient the step applied)."""
    max_norm = 0.7
    cell = _cell(world, tmp_path, "bart-cd", "FedSUMM", "sgd",
                 algorithm={"client_gradient": "mean_batch_gradient"},
                 train={"max_grad_norm": max_norm})
    w_t = _start(cell)
    memory = _memory(w_t)
    sent, _, reply = task.client_train_round(cell, CLIENT, ROUND, w_t, _guidance_records(memory))
    train = task.client_records(cell, CLIENT, "train")
    grads, parts, _, _ = _reference(cell, w_t, train, CLIENT, ROUND, memory)
    total = _norm(grads.values())
    assert total > 2 * max_norm and parts["scale"] > 1.1  # clipping and the max(·, 1) both act
    clipped = {n: g * (max_norm / (total + 1e-6)) for n, g in grads.items()}
    _assert_step(sent, w_t, _optimizer_step(w_t, clipped, "sgd"))
    got = reply[task.REPLY_GRADIENT].to_torch_state_dict()
    assert list(got) == sorted(clipped)
    for n in clipped:
        torch.testing.assert_close(got[n], clipped[n], rtol=2e-4, atol=2e-6, msg=n)


# ----------------------------------------------------------------------------- server rule
W0 = OrderedDict(a=[[0.25, -1.0, 0.5], [1.5, -0.75, 2.0]], b=[0.125, -0.5, 1.0, -2.0])
SIZES = {"c1": 1, "c2": 4, "c3": 9}  # examples per client: Algorithm 1 does not weight by them
LOSSES = {1: {"c1": 0.9, "c2": 0.4, "c3": 0.6}, 2: {"c1": 0.7, "c2": 0.8, "c3": 0.3}}
# the clients' updates Δ^c = w^c − w_t, per round (entries distinct at 8 significant bits)
UPDATES = {
    1: {"c1": {"a": [0.5, -0.25, 1.5, -1.0, 0.75, 0.125], "b": [-0.5, 1.25, 0.25, -2.0]},
        "c2": {"a": [-0.375, 1.0, 0.25, 0.5, -1.5, 2.0], "b": [1.0, -0.25, 0.5, 0.75]},
        "c3": {"a": [0.75, 0.5, -0.25, -1.25, 1.0, -0.5], "b": [0.25, 0.5, -1.5, 1.75]}},
    2: {"c1": {"a": [-0.25, 0.5, 1.0, 0.75, -1.5, 0.375], "b": [0.5, -1.0, 2.0, 0.25]},
        "c2": {"a": [1.25, -0.5, 0.75, -1.0, 0.25, 1.5], "b": [-0.75, 0.5, 1.0, -0.25]},
        "c3": {"a": [0.5, 1.75, -0.75, 0.25, -1.25, -2.0], "b": [1.5, 0.25, -0.5, -1.0]}},
}
SERVER_EPS = 0.3
ALGORITHM = {  # both configs' fedsumm.algorithm, with ε = 0.3
    "epsilon": SERVER_EPS, "reading": "update_direction_rank", "client_gradient": "delta",
    "memory_assignment": "own", "rho_reduction": "expected", "rho_window": "cumulative",
    "rho_scope": "global", "rho_reference": "round_mean", "apply_on_server": True,
    "dldt": "inner_product"}


def _scores(x: list[float]) -> list[float]:
    """Rank-based normal scores (§III-C's normalisation, reading ``update_direction_rank``):
    Φ^{-1}((#{x_j < x_i} + #{x_j = x_i}/2) / d)."""
    d = len(x)
    u = [(sum(v < xi for v in x) + sum(v == xi for v in x) / 2) / d for xi in x]
    return torch.special.ndtri(torch.tensor(u, dtype=torch.float64)).tolist()


def _softmax(z: list[float]) -> list[float]:
    e = [math.exp(v) for v in z]
    return [v / sum(e) for v in e]


def _hand_server(rounds: int) -> tuple[list[dict], list[dict]]:
    """Eq. 5-6 and Algorithm 1 by hand in float64: per round t and tensor k, σ_c,t = softmax of
    the scores of Δ^c_k, σ_g,t = softmax of the scores of the mean update; S = Σ_t σ (cumulative
    window); ρ_{c,k} = Σ_i p_i²/q_i with p = S_c/|T|, q = S_g/|T| (``expected``); the server step
    w_{t+1} = w_t + (1/C) Σ_c (1 + ε·ρ_{c,k}) Δ^c_k (g̃ = MG·ε·ρ with MG = −Δ, ``own``/``delta``,
    applied on the server).  Returns per round w_{t+1} and ρ."""
    w = {k: torch.tensor(v, dtype=torch.float64).reshape(-1).tolist() for k, v in W0.items()}
    s_c = {c: {k: [0.0] * len(w[k]) for k in w} for c in SIZES}
    s_g = {k: [0.0] * len(w[k]) for k in w}
    ws, rhos = [], []
    for t in range(1, rounds + 1):
        upd = UPDATES[t]
        for k in w:
            mean = [sum(upd[c][k][i] for c in SIZES) / 3 for i in range(len(w[k]))]
            s_g[k] = [a + b for a, b in zip(s_g[k], _softmax(_scores(mean)))]
            for c in SIZES:
                s_c[c][k] = [a + b for a, b in zip(s_c[c][k], _softmax(_scores(upd[c][k])))]
        rho = {c: {k: sum((pc / t) ** 2 / (pg / t) for pc, pg in zip(s_c[c][k], s_g[k]))
                   for k in w} for c in SIZES}
        w = {k: [w[k][i] + sum((1 + SERVER_EPS * rho[c][k]) * upd[c][k][i] for c in SIZES) / 3
                 for i in range(len(w[k]))] for k in w}
        ws.append(w)
        rhos.append(rho)
    return ws, rhos



def _strategy(regime: str, tmp: Path) -> FedSummStrategy:
    cell = {"regime": regime, "algorithm": dict(ALGORITHM), "clients": list(SIZES),
            "clients_per_round": None, "dp": {"enabled": False}, "train": {"rounds": 2},
            "keep_round_checkpoints": False}
    s = FedSummStrategy(cell, out_dir=tmp / regime, round_offset=0, expected_clients=3, seed=5,
                        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=3,
                        min_evaluate_nodes=0, min_available_nodes=3,
                        weighted_by_key="num-examples")
    s._node_of = {0: 11, 1: 12, 2: 13}  # partition id -> node id (skips the partition query)
    return s


def _arrays(w: dict) -> ArrayRecord:
    return ArrayRecord(OrderedDict(
        (k, Array(torch.tensor(v, dtype=torch.float32).reshape(torch.tensor(W0[k]).shape).numpy()))
        for k, v in sorted(w.items())))


def _flat(w: dict) -> dict:
    return {k: torch.tensor(v, dtype=torch.float64).reshape(-1).tolist() for k, v in w.items()}


def _round(s: FedSummStrategy, t: int, w_t: dict):
    """configure_train (what each client is sent) and aggregate_arrays on the round's replies."""
    messages = s.configure_train(t, _arrays(w_t), ConfigRecord({"cell": "{}"}), None)
    by_pid = {pid: m for m in messages for pid, node in s._node_of.items()
              if m.metadata.dst_node_id == node}
    replies = []
    for pid, c in enumerate(SIZES):
        params = {k: [a + d for a, d in zip(w_t[k], UPDATES[t][c][k])] for k in w_t}
        metrics = MetricRecord({"partition-id": pid, "num-examples": SIZES[c],
                                "train-loss": LOSSES[t][c]})
        replies.append(Message(RecordDict({"arrays": _arrays(params), "metrics": metrics}),
                               reply_to=by_pid[pid]))
    arrays, metrics = s.aggregate_arrays(t, replies)
    got = {k: v.reshape(-1).double().tolist() for k, v in arrays.to_torch_state_dict().items()}
    return by_pid, got, metrics


def _close(got: list[float], want: list[float], tol: float = 2e-6) -> None:
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64),
                               torch.tensor(want, dtype=torch.float64), rtol=0, atol=tol)


def test_fedsumm_server_two_rounds_unequal_clients_by_hand(task_identity, tmp_path):
    """Algorithm 1 with eq. 5-6 (reading ``update_direction_rank``, cumulative ρ, ``expected``)
    on clients with 1, 4, 9 examples: w_{t+1} = w_t + (1/3) Σ_c (1 + ε·ρ_{c,k}) Δ^c_k, the
    unweighted mean of Algorithm 1 (not the example-weighted one); round 2 sends each client
    g̃^c = MG[c]·ε·ρ_{c,k} (MG[c] = w_t − w^c) with ρ_c = mean_k ρ_{c,k}, l^c and ε."""
    want_w, want_rho = _hand_server(2)
    s = _strategy("FedSUMM", tmp_path)
    w0 = _flat(W0)
    first, w1, m1 = _round(s, 1, w0)
    assert all(len(m.content) == 2 for m in first.values())  # round 1: w_t and config only
    for k in w1:
        _close(w1[k], want_w[0][k])
    assert m1["rho-mean"] == pytest.approx(
        sum(sum(r.values()) / 2 for r in want_rho[0].values()) / 3, rel=1e-6)
    # non-vacuous: ρ differs between clients and tensors, and the weights would change w_1
    assert max(r[k] for r in want_rho[0].values() for k in r) - min(
        r[k] for r in want_rho[0].values() for k in r) > 0.05
    weighted = {k: [w0[k][i] + sum(SIZES[c] * (1 + SERVER_EPS * want_rho[0][c][k])
                                   * UPDATES[1][c][k][i] for c in SIZES) / 14
                    for i in range(len(w0[k]))] for k in w0}
    assert max(abs(a - b) for k in w1 for a, b in zip(w1[k], weighted[k])) > 0.1

    sent, w2, _ = _round(s, 2, w1)
    for pid, c in enumerate(SIZES):
        cfg = sent[pid].content[task.GUIDANCE_CONFIG]
        assert cfg["rho"] == pytest.approx(sum(want_rho[0][c].values()) / 2, rel=1e-6)
        assert cfg["previous-loss"] == pytest.approx(LOSSES[1][c])
        assert cfg["epsilon"] == pytest.approx(SERVER_EPS) and cfg["has-gradient"]
        g = sent[pid].content[task.GUIDANCE_ARRAYS].to_torch_state_dict()
        for k in g:
            mg = [-d for d in UPDATES[1][c][k]]  # MG[c] = w_t − w^c
            _close(g[k].reshape(-1).double().tolist(),
                   [v * SERVER_EPS * want_rho[0][c][k] for v in mg])
    for k in w2:
        _close(w2[k], want_w[1][k], tol=1e-5)


def test_fedavg_server_unequal_clients_plain_mean_and_same_rho(task_identity, tmp_path):
    """FedAvg's server in these cells: Algorithm 1's unweighted mean w_t + (1/3) Σ_c Δ^c (clients
    of 1, 4, 9 examples), no guidance sent, and the same ρ as FedSUMM's (Fig. 6)."""
    _, want_rho = _hand_server(1)
    s = _strategy("FedAvg", tmp_path)
    w0 = _flat(W0)
    _, w1, metrics = _round(s, 1, w0)
    for k in w1:
        _close(w1[k], [w0[k][i] + sum(UPDATES[1][c][k][i] for c in SIZES) / 3
                       for i in range(len(w0[k]))])
    assert metrics["rho-mean"] == pytest.approx(
        sum(sum(r.values()) / 2 for r in want_rho[0].values()) / 3, rel=1e-6)
    sent, _, _ = _round(s, 2, w1)
    assert all(len(m.content) == 2 for m in sent.values())  # never any guidance
