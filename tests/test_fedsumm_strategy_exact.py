"""FedSUMM's Flower server (:class:`fedrepro.papers.fedsumm.strategy.FedSummStrategy`) driven round
by round through the runner's ``configure_train`` / ``aggregate_train`` -- as Flower calls them --
with a fake grid answering the evaluation messages: the round log (ρ per client and its mean, the
participants, the step losses, the guidance bytes, the pooled evaluation), the DP aggregation
hook (C_t, its seeded noise, ε after round t, C_{t+1} carried to the next round and read back on a
resume), and the server state saved every round: a run resumed from round 1's state gives the
same round 2 (model and guidance) as the uninterrupted run; older states are pruned.

Clients c1, c2, c3 hold 1, 4 and 9 examples (Algorithm 1 does not weight by them); the updates and
losses are test_step_fedsumm's, whose hand computation of eq. 5-6 gives ρ here.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict

from fedrepro.data.seq2seq import derive_seed
from fedrepro.fl.checkpoint import checkpoint_paths
from fedrepro.fl.dp import dp_adaptive_clip_mean, dp_median_clip_mean
from fedrepro.fl.privacy import DPSettings, epsilon_per_round
from fedrepro.io import InputError
from fedrepro.papers.fedsumm import strategy as fs
from fedrepro.papers.fedsumm import task
from test_step_fedsumm import (
    ALGORITHM, LOSSES, SERVER_EPS, SIZES, UPDATES, W0, _arrays, _close, _flat, _hand_server,
)

NODES = {0: 11, 1: 12, 2: 13}
# evaluation answers per partition: NLL sum, tokens, split, ROUGE-L sum, test examples
EVAL = {0: (6.0, 4, 1, 0.5, 1), 1: (3.0, 2, 0, 1.25, 3), 2: (9.0, 6, 1, 2.0, 4)}


class Grid:
    """Answers the strategy's evaluation messages (``evaluate_global``) and records them."""

    def __init__(self, fail: bool = False):
        self.sent: list[Message] = []
        self.fail = fail
        self.timeouts: list = []

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        self.sent.extend(messages)
        self.timeouts.append(timeout)
        out = []
        for m in messages:
            pid = {v: k for k, v in NODES.items()}[m.metadata.dst_node_id]
            nll, tokens, val, rouge, n = EVAL[pid]
            if self.fail == "error" and pid in (1, 2):  # partitions 1 and 2 answer with an error
                out.append(Message(Error(code=0, reason=f"client {pid} broke"), reply_to=m))
                continue
            if self.fail and pid == 1:
                continue  # partition 1 never answers
            out.append(Message(RecordDict({"metrics": MetricRecord({
                "partition-id": pid, "nll-sum": nll, "tokens": tokens, "split-is-val": val,
                "rougeL-sum": rouge, "test-examples": n})}), reply_to=m))
        return out


def _cell(regime: str, dp: dict | None = None, **over) -> dict:
    cell = {"regime": regime, "algorithm": dict(ALGORITHM), "clients": list(SIZES),
            "clients_per_round": None, "dp": dp or {"enabled": False}, "train": {"rounds": 3},
            "keep_round_checkpoints": False}
    cell.update(over)
    return cell


def _strategy(cell: dict, out: Path, offset: int = 0) -> fs.FedSummStrategy:
    s = fs.make_strategy(cell, out_dir=out, round_offset=offset, expected_clients=3, seed=5,
                         fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=3,
                         min_evaluate_nodes=0, min_available_nodes=3,
                         weighted_by_key="num-examples")
    s._node_of = dict(NODES)
    return s


def _train(s, server_round: int, t: int, w_t: dict, grid: Grid, steps: bool = True,
           gradient=None):
    """One whole round: configure_train, the clients' replies (w_t + Δ^c of round t), then
    aggregate_train (aggregation, round log, checkpoint, server state)."""
    msgs = s.configure_train(server_round, _arrays(w_t), ConfigRecord({"cell": '{"x": 1}'}), grid)
    by_pid = {pid: m for m in msgs for pid, node in NODES.items() if m.metadata.dst_node_id == node}
    replies = []
    for pid, c in enumerate(SIZES):
        if pid not in by_pid:
            continue
        params = {k: [a + d for a, d in zip(w_t[k], UPDATES[t][c][k])] for k in w_t}
        content = {"arrays": _arrays(params),
                   "metrics": MetricRecord({"partition-id": pid, "num-examples": SIZES[c],
                                            "train-loss": LOSSES[t][c]})}
        if steps and pid == 1:
            content[task.REPLY_STEPS] = ConfigRecord({"step-losses": [1.5, 0.25]})
        if gradient is not None:
            content[task.REPLY_GRADIENT] = _arrays(gradient(t, c))
        replies.append(Message(RecordDict(content), reply_to=by_pid[pid]))
    arrays, metrics = s.aggregate_train(server_round, replies[::-1])  # any arrival order
    got = {k: v.reshape(-1).double().tolist() for k, v in arrays.to_torch_state_dict().items()}
    meta = json.loads(checkpoint_paths(s.out_dir, server_round + s.round_offset)[1].read_text())
    return by_pid, got, metrics, meta


