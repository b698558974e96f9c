"""GLUE source (FedMCP's six clients): release TSVs and hub parquet to classification records."""

from __future__ import annotations

import math
import os
import re
import socket
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedrepro.data import sources
from fedrepro.data.download import DownloadError
from fedrepro.data.samples import glue as glue_samples
from fedrepro.data.sources import glue
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "resources" / "samples" / "glue"
SAMPLE_FILES = {
    t: (
        {"train": "train.tsv", "val": "dev_matched.tsv", "test": "test_matched.tsv"}
        if t == "MNLI"
        else {"train": "train.tsv", "val": "dev.tsv", "test": "test.tsv"}
    )
    for t in glue.TASKS
}
HUB_FIELDS = {
    "MRPC": ("sentence1", "sentence2"),
    "RTE": ("sentence1", "sentence2"),
    "SST-2": ("sentence", None),
    "QNLI": ("question", "sentence"),
    "QQP": ("question1", "question2"),
    "MNLI": ("premise", "hypothesis"),
}
HUB_CONFIG = {
    "MRPC": "mrpc",
    "RTE": "rte",
    "SST-2": "sst2",
    "QNLI": "qnli",
    "QQP": "qqp",
    "MNLI": "mnli",
}
KEYS = {"id", "source", "task", "split", "text_a", "text_b", "label", "meta"}


def _parse(path, **kw):
    return sources.get("glue").parse(path, **kw)


# -- registry and samples -------------------------------------------------------------------
def test_registered_source():
    src = sources.get("glue")
    assert src.name == "glue" and src.kind == "classification" and src.lang == "en"
    assert src.config_key == "data.glue.local_dir"
    assert src.upstream == f"nyu-mll/glue @ {glue.GLUE_REVISION}" and len(glue.GLUE_REVISION) == 40
    assert src.splits == ("train", "val", "test")
    assert glue.LABEL_NAMES["MNLI"] == ("entailment", "neutral", "contradiction")
    assert glue.LABEL_NAMES["MRPC"] == ("not_equivalent", "equivalent")


@pytest.mark.parametrize("task", glue.TASKS)
def test_samples_parse(task):
    ids: set[str] = set()
    for split, fname in SAMPLE_FILES[task].items():
        recs = _parse(SAMPLES / task / fname)
        assert len(recs) == glue_samples.SAMPLE_ROWS[split] and not recs.skipped
        for r in recs:
            assert set(r) == KEYS
            assert r["source"] == "glue" and r["task"] == task and r["split"] == split
            assert (
                isinstance(r["text_a"], str) and r["text_a"] == r["text_a"].strip() and r["text_a"]
            )
            if task == "SST-2":
                assert r["text_b"] is None
            else:
                assert isinstance(r["text_b"], str) and r["text_b"]
            assert isinstance(r["label"], int) and isinstance(r["meta"], dict)
            if split == "test":
                assert r["label"] == glue.UNLABELLED and r["meta"]["label_name"] is None
            else:
                assert 0 <= r["label"] < len(glue.LABEL_NAMES[task])
                assert r["meta"]["label_name"] == glue.LABEL_NAMES[task][r["label"]]
        ids |= {r["id"] for r in recs}
        if split != "test":  # every class present
            assert {r["label"] for r in recs} == set(range(len(glue.LABEL_NAMES[task])))
    assert len(ids) == sum(glue_samples.SAMPLE_ROWS.values())


def test_samples_look_like_glue():
    mrpc = (SAMPLES / "MRPC" / "train.tsv").read_bytes()
    assert mrpc.startswith(b"\xef\xbb\xbfQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n")
    assert b'"' in mrpc  # quote characters, as in the real file
    assert (SAMPLES / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1].endswith(
        " \t0"
    ) or (SAMPLES / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1].endswith(
        " \t1"
    )
    header = (SAMPLES / "MNLI" / "dev_matched.tsv").read_text(encoding="utf-8").splitlines()[0]
    assert header.split("\t")[-6:] == [
        "label1",
        "label2",
        "label3",
        "label4",
        "label5",
        "gold_label",
    ]
    mnli = _parse(SAMPLES / "MNLI" / "train.tsv")
    assert {r["meta"]["genre"] for r in mnli} <= {
        "fiction",
        "government",
        "slate",
        "telephone",
        "travel",
    }
    assert all(
        r["meta"]["pair_id"] == r["meta"]["prompt_id"] + r["meta"]["label_name"][0] for r in mnli
    )
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 150_000, total


