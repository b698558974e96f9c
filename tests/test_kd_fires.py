"""AdaFedSelecKD's KD at the method level, where the KD term actually fires.

With the default tiny test model the teacher's token entropy (about ln |V|) stays above τ = 5, so
the KD term never fires and a wrong KD method would pass the runner tests.  Here τ is chosen from
the teacher's own entropies so that it fires on every token, on none, or on part of them:
AdaFedSelectKD with τ above every entropy is AdaFedKD bit for bit; with τ between them it trains
a different adapter; and the teacher of round r is the server's aggregate of round r-1.
"""

from __future__ import annotations

import copy

import pytest
import torch

import helpers
from fedrepro.data.seq2seq import iterate_batches
from fedrepro.fl.cell import run_cell
from fedrepro.fl.checkpoint import checkpoint_paths, load_state
from fedrepro.papers.adafedseleckd import task
from fedrepro.papers.adafedseleckd.kd import token_entropy
from fedrepro.papers.adafedseleckd.model import AdapterSummarizer

CLIENT = "Academic"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("kd")
    folders = helpers.make_partitions(root / "data", sizes=(8, 2, 2))
    backbone = helpers.make_backbone(root)
    return root, folders, backbone


def _cell(world, method: str, name: str, tau: float, rounds: int = 1) -> dict:
    root, folders, backbone = world
    cell = helpers.make_cell(root, method, backbone, folders, rounds=rounds, out_name=name)
    cell["train"] = dict(cell["train"], tau=float(tau), lam=0.5)
    cell["engine"] = "inprocess"
    return cell


def _teacher_entropies(cell) -> torch.Tensor:
    """Entropy of the teacher (global adapter = W^1) on every target token of the client's data."""
    _, model = task.get_model(cell)
    model.load_adapter_state("global", task.initial_state(cell))
    pad, start = task.special_ids(model)
    out = []
    model.eval()
    for batch in iterate_batches(task.client_examples(cell, CLIENT, "train"), 4, pad, start, 0):
        _, teacher = model.path_logits(batch["input_ids"], batch["attention_mask"],
                                       batch["decoder_input_ids"], student="local", teacher="global")
        out.append(token_entropy(teacher)[batch["labels"] != -100])
    return torch.cat(out)


def _round(cell):
    """One client round from W^1 (round 1: teacher and student both start from the server's W^1)."""
    state, stats = task.client_train_round(cell, CLIENT, 1, task.initial_state(cell))
    return copy.deepcopy(state), stats


def test_selective_kd_fires_on_the_tokens_below_tau_and_equals_kd_above_all(world):
    probe = _cell(world, "AdaFedSelectKD", "probe", tau=5.0)
    ent = _teacher_entropies(probe)
    lo, hi = float(ent.min()), float(ent.max())
    assert hi > lo  # the entropies spread, so a τ between them splits the tokens
    mid = float(ent.median())

    kd_state, kd_stats = _round(_cell(world, "AdaFedKD", "kd", tau=5.0))  # τ ignored: ∞
    all_state, all_stats = _round(_cell(world, "AdaFedSelectKD", "sel-all", tau=hi + 1.0))
    none_state, none_stats = _round(_cell(world, "AdaFedSelectKD", "sel-none", tau=lo - 1.0))
    part_state, part_stats = _round(_cell(world, "AdaFedSelectKD", "sel-part", tau=mid))

    assert kd_stats["kd_fraction"] == 1.0 and kd_stats["n_kd_tokens"] == kd_stats["n_tokens"] > 0
    assert all_stats["kd_fraction"] == 1.0
    assert none_stats["kd_fraction"] == 0.0
    # τ = the median entropy: the tokens strictly below it (entropies are continuous: about half)
    assert 0.0 < part_stats["kd_fraction"] < 1.0
    assert part_stats["n_kd_tokens"] == int((ent < mid).sum())
    # τ above every entropy distils every token: AdaFedKD, bit for bit
    assert all(torch.equal(all_state[k], kd_state[k]) for k in kd_state)
    # on the same batches, distilling part of the tokens trains a different adapter than all / none
    assert any(not torch.equal(part_state[k], kd_state[k]) for k in kd_state)
    assert any(not torch.equal(part_state[k], none_state[k]) for k in kd_state)
    assert any(not torch.equal(none_state[k], kd_state[k]) for k in kd_state)


