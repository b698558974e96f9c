"""FedSUMM (Pan et al.): Algorithm 1 / eq. 4–7 against hand computations, and character ROUGE."""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedrepro.papers.fedsumm.algorithm import (
    ClientGuidance,
    ClientReply,
    DiscrepancyTracker,
    DiskVectorStore,
    FedSummConfig,
    FedSummServer,
    ServerStateConfig,
    discrepancy_ratio,
    fedsumm_local_update,
    fedsumm_objective,
    load_trainable_state,
    modulate_gradient,
    softmax_normalize,
    sort_memory_by_loss,
    state_names,
    trainable_state,
)
from fedrepro.io import InputError
from fedrepro.metrics.rouge import CharTokenizer, is_dropped_char, rouge_scores

LN2 = math.log(2.0)


def od(**tensors) -> OrderedDict:
    return OrderedDict((k, torch.tensor(v, dtype=torch.float32)) for k, v in tensors.items())


# ----------------------------------------------------------------------------- character ROUGE
def test_char_rouge_drops_punctuation_and_spaces():
    # tokens: 我们开会 vs 我们吃饭 once "，。 ！" are dropped -> the hand numbers of 我们开会/我们吃饭:
    # R-1 2/4 -> 50; bigrams {我们, 们开, 开会} vs {我们, 们吃, 吃饭}: 1/3 -> 33.33; LCS 2/4 -> 50
    out = rouge_scores(["我们，开会。"], ["我们 吃饭！"], lang="zh")
    assert out["rouge1"] == pytest.approx(50.0)
    assert out["rouge2"] == pytest.approx(100 / 3)
    assert out["rougeL"] == pytest.approx(50.0)


def test_char_rouge_hand_computation_unequal_lengths():
    # ref 今天天气不错，很好。 -> 今天天气不错很好 (8 tokens); pred 今天天气很好 (6 tokens)
    # clipped overlap 今1 天2 气1 很1 好1 = 6 -> P 6/6, R 6/8, F = 2·0.75/1.75 = 6/7
    # pred bigrams 今天 天天 天气 气很 很好 (5); ref 今天 天天 天气 气不 不错 错很 很好 (7);
    #      overlap 4 -> P 4/5, R 4/7, F = 2/3
    # R-L: LCS 今天天气很好 = 6 -> same as R-1
    out = rouge_scores(["今天天气很好"], ["今天天气不错，很好。"], lang="zh")
    assert out["rouge1"] == pytest.approx(100 * 6 / 7)
    assert out["rouge2"] == pytest.approx(100 * 2 / 3)
    assert out["rougeL"] == pytest.approx(100 * 6 / 7)


def test_char_tokenizer_rule():
    dropped = "，。、；：？！“”‘’（）《》【】「」…—·,.!?;:'\"()[]-_/@#%&*$+<=>^`|~＋＝＄～％ \u3000\n\t\u200b\ufeff"
    kept = "中文字2０aZ×≥℃°￥αБ"
    assert all(is_dropped_char(ch) for ch in dropped), [
        ch for ch in dropped if not is_dropped_char(ch)
    ]
    assert not any(is_dropped_char(ch) for ch in kept), [ch for ch in kept if is_dropped_char(ch)]
    assert CharTokenizer().tokenize("温度：37℃，（正常）") == list("温度37℃正常")
    assert CharTokenizer(drop_punctuation=False).tokenize("温度：37℃") == list("温度：37℃")


# ----------------------------------------------------------------------------- ρ (eq. 5–6)
def test_softmax_normalize_scopes():
    p = od(a=[0.0, LN2], b=[0.0])
    (flat,) = softmax_normalize(p, "global")
    assert torch.allclose(flat, torch.tensor([0.25, 0.5, 0.25]))
    a, b = softmax_normalize(p, "per_tensor")
    assert torch.allclose(a, torch.tensor([1 / 3, 2 / 3])) and torch.allclose(
        b, torch.tensor([1.0])
    )


