"""CopyTransformer and the copy distribution on BART (FedSUMM §III-B, Table II's "+ CD")."""

from __future__ import annotations

import math

import pytest
import torch

from fedrepro.io import InputError
from fedrepro.papers.fedsumm.bart import build_tiny_chinese_bart, load_chinese_bart
from fedrepro.papers.fedsumm.copy_transformer import (
    BartWithCopy,
    CopyTransformer,
    copy_loss,
    copy_mixture,
    copy_nll_loss,
    generate_with_copy,
    make_copy_batch,
)

TEXTS = [
    "针对无线传感器网络故障诊断问题，提出了一种新方法。",
    "结果表明，该方法的诊断误差降低了。",
    "本文检验了人口老龄化对农民增收的影响。",
    "无线网络的诊断方法。",
]
CT_ARCH = {
    "d_model": 32,
    "heads": 2,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "ffn_dim": 64,
    "dropout": 0.0,
    "max_positions": 128,
}


def test_copy_mixture_hand_computation():
    # V = 3, one source-only token (extended id 3); source = [1, 3, 3]
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2]]]))  # P_vocab = [0.5, 0.3, 0.2]
    attn = torch.tensor([[[0.2, 0.3, 0.5]]])
    src_ext = torch.tensor([[1, 3, 3]])
    probs = copy_mixture(logits, attn, torch.tensor([[[0.6]]]), src_ext, n_oov=1)
    # 0.6·[0.5, 0.3, 0.2, 0] + 0.4·[0, 0.2, 0, 0.3 + 0.5]
    assert torch.allclose(probs, torch.tensor([[[0.30, 0.26, 0.12, 0.32]]]))
    assert float(probs.sum()) == pytest.approx(1.0)
    only_generate = copy_mixture(logits, attn, torch.tensor([[[1.0]]]), src_ext, n_oov=1)
    assert float(only_generate[0, 0, 3]) == 0.0  # a source-only token gets mass only by copying
    only_copy = copy_mixture(logits, attn, torch.tensor([[[0.0]]]), src_ext, n_oov=1)
    assert torch.allclose(only_copy, torch.tensor([[[0.0, 0.2, 0.0, 0.8]]]))
    # NLL of the mixture at the labels, padding ignored: -(log 0.32 + log 0.30)/2
    two = torch.cat([probs, probs], dim=1)
    loss = copy_nll_loss(two, torch.tensor([[3, 0]]))
    assert float(loss) == pytest.approx(-(math.log(0.32) + math.log(0.30)) / 2, rel=1e-5)
    assert float(copy_nll_loss(two, torch.tensor([[3, -100]]))) == pytest.approx(
        -math.log(0.32), rel=1e-5
    )
    with pytest.raises(InputError, match="extended vocabulary"):
        copy_mixture(logits, attn, torch.tensor([[[0.5]]]), torch.tensor([[1, 4, 3]]), n_oov=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("cbart") / "bart"
    build_tiny_chinese_bart(
        TEXTS,
        out,
        {
            "d_model": 32,
            "heads": 2,
            "ffn_dim": 64,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "max_position_embeddings": 128,
        },
        seed=0,
    )
    return out, *load_chinese_bart(out)


def test_copy_batch_extended_vocabulary(tiny):
    _, tok, model = tiny
    v = model.config.vocab_size
    vid = tok.convert_tokens_to_ids
    batch = make_copy_batch(tok, ["鑫诊断鑫方法", "诊断"], ["鑫方法淼", "方法"], v, 32, 32)
    cls, sep, unk = tok.cls_token_id, tok.sep_token_id, tok.unk_token_id
    assert batch["oov_tokens"] == [["鑫"], []] and batch["n_oov"] == 1
    assert batch["input_ids"][0].tolist() == [
        cls,
        unk,
        vid("诊"),
        vid("断"),
        unk,
        vid("方"),
        vid("法"),
        sep,
    ]
    assert batch["src_ext_ids"][0].tolist() == [
        cls,
        v,
        vid("诊"),
        vid("断"),
        v,
        vid("方"),
        vid("法"),
        sep,
    ]
    # 鑫 is copyable (extended id v); 淼 is in neither vocabulary nor source -> [UNK]
    assert batch["labels"][0].tolist() == [cls, v, vid("方"), vid("法"), unk, sep]
    assert batch["decoder_input_ids"][0].tolist() == [sep, cls, unk, vid("方"), vid("法"), unk]
    assert batch["labels"][1].tolist() == [cls, vid("方"), vid("法"), sep, -100, -100]
    assert batch["attention_mask"][1].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]


