"""Chinese BART (FedSUMM §III-A): character vocabulary, tiny build/save/load offline, hub pin."""

from __future__ import annotations

import re
import time

import pytest
import torch

from fedrepro.io import InputError
from fedrepro.papers.fedsumm.bart import (
    CHINESE_BART_HUB_ID,
    CHINESE_BART_REVISION,
    SPECIAL_TOKENS,
    build_char_vocab,
    build_tiny_chinese_bart,
    decode_text,
    download_chinese_bart,
    join_tokens,
    load_chinese_bart,
    prepare_chinese_bart,
)

TEXTS = [
    "针对无线传感器网络故障诊断问题，提出了一种新方法。",
    "结果表明，该方法的诊断误差降低了37.5%。",
    "本文利用2010年的数据检验了人口老龄化的影响。",
    "无线网络的诊断方法。",
]
TINY = {
    "d_model": 16,
    "heads": 2,
    "ffn_dim": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "max_position_embeddings": 64,
}


def test_char_vocab_by_hand():
    vocab = build_char_vocab(["我们 ab，我", "ab2010"])
    # BERT pre-tokenization: 我 们 ab ， 我 | ab2010 ; word-initial counts 我2 a2 们1 ，1;
    # continuation pieces (non-CJK only): b2 0 2 1 1 (0 twice in "2010": ##0 ##1 ##0)
    assert vocab[:5] == list(SPECIAL_TOKENS)
    assert vocab[5:] == ["a", "我", "们", "，", "##0", "##b", "##1", "##2"]
    capped = build_char_vocab(["我们 ab，我", "ab2010"], max_size=8)
    assert capped == list(SPECIAL_TOKENS) + ["a", "我", "##0"]
    with pytest.raises(InputError, match="empty"):
        build_char_vocab(["", "  "])


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cbart") / "bart-base-chinese"
    build_tiny_chinese_bart(TEXTS, out, TINY, seed=3)
    return out


def test_tiny_build_save_load_round_trip(tiny_dir):
    assert (tiny_dir / "vocab.txt").is_file() and (tiny_dir / "config.json").is_file()
    vocab = (tiny_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tok, model = load_chinese_bart(tiny_dir)
    assert (
        type(tok).__name__ == "BertTokenizer"
        and type(model).__name__ == "BartForConditionalGeneration"
    )
    assert len(tok) == len(vocab) == model.config.vocab_size
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id) == (0, 1, 2, 3)
    assert model.config.decoder_start_token_id == tok.sep_token_id == model.config.eos_token_id
    enc = tok("诊断方法")
    assert set(enc) == {"input_ids", "attention_mask"}  # no token_type_ids for BART
    assert enc["input_ids"] == [2] + [vocab.index(c) for c in "诊断方法"] + [3]
    assert tok.tokenize("2010年，鑫") == ["2", "##0", "##1", "##0", "年", "，", "[UNK]"]
    # the saved folder reloads to the same weights and the same outputs
    _, again = load_chinese_bart(tiny_dir)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=5, do_sample=False, num_beams=1)
    assert out.shape[0] == 1 and out.shape[1] <= 7
    assert isinstance(decode_text(tok, out[0].tolist()), str)


def test_tiny_build_is_deterministic(tiny_dir, tmp_path):
    other = build_tiny_chinese_bart(TEXTS, tmp_path / "again", TINY, seed=3)
    assert (other / "vocab.txt").read_bytes() == (tiny_dir / "vocab.txt").read_bytes()
    _, a = load_chinese_bart(tiny_dir)
    _, b = load_chinese_bart(other)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    with pytest.raises(InputError, match="unknown tiny"):
        build_tiny_chinese_bart(TEXTS, tmp_path / "bad", {"layers": 2})


