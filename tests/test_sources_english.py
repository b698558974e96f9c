"""English summarization sources: SAMSum, CNN/DailyMail, PubMed, WikiHow, Reddit TIFU."""

from __future__ import annotations

import csv
import io
import json
import re
import socket
import time
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedrepro.data import sources
from fedrepro.data.download import DownloadError
from fedrepro.data.sources import _english as en
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "resources" / "samples"
NAMES = ("samsum", "cnndm", "pubmed", "wikihow", "reddit_tifu")
SAMPLE_FILES = {
    "samsum": {"train.json": 40, "val.json": 20, "test.json": 20},
    "cnndm": {"train.jsonl": 30, "validation.jsonl": 20, "test.jsonl": 20},
    "pubmed": {"train.txt": 20, "val.txt": 10, "test.txt": 10},
    "wikihow": {"train.csv": 30, "val.csv": 15, "test.csv": 15},
    "reddit_tifu": {"train.jsonl": 40},
}


def _module(name: str):
    sources.get(name)
    import importlib

    return importlib.import_module(sources.SOURCE_MODULES[name])


# -- registry -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_registered(name):
    src = sources.get(name)
    assert src.name == name and src.kind == "seq2seq" and src.lang == "en"
    assert src.config_key == f"data.{name}.local_dir"
    assert " @ " in src.upstream
    assert src.splits == (("train",) if name == "reddit_tifu" else ("train", "val", "test"))


# -- committed samples ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_samples_parse(name):
    src = sources.get(name)
    folder = SAMPLES / name
    assert sorted(p.name for p in folder.iterdir()) == sorted(SAMPLE_FILES[name])
    assert sum(p.stat().st_size for p in folder.iterdir()) < 150_000
    ids: list[str] = []
    for fname, n in SAMPLE_FILES[name].items():
        recs = src.parse(folder / fname)
        assert len(recs) == n and recs.skipped == []
        split = en.infer_split(folder / fname)
        for r in recs:
            assert set(r) == {"id", "source", "client", "split", "input", "target", "meta"}
            assert r["source"] == r["client"] == name and r["split"] == split
            assert r["id"].startswith(f"{name}-{split}-")
            assert isinstance(r["input"], str) and r["input"].strip()
            assert isinstance(r["target"], str) and r["target"].strip()
            sents = r["meta"]["sentences"]
            assert (
                isinstance(sents, list)
                and len(sents) >= 2
                and all(isinstance(s, str) and s for s in sents)
            )
            assert r["meta"]["summary_words"] == len(r["target"].split())
        ids += [r["id"] for r in recs]
    assert len(ids) == len(set(ids))


_STOP = {
    "a",
    "an",
    "the",
    "and",
    "or",
    "so",
    "of",
    "to",
    "for",
    "in",
    "on",
    "at",
    "is",
    "are",
    "was",
    "has",
    "have",
    "will",
    "be",
    "because",
    "s",
    "it",
    "its",
    "with",
    "by",
    "that",
    "this",
    "from",
    "up",
}


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+(?:[.,][0-9]+)*", text.lower()) if w not in _STOP]


@pytest.mark.parametrize("name", NAMES)
def test_sample_targets_are_learnable(name):
    """Every number of a summary occurs in its input, and nearly all its content words do."""
    src = sources.get(name)
    for fname in SAMPLE_FILES[name]:
        for r in src.parse(SAMPLES / name / fname):
            source_words = set(_words(r["input"]))
            target_words = _words(r["target"])
            for num in re.findall(r"\d+(?:[.,]\d+)*", r["target"]):
                assert num in r["input"], (r["id"], num)
            covered = sum(w in source_words for w in target_words) / len(target_words)
            assert covered >= 0.8, (r["id"], covered)