def test_rho_hand_computation_uniform_global():
    client, global_ = od(a=[0.0, LN2], b=[0.0]), od(a=[0.0, 0.0], b=[0.0])
    sc, sg = softmax_normalize(client), softmax_normalize(global_)
    # p = [1/4, 1/2, 1/4], q = [1/3]*3, ratio = [3/4, 3/2, 3/4]
    assert discrepancy_ratio(sc, sg, "mean") == pytest.approx(1.0)  # uniform q -> always 1
    assert discrepancy_ratio(sc, sg, "expected") == pytest.approx(
        3 * (1 / 16 + 1 / 4 + 1 / 16)
    )  # 1.125
    # per tensor: a: p=[1/3,2/3], q=[1/2,1/2] -> expected 2(1/9 + 4/9) = 10/9; b: 1 -> mean 19/18
    sc_t, sg_t = softmax_normalize(client, "per_tensor"), softmax_normalize(global_, "per_tensor")
    assert discrepancy_ratio(sc_t, sg_t, "expected") == pytest.approx(19 / 18)
    assert discrepancy_ratio(sg, sg, "expected") == pytest.approx(1.0)


def test_rho_hand_computation_nonuniform_global():
    client, global_ = od(a=[LN2, 0.0], b=[0.0]), od(a=[0.0, LN2], b=[0.0])
    sc, sg = softmax_normalize(client), softmax_normalize(global_)
    # p = [2,1,1]/4, q = [1,2,1]/4, ratio = [2, 1/2, 1]
    assert discrepancy_ratio(sc, sg, "mean") == pytest.approx(3.5 / 3)
    assert discrepancy_ratio(sc, sg, "expected") == pytest.approx(0.5 * 2 + 0.25 * 0.5 + 0.25 * 1)


def test_rho_cumulative_window_sums_over_rounds():
    tracker = DiscrepancyTracker(scope="global", reduction="expected", window="cumulative")
    zeros = od(a=[0.0, 0.0], b=[0.0])
    assert tracker.update("c", od(a=[0.0, LN2], b=[0.0]), zeros) == pytest.approx(1.125)
    # round 2 with client == global (uniform): S_c = p + u, S_g = 2u -> p̄ = [7,10,7]/24,
    # ρ = Σ p̄²/(1/3) = 3·198/576
    assert tracker.update("c", zeros, zeros) == pytest.approx(3 * 198 / 576)
    per_round = DiscrepancyTracker(window="round")
    per_round.update("c", od(a=[0.0, LN2], b=[0.0]), zeros)
    assert per_round.update("c", zeros, zeros) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- MG and modulation
def test_memory_sorted_by_loss_ties_by_id():
    assert sort_memory_by_loss({"c1": 0.5, "c2": 0.2, "c3": 0.5, "c0": 0.9}) == [
        "c2",
        "c1",
        "c3",
        "c0",
    ]
    with pytest.raises(InputError, match="non-finite"):
        sort_memory_by_loss({"c1": float("nan")})


def test_modulate_gradient_when_norm_differs_from_one():
    g = od(a=[3.0, 4.0])  # norm 5
    out, modulated, norm = modulate_gradient(g, epsilon=0.5, rho=1.2)
    assert modulated and norm == pytest.approx(5.0)
    assert torch.allclose(out["a"], torch.tensor([3.0, 4.0]) * 0.6)
    unit = od(a=[0.6, 0.8])  # norm exactly 1: no adaptation
    out, modulated, norm = modulate_gradient(unit, epsilon=0.5, rho=1.2)
    assert not modulated and norm == pytest.approx(1.0)
    assert torch.allclose(out["a"], torch.tensor([0.6, 0.8]))


def _reply(params: OrderedDict, w_t: OrderedDict, loss: float) -> ClientReply:
    return ClientReply(params, OrderedDict((k, w_t[k] - params[k]) for k in w_t), loss)


