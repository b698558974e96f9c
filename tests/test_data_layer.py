"""Generic preparation, split settings and statistics, on the committed QMSum samples."""

import json
from pathlib import Path

import pandas as pd
import pytest

from fedrepro.data.prepare import prepare_source
from fedrepro.data.settings import settings, write_setting
from fedrepro.data.stats import text_length, write_data_stats
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {
    "data": {"qmsum": {"source": "samples"}},
    "partitions": {
        "adafedseleckd": {"iid_clients": 3, "noniid_sizes": {"train": 20, "val": 4, "test": 4},
                          "long_meetings": ["ami"]},
        "fedsum": {"datasets": ["cnndm"], "alphas": [0.1, float("inf")], "total": 20, "num_clients": 4},
        "fedsumm": {"corpora": ["csl"], "num_clients": [4, 50]},
    }
}


@pytest.fixture(scope="module")
def qmsum_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("prep")
    report = prepare_source("qmsum", ROOT / "resources/samples/qmsum", str(out / "records.jsonl"),
                            str(out / "report.json"))
    assert report["counts"] == {"train": 120, "val": 30, "test": 30}
    assert report["skipped"] == 0
    return str(out / "records.jsonl")


def test_settings_enumerate_every_paper_split():
    names = set(settings(CONFIG))
    assert {"adafedseleckd-domains", "adafedseleckd-iid", "adafedseleckd-noniid",
            "adafedseleckd-extreme", "adafedseleckd-long"} <= names
    assert {"fedsum-cnndm-a0.1", "fedsum-cnndm-ainf", "fedsumm-csl-n4", "fedsumm-csl-n50",
            "fedsumm-csl-n4-single", "fedsumm-csl-n4-all"} <= names


@pytest.mark.parametrize("name", ["adafedseleckd-domains", "adafedseleckd-iid", "adafedseleckd-noniid"])
def test_qmsum_settings_write_disjoint_deterministic_manifests(qmsum_records, tmp_path, name):
    setting = settings(CONFIG)[name]
    m1 = write_setting(name, setting, {"qmsum": qmsum_records}, 1, str(tmp_path / "a.json"))
    write_setting(name, setting, {"qmsum": qmsum_records}, 1, str(tmp_path / "b.json"))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    sizes = {c: {s: len(v) for s, v in splits.items()} for c, splits in m1.items()}
    if name == "adafedseleckd-noniid":
        assert all(v == {"train": 20, "val": 4, "test": 4} for v in sizes.values())
    else:
        assert sum(v["train"] for v in sizes.values()) == 120
    meta = json.loads((tmp_path / "a.json").read_text())["meta"]
    assert meta["setting"] == name and meta["seed"] == 1


def test_noniid_setting_asks_for_more_than_there_is(qmsum_records, tmp_path):
    setting = dict(settings(CONFIG)["adafedseleckd-noniid"], sizes={"train": 500})
    with pytest.raises(InputError, match="needs 500 train examples"):
        write_setting("x", setting, {"qmsum": qmsum_records}, 1, str(tmp_path / "m.json"))


def test_stats_tables_and_figures(qmsum_records, tmp_path):
    manifests = []
    for name in ("adafedseleckd-domains", "adafedseleckd-iid"):
        path = tmp_path / name / "manifest.json"
        write_setting(name, settings(CONFIG)[name], {"qmsum": qmsum_records}, 1, str(path))
        manifests.append(str(path))
    src, part = write_data_stats({"qmsum": qmsum_records}, manifests, str(tmp_path / "s.csv"),
                                 str(tmp_path / "p.csv"), str(tmp_path / "fig"))
    assert len(src) == 9 and set(src["unit"]) == {"words"}
    assert src.loc[(src.client == "Academic") & (src.split == "train"), "examples"].item() == 40
    assert set(part["setting"]) == {"adafedseleckd-domains", "adafedseleckd-iid"}
    assert part.groupby("setting")["examples"].sum().to_dict() == {"adafedseleckd-domains": 180, "adafedseleckd-iid": 180}
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == [
        "adafedseleckd-domains_seed1.png", "adafedseleckd-iid_seed1.png"]
    assert pd.read_csv(tmp_path / "p.csv").shape[0] == len(part)


def test_lengths_are_words_in_english_and_characters_in_chinese():
    assert text_length("the cat sat", "en") == 3
    assert text_length("我们 开会", "zh") == 4


def test_materialize_writes_each_clients_own_folder(qmsum_records, tmp_path):
    from fedrepro.data.partition import materialize
    from fedrepro.io import read_jsonl

    manifest = tmp_path / "m.json"
    write_setting("adafedseleckd-iid", settings(CONFIG)["adafedseleckd-iid"], {"qmsum": qmsum_records}, 2, str(manifest))
    counts = materialize(str(manifest), [qmsum_records], str(tmp_path / "clients"))
    assert sorted(counts) == ["client1", "client2", "client3"]
    assert sum(c["train"] for c in counts.values()) == 120
    rows = read_jsonl(tmp_path / "clients" / "client2" / "test.jsonl")
    assert rows and all(r["client"] == "client2" for r in rows)
    assert {r["id"].split("-")[1] for r in rows} == {"Academic", "Committee", "Product"}  # IID: every domain


def test_fedsumm_single_and_all_regimes_come_from_the_n_client_split(tmp_path):
    from fedrepro.io import write_jsonl_atomic

    recs = [{"id": f"csl-{s}-{i:03d}", "source": "csl", "client": "csl", "split": s, "input": "x", "target": "y"}
            for s, n in (("train", 40), ("test", 8)) for i in range(n)]
    path = tmp_path / "csl.jsonl"
    write_jsonl_atomic(path, recs)
    st = settings(CONFIG)
    n4 = write_setting("n4", st["fedsumm-csl-n4"], {"csl": str(path)}, 1, str(tmp_path / "a.json"))
    single = write_setting("s", st["fedsumm-csl-n4-single"], {"csl": str(path)}, 1, str(tmp_path / "b.json"))
    union = write_setting("u", st["fedsumm-csl-n4-all"], {"csl": str(path)}, 1, str(tmp_path / "c.json"))
    assert len(n4) == 4 and all(len(v["train"]) == 10 for v in n4.values())
    assert single == {"csl-001": n4["csl-001"]}
    assert sorted(union["csl-all"]["train"]) == sorted(r["id"] for r in recs if r["split"] == "train")