def test_samples_regenerate_byte_identical(tmp_path):
    counts = glue_samples.write_samples(tmp_path / "a")
    assert counts == {t: dict(glue_samples.SAMPLE_ROWS) for t in glue.TASKS}
    committed = sorted(p.relative_to(SAMPLES) for p in SAMPLES.rglob("*.tsv"))
    assert len(committed) == 18
    assert (
        sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
        == committed
    )
    for rel in committed:
        assert (tmp_path / "a" / rel).read_bytes() == (SAMPLES / rel).read_bytes(), rel
    glue_samples.write_samples(tmp_path / "b", seed=1)
    assert (tmp_path / "b" / "RTE" / "train.tsv").read_bytes() != (
        SAMPLES / "RTE" / "train.tsv"
    ).read_bytes()


def _features(rec: dict) -> list[str]:
    def tok(text: str) -> list[str]:
        return re.findall(r"[a-z0-9$.,]+|[^\sa-z0-9]", text.lower())

    a = tok(rec["text_a"])
    feats = [f"a:{w}" for w in a]
    if rec["text_b"] is not None:
        b, seen = tok(rec["text_b"]), set(a)
        feats += [f"b:{w}" for w in b] + [("shared:" if w in seen else "new:") + w for w in b]
        feats.append(f"overlap:{round(4 * sum(w in seen for w in b) / len(b))}")
    return feats


class _NaiveBayes:
    """Multinomial naive Bayes over :func:`_features` with add-one smoothing."""

    def __init__(self, records: list[dict], num_labels: int) -> None:
        self.counts = [Counter() for _ in range(num_labels)]
        self.prior = Counter(r["label"] for r in records)
        for r in records:
            self.counts[r["label"]].update(_features(r))
        self.vocab = set().union(*self.counts)
        self.totals = [sum(c.values()) for c in self.counts]

    def score(self, rec: dict, label: int) -> float:
        denom = self.totals[label] + len(self.vocab)
        return math.log(self.prior[label]) + sum(
            math.log((self.counts[label][f] + 1) / denom) for f in _features(rec) if f in self.vocab
        )

    def predict(self, rec: dict) -> int:
        return max(range(len(self.counts)), key=lambda label: self.score(rec, label))


def test_sample_labels_are_learnable_from_text(tmp_path):
    """A bag-of-words naive Bayes trained on a larger draw of the generator beats the majority class
    by a wide margin on every task (labels follow from the texts, not from row order)."""
    glue_samples.write_samples(tmp_path, rows={"train": 300, "val": 100, "test": 1})
    for task in glue.TASKS:
        train = _parse(tmp_path / task / SAMPLE_FILES[task]["train"])
        val = _parse(tmp_path / task / SAMPLE_FILES[task]["val"])
        model = _NaiveBayes(train, len(glue.LABEL_NAMES[task]))
        acc = sum(model.predict(r) == r["label"] for r in val) / len(val)
        majority = Counter(r["label"] for r in val).most_common(1)[0][1] / len(val)
        assert acc >= majority + 0.25, (task, acc, majority)


def test_split_files():
    files = glue.split_files(SAMPLES, "MNLI")
    assert files == {
        "train": SAMPLES / "MNLI" / "train.tsv",
        "val": SAMPLES / "MNLI" / "dev_matched.tsv",
        "test": SAMPLES / "MNLI" / "test_matched.tsv",
    }
    assert glue.split_files(SAMPLES, "SST-2")["val"] == SAMPLES / "SST-2" / "dev.tsv"
    with pytest.raises(InputError, match="data.glue.local_dir"):
        glue.split_files(SAMPLES / "nowhere", "QQP")
    with pytest.raises(InputError, match="unknown GLUE task"):
        glue.split_files(SAMPLES, "CoLA")