def test_samples_look_like_their_sources():
    samsum = sources.get("samsum").parse(SAMPLES / "samsum" / "train.json")
    assert all(re.match(r"^[A-Z][a-z]+: ", r["input"]) for r in samsum)
    assert all(r["meta"]["n_turns"] == len(r["input"].split("\n")) >= 4 for r in samsum)
    raw = json.loads((SAMPLES / "samsum" / "train.json").read_text(encoding="utf-8"))
    assert list(raw[0]) == ["id", "summary", "dialogue"] and any(
        "\r\n" in d["dialogue"] for d in raw
    )
    cnn = [
        json.loads(line)
        for line in (SAMPLES / "cnndm" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert all(
        list(o) == ["article", "highlights", "id"] and re.fullmatch(r"[0-9a-f]{40}", o["id"])
        for o in cnn
    )
    pub = [
        json.loads(line)
        for line in (SAMPLES / "pubmed" / "val.txt").read_text(encoding="utf-8").splitlines()
    ]
    assert all(
        s.startswith("<S> ") and s.endswith(" </S>") for o in pub for s in o["abstract_text"]
    )
    assert all(o["article_text"] == [s for sec in o["sections"] for s in sec] for o in pub)
    recs = sources.get("pubmed").parse(SAMPLES / "pubmed" / "val.txt")
    assert all("<S>" not in r["target"] and r["input"] == r["input"].lower() for r in recs)
    with open(SAMPLES / "wikihow" / "val.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["headline", "title", "text"] and all(
        r["title"].startswith("How to ") for r in rows
    )
    tifu = sources.get("reddit_tifu").parse(SAMPLES / "reddit_tifu" / "train.jsonl")
    assert all(r["meta"]["title"].startswith("tifu by ") and r["meta"]["ups"] >= 5 for r in tifu)


@pytest.mark.parametrize("name", NAMES)
def test_samples_regenerate_byte_identical(name, tmp_path):
    src = sources.get(name)
    counts = src.write_samples(tmp_path / "a")
    assert sum(counts.values()) == sum(SAMPLE_FILES[name].values())
    for fname in SAMPLE_FILES[name]:
        assert (tmp_path / "a" / fname).read_bytes() == (SAMPLES / name / fname).read_bytes(), fname
    src.write_samples(tmp_path / "b", seed=1)
    first = next(iter(SAMPLE_FILES[name]))
    assert (tmp_path / "b" / first).read_bytes() != (SAMPLES / name / first).read_bytes()


# -- real data -------------------------------------------------------------------------------------------
def test_real_samsum(shared_data):
    src = sources.get("samsum")
    val = src.parse(shared_data / "samsum" / "val.json")
    test = src.parse(shared_data / "samsum" / "test.json")
    assert (len(val), len(test)) == (818, 819)
    assert {r["split"] for r in val} == {"val"} and {r["split"] for r in test} == {"test"}
    assert len({r["id"] for r in val + test}) == 818 + 819
    r = next(r for r in test if r["id"] == "samsum-test-13862856")
    assert (
        r["target"]
        == "Hannah needs Betty's number but Amanda doesn't have it. She needs to contact Larry."
    )
    assert r["input"].startswith("Hannah: Hey, do you have Betty's number?\nAmanda: Lemme check\n")
    assert r["meta"]["speakers"] == ["Hannah", "Amanda"] and r["meta"]["n_turns"] == 15
    assert r["meta"]["sentences"][-1] == "Amanda: Bye bye"


def test_real_cnndm(shared_data):
    path = shared_data / "cnndm" / "frank_cnndm_test.jsonl"
    recs = sources.get("cnndm").parse(path)
    assert (
        len(recs) == 250
        and {r["split"] for r in recs} == {"test"}
        and len({r["id"] for r in recs}) == 250
    )
    r = recs[0]
    assert r["id"] == "cnndm-test-dm-test-008aa71f64621995d749aff42be822b1b6ca7bc9"
    assert r["target"].startswith(
        "Gary Locke will be confirmed as Kilmarnock boss on Friday . The club went"
    )
    assert len(r["meta"]["highlights"]) == 3 and len(r["meta"]["sentences"]) == 44
    assert r["meta"]["sentences"][1].startswith(
        "An announcement will be made by the Rugby Park club"
    )
    assert "dailymail.co.uk" in r["meta"]["url"]
    raw = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert r["meta"]["sentences"] == [
        " ".join(s.split()) for s in raw["article_lines"] if s.strip()
    ]
    assert r["input"] == " ".join(raw["article"].split())


def test_real_pubmed(shared_data):
    src = sources.get("pubmed")
    folder = shared_data / "pubmed"
    train_path = folder / "pubmed_train_sample.armancohan.jsonl"
    # three training articles have an empty body (article_text == [""]): malformed by the contract
    with pytest.raises(InputError) as err:
        src.parse(train_path)
    msg = str(err.value)
    assert (
        str(train_path) in msg
        and "line 12" in msg
        and "PMC1637871" in msg
        and "`article_text`: empty" in msg
    )
    train = src.parse(train_path, skip_malformed=True)
    assert len(train) == 77 and [loc for loc, _ in train.skipped] == [
        "line 12",
        "line 23",
        "line 51",
    ]
    assert len(train) + len(train.skipped) == 80
    val = src.parse(folder / "pubmed_validation_sample.armancohan.jsonl")
    test = src.parse(folder / "pubmed_test_sample.armancohan.jsonl")
    assert (len(val), len(test)) == (10, 10)
    assert {r["split"] for r in val} == {"val"} and {r["split"] for r in test} == {"test"}
    r = train[0]
    raw = json.loads(train_path.read_text(encoding="utf-8").splitlines()[0])
    assert r["id"] == "pubmed-train-PMC3872579" and raw["article_id"] == "PMC3872579"
    assert r["target"].startswith(
        "background : the present study was carried out to assess the effects of community"
    )
    assert r["target"] == " ".join(
        " ".join(s.replace("<S>", " ").replace("</S>", " ").split()) for s in raw["abstract_text"]
    )
    assert r["meta"]["sentences"][0] == " ".join(raw["article_text"][0].split())
    assert len(r["meta"]["sentences"]) == len([s for s in raw["article_text"] if s.strip()])
    assert len(r["meta"]["abstract_sentences"]) == len(raw["abstract_text"])
    assert r["meta"]["section_names"][:2] == ["INTRODUCTION", "MATERIALS AND METHODS"]
    assert not any("<S>" in x["target"] or "</S>" in x["target"] for x in train + val + test)


# -- malformed records -------------------------------------------------------------------------------------
def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _jsonl(objs) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs)


_GOOD = {
    "samsum": {"id": "1", "summary": "A greets B.", "dialogue": "A: hi\nB: hello"},
    "cnndm": {"article": "First. Second.", "highlights": "First .", "id": "abc"},
    "pubmed": {
        "article_id": "PMC1",
        "article_text": ["a b .", "c d ."],
        "abstract_text": ["<S> a . </S>"],
    },
    "reddit_tifu": {
        "ups": 1.0,
        "documents": "i did a thing. it went bad.",
        "tldr": "did a thing",
        "title": "tifu",
    },
}
_BAD = {  # name -> (bad record, field named in the message, id named in the message or None)
    "samsum": ({"id": "2", "dialogue": "A: hi"}, "`summary`: missing", "id 2"),
    "cnndm": (
        {"article": "X.", "highlights": "Y .", "id": "def", "article_lines": ["X.", 3]},
        "`article_lines[1]`",
        "id def",
    ),
    "pubmed": (
        {"article_id": "PMC2", "article_text": ["x ."], "abstract_text": ["<S> </S>"]},
        "`abstract_text`",
        "id PMC2",
    ),
    "reddit_tifu": (
        {"ups": "many", "documents": "x.", "tldr": "y"},
        "`ups`: expected a number",
        None,
    ),
}
_FILES = {
    "samsum": "train.jsonl",
    "cnndm": "train.jsonl",
    "pubmed": "train.txt",
    "reddit_tifu": "train.jsonl",
}


@pytest.mark.parametrize("name", sorted(_BAD))
def test_malformed_record_named_and_skippable(name, tmp_path):
    bad, field, id_text = _BAD[name]
    good = _GOOD[name]
    other = {k: (f"{v}-other" if k in ("id", "article_id") else v) for k, v in good.items()}
    path = _write(tmp_path / "raw" / _FILES[name], _jsonl([good, "", bad, other]))
    src = sources.get(name)
    with pytest.raises(InputError) as err:
        src.parse(path)
    msg = str(err.value)
    assert str(path) in msg and ":line 3:" in msg and field in msg, msg
    assert id_text is None or id_text in msg
    recs = src.parse(path, skip_malformed=True)
    assert len(recs) == 2 and len(recs.skipped) == 1
    loc, why = recs.skipped[0]
    assert loc == "line 3" and field.split(":")[0] in why


def test_malformed_json_list_and_bad_json_line(tmp_path):
    good = _GOOD["samsum"]
    path = _write(
        tmp_path / "val.json", json.dumps([good, {"id": "7", "summary": "s", "dialogue": 5}])
    )
    with pytest.raises(
        InputError,
        match=r"val\.json:record 1: record \(id 7\): field `dialogue`: expected a string",
    ):
        sources.get("samsum").parse(path)
    path = _write(tmp_path / "test.jsonl", _jsonl([good, '{"id": "8", "summ']))
    with pytest.raises(InputError, match=r"test\.jsonl:line 2: not valid JSON"):
        sources.get("samsum").parse(path)
    recs = sources.get("samsum").parse(path, skip_malformed=True)
    assert len(recs) == 1 and recs.skipped[0][0] == "line 2"
    _write(tmp_path / "broken" / "test.json", "[{")
    with pytest.raises(InputError, match="not valid JSON"):
        sources.get("samsum").parse(tmp_path / "broken" / "test.json")


def test_wikihow_malformed_csv_row(tmp_path):
    text = (
        "headline,title,text\n"
        '"\nStep one.",How to A," Step one. Details here."\n'
        '"\nStep two.",How to B,"   "\n'
        '"\nStep three.",How to C\n'
    )
    path = _write(tmp_path / "test.csv", text)
    with pytest.raises(InputError) as err:
        sources.get("wikihow").parse(path)
    assert f"{path}:line 4:" in str(err.value) and "`text`: empty" in str(err.value)
    recs = sources.get("wikihow").parse(path, skip_malformed=True)
    assert len(recs) == 1 and [loc for loc, _ in recs.skipped] == ["line 4", "line 6"]
    assert "field `text`: missing (the row has 2 CSV fields, the header 3" in recs.skipped[1][1]


def test_wikihow_unsplit_release_is_refused(tmp_path):
    path = _write(tmp_path / "wikihowAll.csv", "headline,title,text\n")
    with pytest.raises(InputError, match="no train/val/test split.*manual_csv"):
        sources.get("wikihow").parse(path)


# -- formats, splits and layouts --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rel, split",
    [
        ("frank_cnndm_test.jsonl", "test"),
        ("pubmed_validation_sample.armancohan.jsonl", "val"),
        ("3.0.0/train-00001-of-00003.parquet", "train"),
        ("long/train/0000.parquet", "train"),
        ("samsum-validation.csv", "val"),
        ("dev.txt", "val"),
    ],
)
def test_infer_split(rel, split):
    assert en.infer_split(Path("/x") / rel) == split


