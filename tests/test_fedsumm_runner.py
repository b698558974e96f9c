"""FedSUMM cells through the federated runner (in-process Flower engine; one test against Flower's
simulation engine): the guidance travelling to clients, MG / ρ updated from the replies, DP in a
run, FedAvg vs FedSUMM, resume after a kill, the local regimes, evaluation, errors."""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
from collections import OrderedDict
from pathlib import Path

import faults
import helpers
import numpy as np
import pytest
import torch

from fedrepro.papers.fedsumm import task as fedsumm_task
from fedrepro.fl.cell import load_final_adapters, run_cell
from fedrepro.fl.checkpoint import checkpoint_paths
from fedrepro.fl.checkpoint import load_state
from fedrepro.io import InputError, write_jsonl_atomic
from fedrepro.papers.fedsumm.algorithm import (
    FedSummConfig,
    FedSummServer,
    ServerStateConfig,
    state_names,
)
from fedrepro.papers.fedsumm.bart import build_tiny_chinese_bart
from fedrepro.papers.fedsumm.strategy import (
    FedSummStrategy,
    server_state_dir,
    server_state_path,
)

CLIENTS = ("csl-001", "csl-002", "csl-003")
CHARS = "网络故障诊断问题提出方法结果表明误差降低人口老龄化农民增收影响数据检验无线传感器新一种本文利用年的了该"
TOPICS = ["网络故障", "人口老龄", "农民增收", "无线传感", "数据检验"]


def _records(client: str, split: str, n: int, k: int) -> list[dict]:
    rng = random.Random(f"{client}/{split}")
    out = []
    for i in range(n):
        topic = TOPICS[(k + i) % len(TOPICS)]
        body = "".join(rng.choice(CHARS) for _ in range(20))
        out.append(
            {
                "id": f"{client}-{split}-{i}",
                "source": "csl",
                "client": client,
                "split": split,
                "input": f"{topic}{body}，{topic}。",
                "target": f"{topic}的{body[:4]}",
                "meta": {},
            }
        )
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedsumm")
    folders, texts = {}, []
    for k, c in enumerate(CLIENTS):
        for split, n in (("train", 6), ("val", 2), ("test", 2)):
            if split == "val" and c == "csl-003":
                continue  # like NLPCC2017: no validation split -> perplexity on test
            recs = _records(c, split, n, k)
            write_jsonl_atomic(root / "clients" / c / f"{split}.jsonl", recs)
            if split == "train":
                texts += [r["input"] for r in recs] + [r["target"] for r in recs]
        folders[c] = str(root / "clients" / c)
    build_tiny_chinese_bart(
        texts,
        root / "backbone",
        {
            "d_model": 16,
            "heads": 2,
            "ffn_dim": 32,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "max_position_embeddings": 64,
        },
    )
    return root, folders


