"""Federated cells through Flower's simulation engine: wire content, weighting, resume, bits."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

import faults
import helpers
from fedrepro.fl.cell import load_final_adapters, run_cell
from fedrepro.fl.strategy import SortedCheckpointFedAvg
from fedrepro.fl.checkpoint import checkpoint_paths
from fedrepro.papers.adafedseleckd.task import get_model

pytestmark = pytest.mark.slow


def _reply(pid: int, n: int, state: dict) -> helpers.TrainReply:
    return helpers.TrainReply(pid, n, state, {"train-loss": 1.0, "kd-fraction": 0.5, "n-tokens": 10})


def test_fedavg_weights_by_client_size_and_ignores_arrival_order(tmp_path):
    """Eq. 2: W = Σ |D_i|/|D| W_i, bit-identical whatever order the replies arrive in."""
    rng = np.random.default_rng(0)
    states = [{"w": torch.tensor(rng.normal(size=(3, 4)), dtype=torch.float32)} for _ in range(3)]
    sizes = [218, 284, 593]  # QMSum train pairs per domain (Table II)
    expected = sum(s["w"].double() * n for s, n in zip(states, sizes)) / sum(sizes)
    results = []
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        strat = SortedCheckpointFedAvg(out_dir=tmp_path / str(order), round_offset=0, expected_clients=3)
        strat._n_sampled = 3
        arrays, _ = strat.aggregate_train(1, [_reply(i, sizes[i], states[i]) for i in order])
        results.append(arrays.to_torch_state_dict()["w"])
    assert torch.allclose(results[0].double(), expected, atol=1e-6)
    assert all(torch.equal(results[0], r) for r in results[1:])
    log = json.loads(checkpoint_paths(tmp_path / "[2, 0, 1]", 1)[1].read_text())
    assert [c["partition_id"] for c in log["clients"]] == [0, 1, 2]
    assert log["bytes_up"] == 3 * 3 * 4 * 4


def test_failed_client_stops_the_round_instead_of_averaging_survivors(tmp_path):
    strat = SortedCheckpointFedAvg(out_dir=tmp_path, round_offset=0, expected_clients=3)
    strat._n_sampled = 3
    replies = [_reply(i, 5, {"w": torch.ones(2)}) for i in range(2)]
    with pytest.raises(RuntimeError, match="2 of 3 clients replied"):
        strat.aggregate_train(1, replies)
    assert not checkpoint_paths(tmp_path, 1)[0].exists()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fed")
    folders = helpers.make_partitions(root / "data", sizes=(12, 2, 3))
    backbone = helpers.make_backbone(root)
    return root, folders, backbone


def test_a_bf16_cell_on_a_device_that_emulates_bf16_says_so_in_its_provenance(world, monkeypatch, caplog):
    """The paper config's bf16-mixed on a device without native bf16 (here: a CPU reported as
    such) trains as configured and records why it is slow (``precision.emulated_bf16``), logged."""
    from fedrepro import precision as prec

    root, folders, backbone = world
    monkeypatch.setattr(prec, "_cpu_native_bf16", lambda: (False, "CPU (AVX2) without AVX512-BF16 or AMX"))
    cell = dict(helpers.make_cell(root, "AdaFedAvg", backbone, folders, rounds=1, out_name="bf16-emulated"),
                engine="inprocess", precision="bf16-mixed", device="cpu")
    with caplog.at_level("WARNING", logger="fedrepro.fl.cell"):
        run_cell(cell, *helpers.cell_outputs(cell))
    recorded = json.loads(Path(helpers.cell_outputs(cell)[2]).read_text())["precision"]
    assert recorded["precision"] == "bf16-mixed" and recorded["frozen_dtype"] == "fp32"
    assert "without AVX512-BF16 or AMX" in recorded["emulated_bf16"]
    assert "adafedseleckd.precision: fp32" in recorded["emulated_bf16"]
    assert recorded["emulated_bf16"] in caplog.text


def test_only_shared_adapter_tensors_reach_the_server(world):
    root, folders, backbone = world
    cell = helpers.make_cell(root, "AdaFedKD", backbone, folders, rounds=2, out_name="wire")
    run_cell(cell, *helpers.cell_outputs(cell))
    _, model = get_model(cell)
    local = model.adapter_state("local")
    expected_shapes = {k: list(v.shape) for k, v in local.items()}
    backbone_names = {n for n, _ in model.backbone.named_parameters()}
    log = json.loads(Path(helpers.cell_outputs(cell)[1]).read_text())
    assert len(log["rounds"]) == 2
    for entry in log["rounds"]:
        assert [c["partition_id"] for c in entry["clients"]] == [0, 1, 2]
        for c in entry["clients"]:
            assert c["uplink_tensors"] == expected_shapes
            assert not set(c["uplink_tensors"]) & backbone_names
            assert c["uplink_bytes"] == sum(v.numel() * 4 for v in local.values())
        assert entry["bytes_down"] == entry["bytes_up"] == 3 * c["uplink_bytes"]
    prov = json.loads(Path(helpers.cell_outputs(cell)[2]).read_text())
    params = prov["parameters"]
    assert params["trainable"] == sum(v.numel() for v in local.values())
    assert params["shared_per_round"] == params["trainable"]
    assert 0 < params["trainable_share"] < 0.2
    assert [b["round"] for b in prov["bytes_per_round"]] == [1, 2]
    for key in ("config_hash", "packages", "git_commit", "seed", "wall_time_s"):
        assert key in prov
    # KD methods: each client ends with its own local adapter, and they differ
    finals = load_final_adapters(helpers.cell_outputs(cell)[0])
    # + the server's final global adapter (Table VII's post-addition continues from it)
    assert sorted(finals) == ["Academic", "Committee", "Product", "__server__"]
    assert set(finals["__server__"]) == set(finals["Academic"])
    assert any(not torch.equal(finals["__server__"][k], finals["Academic"][k]) for k in finals["Academic"])
    a, b = finals["Academic"], finals["Product"]
    assert any(not torch.equal(a[k], b[k]) for k in a)


RUNNER = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
sys.path.insert(0, {tests!r})
from fedrepro.fl.cell import run_cell
cell = json.loads(open({cell_file!r}).read())
out = cell["out_dir"]
run_cell(cell, out + "/adapters.safetensors", out + "/train_log.json", out + "/provenance.json")
"""