def _capture_copy_head(model):
    seen = {}
    model.copy_head.register_forward_hook(
        lambda mod, args, out: seen.update(attn=out[0], p_gen=out[1])
    )
    return seen


def test_ct_distribution_and_source_only_mass(tiny):
    _, tok, _ = tiny
    torch.manual_seed(0)
    ct = CopyTransformer.from_tokenizer(tok, **CT_ARCH)
    batch = make_copy_batch(tok, ["鑫诊断鑫方法"], ["鑫方法"], ct.vocab_size, 32, 32)
    seen = _capture_copy_head(ct)
    probs = ct(
        batch["input_ids"],
        batch["attention_mask"],
        batch["decoder_input_ids"],
        batch["src_ext_ids"],
        batch["n_oov"],
    )
    v = ct.vocab_size
    assert probs.shape == (1, 5, v + 1)
    assert torch.allclose(probs.sum(-1), torch.ones(1, 5), atol=1e-5)
    # P(鑫) = (1 − p_gen)·(a_1 + a_4): the copy attention at its two source positions, nothing else
    oov_positions = (batch["src_ext_ids"][0] == v).nonzero().flatten().tolist()
    assert oov_positions == [1, 4]
    expected = (1 - seen["p_gen"][..., 0]) * seen["attn"][..., oov_positions].sum(-1)
    assert torch.allclose(probs[..., v], expected, atol=1e-6) and bool((probs[..., v] > 0).all())
    plain = CopyTransformer.from_tokenizer(tok, **CT_ARCH, use_copy=False)
    p_plain = plain(
        batch["input_ids"],
        batch["attention_mask"],
        batch["decoder_input_ids"],
        batch["src_ext_ids"],
        batch["n_oov"],
    )
    assert torch.all(p_plain[..., v] == 0) and torch.allclose(
        p_plain.sum(-1), torch.ones(1, 5), atol=1e-5
    )


def test_ct_forward_backward_and_learning(tiny, tmp_path):
    _, tok, _ = tiny
    torch.manual_seed(0)
    ct = CopyTransformer.from_tokenizer(tok, **CT_ARCH)
    sources = [t + "鑫" for t in TEXTS]  # every source ends in a source-only character
    targets = [t[:4] + "鑫" for t in TEXTS]
    batch = make_copy_batch(tok, sources, targets, ct.vocab_size, 64, 16)
    loss = copy_loss(ct, batch)
    loss.backward()
    assert math.isfinite(float(loss.detach()))
    assert all(p.grad is not None for p in ct.parameters())
    assert float(ct.copy_head.p_gen.weight.grad.abs().sum()) > 0
    opt = torch.optim.Adam(ct.parameters(), lr=3e-3)
    first = float(loss.detach())
    for _ in range(40):
        opt.zero_grad()
        loss = copy_loss(ct, batch)
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first
    ct.save_pretrained(tmp_path / "ct")
    again = CopyTransformer.from_pretrained(tmp_path / "ct")
    ct.eval()
    with torch.no_grad():
        assert torch.equal(copy_loss(ct, batch), copy_loss(again, batch))
    with pytest.raises(InputError, match="not a CopyTransformer"):
        CopyTransformer.from_pretrained(tmp_path)


