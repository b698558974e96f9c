"""The adapter equation (eq. 5), the selective KD loss (eq. 6–8) and the adapter summarizer."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import BartConfig, BartForConditionalGeneration, LEDConfig, LEDForConditionalGeneration

from fedrepro.papers.adafedseleckd.kd import selective_kd_loss, token_entropy
from fedrepro.papers.adafedseleckd.adapters import BottleneckAdapter
from fedrepro.papers.adafedseleckd.model import AdapterSummarizer


def test_bottleneck_adapter_equation_5():
    torch.manual_seed(0)
    adapter = BottleneckAdapter(d_model=6, bottleneck=4)
    with torch.no_grad():
        for p in adapter.parameters():
            p.copy_(torch.randn_like(p))
    y = torch.randn(2, 3, 6)
    w_down, b_down = adapter.down.weight.T, adapter.down.bias
    w_up, b_up = adapter.up.weight.T, adapter.up.bias
    z = y + torch.relu(y @ w_down + b_down) @ w_up + b_up
    mu = z.mean(-1, keepdim=True)
    var = z.var(-1, unbiased=False, keepdim=True)
    expected = (z - mu) / torch.sqrt(var + 1e-5) * adapter.layer_norm.weight + adapter.layer_norm.bias
    assert torch.allclose(adapter(y), expected, atol=1e-5)
    assert adapter.down.weight.shape == (4, 6) and adapter.up.weight.shape == (6, 4)


def test_adapter_initialisation_is_layernorm_of_input():
    adapter = BottleneckAdapter(8, 16)
    y = torch.randn(3, 8)
    assert torch.allclose(adapter(y), F.layer_norm(y, (8,)), atol=1e-6)


def _hand_kd(student, teacher, labels, lam, tau):
    """Token by token, straight from eq. 7 and eq. 8 with Python floats."""
    losses, used = [], []
    for s, t, y in zip(student.tolist(), teacher.tolist(), labels.tolist()):
        if y == -100:
            used.append(False)
            continue
        zs = sum(math.exp(v) for v in s)
        zt = sum(math.exp(v) for v in t)
        q_l = [math.exp(v) / zs for v in s]
        q_g = [math.exp(v) / zt for v in t]
        entropy = -sum(p * math.log(p) for p in q_g)
        ce = -math.log(q_l[y])
        kl = sum(g * (math.log(g) - math.log(l)) for g, l in zip(q_g, q_l))
        if entropy < tau:
            losses.append((1 - lam) * ce + lam * kl)
            used.append(True)
        else:
            losses.append(ce)
            used.append(False)
    return sum(losses) / len(losses), used


def test_selective_kd_loss_matches_hand_computation_on_both_sides_of_tau():
    # vocabulary of 4: a confident teacher row (low entropy) and a flat one (H = ln 4 ≈ 1.386)
    teacher = torch.tensor(
        [[8.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 5.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    )
    student = torch.tensor(
        [[1.0, 2.0, 0.5, -1.0], [0.3, -0.2, 0.1, 0.0], [2.0, 1.0, 0.0, 0.5], [0.0, 0.0, 3.0, 0.0]]
    )
    labels = torch.tensor([0, 2, 1, -100])
    tau = 1.0  # rows 0 and 2 have H < 1, row 1 has H = ln 4 > 1, row 3 is padding
    loss, kd_mask = selective_kd_loss(student, teacher, labels, lam=0.2, tau=tau)
    expected, used = _hand_kd(student, teacher, labels, 0.2, tau)
    assert kd_mask.tolist() == [True, False, True, False]
    assert used == [True, False, True, False]
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    ent = token_entropy(teacher)
    assert ent[1].item() == pytest.approx(math.log(4), rel=1e-6)


def test_kd_with_infinite_tau_is_eq6_and_lambda_zero_is_ce():
    torch.manual_seed(1)
    s, t = torch.randn(2, 5, 11), torch.randn(2, 5, 11)
    y = torch.randint(0, 11, (2, 5))
    y[1, 3:] = -100
    loss_all, mask = selective_kd_loss(s, t, y, lam=0.3, tau=math.inf)
    assert mask.sum().item() == (y != -100).sum().item()
    ce = F.cross_entropy(s.reshape(-1, 11), y.reshape(-1), ignore_index=-100, reduction="none")
    kl = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="none").sum(-1)
    valid = (y != -100).reshape(-1)
    manual = ((0.7 * ce + 0.3 * kl.reshape(-1))[valid]).mean()
    assert loss_all.item() == pytest.approx(manual.item(), rel=1e-5)
    loss_ce, _ = selective_kd_loss(s, t, y, lam=0.0, tau=math.inf)
    assert loss_ce.item() == pytest.approx(ce[valid].mean().item(), rel=1e-5)


def test_kd_gradient_flows_to_student_only():
    s = torch.randn(3, 7, requires_grad=True)
    t = torch.randn(3, 7, requires_grad=True)
    loss, _ = selective_kd_loss(s, t, torch.tensor([1, 2, 3]), lam=0.5, tau=100.0)
    loss.backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    assert t.grad is None


def _tiny(cls_name):
    if cls_name == "bart":
        cfg = BartConfig(vocab_size=300, d_model=32, encoder_layers=2, decoder_layers=3,
                         encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                         decoder_ffn_dim=64, max_position_embeddings=128)
        return BartForConditionalGeneration(cfg)
    cfg = LEDConfig(vocab_size=300, d_model=32, encoder_layers=2, decoder_layers=3,
                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                    decoder_ffn_dim=64, max_encoder_position_embeddings=128,
                    max_decoder_position_embeddings=64, attention_window=[8, 8])
    return LEDForConditionalGeneration(cfg)


@pytest.mark.parametrize("kind", ["bart", "led"])
def test_only_local_adapters_are_trainable_and_paths_equal_full_forward(kind):
    torch.manual_seed(0)
    backbone = _tiny(kind)
    model = AdapterSummarizer(backbone, adapter_top_k=2, bottleneck=16, roles=("global", "local"))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("stacks.local.") for n in trainable)
    n_local = sum(p.numel() for p in model.stacks["local"].parameters())
    # 2 adapters × (down 32×16+16, up 16×32+32, LayerNorm 2×32)
    assert n_local == 2 * (32 * 16 + 16 + 16 * 32 + 32 + 64)
    with torch.no_grad():
        for p in model.stacks["local"].parameters():
            p.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(5, 300, (2, 24))
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0
    dec = torch.randint(5, 300, (2, 7))
    student, teacher = model.path_logits(ids, mask, dec, student="local", teacher="global")
    kw = model._encoder_kwargs(ids, mask)
    with torch.no_grad():
        model.router.active = "local"
        ref_local = backbone(**kw, decoder_input_ids=dec).logits
        model.router.active = "global"
        ref_global = backbone(**kw, decoder_input_ids=dec).logits
    assert torch.allclose(student, ref_local, atol=1e-5)
    assert torch.allclose(teacher, ref_global, atol=1e-5)
    assert student.requires_grad and not teacher.requires_grad
    loss, _ = selective_kd_loss(student, teacher, dec, 0.2, 5.0)
    loss.backward()
    assert all(p.grad is None for n, p in model.named_parameters() if not n.startswith("stacks.local."))
    assert all(p.grad is not None for p in model.stacks["local"].parameters())
    model.train()
    assert not backbone.training  # frozen backbone stays in eval mode


def test_fused_kd_gradient_equals_autograd_of_the_plain_formula():
    torch.manual_seed(2)
    s = torch.randn(3, 6, 50, requires_grad=True)
    t = torch.randn(3, 6, 50) * torch.tensor([0.1, 3.0, 0.2, 4.0, 0.1, 2.0]).view(1, 6, 1)
    y = torch.randint(0, 50, (3, 6))
    y[0, 4:] = -100
    lam, tau = 0.2, 3.5
    loss, mask = selective_kd_loss(s, t, y, lam, tau)
    loss.backward()
    fused_grad = s.grad.clone()
    s2 = s.detach().clone().requires_grad_(True)
    log_q_l = F.log_softmax(s2, -1)
    log_q_g = F.log_softmax(t, -1)
    ent = -(log_q_g.exp() * log_q_g).sum(-1)
    valid = y != -100
    ce = -log_q_l.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    kl = (log_q_g.exp() * (log_q_g - log_q_l)).sum(-1)
    use = valid & (ent < tau)
    plain = torch.where(use, (1 - lam) * ce + lam * kl, ce)[valid].mean()
    plain.backward()
    assert 0 < use.sum() < valid.sum()  # tokens on both sides of tau
    assert torch.equal(mask, use)
    assert loss.item() == pytest.approx(plain.item(), rel=1e-5)
    assert torch.allclose(fused_grad, s2.grad, atol=1e-6)


def test_selective_kd_chunk_size_changes_no_bit(monkeypatch):
    """The chunked eq. 8 kernel gives the same bits whatever the rows per chunk (the accelerator
    uses far larger chunks than the CPU): loss, gradient and KD mask."""
    import fedrepro.papers.adafedseleckd.kd as kd

    g = torch.Generator().manual_seed(3)
    s = torch.randn(3, 7, 50, generator=g)
    t = torch.randn(3, 7, 50, generator=g) * 3
    y = torch.randint(0, 50, (3, 7), generator=g)
    y[1, 4:] = -100
    results = []
    for elements in (50, 50 * 4, 1 << 26):  # 1 row, 4 rows, everything in one chunk
        monkeypatch.setattr(kd, "_CHUNK_ELEMENTS", elements)
        student = s.clone().requires_grad_(True)
        loss, mask = selective_kd_loss(student, t, y, lam=0.2, tau=3.5)
        loss.backward()
        results.append((loss.detach().numpy().tobytes(), student.grad.numpy().tobytes(),
                        mask.numpy().tobytes()))
        assert results[-1] == results[0], elements  # at once: a wrong chunk loop fails here
    assert mask.any() and not mask.all()
    assert results[0] == results[1] == results[2]