def test_server_round_own_memory_hand_computation():
    cfg = FedSummConfig(epsilon=0.5, rho_reference="broadcast", rho_reduction="expected")
    server = FedSummServer(cfg, ["c1", "c2", "c3"], seed=0)
    w_t = od(w=[0.0, 0.0, 0.0])
    params = {"c1": od(w=[LN2, 0.0, 0.0]), "c2": od(w=[0.0, 0.0, 0.0]), "c3": od(w=[0.0, LN2, LN2])}
    losses = {"c1": 0.7, "c2": 0.3, "c3": 0.5}
    replies = {c: _reply(params[c], w_t, losses[c]) for c in params}
    w_next, log = server.server_round(1, w_t, replies)
    # ρ against the uniform broadcast model: c1 p=[2,1,1]/4 -> 3(4+1+1)/16 = 1.125;
    # c2 p = q -> 1; c3 p=[1,2,2]/5 -> 3(1+4+4)/25 = 1.08
    assert log["rho"] == pytest.approx({"c1": 1.125, "c2": 1.0, "c3": 1.08})
    assert log["memory_order"] == ["c2", "c3", "c1"]
    # c2's delta is 0 (norm 0 ≠ 1 -> "modulated", but zero); the others have norms ln2, ln2·√2
    assert log["gradient_norms"]["c1"] == pytest.approx(LN2)
    assert log["modulated"] == {"c1": True, "c2": True, "c3": True}
    # apply_on_server: w^c - g̃^c = w^c + ερ(w^c - w_t); then the plain mean
    expected = sum((1 + 0.5 * log["rho"][c]) * params[c]["w"] for c in params) / 3
    assert torch.allclose(w_next["w"], expected, atol=1e-6)
    hand = (
        torch.tensor([(1 + 0.5 * 1.125) * LN2, (1 + 0.5 * 1.08) * LN2, (1 + 0.5 * 1.08) * LN2]) / 3
    )
    assert torch.allclose(w_next["w"], hand, atol=1e-6)
    g1 = server.guidance_for("c1")
    assert g1.rho == pytest.approx(1.125) and g1.previous_loss == pytest.approx(0.7)
    assert torch.allclose(g1.modulated_gradient["w"], torch.tensor([-LN2, 0.0, 0.0]) * 0.5 * 1.125)


def test_server_round_without_server_step_is_plain_mean():
    cfg = FedSummConfig(apply_on_server=False)
    server = FedSummServer(cfg, ["a", "b"], seed=0)
    w_t = od(w=[1.0, 1.0])
    replies = {"a": _reply(od(w=[2.0, 0.0]), w_t, 1.0), "b": _reply(od(w=[4.0, 2.0]), w_t, 2.0)}
    w_next, _ = server.server_round(1, w_t, replies)
    assert torch.allclose(w_next["w"], torch.tensor([3.0, 1.0]))


def test_rank_assignment_gives_sorted_memory_entry():
    cfg = FedSummConfig(
        memory_assignment="rank", epsilon=1.0, apply_on_server=False, rho_reference="broadcast"
    )
    server = FedSummServer(cfg, ["a", "b", "c"], seed=0)
    w_t = od(w=[0.0, 0.0])
    replies = {
        "a": _reply(od(w=[1.0, 0.0]), w_t, 0.9),  # highest loss
        "b": _reply(od(w=[0.0, 2.0]), w_t, 0.1),  # lowest loss
        "c": _reply(od(w=[3.0, 3.0]), w_t, 0.5),
    }
    _, log = server.server_round(1, w_t, replies)
    # sorted MG: [b, c, a]; client index (sorted ids) a->0, b->1, c->2
    assert log["memory_order"] == ["b", "c", "a"]
    assert log["memory_source"] == {"a": "b", "b": "c", "c": "a"}
    g_a = server.guidance_for("a").modulated_gradient["w"]
    assert torch.allclose(g_a, torch.tensor([0.0, -2.0]) * log["rho"]["a"])


def test_unit_norm_memory_is_sent_unmodulated_and_stepped_once():
    cfg = FedSummConfig(epsilon=0.5, rho_reference="broadcast")
    server = FedSummServer(cfg, ["a"], seed=0)
    w_t = od(w=[0.0, 0.0])
    w_next, log = server.server_round(1, w_t, {"a": _reply(od(w=[0.6, 0.8]), w_t, 1.0)})
    assert log["modulated"] == {"a": False}
    assert torch.allclose(w_next["w"], torch.tensor([1.2, 1.6]))  # w^a - MG = w^a + (w^a - w_t)


def test_allocation_is_seeded_random_and_complete():
    server = FedSummServer(FedSummConfig(), [f"c{i}" for i in range(10)], seed=7)
    s1, s1b = server.sample_clients(1), server.sample_clients(1)
    assert s1 == s1b and sorted(s1) == sorted(server.client_ids)
    assert any(server.sample_clients(t) != s1 for t in range(2, 6))
    part = FedSummServer(FedSummConfig(clients_per_round=3), [f"c{i}" for i in range(10)], seed=7)
    assert len(part.sample_clients(4)) == 3
    assert (
        FedSummServer(FedSummConfig(), [f"c{i}" for i in range(10)], seed=8).sample_clients(1) != s1
    )


