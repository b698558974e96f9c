"""LongT5 backbone for AdaFedSelecKD's long-meeting setting (§V-B.4, Fig. 9).

The adapter summarizer on a LongT5 backbone computes what the backbone itself computes (frozen
prefix captured at the first adapted block with T5's position biases, top blocks, final norm and
output scaling), both adapter roles behave as on BART, generation runs through the active role,
and the registry / shape description hold the hub checkpoint's values.
"""

import copy
from pathlib import Path

import helpers
import pytest
import torch
import yaml
from transformers import LongT5Config, LongT5ForConditionalGeneration

from fedrepro.config import validate_config
from fedrepro.grid import backbone_settings
from fedrepro.models.backbones import (
    get_spec,
    load_backbone,
    tokenizer_layout,
    train_tokenizer,
)
from fedrepro.models.shapes import architecture, build_shape_model, check_tokenizer, shape_config
from fedrepro.papers.adafedseleckd.adapters import AdaptedDecoderLayer, FrozenProjectionMemo
from fedrepro.papers.adafedseleckd.kd import selective_kd_loss
from fedrepro.papers.adafedseleckd.model import (
    AdapterSummarizer,
    build_summarizer,
    decoder_layout,
)

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 300


def _tiny(scale_outputs: bool = False, seed: int = 0) -> LongT5ForConditionalGeneration:
    """The demo shape of config/config.yaml's longt5 (d_model 64, 2 + 4 layers, 4 heads,
    transient-global), built from a config; ``scale_outputs``: T5's d_model**-0.5 before the LM
    head (tie_word_embeddings true), which the hub checkpoint does not use."""
    torch.manual_seed(seed)
    cfg = LongT5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=4,
        num_heads=4, encoder_attention_type="transient-global", local_radius=7,
        global_block_size=4, feed_forward_proj="gated-gelu", dropout_rate=0.1,
        tie_word_embeddings=scale_outputs, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0,
    )
    return LongT5ForConditionalGeneration(cfg).eval()


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (2, 40), generator=g)  # > 2 local blocks, 10 global tokens
    mask = torch.ones_like(ids)
    mask[1, 29:] = 0
    ids[1, 29:] = 0
    dec = torch.randint(4, VOCAB, (2, 9), generator=g)
    dec[:, 0] = 0  # decoder start = pad
    return ids, mask, dec


def _reference(backbone, ids, mask, dec):
    """The backbone's own forward (no cache: with its default cache transformers' LongT5 builds
    the masks another way, which moves logits by ~1e-5 of themselves)."""
    with torch.no_grad():
        return backbone(input_ids=ids, attention_mask=mask, decoder_input_ids=dec,
                        use_cache=False).logits


# -- (a) the adapter paths compute what the backbone computes -----------------------------------

@pytest.mark.parametrize("scale_outputs", [False, True], ids=["hub-no-scaling", "scaled"])
@pytest.mark.parametrize("top_k", [1, 2, 4], ids=["top1", "top2", "all4"])
def test_paths_equal_the_backbones_own_forward(scale_outputs, top_k):
    """With the adapters switched off the captured prefix + top blocks + final norm (+ scaling)
    give the untouched backbone's logits; with ``role``'s adapters they give the wrapped
    backbone's full forward through that role.  top_k 4 = every block: block 0 is adapted and
    computes the position biases itself, handed on to the blocks above."""
    plain = _tiny(scale_outputs)
    model = AdapterSummarizer(copy.deepcopy(plain), top_k, 32, roles=("global", "local"))
    ids, mask, dec = _batch()
    prefix = model.frozen_prefix(ids, mask, dec)
    _, kwargs = prefix
    if top_k < 4:  # captured after block 0: its biases travel with the prefix
        assert kwargs["position_bias"] is not None
        assert kwargs["encoder_decoder_position_bias"] is not None
    else:
        assert kwargs["position_bias"] is None  # block 0 computes it inside the adapted path
    with torch.no_grad():
        off = model.adapted_logits(prefix, None)
    ref = _reference(plain, ids, mask, dec)
    assert torch.allclose(off, ref, atol=1e-5, rtol=0)

    # adapters as build_summarizer starts them (W_up = 0: LayerNorm(y)), then trained-looking ones
    for perturb in (False, True):
        if perturb:
            with torch.no_grad():
                for p in model.stacks.parameters():
                    p.add_(0.1 * torch.randn_like(p))
        student, teacher = model.path_logits(ids, mask, dec, student="local", teacher="global")
        model.router.active = "local"
        ref_local = _reference(model.backbone, ids, mask, dec)
        model.router.active = "global"
        ref_global = _reference(model.backbone, ids, mask, dec)
        assert torch.allclose(student, ref_local, atol=1e-5, rtol=0)
        assert torch.allclose(teacher, ref_global, atol=1e-5, rtol=0)
    assert not torch.allclose(student, off, atol=1e-3)  # the adapters act


