"""Backbone registry: demo-scale tiny models and the paper-scale hub path share one loader."""

import time

import pytest
import torch

import helpers
from fedrepro.io import InputError
from fedrepro.models.backbones import (
    BACKBONES,
    download_snapshot,
    get_spec,
    load_backbone,
    prepare_backbone,
)
from fedrepro.models.shapes import (
    ARCHITECTURES,
    SHAPE_NOTE,
    architecture,
    build_shape_model,
    check_tokenizer,
    shape_config,
)
from fedrepro.grid import backbone_settings


def test_registry_holds_the_paper_backbones_and_adapter_settings():
    assert get_spec("bart-large").hub_id == "facebook/bart-large"
    assert (get_spec("bart-large").adapter_top_k, get_spec("bart-large").bottleneck) == (6, 2048)
    assert (get_spec("bart-base").adapter_top_k, get_spec("bart-base").bottleneck) == (3, 1536)
    assert get_spec("led-large").model_class == "LEDForConditionalGeneration"
    with pytest.raises(InputError, match="unknown backbone 'bart-huge'"):
        get_spec("bart-huge")
    assert set(BACKBONES) >= {"bart-large", "bart-base", "led-large", "roberta-base"}
    rob = get_spec("roberta-base")
    assert (rob.hub_id, rob.model_class, rob.bottleneck) == ("FacebookAI/roberta-base", "RobertaForMaskedLM", 16)


def test_config_overrides_registry_defaults():
    cfg = {"backbones": {"bart-base": {"kind": "hub", "revision": "abc1234"}}}
    s = backbone_settings(cfg, "bart-base")
    assert s["hub_id"] == "facebook/bart-base" and s["revision"] == "abc1234"
    assert s["adapter_top_k"] == 3 and s["bottleneck"] == 1536


@pytest.mark.parametrize("name,cls", [("bart-large", "BartForConditionalGeneration"),
                                      ("led-large", "LEDForConditionalGeneration")])
