"""FedMCP's client models are built with the configured sizes (issue 24's mutation survivors of
``fedmcp/methods.py``: the step tests compare a model with its own replay, so they cannot see a
wrong bottleneck or LoRA setting).  Paper: adapters of bottleneck m, FedLR = LoRA on query/value."""

from __future__ import annotations

import pytest
from transformers import RobertaConfig, RobertaModel

from fedrepro.papers.fedmcp.methods import AdapterMethodModel, build_model, get_method


def _backbone() -> RobertaModel:
    cfg = RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=24, type_vocab_size=1, pad_token_id=1)
    return RobertaModel(cfg)


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("bottleneck", [3, 16])
def test_the_adapter_bottleneck_is_the_configured_one(bottleneck):
    cfg = {"bottleneck": bottleneck} if bottleneck != 16 else {}  # 16: the documented default
    got = build_model("FedMCP", _backbone(), num_labels=3, cfg=cfg)
    want = AdapterMethodModel(get_method("FedMCP"), _backbone(), 3, bottleneck)
    assert _trainable(got) == _trainable(want)
    assert {k: tuple(v.shape) for k, v in got.shared_state().items()} == {
        k: tuple(v.shape) for k, v in want.shared_state().items()}
    other = AdapterMethodModel(get_method("FedMCP"), _backbone(), 3, bottleneck + 1)
    assert _trainable(got) != _trainable(other)


@pytest.mark.parametrize("cfg,want", [
    ({"lora_r": 2, "lora_alpha": 6, "lora_dropout": 0.25}, (2, 6.0, 0.25)),
    ({}, (16, 32.0, 0.0)),  # the documented defaults
])
def test_fedlr_lora_has_the_configured_rank_alpha_dropout_on_query_and_value(cfg, want):
    model = build_model("FedLR", _backbone(), num_labels=3, cfg=cfg)
    peft_cfg = model.encoder.peft_config["default"]
    assert (peft_cfg.r, float(peft_cfg.lora_alpha), float(peft_cfg.lora_dropout)) == want
    assert set(peft_cfg.target_modules) == {"query", "value"} and peft_cfg.bias == "none"
    lora = {k for k in model.shared_state()}
    assert lora and all("lora_" in k for k in lora)
    assert {k.split(".")[-4] for k in lora} == {"query", "value"}
    # the backbone is frozen: only LoRA tensors and the head train
    for name, p in model.encoder.named_parameters():
        assert p.requires_grad == ("lora_" in name), name
    r = want[0]
    a = [v for k, v in model.shared_state().items() if "lora_A" in k][0]
    assert a.shape[0] == r
