"""AMI, ICSI, ELITR, MeetingBank: the long-meeting clients of AdaFedSelecKD (§V-B4, Fig. 9)."""

from __future__ import annotations

import collections
import hashlib
import http.server
import io
import json
import re
import socket
import threading
import time
import zipfile
from pathlib import Path
from typing import Self

import pytest

from fedrepro.data import sources
from fedrepro.data.download import DownloadError
from fedrepro.data.sources import ami, elitr, icsi, meetingbank
from fedrepro.data.sources._meetings import SOURCES
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "resources" / "samples"
RECORD_KEYS = {"id", "source", "client", "split", "input", "target", "meta"}


def _check_records(recs: list[dict], name: str) -> None:
    assert recs, name
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)), "ids must be unique"
    for r in recs:
        assert set(r) == RECORD_KEYS, r["id"]
        assert r["source"] == r["client"] == name
        assert r["split"] in ("train", "val", "test")
        assert r["id"].startswith(f"{name}-{r['split']}-")
        for key in ("input", "target"):
            assert isinstance(r[key], str) and r[key].strip() and r[key] == " ".join(r[key].split())
        meta = r["meta"]
        for key in ("n_turns", "n_speakers", "n_words", "summary_words"):
            assert isinstance(meta[key], int) and meta[key] >= 1, (r["id"], key)
        assert meta["summary_words"] == len(r["target"].split())
        assert meta["n_turns"] >= meta["n_speakers"]


def _elitr_samples() -> Path:
    return SAMPLES / "elitr" / elitr.ELITR_LANG_DIR


def _parse_samples(name: str) -> list[dict]:
    src = sources.get(name)
    if name == "ami":
        return src.parse(SAMPLES / "ami" / ami.AMI_FILE)
    if name == "icsi":
        return [
            r for s in ("train", "dev", "test") for r in src.parse(SAMPLES / f"icsi/data/{s}.json")
        ]
    if name == "elitr":
        return [r for s in ("train", "dev", "test") for r in src.parse(_elitr_samples() / s)]
    return [
        r
        for s in ("train", "validation", "test")
        for r in src.parse(SAMPLES / f"meetingbank/data/{s}-00000-of-00001.parquet")
    ]


# -- registry --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SOURCES)
def test_registered(name):
    src = sources.get(name)
    assert src.name == name and src.kind == "seq2seq" and src.lang == "en"
    assert src.config_key == f"data.{name}.local_dir"
    pin = {
        "ami": ami.AMI_TRANSCRIPTS_COMMIT,
        "icsi": icsi.ICSI_REVISION,
        "elitr": elitr.ELITR_SHA256,
        "meetingbank": meetingbank.MEETINGBANK_REVISION,
    }[name]
    assert " @ " in src.upstream and pin in src.upstream


# -- committed samples -----------------------------------------------------------------------------
def test_ami_samples():
    recs = _parse_samples("ami")
    _check_records(recs, "ami")
    assert collections.Counter(r["split"] for r in recs) == {"train": 24, "val": 8, "test": 8}
    for r in recs:
        assert r["split"] == ami.AMI_SPLIT[r["meta"]["meeting_id"]]
        assert r["input"].startswith("Speaker A: ") and "Speaker D: " in r["input"]
        assert r["meta"]["n_turns"] == 4
    # the four scenario stages: kick-off meetings introduce the roles
    kickoff = [r for r in recs if r["meta"]["meeting_id"].endswith("a")]
    assert kickoff and all("I'm the project manager" in r["input"] for r in kickoff)


def test_icsi_samples():
    src = sources.get("icsi")
    by_split = {s: src.parse(SAMPLES / f"icsi/data/{s}.json") for s in ("train", "dev", "test")}
    assert {s: len(r) for s, r in by_split.items()} == {"train": 20, "dev": 6, "test": 6}
    assert {r["split"] for r in by_split["dev"]} == {"val"}
    assert [r["meta"]["meeting_id"] for r in by_split["test"]] == list(icsi.ICSI_TEST_MEETINGS)
    recs = [r for rs in by_split.values() for r in rs]
    _check_records(recs, "icsi")
    assert all(re.match(r"Professor [A-H]: ", r["input"]) for r in recs)
    assert all(r["meta"]["summary_items"]["abstract"] >= 1 for r in recs)
    # decisions / problems items are not part of the target
    assert not any("The group will" in r["target"] for r in recs)