def test_round_log_rho_steps_guidance_bytes_and_pooled_evaluation(task_identity, tmp_path):
    want_w, want_rho = _hand_server(2)
    s = _strategy(_cell("FedSUMM"), tmp_path / "run")
    grid = Grid()
    _, w1, m1, meta = _train(s, 1, 1, _flat(W0), grid)
    for k in w1:
        _close(w1[k], want_w[0][k])
    rho = {c: sum(want_rho[0][c].values()) / 2 for c in SIZES}
    assert meta["regime"] == "FedSUMM" and meta["participants"] == list(SIZES)
    assert meta["rho"] == pytest.approx(rho, rel=1e-6)
    assert meta["rho_mean"] == pytest.approx(sum(rho.values()) / 3, rel=1e-6)
    assert set(meta["rho_statistics"]) == set(SIZES)
    assert meta["step_losses"] == {"c2": [1.5, 0.25]}
    assert meta["guidance_bytes_down"] == 0  # round 1: nobody has guidance yet
    assert meta["fedsumm"]["losses"] == pytest.approx(LOSSES[1])
    assert set(meta["fedsumm"]) == {"memory_order", "losses", "gradient_norms", "modulated",
                                    "memory_source"}
    assert "dp" not in meta
    # FedSUMM's step against FedAvg's on the same replies: Δ_S = w_1 − w_0, Δ_A = mean Δ^c
    w0 = _flat(W0)
    d_a = {k: [sum(UPDATES[1][c][k][i] for c in SIZES) / 3 for i in range(len(w0[k]))] for k in w0}
    a2 = sum(v * v for k in d_a for v in d_a[k])
    d2 = sum((want_w[0][k][i] - w0[k][i] - d_a[k][i]) ** 2 for k in d_a for i in range(len(d_a[k])))
    diff = meta["update_difference"]
    assert diff["norm_fedavg"] == pytest.approx(math.sqrt(a2), rel=1e-6)
    assert diff["rel_diff"] == pytest.approx(math.sqrt(d2 / a2), rel=1e-4)
    assert "rel_diff_vs_rank" in diff
    assert m1["num-clients"] == 3
    assert m1["train-loss"] == pytest.approx(sum(LOSSES[1].values()) / 3)
    # evaluation of w_1 on every client: exp(Σ NLL / Σ tokens), ROUGE-L per test example
    ev = meta["evaluation"]
    assert ev["perplexity"] == pytest.approx(math.exp(18.0 / 12))
    assert ev["rougeL"] == pytest.approx(3.75 / 8)
    assert ev["per_client"]["c1"]["perplexity"] == pytest.approx(math.exp(1.5))
    assert ev["per_client"]["c2"]["perplexity_split"] == "test"
    assert ev["per_client"]["c3"]["perplexity_split"] == "val"
    assert ev["per_client"]["c3"]["test_examples"] == 4
    assert ev["per_client"]["c2"]["rougeL_sum"] == pytest.approx(1.25)
    evals = grid.sent
    assert len(evals) == 3 and all(m.metadata.message_type == MessageType.EVALUATE for m in evals)
    assert sorted(m.metadata.dst_node_id for m in evals) == [11, 12, 13]
    cfg = evals[0].content["config"]
    assert cfg["cell"] == '{"x": 1}' and cfg["round-offset"] == 0 and cfg["server-round"] == 1
    sent_w = {k: v.reshape(-1).double().tolist()
              for k, v in evals[0].content["arrays"].to_torch_state_dict().items()}
    for k in w1:
        _close(sent_w[k], want_w[0][k])
    # round 2: each client gets g̃ (10 float32 entries) -- 3·40 guidance bytes on the downlink
    assert grid.timeouts == [s.timeout]
    sent2, w2, _, meta2 = _train(s, 2, 2, w1, grid, steps=False)
    assert all(sent2[p].content[task.GUIDANCE_CONFIG]["round"] == 2 for p in NODES)
    for k in w2:
        _close(w2[k], want_w[1][k], tol=1e-5)
    assert meta2["guidance_bytes_down"] == 120
    assert meta2["bytes_down"] == 3 * 40 + 120
    assert meta2["step_losses"] == {}
    assert grid.sent[-1].content["config"]["server-round"] == 2