def test_hub_pin_and_offline_download_fails_fast(tmp_path, monkeypatch):
    assert CHINESE_BART_HUB_ID == "fnlp/bart-base-chinese"
    assert re.fullmatch(r"[0-9a-f]{40}", CHINESE_BART_REVISION)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(InputError) as err:
        download_chinese_bart(tmp_path / "hub")
    assert time.monotonic() - start < 5
    msg = str(err.value)
    assert CHINESE_BART_HUB_ID in msg and CHINESE_BART_REVISION in msg and "local_dir" in msg
    assert not (tmp_path / "hub").exists()


def test_prepare_local_dir_and_errors(tiny_dir, tmp_path):
    out = prepare_chinese_bart({"kind": "hub", "local_dir": str(tiny_dir)}, [], tmp_path / "linked")
    tok, _ = load_chinese_bart(out)
    assert len(tok) > len(SPECIAL_TOKENS)
    with pytest.raises(InputError, match="config.json"):
        prepare_chinese_bart({"kind": "hub", "local_dir": str(tmp_path)}, [], tmp_path / "x")
    with pytest.raises(InputError, match="kind"):
        prepare_chinese_bart({"kind": "huge"}, [], tmp_path / "y")
    with pytest.raises(InputError, match="not a Chinese BART folder"):
        load_chinese_bart(tmp_path)


def test_join_tokens():
    assert (
        join_tokens(["我", "们", "2", "##0", "##1", "##0", "年", "hello", "world"])
        == "我们2010年hello world"
    )


# -- kind: shape ---------------------------------------------------------------------------------
def test_shape_char_vocabulary_has_the_real_special_ids_and_size():
    from fedrepro.papers.fedsumm.bart import hub_char_vocab

    vocab = hub_char_vocab(TEXTS, 21128)
    assert len(vocab) == len(set(vocab)) == 21128
    # bert-base-chinese's vocab.txt, which fnlp/bart-base-chinese v1 ships
    assert [vocab.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
        0, 100, 101, 102, 103]
    assert "诊" in vocab and "##0" in vocab


def test_prepare_shape_chinese_bart(tmp_path, monkeypatch):
    """The description of the pinned v1 revision, built small (widths only; vocabulary, positions
    and special ids kept) to test the folder; the true size is counted in test_backbones.py."""
    import json

    from fedrepro.models import shapes
    from fedrepro.models.shapes import architecture, shape_config

    arch = architecture(CHINESE_BART_HUB_ID)
    assert arch.revision == CHINESE_BART_REVISION  # the description is of the pinned revision
    assert (arch.config["vocab_size"], arch.config["max_position_embeddings"]) == (21128, 512)

    def small(arch, seed=0):
        from transformers import BartForConditionalGeneration

        cfg = shape_config(arch)
        cfg.d_model, cfg.encoder_layers, cfg.decoder_layers = 16, 1, 1
        cfg.encoder_attention_heads = cfg.decoder_attention_heads = 2
        cfg.encoder_ffn_dim = cfg.decoder_ffn_dim = 32
        torch.manual_seed(seed)
        return BartForConditionalGeneration(cfg)

    monkeypatch.setattr(shapes, "build_shape_model", small)
    out = prepare_chinese_bart({"kind": "shape"}, TEXTS, tmp_path / "shape")
    meta = json.loads((out / "fedrepro_backbone.json").read_text())
    assert (meta["kind"], meta["hub_id"], meta["revision"]) == (
        "shape", CHINESE_BART_HUB_ID, CHINESE_BART_REVISION)
    tok, model = load_chinese_bart(out)
    assert len(tok) == model.config.vocab_size == 21128
    assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id) == (0, 101, 102)
    assert (model.config.bos_token_id, model.config.eos_token_id,
            model.config.decoder_start_token_id) == (101, 102, 102)
    ids = torch.tensor([tok("诊断方法")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids, decoder_input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], 21128)
    with pytest.raises(InputError, match="no architecture description"):
        prepare_chinese_bart({"kind": "shape", "revision": "main"}, TEXTS, tmp_path / "v2")
    with pytest.raises(InputError, match="'tiny', 'hub' or 'shape'"):
        prepare_chinese_bart({"kind": "huge"}, TEXTS, tmp_path / "z")