def test_greedy_matches_stepwise_argmax_and_beam_runs(tiny):
    _, tok, _ = tiny
    torch.manual_seed(1)
    ct = CopyTransformer.from_tokenizer(tok, **CT_ARCH).eval()
    batch = make_copy_batch(tok, ["鑫诊断方法", "无线网络"], None, ct.vocab_size, 32, 32)
    greedy = generate_with_copy(ct, tok, batch, max_new_tokens=6, beam_size=1)
    # manual greedy for example 0
    prefix = [ct.config.decoder_start_token_id]
    with torch.no_grad():
        enc = ct.encode(batch["input_ids"][:1], batch["attention_mask"][:1])
        for _ in range(6):
            dec_in = torch.tensor([[t if t < ct.vocab_size else tok.unk_token_id for t in prefix]])
            probs = ct.decode(
                enc, batch["attention_mask"][:1], dec_in, batch["src_ext_ids"][:1], batch["n_oov"]
            )
            nxt = int(probs[0, -1, : ct.vocab_size + 1].argmax())
            prefix.append(nxt)
            if nxt == ct.config.eos_token_id:
                break
    words = [
        batch["oov_tokens"][0][t - ct.vocab_size]
        if t >= ct.vocab_size
        else tok.convert_ids_to_tokens(t)
        for t in prefix[1:]
        if t >= ct.vocab_size or t not in tok.all_special_ids
    ]
    assert greedy[0] == "".join(words)
    beams = generate_with_copy(
        ct, tok, batch, max_new_tokens=6, beam_size=3, min_new_tokens=2, no_repeat_ngram_size=2
    )
    assert len(beams) == 2 and all(isinstance(s, str) for s in beams)


def test_pure_copying_outputs_only_source_tokens(tiny):
    _, tok, _ = tiny
    torch.manual_seed(2)
    ct = CopyTransformer.from_tokenizer(tok, **CT_ARCH).eval()
    with torch.no_grad():
        ct.copy_head.p_gen.bias.fill_(-50.0)  # p_gen ≈ 0: P = copy distribution
    source = "鑫诊断淼方法"
    batch = make_copy_batch(tok, [source], None, ct.vocab_size, 32, 32)
    out = generate_with_copy(ct, tok, batch, max_new_tokens=8, beam_size=2)[0]
    assert set(out) <= set(source)


def test_bart_with_copy_cross_attention(tiny, tmp_path):
    path, tok, _ = tiny
    _, bart = load_chinese_bart(path)
    torch.manual_seed(0)
    model = BartWithCopy(bart)
    assert bart.config._attn_implementation == "eager"
    batch = make_copy_batch(
        tok, ["鑫诊断鑫方法", "无线网络"], ["鑫方法", "网络"], model.vocab_size, 32, 16
    )
    seen = _capture_copy_head(model)
    probs = model(
        batch["input_ids"],
        batch["attention_mask"],
        batch["decoder_input_ids"],
        batch["src_ext_ids"],
        batch["n_oov"],
    )
    assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[:2]), atol=1e-5)
    # the copy attention is the last decoder layer's cross-attention, averaged over heads
    with torch.no_grad():
        ref = bart(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=batch["decoder_input_ids"],
            output_attentions=True,
        )
    assert torch.allclose(seen["attn"], ref.cross_attentions[-1].mean(1), atol=1e-5)
    v = model.vocab_size
    expected = (1 - seen["p_gen"][..., 0]) * seen["attn"][..., [1, 4]].sum(-1)
    assert torch.allclose(probs[0, :, v], expected[0], atol=1e-6)
    loss = copy_loss(model, batch)
    loss.backward()
    assert (
        bart.model.shared.weight.grad is not None and model.copy_head.p_gen.weight.grad is not None
    )
    model.save_pretrained(tmp_path / "bart_cd")
    again = BartWithCopy.from_pretrained(tmp_path / "bart_cd")
    model.eval()
    with torch.no_grad():
        assert torch.allclose(copy_loss(model, batch), copy_loss(again, batch), atol=1e-6)
    texts = generate_with_copy(model, tok, batch, max_new_tokens=4, beam_size=2)
    assert len(texts) == 2


def test_bart_with_learned_copy_attention(tiny):
    path, tok, _ = tiny
    _, bart = load_chinese_bart(path)
    model = BartWithCopy(bart, attention="learned")
    batch = make_copy_batch(tok, ["鑫诊断方法"], ["鑫方法"], model.vocab_size, 32, 16)
    loss = copy_loss(model, batch)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and model.copy_head.query.weight.grad is not None
    with pytest.raises(InputError, match="copy attention"):
        BartWithCopy(bart, attention="pointer")
