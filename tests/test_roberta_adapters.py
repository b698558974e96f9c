"""FedMCP global/private Houlsby adapters on a frozen RoBERTa (tiny offline config)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy

import pytest
import torch
from torch.nn import functional as F
from transformers import RobertaConfig, RobertaModel

from fedrepro.papers.fedmcp.model import (
    DualAdapterRoberta,
    HoulsbyInsertion,
    adapter_set_params,
    parameter_shares,
    roberta_base_config,
)

HIDDEN, LAYERS, R = 32, 2, 4


def tiny_config() -> RobertaConfig:
    return RobertaConfig(
        vocab_size=100,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        type_vocab_size=1,
        pad_token_id=1,
    )


def tiny_backbone(seed: int = 0) -> RobertaModel:
    torch.manual_seed(seed)
    return RobertaModel(tiny_config()).eval()


def randomise_adapters(model: DualAdapterRoberta, seed: int = 1) -> None:
    """Give W_up non-zero values so the adapters actually change the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.adapters.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def batch():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 100, (3, 9), generator=g)
    ids[:, 0] = 0
    mask = torch.ones_like(ids)
    ids[1, 6:], mask[1, 6:] = 1, 0  # padded row
    ids[2, 4:], mask[2, 4:] = 1, 0
    return ids, mask


@pytest.fixture
def model() -> DualAdapterRoberta:
    torch.manual_seed(3)
    m = DualAdapterRoberta(tiny_backbone(), num_labels=2, bottleneck=R)
    randomise_adapters(m)
    return m


def test_combination_equation_on_one_wrapped_sublayer(model):
    """h + ½ a_g(h) + ½ a_p(h) before LayerNorm(h + input), on layer 1's FFN output sublayer."""
    sub = model.backbone.encoder.layer[1].output
    assert isinstance(sub.dropout, HoulsbyInsertion)
    x = torch.randn(2, 5, 64)  # intermediate activations
    inp = torch.randn(2, 5, HIDDEN)
    g = model.adapters["global"].layers[1].ffn
    p = model.adapters["private"].layers[1].ffn

    def a(ad, h):
        return F.gelu(h @ ad.down.weight.T + ad.down.bias) @ ad.up.weight.T + ad.up.bias

    h = x @ sub.dense.weight.T + sub.dense.bias
    ln = sub.LayerNorm
    expected = {
        "both": h + 0.5 * a(g, h) + 0.5 * a(p, h),
        "global": h + a(g, h),
        "private": h + a(p, h),
        "none": h,
    }
    with torch.no_grad():
        for mode, hh in expected.items():
            model.router.set_mode(mode)
            want = F.layer_norm(hh + inp, (HIDDEN,), ln.weight, ln.bias, ln.eps)
            torch.testing.assert_close(sub(x, inp), want, rtol=1e-5, atol=1e-5)
            plain = F.layer_norm(h + inp, (HIDDEN,), ln.weight, ln.bias, ln.eps)
            assert torch.allclose(sub(x, inp), plain) == (mode == "none")
    model.router.set_mode("both")
    # the attention-output sublayer is wrapped as well, with its own adapters
    att = model.backbone.encoder.layer[0].attention.output.dropout
    assert isinstance(att, HoulsbyInsertion) and (att.layer, att.position) == (0, "attention")


def test_every_layer_wrapped_and_backbone_keys_unchanged():
    plain_keys = set(tiny_backbone().state_dict())
    m = DualAdapterRoberta(tiny_backbone(), num_labels=3)
    assert set(m.backbone.state_dict()) == plain_keys
    n_ins = sum(isinstance(mod, HoulsbyInsertion) for mod in m.backbone.modules())
    assert n_ins == 2 * LAYERS
    with pytest.raises(ValueError):
        DualAdapterRoberta(m.backbone, num_labels=3)  # double wrapping refused