def _start(cell, root, name):
    cell_file = root / f"{name}.json"
    cell_file.write_text(json.dumps(cell))
    code = RUNNER.format(tests=str(Path(__file__).parent), cell_file=str(cell_file))
    return subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=open(root / f"{name}.err", "w"),
    )


@pytest.mark.e2e  # Ray simulation; the in-process engine's kills are in make test (killable, below)
def test_killed_run_resumes_and_matches_an_uninterrupted_run_bit_for_bit(world):
    root, folders, backbone = world
    rounds = 5
    reference = helpers.make_cell(root, "AdaFedSelectKD", backbone, folders, rounds=rounds, out_name="ref")
    killed = dict(reference, out_dir=str(root / "killed"))
    proc = _start(killed, root, "killed")
    first = checkpoint_paths(killed["out_dir"], 1)[1]
    deadline = time.time() + 240
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert first.exists(), (root / "killed.err").read_text()[-2000:]
    assert not Path(helpers.cell_outputs(killed)[0]).exists()
    done = [r for r in range(1, rounds + 1) if checkpoint_paths(killed["out_dir"], r)[1].exists()]
    assert done and max(done) < rounds, f"the run finished before it was killed: {done}"
    # rerun: resumes after the last finished round
    proc = _start(killed, root, "resumed")
    assert proc.wait(timeout=300) == 0, (root / "resumed.err").read_text()[-3000:]
    assert f"resuming {killed['out_dir']} from round {max(done)}" in (root / "resumed.err").read_text()
    proc = _start(reference, root, "reference")
    assert proc.wait(timeout=300) == 0, (root / "reference.err").read_text()[-3000:]
    # same seed, same bits: final adapters and the round log are identical
    assert Path(helpers.cell_outputs(killed)[0]).read_bytes() == Path(helpers.cell_outputs(reference)[0]).read_bytes()
    assert Path(helpers.cell_outputs(killed)[1]).read_bytes() == Path(helpers.cell_outputs(reference)[1]).read_bytes()
    assert len(json.loads(Path(helpers.cell_outputs(killed)[1]).read_text())["rounds"]) == rounds


