"""Client splits: sizes the papers state, disjointness, coverage and determinism by seed."""

import math

import numpy as np
import pytest

from fedrepro.data import partition as P
from fedrepro.io import InputError

QMSUM_SIZES = {"Academic": (218, 45, 49), "Committee": (284, 67, 66), "Product": (593, 125, 129)}


def _qmsum_ids():
    return {
        d: {s: [f"{d}-{s}-{i}" for i in range(n)] for s, n in zip(("train", "val", "test"), sizes)}
        for d, sizes in QMSUM_SIZES.items()
    }


def _all_ids(manifest):
    return [i for splits in manifest.values() for ids in splits.values() for i in ids]


def test_natural_keeps_every_domain_as_one_client():
    m = P.natural(_qmsum_ids())
    assert {c: tuple(len(m[c][s]) for s in ("train", "val", "test")) for c in m} == QMSUM_SIZES
    P.check_disjoint(m)


def test_iid_balanced_gives_each_client_a_third_of_every_domain():
    ids = _qmsum_ids()
    m = P.iid_balanced(ids, 3, seed=1)
    assert sorted(m) == ["client1", "client2", "client3"]
    for d, (tr, va, te) in QMSUM_SIZES.items():
        for c in m:
            n = sum(1 for i in m[c]["train"] if i.startswith(d + "-"))
            assert n in (tr // 3, tr // 3 + 1)
    assert sorted(_all_ids(m)) == sorted(_all_ids(ids))  # disjoint cover
    P.check_disjoint(m)
    assert P.iid_balanced(ids, 3, seed=1) == m
    assert P.iid_balanced(ids, 3, seed=2) != m  # re-drawn per seed


def test_noniid_balanced_draws_200_40_40_per_domain():
    m = P.noniid_balanced(_qmsum_ids(), {"train": 200, "val": 40, "test": 40}, seed=3)
    for d in QMSUM_SIZES:
        assert [len(m[d][s]) for s in ("train", "val", "test")] == [200, 40, 40]
        assert all(i.startswith(d + "-") for s in m[d] for i in m[d][s])
    assert P.noniid_balanced(_qmsum_ids(), {"train": 200, "val": 40, "test": 40}, seed=4) != m
    with pytest.raises(InputError, match="needs 50 val examples of Academic, only 45"):
        P.noniid_balanced(_qmsum_ids(), {"val": 50}, seed=3)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0, 8.0, math.inf])
def test_dirichlet_quantity_skew_is_a_disjoint_cover_with_no_empty_client(alpha):
    parts = P.dirichlet_quantity_skew(2000, 20, alpha, seed=0)
    assert len(parts) == 20 and all(len(p) >= 1 for p in parts)
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(2000))
    assert parts == P.dirichlet_quantity_skew(2000, 20, alpha, seed=0)
    if math.isinf(alpha):
        assert {len(p) for p in parts} == {100}


def test_dirichlet_skew_grows_with_smaller_alpha():
    def spread(alpha):
        return np.mean([np.std([len(p) for p in P.dirichlet_quantity_skew(2000, 20, alpha, s)]) for s in range(5)])

    assert spread(0.1) > spread(1.0) > spread(8.0)


def test_fedsum_scarcity_takes_2000_examples():
    train = [f"cnndm-train-{i}" for i in range(5000)]
    clients = P.fedsum_scarcity(train, 2000, 20, 0.1, seed=0)
    assert len(clients) == 20 and sum(len(v) for v in clients.values()) == 2000
    assert len({i for v in clients.values() for i in v}) == 2000


def test_fedmcp_cross_task_caps_at_mrpc_and_splits_622():
    sizes = {"MRPC": (3668, 408), "RTE": (2490, 277), "SST-2": (67349, 872), "QNLI": (104743, 5463),
             "QQP": (363846, 40430), "MNLI": (392702, 9815)}
    ids = {t: {"train": [f"{t}-tr-{i}" for i in range(a)], "val": [f"{t}-va-{i}" for i in range(b)]}
           for t, (a, b) in sizes.items()}
    m = P.fedmcp_cross_task(ids, seed=0)
    cap = 3668 + 408
    for t in sizes:
        n = min(cap, sum(sizes[t]))
        got = [len(m[t][s]) for s in ("train", "val", "test")]
        assert sum(got) == n
        assert got[0] == round(0.6 * n) and got[1] == round(0.2 * n)
    assert sum(len(v) for v in m["RTE"].values()) == 2767  # smaller than MRPC: kept whole
    P.check_disjoint(m)


def test_fedsumm_splits_a_corpus_over_n_clients():
    ids = {"train": [f"csl-train-{i}" for i in range(1000)], "test": [f"csl-test-{i}" for i in range(100)]}
    m = P.fedsumm_clients(ids, 50, seed=0, corpus="csl")
    assert len(m) == 50 and all(len(v["train"]) == 20 and len(v["test"]) == 2 for v in m.values())
    P.check_disjoint(m)
    with pytest.raises(InputError, match="fewer than 200 clients"):
        P.fedsumm_clients(ids, 200, seed=0, corpus="csl")