def test_tiny_backbone_is_the_paper_class_and_loads_with_from_pretrained(tmp_path, name, cls):
    path = helpers.make_backbone(tmp_path, name=name, warmup_steps=2)
    tokenizer, model = load_backbone(path)
    assert type(model).__name__ == cls
    ids = tokenizer("the remote button is late .")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True).strip() == "the remote button is late ."
    # the same folder loads twice to the same weights (deterministic build)
    _, again = load_backbone(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_hub_backbone_offline_fails_fast_naming_the_hub_id_and_config_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = backbone_settings({"backbones": {"bart-base": {"kind": "hub"}}}, "bart-base")
    t0 = time.time()
    with pytest.raises(InputError) as err:
        prepare_backbone(settings, [], tmp_path / "bb")
    assert time.time() - t0 < 20
    msg = str(err.value)
    assert "facebook/bart-base" in msg and "backbones.bart-base.local_dir" in msg
    assert not (tmp_path / "bb").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no partial folder left behind


def test_download_snapshot_offline_names_hub_id_revision_and_config_key(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(InputError) as err:
        download_snapshot("org/model", "abc123", tmp_path / "snap", "some.section.local_dir")
    msg = str(err.value)
    assert "org/model" in msg and "abc123" in msg and "some.section.local_dir" in msg
    assert "HF_HUB_OFFLINE" in msg
    assert list(tmp_path.iterdir()) == []


def test_download_snapshot_unreachable_hub_fails_fast(tmp_path, monkeypatch):
    import fedrepro.data.download
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    seen = []

    def unreachable(url, timeout):
        seen.append((url, timeout))
        raise TimeoutError(f"no connection within {timeout:g} s")

    monkeypatch.setattr(fedrepro.data.download, "check_reachable", unreachable)
    t0 = time.monotonic()
    with pytest.raises(InputError) as err:
        download_snapshot("org/model", "abc123", tmp_path / "snap", "k.local_dir", timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert seen == [(constants.ENDPOINT, 0.5)]
    msg = str(err.value)
    assert "org/model" in msg and "abc123" in msg and "k.local_dir" in msg and "TimeoutError" in msg
    assert list(tmp_path.iterdir()) == []


def test_local_dir_backbone_links_a_saved_model(tmp_path):
    saved = helpers.make_backbone(tmp_path / "src")
    settings = backbone_settings({"backbones": {"bart-large": {"kind": "hub", "local_dir": saved}}}, "bart-large")
    out = prepare_backbone(settings, [], tmp_path / "linked")
    _, model = load_backbone(out)
    assert type(model).__name__ == "BartForConditionalGeneration"
    bad = dict(settings, local_dir=str(tmp_path))
    with pytest.raises(InputError, match="holds no config.json"):
        prepare_backbone(bad, [], tmp_path / "x")


# -- kind: shape -------------------------------------------------------------------------------

# The parameter count of each checkpoint's class (tied weights once), asserted three ways: the
# registry's figure, a meta-device build of the description, and the arithmetic below.  Where a
# published figure exists it is the same number: bart-large 406,291,456 and bart-base 139,420,416
# (the counts HF's BART docs/model cards round to 406M/139M), roberta-base RobertaForMaskedLM
# 124,697,433, bert-base-uncased BertModel 109,482,240 with pooler ("110M", Devlin et al.) and
# 108,891,648 without, led-large-16384 459,801,600 ("460M").  fnlp/bart-base-chinese v1
# 116,256,768 and long-t5-tglobal-base 222,913,152 (LM head tied, as transformers 5 builds it)
# have the arithmetic only.
KNOWN_PARAMETERS = {
    "facebook/bart-large": 406_291_456,
    "facebook/bart-base": 139_420_416,
    "allenai/led-large-16384": 459_801_600,
    "FacebookAI/roberta-base": 124_697_433,
    "google-bert/bert-base-uncased": 109_482_240,
    "fnlp/bart-base-chinese": 116_256_768,
    "google/long-t5-tglobal-base": 222_913_152,
}


def arithmetic_parameters(cfg: dict, model_class: str) -> int:
    """Parameters counted by hand from the config (independent of transformers' code)."""

    def lin(i, o):
        return i * o + o

    def ln(d):
        return 2 * d

    if cfg["model_type"] == "longt5":  # no biases; RMS norms (one weight vector each)
        d, inner, ff, buckets = cfg["d_model"], cfg["num_heads"] * cfg["d_kv"], cfg["d_ff"], (
            cfg["relative_attention_num_buckets"] * cfg["num_heads"])
        attn = 4 * d * inner
        ffn = (3 if cfg["feed_forward_proj"].startswith("gated") else 2) * d * ff
        # transient-global self-attention adds a norm of the global aggregates
        enc_block = attn + d + d + ffn + d
        dec_block = attn + d + attn + d + ffn + d
        # block 0 of the encoder: local and global relative biases; of the decoder: one
        return (cfg["vocab_size"] * d + cfg["num_layers"] * enc_block + 2 * buckets + d
                + cfg["num_decoder_layers"] * dec_block + buckets + d)
    if cfg["model_type"] in ("bart", "led"):
        d, v = cfg["d_model"], cfg["vocab_size"]
        if cfg["model_type"] == "bart":  # learned positions with an offset of 2
            pos = 2 * (cfg["max_position_embeddings"] + 2) * d
            enc_attn = 4 * lin(d, d)  # q, k, v, out
        else:  # LED: no offset; encoder self-attention adds global q, k, v
            pos = (cfg["max_encoder_position_embeddings"] + cfg["max_decoder_position_embeddings"]) * d
            enc_attn = 7 * lin(d, d)
        ffn = lin(d, cfg["encoder_ffn_dim"]) + lin(cfg["encoder_ffn_dim"], d)
        enc_layer = enc_attn + ln(d) + ffn + ln(d)
        dec_layer = 4 * lin(d, d) + ln(d) + 4 * lin(d, d) + ln(d) + ffn + ln(d)
        # shared embedding (LM head tied to it; final_logits_bias is a buffer), embedding norms
        return (v * d + pos + 2 * ln(d) + cfg["encoder_layers"] * enc_layer
                + cfg["decoder_layers"] * dec_layer)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    emb = (v + cfg["max_position_embeddings"] + cfg["type_vocab_size"]) * h + ln(h)
    layer = 4 * lin(h, h) + ln(h) + lin(h, i) + lin(i, h) + ln(h)
    encoder = emb + cfg["num_hidden_layers"] * layer
    if model_class == "BertModel":
        return encoder + lin(h, h)  # + pooler
    assert model_class == "RobertaForMaskedLM"
    return encoder + lin(h, h) + ln(h) + v  # LM head: dense, norm, bias (decoder tied)


@pytest.mark.parametrize("hub_id", sorted(KNOWN_PARAMETERS))
def test_shape_description_has_the_checkpoints_exact_parameter_count(hub_id):
    arch = architecture(hub_id)
    with torch.device("meta"):
        model = build_shape_model(arch)
    n = sum(p.numel() for p in model.parameters())
    assert n == arch.parameters == KNOWN_PARAMETERS[hub_id]
    assert arithmetic_parameters(dict(arch.config), arch.model_class) == n
    assert type(model).__name__ == arch.model_class
    assert all(p.device.type == "meta" for p in model.parameters())


def test_shape_descriptions_cover_every_paper_backbone_with_true_dimensions():
    assert {s.hub_id for s in BACKBONES.values()} <= set(ARCHITECTURES)
    assert set(KNOWN_PARAMETERS) == set(ARCHITECTURES)
    for spec in BACKBONES.values():
        assert architecture(spec.hub_id).model_class == spec.model_class
    large = shape_config(architecture("facebook/bart-large"))
    assert (large.d_model, large.encoder_layers, large.decoder_layers, large.encoder_attention_heads,
            large.encoder_ffn_dim, large.vocab_size, large.max_position_embeddings) == (
        1024, 12, 12, 16, 4096, 50265, 1024)
    led = shape_config(architecture("allenai/led-large-16384"))
    assert (led.max_encoder_position_embeddings, led.max_decoder_position_embeddings) == (16384, 1024)
    assert list(led.attention_window) == [1024] * 12
    rob = shape_config(architecture("FacebookAI/roberta-base"))
    assert (rob.max_position_embeddings, rob.type_vocab_size, rob.pad_token_id) == (514, 1, 1)
    # BERTSUM loads the encoder without pooler: the other well-known bert-base figure
    from transformers import BertModel

    with torch.device("meta"):
        enc = BertModel(shape_config(architecture("google-bert/bert-base-uncased")),
                        add_pooling_layer=False)
    assert sum(p.numel() for p in enc.parameters()) == 108_891_648
    with pytest.raises(InputError, match="architecture description of 'org/unknown'"):
        architecture("org/unknown")


def test_shape_kind_in_settings_schema_and_workflow_inputs():
    from pathlib import Path

    import yaml

    from fedrepro.config import validate_config
    from fedrepro.grid import backbone_train_files

    root = Path(__file__).resolve().parents[1]
    paper = yaml.safe_load((root / "config" / "paper.yaml").read_text())
    for name in ("bart-large", "bert-base"):
        paper["backbones"][name]["kind"] = "shape"
    paper["fedsumm"]["backbone"]["kind"] = "shape"
    validate_config(paper, root / "config" / "schema.yaml")

    cfg = {"backbones": {"bart-large": {"kind": "shape"}, "roberta-base": {"kind": "shape"}}}
    assert backbone_settings(cfg, "bart-large")["kind"] == "shape"
    assert backbone_train_files(cfg, "bart-large") == ["results/data/qmsum/records.jsonl"]
    assert backbone_train_files(cfg, "roberta-base") == ["results/data/glue/records.jsonl"]
    assert backbone_train_files({"backbones": {"bart-large": {"kind": "hub"}}}, "bart-large") == []
    with pytest.raises(InputError, match="'hub', 'tiny' or 'shape'"):
        backbone_settings({"backbones": {"bart-large": {"kind": "huge"}}}, "bart-large")


def test_shape_tokenizer_special_ids_are_checked_against_the_real_config(tmp_path):
    from fedrepro.models.backbones import train_tokenizer

    tok = train_tokenizer(["the remote is late .", "we discussed the budget ."], 300, tmp_path)
    for hub_id in ("facebook/bart-large", "allenai/led-large-16384", "FacebookAI/roberta-base"):
        check_tokenizer(architecture(hub_id), tok)  # <pad> 1, <s> 0, </s> 2 = decoder start
    with pytest.raises(RuntimeError, match="pad id 1 != config.json pad_token_id 0"):
        check_tokenizer(architecture("google-bert/bert-base-uncased"), tok)


def test_shape_backbone_real_build_loads_and_runs_a_forward_pass(tmp_path, caplog):
    """roberta-base (the smallest of the shared registry) at true size through prepare_backbone,
    loaded with FedMCP's loader; ~10 s, ~1 GB."""
    import json
    import logging

    from fedrepro.models.backbones import load_encoder

    settings = backbone_settings({"backbones": {"roberta-base": {"kind": "shape"}}}, "roberta-base")
    texts = ["the remote control is late .", "we discussed the budget of the project ."] * 10
    with caplog.at_level(logging.WARNING, logger="fedrepro.models.shapes"):
        out = prepare_backbone(settings, texts, tmp_path / "roberta-base", seed=1)
    assert any("FacebookAI/roberta-base not fetched" in r.getMessage()
               and "true dimensions with random weights" in r.getMessage() for r in caplog.records)
    meta = json.loads((out / "fedrepro_backbone.json").read_text())
    assert meta["kind"] == "shape" and meta["hub_id"] == "FacebookAI/roberta-base"
    assert meta["weights"] == SHAPE_NOTE and meta["parameters"] == 124_697_433
    assert (out / "model.safetensors").is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["RobertaForMaskedLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (768, 12, 50265)

    encoder = load_encoder(out)
    assert sum(p.numel() for p in encoder.parameters()) == 124_645_632  # + fresh pooler
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) <= 50265
    batch = tok(["the remote is late .", "the budget ."], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder(**batch).last_hidden_state
    assert hidden.shape == (2, batch["input_ids"].shape[1], 768)
    assert torch.isfinite(hidden).all()


def test_load_backbone_loads_a_hub_folder_naming_bare_bart_model_as_the_generation_class(tmp_path):
    """facebook/bart-{base,large}'s config.json names ``BartModel`` (so does a shape folder)."""
    import json

    path = helpers.make_backbone(tmp_path, name="bart-large")
    cfg_path = tmp_path / "backbone" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = ["BartModel"]
    cfg_path.write_text(json.dumps(cfg))
    _, model = load_backbone(path)
    assert type(model).__name__ == "BartForConditionalGeneration"


def _projection_inputs(model) -> list[bool]:
    """Record, per encoder self-attention projection call, whether its input was contiguous
    (a hook registered after the project's, so it sees what the Linear gets)."""
    seen: list[bool] = []
    for module in model.modules():
        if type(module).__name__ == "LEDEncoderSelfAttention":
            for child in module.children():
                if isinstance(child, torch.nn.Linear):
                    child.register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous()))
    return seen


def test_led_encoder_projections_get_contiguous_inputs(tmp_path):
    """LED's encoder attention projects hidden_states.transpose(0, 1): for a frozen weight PyTorch
    broadcasts the weight per position (bmm), which on the CPU in bfloat16 copies it 2,048 times
    per pass (issue 23: the rehearsal's LED cell took over an hour).  load_backbone hooks every
    such projection so its input is contiguous (one mm); the encoder's output is unchanged."""
    from fedrepro.models.backbones import SEQUENCE_FIRST_ATTENTION, contiguous_sequence_first_inputs

    path = helpers.make_backbone(tmp_path, name="led-large", warmup_steps=0)
    _, plain = load_backbone(path)
    layers = plain.config.encoder_layers
    # q, k, v and the global q, k, v of every encoder layer: hooked once, not twice
    hooked = [m for m in plain.modules() if getattr(m, "_fedrepro_contiguous", False)]
    assert len(hooked) == 6 * layers
    assert contiguous_sequence_first_inputs(plain) == 0
    seen = _projection_inputs(plain)
    plain.eval().requires_grad_(False)
    ids = torch.randint(5, plain.config.vocab_size, (2, 40))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        out = plain.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert seen and all(seen)  # every projection got a contiguous input
    # the same model without the hooks (from_pretrained directly): the same encoder output
    from transformers import LEDForConditionalGeneration

    bare = LEDForConditionalGeneration.from_pretrained(path).eval().requires_grad_(False)
    bare_seen = _projection_inputs(bare)
    with torch.no_grad():
        ref = bare.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert bare_seen and not any(bare_seen)  # transformers itself passes the transposed view
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert "LEDEncoderSelfAttention" in SEQUENCE_FIRST_ATTENTION


def test_bart_has_no_sequence_first_projections(tmp_path):
    path = helpers.make_backbone(tmp_path, name="bart-large", warmup_steps=0)
    _, model = load_backbone(path)
    assert not any(getattr(m, "_fedrepro_contiguous", False) for m in model.modules())
