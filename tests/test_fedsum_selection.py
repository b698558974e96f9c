"""FedSum's per-round client selection (``fedsum.client_selection``): size-proportional without
replacement for FedSum and FedProx, uniform for the other baselines (the authors' code), seeded by
(cell seed, round) -- checked against the exact selection probabilities."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import yaml
from helpers import ROOT, configs

from fedrepro.io import InputError, read_json, write_json_atomic, write_jsonl_atomic
from fedrepro.papers.fedsum import grid as wfsum
from fedrepro.papers.fedsum import strategy as S
from fedrepro.papers.fedsum import task as fedsum_task


def _inclusion(sizes: list[int], k: int) -> tuple[np.ndarray, dict]:
    """Exact probabilities of successive sampling ∝ size without replacement (every ordered draw
    enumerated): per client, and per chosen set."""
    s = np.asarray(sizes, float)
    per_client, per_set = np.zeros(len(s)), {}

    def walk(left: list[int], prob: float, chosen: tuple):
        if len(chosen) == k:
            key = tuple(sorted(chosen))
            per_set[key] = per_set.get(key, 0.0) + prob
            for i in chosen:
                per_client[i] += prob
            return
        total = s[left].sum()
        for i in left:
            walk([j for j in left if j != i], prob * s[i] / total, chosen + (i,))

    walk(list(range(len(s))), 1.0, ())
    return per_client, per_set


def _data_folder(root, sizes: dict[str, int], with_sizes_file: bool = True) -> dict:
    for client, n in sizes.items():
        write_jsonl_atomic(root / "clients" / client / "train.jsonl", [{"id": f"{client}-{i}"} for i in range(n)])
    if with_sizes_file:
        write_json_atomic(root / "sizes.json", {"train": sizes, "test": 0})
    return {c: str(root / "clients" / c) for c in sizes}


def _cell(tmp, method: str, sizes: dict[str, int], rule: str | None, per_round: int, **over) -> dict:
    cell = {
        "method": method,
        "seed": 1,
        "clients": list(sizes),
        "client_data": _data_folder(tmp / "data", sizes, over.pop("with_sizes_file", True)),
        "test_file": str(tmp / "data" / "test.jsonl"),
        "clients_per_round": per_round,
        "train": {"rounds": 3, "local_epochs": 1, "lr": 0.005},
        "baselines": {"mu": 1.0},
        "fedsum": {"lam": 0.5, "gamma": 0.3, "pdt_init": "random"},
        **over,
    }
    if rule is not None:
        cell["client_selection"] = rule
    return cell


def _strategy(cell: dict, tmp):
    k, n = int(cell["clients_per_round"]), len(cell["clients"])
    return S.make_strategy(
        cell,
        out_dir=tmp / "out",
        round_offset=0,
        expected_clients=k,
        seed=int(cell["seed"]),
        fraction_train=k / n,
        fraction_evaluate=0.0,
        min_train_nodes=k,
        min_evaluate_nodes=0,
        min_available_nodes=n,
        weighted_by_key="num-examples",
    )


SIZES = {"client01": 1, "client02": 2, "client03": 3, "client04": 10, "client05": 30}


@pytest.mark.parametrize("method", ["FedSum", "FedProx"])
def test_proportional_selection_matches_the_exact_probabilities(tmp_path, method):
    """20,000 seeded rounds of 2 of 5 clients with sizes 1, 2, 3, 10, 30: per-client frequencies
    within 4 standard errors of the exact successive-sampling probabilities, and a chi-square
    over the 10 possible pairs below its 0.1 % critical value (27.88, 9 degrees of freedom)."""
    cell = _cell(tmp_path, method, SIZES, "proportional", 2)
    strat = _strategy(cell, tmp_path)
    rounds = 20_000
    draws = [strat.sample_partitions(r, list(range(5))) for r in range(1, rounds + 1)]
    pi, pairs = _inclusion(list(SIZES.values()), 2)
    # the exact numbers (not k·n_i/n = 0.043 ... 1.30: successive sampling caps the big client)
    assert np.round(pi, 4).tolist() == [0.071, 0.1411, 0.21, 0.6549, 0.923]
    assert round(pairs[(3, 4)], 4) == 0.5888 and round(pairs[(0, 1)], 4) == 0.002
    freq = np.bincount([i for d in draws for i in d], minlength=5) / rounds
    se = np.sqrt(pi * (1 - pi) / rounds)
    assert np.all(np.abs(freq - pi) <= 4 * se), (freq, pi)
    counts: dict = {}
    for d in draws:
        counts[tuple(d)] = counts.get(tuple(d), 0) + 1
    assert set(counts) <= set(pairs)
    chi2 = sum((counts.get(key, 0) - rounds * p) ** 2 / (rounds * p) for key, p in pairs.items())
    assert chi2 < 27.88, chi2
    # the size-blind draw would give every client 2/5 = 0.4
    assert freq[0] < 0.1 and freq[4] > 0.9
    # rerun: a fresh strategy draws the same clients every round; another seed does not
    again = _strategy(_cell(tmp_path, method, SIZES, "proportional", 2), tmp_path)
    assert [again.sample_partitions(r, list(range(5))) for r in range(1, 201)] == draws[:200]
    other = _strategy(_cell(tmp_path, method, SIZES, "proportional", 2, seed=2), tmp_path)
    assert [other.sample_partitions(r, list(range(5))) for r in range(1, 201)] != draws[:200]


def test_the_law_is_that_of_the_authors_numpy_call():
    """The authors' ``np.random.choice(range(K), k, replace=False, p=n_i/n)`` (legacy RandomState)
    has the same selection probabilities as our draw: 20,000 of its draws within 4 standard
    errors of the exact values used above."""
    sizes = np.array(list(SIZES.values()))
    pi, _ = _inclusion(sizes.tolist(), 2)
    np_rng = np.random.RandomState(666)
    rounds = 20_000
    picks = [np_rng.choice(range(5), size=2, replace=False, p=sizes / sizes.sum()) for _ in range(rounds)]
    freq = np.bincount(np.concatenate(picks), minlength=5) / rounds
    assert np.all(np.abs(freq - pi) <= 4 * np.sqrt(pi * (1 - pi) / rounds)), (freq, pi)


def test_first_pick_is_proportional_to_size():
    """The first of the k draws picks client i with probability n_i / n (1/46, 2/46, ... 30/46)."""
    sizes = list(SIZES.values())
    rounds = 20_000
    first = [S.size_proportional_sample(list(range(5)), sizes, 2, random.Random(f"1/sample/{r}"))[0] for r in range(rounds)]
    p = np.asarray(sizes) / sum(sizes)
    freq = np.bincount(first, minlength=5) / rounds
    assert np.all(np.abs(freq - p) <= 4 * np.sqrt(p * (1 - p) / rounds)), (freq, p)
    with pytest.raises(InputError, match="only 1 clients hold data"):
        S.size_proportional_sample([0, 1, 2], [0, 5, 0], 2, random.Random(0))


@pytest.mark.parametrize("method", ["FedAvg", "SCAFFOLD", "FedNova", "FedProto", "FedDC"])
def test_uniform_selection_for_the_other_baselines(tmp_path, method):
    """Uniform: each of 5 clients in 2/5 of 5,000 rounds whatever its size, and the very draw the
    runner made before (SortedCheckpointFedAvg.sample_partitions: random.Random((seed, round)))."""
    cell = _cell(tmp_path, method, SIZES, "uniform", 2)
    strat = _strategy(cell, tmp_path)
    rounds = 5_000
    draws = [strat.sample_partitions(r, list(range(5))) for r in range(1, rounds + 1)]
    freq = np.bincount([i for d in draws for i in d], minlength=5) / rounds
    assert np.all(np.abs(freq - 0.4) <= 4 * math.sqrt(0.4 * 0.6 / rounds)), freq
    assert draws[:50] == [sorted(random.Random(f"1/sample/{r}").sample(range(5), 2)) for r in range(1, 51)]
    legacy = _cell(tmp_path, method, SIZES, None, 2)  # a cell made before the key: uniform
    assert [_strategy(legacy, tmp_path).sample_partitions(r, list(range(5))) for r in range(1, 51)] == draws[:50]


def test_paper_scale_documents_per_round(tmp_path):
    """20 clients, 4 per round, on the Dir = 0.1 split of seed 0 (the authors' re-draw): uniform
    selection trains on 400 documents per round on average, size-proportional on 1,152."""
    from fedrepro.data.partition import dirichlet_quantity_skew

    parts = dirichlet_quantity_skew(2000, 20, 0.1, 0)
    sizes = {f"client{i + 1:02d}": len(p) for i, p in enumerate(parts)}
    n = np.array(list(sizes.values()))
    pi, _ = _inclusion(n.tolist(), 4)
    assert pi.sum() == pytest.approx(4.0)
    assert round(float(pi @ n)) == 1152 and n.mean() * 4 == 400
    strat = _strategy(_cell(tmp_path, "FedSum", sizes, "proportional", 4), tmp_path)
    docs = [n[strat.sample_partitions(r, list(range(20)))].sum() for r in range(1, 2001)]
    assert abs(np.mean(docs) - pi @ n) < 0.03 * (pi @ n)


def test_sizes_come_from_the_data_folder(tmp_path):
    """sizes.json (written with the data folder) gives n_i; an older folder without it: the line
    counts of train.jsonl; a rehearsal cell counts only the documents it keeps."""
    cell = _cell(tmp_path, "FedSum", SIZES, "proportional", 2)
    assert fedsum_task.client_sizes(cell) == SIZES
    (tmp_path / "data" / "sizes.json").unlink()
    assert fedsum_task.client_sizes(cell) == SIZES
    assert fedsum_task.client_sizes(dict(cell, rehearsal={"examples_per_client": 2, "eval_examples": 1})) == {
        c: min(n, 2) for c, n in SIZES.items()
    }


def test_write_data_folder_writes_the_sizes(tmp_path):
    recs = [
        {"id": f"d{i}", "split": "train" if i < 6 else "test", "meta": {"sentences": ["a b c .", "d e f ."]}}
        for i in range(8)
    ]
    write_jsonl_atomic(tmp_path / "records.jsonl", recs)
    write_jsonl_atomic(
        tmp_path / "oracle.jsonl", [{"id": r["id"], "sentences": r["meta"]["sentences"], "labels": [1, 0]} for r in recs]
    )
    write_json_atomic(
        tmp_path / "manifest.json",
        {"clients": {"client01": {"train": ["d0"]}, "client02": {"train": ["d1", "d2", "d3", "d4", "d5"]}},
         "meta": {"shared": {"test": ["d6", "d7"]}}},
    )
    fedsum_task.write_data_folder(
        str(tmp_path / "manifest.json"), str(tmp_path / "records.jsonl"), str(tmp_path / "oracle.jsonl"),
        str(tmp_path / "data"), seed=1,
    )
    assert read_json(tmp_path / "data" / "sizes.json") == {"train": {"client01": 1, "client02": 5}, "test": 2}


def test_config_key_per_method_and_its_errors():
    demo, paper = configs()
    rules = {m: wfsum.make_fedsum_cell(paper, "fedsum-cnndm-a0.1", m, 1).get("client_selection")
             for m in ["Separate", "FedAvg", "FedProx", "SCAFFOLD", "FedNova", "FedProto", "FedDC", "FedSum", "FedSum-lam0.3"]}
    assert rules == {
        "Separate": None,  # every client every round
        "FedAvg": "uniform", "FedProx": "proportional", "SCAFFOLD": "uniform", "FedNova": "uniform",
        "FedProto": "uniform", "FedDC": "uniform", "FedSum": "proportional", "FedSum-lam0.3": "proportional",
    }
    assert wfsum.client_selection(demo, "FedSum-depth") == "proportional"
    bare = yaml.safe_load(yaml.safe_dump(demo))
    del bare["fedsum"]["client_selection"]  # no key: the authors' table
    assert {m: wfsum.client_selection(bare, m) for m in ("FedAvg", "FedProx", "FedSum")} == {
        "FedAvg": "uniform", "FedProx": "proportional", "FedSum": "proportional"}
    bare["fedsum"]["client_selection"] = {"default": "uniform"}  # a table given is the whole table
    assert wfsum.client_selection(bare, "FedSum") == "uniform"
    bare["fedsum"]["client_selection"] = {"FedMagic": "uniform"}
    with pytest.raises(InputError, match="fedsum.client_selection.FedMagic"):
        wfsum.make_fedsum_cell(bare, "fedsum-cnndm-a0.1", "FedAvg", 1)
    bare["fedsum"]["client_selection"] = {"FedAvg": "by_loss"}
    with pytest.raises(InputError, match="fedsum.client_selection.FedAvg must be one of"):
        wfsum.make_fedsum_cell(bare, "fedsum-cnndm-a0.1", "FedAvg", 1)


def test_schema_names_the_keys():
    from fedrepro.config import validate_config

    demo, _ = configs()
    bad = yaml.safe_load(yaml.safe_dump(demo))
    bad["fedsum"]["client_selection"]["FedSum"] = "by_loss"
    bad["partitions"]["fedsum"]["empty_clients"] = "drop"
    with pytest.raises(InputError) as err:
        validate_config(bad, ROOT / "config" / "schema.yaml")
    assert "fedsum.client_selection.FedSum" in str(err.value)
    assert "partitions.fedsum.empty_clients" in str(err.value)
