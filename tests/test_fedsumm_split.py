"""FedSUMM's non-i.i.d. client split (issue 23, item 3): ``partitions.fedsumm.split:
dirichlet_length`` -- equal client sizes, per-client Dirichlet mixtures over source-length buckets;
its config keys, and that they reach the partition rule's params."""

from __future__ import annotations

import numpy as np
import pytest

from fedrepro.data import partition as P
from fedrepro.data.settings import build_manifest, fedsumm_split, settings
from fedrepro.io import InputError, write_jsonl_atomic


def _corpus(n_train=1000, n_test=100, n_val=0, seed=0):
    """Ids with lengths spread over 20 … 2,000 characters."""
    rng = np.random.default_rng(seed)
    ids, lengths = {}, {}
    for split, n in (("train", n_train), ("test", n_test), ("val", n_val)):
        if n:
            ids[split] = [f"x-{split}-{i:05d}" for i in range(n)]
            lengths.update({i: int(rng.integers(20, 2000)) for i in ids[split]})
    return ids, lengths


def _mixtures(manifest, lengths, edges, split="train"):
    """Each client's share of every length bucket in ``split``."""
    out = {}
    for c, splits in manifest.items():
        b = np.searchsorted(edges, [lengths[i] for i in splits[split]], side="right")
        out[c] = np.bincount(b, minlength=len(edges) + 1) / len(b)
    return out