# -- real data ------------------------------------------------------------------------------------
def test_real_glue_counts_and_records(shared_data):
    root = shared_data / "glue"
    if not root.is_dir():
        pytest.skip(f"real GLUE files not present at {root}")
    expected = {
        ("MRPC", "train.tsv"): 3668,
        ("MRPC", "dev.tsv"): 408,
        ("RTE", "train.tsv"): 2490,
        ("RTE", "dev.tsv"): 277,
        ("SST-2", "dev.tsv"): 872,
    }
    parsed = {}
    for (task, fname), n in expected.items():
        recs = _parse(root / task / fname)
        assert len(recs) == n and not recs.skipped, (task, fname, len(recs))
        assert len({r["id"] for r in recs}) == n
        assert all(
            r["task"] == task and r["split"] == ("train" if fname == "train.tsv" else "val")
            for r in recs
        )
        parsed[(task, fname)] = recs

    first = parsed[("MRPC", "train.tsv")][0]
    assert first["id"] == "glue-MRPC-train-0" and first["label"] == 1
    assert first["text_a"].startswith('Amrozi accused his brother, whom he called "the witness"')
    assert first["text_b"].startswith('Referring to him as only "the witness", Amrozi')
    assert first["meta"]["id1"] == "702876" and first["meta"]["id2"] == "702977"
    # quote characters never merge lines: a dev text opens a quote it never closes
    dev0 = parsed[("MRPC", "dev.tsv")][0]
    assert (
        dev0["text_b"]
        == '"The foodservice pie business does not fit our long-term growth strategy.'
    )
    assert Counter(r["label"] for r in parsed[("MRPC", "train.tsv")]) == {1: 2474, 0: 1194}

    rte = parsed[("RTE", "train.tsv")][0]
    assert rte["text_a"] == "No Weapons of Mass Destruction Found in Iraq Yet."
    assert rte["text_b"] == "Weapons of Mass Destruction Found in Iraq."
    assert rte["label"] == 1 and rte["meta"]["label_name"] == "not_entailment"
    assert (
        parsed[("RTE", "dev.tsv")][1]["label"] == 0
    )  # "Bacteria is winning the war ...": entailment

    sst = parsed[("SST-2", "dev.tsv")]
    assert (
        sst[0]["text_a"] == "it 's a charming and often affecting journey ."
    )  # trailing space stripped
    assert sst[0]["text_b"] is None and sst[0]["label"] == 1
    assert sst[1]["text_a"] == "unflinchingly bleak and desperate" and sst[1]["label"] == 0
    assert Counter(r["label"] for r in sst) == {1: 444, 0: 428}


# -- hub parquet form -----------------------------------------------------------------------------
def _to_hub(recs: list[dict], task: str, path: Path, labels: list | None = None) -> Path:
    a, b = HUB_FIELDS[task]
    cols = {a: [r["text_a"] for r in recs]}
    if b:
        cols[b] = [r["text_b"] for r in recs]
    cols["label"] = labels if labels is not None else [r["label"] for r in recs]
    cols["idx"] = pa.array(list(range(len(recs))), type=pa.int32())
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)
    return path


@pytest.mark.parametrize("task", glue.TASKS)
def test_hub_parquet_matches_tsv(tmp_path, task):
    hub_split = {"val": "validation_matched" if task == "MNLI" else "validation", "train": "train"}
    for split in ("train", "val"):
        tsv = _parse(SAMPLES / task / SAMPLE_FILES[task][split])
        path = _to_hub(
            tsv, task, tmp_path / HUB_CONFIG[task] / f"{hub_split[split]}-00000-of-00001.parquet"
        )
        hub = _parse(path)
        assert [(r["id"], r["split"], r["text_a"], r["text_b"], r["label"]) for r in hub] == [
            (r["id"], r["split"], r["text_a"], r["text_b"], r["label"]) for r in tsv
        ]
        assert all(r["meta"]["format"] == "parquet" and r["task"] == task for r in hub)


def test_hub_layouts_and_mnli_splits(tmp_path):
    recs = _parse(SAMPLES / "MNLI" / "train.tsv")[:4]
    cases = {
        "mnli/validation_matched-00000-of-00001.parquet": "val",
        "mnli/validation_mismatched-00000-of-00001.parquet": "val_mismatched",
        "mnli/test_mismatched-00000-of-00001.parquet": "test_mismatched",
        "mnli_matched/validation-00000-of-00001.parquet": "val",
        "mnli_mismatched/validation-00000-of-00001.parquet": "val_mismatched",
        "MNLI/validation_matched.parquet": "val",  # download()'s layout
        "mnli/validation_matched/0000.parquet": "val",  # datasets-server layout
    }
    for rel, split in cases.items():
        out = _parse(_to_hub(recs, "MNLI", tmp_path / rel))
        assert [r["split"] for r in out] == [split] * 4, rel
        assert out[0]["id"] == f"glue-MNLI-{split}-0"
    test = _parse(
        _to_hub(recs, "MNLI", tmp_path / "mnli" / "test_matched-00000-of-00001.parquet", [-1] * 4)
    )
    assert [r["label"] for r in test] == [-1] * 4 and test[0]["split"] == "test"
    assert (
        glue.split_files(tmp_path, "MNLI")["val"]
        == tmp_path / "MNLI" / "validation_matched.parquet"
    )