def test_elitr_samples():
    src = sources.get("elitr")
    counts = {}
    for split_dir in ("train", "dev", "test"):
        folder = _elitr_samples() / split_dir
        recs = src.parse(folder)
        n_minutes = len(list(folder.glob("*/minutes_GENER_*.txt")))
        assert len(recs) == n_minutes, split_dir  # one record per (meeting, annotator minutes)
        counts[split_dir] = len(recs)
    assert 20 <= counts["train"] <= 40 and counts["dev"] >= 5 and counts["test"] >= 5
    recs = _parse_samples("elitr")
    _check_records(recs, "elitr")
    assert collections.Counter(r["split"] for r in recs) == {
        "train": counts["train"],
        "val": counts["dev"],
        "test": counts["test"],
    }
    assert all(re.match(r"PERSON\d+: ", r["input"]) for r in recs)
    # the language folder and a single meeting folder parse too
    assert len(src.parse(SAMPLES / "elitr")) == len(recs)
    meeting = min((_elitr_samples() / "dev").iterdir())
    one = src.parse(meeting)
    assert one and {r["split"] for r in one} == {"val"} and one[0]["meta"]["raw_split"] == "dev"


def test_meetingbank_samples():
    recs = _parse_samples("meetingbank")
    _check_records(recs, "meetingbank")
    assert collections.Counter(r["split"] for r in recs) == {"train": 30, "val": 10, "test": 10}
    assert all(r["input"].startswith("Speaker 0: ") for r in recs)
    assert all(r["meta"]["n_turns"] == r["input"].count("Speaker ") for r in recs)


@pytest.mark.parametrize("name", SOURCES)
def test_sample_targets_are_learnable(name):
    """Every number and placeholder entity a summary states also occurs in its transcript."""
    for r in _parse_samples(name):
        target = re.sub(r"Date: 20\d\d-\d\d-\d\d", "", r["target"])  # ELITR minutes header
        for tok in re.findall(r"\$?\d[\d,.]*\d|\d", target):
            assert tok.rstrip(".") in r["input"], (r["id"], tok)
        for ent in re.findall(r"\[(?!ANNOTATOR)[A-Z]+\d+\]", r["target"]):
            assert ent in r["input"] or f"{ent[1:-1]}: " in r["input"], (r["id"], ent)


def test_sample_clients_are_non_iid():
    vocab = {}
    for name in SOURCES:
        words = " ".join(r["target"] for r in _parse_samples(name)).lower()
        vocab[name] = {w for w in re.findall(r"[a-z]{5,}", words)}
    for a in SOURCES:
        for b in SOURCES:
            if a < b:
                jaccard = len(vocab[a] & vocab[b]) / len(vocab[a] | vocab[b])
                assert jaccard < 0.15, (a, b, jaccard)


@pytest.mark.parametrize("name", SOURCES)
def test_samples_regenerate_byte_identical(name, tmp_path):
    src = sources.get(name)
    src.write_samples(tmp_path / "a")
    committed = sorted(
        p.relative_to(SAMPLES / name) for p in (SAMPLES / name).rglob("*") if p.is_file()
    )
    fresh = sorted(
        p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file()
    )
    assert fresh == committed
    for rel in committed:
        assert (tmp_path / "a" / rel).read_bytes() == (SAMPLES / name / rel).read_bytes(), rel
    size = sum((SAMPLES / name / rel).stat().st_size for rel in committed)
    assert size < 150_000, size
    src.write_samples(tmp_path / "b", seed=1)
    assert any(
        (tmp_path / "b" / rel).exists()
        and (tmp_path / "b" / rel).read_bytes() != (SAMPLES / name / rel).read_bytes()
        for rel in committed
    )


# -- the real AMI copy -----------------------------------------------------------------------------
def test_ami_scenario_partition():
    scenario = [m for m in ami.AMI_MEETINGS if not m.startswith("IB")]
    counts = collections.Counter(ami.ami_split(m) for m in scenario)
    assert counts == {"train": 98, "val": 20, "test": 20}  # AMI scenario-only partition SA/SB/SC
    assert collections.Counter(ami.AMI_SPLIT.values()) == {"train": 102, "val": 20, "test": 20}
    assert ami.ami_split("ES2003c") == "val" and ami.ami_split("TS3007a") == "test"
    assert ami.ami_split("IB4010") == "train"