def test_infer_split_errors():
    with pytest.raises(InputError, match="cannot tell the split"):
        en.infer_split(Path("/x/samsum/corpus.json"))
    with pytest.raises(InputError, match="several splits"):
        en.infer_split(Path("/x/train_test.json"))


def test_hub_parquet_and_csv_copies(tmp_path):
    cnn = pa.table(
        {
            "article": ["A one. B two.", "C three."],
            "highlights": ["A one .\nB two .", "C ."],
            "id": ["h1", "h2"],
        }
    )
    (tmp_path / "3.0.0").mkdir()
    pq.write_table(cnn, tmp_path / "3.0.0" / "test-00000-of-00001.parquet")
    recs = sources.get("cnndm").parse(tmp_path / "3.0.0" / "test-00000-of-00001.parquet")
    assert [r["id"] for r in recs] == ["cnndm-test-h1", "cnndm-test-h2"]
    assert recs[0]["target"] == "A one . B two ." and recs[0]["meta"]["sentences"] == [
        "A one.",
        "B two.",
    ]
    assert recs[0]["meta"]["highlights"] == ["A one .", "B two ."]

    shard_dir = tmp_path / "long" / "train"
    shard_dir.mkdir(parents=True)
    for k in range(2):
        pq.write_table(
            pa.table(
                {
                    "ups": [1.0, 2.0],
                    "num_comments": [0.0, 1.0],
                    "upvote_ratio": [0.5, 0.9],
                    "score": [1.0, 2.0],
                    "documents": ["so i did x. it broke.", "i did y.\nthen z."],
                    "tldr": ["did x", "did y"],
                    "title": ["a", "b"],
                }
            ),
            shard_dir / f"000{k}.parquet",
        )
    recs = sources.get("reddit_tifu").parse(shard_dir)
    assert [r["id"] for r in recs] == [
        f"reddit_tifu-train-000{k}-00000{i}" for k in range(2) for i in range(2)
    ]
    assert (
        recs[1]["meta"]["sentences"] == ["i did y.", "then z."]
        and recs[1]["meta"]["num_comments"] == 1.0
    )
    assert len(en.load_split(tmp_path, "train", sources.get("reddit_tifu").parse)) == 4

    csv_text = 'id,dialogue,summary\n13818513,"Amanda: I baked cookies. Do you want some?\r\nJerry: Sure!\r\nAmanda: I\'ll bring you tomorrow :-)",Amanda baked cookies and will bring Jerry some tomorrow.\n'
    path = _write(tmp_path / "knk" / "validation.csv", csv_text)
    (r,) = sources.get("samsum").parse(path)
    assert r["id"] == "samsum-val-13818513" and r["meta"]["n_turns"] == 3 and "\r" not in r["input"]