@pytest.mark.parametrize("engine", ["inprocess", pytest.param("simulation", marks=pytest.mark.e2e)])
def test_a_client_error_fails_the_cell_with_the_clients_message(world, tmp_path, engine):
    root, folders, backbone = world
    broken = dict(folders)
    bad = tmp_path / "Committee"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"id": "x", "input": "a", "target": "b"}\nnot json\n')
    broken["Committee"] = str(bad)
    cell = dict(helpers.make_cell(root, "AdaFedAvg", backbone, broken, rounds=2, out_name=f"broken-{engine}"),
                engine=engine)
    t0 = time.time()
    with pytest.raises(RuntimeError) as err:
        run_cell(cell, *helpers.cell_outputs(cell))
    assert time.time() - t0 < 120
    assert "round 1 failed" in str(err.value)
    assert "train.jsonl:2" in str(err.value)  # the client's own error names file and line
    assert not Path(helpers.cell_outputs(cell)[0]).exists()


def _sampled(cell) -> dict[int, list[str]]:
    """``{round: clients that took part}``, read from the cell's train log."""
    rounds = json.loads(Path(helpers.cell_outputs(cell)[1]).read_text())["rounds"]
    return {e["round"]: [cell["clients"][c["partition_id"]] for c in e["clients"]] for e in rounds}


def _equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", ["AdaFedSelectKD", "AdaFedKD"])
def test_sampled_out_clients_keep_their_local_adapter(world, monkeypatch, method):
    """Issue 12: ``clients_per_round: 2`` of 3 (Fig. 10).  A client trains its local adapter on
    from its own last participation (W^1 if it has none), keeps it unchanged while sampled out,
    and ends with the adapter of its last participation; reruns and resumes give the same bytes."""
    from fedrepro.fl.checkpoint import load_state
    from fedrepro.papers.adafedseleckd import task as ada_task

    root, folders, backbone = world
    rounds = 4
    cell = helpers.make_cell(root, method, backbone, folders, rounds=rounds, out_name=f"sampled-{method}")
    cell.update(seed=1, clients_per_round=2, engine="inprocess", keep_round_checkpoints=True)
    starts = {}
    real = ada_task.local_update

    def spy(model, spec, examples, hp, optimizer, seed, client, round_index, *rest, **kwargs):
        starts[client, round_index] = OrderedDict(
            (k, v.detach().cpu().clone()) for k, v in model.adapter_state("local").items())
        return real(model, spec, examples, hp, optimizer, seed, client, round_index, *rest, **kwargs)

    monkeypatch.setattr(ada_task, "local_update", spy)
    run_cell(cell, *helpers.cell_outputs(cell))
    sampled = _sampled(cell)
    assert sorted(sampled) == list(range(1, rounds + 1))
    assert all(len(cs) == 2 for cs in sampled.values())
    assert sorted(starts) == sorted((c, r) for r, cs in sampled.items() for c in cs)
    took_part = {c: [r for r, cs in sampled.items() if c in cs] for c in cell["clients"]}
    # the draw (seed 1) covers every case: a client that first trains after round 1, one that
    # skips a round and comes back, one absent from the last round
    assert any(rs[0] > 1 for rs in took_part.values())
    assert any(b - a > 1 for rs in took_part.values() for a, b in zip(rs, rs[1:]))
    assert any(rs[-1] < rounds for rs in took_part.values())
    initial = ada_task.initial_state(cell)
    for (client, r), start in starts.items():
        before = [p for p in took_part[client] if p < r]
        expected = load_state(ada_task.client_state_path(cell, client, before[-1])) if before else initial
        assert _equal(start, expected), (client, r)  # unchanged over the rounds it sat out
    finals = load_final_adapters(helpers.cell_outputs(cell)[0])
    for client, rs in took_part.items():
        files = sorted((Path(cell["out_dir"]) / "clients" / client).glob("local_round_*.safetensors"))
        assert [int(f.stem.rsplit("_", 1)[1]) for f in files] == rs
        assert _equal(finals[client], load_state(ada_task.client_state_path(cell, client, rs[-1])))
    # a client never sampled (here: one more client in the list): W^1 as its local adapter
    extra = dict(cell, clients=[*cell["clients"], "Late"], eval_clients=["Late"])
    assert _equal(ada_task.final_states(extra)["Late"], initial)
    first = [Path(p).read_bytes() for p in helpers.cell_outputs(cell)[:2]]
    # a run killed after its clients wrote round 4 but before the server's checkpoint resumes
    checkpoint_paths(cell["out_dir"], rounds)[1].unlink()
    for p in helpers.cell_outputs(cell):
        Path(p).unlink()
    run_cell(cell, *helpers.cell_outputs(cell))
    assert [Path(p).read_bytes() for p in helpers.cell_outputs(cell)[:2]] == first
    # and a rerun from scratch gives the same bytes
    again = dict(cell, out_dir=str(root / f"sampled-{method}-again"), keep_round_checkpoints=False)
    run_cell(again, *helpers.cell_outputs(again))
    assert [Path(p).read_bytes() for p in helpers.cell_outputs(again)[:2]] == first