def test_real_ami(shared_data):
    path = shared_data / "ami" / "ami_abstractive.jsonl"
    if not path.is_file():
        pytest.skip(f"real AMI copy not present at {path}")
    recs = sources.get("ami").parse(path)
    assert len(recs) == 142 and not recs.skipped
    _check_records(recs, "ami")
    assert tuple(sorted(r["meta"]["meeting_id"] for r in recs)) == ami.AMI_MEETINGS
    assert collections.Counter(r["split"] for r in recs) == {"train": 102, "val": 20, "test": 20}
    by_id = {r["meta"]["meeting_id"]: r for r in recs}
    es2002a = by_id["ES2002a"]
    assert es2002a["id"] == "ami-train-ES2002a"
    assert es2002a["input"].startswith("Speaker A: Um I'm Craig and I'm User Interface.")
    assert "Speaker C: Okay. Right. Um well this is the kick-off meeting" in es2002a["input"]
    assert es2002a["target"].startswith(
        "The project manager introduced the upcoming project to the team members"
    )
    assert es2002a["meta"]["n_turns"] == 4 and es2002a["meta"]["summary_sentences"] == 3
    assert by_id["ES2004a"]["split"] == "test" and by_id["IS1008b"]["split"] == "val"
    assert by_id["IB4011"]["split"] == "train"
    # whole meetings: thousands of words in, a paragraph out (the long-meeting setting of §V-B4)
    mean_words = sum(r["meta"]["n_words"] for r in recs) / len(recs)
    assert 4000 < mean_words < 6000


# -- downloads -------------------------------------------------------------------------------------
def _reachable(host: str, port: int = 443) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


_DOWNLOAD_EXPECT = {
    "ami": (
        "raw.githubusercontent.com",
        ["AMI", ami.AMI_TRANSCRIPTS_COMMIT, "ES2002a.transcript.txt"],
    ),
    "icsi": (None, ["ICSI", icsi.ICSI_HUB_ID, icsi.ICSI_REVISION]),
    "elitr": ("lindat.mff.cuni.cz", ["ELITR", elitr.ELITR_URL, "11234/1-4692"]),
    "meetingbank": (None, ["MeetingBank", meetingbank.MEETINGBANK_HUB_ID, meetingbank.MEETINGBANK_REVISION]),
}


@pytest.mark.parametrize("name", SOURCES)
def test_download_offline_fails_fast_and_cleanly(name, tmp_path):
    host, words = _DOWNLOAD_EXPECT[name]
    if host is not None and _reachable(host):
        pytest.skip(f"this machine reaches {host}; the offline path is not testable here")
    parent = tmp_path / "parent"
    parent.mkdir()
    t0 = time.monotonic()
    with pytest.raises(DownloadError) as err:
        sources.get(name).download(parent / "dl", timeout=3)
    assert time.monotonic() - t0 < 10
    msg = str(err.value)
    for word in [*words, f"data.{name}.local_dir"]:
        assert word in msg, (word, msg)
    assert list(parent.iterdir()) == []