def test_evaluation_without_an_answer_stops_the_round(task_identity, tmp_path):
    s = _strategy(_cell("FedAvg"), tmp_path / "run")
    with pytest.raises(RuntimeError, match="evaluation failed"):
        _train(s, 1, 1, _flat(W0), Grid(fail=True))
    failure = json.loads((tmp_path / "run" / "checkpoints" / "failure.json").read_text())
    assert failure["round"] == 1 and failure["reason"].startswith("evaluation: ")
    assert "partition(s) [1]" in failure["reason"]
    # clients that answer with an error: their reasons, in partition order
    s = _strategy(_cell("FedAvg"), tmp_path / "run2")
    with pytest.raises(RuntimeError, match="round 1 evaluation failed: client 1 broke; client 2 broke$"):
        _train(s, 1, 1, _flat(W0), Grid(fail="error"))
    failure = json.loads((tmp_path / "run2" / "checkpoints" / "failure.json").read_text())
    assert failure == {"round": 1, "reason": "client 1 broke; client 2 broke"}


def test_zero_tokens_give_no_perplexity_and_infinite_numbers_become_null(task_identity, tmp_path):
    assert fs._jsonable({1: [float("inf"), 2.5, (float("nan"), "x")], "k": {"v": 3}}) == {
        "1": [None, 2.5, [None, "x"]], "k": {"v": 3}}
    s = _strategy(_cell("FedAvg"), tmp_path / "run")
    grid = Grid()
    old = EVAL[0]
    EVAL[0] = (0.0, 0, 1, 0.5, 1)
    try:
        _, _, _, meta = _train(s, 1, 1, _flat(W0), grid)
    finally:
        EVAL[0] = old
    assert meta["evaluation"]["per_client"]["c1"]["perplexity"] is None
    assert meta["evaluation"]["perplexity"] == pytest.approx(math.exp(12.0 / 8))
    assert "fedsumm" not in meta and "update_difference" not in meta  # FedAvg: no memory
    assert meta["participants"] == list(SIZES) and set(meta["rho_statistics"]) == set(SIZES)
    assert s.server.losses == pytest.approx(LOSSES[1])


@pytest.mark.parametrize("regime,storage", [("FedSUMM", "memory"), ("FedAvg", "memory"),
                                            ("FedSUMM", "disk")])
def test_resume_from_the_saved_server_state_gives_the_same_round(task_identity, tmp_path, regime,
                                                                 storage):
    """Uninterrupted: rounds 1, 2.  Resumed: round 1, then a new strategy with round_offset 1 (the
    runner's resume) loads round 1's server state and runs round 2: same w_2 and same guidance."""
    st = {"server_state": {"storage": storage}}
    a = _strategy(_cell(regime, **st), tmp_path / "a")
    _, w1, _, _ = _train(a, 1, 1, _flat(W0), Grid())
    sent_a, w2_a, _, meta_a = _train(a, 2, 2, w1, Grid())
    b = _strategy(_cell(regime, **st), tmp_path / "b")
    _, w1_b, _, _ = _train(b, 1, 1, _flat(W0), Grid())
    assert fs.server_state_path(tmp_path / "b", 1).exists()
    if storage == "disk":  # a killed run's file written after round 1 is collected on resume
        stray = fs.server_state_dir(tmp_path / "b") / "stray.pt"
        files = sorted(p.name for p in fs.server_state_dir(tmp_path / "b").iterdir())
        assert files
        torch.save(torch.zeros(1), stray)
    resumed = _strategy(_cell(regime, **st), tmp_path / "b", offset=1)
    if storage == "disk":
        assert sorted(p.name for p in fs.server_state_dir(tmp_path / "b").iterdir()) == files
    grid_b = Grid()
    sent_b, w2_b, _, meta_b = _train(resumed, 1, 2, w1_b, grid_b)
    cfg = grid_b.sent[0].content["config"]
    assert cfg["server-round"] == 1 and cfg["round-offset"] == 1
    assert w2_b == w2_a
    assert meta_b["round"] == 2 and meta_b["rho"] == meta_a["rho"]
    assert meta_b["guidance_bytes_down"] == meta_a["guidance_bytes_down"]
    for pid in NODES:
        assert set(sent_b[pid].content.keys()) == set(sent_a[pid].content.keys())
        if regime == "FedSUMM":
            ga = sent_a[pid].content[task.GUIDANCE_ARRAYS].to_torch_state_dict()
            gb = sent_b[pid].content[task.GUIDANCE_ARRAYS].to_torch_state_dict()
            assert all(torch.equal(ga[k], gb[k]) for k in ga)
            assert dict(sent_b[pid].content[task.GUIDANCE_CONFIG]) == dict(
                sent_a[pid].content[task.GUIDANCE_CONFIG])
    with pytest.raises(InputError, match="server state of round 4 is missing"):
        _strategy(_cell(regime), tmp_path / "b", offset=4)