def _whitespace_pos_tags(cell: dict, root: Path) -> dict:
    """POS files for AdaFedHardKD without spaCy: every whitespace word of each training target,
    tagged NOUN (the format of the ``adafedseleckd_pos_tags`` rule)."""
    from fedrepro.io import read_jsonl, write_jsonl_atomic

    out = {}
    for client, folder in cell["client_data"].items():
        recs = []
        for r in read_jsonl(Path(folder) / "train.jsonl"):
            words, at = [], 0
            for w in r["target"].split():
                start = r["target"].index(w, at)
                words.append({"text": w, "start": start, "end": start + len(w), "pos": "NOUN"})
                at = start + len(w)
            recs.append({"id": r["id"], "target": r["target"], "words": words})
        path = root / "pos" / f"{client}.jsonl"
        write_jsonl_atomic(path, recs)
        out[client] = str(path)
    return out


def test_only_the_methods_shared_tensors_and_scalars_reach_the_server(world, tmp_path, wire):
    """Issue 17, item 5, at the engine: one round of every federated AdaFedSelecKD method; every
    reply the server pulls holds exactly the global adapter the server broadcasts (the method's
    shared set) and scalar statistics -- no token ids, no text, no per-example arrays."""
    from helpers import check_wire

    from fedrepro.papers.adafedseleckd import task as ada_task
    from fedrepro.papers.adafedseleckd.methods import METHODS

    root, folders, backbone = world
    federated = [m for m, spec in METHODS.items() if spec.federated]
    for method in federated:
        wire.replies.clear()
        cell = helpers.make_cell(tmp_path, method, backbone, folders, rounds=1, out_name=f"wire-{method}")
        cell["engine"] = "inprocess"
        if METHODS[method].hard_kd:
            cell.update(pos_tags=_whitespace_pos_tags(cell, tmp_path), hard_kd_tags=["NOUN"])
        if METHODS[method].server == "fedopt":
            cell["server_optimizer"] = {"name": "adam", "eta": 0.01, "beta_1": 0.9, "beta_2": 0.99, "tau": 0.001}
        run_cell(cell, *helpers.cell_outputs(cell))
        shared = {k: tuple(v.shape) for k, v in ada_task.initial_state(cell).items()}
        counts = check_wire(wire, shared, examples={0: 12, 1: 12, 2: 12})
        assert counts["train"] == 3 and counts["arrays"] == 3 * len(shared), method
    assert len(federated) == 7


# -- kill at a random moment, rerun, compare (issue 17; tests/faults.py) ------------------------------
KILL_ROUNDS = 3
ROW = ["AdaFedAvg", "AdaFedKD", "AdaFedSelectKD"]  # adafedseleckd.grid.ROW_METHODS


@pytest.fixture(scope="module")
def killable(world, tmp_path_factory):
    """A 3-round AdaFedSelectKD cell job and a ``cells_per_job: row`` job (the three methods,
    2 rounds each, trained and evaluated by ``evaluate.run_row``) on the in-process engine, and
    the uninterrupted run of each (the references)."""
    from fedrepro.papers.adafedseleckd.grid import ROW_METHODS

    assert ROW == list(ROW_METHODS)
    _, folders, backbone = world
    root = tmp_path_factory.mktemp("ada-kill")
    cell = dict(helpers.make_cell(root, "AdaFedSelectKD", backbone, folders, rounds=KILL_ROUNDS),
                engine="inprocess")
    cell_job = faults.cell_job(cell)
    cells = [dict(helpers.make_cell(root, m, backbone, folders, rounds=2), engine="inprocess",
                  out_dir=f"cells/{m}") for m in ROW]
    row_job = ("fedrepro.papers.adafedseleckd.evaluate:run_row", [cells])
    return {
        "cell": (root / "cell", cell_job, faults.run(root / "cell" / "reference", *cell_job)),
        "row": (root / "row", row_job, faults.run(root / "row" / "reference", *row_job)),
    }


