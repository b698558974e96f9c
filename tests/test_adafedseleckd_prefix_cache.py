"""AdaFedSelecKD's frozen-prefix cache (issue 16): byte-identical adapters with an fp32 cache,
keys, invalidation, budget, and the backbone_dropout interaction."""

from __future__ import annotations

import logging
from collections import OrderedDict

import helpers
import pytest
import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    LEDConfig,
    LEDForConditionalGeneration,
)

from fedrepro.data.seq2seq import collate
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd.methods import (
    METHODS,
    TrainHParams,
    local_update,
    make_optimizer,
)
from fedrepro.papers.adafedseleckd.model import AdapterSummarizer, initial_adapter_state
from fedrepro.papers.adafedseleckd.prefix_cache import (
    PrefixCache,
    backbone_fingerprint,
    example_lengths,
    prefix_cache_settings,
)

PAD, START = 1, 2


def _model(roles=("global", "local"), seed: int = 0, family: str = "bart") -> AdapterSummarizer:
    torch.manual_seed(seed)
    sizes = {"vocab_size": 120, "d_model": 32, "encoder_layers": 2, "decoder_layers": 3,
                 "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
                 "decoder_ffn_dim": 64, "pad_token_id": PAD, "decoder_start_token_id": START}
    if family == "led":
        backbone = LEDForConditionalGeneration(LEDConfig(
            **sizes, max_encoder_position_embeddings=128, max_decoder_position_embeddings=64,
            attention_window=[8, 8]))
    else:
        backbone = BartForConditionalGeneration(BartConfig(**sizes, max_position_embeddings=64))
    model = AdapterSummarizer(backbone, 2, 16, roles)
    init = initial_adapter_state(32, 16, 2, seed=7)
    for role in roles:
        model.load_adapter_state(role, init)
    # the global (teacher) adapter differs from the local one, so KD has something to distil
    model.load_adapter_state("global", OrderedDict((k, v + 0.05) for k, v in init.items())) \
        if "global" in roles else None
    return model


