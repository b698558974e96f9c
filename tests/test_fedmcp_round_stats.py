"""What FedMCP's client round reports and the forward passes it relies on (``fedmcp.methods``).

The step tests (``test_step_fedmcp.py``) replay each method's round through the model's own
``forward`` and compare parameters, so the mutation run of ``fedmcp.methods`` (issue 24) left
alive what they cannot see: the round's statistics (the mean loss and loss parts are divided by the
step count, ``n_examples`` is one epoch's examples, the phases are named, the batches of each
epoch are asked for by epoch), a zero-epoch round, MOON's key check's text, an attention mask
dropped in the classifier models' forward, and LoRA's dropout following the train/eval mode.
Here each is checked on the step tests' tiny float64 RoBERTa and their padded batches.
"""

from __future__ import annotations

import dataclasses
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections import OrderedDict

import pytest
import torch

from fedrepro.papers.fedmcp import methods
from fedrepro.papers.fedmcp.methods import local_update

import test_step_fedmcp as step  # noqa: E402

PARTS = {"ce": {"L_ce"}, "fedmcp": {"L_a", "L_b", "L_c"}, "moon": {"L_ce", "L_con"}, "fedrep": {"L_ce"}}


@pytest.fixture
def losses(monkeypatch):
    """Every (phase, loss, parts) the round's steps computed, in order (``_run``'s loss_fn wrapped)."""
    seen: list[tuple[str, float, dict]] = []
    real = methods._run

    def run(model, params, batches, epochs, lr, loss_fn, stats, phase, timer, precision=None):
        def recorded(batch):
            loss, parts = loss_fn(batch)
            seen.append((phase, float(loss.detach()), dict(parts)))
            return loss, parts

        return real(model, params, batches, epochs, lr, recorded, stats, phase, timer, precision)

    monkeypatch.setattr(methods, "_run", run)
    return seen


def _batches():
    """Two epochs' batches of unequal sizes (5 and 3 examples), one call per epoch recorded."""
    full = step.make_batches(2)
    small = {k: v[:3] for k, v in full[1].items()}
    asked: list = []

    def batches(epoch):
        asked.append(epoch)
        return [full[0], small] if epoch == 0 else [small, full[0]]

    return batches, asked


@pytest.mark.parametrize("name", ["FedAvg-FT", "FedLR", "MOON", "FedRep", "FedMCP", "FedMCP-noLc"])
def test_the_rounds_statistics_are_means_over_its_steps(name, losses):
    model = step.build(name)
    spec = model.spec
    hp = dataclasses.replace(step.HP, epochs=2, head_epochs=1)
    batches, asked = _batches()
    received = model.shared_state() if spec.federated else None
    out = local_update(model, name, batches, hp, received)

    phases = [("head", 1), ("body", 2)] if spec.objective == "fedrep" else [("all", 2)]
    assert out["phases"] == phases
    assert [p for p, _, _ in losses] == [p for p, e in phases for _ in range(2 * e)]
    assert asked == [e for _, n in phases for e in range(n)]  # each epoch's batches, by epoch
    n = len(losses)
    assert out["n_steps"] == n
    assert out["n_examples"] == 8  # one epoch: 5 + 3 examples
    assert out["lr"] == (hp.full_ft_lr if spec.kind == "full_ft" else hp.lr)
    assert out["loss"] == pytest.approx(sum(loss for _, loss, _ in losses) / n, rel=1e-12)
    parts = PARTS[spec.objective]
    assert set(losses[0][2]) == parts and parts <= set(out)
    for k in parts:
        assert out[k] == pytest.approx(sum(p[k] for _, _, p in losses) / n, rel=1e-12), k
    if spec.objective == "fedmcp" and spec.mu == 0.0:  # noLc: no contrastive term at all
        assert all(p["L_c"] == 0.0 for _, _, p in losses)
    if spec.objective == "ce":
        assert all(p["L_ce"] == pytest.approx(loss, rel=1e-12) for _, loss, p in losses)