def test_server_state_round_trip_and_errors():
    cfg = FedSummConfig(epsilon=0.3)
    w_t = od(w=[0.1, -0.2])
    r1 = {"a": _reply(od(w=[0.5, 0.0]), w_t, 1.0), "b": _reply(od(w=[0.0, 0.4]), w_t, 0.5)}
    s1 = FedSummServer(cfg, ["a", "b"], seed=1)
    w1, _ = s1.server_round(1, w_t, r1)
    s2 = FedSummServer(cfg, ["a", "b"], seed=1)
    s2.load_state_dict(s1.state_dict())
    r2 = {"a": _reply(od(w=[0.3, 0.3]), w1, 0.8)}
    out1, log1 = s1.server_round(2, w1, r2)
    out2, log2 = s2.server_round(2, w1, r2)
    assert torch.equal(out1["w"], out2["w"]) and log1["rho"] == log2["rho"]
    with pytest.raises(InputError, match="already aggregated"):
        s1.server_round(2, w1, r2)
    with pytest.raises(InputError, match="unknown clients"):
        s1.server_round(3, w1, {"zz": r2["a"]})
    with pytest.raises(InputError, match="shape"):
        s1.server_round(3, w1, {"a": _reply(od(w=[0.3, 0.3, 0.1]), od(w=[0.0, 0.0, 0.0]), 1.0)})
    with pytest.raises(InputError, match="fedsumm.algorithm.dldt"):
        FedSummConfig.from_config({"dldt": "finite"})
    with pytest.raises(InputError, match="unknown keys"):
        FedSummConfig.from_config({"epsilon": 0.1, "eps": 1})


# ----------------------------------------------------------------------------- eq. 7
def _quadratic(theta: torch.nn.Parameter, a: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a * theta * theta).sum()  # ∇L = a ⊙ θ, Hessian diag(a)


def test_objective_inner_product_value_and_gradient():
    a = torch.tensor([1.0, 3.0])
    theta = torch.nn.Parameter(torch.tensor([2.0, 1.0]))
    g_mod = OrderedDict(theta=torch.tensor([0.5, -1.0]))
    guidance = ClientGuidance(g_mod, rho=1.1, previous_loss=2.0, epsilon=0.2)
    loss = _quadratic(theta, a)  # 0.5(4 + 3) = 3.5
    total, parts = fedsumm_objective(
        loss, [("theta", theta)], guidance, FedSummConfig(dldt="inner_product")
    )
    # ∇L = [2, 3], ‖∇L‖ = √13; dL/dt = ⟨∇L, −g̃⟩ = −(1 − 3) = 2; term = 2·√13
    assert parts["grad_norm"] == pytest.approx(math.sqrt(13))
    assert parts["dldt"] == pytest.approx(2.0)
    assert float(total.detach()) == pytest.approx(3.5 + 2 * math.sqrt(13), rel=1e-6)
    total.backward()
    # d/dθ [L − ⟨aθ, g̃⟩·s] (s detached) = aθ − s·a⊙g̃ = [2, 3] − √13·[0.5, −3]
    expected = torch.tensor([2.0, 3.0]) - math.sqrt(13) * torch.tensor([0.5, -3.0])
    assert torch.allclose(theta.grad, expected, atol=1e-5)


def test_objective_loss_difference_and_first_round():
    a = torch.tensor([1.0, 1.0])
    theta = torch.nn.Parameter(torch.tensor([0.3, 0.4]))  # ∇L = θ, ‖∇L‖ = 0.5 -> max(·,1) = 1
    guidance = ClientGuidance(None, rho=1.5, previous_loss=0.1, epsilon=0.2)
    loss = _quadratic(theta, a)  # 0.125
    cfg = FedSummConfig(dldt="loss_difference")
    total, parts = fedsumm_objective(loss, [("theta", theta)], guidance, cfg)
    assert parts["dldt"] == pytest.approx(0.025)
    assert float(total.detach()) == pytest.approx(0.125 + 0.2 * 1.5 * 0.025)
    total.backward()
    assert torch.allclose(theta.grad, (1 + 0.2 * 1.5) * torch.tensor([0.3, 0.4]))
    # no guidance yet (first round), or dL/dt switched off: J = L_b
    for g, c in (
        (None, cfg),
        (guidance, FedSummConfig(dldt="off")),
        (ClientGuidance(None, 1.0, 1.0, 0.1), FedSummConfig(dldt="inner_product")),
    ):
        loss = _quadratic(theta, a)
        assert fedsumm_objective(loss, [("theta", theta)], g, c)[0] is loss


