"""``<paper>.precision`` and ``<paper>.frozen_dtype`` (fedrepro.precision; the GPU-hours issue, item 1).

For one local update of each paper's real client code (AdaFedSelecKD's ``local_update``, FedMCP's
``local_update``, FedSum's ``fedsum_local_update`` / ``baseline_local_update``, FedSUMM's
``fedsumm_local_update`` with eq. 7's guided, twice-differentiated objective) on tiny float32
models:

* ``fp32`` trains byte-identical parameters to a call without the argument (today's code path; no
  autocast object exists), and ``tf32`` on the CPU (no TF32 there) does too;
* ``bf16-mixed`` (CPU autocast) runs: the trained parameters stay float32, the loss is finite and
  near fp32's, and the parameters differ from fp32's -- autocast really applied;
* ``frozen_dtype: bf16`` stores the frozen backbone (AdaFedSelecKD, FedMCP's adapter methods and
  FedLR) in bfloat16 while adapters, heads and LoRA tensors stay float32 and keep training;
* bad values are InputErrors naming the config key; a default cell carries neither key (its config
  hash is unchanged), a bf16 cell carries both.

What needs a GPU (TF32 on CUDA, bf16 speed and memory) is not tested here: docs/decisions.md,
"Precision".
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import re
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import yaml

from fedrepro.io import InputError
from fedrepro.precision import PRECISIONS, Precision, cast_frozen, precision_cell

ROOT = Path(__file__).resolve().parents[1]
BF16_LOSS_RTOL = 0.05  # bf16 has 8 significant bits: a tiny model's loss moves by well under 5 %


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread, as a demo cell (``threads_per_cell: 1``): tiny models on a loaded
    2-core machine run far faster without OpenMP's thread team."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _params(model) -> OrderedDict:
    return OrderedDict((n, p.detach().clone()) for n, p in model.named_parameters() if p.requires_grad)


def _same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8))
        for k in a
    )


def _check_modes(run):
    """``run(precision)`` -> (trained parameters, loss): the properties of the module docstring."""
    base_params, base_loss = run(None)
    fp32_params, fp32_loss = run(Precision("fp32"))
    tf32_params, tf32_loss = run(Precision("tf32"))
    bf16_params, bf16_loss = run(Precision("bf16-mixed"))
    assert _same_bits(fp32_params, base_params) and fp32_loss == base_loss
    assert _same_bits(tf32_params, base_params) and tf32_loss == base_loss  # no TF32 on the CPU
    assert all(p.dtype == torch.float32 for p in bf16_params.values())
    assert math.isfinite(bf16_loss)
    assert bf16_loss == pytest.approx(fp32_loss, rel=BF16_LOSS_RTOL)
    assert bf16_params.keys() == fp32_params.keys()
    assert any(not torch.equal(bf16_params[k], fp32_params[k]) for k in fp32_params)
    return base_params, bf16_params


# -- the helper ------------------------------------------------------------------------------------
@pytest.mark.parametrize("paper", ["adafedseleckd", "fedmcp", "fedsum", "fedsumm"])
def test_bad_values_are_input_errors_naming_the_key(paper):
    for bad in ("fp16", "bf16", "16-mixed", "", None, 32):
        with pytest.raises(InputError, match=rf"{paper}\.precision"):
            precision_cell({"precision": bad}, paper)
        with pytest.raises(InputError, match=rf"{paper}\.precision"):
            Precision.from_cell({"paper": paper, "precision": bad})
    with pytest.raises(InputError, match=rf"{paper}\.frozen_dtype"):
        precision_cell({"frozen_dtype": "fp16"}, paper)
    if paper in ("fedsum", "fedsumm"):  # nothing frozen to cast
        with pytest.raises(InputError, match=rf"{paper}\.frozen_dtype"):
            precision_cell({"frozen_dtype": "bf16"}, paper)


def test_the_schema_refuses_a_bad_precision_naming_the_key():
    from fedrepro.config import validate_config

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate_config(cfg, ROOT / "config" / "schema.yaml")
    for paper in ("adafedseleckd", "fedmcp", "fedsum", "fedsumm"):
        assert cfg[paper]["precision"] == "fp32"  # both configs: fp32 until GPU measurements
        bad = copy.deepcopy(cfg)
        bad[paper]["precision"] = "fp16"
        with pytest.raises(InputError, match=rf"config key {paper}\.precision"):
            validate_config(bad, ROOT / "config" / "schema.yaml")
    bad = copy.deepcopy(cfg)
    bad["fedsum"]["frozen_dtype"] = "bf16"
    with pytest.raises(InputError, match=r"fedsum"):
        validate_config(bad, ROOT / "config" / "schema.yaml")
    paper_cfg = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    validate_config(paper_cfg, ROOT / "config" / "schema.yaml")
    # the paper config: bf16-mixed with a bf16 frozen backbone where it was measured (an H100 step
    # and the demo's scores, docs/decisions.md "Precision"); fp32 for FedSum and FedSUMM
    assert {p: paper_cfg[p]["precision"] for p in ("adafedseleckd", "fedmcp", "fedsum", "fedsumm")} == {
        "adafedseleckd": "bf16-mixed", "fedmcp": "bf16-mixed", "fedsum": "fp32", "fedsumm": "fp32"}
    assert {paper_cfg[p]["frozen_dtype"] for p in ("adafedseleckd", "fedmcp")} == {"bf16"}


def test_contexts():
    """fp32 (and tf32 on the CPU) create no autocast at all; bf16-mixed autocasts to bfloat16 and
    leaves autocast off after; tf32 restores the TF32 switches."""
    for mode in ("fp32", "tf32"):
        p = Precision(mode)
        assert isinstance(p.autocast("cpu"), contextlib.nullcontext)
        assert isinstance(p.region("cpu"), contextlib.nullcontext)
    assert isinstance(Precision("fp32").region("cuda"), contextlib.nullcontext)
    assert isinstance(Precision("bf16-mixed").region("cuda"), contextlib.nullcontext)
    with Precision("bf16-mixed").autocast(torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with Precision("tf32").region("cuda"):  # only flips the switches: safe without a GPU
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    assert Precision.of(None) == Precision() and Precision.of("tf32").mode == "tf32"
    assert PRECISIONS == ("fp32", "tf32", "bf16-mixed")


def test_cells_carry_the_keys_only_when_not_fp32():
    """A default cell has neither key (same description and config hash as before the keys
    existed); a bf16 cell carries both and ``Precision.from_cell`` reads them back."""
    from fedrepro.fl.checkpoint import config_hash
    from fedrepro.papers.adafedseleckd import grid as ada
    from fedrepro.papers.fedmcp import grid as mcp
    from fedrepro.papers.fedsum import grid as fsum
    from fedrepro.papers.fedsumm import grid as fsumm

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    makers = {
        "adafedseleckd": lambda c: ada.make_cell(c, "domains", "bart-large", "AdaFedSelectKD", "all", 1),
        "fedmcp": lambda c: mcp.make_cell(c, "roberta-base", "FedMCP", 1),
        "fedsum": lambda c: fsum.make_fedsum_cell(c, "fedsum-cnndm-a0.1", "FedAvg", 1),
        "fedsumm": lambda c: fsumm.make_cell(c, "csl", 2, "bart", "FedSUMM", 1),
    }
    for paper, make in makers.items():
        plain = make(cfg)
        assert "precision" not in plain and "frozen_dtype" not in plain
        bare = copy.deepcopy(cfg)
        bare[paper].pop("precision")
        bare[paper].pop("frozen_dtype", None)
        assert config_hash(make(bare)) == config_hash(plain)  # the key at fp32 changes nothing
        assert Precision.from_cell(plain).record() == {"precision": "fp32", "frozen_dtype": "fp32"}
        mixed = copy.deepcopy(cfg)
        mixed[paper]["precision"] = "bf16-mixed"
        if paper in ("adafedseleckd", "fedmcp"):
            mixed[paper]["frozen_dtype"] = "bf16"
        cell = make(mixed)
        assert cell["precision"] == "bf16-mixed"
        assert config_hash(cell) != config_hash(plain)
        got = Precision.from_cell(cell)
        assert got.mode == "bf16-mixed" and got.paper == paper
        assert got.frozen_dtype == ("bf16" if paper in ("adafedseleckd", "fedmcp") else "fp32")


def test_cast_frozen_keeps_trainable_and_ties():
    lin = torch.nn.Linear(4, 4)
    emb = torch.nn.Embedding(5, 4)
    head = torch.nn.Linear(4, 5, bias=False)
    head.weight = emb.weight  # tied
    model = torch.nn.ModuleDict({"lin": lin, "emb": emb, "head": head})
    model["emb"].requires_grad_(False)
    model["lin"].register_buffer("scale", torch.ones(4))
    model.register_buffer("table", torch.ones(3))
    assert cast_frozen(model, torch.bfloat16) == 2  # the tied weight once, the root's buffer
    assert emb.weight.dtype == torch.bfloat16 and head.weight is emb.weight
    assert lin.weight.dtype == torch.float32 and lin.bias.dtype == torch.float32
    assert lin.scale.dtype == torch.float32  # a trained module's buffer stays
    assert model.table.dtype == torch.bfloat16
    assert Precision().cast_frozen(model) == 0


# -- AdaFedSelecKD -------------------------------------------------------------------------------
V, PAD, BOS, EOS, START = 24, 1, 0, 2, 2


def _ada_model(roles=("global", "local")):
    from transformers import BartConfig, BartForConditionalGeneration

    from fedrepro.papers.adafedseleckd.model import AdapterSummarizer

    cfg = BartConfig(vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=2,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                     decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=PAD,
                     bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=START, init_std=0.3)
    torch.manual_seed(0)
    model = AdapterSummarizer(BartForConditionalGeneration(cfg), adapter_top_k=1, bottleneck=8,
                              roles=roles)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for role, scale in (("global", 1.5), ("local", 0.5)):
            if role in model.stacks:
                for p in model.stacks[role].parameters():
                    p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def _ada_examples():
    out = []
    for i in range(6):
        labels = [3 + (7 * i + 3 * j) % 20 for j in range(3 + i)] + [EOS]
        out.append({"id": f"ex{i}", "labels": labels,
                    "input_ids": [BOS] + [3 + (5 * i + j) % 20 for j in range(4 + i)] + [EOS]})
    return out


def _ada_run(model, precision, prefix_cache=None, method="AdaFedSelectKD"):
    from fedrepro.papers.adafedseleckd.methods import (
        METHODS,
        TrainHParams,
        local_update,
        make_optimizer,
    )

    hp = TrainHParams(lr=0.01, weight_decay=0.05, batch_size=3, local_epochs=2, lam=0.3, tau=1.5)
    kwargs = {} if precision is None else {"precision": precision}
    stats = local_update(model, METHODS[method], _ada_examples(), hp, make_optimizer(model, hp), 7,
                         "Academic", 3, PAD, START, prefix_cache=prefix_cache, **kwargs)
    return _params(model), stats["train_loss"]


def test_adafedseleckd_local_update():
    def run(precision):
        return _ada_run(_ada_model(), precision)

    _check_modes(run)


def test_adafedseleckd_frozen_bf16_backbone():
    """The backbone in bfloat16, both adapter stacks float32; the adapters' math takes bf16 inputs
    (cast at the boundary), the local adapter trains (fp32 and bf16-mixed), the backbone and the
    teacher never change."""
    from fedrepro.papers.adafedseleckd.adapters import BottleneckAdapter

    fp32_params, fp32_loss = _ada_run(_ada_model(), None)
    for precision in (None, Precision("bf16-mixed", "bf16")):
        model = _ada_model()
        n = Precision(frozen_dtype="bf16", paper="adafedseleckd").cast_frozen(model.backbone)
        assert n > 0
        assert all(p.dtype == torch.bfloat16 for p in model.backbone.parameters())
        assert all(p.dtype == torch.float32 for p in model.stacks.parameters())
        frozen = {k: v.clone() for k, v in model.backbone.state_dict().items()}
        teacher = {k: v.clone() for k, v in model.stacks["global"].state_dict().items()}
        params, loss = _ada_run(model, precision)
        assert all(v.dtype == torch.float32 for v in params.values())
        assert math.isfinite(loss) and loss == pytest.approx(fp32_loss, rel=BF16_LOSS_RTOL)
        assert any(not torch.equal(params[k], fp32_params[k]) for k in params)
        assert all(torch.equal(v, model.backbone.state_dict()[k]) for k, v in frozen.items())
        assert all(torch.equal(v, model.stacks["global"].state_dict()[k]) for k, v in teacher.items())
    # the adapter on a bf16 input: float32 math, the input's dtype out
    torch.manual_seed(3)
    adapter = BottleneckAdapter(16, 8)
    torch.nn.init.normal_(adapter.up.weight, std=0.5)
    y = torch.randn(2, 5, 16)
    out = adapter(y.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), adapter(y.bfloat16().float()).bfloat16().float())
    assert adapter(y).dtype == torch.float32


def test_adafedseleckd_prefix_cache_follows_autocast():
    """A stored fp32 prefix is not served to a bf16-mixed step (and back): with the cache the
    parameters are those of the uncached run of the same precision."""
    from fedrepro.papers.adafedseleckd.prefix_cache import PrefixCache

    cache = PrefixCache("fp32", 10**8)
    for precision in (Precision("fp32"), Precision("bf16-mixed"), Precision("fp32")):
        want, _ = _ada_run(_ada_model(), precision, PrefixCache("off", 0))
        got, _ = _ada_run(_ada_model(), precision, cache)
        assert _same_bits(got, want), precision.mode
    assert cache.hits > 0


def test_adafedseleckd_resident_bf16_copy(tmp_path, monkeypatch):
    """``frozen_dtype: bf16`` gets a bfloat16 resident copy of its own: a float32 summarizer of the
    same folder in the same process keeps float32 weights."""
    from fedrepro.models import backbones, resident
    from fedrepro.papers.adafedseleckd import task

    def fake_load(path):
        return None, _ada_model().backbone

    monkeypatch.setattr(backbones, "load_backbone", fake_load)
    task._cached_model.cache_clear()
    resident.clear()
    try:
        _, m32 = task._cached_model(str(tmp_path), 1, 8, ("global", "local"), 1, "cpu", False, "fp32")
        _, m16 = task._cached_model(str(tmp_path), 1, 8, ("global", "local"), 1, "cpu", False, "bf16")
        assert {p.dtype for p in m32.backbone.parameters()} == {torch.float32}
        assert {p.dtype for p in m16.backbone.parameters()} == {torch.bfloat16}
        assert {p.dtype for p in m16.stacks.parameters()} == {torch.float32}
        assert {p.dtype for p in m32.backbone.parameters()} == {torch.float32}  # still
        _ada_run(m16, Precision("bf16-mixed", "bf16"))
    finally:
        task._cached_model.cache_clear()
        resident.clear()


# -- FedMCP ---------------------------------------------------------------------------------------
def _roberta():
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=40, type_vocab_size=1,
                        pad_token_id=1)
    return RobertaModel(cfg).eval()


def _mcp_model(name):
    from fedrepro.papers.fedmcp.methods import build_model

    torch.manual_seed(11)
    model = build_model(name, _roberta(), num_labels=3,
                        cfg={"bottleneck": 4, "lora_r": 2, "lora_alpha": 6})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".adapters." in n or "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def _mcp_batches():
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(3):
        ids = torch.randint(3, 100, (6, 9), generator=g)
        mask = torch.ones_like(ids)
        ids[1, 5:], mask[1, 5:] = 1, 0
        out.append({"input_ids": ids, "attention_mask": mask,
                    "labels": torch.tensor([0, 2, 1, 2, 0, 1])})
    return out


def _mcp_run(model, name, precision):
    from fedrepro.papers.fedmcp.methods import LocalHParams, local_update

    hp = LocalHParams(lr=3e-3, full_ft_lr=7e-4, epochs=2, gamma=0.3, mu=0.5)
    kwargs = {} if precision is None else {"precision": precision}
    torch.manual_seed(5)
    stats = local_update(model, name, _mcp_batches(), hp, None, **kwargs)
    return _params(model), stats["loss"]


@pytest.mark.parametrize("name", ["FedMCP", "FedLR"])
def test_fedmcp_local_update(name):
    _check_modes(lambda precision: _mcp_run(_mcp_model(name), name, precision))


@pytest.mark.parametrize("name", ["FedMCP", "FedLR", "FedAvg-FT"])
def test_fedmcp_frozen_bf16_backbone(name):
    """The frozen backbone in bfloat16 (FedLR: its base weights, under peft's LoRA layers),
    adapters / heads / LoRA tensors float32 and training; Full FT has nothing frozen: a no-op."""
    from fedrepro.papers.fedmcp.task import accuracy  # noqa: F401  (the evaluation path imports)

    fp32_params, fp32_loss = _mcp_run(_mcp_model(name), name, None)
    for precision in (None, Precision("bf16-mixed", "bf16")):
        model = _mcp_model(name)
        n = Precision(frozen_dtype="bf16", paper="fedmcp").cast_frozen(model.backbone_module())
        dtypes = {p.dtype for p in model.backbone_module().parameters() if not p.requires_grad}
        if name == "FedAvg-FT":
            assert n == 0 and not dtypes
        else:
            assert n > 0 and dtypes == {torch.bfloat16}
        assert all(p.dtype == torch.float32 for p in model.trainable_parameters())
        before = {k: v.clone() for k, v in model.backbone_module().state_dict().items()
                  if v.dtype == torch.bfloat16}
        params, loss = _mcp_run(model, name, precision)
        assert all(v.dtype == torch.float32 for v in params.values())
        assert math.isfinite(loss) and loss == pytest.approx(fp32_loss, rel=BF16_LOSS_RTOL)
        state = model.backbone_module().state_dict()
        assert all(torch.equal(v, state[k]) for k, v in before.items())
        if name != "FedAvg-FT" or precision is not None:
            assert any(not torch.equal(params[k], fp32_params[k]) for k in params)
        else:  # Full FT without autocast: nothing was cast, today's bits
            assert _same_bits(params, fp32_params)
    with torch.no_grad():
        logits, _ = model(_mcp_batches()[0]["input_ids"], _mcp_batches()[0]["attention_mask"])
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


# -- FedSum ---------------------------------------------------------------------------------------
HIDDEN = 8
DOC_LABELS = ([1, 0, 0, 1], [0, 1, 0], [0, 0, 0, 1, 1], [1, 1, 0])


def _bertsum():
    from transformers import BertConfig, BertModel

    from fedrepro.papers.fedsum.model import BertSumExt

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return BertSumExt(BertModel(cfg, add_pooling_layer=False), head_seed=0)


def _bertsum_batch():
    from fedrepro.papers.fedsum.model import EncodedDocument, collate

    docs = []
    for i, labels in enumerate(DOC_LABELS):
        rng = random.Random(i)
        ids, segs, clss = [], [], []
        for s in range(len(labels)):
            clss.append(len(ids))
            span = [2] + [rng.randint(5, 39) for _ in range(3)] + [3]
            ids += span
            segs += [s % 2] * len(span)
        docs.append(EncodedDocument(f"d{i}", ids, segs, clss, list(labels),
                                    [f"s{s}" for s in range(len(labels))]))
    return collate(docs)


def _vec(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_fedsum_local_update():
    """FedSum (both extensions) in a round t = 2: L_data + L_pm on two received heads, the
    prototypes and the L_po step."""
    from fedrepro.papers.fedsum.algorithm import FedSumBroadcast, FedSumHParams, fedsum_local_update

    heads = [OrderedDict([("linear1.weight", _vec(s, 1, HIDDEN)), ("linear1.bias", _vec(s + 50, 1))])
             for s in (11, 12)]
    bc = FedSumBroadcast(round=2, total_rounds=3, global_significance=0.01, global_bias_level=4.5,
                         global_class_prototypes={0: _vec(21, HIDDEN), 1: _vec(22, HIDDEN)},
                         parameter_knowledge=list(zip((0.3, 0.85), heads)))
    batch = _bertsum_batch()

    def run(precision):
        model = _bertsum()
        kwargs = {} if precision is None else {"precision": precision}
        up = fedsum_local_update(model, [batch], bc, FedSumHParams(lr=0.05, local_epochs=2),
                                 "FedSum", client="a", seed=1, **kwargs)
        assert up.stats["L_po"] != 0.0 and up.stats["received_heads"] == 2
        return _params(model), up.stats["L_data"] + up.stats["L_pm"]

    _check_modes(run)


@pytest.mark.parametrize("method", ["FedProx", "FedProto"])
def test_fedsum_baseline_local_update(method):
    from fedrepro.papers.fedsum.baselines import BaselineHParams, baseline_local_update

    batch = _bertsum_batch()
    protos = {0: _vec(21, HIDDEN), 1: _vec(22, HIDDEN)}

    def run(precision):
        model = _bertsum()
        kwargs = {} if precision is None else {"precision": precision}
        extra = {"global_prototypes": protos} if method == "FedProto" else {
            "global_state": _bertsum().federated_state(), "mu": 0.3}
        up = baseline_local_update(model, method, [batch], BaselineHParams(lr=0.05, local_epochs=2),
                                   client="a", t=2, seed=1, **extra, **kwargs)
        return _params(model), up.stats["L_data"]

    _check_modes(run)


# -- FedSUMM --------------------------------------------------------------------------------------
def _ct():
    from fedrepro.papers.fedsumm.copy_transformer import CopyTransformer, CopyTransformerConfig

    torch.manual_seed(0)
    return CopyTransformer(CopyTransformerConfig(
        vocab_size=30, pad_token_id=0, unk_token_id=1, bos_token_id=2, eos_token_id=3,
        decoder_start_token_id=3, d_model=16, heads=2, encoder_layers=1, decoder_layers=1,
        ffn_dim=32, dropout=0.0, max_positions=32))


def _ct_batches():
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(2):
        src = torch.randint(4, 30, (3, 7), generator=g)
        mask = torch.ones_like(src)
        src[2, 5:], mask[2, 5:] = 0, 0
        ext = src.clone()
        ext[0, 1] = 30  # a source-only token (extended id)
        labels = torch.randint(4, 30, (3, 5), generator=g)
        labels[0, 2] = 30  # copied
        labels[1, 4] = -100
        dec = torch.cat([torch.full((3, 1), 3), labels[:, :-1].clamp_min(0).masked_fill(
            labels[:, :-1] >= 30, 1)], dim=1)
        out.append({"input_ids": src, "attention_mask": mask, "decoder_input_ids": dec,
                    "src_ext_ids": ext, "n_oov": 1, "labels": labels})
    return out


@pytest.mark.parametrize("dldt", ["inner_product", "off"])
def test_fedsumm_local_update(dldt):
    """FedSUMM's client round with eq. 7's inner product (``autograd.grad`` with
    ``create_graph``: a Hessian-vector product through the bf16 forward) and without guidance."""
    from fedrepro.papers.fedsumm.algorithm import (
        ClientGuidance,
        FedSummConfig,
        fedsumm_local_update,
    )
    from fedrepro.papers.fedsumm.copy_transformer import copy_loss

    config = FedSummConfig(dldt=dldt)
    batches = _ct_batches()

    def run(precision):
        model = _ct()
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        guidance = None
        if dldt != "off":
            guidance = ClientGuidance({n: 0.05 * _vec(i, *p.shape) for i, (n, p) in enumerate(named)},
                                      rho=0.5, previous_loss=3.0, epsilon=0.1)
        kwargs = {} if precision is None else {"precision": precision}
        res = fedsumm_local_update(model, batches, copy_loss,
                                   torch.optim.SGD([p for _, p in named], lr=0.3), guidance, config,
                                   local_epochs=2, **kwargs)
        if dldt != "off":
            assert res.mean_objective_term != 0.0 and math.isfinite(res.mean_objective_term)
        assert all(v.dtype == torch.float32 for v in res.gradient.values())
        return _params(model), res.loss

    _check_modes(run)


# -- native_bf16: the probe behind the rehearsal's precision: auto ----------------------------
def _cpu_probe(monkeypatch, *, avx512_bf16, amx, machine="x86_64", onednn=False):
    import platform

    from fedrepro import precision as prec

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, value in (("avx512_bf16", avx512_bf16), ("amx_tile", amx)):
        if value is None:
            monkeypatch.delattr(torch.cpu, f"_is_{name}_supported", raising=False)
        else:
            monkeypatch.setattr(torch.cpu, f"_is_{name}_supported", lambda v=value: v, raising=False)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    if onednn is not None:  # None: leave torch.ops as the test made it
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn, raising=False)
    return prec.native_bf16()


def test_native_bf16_is_a_gpu_or_a_cpu_with_bf16_instructions(monkeypatch):
    from fedrepro import precision as prec

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert prec.native_bf16(lambda: [(9, 0)])[0] is True
    native, why = _cpu_probe(monkeypatch, avx512_bf16=True, amx=False)
    assert native and "avx512_bf16" in why and "amx" not in why
    native, why = _cpu_probe(monkeypatch, avx512_bf16=False, amx=True)
    assert native and "amx_tile" in why and "avx512_bf16" not in why
    assert _cpu_probe(monkeypatch, avx512_bf16=True, amx=True)[1].endswith("with avx512_bf16 and amx_tile")
    # an AVX2 x86 CPU (this VM): emulated, whatever oneDNN's check (AVX512 without BF16 says yes there)
    native, why = _cpu_probe(monkeypatch, avx512_bf16=False, amx=False, onednn=True)
    assert not native and "13.1x" in why and "without AVX512-BF16 or AMX" in why
    # PyTorch's private probes gone: the answer is no (fp32, the default bits)
    assert _cpu_probe(monkeypatch, avx512_bf16=None, amx=None)[0] is False
    # another architecture: oneDNN's own check (ARM's BF16 extension)
    assert _cpu_probe(monkeypatch, avx512_bf16=None, amx=None, machine="aarch64", onednn=True)[0] is True
    assert _cpu_probe(monkeypatch, avx512_bf16=None, amx=None, machine="aarch64", onednn=False)[0] is False
    # every x86 spelling takes the x86 rule (oneDNN's yes is not enough there)
    for x86 in ("x86_64", "AMD64", "amd64", "i386", "i686"):
        assert _cpu_probe(monkeypatch, avx512_bf16=False, amx=False, machine=x86, onednn=True)[0] is False, x86
    # the answer names this CPU's vector capability, as PyTorch reports it
    capability = torch.backends.cpu.get_cpu_capability()
    assert f"CPU ({capability})" in _cpu_probe(monkeypatch, avx512_bf16=False, amx=False)[1]
    # a PyTorch without oneDNN's op (or without its check): no, not an AttributeError
    import types

    for ops in (types.SimpleNamespace(), types.SimpleNamespace(mkldnn=types.SimpleNamespace())):
        monkeypatch.setattr(torch, "ops", ops)
        assert _cpu_probe(monkeypatch, avx512_bf16=None, amx=None, machine="aarch64", onednn=None)[0] is False


# -- GPUs: native bf16 from compute capability 8.0, asked in a child process -------------------
def test_native_bf16_on_gpus_needs_compute_capability_8_on_every_visible_device(monkeypatch):
    from fedrepro import precision as prec

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    native, why = prec.native_bf16(lambda: [(9, 0), (8, 0)])
    assert native and "GPU 0: 9.0, GPU 1: 8.0" in why
    assert prec.native_bf16(lambda: [(8, 6)])[0] is True  # an A10 / RTX 30xx
    # a V100 (7.0) or a T4 (7.5) emulates bf16; one such device among newer ones decides
    for caps in ([(7, 0)], [(7, 5)], [(9, 0), (7, 0)]):
        native, why = prec.native_bf16(lambda caps=caps: caps)
        assert not native and "no bf16 tensor cores" in why, caps
    assert "GPU 1: 7.0" in prec.native_bf16(lambda: [(9, 0), (7, 0)])[1]

    def broken():
        raise RuntimeError("the CUDA capability probe exited 1: CUDA driver too old")

    native, why = prec.native_bf16(broken)
    assert not native and "capability is unknown" in why and "driver too old" in why
    # no GPU: the CPU's rules, and the GPU probe is not asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert prec.native_bf16(broken) == prec._cpu_native_bf16()


def _completed(returncode=0, stdout="", stderr=""):
    import subprocess

    return subprocess.CompletedProcess(args=[], returncode=returncode, stdout=stdout, stderr=stderr)


def test_cuda_capabilities_reads_its_child_and_names_what_went_wrong(monkeypatch):
    import subprocess
    import sys

    from fedrepro import precision as prec

    seen = {}

    def run(argv, **kw):
        seen["argv"], seen["kw"] = argv, kw
        return answer

    monkeypatch.setattr(subprocess, "run", run)
    answer = _completed(stdout="some import noise\n[(9, 0), (8, 0)]\n")
    assert prec.cuda_capabilities(timeout_s=7) == [(9, 0), (8, 0)]
    # a child Python of this interpreter asks torch for every visible device, bounded in time
    assert seen["argv"][:2] == [sys.executable, "-c"] and "get_device_capability" in seen["argv"][2]
    assert seen["kw"]["timeout"] == 7 and seen["kw"]["capture_output"]
    for answer, said in (
        (_completed(1, "", "RuntimeError: CUDA driver too old\n"), "exited 1: RuntimeError: CUDA driver too old"),
        (_completed(0, "not a list\n"), "exited 0: not a list"),
        (_completed(0, ""), "exited 0: nothing"),
        (_completed(0, "[(9,)]\n"), "exited 0"),
        (_completed(0, "[]\n"), "saw no device"),
    ):
        with pytest.raises(RuntimeError, match=re.escape(said)):
            prec.cuda_capabilities()

    def hang(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    monkeypatch.setattr(subprocess, "run", hang)
    with pytest.raises(RuntimeError, match="did not answer"):
        prec.cuda_capabilities(timeout_s=1)


def test_cuda_capabilities_really_asks_a_child_process():
    # this machine has no GPU: the child answers with no device (a real child, not a stub)
    from fedrepro import precision as prec

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(RuntimeError, match="saw no device"):
        prec.cuda_capabilities()


def test_emulation_warning_names_the_device_that_emulates_bf16(monkeypatch):
    from fedrepro import precision as prec

    cpu = dict(avx512_bf16=False, amx=False)
    _cpu_probe(monkeypatch, **cpu)  # an AVX2 CPU, as this VM
    assert prec.Precision("fp32", paper="fedmcp").emulation_warning("cpu") is None
    assert prec.Precision("tf32", paper="fedmcp").emulation_warning("cpu") is None
    warning = prec.Precision("bf16-mixed", paper="fedmcp").emulation_warning("cpu")
    assert "fedmcp: precision bf16-mixed" in warning and "without AVX512-BF16 or AMX" in warning
    assert "fedmcp.precision: fp32" in warning
    # a bf16 frozen backbone alone computes in bf16 too
    assert prec.Precision("fp32", "bf16", paper="fedmcp").emulation_warning(None) is not None
    _cpu_probe(monkeypatch, avx512_bf16=False, amx=True)
    assert prec.Precision("bf16-mixed", paper="fedmcp").emulation_warning("cpu") is None
    # CUDA: the device's own capability (this process trains on it, so asking is free)
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name",
                        lambda d=None: "Tesla V100-SXM2-32GB" if d == torch.device("cuda") else f"not {d}")
    for cap, expected in (((7, 0), True), ((7, 5), True), ((8, 0), False), ((9, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, cap=cap: asked.append(d) or cap)
        warning = prec.Precision("bf16-mixed", paper="adafedseleckd").emulation_warning("cuda:1")
        assert (warning is not None) is expected, cap
    assert asked[0] == torch.device("cuda:1")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 0))
    warning = prec.Precision("bf16-mixed", paper="adafedseleckd").emulation_warning("cuda")
    assert "Tesla V100-SXM2-32GB (compute capability 7.0) has no bf16 tensor cores" in warning
    # another device type: nothing to say
    assert prec.Precision("bf16-mixed").emulation_warning("meta") is None


def test_a_cell_records_its_emulated_bf16_where_it_trains(monkeypatch, caplog):
    import types

    from fedrepro import precision as prec
    from fedrepro.fl import cell as cell_mod

    _cpu_probe(monkeypatch, avx512_bf16=False, amx=False)
    federated = types.SimpleNamespace(is_federated=lambda c: True)
    local = types.SimpleNamespace(is_federated=lambda c: False)
    bf16 = prec.Precision("bf16-mixed", paper="fedmcp")
    with caplog.at_level("WARNING", logger="fedrepro.fl.cell"):
        warning = cell_mod._emulated_bf16({"device": "cpu", "out_dir": "results/x"}, federated, bf16)
    assert "emulates" in warning and "results/x: fedmcp: precision bf16-mixed" in caplog.text
    assert cell_mod._emulated_bf16({"device": "cpu"}, federated, prec.Precision()) is None
    # on CUDA: asked where this process trains (in-process engine, a local regime), not for Ray's
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla T4")
    assert "Tesla T4" in cell_mod._emulated_bf16({"device": "cuda", "engine": "inprocess"}, federated, bf16)
    assert "Tesla T4" in cell_mod._emulated_bf16({"device": "auto"}, local, bf16)
    for engine in ("simulation", "deployment"):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: pytest.fail("asked"))
        assert cell_mod._emulated_bf16({"device": "cuda", "engine": engine}, federated, bf16) is None