def test_the_teacher_of_round_r_is_the_servers_aggregate_of_round_r_minus_1(world, monkeypatch):
    cell = _cell(world, "AdaFedSelectKD", "teacher", tau=1e9, rounds=3)
    cell["keep_round_checkpoints"] = True
    loaded: list[tuple[int, dict]] = []
    original = AdapterSummarizer.load_adapter_state
    current_round = {"r": 0}
    train_round = task.client_train_round

    def spy_round(cell_, client, round_index, server_state, **kw):
        current_round["r"] = round_index
        return train_round(cell_, client, round_index, server_state, **kw)

    def spy_load(self, role, state):
        if role == "global":
            loaded.append((current_round["r"], {k: v.clone() for k, v in state.items()}))
        return original(self, role, state)

    # built (and cached) before the spies: building it loads W^1 into both roles, which counted
    # as one more "global" load of round 1 when this test ran first (alone, or early in a
    # mutation run's test order)
    task.get_model(cell)
    monkeypatch.setattr(task, "client_train_round", spy_round)
    monkeypatch.setattr(AdapterSummarizer, "load_adapter_state", spy_load)
    out = cell["out_dir"]
    run_cell(cell, f"{out}/adapters.safetensors", f"{out}/train_log.json", f"{out}/provenance.json")
    by_round: dict[int, list[dict]] = {}
    for r, state in loaded:
        by_round.setdefault(r, []).append(state)
    assert sorted(by_round) == [1, 2, 3] and all(len(v) == 3 for v in by_round.values())
    w1 = task.initial_state(cell)
    assert all(torch.equal(s[k], w1[k]) for s in by_round[1] for k in w1)
    for r in (2, 3):
        aggregate = load_state(checkpoint_paths(out, r - 1)[0])
        for state in by_round[r]:
            assert set(state) == set(aggregate)
            assert all(torch.equal(state[k], aggregate[k]) for k in aggregate)
    # and the KD term fired in every round (τ above every entropy)
    import json

    log = json.loads(open(f"{out}/train_log.json").read())
    assert all(c["kd_fraction"] == 1.0 for e in log["rounds"] for c in e["clients"])


@pytest.mark.parametrize("start", ["persistent", "aggregate"])
def test_local_start_reads_algorithm_1_either_way(world, monkeypatch, start):
    """``train.local_start``: the local adapter of round 2 starts from the client's own round-1
    adapter (persistent, default) or from the server's aggregate W^2 (aggregate: Algorithm 1,
    line 4 literally)."""
    cell = _cell(world, "AdaFedSelectKD", f"start-{start}", tau=1e9, rounds=2)
    cell["train"]["local_start"] = start
    cell["keep_round_checkpoints"] = True
    loaded: list[tuple[int, str, dict]] = []
    original = AdapterSummarizer.load_adapter_state
    current = {"r": 0, "client": None}
    train_round = task.client_train_round

    def spy_round(cell_, client, round_index, server_state, **kw):
        current.update(r=round_index, client=client)
        return train_round(cell_, client, round_index, server_state, **kw)

    def spy_load(self, role, state):
        if role == "local":
            loaded.append((current["r"], current["client"], {k: v.clone() for k, v in state.items()}))
        return original(self, role, state)

    # built (and cached) before the spies: building it loads W^1 into both roles, which counted
    # as one more "global" load of round 1 when this test ran first (alone, or early in a
    # mutation run's test order)
    task.get_model(cell)
    monkeypatch.setattr(task, "client_train_round", spy_round)
    monkeypatch.setattr(AdapterSummarizer, "load_adapter_state", spy_load)
    out = cell["out_dir"]
    run_cell(cell, f"{out}/adapters.safetensors", f"{out}/train_log.json", f"{out}/provenance.json")
    aggregate = load_state(checkpoint_paths(out, 1)[0])
    second = [(c, s) for r, c, s in loaded if r == 2]
    assert len(second) == 3
    for client, state in second:
        own = load_state(task.client_state_path(cell, client, 1))
        expected = aggregate if start == "aggregate" else own
        assert all(torch.equal(state[k], expected[k]) for k in expected)
        assert any(not torch.equal(own[k], aggregate[k]) for k in own)  # the two readings differ


def test_bad_local_start_names_the_key(world):
    cell = _cell(world, "AdaFedSelectKD", "bad-start", tau=5.0)
    cell["train"]["local_start"] = "fresh"
    with pytest.raises(Exception, match="adafedseleckd.train.local_start"):
        task.client_train_round(cell, CLIENT, 2, task.initial_state(cell))