def test_hub_parquet_malformed(tmp_path):
    recs = _parse(SAMPLES / "QQP" / "train.tsv")[:5]
    path = _to_hub(recs, "QQP", tmp_path / "qqp" / "train-00000-of-00001.parquet", [0, 1, 7, 1, 0])
    with pytest.raises(InputError) as err:
        _parse(path)
    msg = str(err.value)
    assert str(path) in msg and "row 2" in msg and "glue-QQP-train-2" in msg and "`label`" in msg
    assert "out of range" in msg
    ok = _parse(path, skip_malformed=True)
    assert len(ok) == 4 and [s[0] for s in ok.skipped] == ["glue-QQP-train-2"]

    path = _to_hub(recs, "QQP", tmp_path / "qqp" / "validation-00000-of-00001.parquet", [-1] * 5)
    with pytest.raises(InputError, match="out of range"):  # -1 only on the unlabelled test splits
        _parse(path)
    pq.write_table(pa.table({"question1": ["a?"], "label": [0], "idx": [0]}), path)
    with pytest.raises(InputError, match="lacks the QQP field.*question2"):
        _parse(path)


# -- malformed TSV --------------------------------------------------------------------------------
def _write_tsv(tmp_path: Path, task: str, fname: str, lines: list[str]) -> Path:
    path = tmp_path / task / fname
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "bad_line, field, words",
    [
        ("1\tWho won?\tnot_entailment", "label", "missing"),
        ("1\tWho won?\t   \tentailment", "sentence", "empty"),
        ("1\tWho won?\tThe team won.\tmaybe", "label", "unknown label 'maybe'"),
        ("1\tWho won?\tThe team won.\t2", "label", "out of range"),
    ],
)
def test_tsv_malformed_row(tmp_path, bad_line, field, words):
    good = [
        "index\tquestion\tsentence\tlabel",
        "0\tWho won?\tThe home team won the cup.\tentailment",
    ]
    path = _write_tsv(tmp_path, "QNLI", "train.tsv", [*good, bad_line, "2\tWhen?\tIn 1990.\t1"])
    with pytest.raises(InputError) as err:
        _parse(path)
    msg = str(err.value)
    assert (
        f"{path}:3:" in msg and "glue-QNLI-train-1" in msg and f"`{field}`" in msg and words in msg
    )
    recs = _parse(path, skip_malformed=True)
    assert [r["id"] for r in recs] == ["glue-QNLI-train-0", "glue-QNLI-train-2"]
    assert recs[1]["label"] == 1  # numeric labels are accepted too
    assert len(recs.skipped) == 1 and recs.skipped[0][0] == "glue-QNLI-train-1"
    assert f"{path}:3:" in recs.skipped[0][1]


def test_tsv_quotes_bom_and_blank_lines(tmp_path):
    path = tmp_path / "MRPC" / "dev.tsv"
    path.parent.mkdir()
    path.write_bytes(
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t11\t12\t"He said it was "fine.\tIt was "fine", he said.\n'
        "\n"
        '0\t13\t14\tA "quoted\ttext with an open quote\r\n'.encode("utf-8")
    )
    recs = _parse(path)
    assert [r["id"] for r in recs] == ["glue-MRPC-val-0", "glue-MRPC-val-1"]
    assert (
        recs[0]["text_a"] == '"He said it was "fine.'
        and recs[1]["text_b"] == "text with an open quote"
    )
    assert [r["meta"]["line"] for r in recs] == [2, 4] and recs[1]["label"] == 0


def test_tsv_bad_header_task_or_split(tmp_path):
    path = _write_tsv(
        tmp_path, "RTE", "train.tsv", ["index\tpremise\thypothesis\tlabel", "0\ta\tb\tentailment"]
    )
    with pytest.raises(
        InputError, match=r"header lacks the RTE column\(s\) 'sentence1', 'sentence2'"
    ):
        _parse(path)
    path = _write_tsv(
        tmp_path,
        "RTE",
        "test.tsv",
        ["index\tsentence1\tsentence2", "0\tA dog ran.\tAn animal ran."],
    )
    assert _parse(path)[0]["label"] == glue.UNLABELLED
    with pytest.raises(InputError, match="cannot tell the GLUE task"):
        _parse(_write_tsv(tmp_path, "CoLA", "train.tsv", ["sentence\tlabel"]))
    with pytest.raises(InputError, match="cannot tell the RTE split"):
        _parse(
            _write_tsv(tmp_path, "RTE", "dev_matched.tsv", ["index\tsentence1\tsentence2\tlabel"])
        )
    with pytest.raises(InputError, match="not a GLUE split file"):
        _parse(tmp_path / "RTE" / "train.csv")
    with pytest.raises(InputError, match="file not found.*data.glue.local_dir"):
        _parse(tmp_path / "QQP" / "dev.tsv")