def test_a_cell_killed_inside_a_client_state_write_reruns_to_the_same_bytes(killable):
    """SIGKILL inside a seeded write of a client's local adapter (AdaFedSelectKD keeps one per
    client): the rerun resumes after the last complete round; every output (adapters, round log,
    KD trace, provenance) equals the uninterrupted run's, run in another process."""
    root, job, seconds = killable["cell"]
    res = faults.check_kill_and_rerun(root, job, ["out"], KILL_ROUNDS, "write", 1, seconds,
                                      writes_per_round=3)
    assert res["plan"]["match"] == "/clients/" and res["rerun"] is not None


def test_a_killed_row_job_restores_its_finished_runs_instead_of_retraining_them(killable):
    """SIGKILL inside the first checkpoint write of the row's last method: the rerun trains
    neither AdaFedAvg nor AdaFedKD again (restored from their receipts, evaluation included)."""
    root, job, seconds = killable["row"]
    dirs = [f"cells/{m}" for m in ROW]
    work = root / "third-run"
    res = faults.kill_and_rerun(work, *job, dirs, "write",
                                match="/cells/AdaFedSelectKD/checkpoints/server_round_")
    assert [res["at_kill"][d]["trained"] for d in dirs] == [True, True, False]
    assert res["rerun"] == dict(zip(dirs, [[], [], [1, 2]]))
    for d in dirs:
        faults.assert_same_tree(root / "reference" / d, work / d)


@pytest.mark.exhaustive
@pytest.mark.parametrize("kind,seed", [("start", 0), ("after_round", 1), ("random", 2),
                                       ("random", 3), ("write", 4), ("write", 5)])
def test_a_cell_killed_at_seeded_moments_reruns_to_the_same_bytes(killable, kind, seed):
    root, job, seconds = killable["cell"]
    faults.check_kill_and_rerun(root, job, ["out"], KILL_ROUNDS, kind, seed, seconds,
                                writes_per_round=3)


@pytest.mark.exhaustive
@pytest.mark.parametrize("kind,seed", [("random", 0), ("random", 1), ("random", 2), ("random", 3),
                                       ("write", 4), ("write", 5)])
def test_a_row_job_killed_at_seeded_moments_reruns_to_the_same_bytes(killable, kind, seed):
    root, job, seconds = killable["row"]
    faults.check_kill_and_rerun(root, job, [f"cells/{m}" for m in ROW], 2, kind, seed, seconds,
                                writes_per_round=3)


# -- same seed, same bits, on both engines (issue 17) ----------------------------------------------
def test_inprocess_engine_gives_the_same_bits_as_flower_simulation(world):
    """AdaFedSelectKD, 2 rounds, on the in-process engine and on Flower's Ray simulation engine:
    the same adapters, round log and KD trace, and so the same predictions and scores (FedMCP,
    FedSum and FedSUMM have the same check in their runner tests)."""
    from fedrepro.papers.adafedseleckd.evaluate import evaluate_cell

    root, folders, backbone = world
    outs = {}
    for engine in ("inprocess", "simulation"):
        cell = dict(helpers.make_cell(root, "AdaFedSelectKD", backbone, folders, rounds=2,
                                      out_name=f"engine-{engine}"), engine=engine)
        run_cell(cell, *helpers.cell_outputs(cell))
        out = Path(cell["out_dir"])
        evaluate_cell(cell, str(out / "adapters.safetensors"), str(out / "predictions.jsonl"),
                      str(out / "scores.json"))
        outs[engine] = out
    for name in ("adapters.safetensors", "train_log.json", "kd_trace.json", "predictions.jsonl",
                 "scores.json"):
        assert (outs["inprocess"] / name).read_bytes() == (outs["simulation"] / name).read_bytes(), name
    assert json.loads((outs["simulation"] / "provenance.json").read_text())["engine"] == "simulation"
