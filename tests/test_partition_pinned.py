"""The client splits pinned: which ids a seed gives each client, and the edges of every split
function (from the mutation run of ``fedrepro.data.partition``, docs/mutation.md).

``tests/test_partition.py`` checks what the papers state -- sizes, disjointness, coverage, skew.
Those properties hold for *any* seeded shuffle, so a changed seed salt (two domains or two splits
shuffled by one permutation, a dropped seed) passed them.  The digests below pin the manifests
themselves: a split is part of a result's identity (same seed, same split, same bits), and a
change here changes every cell trained on it.  A digest that changes on purpose (a new rule, or a
NumPy release whose ``Generator`` streams change) is updated together with a note in
docs/decisions.md: earlier results then rest on other splits.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

import numpy as np
import pytest

from fedrepro.data import partition as P
from fedrepro.io import InputError, write_json_atomic, write_jsonl_atomic


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


IDS = [f"x{i:03d}" for i in range(60)]
DOMAINS = {
    d: {"train": [f"{d}-tr{i:02d}" for i in range(12)], "val": [f"{d}-va{i}" for i in range(5)],
        "test": [f"{d}-te{i}" for i in range(5)]}
    for d in ("acad", "comm", "prod")
}
TASKS = {t: {"train": [f"{t}{i}" for i in range(n)], "val": [f"{t}v{i}" for i in range(3)]}
         for t, n in (("MRPC", 17), ("SST-2", 30), ("RTE", 12))}
CORPUS = {"train": [f"t{i}" for i in range(20)], "val": [f"v{i}" for i in range(6)],
          "test": [f"s{i}" for i in range(7)]}
LENGTHS = {i: (int(i[1:]) * 37) % 101 + 5 for s in CORPUS.values() for i in s}


# -- the manifests a seed gives ----------------------------------------------------------------
def test_equal_parts_pinned():
    assert P.equal_parts([f"e{i}" for i in range(7)], 3, 1, "s") == [
        ["e3", "e1"], ["e4", "e0", "e5"], ["e6", "e2"]]
    # the salt is part of the stream: another salt, another order
    assert P.equal_parts([f"e{i}" for i in range(7)], 3, 1, "t") != P.equal_parts(
        [f"e{i}" for i in range(7)], 3, 1, "s")


@pytest.mark.parametrize("name, make, expected", [
    ("iid_balanced", lambda: P.iid_balanced(DOMAINS, 3, 5), "0299f7ca886e93a1"),
    ("noniid_balanced", lambda: P.noniid_balanced(DOMAINS, {"train": 4, "val": 2, "test": 2}, 5),
     "0f6678a192a474bf"),
    ("dirichlet redraw", lambda: P.dirichlet_quantity_skew(50, 5, 0.5, 7, "redraw"), "7cd1c6a09cc1a954"),
    ("dirichlet add_one", lambda: P.dirichlet_quantity_skew(50, 5, 0.5, 7, "add_one"), "bed8737d853cac3f"),
    ("dirichlet inf", lambda: P.dirichlet_quantity_skew(23, 5, math.inf, 7), "cdbbd9aec8bd2789"),
    ("fedsum_scarcity", lambda: P.fedsum_scarcity(IDS, 40, 4, 1.0, 3), "6d750c59ea153758"),
    ("fedmcp_cross_task", lambda: P.fedmcp_cross_task(TASKS, 4), "0dd260de4852e46c"),
    ("fedsumm_clients", lambda: P.fedsumm_clients(CORPUS, 3, 2, "csl"), "b0d790b5da17eddc"),
    ("fedsumm_length_skew", lambda: P.fedsumm_length_skew_clients(CORPUS, LENGTHS, 3, 2, "csl", 0.5, 3),
     "e68e855caa3f8efc"),
])
def test_a_seed_gives_the_same_manifest_as_before(name, make, expected):
    assert _digest(make()) == expected, f"{name}: the split of this seed changed (module docstring)"


def test_domains_and_splits_draw_their_own_permutations():
    """Two domains (and two splits) whose ids sort alike are not cut alike: each (domain, split)
    has its own stream."""
    twins = {d: {s: [f"{d}-{s}-{i:02d}" for i in range(12)] for s in ("train", "val")} for d in ("a", "b")}

    def cut(manifest, domain, split):
        return [sorted(int(i[-2:]) for i in manifest[c][split] if i.startswith(f"{domain}-")) for c in manifest]

    m = P.iid_balanced(twins, 3, 0)
    assert cut(m, "a", "train") != cut(m, "b", "train") and cut(m, "a", "train") != cut(m, "a", "val")
    n = P.noniid_balanced(twins, {"train": 4, "val": 4}, 0)
    assert sorted(i[-2:] for i in n["a"]["train"]) != sorted(i[-2:] for i in n["b"]["train"])
    assert sorted(i[-2:] for i in n["a"]["train"]) != sorted(i[-2:] for i in n["a"]["val"])


# -- the edges -----------------------------------------------------------------------------------
def test_one_part_and_exact_supplies_are_allowed():
    ids = [f"e{i}" for i in range(5)]
    assert sorted(P.equal_parts(ids, 1, 0)[0]) == ids
    with pytest.raises(ValueError):
        P.equal_parts(ids, 0, 0)
    # exactly as many examples as asked for: every one is drawn
    exact = {"d": {"train": ["a", "b"], "val": ["c"]}}
    assert P.noniid_balanced(exact, {"train": 2, "val": 1}, 0) == {"d": {"train": ["a", "b"], "val": ["c"]}}
    assert sorted(sum(P.fedsum_scarcity(IDS[:8], 8, 2, 1.0, 0).values(), [])) == IDS[:8]
    assert [len(b) for b in P.dirichlet_quantity_skew(4, 1, 0.5, 0)] == [4]  # one client
    assert [len(b) for b in P.dirichlet_quantity_skew(3, 3, math.inf, 0)] == [1, 1, 1]
    three = {"train": ["a", "b", "c"], "test": ["d", "e", "f"]}
    assert all(len(s["train"]) == 1 for s in P.fedsumm_clients(three, 3, 0, "csl").values())
    assert all(len(s["train"]) == 1 for s in P.fedsumm_length_skew_clients(
        three, dict.fromkeys("abcdef", 10), 3, 0, "csl", 1.0, 2).values())
    assert P.length_bucket_edges([5, 1, 9, 3], 2) == [5]


def test_the_refusals_name_what_is_missing():
    with pytest.raises(InputError, match="needs 2 val examples of d, only 0 exist"):
        P.noniid_balanced({"d": {"train": ["a", "b"]}}, {"train": 1, "val": 2}, 0)
    with pytest.raises(ValueError, match="n >= num_clients >= 1"):
        P.dirichlet_quantity_skew(4, 0, 0.5, 0)
    with pytest.raises(ValueError, match="n >= num_clients"):
        P.dirichlet_quantity_skew(2, 3, 0.5, 0)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        P.dirichlet_quantity_skew(10, 2, 0.0, 0)
    with pytest.raises(InputError, match="needs 9 training examples, only 8"):
        P.fedsum_scarcity(IDS[:8], 9, 2, 1.0, 0)
    with pytest.raises(InputError, match="no test split"):
        P.fedsumm_clients({"train": ["a"]}, 1, 0, "csl")
    with pytest.raises(InputError, match="has 2 examples, fewer than 3 clients"):
        P.fedsumm_clients({"train": ["a", "b", "c"], "test": ["d", "e"]}, 3, 0, "csl")
    for bad in (1, 2.0, True):
        with pytest.raises(InputError, match="length_buckets"):
            P.fedsumm_length_skew_clients(CORPUS, LENGTHS, 3, 0, "csl", 0.5, bad)
    with pytest.raises(InputError, match="no source length for record t0"):
        P.fedsumm_length_skew_clients(CORPUS, {k: v for k, v in LENGTHS.items() if k != "t0"}, 3, 0, "csl", 0.5)
    with pytest.raises(InputError, match="fewer than 3 clients"):
        P.fedsumm_length_skew_clients({"train": ["a", "b", "c"], "test": ["d", "e"]},
                                      dict.fromkeys("abcde", 1), 3, 0, "csl", 0.5, 2)
    with pytest.raises(ValueError, match=r"id b is in \('A', 'train'\) and in \('B', 'val'\)"):
        P.check_disjoint({"A": {"train": ["a", "b"]}, "B": {"val": ["b"]}})


def test_uniform_sizes_give_the_remainder_to_the_first_clients():
    assert [len(b) for b in P.dirichlet_quantity_skew(23, 5, math.inf, 0)] == [5, 5, 5, 4, 4]
    blocks = P.dirichlet_quantity_skew(23, 5, math.inf, 0)
    assert sorted(sum(blocks, [])) == list(range(23))


def test_fedsum_clients_are_numbered_from_01_and_max_redraws_reaches_the_draws():
    split = P.fedsum_scarcity(IDS, 40, 4, 1.0, 3)
    assert list(split) == ["client01", "client02", "client03", "client04"]
    # Dir(0.1) over 20 clients and 40 examples: one draw is (almost) never enough
    with pytest.raises(InputError, match="no draw in 1 gave every client"):
        P.fedsum_scarcity(IDS, 40, 20, 0.1, 3, max_redraws=1)


def test_a_task_without_validation_ids_and_the_val_ratio_of_the_split():
    no_val = {"MRPC": {"train": [f"m{i}" for i in range(10)]}, "RTE": {"train": [f"r{i}" for i in range(20)]}}
    out = P.fedmcp_cross_task(no_val, 0)
    assert {t: sum(len(v) for v in s.values()) for t, s in out.items()} == {"MRPC": 10, "RTE": 10}
    split = P.fedmcp_cross_task(TASKS, 4, ratios=(0.5, 0.3, 0.2))
    sizes = {t: {s: len(v) for s, v in sp.items()} for t, sp in split.items()}
    assert sizes["MRPC"] == {"train": 10, "val": 6, "test": 4}  # 20 merged: 0.5 / 0.3 / rest
    assert sizes["RTE"] == {"train": 8, "val": 4, "test": 3}


def test_largest_remainder_is_hamilton_s_method_with_ties_to_the_lower_index():
    assert P._largest_remainder(10, np.array([1.0, 1.0, 1.0])).tolist() == [4, 3, 3]
    assert P._largest_remainder(7, np.array([0.5, 0.3, 0.2])).tolist() == [4, 2, 1]  # 3.5, 2.1, 1.4
    assert P._largest_remainder(5, np.array([0.1, 0.45, 0.45])).tolist() == [1, 2, 2]  # .5 .25 .25
    assert P._largest_remainder(3, np.array([0.2, 0.2, 0.6])).dtype.kind == "i"


def test_fit_to_supply_leaves_an_empty_bucket_empty_and_meets_both_margins():
    wanted = np.array([[3.0, 1.0, 1.0], [1.0, 1.0, 3.0]])
    rows, columns = np.array([5.0, 5.0]), np.array([6.0, 0.0, 4.0])
    t = P.fit_to_supply(wanted, rows, columns)
    assert t[:, 1].tolist() == [0.0, 0.0]
    assert np.allclose(t.sum(axis=1), rows, atol=1e-8) and np.allclose(t.sum(axis=0), columns, atol=1e-8)
    # a bucket no client wants still receives its supply (the 1e-12 floor of every row)
    t = P.fit_to_supply(np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([2.0, 2.0]), np.array([3.0, 1.0]))
    assert np.allclose(t.sum(axis=0), [3.0, 1.0], atol=1e-6)
    with pytest.raises(ValueError, match="totals differ"):
        P.fit_to_supply(wanted, rows, np.array([6.0, 0.0, 5.0]))


def test_redraw_acceptance_edges_and_pinned_values():
    assert P.redraw_acceptance(10, 1, 0.5) == 1.0  # one client always has every example
    assert P.redraw_acceptance(3, 5, 0.5) == 0.0  # 5 clients, 3 examples: impossible
    assert P.redraw_acceptance(80, 20, 0.1) == pytest.approx(2.2558588977489705e-14, rel=1e-9)
    assert P.redraw_acceptance(40, 5, 0.3) == pytest.approx(0.07897228862103836, rel=1e-9)
    # its own generator: the estimate does not depend on (or move) a global stream
    np.random.seed(1)
    a = P.redraw_acceptance(40, 5, 0.3)
    np.random.seed(2)
    assert P.redraw_acceptance(40, 5, 0.3) == a


def test_redraw_counts_its_draws_and_says_how_many_it_expected():
    rng = np.random.default_rng(0)
    p, used = P.redraw_proportions(rng, 40, 5, 0.3, 1000)  # rate ~0.08: a few draws
    assert used > 1 and p.min() * 40 >= 1
    # the draws counted are those the generator gave: the accepted row is draw number `used`
    again = np.random.default_rng(0).dirichlet(np.full(5, 0.3), size=min(P.REDRAW_BATCH, 1000))
    assert np.array_equal(again[used - 1], p) and (again[: used - 1].min(axis=1) * 40 < 1).all()
    assert P.redraw_proportions(np.random.default_rng(0), 1000, 2, 10.0, 1)[1] == 1  # one draw allowed
    with pytest.raises(InputError, match="max_redraws must be >= 1"):
        P.redraw_proportions(np.random.default_rng(0), 40, 5, 0.3, 0)
    # impossible (3 examples, 5 clients): the estimate after the first batch says never
    with pytest.raises(InputError, match=r"redraw needs never \(rate 0\) draws"):
        P.redraw_proportions(np.random.default_rng(0), 3, 5, 0.5, P.REDRAW_BATCH + 1)
    # possible but rare: the expected number of draws, 1 / rate, in the message
    rate = P.redraw_acceptance(80, 20, 0.1)
    with pytest.raises(InputError, match=re.escape(f"redraw needs about {1.0 / rate:.3g} draws")):
        P.redraw_proportions(np.random.default_rng(0), 80, 20, 0.1, P.REDRAW_BATCH + 1)


def test_materialize_names_an_unknown_record(tmp_path):
    write_jsonl_atomic(tmp_path / "r.jsonl", [{"id": "a", "input": "x"}])
    write_json_atomic(tmp_path / "m.json", {"meta": {}, "clients": {"A": {"train": ["a", "zz"]}}})
    with pytest.raises(InputError, match="unknown record id zz for client A"):
        P.materialize(str(tmp_path / "m.json"), [str(tmp_path / "r.jsonl")], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # nothing half-written