def test_position_biases_reach_the_adapted_blocks():
    """Without block 0's biases the top blocks compute other logits: the capture matters."""
    model = AdapterSummarizer(_tiny(), 2, 32)
    ids, mask, dec = _batch()
    args, kwargs = model.frozen_prefix(ids, mask, dec)
    with torch.no_grad():
        right = model.adapted_logits((args, kwargs), "local")
        wrong = model.adapted_logits(
            (args, {**kwargs, "position_bias": None, "encoder_decoder_position_bias": None}),
            "local",
        )
    assert not torch.allclose(right, wrong, atol=1e-3)


# -- (b) roles, gradients, memo ------------------------------------------------------------------

def test_roles_gradients_and_cross_attention_memo():
    torch.manual_seed(3)
    model = AdapterSummarizer(_tiny(), 2, 32, roles=("global", "local"))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("stacks.local.") for n in trainable)
    # 2 adapters x (down 64x32+32, up 32x64+64, LayerNorm 2x64)
    assert sum(p.numel() for p in model.trainable_parameters()) == 2 * (
        64 * 32 + 32 + 32 * 64 + 64 + 128)
    blocks = model.backbone.get_decoder().block
    assert model.backbone.get_decoder().layers is blocks  # the alias, not a second copy
    assert [isinstance(b, AdaptedDecoderLayer) for b in blocks] == [False, False, True, True]
    names = [n for n, _ in model.backbone.named_parameters()]
    assert len(names) == len(set(names)) and not any(".layers." in n for n in names)
    for b in blocks[2:]:
        cross = b.layer.layer[1].EncDecAttention
        assert isinstance(cross.k, FrozenProjectionMemo) and isinstance(cross.v, FrozenProjectionMemo)
    assert not isinstance(blocks[0].layer[1].EncDecAttention.k, FrozenProjectionMemo)
    assert len(model._kv_memos) == 4

    with torch.no_grad():
        for p in model.stacks["local"].parameters():
            p.add_(0.1 * torch.randn_like(p))
    ids, mask, dec = _batch()
    calls = []
    original = model._kv_memos[0].linear.forward
    model._kv_memos[0].linear.forward = lambda x: calls.append(1) or original(x)
    student, teacher = model.path_logits(ids, mask, dec, student="local", teacher="global")
    assert len(calls) == 1  # the teacher's keys reused by the student path
    assert student.requires_grad and not teacher.requires_grad
    assert not torch.allclose(student, teacher, atol=1e-3)  # the roles' adapters differ
    labels = dec.roll(-1, dims=1)
    loss, _ = selective_kd_loss(student, teacher, labels, 0.2, 5.0)
    loss.backward()
    assert all(p.grad is None for n, p in model.named_parameters()
               if not n.startswith("stacks.local."))
    assert all(p.grad is not None for p in model.stacks["local"].parameters())
    model.train()
    assert not model.backbone.training


# -- (c) generation ------------------------------------------------------------------------------

def test_generate_runs_through_the_active_role():
    """Beam search and greedy; the decoder (4 blocks) is deeper than the encoder (2), which the
    default generation cache of transformers 5.23 cannot hold for LongT5."""
    model = AdapterSummarizer(_tiny(), 2, 32, roles=("global", "local"))
    with torch.no_grad():
        for p in model.stacks["local"].parameters():
            p.add_(torch.randn_like(p))
    ids, mask, _ = _batch()
    out = model.generate(ids, mask, role="local", num_beams=2, max_new_tokens=6,
                         min_new_tokens=2, no_repeat_ngram_size=3)
    assert out.dtype == torch.long and out.shape[0] == 2 and 3 <= out.shape[1] <= 7
    assert (out[:, 0] == 0).all()  # decoder start = pad
    greedy = {r: model.generate(ids, mask, role=r, num_beams=1, do_sample=False, max_new_tokens=6,
                                min_new_tokens=6) for r in ("global", "local")}
    # greedy ids = argmax of the role's own teacher-forced logits on them
    for role, seq in greedy.items():
        dec = seq[:, :-1]
        model.router.active = role
        with torch.no_grad():
            logits = model.adapted_logits(model.frozen_prefix(ids, mask, dec), role)
        assert torch.equal(logits.argmax(-1), seq[:, 1:])
    assert not torch.equal(greedy["global"], greedy["local"])


