"""FedSUMM's client round around the step (``fedsumm.task.client_train_round`` and its helpers):
the batches' seeded order, what the round hands the local update, the received tensors' and
guidance's checks and the errors' names.

The step tests (``test_step_fedsumm.py``) check that a client round is one step of eq. 7's total
loss -- but their reference draws its batch with the task's own ``epoch_batches`` and the same
``where`` texts, so the mutation run of ``fedsumm.task`` (issue 24) left alive: another seed for
the batch shuffle (any argument of ``derive_seed`` dropped or changed), the number of local epochs
or the cell's precision not reaching ``fedsumm_local_update``, ``weight_decay``'s default, the
names of missing and unexpected tensors in the error, the round and client in the errors, and a
guidance without gradient.  Each is pinned here on the step tests' tiny Chinese BART.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections import OrderedDict

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from fedrepro.data.seq2seq import derive_seed
from fedrepro.io import InputError
from fedrepro.papers.fedsumm import task

import test_step_fedsumm as step  # noqa: E402

world = step.world  # the module fixture: three clients' files and the tiny backbone


def _cell(world, tmp_path, regime: str = "FedSUMM", optimizer: str = "sgd", **over) -> dict:
    return step._cell(world, tmp_path, "bart", regime, optimizer, **over)


# -- the batches --------------------------------------------------------------------------------
def test_epoch_batches_are_the_seeded_shuffle_of_seed_client_round_epoch(world, tmp_path):
    cell = _cell(world, tmp_path, train={"batch_size": 3})
    model, tok = task.build_model(cell), task.tokenizer(cell)
    records = tuple(step._records("csl-001", "train", 8, 0))  # 8! orders: seeds do not collide
    got = {}
    for name, r, e in (("csl-002", 3, 0), ("csl-002", 3, 1), ("csl-002", 4, 0), ("csl-003", 3, 0)):
        batches = task.epoch_batches(cell, model, tok, records, name, r)(e)
        g = torch.Generator().manual_seed(derive_seed(1, name, r, e, "fedsumm-batches"))
        order = torch.randperm(len(records), generator=g).tolist()
        assert [b["input_ids"].shape[0] for b in batches] == [3, 3, 2]
        for s, b in zip(range(0, 8, 3), batches):
            want = task.make_batch(cell, model, tok, [records[i] for i in order[s:s + 3]])
            for k in ("input_ids", "labels", "decoder_input_ids"):
                assert torch.equal(b[k], want[k]), (name, r, e, k)
        got[(name, r, e)] = order
    assert len({tuple(v) for v in got.values()}) == 4  # epoch, round and client each reorder
    # another cell seed, another order
    other = task.epoch_batches({**cell, "seed": 2}, model, tok, records, "csl-002", 3)(0)
    mine = task.epoch_batches(cell, model, tok, records, "csl-002", 3)(0)
    assert not all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(other, mine))


def test_a_generation_batch_has_no_targets(world, tmp_path):
    cell = _cell(world, tmp_path)
    model, tok = task.build_model(cell), task.tokenizer(cell)
    records = [{k: v for k, v in r.items() if k != "target"} for r in step._records("csl-001", "test", 2, 0)]
    batch = task.make_batch(cell, model, tok, records, with_targets=False)
    assert "labels" not in batch and "decoder_input_ids" not in batch
    assert batch["input_ids"].shape[0] == 2 and batch["unk_token_id"] == tok.unk_token_id


# -- what the round hands the local update -------------------------------------------------------
@pytest.mark.parametrize("precision, epochs, clip", [("fp32", 3, None), ("bf16-mixed", 2, 0.7)])
def test_the_round_hands_the_local_update_its_epochs_precision_and_clip(world, tmp_path, monkeypatch,
                                                                         precision, epochs, clip):
    cell = _cell(world, tmp_path, regime="FedAvg", precision=precision,
                 train={"local_epochs": epochs, "max_grad_norm": clip})
    seen = []
    real = task.fedsumm_local_update

    def spy(model, batches, loss_fn, optimizer, guidance, config, **kw):
        seen.append({"kw": kw, "loss_fn": loss_fn, "guidance": guidance, "torch_seed": torch.initial_seed(),
                     "n_batches": [len(batches(e)) for e in range(kw["local_epochs"])]})
        return real(model, batches, loss_fn, optimizer, guidance, config, **kw)

    monkeypatch.setattr(task, "fedsumm_local_update", spy)
    sent, stats, _ = task.client_train_round(cell, "csl-002", 2, step._start(cell))
    (call,) = seen
    assert call["kw"]["local_epochs"] == epochs
    assert call["kw"]["max_grad_norm"] == clip
    assert call["kw"]["precision"].mode == precision and call["kw"]["precision"].paper == "fedsumm"
    assert call["loss_fn"] is task.data_loss and call["guidance"] is None
    assert call["torch_seed"] == derive_seed(1, "csl-002", 2, "fedsumm-torch")
    assert stats["n_steps"] == epochs and stats["num_examples"] == 4 and stats["guided"] == 0


@pytest.mark.parametrize("optimizer, cls", [("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW)])
def test_weight_decay_defaults_to_none(world, tmp_path, optimizer, cls):
    cell = _cell(world, tmp_path, optimizer=optimizer)
    del cell["train"]["weight_decay"]
    model = task.build_model(cell)
    opt = task._optimizer(cell, model)
    assert isinstance(opt, cls)
    assert opt.param_groups[0]["weight_decay"] == 0.0 and opt.param_groups[0]["lr"] == step.LR
    cell["train"]["weight_decay"] = 0.013
    assert task._optimizer(cell, model).param_groups[0]["weight_decay"] == 0.013


# -- received tensors and guidance ---------------------------------------------------------------
def test_mismatched_tensors_are_named(world, tmp_path):
    cell = _cell(world, tmp_path)
    model = task.build_model(cell)
    state = task.shared_state(model)
    names = sorted(state)
    bad = OrderedDict((k, v) for k, v in state.items() if k not in names[:4])
    for extra in ("zz.a", "zz.b", "aa.c", "aa.d"):
        bad[extra] = torch.zeros(1)
    msg = (f"here: tensors do not match the model (missing {names[:3]}, unexpected "
           f"{['aa.c', 'aa.d', 'zz.a']})")
    with pytest.raises(InputError, match=re.escape(msg) + "$"):
        task.load_shared_state(model, bad, "here")
    # nothing missing: an empty list; nothing extra: likewise
    with pytest.raises(InputError, match=re.escape("(missing [], unexpected ['zz.a'])")):
        task.load_shared_state(model, {**state, "zz.a": torch.zeros(1)}, "here")
    with pytest.raises(InputError, match=re.escape(f"(missing {names[-1:]}, unexpected [])")):
        task.load_shared_state(model, {k: v for k, v in state.items() if k != names[-1]}, "here")


def test_the_rounds_errors_name_the_round_and_client(world, tmp_path):
    cell = _cell(world, tmp_path)
    state = step._start(cell)
    missing = OrderedDict(list(state.items())[1:])
    with pytest.raises(InputError, match=r"^round 4, client csl-002: tensors do not match"):
        task.client_train_round(cell, "csl-002", 4, missing)
    records = {task.GUIDANCE_CONFIG: ConfigRecord({"previous-loss": 1.0, "epsilon": 0.3, "has-gradient": False})}
    with pytest.raises(InputError, match=r"^round 4, client csl-002: record .* lacks 'rho'"):
        task.client_train_round(cell, "csl-002", 4, state, records)
    fedavg = _cell(world, tmp_path, regime="FedAvg")
    records = {task.GUIDANCE_CONFIG: ConfigRecord({"rho": 1.2, "previous-loss": 1.0, "epsilon": 0.3,
                                                   "has-gradient": False})}
    with pytest.raises(InputError, match=r"^round 4, client csl-001: a FedAvg client received FedSUMM guidance"):
        task.client_train_round(fedavg, "csl-001", 4, state, records)


def test_guidance_without_a_gradient(world, tmp_path):
    cell = _cell(world, tmp_path)
    model = task.build_model(cell)
    assert task.guidance_from_records(None, model, "w") is None
    assert task.guidance_from_records({}, model, "w") is None
    cfg = ConfigRecord({"rho": 1.25, "previous-loss": 2.5, "epsilon": 0.3, "has-gradient": False})
    g = task.guidance_from_records({task.GUIDANCE_CONFIG: cfg}, model, "w")
    assert g.modulated_gradient is None
    assert (g.rho, g.previous_loss, g.epsilon) == (1.25, 2.5, 0.3)
    with pytest.raises(InputError, match=r"^w: record .* came without"):
        task.guidance_from_records({task.GUIDANCE_ARRAYS: ArrayRecord()}, model, "w")
    cfg = ConfigRecord({"rho": 1.25, "previous-loss": 2.5, "epsilon": 0.3, "has-gradient": True})
    with pytest.raises(InputError, match=r"^w: has-gradient is set but record"):
        task.guidance_from_records({task.GUIDANCE_CONFIG: cfg}, model, "w")
    arrays = ArrayRecord(OrderedDict(sorted(task.shared_state(model).items())[1:]))
    with pytest.raises(InputError, match=r"^w: the modulated gradient's tensors do not match"):
        task.guidance_from_records({task.GUIDANCE_CONFIG: cfg, task.GUIDANCE_ARRAYS: arrays}, model, "w")
    full = task.shared_state(model)
    g = task.guidance_from_records({task.GUIDANCE_CONFIG: cfg, task.GUIDANCE_ARRAYS: ArrayRecord(full)},
                                   model, "w")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert list(g.modulated_gradient) == names and all(torch.equal(g.modulated_gradient[n], full[n]) for n in names)


def test_the_working_model_is_not_reused_across_backbone_folders(world, tmp_path, monkeypatch):
    """The resident working model's key names the backbone's folder and its identity, not only
    the resident object's ``id``: an id is reused once its object is freed (a backbone dropped from
    the resident cache), and a model built from another folder must not be lent out for it."""
    import shutil

    root, _ = world
    cell = step._cell(world, tmp_path, "bart", "FedSUMM", next(iter(step.DECAY)))
    other = tmp_path / "other_backbone"
    shutil.copytree(root / "backbone", other)
    same_object = task._backbone(str(root / "backbone"))
    monkeypatch.setattr(task, "_backbone", lambda folder: same_object)  # as if the id were reused
    key = task._working_key(cell)
    assert key == task._working_key(dict(cell))
    assert task._working_key({**cell, "backbone_dir": str(other)}) != key
    config = other / "config.json"
    before = task._working_key({**cell, "backbone_dir": str(other)})
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))  # rebuilt
    assert task._working_key({**cell, "backbone_dir": str(other)}) != before