def test_local_update_gradients_sgd():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    batches = [{"x": x[:4], "y": y[:4]}, {"x": x[4:], "y": y[4:]}]

    def loss_fn(m, b):
        return torch.nn.functional.mse_loss(m(b["x"]), b["y"])

    start = trainable_state(model)
    for kind in ("delta", "mean_batch_gradient"):
        load_trainable_state(model, start)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        res = fedsumm_local_update(
            model, batches, loss_fn, opt, None, FedSummConfig(client_gradient=kind), local_epochs=2
        )
        assert res.n_steps == 4 and len(res.step_losses) == 4
        assert res.loss == pytest.approx(sum(res.step_losses) / 4)
        moved = {k: start[k] - res.params[k] for k in start}
        if kind == "delta":
            for k in start:
                assert torch.allclose(res.gradient[k], moved[k])
        else:  # plain SGD: w_t − w = lr · Σ steps' gradients = lr · n_steps · mean gradient
            for k in start:
                assert torch.allclose(moved[k], 0.1 * 4 * res.gradient[k], atol=1e-6)


def _tiny_bart_and_batch():
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                        decoder_ffn_dim=32, max_position_embeddings=32, dropout=0.0,
                        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0,
                        bos_token_id=2, eos_token_id=3, decoder_start_token_id=3)
    torch.manual_seed(4)
    model = BartForConditionalGeneration(config)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, 40, (2, 9), generator=g)
    labels = torch.randint(5, 40, (2, 6), generator=g)
    labels[1, 4:] = -100  # padding
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
             "decoder_input_ids": torch.cat([torch.full((2, 1), 3), labels[:, :-1].clamp(min=0)], 1),
             "unk_token_id": 1}
    return model, batch


@pytest.mark.parametrize("decay", [0.0, 0.01])
def test_sgd_local_step_moves_parameters_by_minus_lr_times_gradient(decay):
    """``fedsumm.train.optimizer: sgd`` is eq. 3 / Algorithm 1's ``w ← w − δ∇L_b(w)``: one local
    step of the task's client update moves every trainable parameter by exactly −δ·(∇ + λw), with
    the gradient of the mean token cross-entropy computed here independently of the task."""
    from fedrepro.papers.fedsumm import task

    model, batch = _tiny_bart_and_batch()
    lr = 0.37
    cell = {"train": {"optimizer": "sgd", "lr": lr, "weight_decay": decay}}
    opt = task._optimizer(cell, model)
    assert type(opt) is torch.optim.SGD
    start = trainable_state(model)
    # the gradient, by hand: logits of the same model, cross-entropy over non-padding tokens
    ref, _ = _tiny_bart_and_batch()
    logits = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 decoder_input_ids=batch["decoder_input_ids"], use_cache=False).logits
    mask = batch["labels"] != -100
    nll = -torch.log_softmax(logits, -1).gather(-1, batch["labels"].clamp(min=0)[..., None])[..., 0]
    loss = (nll * mask).sum() / mask.sum()
    names = [n for n, p in ref.named_parameters() if p.requires_grad]
    grads = dict(zip(names, torch.autograd.grad(loss, [p for _, p in ref.named_parameters()
                                                      if p.requires_grad], allow_unused=True)))
    # and the task's own loss on a third copy: the same gradient bits as the step sees
    same, _ = _tiny_bart_and_batch()
    same_params = [p for _, p in same.named_parameters() if p.requires_grad]
    exact = dict(zip(names, torch.autograd.grad(task.data_loss(same, batch), same_params,
                                                allow_unused=True)))
    res = fedsumm_local_update(model, [batch], task.data_loss, opt, None,
                               FedSummConfig(dldt="off"), max_grad_norm=None)
    assert res.n_steps == 1 and res.loss == pytest.approx(float(loss), rel=1e-6)
    moved = 0
    for n in names:
        g = torch.zeros_like(start[n]) if grads[n] is None else grads[n]
        expected = start[n] - lr * (g + decay * start[n])
        assert torch.allclose(res.params[n], expected, rtol=0, atol=2e-7), n
        if decay == 0.0:  # bit for bit: w + (−δ)·∇ (one rounding) with the step's own gradient
            g = torch.zeros_like(start[n]) if exact[n] is None else exact[n]
            assert torch.equal(res.params[n], start[n].add(g, alpha=-lr)), n
        moved += int(not torch.equal(res.params[n], start[n]))
    assert moved > 10  # the step moved the model (not a vacuous equality)