class _Server:
    """A loopback HTTP server answering GET for a fixed {path: bytes} map (404 otherwise)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = files.get(self.path)
                self.send_response(200 if body is not None else 404)
                body = body if body is not None else b"not found"
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def test_download_ami_assembles_the_shared_form(tmp_path, monkeypatch):
    transcript = "Hi , I'm the PM.\nOkay.\nYes.\nRight, fine.\n"
    abstract = "The team met. They decided on a yellow remote! Was it good? Yes. "
    files = {
        "/t/ES2002a.transcript.txt": transcript.encode(),
        "/s/ES2002a.abssumm.txt": abstract.encode(),
        "/t/TS3003b.transcript.txt": b"A said this.\nB said that.\n",
        "/s/TS3003b.abssumm.txt": b"They talked.",
    }
    with _Server(files) as srv:
        monkeypatch.setattr(ami, "AMI_TRANSCRIPT_URL", srv.url + "/t/{meeting}.transcript.txt")
        monkeypatch.setattr(ami, "AMI_SUMMARY_URL", srv.url + "/s/{meeting}.abssumm.txt")
        out = ami.download_ami(tmp_path / "ami", timeout=3, meetings=["ES2002a", "TS3003b"])
        assert sorted(p.name for p in out.iterdir()) == [ami.AMI_FILE]
        lines = [json.loads(x) for x in (out / ami.AMI_FILE).read_text().splitlines()]
        assert lines[0] == {
            "meeting_id": "ES2002a",
            "transcript": transcript.strip("\n"),
            "abstract": abstract.strip(),
            "abstract_sentences": [
                "The team met.",
                "They decided on a yellow remote!",
                "Was it good?",
                "Yes.",
            ],
        }
        recs = sources.get("ami").parse(out)
        assert [r["split"] for r in recs] == ["train", "test"]
        assert recs[0]["input"] == (
            "Speaker A: Hi , I'm the PM. Speaker B: Okay. Speaker C: Yes. Speaker D: Right, fine."
        )
        # a missing file fails the whole download and leaves nothing behind
        with pytest.raises(DownloadError, match="IS1000a.transcript.txt"):
            ami.download_ami(tmp_path / "ami2", timeout=3, meetings=["ES2002a", "IS1000a"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ami"]


def _elitr_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(_elitr_samples().rglob("*")):
            if p.is_file():
                rel = p.relative_to(SAMPLES / "elitr")
                zf.writestr(f"ELITR-minuting-corpus/{rel}", p.read_bytes())
        zf.writestr("ELITR-minuting-corpus/elitr-minuting-corpus-cs/train/x.txt", "cs")
    return buf.getvalue()


def test_download_elitr_extracts_english_part(tmp_path):
    body = _elitr_zip()
    with _Server({"/elitr.zip": body}) as srv:
        out = elitr.download_elitr(
            tmp_path / "elitr",
            timeout=3,
            url=srv.url + "/elitr.zip",
            sha256=hashlib.sha256(body).hexdigest(),
        )
        assert sorted(p.name for p in out.iterdir()) == [elitr.ELITR_LANG_DIR]
        assert len(sources.get("elitr").parse(out)) == len(_parse_samples("elitr"))
        with pytest.raises(DownloadError, match="SHA-256") as err:
            elitr.download_elitr(
                tmp_path / "bad", timeout=3, url=srv.url + "/elitr.zip", sha256="0" * 64
            )
        assert "data.elitr.local_dir" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elitr"]


# -- malformed records -----------------------------------------------------------------------------
def _ami_line(mid: str = "ES2002a", **over) -> str:
    obj = {"meeting_id": mid, "transcript": "a b\nc d", "abstract_sentences": ["They met."]}
    obj.update(over)
    return json.dumps({k: v for k, v in obj.items() if v is not ...})


def test_ami_malformed(tmp_path):
    path = tmp_path / ami.AMI_FILE
    path.write_text(
        "\n".join([_ami_line(), _ami_line("ES2002b", transcript=...), _ami_line("ES2003a")]) + "\n"
    )
    with pytest.raises(InputError) as err:
        sources.get("ami").parse(path)
    msg = str(err.value)
    assert str(path) in msg and ":2:" in msg and "`transcript`" in msg and "missing" in msg
    recs = sources.get("ami").parse(path, skip_malformed=True)
    assert [r["id"] for r in recs] == ["ami-train-ES2002a", "ami-val-ES2003a"]
    assert len(recs.skipped) == 1 and recs.skipped[0][0] == "2"

    for bad, field in (
        (_ami_line(abstract_sentences=[]), "abstract_sentences"),
        (_ami_line(abstract_sentences=["ok", 3]), "abstract_sentences[1]"),
        (_ami_line(transcript="   "), "transcript"),
        (_ami_line(meeting_id="meeting 1"), "meeting_id"),
        ("{not json", "JSON"),
    ):
        path.write_text(bad + "\n")
        with pytest.raises(InputError, match=re.escape(field)):
            sources.get("ami").parse(path)
        assert len(sources.get("ami").parse(path, skip_malformed=True).skipped) == 1
    path.write_text(_ami_line() + "\n" + _ami_line() + "\n")
    with pytest.raises(InputError, match="duplicate"):
        sources.get("ami").parse(path)


def _icsi_meeting(sid: str) -> dict:
    return {
        "sample_id": sid,
        "dialogue": [
            {"id": "1", "speaker": "A", "text": "OK , so .", "attributes": {"role": "Professor"}},
            {
                "id": "2",
                "speaker": "B",
                "text": "yeah .",
                "attributes": json.dumps({"role": "PhD"}),
            },
            {"id": "3", "speaker": "C", "text": "right .", "attributes": None},
        ],
        "summary": [
            {"id": "s1", "text": "They met.", "type": "abstract"},
            {"id": "s2", "text": "Fix it.", "type": "decisions"},
        ],
    }


def test_icsi_malformed(tmp_path):
    good = _icsi_meeting("Bmr001")
    bad = _icsi_meeting("Bmr002")
    bad["dialogue"][1]["text"] = None
    path = tmp_path / "data" / "train.json"
    path.parent.mkdir()
    path.write_text(json.dumps([good, bad]))
    with pytest.raises(InputError) as err:
        sources.get("icsi").parse(path)
    msg = str(err.value)
    assert str(path) in msg and "record 1" in msg and "Bmr002" in msg and "dialogue[1].text" in msg
    recs = sources.get("icsi").parse(path, skip_malformed=True)
    assert [r["id"] for r in recs] == ["icsi-train-Bmr001"] and len(recs.skipped) == 1
    assert recs[0]["input"] == "Professor A: OK , so . PhD B: yeah . C: right ."
    assert recs[0]["target"] == "They met."

    no_abstract = _icsi_meeting("Bmr003")
    no_abstract["summary"] = [{"id": "s", "text": "Fix it.", "type": "decisions"}]
    (tmp_path / "data" / "dev.jsonl").write_text(json.dumps(no_abstract) + "\n")
    with pytest.raises(InputError, match=r":1 \(sample_id=Bmr003\): field `summary`"):
        sources.get("icsi").parse(tmp_path / "data" / "dev.jsonl")
    path.write_text('[{"sample_id": "x",')
    with pytest.raises(InputError, match="not valid JSON"):
        sources.get("icsi").parse(path)
    with pytest.raises(InputError, match="split"):
        (tmp_path / "data" / "meetings.json").write_text(json.dumps([good]))
        sources.get("icsi").parse(tmp_path / "data" / "meetings.json")


def test_elitr_malformed(tmp_path):
    split = tmp_path / elitr.ELITR_LANG_DIR / "dev"
    good = split / "meeting_en_dev_001"
    good.mkdir(parents=True)
    (good / "transcript_MAN_annot01.txt").write_text(
        "(PERSON1) Hello.\nHow are you?\n\n(PERSON2) Fine.\n(PERSON2) Thanks.\n"
    )
    (good / "minutes_GENER_annot01.txt").write_text("- [PERSON2] is fine\n")
    (good / "minutes_GENER_annot02.txt").write_text("Date: x\n- all fine\n")
    bad = split / "meeting_en_dev_002"
    bad.mkdir()
    (bad / "transcript_MAN_annot03.txt").write_text("(PERSON1) Hi.\n")
    (bad / "minutes_GENER_annot03.txt").write_text("\n  \n")
    with pytest.raises(InputError) as err:
        sources.get("elitr").parse(split)
    msg = str(err.value)
    assert str(bad / "minutes_GENER_annot03.txt") in msg and "`minutes`" in msg and "empty" in msg
    recs = sources.get("elitr").parse(split, skip_malformed=True)
    assert [r["id"] for r in recs] == [
        "elitr-val-meeting_en_dev_001-annot01",
        "elitr-val-meeting_en_dev_001-annot02",
    ]
    assert recs.skipped == [(str(bad), msg)]
    assert recs[0]["input"] == "PERSON1: Hello. How are you? PERSON2: Fine. Thanks."
    assert recs[1]["target"] == "Date: x - all fine"
    (bad / "minutes_GENER_annot03.txt").unlink()
    with pytest.raises(InputError, match=r"meeting_en_dev_002:meeting: field `minutes`"):
        sources.get("elitr").parse(split)
    with pytest.raises(InputError, match="not a folder"):
        sources.get("elitr").parse(good / "minutes_GENER_annot01.txt")


def test_meetingbank_malformed(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "id": 1,
            "uid": "DenverCityCouncil_01012020_20-0001",
            "summary": "A bill.",
            "transcript": "Speaker 0: A bill. Speaker 1: Aye.",
        },
        {
            "id": 2,
            "uid": "DenverCityCouncil_01012020_20-0002",
            "summary": "  ",
            "transcript": "Speaker 0: Item two.",
        },
    ]
    path = tmp_path / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(InputError) as err:
        sources.get("meetingbank").parse(path)
    msg = str(err.value)
    assert str(path) in msg and "row 2" in msg and "20-0002" in msg and "`summary`" in msg
    recs = sources.get("meetingbank").parse(path, skip_malformed=True)
    assert [r["id"] for r in recs] == ["meetingbank-test-DenverCityCouncil_01012020_20-0001"]
    assert recs[0]["meta"]["n_turns"] == 2 and recs[0]["meta"]["n_words"] == 3
    assert len(recs.skipped) == 1

    jl = tmp_path / "validation.jsonl"
    jl.write_text(json.dumps({"id": 3, "summary": "x", "transcript": "y"}) + "\n")
    with pytest.raises(InputError, match=r":1: field `uid`: missing"):
        sources.get("meetingbank").parse(jl)
    (tmp_path / "train.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="parquet"):
        sources.get("meetingbank").parse(tmp_path / "train.parquet")