def test_folder_of_mixed_splits_is_refused(tmp_path):
    _write(tmp_path / "train.jsonl", _jsonl([_GOOD["cnndm"]]))
    _write(tmp_path / "test.jsonl", _jsonl([_GOOD["cnndm"]]))
    with pytest.raises(InputError, match="several splits"):
        sources.get("cnndm").parse(tmp_path)
    assert sorted(en.split_files(tmp_path)) == ["test", "train"]


def test_original_reddit_tifu_json_lines(tmp_path):
    line = {
        "id": "7abc",
        "selftext_without_tldr": "so i fell. it hurt.",
        "trimmed_title": "falling",
        "tldr": "fell",
        "ups": 3,
        "num_comments": 1,
        "score": 3,
        "upvote_ratio": 0.7,
        "selftext": "...",
    }
    (r,) = sources.get("reddit_tifu").parse(
        _write(tmp_path / "tifu_all_tokenized_and_filtered.json", _jsonl([line])), split="train"
    )
    assert (
        r["id"] == "reddit_tifu-train-7abc"
        and r["meta"]["title"] == "falling"
        and r["input"] == "so i fell. it hurt."
    )


def test_split_sentences():
    text = 'He said "Stop." Then he left! Was it 3 p.m.? 4 people saw it.\nNew paragraph. the end'
    assert en.split_sentences(text) == [
        'He said "Stop."',
        "Then he left!",
        "Was it 3 p.m.?",
        "4 people saw it.",
        "New paragraph. the end",
    ]