def test_optimizer_choice_and_its_config_error():
    from fedrepro.papers.fedsumm import task
    from fedrepro.papers.fedsumm.grid import OPTIMIZERS, train_optimizer

    model = torch.nn.Linear(2, 1)
    assert OPTIMIZERS == ("sgd", "adamw")
    assert type(task._optimizer({"train": {"lr": 0.1}}, model)) is torch.optim.AdamW  # default
    assert type(task._optimizer({"train": {"lr": 0.1, "optimizer": "adamw"}}, model)) is torch.optim.AdamW
    sgd = task._optimizer({"train": {"lr": 0.1, "optimizer": "sgd"}}, model)
    assert sgd.defaults["momentum"] == 0 and sgd.defaults["lr"] == 0.1
    with pytest.raises(InputError, match="fedsumm.train.optimizer"):
        train_optimizer({"optimizer": "adam"})
    with pytest.raises(InputError, match="fedsumm.train.optimizer"):
        task._optimizer({"train": {"lr": 0.1, "optimizer": "lion"}}, model)


def test_two_rounds_end_to_end_with_guidance():
    torch.manual_seed(1)
    clients = {f"c{i}": (torch.randn(16, 4), torch.randn(16, 1) + i) for i in range(3)}
    model = torch.nn.Linear(4, 1)
    server = FedSummServer(FedSummConfig(epsilon=0.1), list(clients), seed=3)

    def loss_fn(m, b):
        return torch.nn.functional.mse_loss(m(b[0]), b[1])

    w = trainable_state(model)
    logs = []
    for t in (1, 2):
        replies = {}
        for c in server.sample_clients(t):
            load_trainable_state(model, w)
            guidance = server.guidance_for(c)
            assert (guidance is None) == (t == 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            res = fedsumm_local_update(
                model, [clients[c]], loss_fn, opt, guidance, FedSummConfig(epsilon=0.1)
            )
            assert (res.mean_objective_term == 0.0) == (t == 1)
            replies[c] = res.reply()
        w, log = server.server_round(t, w, replies)
        logs.append(log)
    assert all(math.isfinite(r) and r >= 1.0 for log in logs for r in log["rho"].values())
    assert logs[1]["rho_mean"] == pytest.approx(sum(logs[1]["rho"].values()) / 3)


# ----------------------------------------------------------------------------- server state storage
SHAPES = {"a": (4, 3), "b": (5,), "c": ()}  # a 0-dim tensor too
P = 4 * 3 + 5 + 1
STORAGE_CLIENTS = [f"c{i}" for i in range(5)]


def _synthetic_replies(server: FedSummServer, t: int, w: OrderedDict) -> dict:
    """S_t's replies: w^c = w_t + a seeded step (so later rounds depend on earlier ones), delta."""
    replies = {}
    for c in server.sample_clients(t):
        g = torch.Generator().manual_seed(1000 * t + server.client_index[c])
        params = OrderedDict((k, w[k] + 0.3 * torch.randn(SHAPES[k], generator=g)) for k in w)
        loss = float(torch.rand((), generator=g))
        replies[c] = ClientReply(params, OrderedDict((k, w[k] - params[k]) for k in w), loss)
    return replies


def _run_server(server: FedSummServer, rounds, w: OrderedDict) -> tuple[OrderedDict, list]:
    """Rounds of partial participation; per round w_{t+1}, ρ and the guidance of every client."""
    trace = []
    for t in rounds:
        w, log = server.server_round(t, w, _synthetic_replies(server, t, w))
        guidance = {c: server.guidance_for(c) for c in server.client_ids}
        trace.append((w, log["rho"], log["gradient_norms"], guidance))
    return w, trace


def _w0() -> OrderedDict:
    g = torch.Generator().manual_seed(0)
    return OrderedDict((k, torch.randn(s, generator=g)) for k, s in SHAPES.items())


def _storage_server(tmp: Path | None, storage="memory", dtype="float32", **algo) -> FedSummServer:
    cfg = FedSummConfig(epsilon=0.5, clients_per_round=3, **algo)
    return FedSummServer(
        cfg,
        STORAGE_CLIENTS,
        seed=4,
        state=ServerStateConfig(storage, dtype),
        state_dir=None if tmp is None else tmp / "server_state",
    )


def _assert_same_trace(a: list, b: list) -> None:
    for (wa, rho_a, norms_a, ga), (wb, rho_b, norms_b, gb) in zip(a, b, strict=True):
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        assert rho_a == rho_b and norms_a == norms_b
        for c in ga:
            assert (ga[c] is None) == (gb[c] is None)
            if ga[c] is not None:
                assert (ga[c].rho, ga[c].previous_loss) == (gb[c].rho, gb[c].previous_loss)
                g_a, g_b = ga[c].modulated_gradient, gb[c].modulated_gradient
                assert (g_a is None) == (g_b is None)  # rank: none while MG is too short
                assert g_a is None or all(torch.equal(g_a[k], g_b[k]) for k in SHAPES)


@pytest.mark.parametrize("assignment", ["own", "rank"])
def test_disk_storage_gives_the_same_rounds_as_memory(tmp_path, assignment):
    """float32 on disk: new global weights, ρ, ‖MG‖ and the guidance of every client are equal
    bit for bit to the in-memory path over rounds with partial participation (3 of 5)."""
    memory_server = _storage_server(None, memory_assignment=assignment)
    _, memory = _run_server(memory_server, range(1, 6), _w0())
    disk_server = _storage_server(tmp_path, "disk", memory_assignment=assignment)
    _, disk = _run_server(disk_server, range(1, 6), _w0())
    _assert_same_trace(memory, disk)
    assert isinstance(disk_server.store, DiskVectorStore)
    # RAM holds exactly the live vectors: no stored g̃, superseded versions dropped
    assert set(memory_server.store.vectors) == memory_server.live_names()
    if assignment == "own":  # each guidance names its client's current MG entry
        assert {g.gradient for g in memory_server.guidance.values()} <= set(
            memory_server.memory.values()
        )


def test_disk_storage_keeps_the_vectors_in_files_not_in_ram(tmp_path):
    server = _storage_server(tmp_path, "disk")
    w1, _ = _run_server(server, [1], _w0())
    assert len(server.live_names()) == 2 * 3 + 1  # round 1's 3 clients share one S_g
    _run_server(server, [2, 3], w1)
    folder = tmp_path / "server_state"
    seen = set(server.memory)
    # one MG and one S_c per client seen, one S_g per distinct set of rounds taken part in
    rounds_of = {c: tuple(t for t in range(1, 4) if c in server.sample_clients(t)) for c in seen}
    n_global = len(set(rounds_of.values()))
    live = server.live_names()
    assert len(live) == 2 * len(seen) + n_global
    assert {p.stem for p in folder.glob("*.bin")} >= live
    for name in live:  # every live vector is a file of exactly P float32 entries
        assert (folder / f"{name}.bin").stat().st_size == 4 * P
    assert server.state_bytes() == 4 * P * len(live)
    assert server.store.vectors == {}  # nothing parameter-sized kept in RAM
    state = server.state_dict()
    tensors = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(state)
    assert tensors == [] and state_names(state) == live  # the checkpoint only names the files
    # files only superseded vectors name go on collect_garbage (unless a kept checkpoint names them)
    stale = {p.stem for p in folder.glob("*.bin")} - live
    assert stale and server.collect_garbage(keep=[sorted(stale)[0]]) > 0
    assert {p.stem for p in folder.glob("*.bin")} == live | {sorted(stale)[0]}
    server.collect_garbage()
    assert {p.stem for p in folder.glob("*.bin")} == live
    # bfloat16 memory gradients: MG files half the size, ρ sums still float32
    half = _storage_server(tmp_path / "bf16", "disk", "bfloat16")
    _run_server(half, range(1, 2), _w0())
    for c, name in half.memory.items():
        assert (tmp_path / "bf16" / "server_state" / f"{name}.bin").stat().st_size == 2 * P
        assert (
            tmp_path / "bf16" / "server_state" / f"{half.tracker.client_sums[c]}.bin"
        ).stat().st_size == 4 * P


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_bfloat16_memory_gradients_round_mg_only(tmp_path, storage):
    """bf16 storage: g̃ = bf16(MG)·ε·ρ exactly (the stored entry, rounded to nearest, times the
    same scalar); memory and disk agree bit for bit; against float32 the run stays within bf16
    tolerance (relative 2^-8 on g̃; the rounds' w and ρ within 1e-3 / 1e-4)."""
    server = _storage_server(tmp_path, storage, "bfloat16")
    w = _w0()
    replies = _synthetic_replies(server, 1, w)
    _, log = server.server_round(1, w, replies)
    for c, reply in replies.items():
        scale = 0.5 * log["rho"][c]
        got = server.guidance_for(c).modulated_gradient
        for k in SHAPES:
            assert got[k].dtype == torch.float32
            assert torch.equal(got[k], reply.gradient[k].to(torch.bfloat16).float() * scale)
            assert torch.allclose(got[k], reply.gradient[k] * scale, rtol=2**-8, atol=0)
    _, bf16 = _run_server(_storage_server(tmp_path / "a", storage, "bfloat16"), range(1, 6), _w0())
    _, bf16_mem = _run_server(_storage_server(None, "memory", "bfloat16"), range(1, 6), _w0())
    _assert_same_trace(bf16, bf16_mem)
    _, fp32 = _run_server(_storage_server(None), range(1, 6), _w0())
    for (wa, rho_a, _, _), (wb, rho_b, _, _) in zip(bf16, fp32):
        assert all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-3) for k in wa)
        assert any(not torch.equal(wa[k], wb[k]) for k in wa)  # bf16 was really used
        assert rho_a == pytest.approx(rho_b, rel=1e-4)


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_server_state_saved_mid_run_resumes_to_the_same_result(tmp_path, storage):
    """Save after round 2, run round 3 and 'die'; a new server loads round 2's state, collects
    the dead run's files, and rounds 3-5 equal the uninterrupted run's."""
    _, reference = _run_server(_storage_server(tmp_path / "ref", storage), range(1, 6), _w0())
    first = _storage_server(tmp_path / "cut", storage)
    w2, _ = _run_server(first, range(1, 3), _w0())
    saved = tmp_path / "round2.pt"
    torch.save(first.state_dict(), saved)
    _run_server(first, [3], w2)  # writes round 3's files, then the process is killed
    again = _storage_server(tmp_path / "cut", storage)
    state = torch.load(saved, weights_only=True)
    again.load_state_dict(state)
    again.collect_garbage()
    if storage == "disk":
        files = {p.stem for p in (tmp_path / "cut" / "server_state").glob("*.bin")}
        assert files == state_names(state) == again.live_names()
    _, resumed = _run_server(again, range(3, 6), w2)
    _assert_same_trace(reference[2:], resumed)
    wrong = _storage_server(tmp_path / "x", "disk" if storage == "memory" else "memory")
    with pytest.raises(InputError, match="server_state"):
        wrong.load_state_dict(state)


def test_disk_state_with_a_missing_file_is_a_clear_error(tmp_path):
    server = _storage_server(tmp_path, "disk")
    _run_server(server, range(1, 3), _w0())
    state = server.state_dict()
    victim = sorted(server.live_names())[0]
    (tmp_path / "server_state" / f"{victim}.bin").unlink()
    with pytest.raises(InputError, match=victim):
        _storage_server(tmp_path, "disk").load_state_dict(state)
    with pytest.raises(InputError, match="fedsumm.server_state.storage"):
        ServerStateConfig.from_config({"storage": "mmap"})
    with pytest.raises(InputError, match="unknown keys"):
        ServerStateConfig.from_config({"storage": "disk", "path": "x"})
    with pytest.raises(InputError, match="needs a folder"):
        _storage_server(None, "disk")
