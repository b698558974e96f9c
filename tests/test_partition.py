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


@pytest.mark.parametrize("mode", ["redraw", "add_one"])
def test_dirichlet_skew_grows_with_smaller_alpha(mode):
    seeds = (0, 4)  # redraw at Dir 0.1: 9,901 and 631,684 draws (cheap seeds)

    def spread(alpha):
        return np.mean([np.std([len(p) for p in P.dirichlet_quantity_skew(2000, 20, alpha, s, mode)]) for s in seeds])

    assert spread(0.1) > spread(1.0) > spread(8.0)


# -- FedSum's empty clients: the authors' re-draw (default) or one example each ----------------
def test_redraw_is_the_authors_rule_with_numbers():
    """partitions.fedsum.empty_clients: redraw -- p ~ Dir(α) re-drawn until min(p)·n >= 1, sizes cut
    at ⌊n·cumsum(p)⌋; seeded, so the same split every time."""
    n, k, alpha, seed = 20, 4, 0.1, 1
    rng = P._rng(seed, "dirichlet", n, k, alpha)
    first = P._rng(seed, "dirichlet", n, k, alpha).dirichlet(np.full(k, alpha), size=P.REDRAW_BATCH)
    p, used = P.redraw_proportions(rng, n, k, alpha, 10**6)
    assert used == 79  # the first 78 draws leave a client with < 1 example
    assert first[0].min() * n < 1 and all(first[i].min() * n < 1 for i in range(78))
    assert np.array_equal(p, first[78]) and p.min() * n >= 1
    sizes = P.sizes_from_proportions(p, n)
    assert sizes.tolist() == [1, 14, 3, 2] and sizes.sum() == n
    parts = P.dirichlet_quantity_skew(n, k, alpha, seed)  # redraw is the default
    assert [len(x) for x in parts] == [1, 14, 3, 2]
    assert sorted(i for x in parts for i in x) == list(range(n))
    assert parts == P.dirichlet_quantity_skew(n, k, alpha, seed, "redraw")  # reproducible
    # the cut itself: cumulative 2.5, 12.5, 17.5 of 20 -> 2, 12, 17 -> sizes 2, 10, 5, 3
    assert P.sizes_from_proportions(np.array([0.125, 0.5, 0.25, 0.125]), 20).tolist() == [2, 10, 5, 3]


@pytest.mark.parametrize(("n", "k", "alpha", "seed"), [(2000, 20, 0.1, 0), (20, 4, 0.1, 2), (10, 4, 0.1, 3), (20, 4, 0.5, 1)])
def test_redraw_split_covers_everything_with_no_empty_client(n, k, alpha, seed):
    parts = P.dirichlet_quantity_skew(n, k, alpha, seed, "redraw")
    sizes = [len(x) for x in parts]
    assert len(parts) == k and min(sizes) >= 1 and sum(sizes) == n
    assert sorted(i for x in parts for i in x) == list(range(n))
    assert parts == P.dirichlet_quantity_skew(n, k, alpha, seed, "redraw")
    assert parts != P.dirichlet_quantity_skew(n, k, alpha, seed + 10, "redraw")


def test_redraw_differs_from_add_one_and_add_one_is_unchanged():
    """add_one keeps the earlier split bit for bit: 1 + Multinomial(n − K, p) from the first draw."""
    n, k, alpha, seed = 2000, 20, 0.1, 0
    rng = P._rng(seed, "dirichlet", n, k, alpha)
    p = rng.dirichlet(np.full(k, alpha))
    sizes = 1 + rng.multinomial(n - k, p)
    order = rng.permutation(n)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    old = [sorted(order[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:])]
    assert P.dirichlet_quantity_skew(n, k, alpha, seed, "add_one") == old
    assert sum(len(x) == 1 for x in old) >= 5  # add_one: many clients hold the one added example
    assert P.dirichlet_quantity_skew(n, k, alpha, seed, "redraw") != old
    # Dir = inf: uniform sizes either way
    assert P.dirichlet_quantity_skew(n, k, math.inf, seed, "redraw") == P.dirichlet_quantity_skew(n, k, math.inf, seed, "add_one")


def test_redraw_gives_up_after_max_redraws_naming_the_keys():
    with pytest.raises(InputError, match=r"no draw in 1,000 .*partitions.fedsum.max_redraws.*empty_clients: add_one"):
        P.dirichlet_quantity_skew(20, 20, 0.1, 0, "redraw", max_redraws=1000)  # needs p exactly uniform
    assert [len(x) for x in P.dirichlet_quantity_skew(20, 20, 0.1, 0, "add_one")] == [1] * 20
    with pytest.raises(InputError, match="partitions.fedsum.empty_clients"):
        P.dirichlet_quantity_skew(20, 4, 0.1, 0, "drop")


