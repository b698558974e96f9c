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