def test_length_bucket_edges_are_training_quantiles():
    assert P.length_bucket_edges([5, 1, 4, 2, 3, 6, 8, 7], 4) == [3, 5, 7]
    # an example of length x is in bucket #{edges <= x}: 1, 2 -> 0; 3, 4 -> 1; 5, 6 -> 2; 7, 8 -> 3
    assert np.searchsorted([3, 5, 7], [1, 2, 3, 4, 5, 6, 7, 8], side="right").tolist() == [
        0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(InputError):
        P.length_bucket_edges([1, 2], 1)


@pytest.mark.parametrize("n_clients", [2, 7, 50])
def test_sizes_equal_parts_disjoint_cover_and_seeded(n_clients):
    ids, lengths = _corpus(n_val=60)
    m = P.fedsumm_length_skew_clients(ids, lengths, n_clients, seed=3, corpus="csl", alpha=0.5)
    iid = P.fedsumm_clients(ids, n_clients, seed=3, corpus="csl")
    assert list(m) == list(iid) == [f"csl-{k + 1:03d}" for k in range(n_clients)]
    for split, all_ids in ids.items():
        # the i.i.d. split's sizes (near-equal parts), every client non-empty
        assert [len(m[c][split]) for c in m] == [len(iid[c][split]) for c in iid]
        assert min(len(m[c][split]) for c in m) >= 1
        got = [i for c in m for i in m[c][split]]
        assert sorted(got) == sorted(all_ids) and len(set(got)) == len(got)
    P.check_disjoint(m)
    again = P.fedsumm_length_skew_clients(ids, lengths, n_clients, seed=3, corpus="csl", alpha=0.5)
    assert again == m  # same seed, same split
    other = P.fedsumm_length_skew_clients(ids, lengths, n_clients, seed=4, corpus="csl", alpha=0.5)
    assert other != m


def test_alpha_controls_the_skew_and_test_data_follow_the_training_mixture():
    """Mean total-variation distance of the clients' length mixtures from the corpus's (uniform
    over the 5 quantile buckets): i.i.d. ~ sampling noise only, α = 100 near it, α = 0.1 close to
    one bucket per client (TV → 0.8); each client's test mixture follows its training mixture."""
    ids, lengths = _corpus(n_train=5000, n_test=1000)
    edges = P.length_bucket_edges([lengths[i] for i in ids["train"]], 5)

    def mean_tv(manifest, split="train"):
        mix = _mixtures(manifest, lengths, edges, split)
        return float(np.mean([0.5 * np.abs(v - 0.2).sum() for v in mix.values()]))

    iid = mean_tv(P.fedsumm_clients(ids, 10, 1, "csl"))
    flat = mean_tv(P.fedsumm_length_skew_clients(ids, lengths, 10, 1, "csl", alpha=100.0))
    skew = P.fedsumm_length_skew_clients(ids, lengths, 10, 1, "csl", alpha=0.1)
    assert iid < 0.06 and flat < 0.08
    assert mean_tv(skew) > 0.55
    tr, te = _mixtures(skew, lengths, edges), _mixtures(skew, lengths, edges, "test")
    # test follows train: the same dominant bucket, mixtures within TV 0.3
    assert all(np.argmax(tr[c]) == np.argmax(te[c]) for c in tr)
    assert max(0.5 * np.abs(tr[c] - te[c]).sum() for c in tr) < 0.3


def test_length_skew_errors_name_the_keys():
    ids, lengths = _corpus()
    with pytest.raises(InputError, match="partitions.fedsumm.alpha"):
        P.fedsumm_length_skew_clients(ids, lengths, 4, 0, "csl", alpha=0.0)
    with pytest.raises(InputError, match="partitions.fedsumm.length_buckets"):
        P.fedsumm_length_skew_clients(ids, lengths, 4, 0, "csl", alpha=1.0, buckets=1)
    with pytest.raises(InputError, match="fewer than 200 clients"):
        P.fedsumm_length_skew_clients(ids, lengths, 200, 0, "csl", alpha=1.0)
    with pytest.raises(InputError, match="need a train and a test split"):
        P.fedsumm_length_skew_clients({"train": ids["train"]}, lengths, 4, 0, "csl", alpha=1.0)
    assert fedsumm_split({}) == {} and fedsumm_split({"split": "iid", "alpha": 3}) == {}
    assert fedsumm_split({"split": "dirichlet_length"}) == {
        "split": "dirichlet_length", "alpha": 0.5, "length_buckets": 5}
    for bad, key in (({"split": "topic"}, "split"), ({"alpha": -1}, "alpha"),
                     ({"alpha": "x"}, "alpha"), ({"length_buckets": 1.5}, "length_buckets")):
        with pytest.raises(InputError, match=f"partitions.fedsumm.{key}"):
            fedsumm_split(bad)


def _config(**split):
    return {"partitions": {"fedsumm": {"corpora": ["csl"], "num_clients": [4], **split}}}


def test_the_split_keys_reach_the_settings_and_the_manifest(tmp_path):
    """The keys are in the setting (the partition rule's params: changing them redraws the split);
    an i.i.d. split keeps the setting it had before the keys existed."""
    iid = settings(_config())
    assert iid["fedsumm-csl-n4"] == {"sources": ["csl"], "kind": "fedsumm", "num_clients": 4}
    assert settings(_config(split="iid", alpha=2.0)) == iid
    skew = settings(_config(split="dirichlet_length", alpha=0.3, length_buckets=4))
    for name in ("fedsumm-csl-n4", "fedsumm-csl-n4-single", "fedsumm-csl-n4-all"):
        assert skew[name]["split"] == "dirichlet_length"
        assert (skew[name]["alpha"], skew[name]["length_buckets"]) == (0.3, 4)
    ids, lengths = _corpus(n_train=200, n_test=40)
    rng = np.random.default_rng(1)
    records = [{"id": i, "source": "csl", "split": s, "input": "字" * lengths[i],
                "target": "题" * int(rng.integers(5, 20))} for s in ids for i in ids[s]]
    path = tmp_path / "records.jsonl"
    write_jsonl_atomic(path, records)
    files = {"csl": str(path)}
    m = build_manifest(skew["fedsumm-csl-n4"], files, seed=2)
    assert m == P.fedsumm_length_skew_clients(ids, lengths, 4, 2, "csl", 0.3, 4)
    assert build_manifest(iid["fedsumm-csl-n4"], files, seed=2) == P.fedsumm_clients(ids, 4, 2, "csl")
    first = build_manifest(skew["fedsumm-csl-n4-single"], files, seed=2)
    assert first == {"csl-001": m["csl-001"]}
    pooled = build_manifest(skew["fedsumm-csl-n4-all"], files, seed=2)
    assert sorted(pooled["csl-all"]["train"]) == sorted(ids["train"])
