"""FedSUMM in a rehearsal (``cell["rehearsal"]``): every client trains on its first
``examples_per_client`` records and is evaluated on its first ``eval_examples`` validation / test
records, in the federated regimes and the local ones (``single``, ``all``); every optimizer step
is timed, and the times land in provenance.json, never in train_log.json.

The tiny corpus and the cells are those of tests/test_fedsumm_runner.py (6 train, 2 val, 2 test
records per client; csl-003 has no validation split)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from test_fedsumm_runner import CLIENTS, _cell, _run, spy, world  # noqa: F401 (fixtures)

from fedrepro.fl.strategy import is_measurement
from fedrepro.papers.fedsumm import grid as wfs
from fedrepro.papers.fedsumm import task as fedsumm_task

ROOT = Path(__file__).resolve().parents[1]
LIMITS = {"examples_per_client": 2, "eval_examples": 1}


@pytest.fixture
def reads(monkeypatch):
    """The record ids every evaluation (perplexity, generation) and every training read used."""
    seen: dict[str, list[list[str]]] = {"nll": [], "generate": [], "train": []}
    nll, generate, batches = (
        fedsumm_task.nll_sums,
        fedsumm_task.generate,
        fedsumm_task.epoch_batches,
    )

    def nll_spy(cell, model, tok, records):
        seen["nll"].append([r["id"] for r in records])
        return nll(cell, model, tok, records)

    def generate_spy(cell, model, tok, records):
        seen["generate"].append([r["id"] for r in records])
        return generate(cell, model, tok, records)

    def batches_spy(cell, model, tok, records, name, round_index):
        seen["train"].append([r["id"] for r in records])
        return batches(cell, model, tok, records, name, round_index)

    monkeypatch.setattr(fedsumm_task, "nll_sums", nll_spy)
    monkeypatch.setattr(fedsumm_task, "generate", generate_spy)
    monkeypatch.setattr(fedsumm_task, "epoch_batches", batches_spy)
    return seen


def _keys(obj) -> set[str]:
    """Every dict key anywhere in a JSON document."""
    if isinstance(obj, dict):
        return set(obj) | set().union(*(_keys(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_keys(v) for v in obj))
    return set()


def _first(client: str, split: str, n: int) -> list[str]:
    return [f"{client}-{split}-{i}" for i in range(n)]


def _eval_split(client: str) -> str:
    return "test" if client == "csl-003" else "val"  # csl-003 has no validation split


def _check_timing_is_provenance(out: Path, n_rounds: int) -> list[dict]:
    log = json.loads((out / "train_log.json").read_text())
    assert not [k for k in _keys(log) if is_measurement(k)]  # no seconds* / peak* anywhere
    timing = json.loads((out / "provenance.json").read_text())["timing"]
    assert [t["round"] for t in timing["rounds"]] == list(range(1, n_rounds + 1))
    for t in timing["rounds"]:
        assert t["clients"] and all(c["seconds_steps"] > 0 for c in t["clients"])
        assert all(c["seconds_per_step"] > 0 for c in t["clients"])
    return log["rounds"]


def _check_final_evaluation(cell: dict, tmp_path: Path) -> None:
    out = Path(cell["out_dir"])
    res = fedsumm_task.evaluate_cell(
        cell, str(out / "adapters.safetensors"), str(tmp_path / "p.jsonl"), str(tmp_path / "s.json")
    )
    assert res["n"] == len(CLIENTS) and all(res["per_client"][c]["n"] == 1 for c in CLIENTS)
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").open(encoding="utf-8")]
    # predictions and references stay aligned: one row per client, its first test record
    assert [(r["client"], r["id"]) for r in rows] == [(c, f"{c}-test-0") for c in CLIENTS]
    targets = {
        r["id"]: r["target"]
        for c in CLIENTS
        for r in fedsumm_task._records(str(Path(cell["client_data"][c]) / "test.jsonl"))
    }
    assert all(r["reference"] == targets[r["id"]] for r in rows)


def test_federated_rehearsal_cell_reads_few_examples_and_times_its_steps(
    world, tmp_path, spy, reads  # noqa: F811
):
    cell = _cell(world, tmp_path, "ct", "FedSUMM", "fed", rouge_every_round=True)
    cell["rehearsal"] = dict(LIMITS)
    out = _run(cell)
    # each client trained on its first 2 records (one batch of 4 -> one step), every round
    for call in spy.values():
        stats = call["stats"]
        assert stats["num_examples"] == 2 and stats["n_steps"] == 1
        assert stats["seconds_steps"] > 0 and stats["seconds_per_step"] > 0
    assert sorted(spy) == [(r, c) for r in (1, 2) for c in CLIENTS]
    assert sorted(map(sorted, reads["train"])) == sorted(
        [_first(c, "train", 2) for c in CLIENTS] * 2
    )
    rounds = _check_timing_is_provenance(out, 2)
    for entry in rounds:
        assert [c["num_examples"] for c in entry["clients"]] == [2, 2, 2]
        assert {c: len(s) for c, s in entry["step_losses"].items()} == {c: 1 for c in CLIENTS}
        ev = entry["evaluation"]["per_client"]
        assert all(ev[c]["test_examples"] == 1 for c in CLIENTS)  # ROUGE-L on 1 test record
        assert ev["csl-003"]["perplexity_split"] == "test" and ev["csl-001"]["perplexity_split"] == "val"
    # each client's evaluation (perplexity, ROUGE) used exactly its first record, every round
    expected_nll = sorted([_first(c, _eval_split(c), 1) for c in CLIENTS] * 2)
    assert sorted(reads["nll"]) == expected_nll
    assert sorted(reads["generate"]) == sorted([_first(c, "test", 1) for c in CLIENTS] * 2)
    _check_final_evaluation(cell, tmp_path)


@pytest.mark.parametrize("regime", ["single", "all"])
def test_local_rehearsal_cell_reads_few_examples_and_times_its_steps(
    world, tmp_path, reads, regime  # noqa: F811
):
    cell = _cell(world, tmp_path, "bart", regime, regime, keep_round_checkpoints=True,
                 rouge_every_round=regime == "all")
    cell["rehearsal"] = dict(LIMITS)
    out = _run(cell)
    trained = cell["clients"]
    # the pooled training data: each training client's first 2 records
    assert reads["train"] and all(
        ids == [i for c in trained for i in _first(c, "train", 2)] for ids in reads["train"]
    )
    rounds = _check_timing_is_provenance(out, 2)
    for entry in rounds:
        (client,) = entry["clients"]
        assert client["num_examples"] == 2 * len(trained)
        steps = -(-2 * len(trained) // cell["train"]["batch_size"])  # one epoch of batches of 4
        assert client["n_steps"] == len(next(iter(entry["step_losses"].values()))) == steps
        assert entry["evaluation"]["tokens"] > 0
        if regime == "all":
            assert all(e["test_examples"] == 1 for e in entry["evaluation"]["per_client"].values())
        # the round meta the local run wrote itself carries the step timer's statistics
        meta = json.loads(
            (out / "checkpoints" / f"server_round_{entry['round']:03d}.json").read_text()
        )
        (stats,) = meta["clients"]
        assert stats["seconds_steps"] > 0 and stats["seconds_per_step"] > 0
        assert stats["num_examples"] == 2 * len(trained)
    assert sorted(reads["nll"]) == sorted([_first(c, _eval_split(c), 1) for c in CLIENTS] * 2)
    if regime == "all":
        assert sorted(reads["generate"]) == sorted([_first(c, "test", 1) for c in CLIENTS] * 2)
    else:
        assert reads["generate"] == []  # no ROUGE per round
    _check_final_evaluation(cell, tmp_path)


def test_make_cell_adds_the_rehearsal_limits_only_in_a_rehearsal():
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    corpus, n = wfs.available_corpora(cfg)[0], wfs.table_clients(cfg)
    normal = wfs.row_cells(cfg, "table", corpus, n, "ct", 1)
    assert all("rehearsal" not in c for c in normal)
    rehearsal = copy.deepcopy(cfg)
    rehearsal["rehearsal"] = True
    rehearsal["rehearsal_settings"] = dict(LIMITS)
    cells = wfs.row_cells(rehearsal, "table", corpus, n, "ct", 1)
    assert [c["rehearsal"] for c in cells] == [LIMITS] * len(wfs.REGIMES)
    assert [{k: v for k, v in c.items() if k != "rehearsal"} for c in cells] == normal
    assert wfs.make_cell(rehearsal, corpus, n, "bart", "FedAvg", 1)["rehearsal"] == LIMITS