@pytest.mark.parametrize("keep", [False, True])
def test_older_server_states_are_pruned_unless_kept(task_identity, tmp_path, keep):
    s = _strategy(_cell("FedSUMM", keep_round_checkpoints=keep), tmp_path / "run")
    grid = Grid()
    _, w1, _, _ = _train(s, 1, 1, _flat(W0), grid)
    _, w2, _, _ = _train(s, 2, 2, w1, grid)
    assert fs._saved_rounds(tmp_path / "run") == [1, 2]  # a resume needs round 1's until 3 starts
    s.configure_train(3, _arrays(w2), ConfigRecord({"cell": "{}"}), grid)
    assert fs._saved_rounds(tmp_path / "run") == ([1, 2] if keep else [2])
    s.save_server_state(3)
    assert fs._saved_rounds(tmp_path / "run") == ([1, 2, 3] if keep else [2, 3])
    s.save_server_state(5)
    assert fs._saved_rounds(tmp_path / "run") == ([1, 2, 3, 5] if keep else [5])
    assert fs.server_state_path("x", 7) == Path("x/checkpoints/fedsumm_server_round_007.pt")
    assert fs.server_state_dir("x") == Path("x/checkpoints/server_state")
    assert fs._saved_rounds(tmp_path / "nothing") == []


def _updates(t: int, w_t: dict) -> list[OrderedDict]:
    """Δ^c = w^c − w_t as the server computes it (float32 replies)."""
    out = []
    for c in SIZES:
        params = {k: torch.tensor([a + d for a, d in zip(w_t[k], UPDATES[t][c][k])],
                                  dtype=torch.float32) for k in w_t}
        out.append(OrderedDict((k, (params[k] - torch.tensor(w_t[k], dtype=torch.float32))
                                .reshape(torch.tensor(W0[k]).shape)) for k in sorted(w_t)))
    return out


DP = {"enabled": True, "noise_multiplier": 0.7, "delta": 1e-4, "clipping": "adaptive",
      "initial_clip_norm": 2.0, "target_quantile": 0.4, "clip_norm_lr": 0.3,
      "clipped_count_stddev": 0.5, "regimes": ["FedAvg"]}