# -- downloads ------------------------------------------------------------------------------------------------
def _reachable(host: str) -> bool:
    try:
        socket.create_connection((host, 443), timeout=2).close()
        return True
    except OSError:
        return False


_HOSTS = {
    "samsum": "huggingface.co",
    "cnndm": "huggingface.co",
    "reddit_tifu": "huggingface.co",
    "pubmed": "archive.org",
    "wikihow": "raw.githubusercontent.com",
}
_MESSAGE_PARTS = {
    "samsum": ("SAMSum", "knkarthick/samsum", "'main'"),
    "cnndm": ("CNN/DailyMail", "abisee/cnn_dailymail", "3adf6249f0cc8409a97a4d38471529ef5f7dc496"),
    "reddit_tifu": ("Reddit TIFU", "ctr4si/reddit_tifu", "refs/convert/parquet"),
    "pubmed": (
        "PubMed",
        "https://archive.org/download/armancohan-long-summarization-paper-code/pubmed-dataset.zip",
    ),
    "wikihow": (
        "WikiHow",
        "https://raw.githubusercontent.com/mahnazkoupaee/WikiHow-Dataset/4e9f8ce85efc57d7627e44906ba7e02a5729779c/all_train.txt",
    ),
}


@pytest.mark.parametrize(
    "name, offline_env",
    [(n, False) for n in NAMES] + [(n, True) for n in NAMES if _HOSTS[n] == "huggingface.co"],
)
def test_download_offline_fails_fast_and_cleanly(name, offline_env, tmp_path, monkeypatch):
    """Without network (or with HF_HUB_OFFLINE for the hub sources): DownloadError within 10 s that
    names the dataset, the URL or hub id and revision and the config key; nothing left behind."""
    from huggingface_hub import constants

    if offline_env:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        if _reachable(_HOSTS[name]):
            pytest.skip(
                f"this machine reaches {_HOSTS[name]}; the offline path is not testable here"
            )
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    before = sorted(tmp_path.iterdir())
    t0 = time.monotonic()
    with pytest.raises(DownloadError) as err:
        sources.get(name).download(tmp_path / "dl", timeout=3)
    assert time.monotonic() - t0 < 10
    msg = str(err.value)
    for part in _MESSAGE_PARTS[name] + (f"data.{name}.local_dir",):
        assert part in msg, (part, msg)
    assert sorted(tmp_path.iterdir()) == before