def test_settings_carry_the_empty_client_rule():
    from fedrepro.data.settings import settings

    cfg = {"partitions": {"fedsum": {"datasets": ["cnndm"], "alphas": [0.1], "total": 20, "num_clients": 4}}}
    assert settings(cfg)["fedsum-cnndm-a0.1"]["empty_clients"] == "redraw"  # the authors' default
    cfg["partitions"]["fedsum"]["empty_clients"] = "add_one"
    assert settings(cfg)["fedsum-cnndm-a0.1"]["empty_clients"] == "add_one"
    cfg["partitions"]["fedsum"]["empty_clients"] = "bogus"
    with pytest.raises(InputError, match="partitions.fedsum.empty_clients"):
        settings(cfg)
    cfg["partitions"]["fedsum"].update(empty_clients="redraw", max_redraws=0)
    with pytest.raises(InputError, match="partitions.fedsum.max_redraws"):
        settings(cfg)


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


# -- NLPCC2017: the download has only a train split; FedSUMM's clients still get a test split ---------
def _paper_config() -> dict:
    from helpers import configs, deep_update

    cfg, paper = configs()
    deep_update(cfg, paper)  # as Snakemake merges --configfile config/paper.yaml over the demo
    return cfg


def _prepare_nlpcc(cfg: dict, out) -> tuple[dict, list[dict]]:
    from fedrepro import grid
    from fedrepro.data.prepare import prepare_source
    from fedrepro.io import read_jsonl

    out.mkdir(parents=True, exist_ok=True)
    report = prepare_source("nlpcc2017", grid.source_raw_dir(cfg, "nlpcc2017"), str(out / "records.jsonl"),
                            str(out / "prepare_report.json"), **grid.prepare_options(cfg, "nlpcc2017"))
    return report, read_jsonl(out / "records.jsonl")


def test_nlpcc2017_train_only_download_gets_a_seeded_heldout_test_split_for_every_client(tmp_path):
    import json

    from fedrepro.data.settings import settings, write_setting

    raw = tmp_path / "downloads" / "nlpcc2017"  # the hub copy's layout: nlpcc_data.json only
    raw.mkdir(parents=True)
    data = [{"title": f"第{i}条摘要", "content": f"第{i}篇新闻的第一段。<Paragraph>第二段{i}。"} for i in range(100)]
    (raw / "nlpcc_data.json").write_text(json.dumps({"data": data}, ensure_ascii=False), encoding="utf-8")
    cfg = _paper_config()
    cfg["data"]["nlpcc2017"].update(source="local", local_dir=str(raw))
    fraction = cfg["data"]["nlpcc2017"]["heldout_test_fraction"]
    n_test = round(fraction * len(data))
    assert n_test >= 2

    report, records = _prepare_nlpcc(cfg, tmp_path / "a")
    assert report["counts"] == {"train": len(data) - n_test, "test": n_test}
    assert report["heldout_test"]["count"] == n_test
    test_ids = {r["id"] for r in records if r["split"] == "test"}
    train_ids = {r["id"] for r in records if r["split"] == "train"}
    assert len(test_ids) == n_test and not test_ids & train_ids
    # seeded: the same ids again; another seed draws others
    assert {r["id"] for r in _prepare_nlpcc(cfg, tmp_path / "b")[1] if r["split"] == "test"} == test_ids
    cfg["data"]["nlpcc2017"]["heldout_test_seed"] += 1
    assert {r["id"] for r in _prepare_nlpcc(cfg, tmp_path / "c")[1] if r["split"] == "test"} != test_ids
    cfg["data"]["nlpcc2017"]["heldout_test_seed"] -= 1

    name = "fedsumm-nlpcc2017-n2"
    setting = settings(cfg)[name]
    records_file = str(tmp_path / "a" / "records.jsonl")
    manifest = tmp_path / "manifest.json"
    write_setting(name, setting, {"nlpcc2017": records_file}, 1, str(manifest))
    counts = P.materialize(str(manifest), [records_file], str(tmp_path / "clients"))
    assert len(counts) == 2 and sum(c["test"] for c in counts.values()) == n_test
    got_test: set[str] = set()
    for client in counts:
        rows = {s: [json.loads(x)["id"] for x in (tmp_path / "clients" / client / f"{s}.jsonl").read_text().splitlines()]
                for s in ("train", "test")}
        assert len(rows["test"]) == n_test // 2 and not set(rows["test"]) & set(rows["train"])
        got_test |= set(rows["test"])
    assert got_test == test_ids


def test_nlpcc2017_samples_keep_their_own_test_split(tmp_path):
    """The committed samples ship a test file: no held-out split is drawn (the demo is unchanged)."""
    from helpers import ROOT, configs

    from fedrepro import grid
    from fedrepro.data.prepare import prepare_source

    cfg = configs()[0]
    out = tmp_path
    report = prepare_source("nlpcc2017", ROOT / grid.source_raw_dir(cfg, "nlpcc2017"), str(out / "r.jsonl"),
                            str(out / "r.json"), **grid.prepare_options(cfg, "nlpcc2017"))
    assert report["counts"] == {"train": 30, "test": 20} and report["heldout_test"] is None