def test_adaptive_dp_round_uses_c_t_its_seeded_noise_and_resumes_with_c_t_plus_1(task_identity,
                                                                                 tmp_path):
    """FedAvg + DP (adaptive clipping): w_{t+1} = w_t + clipped noised mean with C_1 = 2.0, σ, σ_b
    and the generator seeded by (cell seed 5, "fedsumm-dp", t); round 2 clips at round 1's C_2,
    also after a resume (read back from round 1's log); ε after round t in log and metrics."""
    s = _strategy(_cell("FedAvg", dict(DP)), tmp_path / "a")
    assert s.dp_enabled
    eps = epsilon_per_round(DPSettings.from_config(DP), 3, 3, 3)
    w0 = _flat(W0)
    _, w1, m1, meta1 = _train(s, 1, 1, w0, Grid())
    gen = torch.Generator().manual_seed(derive_seed(5, "fedsumm-dp", 1))
    mean, info = dp_adaptive_clip_mean(_updates(1, w0), clip_norm=2.0, noise_multiplier=0.7,
                                       clipped_count_stddev=0.5, target_quantile=0.4,
                                       clip_norm_lr=0.3, generator=gen)
    for k in w1:
        _close(w1[k], [a + b for a, b in zip(w0[k], mean[k].reshape(-1).double().tolist())])
    dp1 = meta1["dp"]
    assert dp1["clip_norm"] == 2.0 and dp1["next_clip_norm"] == pytest.approx(info["next_clip_norm"])
    assert dp1["epsilon"] == pytest.approx(eps[0]) and dp1["delta"] == 1e-4
    assert dp1["sampling_rate"] == 1.0
    assert m1["dp-epsilon"] == pytest.approx(eps[0])
    assert m1["dp-clip-norm"] == 2.0 and m1["dp-next-clip-norm"] == pytest.approx(info["next_clip_norm"])
    assert m1["dp-num-clients"] == 3.0
    assert info["next_clip_norm"] != 2.0
    c2 = info["next_clip_norm"]
    _, w2, m2, meta2 = _train(s, 2, 2, w1, Grid())
    gen = torch.Generator().manual_seed(derive_seed(5, "fedsumm-dp", 2))
    mean2, _ = dp_adaptive_clip_mean(_updates(2, w1), clip_norm=c2, noise_multiplier=0.7,
                                     clipped_count_stddev=0.5, target_quantile=0.4,
                                     clip_norm_lr=0.3, generator=gen)
    for k in w2:
        _close(w2[k], [a + b for a, b in zip(w1[k], mean2[k].reshape(-1).double().tolist())])
    assert meta2["dp"]["clip_norm"] == pytest.approx(c2)
    assert meta2["dp"]["epsilon"] == pytest.approx(eps[1]) and eps[1] > eps[0]
    resumed = _strategy(_cell("FedAvg", dict(DP)), tmp_path / "a", offset=1)
    assert resumed._clip_norm == pytest.approx(c2)
    _, w2_b, _, _ = _train(resumed, 1, 2, w1, Grid())
    assert w2_b == w2


def test_round_median_dp_and_regimes_without_dp(task_identity, tmp_path):
    """``round_median``: eq. 9-10's median clipping with the round's seeded noise; ε None.  DP on
    for FedSUMM only leaves a FedAvg cell without DP; an unknown regime is an error."""
    dp = dict(DP, clipping="round_median", clipped_count_stddev=None)
    s = _strategy(_cell("FedAvg", dp), tmp_path / "a")
    w0 = _flat(W0)
    _, w1, m1, meta = _train(s, 1, 1, w0, Grid())
    gen = torch.Generator().manual_seed(derive_seed(5, "fedsumm-dp", 1))
    mean, info = dp_median_clip_mean(_updates(1, w0), noise_multiplier=0.7, generator=gen)
    for k in w1:
        _close(w1[k], [a + b for a, b in zip(w0[k], mean[k].reshape(-1).double().tolist())])
    assert meta["dp"]["clip_norm"] == pytest.approx(info["clip_norm"])
    assert meta["dp"]["epsilon"] is None and "dp-epsilon" not in m1
    off = _strategy(_cell("FedAvg", dict(DP, regimes=["FedSUMM"])), tmp_path / "b")
    assert not off.dp_enabled and off._aggregate_fn(1) is fs.plain_mean
    with pytest.raises(InputError, match="not 'local'"):
        _strategy(_cell("local"), tmp_path / "c")
    with pytest.raises(InputError, match="clients_per_round"):
        _strategy(_cell("FedAvg", clients_per_round=2), tmp_path / "d")


def test_aggregate_before_configure_and_replies_without_loss_are_errors(task_identity, tmp_path):
    s = _strategy(_cell("FedSUMM"), tmp_path / "a")
    with pytest.raises(RuntimeError, match="before configure_train"):
        s.aggregate_arrays(1, [])
    msgs = s.configure_train(1, _arrays(_flat(W0)), ConfigRecord({"cell": "{}"}), Grid())
    reply = Message(RecordDict({"arrays": _arrays(_flat(W0)),
                                "metrics": MetricRecord({"partition-id": 0, "num-examples": 1})}),
                    reply_to=msgs[0])
    with pytest.raises(RuntimeError, match="no train-loss"):
        s.aggregate_arrays(1, [reply])
    with pytest.raises(RuntimeError, match="expected partitions 0..2"):
        s.sample_partitions(1, [0, 1])


def test_resumed_run_prunes_by_absolute_round_and_default_prunes(task_identity, tmp_path):
    """A run resumed at round 2 (round_offset 2) starting its round 3 drops round 1's state; a
    cell without ``keep_round_checkpoints`` prunes (the default)."""
    cell = _cell("FedSUMM")
    del cell["keep_round_checkpoints"]
    s = _strategy(cell, tmp_path / "run")
    _, w1, _, _ = _train(s, 1, 1, _flat(W0), Grid())
    _, w2, _, _ = _train(s, 2, 2, w1, Grid())
    assert fs._saved_rounds(tmp_path / "run") == [1, 2]
    r = _strategy(cell, tmp_path / "run", offset=2)
    r.configure_train(1, _arrays(w2), ConfigRecord({"cell": "{}"}), Grid())
    assert fs._saved_rounds(tmp_path / "run") == [2]