def _examples(n: int = 7, seed: int = 0) -> list[dict]:
    """Examples of different lengths, so every batch pads and re-shuffled batches pad differently."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        s, t = 5 + 3 * i, 3 + (i * 5) % 9
        out.append({"id": f"e{i}", "input_ids": torch.randint(5, 120, (s,), generator=g).tolist(),
                    "labels": torch.randint(5, 120, (t,), generator=g).tolist()})
    return out


def _train(model, cache, examples, rounds: int = 2, epochs: int = 2, method: str = "AdaFedSelectKD"):
    """``rounds`` local updates of ``epochs`` epochs (fresh AdamW each round, as the clients do);
    returns the trained local adapter."""
    hp = TrainHParams(lr=5e-3, weight_decay=0.01, batch_size=3, local_epochs=epochs, lam=0.2, tau=5.0)
    spec = METHODS[method]
    for r in range(1, rounds + 1):
        torch.manual_seed(11)
        local_update(model, spec, examples, hp, make_optimizer(model, hp), 3, "client-a", r, PAD,
                     START, prefix_cache=cache)
    return model.adapter_state("local")


def _assert_byte_identical(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k, v in a.items():
        assert v.dtype == b[k].dtype and v.shape == b[k].shape
        assert v.numpy().tobytes() == b[k].numpy().tobytes(), k


@pytest.mark.parametrize("method", ["AdaFedSelectKD", "AdaFedAvg"])
def test_fp32_prefix_cache_trains_byte_identical_adapters(method):
    """The issue's byte-identity test: a few steps on a tiny BART, two rounds of two epochs (the
    batches re-shuffled and re-padded every epoch), fp32 cache vs prefix_cache off."""
    examples = _examples()
    roles = METHODS[method].roles
    uncached = _train(_model(roles), PrefixCache("off", 0), examples, method=method)
    cache = PrefixCache("fp32", 1 << 30)
    cached = _train(_model(roles), cache, examples, method=method)
    _assert_byte_identical(uncached, cached)
    assert cache.misses == len(examples)  # each example's prefix computed once, in epoch 1
    assert cache.hits == 2 * 2 * len(examples) - len(examples)
    # training moved the adapter (W_up starts at zero)
    assert not torch.equal(uncached["layers.0.up.weight"], torch.zeros_like(uncached["layers.0.up.weight"]))


def test_a_client_over_the_budget_trains_uncached_with_a_log_line_and_the_same_bits(caplog):
    examples = _examples()
    reference = _train(_model(), PrefixCache("off", 0), examples)
    cache = PrefixCache("fp32", 1000)  # bytes: far below 7 examples x (S + T) x 32 x 4
    with caplog.at_level(logging.INFO, logger="fedrepro.papers.adafedseleckd.prefix_cache"):
        got = _train(_model(), cache, examples)
    assert "prefix cache off for client client-a" in caplog.text
    assert "prefix_cache_budget_mb" in caplog.text
    assert cache.hits == 0 and cache.used == 0
    _assert_byte_identical(reference, got)


@pytest.mark.parametrize("family", ["bart", "led"])
def test_the_canonical_prefix_matches_the_padded_batch_prefix_numerically(family):
    """Per-example prefix, zero-padded and re-assembled, gives the padded batch's logits at every
    real target position (to float rounding: the two differ only in reduction order)."""
    model = _model(family=family)
    examples = _examples(4)
    batch = collate(examples, PAD, START)
    cache = PrefixCache("fp32", 1 << 30)
    cache.begin(model, "c", examples)
    prefix = cache.batch_prefix(model, batch, batch)
    args = (batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"])
    s_ref, t_ref = model.path_logits(*args, teacher="global")
    s_got, t_got = model.path_logits(*args, teacher="global", prefix=prefix)
    real = batch["labels"] != -100
    assert torch.allclose(s_ref[real], s_got[real], atol=1e-5)
    assert torch.allclose(t_ref[real], t_got[real], atol=1e-5)
    assert torch.isfinite(s_got).all()
    assert example_lengths(batch) == [(len(e["input_ids"]), len(e["labels"])) for e in examples]


def test_bf16_cache_halves_the_bytes_and_stays_close():
    examples = _examples()
    fp32, bf16 = PrefixCache("fp32", 1 << 30), PrefixCache("bf16", 1 << 30)
    init = _model().adapter_state("local")
    a = _train(_model(), fp32, examples, rounds=1)
    b = _train(_model(), bf16, examples, rounds=1)
    assert bf16.used * 2 == fp32.used
    assert any(not torch.equal(a[k], b[k]) for k in a)  # lossy
    # the bf16 run's update is the fp32 run's to within 30 % (Adam's normalised steps amplify
    # small gradient differences on a 4-step run; ~10 % measured here)
    moved = torch.cat([(a[k] - init[k]).flatten() for k in a]).norm()
    apart = torch.cat([(a[k] - b[k]).flatten() for k in a]).norm()
    assert apart < 0.3 * moved


def test_a_changed_backbone_or_example_invalidates_the_cache(caplog):
    model = _model()
    examples = _examples(3)
    batch = collate(examples, PAD, START)
    cache = PrefixCache("fp32", 1 << 30)
    cache.begin(model, "c", examples)
    cache.batch_prefix(model, batch, batch)
    assert len(cache._store) == 3 and cache.misses == 3
    fingerprint = backbone_fingerprint(model.backbone)
    # the same backbone and examples: all hits
    cache.begin(model, "c", examples)
    cache.batch_prefix(model, batch, batch)
    assert cache.hits == 3
    # a backbone weight changed in place (a checkpoint load): the cache is emptied
    with torch.no_grad():
        model.backbone.get_encoder().layers[0].fc1.weight[0, 0] += 1.0
    assert backbone_fingerprint(model.backbone) != fingerprint
    with caplog.at_level(logging.INFO, logger="fedrepro.papers.adafedseleckd.prefix_cache"):
        cache.begin(model, "c", examples)
    assert "the backbone changed" in caplog.text and len(cache._store) == 0
    cache.batch_prefix(model, batch, batch)
    assert cache.misses == 6
    # a changed example: a new key; the old entry of the client is dropped at its next round
    # (a changed first target token: the decoder input ids are the labels shifted right)
    first = examples[0]["labels"]
    changed = [dict(examples[0], labels=[first[0] % 100 + 7] + first[1:])] + examples[1:]
    cache.begin(model, "c", changed)
    assert len(cache._store) == 2
    b2 = collate(changed, PAD, START)
    cache.batch_prefix(model, b2, b2)
    assert cache.misses == 7 and cache.hits == 5


def test_another_backbone_object_is_fingerprinted_even_where_everything_else_matches(monkeypatch, caplog):
    """A new backbone (another cell's, loaded after the old one was freed) may get the old one's
    ``id`` and, freshly loaded, the same tensor versions: it must still be fingerprinted, not
    served the old backbone's prefixes."""
    from fedrepro.papers.adafedseleckd import prefix_cache

    examples = _examples(3)
    model, other = _model(), _model()
    with torch.no_grad():  # other weights, equal tensor versions after a reset of the counters
        other.backbone.get_encoder().layers[0].fc1.weight.add_(1.0)
    monkeypatch.setattr(prefix_cache, "_versions", lambda backbone: (0,))  # as freshly loaded
    monkeypatch.setattr(prefix_cache, "id", lambda obj: 1, raising=False)  # as a reused id
    cache = PrefixCache("fp32", 1 << 30)
    batch = collate(examples, PAD, START)
    cache.begin(model, "c", examples)
    cache.batch_prefix(model, batch, batch)
    assert len(cache._store) == 3
    with caplog.at_level(logging.INFO, logger="fedrepro.papers.adafedseleckd.prefix_cache"):
        cache.begin(other, "c", examples)
    assert "the backbone changed" in caplog.text and len(cache._store) == 0


def test_the_budget_evicts_other_clients_first():
    model = _model()
    a, b = _examples(3, seed=1), _examples(3, seed=2)
    per_client = sum((len(e["input_ids"]) + len(e["labels"])) * 32 * 4 for e in a)
    cache = PrefixCache("fp32", per_client + 64)  # room for one client's examples
    for name, ex in (("a", a), ("b", b)):
        cache.begin(model, name, ex)
        assert cache.active
        batch = collate(ex, PAD, START)
        cache.batch_prefix(model, batch, batch)
    assert set(cache._client_keys) == {"b"} and cache.used <= cache.budget


def test_prefix_cache_settings_refuse_a_cache_with_backbone_dropout():
    assert prefix_cache_settings({"prefix_cache": "fp32", "prefix_cache_budget_mb": 2,
                                  "backbone_dropout": False}) == ("fp32", 2 * 2**20)
    assert prefix_cache_settings({"backbone_dropout": True}) == ("off", 0)
    with pytest.raises(InputError, match="prefix_cache: bf16 needs adafedseleckd.train.backbone_dropout: false"):
        prefix_cache_settings({"prefix_cache": "bf16", "backbone_dropout": True})
    with pytest.raises(InputError, match="must be one of"):
        prefix_cache_settings({"prefix_cache": "fp16"})
    with pytest.raises(InputError, match="prefix_cache_budget_mb"):
        prefix_cache_settings({"prefix_cache": "fp32", "prefix_cache_budget_mb": -1})


def test_client_rounds_of_a_cell_are_byte_identical_with_the_cache(tmp_path):
    """Through the clients' entry point (client_train_round): an fp32-cache cell and an uncached
    one (both backbone_dropout false) send the same bytes, round after round; a cache with the
    backbone's dropout on is refused naming both keys."""
    from fedrepro.papers.adafedseleckd import task

    folders = helpers.make_partitions(tmp_path / "data")
    backbone = helpers.make_backbone(tmp_path)
    sent = {}
    for mode in ("off", "fp32"):
        cell = helpers.make_cell(tmp_path, "AdaFedSelectKD", backbone, folders, out_name=mode)
        cell["train"] |= {"backbone_dropout": False, "prefix_cache": mode, "local_epochs": 2,
                          "prefix_cache_budget_mb": 64}
        server = task.initial_state(cell)
        for r in (1, 2):
            states = [task.client_train_round(cell, c, r, server)[0] for c in cell["clients"]]
            sent[mode, r] = states
            server = OrderedDict((k, sum(s[k] for s in states) / len(states)) for k in states[0])
    for r in (1, 2):
        for off, fp32 in zip(sent["off", r], sent["fp32", r]):
            _assert_byte_identical(off, fp32)
    _, model = task.get_model(cell)
    store = task.prefix_store(cell, model)
    assert store.hits > 0 and store.used > 0
    cell["train"] |= {"backbone_dropout": True}
    with pytest.raises(InputError, match="backbone_dropout"):
        task.client_train_round(cell, cell["clients"][0], 1, task.initial_state(cell))


def test_prefix_store_needs_a_backbone_with_per_example_prefixes():
    """LongT5 (position biases handed up the decoder): no cache; with prefix_cache off its batch
    prefix is computed per padded batch as before."""
    from types import SimpleNamespace

    from fedrepro.papers.adafedseleckd import task

    longt5 = SimpleNamespace(backbone_dropout=False, supports_example_prefix=False,
                             backbone=SimpleNamespace())
    cell = {"train": {"backbone_dropout": False, "prefix_cache": "fp32"}}
    with pytest.raises(InputError, match="supports BART and LED"):
        task.prefix_store(cell, longt5)
    assert task.prefix_store({"train": {"backbone_dropout": False}}, longt5) is None
    bart = _model()
    assert task.prefix_store({"train": {"backbone_dropout": False}}, bart).mode == "off"
    bart.backbone_dropout = True
    assert task.prefix_store({"train": {"backbone_dropout": True}}, bart) is None


def test_config_validation_names_both_keys_when_a_cache_meets_backbone_dropout():
    from helpers import ROOT, configs

    from fedrepro.config import validate_config

    for cfg in configs():  # both configs: dropout on, cache off
        assert cfg["adafedseleckd"]["train"]["prefix_cache"] == "off"
        assert cfg["adafedseleckd"]["train"]["backbone_dropout"] is True
        validate_config(cfg, ROOT / "config" / "schema.yaml")
    cfg = configs()[0]
    cfg["adafedseleckd"]["train"]["prefix_cache"] = "fp32"
    with pytest.raises(InputError) as err:
        validate_config(cfg, ROOT / "config" / "schema.yaml")
    assert "adafedseleckd.train.prefix_cache (fp32)" in str(err.value)
    assert "adafedseleckd.train.backbone_dropout (true)" in str(err.value)
    cfg["adafedseleckd"]["train"]["backbone_dropout"] = False
    validate_config(cfg, ROOT / "config" / "schema.yaml")
    cfg["adafedseleckd"]["train"]["prefix_cache"] = False  # YAML's unquoted off
    with pytest.raises(InputError, match="prefix_cache"):
        validate_config(cfg, ROOT / "config" / "schema.yaml")