# -- download -------------------------------------------------------------------------------------
def _hub_reachable() -> bool:
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=2):
            return True
    except OSError:
        return False


def _check_download_error(exc: DownloadError) -> None:
    msg = str(exc)
    assert "GLUE" in msg and "nyu-mll/glue" in msg and glue.GLUE_REVISION in msg
    assert "data.glue.local_dir" in msg


@pytest.mark.parametrize("offline_mode", [True, False])
def test_download_offline_fails_fast_and_cleanly(tmp_path, monkeypatch, offline_mode):
    import huggingface_hub.constants as hf_constants

    if not offline_mode and _hub_reachable():
        pytest.skip(
            "this machine can reach huggingface.co; the offline failure path is not testable here"
        )
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", offline_mode)
    parent = tmp_path / "data"
    parent.mkdir()
    (parent / "keep.txt").write_text("x")
    t0 = time.monotonic()
    with pytest.raises(DownloadError) as err:
        sources.get("glue").download(parent / "glue", timeout=5)
    assert time.monotonic() - t0 < 10
    _check_download_error(err.value)
    assert "mrpc/train-00000-of-00001.parquet" in str(err.value)
    assert sorted(os.listdir(parent)) == ["keep.txt"]


def test_download_gives_up_on_a_hanging_hub(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(
        huggingface_hub, "get_hf_file_metadata", lambda url, timeout: time.sleep(30)
    )
    t0 = time.monotonic()
    with pytest.raises(DownloadError, match="no answer within 1 s") as err:
        glue.download(tmp_path / "glue", timeout=1)
    assert time.monotonic() - t0 < 3
    _check_download_error(err.value)
    assert os.listdir(tmp_path) == []


def test_hub_filenames():
    assert glue.hub_filename("MNLI", "val") == "mnli/validation_matched-00000-of-00001.parquet"
    assert glue.hub_filename("SST-2", "train") == "sst2/train-00000-of-00001.parquet"
    with pytest.raises(InputError):
        glue.hub_filename("QQP", "val_mismatched")


def _fake_hub(monkeypatch, fail_on: str | None = None) -> list[str]:
    """Stand-ins for the hub client: metadata answers, files are written from the samples."""
    import huggingface_hub

    fetched: list[str] = []
    config_task = {v: k for k, v in HUB_CONFIG.items()}

    def fake_download(repo_id, filename, *, repo_type, revision, local_dir, etag_timeout):
        assert (repo_id, repo_type, revision) == ("nyu-mll/glue", "dataset", glue.GLUE_REVISION)
        assert etag_timeout == 5
        if filename == fail_on:
            raise OSError("connection reset by peer")
        task = config_task[filename.split("/")[0]]
        split = "train" if filename.split("/")[1].startswith("train") else "val"
        recs = _parse(SAMPLES / task / SAMPLE_FILES[task][split])
        fetched.append(filename)
        return str(_to_hub(recs, task, Path(local_dir) / filename))

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, timeout: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    return fetched


def test_download_layout_with_a_stand_in_hub(tmp_path, monkeypatch):
    fetched = _fake_hub(monkeypatch)
    dest = glue.download(tmp_path / "glue", timeout=5)
    assert len(fetched) == 12 and "mnli/validation_matched-00000-of-00001.parquet" in fetched
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == sorted(
        f"{t}/{s}.parquet"
        for t in glue.TASKS
        for s in ("train", "validation_matched" if t == "MNLI" else "validation")
    )
    assert os.listdir(tmp_path) == ["glue"]  # no staging folder left beside it
    val = _parse(glue.split_files(dest, "MNLI")["val"])
    assert len(val) == glue_samples.SAMPLE_ROWS["val"] and val[0]["split"] == "val"


def test_download_failing_midway_leaves_nothing(tmp_path, monkeypatch):
    _fake_hub(monkeypatch, fail_on="qnli/train-00000-of-00001.parquet")
    (tmp_path / "glue").mkdir()
    (tmp_path / "glue" / "old.txt").write_text("previous copy")
    with pytest.raises(DownloadError, match="qnli/train-00000-of-00001.parquet") as err:
        glue.download(tmp_path / "glue", timeout=5)
    _check_download_error(err.value)
    assert os.listdir(tmp_path) == ["glue"]  # the staging folder is gone
    assert os.listdir(tmp_path / "glue") == ["old.txt"]  # an earlier copy is untouched