def _fake_snapshot(files: dict[str, bytes], calls: list):
    def fake(repo_id, *, repo_type, revision, allow_patterns, local_dir, etag_timeout, **kw):
        calls.append((repo_id, repo_type, revision, tuple(allow_patterns), etag_timeout))
        for rel, data in files.items():
            (Path(local_dir) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(local_dir) / rel).write_bytes(data)
        (Path(local_dir) / ".cache" / "huggingface").mkdir(parents=True)
        (Path(local_dir) / ".cache" / "huggingface" / "x.metadata").write_text("m")
        return str(local_dir)

    return fake


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def test_hub_download_with_a_stand_in_hub(tmp_path, monkeypatch):
    import huggingface_hub

    cnndm = _module("cnndm")
    table = lambda i: pa.table(
        {"article": [f"Story {i}. More."], "highlights": [f"Story {i} ."], "id": [f"id{i}"]}
    )
    files = {
        "3.0.0/train-00000-of-00002.parquet": _parquet_bytes(table(0)),
        "3.0.0/train-00001-of-00002.parquet": _parquet_bytes(table(1)),
        "3.0.0/validation-00000-of-00001.parquet": _parquet_bytes(table(2)),
        "3.0.0/test-00000-of-00001.parquet": _parquet_bytes(table(3)),
    }
    calls: list = []
    monkeypatch.setattr(en, "probe", lambda url, timeout: None)
    monkeypatch.setattr(en, "_offline_env", lambda: False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _fake_snapshot(files, calls))
    dest = cnndm.download(tmp_path / "cnndm", timeout=4)
    assert calls == [("abisee/cnn_dailymail", "dataset", cnndm.REVISION, ("3.0.0/*.parquet",), 4)]
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == sorted(files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnndm"]
    train = cnndm.load_split(dest, "train")
    assert [r["id"] for r in train] == ["cnndm-train-id0", "cnndm-train-id1"]
    assert [r["id"] for r in cnndm.load_split(dest, "val")] == ["cnndm-val-id2"]

    # a revision without one of the splits: error, and nothing left behind
    del files["3.0.0/validation-00000-of-00001.parquet"]
    with pytest.raises(
        DownloadError, match=r"no files for split\(s\) \['val'\].*data.cnndm.local_dir"
    ):
        cnndm.download(tmp_path / "cnndm2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnndm"]


def test_pubmed_download_with_a_stand_in_archive(tmp_path, monkeypatch):
    pubmed = _module("pubmed")
    line = (
        json.dumps(
            {"article_id": "PMC9", "article_text": ["a ."], "abstract_text": ["<S> b . </S>"]}
        )
        + "\n"
    )

    def fake_fetch(url, dest, timeout, config_key, dataset):
        with zipfile.ZipFile(dest, "w") as zf:
            for s in ("train", "val", "test"):
                zf.writestr(f"pubmed-dataset/{s}.txt", line)
                zf.writestr(f"__MACOSX/pubmed-dataset/._{s}.txt", "junk")
            zf.writestr("pubmed-dataset/vocab", "the 100\n")
        return Path(dest)

    monkeypatch.setattr(en, "probe", lambda url, timeout: None)
    monkeypatch.setattr(pubmed, "fetch_url", fake_fetch)
    dest = pubmed.download(tmp_path / "pubmed")
    assert sorted(p.name for p in dest.iterdir()) == ["test.txt", "train.txt", "val.txt"]
    assert [r["id"] for r in pubmed.load_split(dest, "val")] == ["pubmed-val-PMC9"]


def test_wikihow_download_splits_the_manual_csv(tmp_path, monkeypatch):
    wikihow = _module("wikihow")
    rows = [
        [
            "\nWash it.,\nDry it.,",
            "How to Clean a Pan",
            " Wash it. Use soap.\n,Dry it. Use a towel.",
        ],
        ["\nFeed it.,", "How to Feed a Cat", " Feed it. Twice a day is enough for most cats."],
        ["\nA very long summary line that is longer than the text.,", "How to Skip", " Short."],
        ["\nPlant it.,", "How to Grow Basil", " Plant it. Water it often."],
        ["\nUnlisted.,", "How to Be Unlisted", " Unlisted. Not in any list."],
    ]
    manual = tmp_path / "manual" / "wikihowAll.csv"
    en.write_csv_atomic(manual, ["headline", "title", "text"], rows)
    lists = {
        "train": "HowtoCleanaPan\nHowtoSkip\n",
        "val": "HowtoFeedaCat\n",
        "test": "HowtoGrowBasil\n",
    }

    def fake_fetch(url, dest, timeout, config_key, dataset):
        split = re.search(r"all_(\w+)\.txt$", url).group(1)
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        Path(dest).write_text(lists[split], encoding="utf-8")
        return Path(dest)

    monkeypatch.setattr(en, "probe", lambda url, timeout: None)
    monkeypatch.setattr(wikihow, "fetch_url", fake_fetch)
    with pytest.raises(DownloadError, match=re.escape(wikihow.MANUAL_URL)):
        wikihow.download(tmp_path / "wh")
    dest = wikihow.download(tmp_path / "wh", manual_csv=manual)
    assert sorted(p.name for p in dest.iterdir()) == ["test.csv", "train.csv", "val.csv"]
    (train,) = wikihow.load_split(dest, "train")
    assert (
        train["target"] == "Wash it. Dry it."
        and train["input"] == "Wash it. Use soap. Dry it. Use a towel."
    )
    assert train["meta"]["sentences"] == ["Wash it.", "Use soap.", "Dry it.", "Use a towel."]
    assert [r["meta"]["title"] for r in wikihow.load_split(dest, "test")] == ["How to Grow Basil"]
    assert sources.get("wikihow").parse(dest / "val.csv")[0]["id"] == "wikihow-val-000000"


# -- PubMed at paper scale: empty article bodies are skipped and named ----------------------------------
def _paper_prepare_options(name: str) -> dict:
    """The options the ``prepare_source`` rule passes for ``name`` under ``config/paper.yaml``."""
    from helpers import configs, deep_update

    from fedrepro import grid

    cfg, paper = configs()
    deep_update(cfg, paper)  # as Snakemake merges --configfile config/paper.yaml over the demo
    return grid.prepare_options(cfg, name)


def _skipped_named(report: dict) -> list[tuple[str, str, str]]:
    return [(s["id"], s["field"], s["problem"]) for s in report["skipped_records"]]


def test_pubmed_paper_options_skip_an_empty_article_body_and_name_it(tmp_path):
    from fedrepro.data.prepare import prepare_source

    empty = {"article_id": "PMC9", "article_text": [""], "abstract_text": ["<S> a . </S>"]}
    other = dict(_GOOD["pubmed"], article_id="PMC3")
    raw = tmp_path / "raw"
    _write(raw / "train.txt", _jsonl([_GOOD["pubmed"], empty, other]))
    opts = _paper_prepare_options("pubmed")
    assert opts["skip_malformed"] is True
    report = prepare_source("pubmed", raw, str(tmp_path / "r.jsonl"), str(tmp_path / "r.json"), **opts)
    assert report["counts"] == {"train": 2} and report["skipped"] == 1
    assert _skipped_named(report) == [("PMC9", "article_text", "empty")]
    (entry,) = report["skipped_records"]
    assert entry["record"] == "line 2" and entry["file"] == str(raw / "train.txt")
    assert json.loads((tmp_path / "r.json").read_text())["skipped_records"] == report["skipped_records"]


def test_real_pubmed_prepares_with_the_paper_options(shared_data, tmp_path):
    from fedrepro.data.prepare import prepare_source

    folder = shared_data / "pubmed"
    train = folder / "pubmed_train_sample.armancohan.jsonl"
    empty = [  # the training articles whose body is empty in the real files
        (f"line {n}", obj["article_id"])
        for n, obj in enumerate(map(json.loads, train.read_text(encoding="utf-8").splitlines()), 1)
        if not any(s.strip() for s in obj["article_text"])
    ]
    assert [i for _, i in empty] == ["PMC1637871", "PMC1469534", "PMC4151783"]
    opts = _paper_prepare_options("pubmed")
    report = prepare_source("pubmed", folder, str(tmp_path / "r.jsonl"), str(tmp_path / "r.json"), **opts)
    assert report["counts"] == {"train": 77, "val": 10, "test": 10} and report["skipped"] == 3
    assert _skipped_named(report) == [(i, "article_text", "empty") for _, i in empty]
    assert [(s["file"], s["record"]) for s in report["skipped_records"]] == [
        (str(train), loc) for loc, _ in empty
    ]