def test_zero_init_up_projection_equals_plain_backbone():
    ids, mask = batch()
    plain = tiny_backbone()
    with torch.no_grad():
        ref = plain(input_ids=ids, attention_mask=mask).last_hidden_state
    m = DualAdapterRoberta(tiny_backbone(), num_labels=2)  # fresh: W_up = 0
    for ad in m.adapters.modules():
        if hasattr(ad, "up"):
            assert not ad.up.weight.any() and not ad.up.bias.any()
            assert ad.down.weight.abs().sum() > 0
    hooked = {}
    h = m.backbone.register_forward_hook(
        lambda _m, _a, out: hooked.__setitem__("h", out.last_hidden_state)
    )
    with torch.no_grad():
        for mode in ("both", "global", "private", "none"):
            m(ids, mask, mode=mode)
            torch.testing.assert_close(hooked["h"], ref, rtol=0, atol=1e-6)
    h.remove()


def test_trainable_params_and_backbone_eval(model):
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(n.startswith(("adapters.", "g1.", "g2.")) for n in names)
    assert all(not p.requires_grad for p in model.backbone.parameters())
    n_trainable = sum(p.numel() for p in model.trainable_parameters())
    assert n_trainable == 2 * adapter_set_params(HIDDEN, LAYERS, R) + 2 * (HIDDEN * 2 + 2)
    model.train()
    assert model.training and model.adapters.training and model.g1.training
    assert not model.backbone.training
    assert all(not mod.training for mod in model.backbone.modules())


def test_backward_reaches_adapters_and_heads_only(model):
    ids, mask = batch()
    model.train()
    y = torch.tensor([0, 1, 1])
    logits1, _ = model(ids, mask, mode="both")
    logits2, _ = model(ids, mask, mode="global")
    (F.cross_entropy(logits1, y) + F.cross_entropy(logits2, y)).backward()
    assert all(p.grad is None for p in model.backbone.parameters())
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_global_mode_ignores_private_adapter(model):
    ids, mask = batch()
    with torch.no_grad():
        logits_g, pooled_g = model(ids, mask, mode="global")
        logits_b, pooled_b = model(ids, mask, mode="both")
        _, pooled_p = model(ids, mask, mode="private")
        for p in model.adapters["private"].parameters():
            p.add_(torch.randn_like(p))
        logits_g2, pooled_g2 = model(ids, mask, mode="global")
        _, pooled_b2 = model(ids, mask, mode="both")
        _, pooled_p2 = model(ids, mask, mode="private")
    torch.testing.assert_close(pooled_g2, pooled_g, rtol=0, atol=0)
    torch.testing.assert_close(logits_g2, logits_g, rtol=0, atol=0)
    assert not torch.allclose(pooled_b2, pooled_b)  # the private adapter does act in "both"...
    assert not torch.allclose(pooled_p2, pooled_p)  # ...and in "private"
    assert not torch.allclose(pooled_g, pooled_b)
    assert model.router.mode == "both"  # forward restores the default mode


def test_heads_and_modes(model):
    ids, mask = batch()
    with torch.no_grad():
        logits_b, pooled_b = model(ids, mask, mode="both")
        logits_g, pooled_g = model(ids, mask, mode="global")
        logits_p, _ = model(ids, mask, mode="private")
        logits_n, _ = model(ids, mask, mode="none")
    torch.testing.assert_close(logits_b, model.g1(pooled_b))
    torch.testing.assert_close(logits_g, model.g2(pooled_g))
    assert logits_b.shape == (3, 2) and logits_p is None and logits_n is None
    with pytest.raises(ValueError):
        model(ids, mask, mode="local")