def test_disk_files_of_every_kept_state_survive_a_resume(task_identity, tmp_path):
    """Disk storage with every round's state kept: a resume at round 2 keeps the files round 1's
    state names too, so a later resume from round 1 still gives the same round 2."""
    cell = _cell("FedSUMM", server_state={"storage": "disk"}, keep_round_checkpoints=True)
    s = _strategy(cell, tmp_path / "run")
    _, w1, _, _ = _train(s, 1, 1, _flat(W0), Grid())
    _, w2, _, _ = _train(s, 2, 2, w1, Grid())
    _strategy(cell, tmp_path / "run", offset=2)
    r = _strategy(cell, tmp_path / "run", offset=1)
    _, w2_b, _, _ = _train(r, 1, 2, w1, Grid())
    assert w2_b == w2


def test_wave_size_and_dp_key_come_from_the_cell(tmp_path):
    s = _strategy(_cell("FedAvg", server_state={"wave_size": 2}), tmp_path / "a")
    assert s.wave_size == 2
    assert _strategy(_cell("FedAvg"), tmp_path / "b").wave_size is None
    with pytest.raises(InputError, match="cell dp.noise_multiplier"):
        _strategy(_cell("FedAvg", dict(DP, noise_multiplier=-1.0)), tmp_path / "c")


def test_mean_batch_gradient_replies_are_the_memory(task_identity, tmp_path):
    """``client_gradient: mean_batch_gradient``: g^c is the reply's ``fedsumm-gradient`` record
    (here −2Δ^c, not the delta −Δ^c), so round 2's guidance is g^c·ε·ρ_{c,k}; a reply without the
    record is an error."""
    _, want_rho = _hand_server(1)
    cell = _cell("FedSUMM")
    cell["algorithm"]["client_gradient"] = "mean_batch_gradient"
    s = _strategy(cell, tmp_path / "a")
    grad = lambda t, c: {k: [-2 * d for d in UPDATES[t][c][k]] for k in W0}  # noqa: E731
    _, w1, _, _ = _train(s, 1, 1, _flat(W0), Grid(), gradient=grad)
    sent, _, _, _ = _train(s, 2, 2, w1, Grid(), gradient=grad)
    for pid, c in enumerate(SIZES):
        g = sent[pid].content[task.GUIDANCE_ARRAYS].to_torch_state_dict()
        for k in g:
            _close(g[k].reshape(-1).double().tolist(),
                   [-2 * d * SERVER_EPS * want_rho[0][c][k] for d in UPDATES[1][c][k]])
    with pytest.raises(RuntimeError, match="fedsumm-gradient"):
        _train(_strategy(cell, tmp_path / "b"), 1, 1, _flat(W0), Grid())


def test_partial_participation_and_dp_count_noise_of_m_clients(task_identity, tmp_path):
    """clients_per_round = 2 of 3: S_t is the server's seeded allocation of round t (it changes
    with t); adaptive DP with σ_b = m/20 for m = 2 participants and q = 2/3 in the log."""
    dp = dict(DP, noise_multiplier=0.15, clipped_count_stddev=None, regimes=["FedSUMM"])
    cell = _cell("FedSUMM", dp, clients_per_round=2)
    cell["algorithm"]["clients_per_round"] = 2
    s = _strategy(cell, tmp_path / "a")
    draws = {t: s.sample_partitions(t, [0, 1, 2]) for t in range(1, 7)}
    assert all(len(d) == 2 for d in draws.values()) and len(set(map(tuple, draws.values()))) > 1
    for t, d in draws.items():
        assert d == sorted(s.pid_of[c] for c in s.server.sample_clients(t))
    sent, w1, _, meta = _train(s, 1, 1, _flat(W0), Grid())
    assert sorted(sent) == draws[1] and meta["participants"] == [list(SIZES)[p] for p in draws[1]]
    assert meta["dp"]["clipped_count_stddev"] == pytest.approx(0.1)
    assert meta["dp"]["sampling_rate"] == pytest.approx(2 / 3)
    eps = epsilon_per_round(DPSettings.from_config(dp), 3, 2, 3)
    assert meta["dp"]["epsilon"] == pytest.approx(eps[0])
