"""Rehearsal hooks of FedMCP and FedSum: a cell with ``rehearsal = {examples_per_client: 2,
eval_examples: 1}`` trains every client on its first 2 examples and evaluates 1 test example
(per client for FedMCP, 1 test document for FedSum); every client round reports its step times
(``seconds_*``), which the runner keeps out of ``train_log.json`` and writes to provenance's
``timing``; a normal cell gets no ``rehearsal`` key (same config hash).

Fixtures: the tiny worlds of ``test_fedmcp_runner.py`` and ``test_fedsum_runner.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedrepro.fl.cell import run_cell
from fedrepro.fl.strategy import MEASUREMENT_PREFIXES
from fedrepro.io import read_json, read_jsonl

REHEARSAL = {"examples_per_client": 2, "eval_examples": 1}


def _keys(obj) -> list[str]:
    """Every mapping key anywhere in a JSON document."""
    if isinstance(obj, dict):
        return [k for k, v in obj.items() for k in [k, *_keys(v)]]
    if isinstance(obj, list):
        return [k for v in obj for k in _keys(v)]
    return []


def _measurements(obj) -> list[str]:
    return [k for k in _keys(obj) if k.replace("-", "_").startswith(MEASUREMENT_PREFIXES)]


def _run(cell: dict) -> Path:
    out = Path(cell["out_dir"])
    run_cell(cell, out / "adapters.safetensors", out / "train_log.json", out / "provenance.json")
    return out


def _check_timing_split(out: Path, n_clients: int) -> list[dict]:
    """train_log.json holds no measurement; provenance.json's timing has each client's."""
    log = read_json(out / "train_log.json")["rounds"]
    assert _measurements(log) == []
    timing = read_json(out / "provenance.json")["timing"]["rounds"]
    assert [t["round"] for t in timing] == [e["round"] for e in log]
    for t in timing:
        assert len(t["clients"]) == n_clients
        assert all(c["seconds_steps"] > 0 and c["seconds_per_step"] > 0 for c in t["clients"])
    return log


# -- FedMCP --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mcp_world(tmp_path_factory):
    from test_fedmcp_runner import world

    return world.__wrapped__(tmp_path_factory)


def _mcp_cell(world, tmp: Path, method: str, name: str) -> dict:
    from test_fedmcp_runner import _cell

    return {**_cell(world, tmp, method, rounds=1, name=name), "rehearsal": dict(REHEARSAL)}


def test_fedmcp_client_round_trains_two_examples_and_times_its_steps(mcp_world, tmp_path):
    from fedrepro.papers.fedmcp import task as mcp_task

    cell = _mcp_cell(mcp_world, tmp_path, "FedMCP", "direct")
    _, stats = mcp_task.client_train_round(cell, "MRPC", 1, mcp_task.initial_state(cell))
    assert stats["num_examples"] == 2 and stats["n_steps"] == 1  # batch_size 4 > 2 examples
    assert stats["seconds_steps"] > 0 and stats["seconds_per_step"] > 0
    assert stats["test_accuracy"] in (0.0, 100.0)  # one test example
    assert len(mcp_task.client_examples(cell, "MRPC", "train")) == 2
    assert len(mcp_task.client_examples(cell, "MRPC", "val")) == 1
    normal = {k: v for k, v in cell.items() if k != "rehearsal"}
    assert len(mcp_task.client_examples(normal, "MRPC", "train")) == 10


@pytest.mark.parametrize("method", ["FedMCP", "Local"])
def test_fedmcp_rehearsal_cell(mcp_world, tmp_path, method):
    from test_fedmcp_runner import TASKS

    from fedrepro.papers.fedmcp.task import evaluate_cell

    cell = _mcp_cell(mcp_world, tmp_path, method, method)
    out = _run(cell)
    log = _check_timing_split(out, len(TASKS))
    assert [c["num_examples"] for c in log[0]["clients"]] == [2] * len(TASKS)
    scores = evaluate_cell(cell, str(out / "adapters.safetensors"), str(out / "p.jsonl"),
                           str(out / "s.json"))
    assert {c: s["n"] for c, s in scores.items()} == {t: 1 for t in TASKS}
    preds = read_jsonl(out / "p.jsonl")
    first = {t: read_jsonl(Path(cell["client_data"][t]) / "test.jsonl")[0] for t in TASKS}
    assert [(p["client"], p["id"], p["label"]) for p in preds] == [
        (t, first[t]["id"], first[t]["label"]) for t in TASKS
    ]
    logged = {TASKS[c["partition_id"]]: c["test_accuracy"] for c in log[-1]["clients"]}
    assert {c: s["accuracy"] for c, s in scores.items()} == logged


# -- FedSum --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sum_world(tmp_path_factory):
    from test_fedsum_runner import world

    return world.__wrapped__(tmp_path_factory)


def _sum_cell(world, tmp: Path, method: str, name: str) -> dict:
    from test_fedsum_runner import CLIENTS, _cell

    return {**_cell(world, tmp, method, rounds=1, name=name, clients_per_round=len(CLIENTS)),
            "rehearsal": dict(REHEARSAL)}


def test_fedsum_client_round_trains_two_documents_and_times_its_steps(sum_world, tmp_path):
    from fedrepro.papers.fedsum import task as fedsum_task

    cell = _sum_cell(sum_world, tmp_path, "FedAvg", "direct")
    _, stats, _ = fedsum_task.client_train_round(cell, "client04", 1, fedsum_task.initial_state(cell))
    assert stats["num_examples"] == 2 and stats["steps"] == 1  # batch_size 2
    assert stats["seconds_steps"] > 0 and stats["seconds_per_step"] > 0
    assert len(fedsum_task.test_docs(cell)) == 1
    normal = {k: v for k, v in cell.items() if k != "rehearsal"}
    assert len(fedsum_task.client_docs(normal, "client04")) == 7
    assert len(fedsum_task.test_docs(normal)) == 6


@pytest.mark.parametrize("method", ["FedAvg", "FedSum", "FedProto", "Separate"])
def test_fedsum_rehearsal_cell(sum_world, tmp_path, method):
    from test_fedsum_runner import CLIENTS

    from fedrepro.papers.fedsum.scores import write_cell_scores

    cell = _sum_cell(sum_world, tmp_path, method, method)
    out = _run(cell)
    log = _check_timing_split(out, len(CLIENTS))
    assert [c["num_examples"] for c in log[0]["clients"]] == [2] * len(CLIENTS)
    test_file = str(Path(cell["test_file"]))
    first = read_jsonl(test_file)[0]["id"]
    ev = log[0]["evaluation"]
    assert ev["metrics"]["n"] == 1
    assert all(list(sel) == [first] for sel in ev["selected"].values())
    if method in ("FedProto", "Separate"):  # each client's own model, on the same document
        assert sorted(ev["per_client"]) == CLIENTS
        assert all(m["n"] == 1 for m in ev["per_client"].values())
    scores = write_cell_scores(cell, str(out / "train_log.json"), test_file,
                               str(out / "scores.json"), str(out / "predictions.jsonl"))
    assert scores["n"] == 1
    preds = read_jsonl(out / "predictions.jsonl")
    assert {p["id"] for p in preds} == {first}
    assert len(preds) == (len(CLIENTS) if method in ("FedProto", "Separate") else 1)


# -- grids ---------------------------------------------------------------------------------------
def test_grid_cells_carry_the_rehearsal_only_in_a_rehearsal():
    from helpers import configs

    from fedrepro.papers.fedmcp import grid as mcp_grid
    from fedrepro.papers.fedsum import grid as sum_grid

    config = configs()[0]
    settings = {"examples_per_client": 2, "eval_examples": 1}
    rehearsal = {**config, "rehearsal": True,
                 "rehearsal_settings": {**config.get("rehearsal_settings", {}), **settings}}
    bb = config["fedmcp"]["backbone"]
    assert "rehearsal" not in mcp_grid.make_cell(config, bb, "FedMCP", 1)
    assert mcp_grid.make_cell(rehearsal, bb, "FedMCP", 1)["rehearsal"] == settings
    run = sum_grid.target_runs(config, "table1")[0]
    for cells in ([sum_grid.make_fedsum_cell(config, run["setting"], run["method"], 1)],
                  sum_grid.row_cells(config, run["setting"], 1)):
        assert all("rehearsal" not in c for c in cells)
    for cells in ([sum_grid.make_fedsum_cell(rehearsal, run["setting"], run["method"], 1)],
                  sum_grid.row_cells(rehearsal, run["setting"], 1)):
        assert all(c["rehearsal"] == settings for c in cells)