def test_a_round_without_epochs_trains_nothing_and_says_so(losses):
    model = step.build("FedMCP")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = local_update(model, "FedMCP", step.make_batches(1), dataclasses.replace(step.HP, epochs=0),
                       model.shared_state())
    assert (out["loss"], out["n_steps"], out["n_examples"], out["phases"]) == (0.0, 0, 0, [])
    assert losses == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_moon_refuses_a_previous_state_of_other_tensors():
    model = step.build("MOON")
    shared = model.shared_state()
    prev = OrderedDict(list(shared.items())[1:])
    prev["zz.extra"] = torch.zeros(1)
    first = next(iter(shared))
    msg = f"MOON previous-round state keys differ: missing ['{first}'], unexpected ['zz.extra']"
    with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
        local_update(model, "MOON", step.make_batches(1), step.HP, shared, prev)


@pytest.mark.parametrize("name", ["FedAvg-FT", "FedLR", "FedMCP"])
def test_padding_does_not_change_an_examples_logits(name):
    """Rows 1 and 3 of the step batches are padded: each row's logits equal those of the row
    alone without its padding (the attention mask reaches the encoder and the mean pooling)."""
    model = step.build(name).eval()
    b = step.make_batches(1)[0]
    with torch.no_grad():
        logits, _ = model(b["input_ids"], b["attention_mask"])
        for row in (1, 3):
            keep = b["attention_mask"][row].bool()
            alone, _ = model(b["input_ids"][row][keep][None], b["attention_mask"][row][keep][None])
            torch.testing.assert_close(logits[row], alone[0], rtol=1e-9, atol=1e-10)


def test_loras_dropout_follows_the_mode_and_the_backbone_stays_in_eval():
    model = step.build("FedLR")
    drops = [m for n, m in model.encoder.named_modules() if n.endswith("lora_dropout")]
    assert drops
    model.train()
    assert model.training and not model.encoder.training
    assert all(m.training for d in drops for m in d.modules())
    others = [m for n, m in model.encoder.named_modules()
              if "lora_dropout" not in n and isinstance(m, torch.nn.Dropout)]
    assert others and not any(m.training for m in others)
    model.eval()
    assert not any(m.training for d in drops for m in d.modules())


@pytest.mark.parametrize("name", ["MOON", "FedRep"])
def test_bf16_mixed_reaches_every_phase_of_the_round(name):
    """``precision: bf16-mixed`` runs the forward of every step under bf16 autocast (on the CPU
    too), so the round's trained tensors differ from fp32's -- in MOON's round and in both of
    FedRep's phases (the head-only run: head_epochs 1, epochs 0; the body-only: 0 and 1)."""
    for head_epochs, epochs in ((1, 0), (0, 1)):
        hp = dataclasses.replace(step.HP, head_epochs=head_epochs, epochs=epochs)
        if name == "MOON" and epochs == 0:
            continue
        out = {}
        for mode in ("fp32", "bf16-mixed"):
            model = step.build(name).float()
            received = model.shared_state()
            local_update(model, name, step.make_batches(2), hp, received, precision=mode)
            out[mode] = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
        moved = [k for k in out["fp32"] if not torch.equal(out["fp32"][k], out["bf16-mixed"][k])]
        assert moved, (name, head_epochs, epochs)


def test_hparams_epochs_are_integers_and_mismatched_shared_tensors_are_named():
    hp = methods.LocalHParams.from_config({"epochs": "2", "head_epochs": 3.0, "gamma": "0.25", "other": 1})
    assert (hp.epochs, hp.head_epochs, hp.gamma) == (2, 3, 0.25)
    assert type(hp.epochs) is int and type(hp.head_epochs) is int
    model = step.build("FedMCP")
    shared = model.shared_state()
    first = next(iter(shared))
    with pytest.raises(ValueError, match="^" + re.escape(f"FedMCP shared state keys differ: missing ['{first}']")):
        model.load_shared_state(OrderedDict(list(shared.items())[1:]))


@pytest.mark.parametrize("name", ["FedAvg-FT", "FedLR"])
def test_a_classifier_models_head_is_its_classification_layer(name):
    model = step.build(name)
    head = model.head_parameters()
    assert head and [id(p) for p in head] == [id(p) for p in model.head.parameters()]