# -- the demo backbone folder ---------------------------------------------------------------------

def test_tiny_longt5_folder_has_t5_ids_and_loads_into_the_summarizer(tmp_path):
    path = helpers.make_backbone(tmp_path, name="longt5", warmup_steps=2)
    tokenizer, backbone = load_backbone(path)
    assert type(backbone).__name__ == "LongT5ForConditionalGeneration"
    cfg = backbone.config
    assert cfg.encoder_attention_type == "transient-global"
    assert (cfg.num_layers, cfg.num_decoder_layers, cfg.d_model, cfg.d_kv) == (1, 2, 32, 16)
    assert (cfg.local_radius, cfg.global_block_size) == (15, 8)
    assert not cfg.scale_decoder_outputs  # as the hub checkpoint
    assert (cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id) == (0, 1, 0)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    assert tokenizer.bos_token_id is None and tokenizer.mask_token_id == 3
    ids = tokenizer("the remote button is late .")["input_ids"]
    assert ids[-1] == 1 and 1 not in ids[:-1] and ids[0] > 3
    assert tokenizer.decode(ids, skip_special_tokens=True).strip() == "the remote button is late ."
    _, model = build_summarizer(path, 1, 16, ("global", "local"), adapter_init_seed=5)
    assert decoder_layout(model.backbone).final_norm == "final_layer_norm"
    batch = tokenizer(["the remote is late .", "we discussed the budget ."], padding=True,
                      return_tensors="pt")
    dec = torch.tensor([[0, 5, 6], [0, 7, 8]])
    student, teacher = model.path_logits(batch["input_ids"], batch["attention_mask"], dec,
                                         student="local", teacher="global")
    # the same initial adapters in both roles
    assert torch.allclose(student, teacher, atol=1e-6) and student.requires_grad
    assert torch.allclose(student.detach(), _reference(model.backbone, batch["input_ids"],
                                                       batch["attention_mask"], dec), atol=1e-5)


# -- (d) the shape backbone: the hub checkpoint's dimensions -------------------------------------

def test_shape_longt5_has_the_hub_dimensions_and_takes_paper_adapters():
    arch = architecture("google/long-t5-tglobal-base")
    assert arch.model_class == get_spec("longt5").model_class
    cfg = shape_config(arch)
    assert (cfg.d_model, cfg.num_layers, cfg.num_decoder_layers, cfg.num_heads, cfg.d_kv,
            cfg.d_ff, cfg.vocab_size) == (768, 12, 12, 12, 64, 2048, 32128)
    assert (cfg.encoder_attention_type, cfg.local_radius, cfg.global_block_size) == (
        "transient-global", 127, 16)
    assert cfg.feed_forward_proj == "gated-gelu" and not cfg.scale_decoder_outputs
    assert (cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id) == (0, 1, 0)
    with torch.device("meta"):
        backbone = build_shape_model(arch)
        spec = get_spec("longt5")
        model = AdapterSummarizer(backbone, spec.adapter_top_k, spec.bottleneck,
                                  roles=("global", "local"))
    assert sum(p.numel() for p in backbone.parameters()) == arch.parameters == 222_913_152
    blocks = backbone.get_decoder().block
    assert len(blocks) == 12 and model.first_adapted == 6
    assert [isinstance(b, AdaptedDecoderLayer) for b in blocks] == [False] * 6 + [True] * 6
    # the exchanged adapter tensors: 6 x (down 768x1536+1536, up 1536x768+768, LayerNorm 2x768)
    per_layer = 768 * 1536 + 1536 + 1536 * 768 + 768 + 2 * 768
    assert sum(p.numel() for p in model.trainable_parameters()) == 6 * per_layer == 14_178_816