def _cell(
    world,
    tmp: Path,
    model: str,
    regime: str,
    name: str,
    rounds: int = 2,
    engine: str = "inprocess",
    **over,
) -> dict:
    root, folders = world
    cell = {
        "paper": "fedsumm",
        "scale": "demo",
        "corpus": "csl",
        "num_clients": 3,
        "model": model,
        "regime": regime,
        "seed": 1,
        "backbone": "bart-base-chinese",
        "backbone_dir": str(root / "backbone"),
        "clients": list(CLIENTS[:1]) if regime == "single" else list(CLIENTS),
        "eval_clients": list(CLIENTS),
        "client_data": dict(folders),
        "copy_transformer": {
            "d_model": 16,
            "heads": 2,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "ffn_dim": 32,
            "dropout": 0.1,
            "max_positions": 64,
        },
        "copy_attention": "cross_attention",
        "algorithm": {"epsilon": 0.1, "dldt": "inner_product"},
        "dp": {"enabled": False, "noise_multiplier": 1.0, "regimes": ["FedSUMM"]},
        "train": {
            "rounds": rounds,
            "local_epochs": 1,
            "lr": 0.003,
            "weight_decay": 0.0,
            "batch_size": 4,
            "max_grad_norm": 1.0,
            "max_source_length": 48,
            "max_target_length": 16,
        },
        "generation": {
            "beam_size": 1,
            "max_new_tokens": 6,
            "min_new_tokens": 1,
            "length_penalty": 1.0,
            "no_repeat_ngram_size": 3,
            "batch_size": 8,
        },
        "rouge_every_round": False,
        "threads": 1,
        "engine": engine,
        "device": "cpu",
        "clients_per_round": None,
        "keep_round_checkpoints": False,
        "round_timeout_s": 300,
        "out_dir": str(tmp / name),
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(cell.get(key), dict):
            cell[key] = {**cell[key], **value}
        else:
            cell[key] = value
    return cell


def _run(cell: dict) -> Path:
    out = Path(cell["out_dir"])
    run_cell(
        cell,
        str(out / "adapters.safetensors"),
        str(out / "train_log.json"),
        str(out / "provenance.json"),
    )
    return out


def _rounds(out: Path) -> list[dict]:
    return json.loads((out / "train_log.json").read_text())["rounds"]


@pytest.fixture
def spy(monkeypatch):
    """Record what every client received (extra records) and returned, per (round, client)."""
    calls: dict[tuple[int, str], dict] = {}
    original = fedsumm_task.client_train_round

    def wrapper(cell, client, round_index, server_state, records=None):
        out = original(cell, client, round_index, server_state, records=records)
        calls[(round_index, client)] = {
            "records": dict(records or {}),
            "sent": out[0],
            "stats": out[1],
            "received": OrderedDict(server_state),
        }
        return out

    monkeypatch.setattr(fedsumm_task, "client_train_round", wrapper)
    return calls


def _saved_server(cell: dict, round_index: int) -> FedSummServer:
    """The FedSUMM server state a cell saved after ``round_index`` (its checkpoints kept)."""
    server = FedSummServer(
        FedSummConfig.from_config(cell["algorithm"]),
        cell["clients"],
        cell["seed"],
        state=ServerStateConfig.from_config(cell.get("server_state")),
        state_dir=server_state_dir(cell["out_dir"]),
    )
    server.load_state_dict(
        torch.load(server_state_path(cell["out_dir"], round_index), weights_only=True)
    )
    return server


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_guidance_travels_to_clients_and_the_server_updates_mg_and_rho_from_replies(
    world, tmp_path, spy, storage
):
    cell = _cell(
        world,
        tmp_path,
        "ct",
        "FedSUMM",
        "fedsumm",
        keep_round_checkpoints=True,
        server_state={"storage": storage, "dtype": "float32"},
    )
    out = _run(cell)
    log = _rounds(out)
    eps = 0.1
    for c in CLIENTS:
        assert spy[(1, c)]["records"] == {}  # first round: no guidance yet
        rec = spy[(2, c)]["records"]
        assert set(rec) == {fedsumm_task.GUIDANCE_ARRAYS, fedsumm_task.GUIDANCE_CONFIG}
        cfg = rec[fedsumm_task.GUIDANCE_CONFIG]
        # ρ and l^c of round 1, as the server logged them, arrive with w_1
        assert cfg["rho"] == log[0]["rho"][c] and cfg["epsilon"] == eps
        assert cfg["previous-loss"] == spy[(1, c)]["stats"]["train_loss"]
        # g̃ = MG[c]·ε·ρ with MG[c] = w_0 − w^c_1 (delta, own entry), computed on the server from the reply
        g = rec[fedsumm_task.GUIDANCE_ARRAYS].to_torch_state_dict()
        w_0, w_c = spy[(1, c)]["received"], spy[(1, c)]["sent"]
        assert list(g) == sorted(w_c)
        for k in g:
            assert torch.equal(g[k], (w_0[k] - w_c[k]) * (eps * cfg["rho"]))
        assert spy[(2, c)]["stats"]["guided"] == 1 and spy[(1, c)]["stats"]["guided"] == 0
    # the server state after round 2: MG holds round 2's deltas, the losses the round-2 losses
    server = _saved_server(cell, 2)
    memory = {c: server.memory_entry(c) for c in CLIENTS}
    for c in CLIENTS:
        w_1, w_c2 = spy[(2, c)]["received"], spy[(2, c)]["sent"]
        assert all(torch.equal(memory[c][k], w_1[k] - w_c2[k]) for k in w_1)
        assert server.losses[c] == spy[(2, c)]["stats"]["train_loss"]
        assert server.guidance[c].rho == log[1]["rho"][c]
    assert log[1]["fedsumm"]["memory_order"] == sorted(CLIENTS, key=lambda c: (server.losses[c], c))
    assert all(log[1]["fedsumm"]["modulated"].values())
    # w_2 = w_1 + mean_c (w^c_2 − g̃^c_2 − w_1), g̃^c_2 = MG_2[c]·ε·ρ_2[c] (Algorithm 1, apply_on_server)
    w_1 = spy[(2, CLIENTS[0])]["received"]
    w_2 = load_state(checkpoint_paths(cell["out_dir"], 2)[0])
    for k in w_1:
        ups = [
            spy[(2, c)]["sent"][k] - memory[c][k] * (eps * log[1]["rho"][c]) - w_1[k]
            for c in CLIENTS
        ]
        assert torch.equal(w_2[k], w_1[k] + sum(ups) / len(ups))
    # every round logs ρ per client, step losses and the evaluation of the new global model on every client
    for entry in log:
        assert set(entry["rho"]) == set(CLIENTS) and entry["rho_mean"] >= 1.0 - 1e-9
        assert {c: len(s) for c, s in entry["step_losses"].items()} == {c: 2 for c in CLIENTS}
        ev = entry["evaluation"]
        assert set(ev["per_client"]) == set(CLIENTS) and ev["perplexity"] > 1
        assert ev["per_client"]["csl-003"]["perplexity_split"] == "test"  # no validation split
        assert ev["per_client"]["csl-001"]["perplexity_split"] == "val"
        pooled = math.exp(
            sum(e["nll_sum"] for e in ev["per_client"].values())
            / sum(e["tokens"] for e in ev["per_client"].values())
        )
        assert ev["perplexity"] == pytest.approx(pooled)
    assert log[1]["guidance_bytes_down"] == log[1]["bytes_down"] // 2  # g̃ is as large as w_t


@pytest.mark.parametrize("reading, train", [
    ("update_direction", {}),
    # the configs' reading and optimizer since issue 23
    ("update_direction_rank", {"optimizer": "sgd", "lr": 0.5}),
])
def test_round_log_holds_the_rho_distribution_and_the_update_difference(
    world, tmp_path, spy, reading, train
):
    """A FedSUMM cell under an update-direction reading: every round's log has each
    client's distribution of ρ − 1 and the difference of the server update from FedAvg's, which
    equals the one recomputed from the models the clients sent and the new global model; a rerun
    gives the same bits."""
    algorithm = {"epsilon": 0.1, "dldt": "inner_product", "reading": reading}
    cell = _cell(world, tmp_path, "ct", "FedSUMM", "ud", algorithm=algorithm,
                 keep_round_checkpoints=True, train=train)
    out = _run(cell)
    log = _rounds(out)
    for t, entry in enumerate(log, start=1):
        assert set(entry["rho_statistics"]) == set(CLIENTS)
        for c, st in entry["rho_statistics"].items():
            assert set(st) == {"parameter", "tensor", "group"}
            assert st["group"]["min"] <= entry["rho"][c] - 1 <= st["group"]["max"]
            assert st["parameter"]["min"] <= st["parameter"]["p50"] <= st["parameter"]["max"]
        w_t = spy[(t, CLIENTS[0])]["received"]
        w_next = load_state(checkpoint_paths(cell["out_dir"], t)[0])
        fedavg = {k: sum(spy[(t, c)]["sent"][k] - w_t[k] for c in CLIENTS) / 3 for k in w_t}
        d2 = sum(float(((w_next[k] - w_t[k]) - fedavg[k]).double().pow(2).sum()) for k in w_t)
        a2 = sum(float(fedavg[k].double().pow(2).sum()) for k in w_t)
        diff = entry["update_difference"]
        assert diff["rel_diff"] == pytest.approx(math.sqrt(d2 / a2), rel=1e-3)
        assert diff["norm_fedavg"] == pytest.approx(math.sqrt(a2), rel=1e-5)
        # per-tensor ρ: the step is not FedAvg's rescaled
        assert diff["rel_diff_beyond_scale"] > 1e-3 and "rel_diff_vs_rank" in diff
    again = _run(_cell(world, tmp_path, "ct", "FedSUMM", "ud2", algorithm=algorithm,
                       keep_round_checkpoints=True, train=train))
    for name in ("adapters.safetensors", "train_log.json"):
        assert (out / name).read_bytes() == (again / name).read_bytes()
    # FedAvg logs ρ under the same reading, without an update difference
    avg = _rounds(_run(_cell(world, tmp_path, "ct", "FedAvg", "ud-avg", algorithm=algorithm,
                             train=train)))
    assert avg[0]["rho"] == log[0]["rho"] and avg[0]["rho_statistics"] == log[0]["rho_statistics"]
    assert all("update_difference" not in e for e in avg)


def test_fedavg_and_fedsumm_differ_only_by_the_server_procedure(world, tmp_path):
    plain = {"epsilon": 0.0, "dldt": "off"}
    fedavg = _run(_cell(world, tmp_path, "bart", "FedAvg", "avg", algorithm=plain))
    fedsumm0 = _run(_cell(world, tmp_path, "bart", "FedSUMM", "summ0", algorithm=plain))
    # ε = 0 and no eq. 7 term: the adapter is the identity, so FedSUMM is FedAvg bit for bit
    assert (fedavg / "adapters.safetensors").read_bytes() == (
        fedsumm0 / "adapters.safetensors"
    ).read_bytes()
    a, b = _rounds(fedavg), _rounds(fedsumm0)
    for ra, rb in zip(a, b):
        assert ra["evaluation"] == rb["evaluation"] and ra["rho"] == rb["rho"]
        assert "fedsumm" not in ra and "fedsumm" in rb
        assert ra["guidance_bytes_down"] == 0
    assert b[1]["guidance_bytes_down"] > 0  # FedSUMM still sends (zero) guidance
    # the default ε: the clients' first round is the same, the server's procedure is not
    fedsumm = _run(_cell(world, tmp_path, "bart", "FedSUMM", "summ"))
    c = _rounds(fedsumm)
    assert [x["train_loss"] for x in c[0]["clients"]] == [x["train_loss"] for x in a[0]["clients"]]
    assert c[0]["rho"] == a[0]["rho"]
    assert c[0]["evaluation"]["perplexity"] != a[0]["evaluation"]["perplexity"]
    assert (fedsumm / "adapters.safetensors").read_bytes() != (
        fedavg / "adapters.safetensors"
    ).read_bytes()


def test_dp_clips_to_the_median_and_records_the_noise_scale(world, tmp_path, spy):
    """``clipping: round_median``: eq. 9 literally (exact median, no ε)."""
    sigma = 0.5
    cell = _cell(
        world,
        tmp_path,
        "ct",
        "FedSUMM",
        "dp",
        dp={"enabled": True, "noise_multiplier": sigma, "clipping": "round_median"},
        algorithm={"dldt": "off"},
    )
    out = _run(cell)
    log = _rounds(out)
    for entry in log:
        dp = entry["dp"]
        norms = dp["norms"]
        assert len(norms) == 3 and dp["clip_norm"] == pytest.approx(float(np.median(norms)))
        assert dp["noise_scale"] == pytest.approx(dp["clip_norm"] * sigma)
        assert dp["noise_std_on_mean"] == pytest.approx(dp["clip_norm"] * sigma / 3)
        assert dp["num_clipped"] == sum(n > dp["clip_norm"] for n in norms) == 1
        assert entry["aggregated_metrics"]["dp-noise-scale"] == pytest.approx(dp["noise_scale"])
        assert dp["epsilon"] is None and "dp-epsilon" not in entry["aggregated_metrics"]
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["dp"]["epsilon"] is None and prov["dp"]["guarantee"].startswith("none")
    # round 1: the clipped quantity is the modulated update w^c − g̃^c − w_0 = (1 + ερ)(w^c − w_0)
    for i, c in enumerate(CLIENTS):
        w0, wc = spy[(1, c)]["received"], spy[(1, c)]["sent"]
        raw = math.sqrt(sum(float((wc[k] - w0[k]).double().pow(2).sum()) for k in w0))
        assert log[0]["dp"]["norms"][i] == pytest.approx(
            raw * (1 + 0.1 * log[0]["rho"][c]), rel=1e-5
        )
    # seeded noise: the same run gives the same bits; without noise the model differs
    again = _run(dict(cell, out_dir=str(tmp_path / "dp-again")))
    assert (again / "adapters.safetensors").read_bytes() == (
        out / "adapters.safetensors"
    ).read_bytes()
    other = _run(dict(cell, seed=2, out_dir=str(tmp_path / "dp-seed2")))
    assert (other / "adapters.safetensors").read_bytes() != (out / "adapters.safetensors").read_bytes()
    # DP is configured for FedSUMM only: a FedAvg cell with the same dp block aggregates without it
    fedavg = _run(
        _cell(
            world,
            tmp_path,
            "ct",
            "FedAvg",
            "dp-avg",
            dp={"enabled": True, "noise_multiplier": sigma},
        )
    )
    assert "dp" not in _rounds(fedavg)[0]


def test_adaptive_dp_logs_clip_norm_and_epsilon_per_round_and_resumes_bit_identically(
    world, tmp_path, monkeypatch
):
    from fedrepro.fl.privacy import DPSettings, epsilon_per_round

    dp_cfg = {"enabled": True, "noise_multiplier": 0.8, "clipped_count_stddev": 1.0,
              "initial_clip_norm": 0.05, "clip_norm_lr": 0.5, "delta": 1e-4}
    cell = _cell(world, tmp_path, "ct", "FedSUMM", "adp", rounds=3, dp=dp_cfg)
    out = _run(cell)
    log = _rounds(out)
    eps = epsilon_per_round(DPSettings.from_config(cell["dp"]), 3, 3, 3)
    c = 0.05
    for t, entry in enumerate(log):
        dp = entry["dp"]
        assert dp["clipping"] == "adaptive" and dp["clip_norm"] == c  # C_t = C_{t-1}'s update
        assert dp["epsilon"] == eps[t] and entry["aggregated_metrics"]["dp-epsilon"] == eps[t]
        assert dp["delta"] == 1e-4 and dp["sampling_rate"] == 1.0
        unclipped = sum(n <= c for n in dp["norms"])
        assert dp["num_unclipped"] == unclipped
        assert dp["next_clip_norm"] == pytest.approx(
            c * math.exp(-0.5 * (dp["noisy_unclipped_fraction"] - 0.5)), rel=1e-12
        )
        z = (0.8**-2 - 2.0**-2) ** -0.5
        assert dp["noise_std_on_mean"] == pytest.approx(z * c / 3, rel=1e-12)
        c = dp["next_clip_norm"]
    assert eps[0] < eps[1] < eps[2]
    prov = json.loads((out / "provenance.json").read_text())["dp"]
    assert prov["epsilon_per_round"] == eps and prov["epsilon"] == eps[-1]
    assert prov["clip_norm_per_round"] == [e["dp"]["clip_norm"] for e in log]
    assert "rho_reference round_mean" in prov["caveat"]  # the default reading (docs)
    # same seed, same bits; killed in round 3 and resumed (C_3 read back from round 2's log): same bits
    again = _run(dict(cell, out_dir=str(tmp_path / "adp-again")))
    assert (again / "adapters.safetensors").read_bytes() == (out / "adapters.safetensors").read_bytes()
    cut = dict(cell, out_dir=str(tmp_path / "adp-cut"))
    _kill_in_round(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="round 3"):
        _run(cut)
    monkeypatch.undo()
    _run(cut)
    for name in ("adapters.safetensors", "train_log.json"):
        assert (Path(cut["out_dir"]) / name).read_bytes() == (out / name).read_bytes()


def _kill_in_round(monkeypatch, bad_round: int):
    original = fedsumm_task.client_train_round

    def dying(cell, client, round_index, server_state, records=None):
        if round_index == bad_round:
            raise RuntimeError("node killed")  # the node dies mid-round
        return original(cell, client, round_index, server_state, records=records)

    monkeypatch.setattr(fedsumm_task, "client_train_round", dying)


def test_resume_after_a_kill_is_bit_identical(world, tmp_path, monkeypatch):
    full = _run(_cell(world, tmp_path, "ct", "FedSUMM", "full", rounds=3))
    again = _run(_cell(world, tmp_path, "ct", "FedSUMM", "again", rounds=3))
    assert (full / "adapters.safetensors").read_bytes() == (
        again / "adapters.safetensors"
    ).read_bytes()
    assert (full / "train_log.json").read_bytes() == (again / "train_log.json").read_bytes()
    cut = _cell(world, tmp_path, "ct", "FedSUMM", "cut", rounds=3)
    _kill_in_round(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="round 3"):
        _run(cut)
    assert (Path(cut["out_dir"]) / "checkpoints" / "fedsumm_server_round_002.pt").exists()
    monkeypatch.undo()
    _run(cut)  # resumes from round 2 (server state with MG, ρ sums and guidance reloaded)
    for name in ("adapters.safetensors", "train_log.json"):
        assert (Path(cut["out_dir"]) / name).read_bytes() == (full / name).read_bytes()
    # a local regime resumes too (model and AdamW state of the last finished round)
    local = _run(_cell(world, tmp_path, "bart-cd", "all", "local", rounds=3))
    cut = _cell(
        world, tmp_path, "bart-cd", "all", "local-cut", rounds=3, keep_round_checkpoints=True
    )
    _run(cut)
    (Path(cut["out_dir"]) / "checkpoints" / "server_round_003.json").unlink()
    for name in ("adapters.safetensors", "train_log.json"):
        (Path(cut["out_dir"]) / name).unlink()
    _run(cut)
    for name in ("adapters.safetensors", "train_log.json"):
        assert (Path(cut["out_dir"]) / name).read_bytes() == (local / name).read_bytes()


def test_disk_server_state_resumes_bit_identically_and_follows_the_checkpoint_policy(
    world, tmp_path, monkeypatch
):
    disk = {"server_state": {"storage": "disk", "dtype": "float32"}}
    memory = _run(_cell(world, tmp_path, "ct", "FedSUMM", "memory", rounds=3))
    cut = _cell(world, tmp_path, "ct", "FedSUMM", "disk-cut", rounds=3, **disk)
    original = FedSummStrategy.evaluate_global

    def dying(self, absolute_round):
        if absolute_round == 3:  # the server dies after round 3's server procedure wrote its files
            raise RuntimeError("server killed")
        return original(self, absolute_round)

    monkeypatch.setattr(FedSummStrategy, "evaluate_global", dying)
    with pytest.raises(RuntimeError):
        _run(cut)
    monkeypatch.undo()
    ckpt = Path(cut["out_dir"]) / "checkpoints"
    # round 2's state; round 1's too if round 2's log entry was still with the background round
    # writer when round 3 started (a resume from round 1 would then need it)
    saved = sorted(p.name for p in ckpt.glob("fedsumm_server_round_*.pt"))
    assert saved in (["fedsumm_server_round_002.pt"],
                     ["fedsumm_server_round_001.pt", "fedsumm_server_round_002.pt"])
    named = state_names(torch.load(server_state_path(cut["out_dir"], 2), weights_only=True))
    on_disk = {p.stem for p in server_state_dir(cut["out_dir"]).glob("*.bin")}
    assert named and named < on_disk  # round 2's files, and the unfinished round 3's
    _run(cut)  # resumes from round 2: its files reloaded, round 3's leftovers deleted and redone
    for name in ("adapters.safetensors", "train_log.json"):  # = the uninterrupted in-memory run
        assert (Path(cut["out_dir"]) / name).read_bytes() == (memory / name).read_bytes()
    assert not ckpt.exists()  # keep_round_checkpoints: false -> the state files went with it
    kept = _cell(
        world, tmp_path, "ct", "FedSUMM", "disk-kept", rounds=3, keep_round_checkpoints=True, **disk
    )
    _run(kept)
    names = [
        state_names(torch.load(server_state_path(kept["out_dir"], r), weights_only=True))
        for r in (1, 2, 3)
    ]
    files = {p.stem for p in server_state_dir(kept["out_dir"]).glob("*.bin")}
    assert set().union(*names) == files  # every kept round's state is complete, nothing else
    assert (Path(kept["out_dir"]) / "adapters.safetensors").read_bytes() == (
        memory / "adapters.safetensors"
    ).read_bytes()


def test_a_round_whose_log_entry_the_background_writer_lost_resumes_from_the_round_before(
    world, tmp_path, monkeypatch
):
    """Round t's files are written in the background while round t+1 trains
    (fedrepro.fl.strategy): when round 2's write fails, round 3 has already started (and pruned
    old server states); the run stops naming the file, and the rerun resumes from round 1 -- whose
    server state (disk storage) must still be there -- to the bits of an uninterrupted run."""
    import fedrepro.fl.strategy as fl_strategy

    disk = {"server_state": {"storage": "disk", "dtype": "float32"}}
    memory = _run(_cell(world, tmp_path, "ct", "FedSUMM", "bg-memory", rounds=3))
    cut = _cell(world, tmp_path, "ct", "FedSUMM", "bg-cut", rounds=3, **disk)
    bad = checkpoint_paths(cut["out_dir"], 2)[0]
    helpers.disk_full_at(monkeypatch, fl_strategy, "save_state", bad)
    with pytest.raises(RuntimeError, match="round 2 failed") as err:
        _run(cut)
    assert str(bad) in str(err.value)
    monkeypatch.undo()
    assert server_state_path(cut["out_dir"], 1).exists()
    assert not checkpoint_paths(cut["out_dir"], 2)[1].exists()
    _run(cut)
    for name in ("adapters.safetensors", "train_log.json"):
        assert (Path(cut["out_dir"]) / name).read_bytes() == (memory / name).read_bytes()


def test_local_regimes_and_final_evaluation(world, tmp_path):
    single = _cell(world, tmp_path, "bart", "single", "single")
    out = _run(single)
    log = _rounds(out)
    assert [c["client"] for c in log[0]["clients"]] == ["csl-001"] and log[0]["clients"][0][
        "num_examples"
    ] == 6
    assert log[0]["bytes_up"] == 0 and set(log[0]["evaluation"]["per_client"]) == set(CLIENTS)
    pooled = _cell(world, tmp_path, "ct", "all", "all", rouge_every_round=True)
    log = _rounds(_run(pooled))
    assert log[0]["clients"][0]["num_examples"] == 18 and "rougeL" in log[0]["evaluation"]
    res = fedsumm_task.evaluate_cell(
        pooled,
        str(Path(pooled["out_dir"]) / "adapters.safetensors"),
        str(tmp_path / "p.jsonl"),
        str(tmp_path / "s.json"),
    )
    assert res["n"] == 6 and set(res["per_client"]) == set(CLIENTS)
    assert res["evaluated_model"].startswith("the model trained on the pooled")
    assert all(0 <= res[k] <= 100 for k in ("rouge1", "rouge2", "rougeL"))
    # the final model is the last round's: its perplexity equals the round log's
    assert res["perplexity"] == pytest.approx(log[-1]["evaluation"]["perplexity"])
    preds = [json.loads(line) for line in (tmp_path / "p.jsonl").open(encoding="utf-8")]
    assert len(preds) == 6 and {p["client"] for p in preds} == set(CLIENTS)
    assert set(load_final_adapters(Path(pooled["out_dir"]) / "adapters.safetensors")) == {"model"}


@pytest.mark.slow
def test_inprocess_engine_gives_the_same_bits_as_flower_simulation(world, tmp_path):
    a = _run(_cell(world, tmp_path, "ct", "FedSUMM", "inprocess"))
    b = _run(_cell(world, tmp_path, "ct", "FedSUMM", "simulation", engine="simulation"))
    assert (a / "adapters.safetensors").read_bytes() == (b / "adapters.safetensors").read_bytes()
    assert (a / "train_log.json").read_bytes() == (b / "train_log.json").read_bytes()
    assert json.loads((b / "provenance.json").read_text())["engine"] == "simulation"


def test_bad_input_is_a_clear_error(world, tmp_path):
    _, folders = world
    bad = tmp_path / "bad"
    shutil.copytree(folders["csl-002"], bad)
    recs = _records("csl-002", "train", 6, 1)
    recs[2]["target"] = "  "
    write_jsonl_atomic(bad / "train.jsonl", recs)
    cell = _cell(world, tmp_path, "ct", "FedAvg", "bad", rounds=1)
    cell["client_data"]["csl-002"] = str(bad)
    with pytest.raises(RuntimeError) as err:
        _run(cell)
    assert (
        "train.jsonl" in str(err.value)
        and "record 3" in str(err.value)
        and "csl-002-train-2" in str(err.value)
    )
    with pytest.raises(InputError, match="regime"):
        fedsumm_task.is_federated(_cell(world, tmp_path, "ct", "FedProx", "x"))
    with pytest.raises(InputError, match="fedsumm.algorithm.dldt"):
        _run(_cell(world, tmp_path, "ct", "FedSUMM", "bad-algo", algorithm={"dldt": "sometimes"}))


def test_only_the_methods_shared_tensors_and_scalars_reach_the_server(world, tmp_path, wire):
    """Issue 17, item 5, at the engine: one round of every federated FedSUMM regime (FedAvg,
    FedSUMM, FedSUMM with DP) on each model; every train reply holds exactly the shared (trainable)
    tensors the server broadcasts and scalar statistics, every evaluate reply scalar metrics
    only -- no token ids, no text, no per-example arrays; the guidance travels server -> client."""
    from helpers import check_wire

    def step_losses(record, pid) -> None:
        # the per-step (per-batch) losses of the local epoch, for the loss curves: one value per
        # optimiser step of 4 examples, not one per example (6 examples -> 2 steps)
        assert set(record.keys()) == {"step-losses"}
        losses = record["step-losses"]
        assert len(losses) == math.ceil(6 / 4) and all(isinstance(x, float) for x in losses)

    inspected = []
    for model in fedsumm_task.MODELS:
        for regime, over in (("FedAvg", {}), ("FedSUMM", {}),
                             ("FedSUMM", {"dp": {"enabled": True, "noise_multiplier": 0.8, "clipped_count_stddev": 1.0,
                                                     "initial_clip_norm": 0.05, "clip_norm_lr": 0.5,
                                                     "delta": 1e-4}})):
            wire.replies.clear()
            name = f"wire-{model}-{regime}-{'dp' if over else 'plain'}"
            cell = _cell(world, tmp_path, model, regime, name, rounds=1, **over)
            _run(cell)
            shared = {k: tuple(v.shape) for k, v in fedsumm_task.initial_state(cell).items()}
            counts = check_wire(wire, shared, examples={i: 6 for i in range(len(CLIENTS))},
                                declared={fedsumm_task.REPLY_STEPS: step_losses})
            assert counts["train"] == len(CLIENTS), name
            inspected.append(name)
    assert len(inspected) == 9


# -- kill at a random moment, rerun, compare (issue 17; tests/faults.py) ------------------------------
KILL_ROUNDS = 3
ROW = ["single", "all", "FedAvg", "FedSUMM"]  # a table row's regimes (fedsumm.task.run_row)


@pytest.fixture(scope="module")
def killable(world, tmp_path_factory):
    """A 3-round FedSUMM cell job, a table-row job (the four regimes, 2 rounds each, trained and
    evaluated by ``run_row``), and the uninterrupted run of each (the references)."""
    root = tmp_path_factory.mktemp("fedsumm-kill")
    cell_job = faults.cell_job(_cell(world, root, "ct", "FedSUMM", "x", rounds=KILL_ROUNDS))
    cells = [dict(_cell(world, root, "ct", r, "x", rounds=2), out_dir=f"cells/{r}") for r in ROW]
    row_job = ("fedrepro.papers.fedsumm.task:run_row", [cells])
    return {
        "cell": (root / "cell", cell_job, faults.run(root / "cell" / "reference", *cell_job)),
        "row": (root / "row", row_job, faults.run(root / "row" / "reference", *row_job)),
    }


def test_a_cell_killed_inside_a_checkpoint_write_reruns_to_the_bytes_of_an_uninterrupted_run(killable):
    """SIGKILL inside a seeded write of a round's server checkpoint files (FedSUMM's server state:
    MG and the rho sums, is among them): the rerun resumes after the last complete round."""
    root, job, seconds = killable["cell"]
    res = faults.check_kill_and_rerun(root, job, ["out"], KILL_ROUNDS, "write", 2, seconds)
    assert res["rerun"] is not None


def test_a_row_job_killed_while_evaluating_is_not_retrained(killable):
    """SIGKILL inside the write of the first regime's predictions (training done, evaluation
    under way): the rerun evaluates that cell again without training it, trains the other three,
    and every file equals the uninterrupted row's."""
    root, job, seconds = killable["row"]
    dirs = [f"cells/{r}" for r in ROW]
    work = root / "evaluating"
    res = faults.kill_and_rerun(work, *job, dirs, "write", match="/cells/single/predictions.jsonl")
    assert res["at_kill"]["cells/single"]["trained"]
    assert res["rerun"] == dict(zip(dirs, [[], [1, 2], [1, 2], [1, 2]]))
    for d in dirs:
        faults.assert_same_tree(root / "reference" / d, work / d)
    assert "cells/single: 1 of 2 stages restored" in (work / "rerun.err").read_text()


@pytest.mark.exhaustive
@pytest.mark.parametrize("kind,seed", [("start", 0), ("after_round", 1), ("random", 2),
                                       ("random", 3), ("write", 4), ("write", 5)])
def test_a_cell_killed_at_seeded_moments_reruns_to_the_same_bytes(killable, kind, seed):
    root, job, seconds = killable["cell"]
    faults.check_kill_and_rerun(root, job, ["out"], KILL_ROUNDS, kind, seed, seconds)


@pytest.mark.exhaustive
@pytest.mark.parametrize("kind,seed", [("random", 0), ("random", 1), ("random", 2), ("random", 3),
                                       ("write", 4), ("write", 5)])
def test_a_row_job_killed_at_seeded_moments_reruns_to_the_same_bytes(killable, kind, seed):
    root, job, seconds = killable["row"]
    faults.check_kill_and_rerun(root, job, [f"cells/{r}" for r in ROW], 2, kind, seed, seconds)


# -- the resident working model of the clients (issue 25) -----------------------------------------
def _fresh_run(monkeypatch, cell: dict) -> Path:
    """``cell`` with every client call building its own model (the code before the cache)."""

    @contextlib.contextmanager
    def fresh(cell, state, where):
        model = fedsumm_task.build_model(cell)
        fedsumm_task.load_shared_state(model, state, where)
        yield model

    with monkeypatch.context() as m:
        m.setattr(fedsumm_task, "client_model", fresh)
        return _run(cell)


@pytest.mark.parametrize("model, regime", [("bart", "FedSUMM"), ("ct", "FedAvg"), ("bart-cd", "FedSUMM")])
def test_the_cached_client_model_gives_the_bits_of_a_fresh_build(world, tmp_path, monkeypatch,
                                                                  model, regime):
    cached = _run(_cell(world, tmp_path, model, regime, "cached", rouge_every_round=True))
    fresh = _fresh_run(monkeypatch, _cell(world, tmp_path, model, regime, "fresh",
                                          rouge_every_round=True))
    assert (cached / "adapters.safetensors").read_bytes() == (fresh / "adapters.safetensors").read_bytes()
    for a, b in zip(_rounds(cached), _rounds(fresh), strict=True):
        assert a["evaluation"] == b["evaluation"]
        assert a["step_losses"] == b["step_losses"] and a["rho"] == b["rho"]


def test_a_client_never_sees_another_clients_state(world, tmp_path):
    """The cached model holds exactly the state the call received: every trainable tensor is
    overwritten, no gradient of the previous call survives, and it is the same object (no rebuild)."""
    cell = _cell(world, tmp_path, "bart", "FedSUMM", "isolation")
    w0 = fedsumm_task.initial_state(cell)
    g = torch.Generator().manual_seed(3)
    other = OrderedDict((k, v + torch.randn(v.shape, generator=g)) for k, v in w0.items())
    with fedsumm_task.client_model(cell, other, "a") as model:
        first = model
        for p in model.parameters():
            p.grad = torch.ones_like(p)  # as a finished training call leaves them
    with fedsumm_task.client_model(cell, w0, "b") as model:
        assert model is first
        assert all(p.grad is None for p in model.parameters())
        for k, v in fedsumm_task.shared_state(model).items():
            assert torch.equal(v, w0[k]), k
        # in use: a second (e.g. a timed-out client's) call gets a model of its own
        with fedsumm_task.client_model(cell, other, "c") as second:
            assert second is not model
            assert all(torch.equal(v, other[k]) for k, v in fedsumm_task.shared_state(second).items())
        assert all(torch.equal(v, w0[k]) for k, v in fedsumm_task.shared_state(model).items())
    # the CPU random state after the call is the one a fresh build leaves
    with fedsumm_task.client_model(cell, w0, "d"):
        cached = torch.get_rng_state()
    fedsumm_task.build_model(cell)
    assert torch.equal(cached, torch.get_rng_state())