def test_global_adapter_state_is_exactly_the_global_set(model):
    state = model.global_adapter_state()
    full = model.state_dict()
    expected = {k[len("adapters.global."):] for k in full if k.startswith("adapters.global.")}
    assert set(state) == expected
    assert len(state) == LAYERS * 2 * 4  # 2 positions × (down, up) × (weight, bias)
    for k, v in state.items():
        assert torch.equal(v, full["adapters.global." + k])
        assert "private" not in k and not k.startswith(("g1", "g2", "backbone"))
    assert sum(v.numel() for v in state.values()) == adapter_set_params(HIDDEN, LAYERS, R)
    # round trip into another client; private adapters and heads untouched
    other = DualAdapterRoberta(tiny_backbone(), num_labels=2, bottleneck=R)
    before_private = copy.deepcopy(other.adapters["private"].state_dict())
    other.load_global_adapter_state(state)
    for k, v in other.global_adapter_state().items():
        assert torch.equal(v, state[k])
    for k, v in other.adapters["private"].state_dict().items():
        assert torch.equal(v, before_private[k])
    # a clone, not a view
    state[next(iter(state))].add_(1.0)
    first = next(iter(state))
    assert not torch.equal(state[first], model.global_adapter_state()[first])
    bad = dict(state)
    bad.pop(next(iter(bad)))
    with pytest.raises(ValueError):
        other.load_global_adapter_state(bad)
    with pytest.raises(ValueError):
        other.load_global_adapter_state({**state, "g1.weight": torch.zeros(2, HIDDEN)})


def test_pooling_mean_vs_cls_and_padding(model):
    ids, mask = batch()
    with torch.no_grad():
        _, mean = model(ids, mask, mode="both", pooling="mean")
        _, cls = model(ids, mask, mode="both", pooling="cls")
        assert not torch.allclose(mean, cls)
        # manual masked mean of the last hidden state
        model.router.set_mode("both")
        hidden = model.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(cls, hidden[:, 0])
        torch.testing.assert_close(mean[2], hidden[2, :4].mean(0))
        # changing padded tokens (ids) does not change the mean-pooled representation
        ids2 = ids.clone()
        ids2[1, 6:] = 50
        ids2[2, 4:] = 77
        _, mean2 = model(ids2, mask, mode="both", pooling="mean")
        torch.testing.assert_close(mean2, mean, rtol=1e-5, atol=1e-6)
        # and the padded row equals the same sentence without padding
        _, alone = model(ids[2:3, :4], mask[2:3, :4], mode="both", pooling="mean")
        torch.testing.assert_close(alone[0], mean[2], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        model(ids, mask, pooling="max")


def test_parameter_shares_roberta_base():
    s = parameter_shares(roberta_base_config())
    print(s)
    assert s["backbone_params"] == 124_645_632  # released roberta-base RobertaModel
    assert s["adapter_set_params"] == 12 * 2 * (2 * 768 * 16 + 16 + 768) == 608_640
    assert s["communicated_params"] * 2 == s["adapter_params"]
    assert s["trainable_params"] == s["adapter_params"] + 2 * (768 * 2 + 2) == 1_220_356
    assert s["full_finetune_params"] == s["backbone_params"] + 1_538
    # paper: 1.16 % trainable, 0.58 % communicated; exact counts are ~0.84× that
    assert 0.009 < s["trainable_share"] < 0.0125
    assert 0.0045 < s["communicated_share"] < 0.0062
    assert s["trainable_share"] == pytest.approx(0.0097905, abs=1e-7)
    assert s["communicated_share"] == pytest.approx(0.0048829, abs=1e-7)


def test_parameter_shares_matches_instantiated_tiny_model():
    cfg = tiny_config()
    s = parameter_shares(cfg, bottleneck=R, num_labels=2)
    m = DualAdapterRoberta(RobertaModel(cfg), num_labels=2, bottleneck=R)
    assert s["backbone_params"] == sum(p.numel() for p in m.backbone.parameters())
    assert s["trainable_params"] == sum(p.numel() for p in m.trainable_parameters())
    assert s["communicated_params"] == sum(v.numel() for v in m.global_adapter_state().values())