def test_shape_build_path_writes_a_loadable_longt5_folder(tmp_path, monkeypatch):
    """``kind: shape`` end to end (tokenizer with T5's ids checked against the description, model
    saved, hub ``architectures`` restored, loaded, wrapped) -- on the hub description with its
    widths and depths shrunk, so that it runs in a second; the true sizes are checked above."""
    import dataclasses
    import json

    from fedrepro.models import shapes
    from fedrepro.models.backbones import prepare_backbone

    hub_id = "google/long-t5-tglobal-base"
    small = {**shapes.ARCHITECTURES[hub_id].config, "d_model": 32, "d_kv": 8, "num_heads": 4,
             "d_ff": 64, "num_layers": 1, "num_decoder_layers": 2, "vocab_size": 400}
    monkeypatch.setitem(shapes.ARCHITECTURES, hub_id,
                        dataclasses.replace(shapes.ARCHITECTURES[hub_id], config=small))
    settings = backbone_settings({"backbones": {"longt5": {"kind": "shape"}}}, "longt5")
    texts = ["the remote control is late .", "we discussed the budget of the project ."] * 10
    out = prepare_backbone(settings, texts, tmp_path / "longt5", seed=1)
    meta = json.loads((out / "fedrepro_backbone.json").read_text())
    assert meta["kind"] == "shape" and meta["model_class"] == "LongT5ForConditionalGeneration"
    saved = json.loads((out / "config.json").read_text())
    assert saved["architectures"] == ["LongT5ForConditionalGeneration"]
    tokenizer, backbone = load_backbone(out)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1) and len(tokenizer) <= 400
    model = AdapterSummarizer(backbone, 1, 16)
    batch = tokenizer(texts[:2], padding=True, return_tensors="pt")
    dec = torch.tensor([[0, 5, 6], [0, 7, 8]])
    logits, _ = model.path_logits(batch["input_ids"], batch["attention_mask"], dec)
    assert logits.shape == (2, 3, 400) and torch.isfinite(logits).all()


def test_shape_tokenizer_has_t5_special_ids(tmp_path):
    texts = ["the remote is late .", "we discussed the budget ."]
    arch = architecture("google/long-t5-tglobal-base")
    assert tokenizer_layout(arch.model_class) == "t5"
    check_tokenizer(arch, train_tokenizer(texts, 300, tmp_path / "t5", "t5"))
    with pytest.raises(RuntimeError, match="pad id 1 != config.json pad_token_id 0"):
        check_tokenizer(arch, train_tokenizer(texts, 300, tmp_path / "bart"))


# -- (e) registry and config ---------------------------------------------------------------------

def test_registry_and_config_hold_the_longt5_values():
    spec = get_spec("longt5")
    assert (spec.hub_id, spec.model_class, spec.adapter_top_k, spec.bottleneck,
            spec.max_source_length) == ("google/long-t5-tglobal-base",
                                        "LongT5ForConditionalGeneration", 6, 1536, 16384)
    assert spec.bottleneck == 2 * 768  # m = 2n, BART-base's ratio (768 -> 1536)
    schema = ROOT / "config" / "schema.yaml"
    paper = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    validate_config(paper, schema, "config/paper.yaml")
    s = backbone_settings(paper, "longt5")
    assert (s["kind"], s["hub_id"], s["adapter_top_k"], s["bottleneck"],
            s["max_source_length"]) == ("hub", "google/long-t5-tglobal-base", 6, 1536, 16384)
    demo = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate_config(demo, schema, "config/config.yaml")
    d = backbone_settings(demo, "longt5")
    assert (d["kind"], d["adapter_top_k"], d["bottleneck"]) == ("tiny", 2, 128)
    assert (d["tiny"]["d_model"], d["tiny"]["encoder_layers"], d["tiny"]["decoder_layers"],
            d["tiny"]["heads"]) == (64, 2, 4, 4)
    assert (d["tiny"]["local_radius"], d["tiny"]["global_block_size"]) == (15, 8)
    # wired into the experiment grid elsewhere, not here
    assert "longt5" not in demo["adafedseleckd"]["backbones"]


def test_unknown_backbone_family_is_refused():
    with pytest.raises(ValueError, match="supports .*LongT5.* got Linear"):
        AdapterSummarizer(torch.nn.Linear(2, 2), 1, 4)
