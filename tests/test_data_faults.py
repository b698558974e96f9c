"""The holes of the data layer found in issue 17, each pinned by a test (examples and properties).

* an empty raw file gave 0 records silently in most parsers, then ``KeyError: 'csl'`` in the
  partition step;
* bytes that are not UTF-8 gave a raw ``UnicodeDecodeError`` without the file name (QMSum, SAMSum,
  CNN/DM, PubMed, GLUE);
* QMSum ``topic_list`` spans were not checked;
* a CSV cut inside a quoted field lost the rest of the field silently; a field over 128 KiB was
  refused; a damaged UTF-8 THUCNews document was decoded as GB18030 mojibake.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrepro.data import sources
from fedrepro.data.prepare import prepare_source
from fedrepro.data.settings import build_manifest
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "resources" / "samples"

# one sample file per source, and where a copy must sit for the parser to read it
FILES = {
    "qmsum": ("qmsum/Academic/train.jsonl", "Academic/train.jsonl"),
    "samsum": ("samsum/train.json", "train.json"),
    "cnndm": ("cnndm/train.jsonl", "train.jsonl"),
    "pubmed": ("pubmed/train.txt", "train.txt"),
    "wikihow": ("wikihow/train.csv", "train.csv"),
    "reddit_tifu": ("reddit_tifu/train.jsonl", "train.jsonl"),
    "glue": ("glue/RTE/train.tsv", "RTE/train.tsv"),
    "csl": ("csl/train.tsv", "train.tsv"),
    "nlpcc2017": ("nlpcc2017/train_with_summ.txt", "train_with_summ.txt"),
    "lcsts": ("lcsts/train.src.txt", "train.src.txt"),
    "education": ("education/train.jsonl", "train.jsonl"),
    "ami": ("ami/ami_abstractive.jsonl", "ami_abstractive.jsonl"),
    "icsi": ("icsi/data/train.json", "data/train.json"),
    "meetingbank": ("meetingbank/data/train-00000-of-00001.parquet", "data/train.parquet"),
}


def _copy(tmp_path: Path, name: str) -> Path:
    rel, dest = FILES[name]
    out = tmp_path / dest
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SAMPLES / rel, out)
    if name == "lcsts":
        shutil.copyfile(SAMPLES / "lcsts/train.tgt.txt", out.with_name("train.tgt.txt"))
    return out


# -- empty inputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FILES))
def test_an_empty_raw_file_is_an_error_naming_it(tmp_path, name):
    path = _copy(tmp_path, name)
    path.write_bytes(b"")
    if name == "lcsts":
        path.with_name("train.tgt.txt").write_bytes(b"")
    with pytest.raises(InputError) as err:
        sources.get(name).parse(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("name", ["thucnews", "elitr"])
def test_an_empty_release_folder_is_an_error_naming_it(tmp_path, name):
    with pytest.raises(InputError) as err:
        sources.get(name).parse(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_a_json_list_with_no_record_is_an_error(tmp_path):
    path = tmp_path / "train.json"
    path.write_text("[]\n")
    with pytest.raises(InputError, match="no samsum records"):
        sources.get("samsum").parse(path)


def test_prepare_refuses_a_release_whose_records_were_all_skipped(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.tsv").write_text("to title\t\t\n", encoding="utf-8")  # empty abstract and title
    with pytest.raises(InputError, match=r"no csl records in 1 data file\(s\) \(1 malformed"):
        prepare_source("csl", raw, str(tmp_path / "r.jsonl"), str(tmp_path / "r.json"),
                       skip_malformed=True)
    assert not (tmp_path / "r.jsonl").exists()


def test_partition_names_a_records_file_without_the_source_instead_of_keyerror(tmp_path):
    records = tmp_path / "records.jsonl"
    records.write_text("")
    setting = {"kind": "fedsumm", "sources": ["csl"], "num_clients": 2}
    with pytest.raises(InputError) as err:
        build_manifest(setting, {"csl": str(records)}, seed=0)
    assert str(records) in str(err.value) and "'csl'" in str(err.value)
    with pytest.raises(InputError, match="no records file of 'csl'"):
        build_manifest(setting, {}, seed=0)
    dirichlet = {"kind": "dirichlet", "sources": ["cnndm"], "total": 4, "num_clients": 2,
                 "alpha": 1.0}
    records.write_text(json.dumps({"id": "cnndm-test-1", "source": "cnndm", "split": "test"})
                       + "\n")
    with pytest.raises(InputError, match=r"has no train records"):
        build_manifest(dirichlet, {"cnndm": str(records)}, seed=0)


# -- bytes that are not UTF-8 -------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(set(FILES) - {"meetingbank"}))
def test_bytes_that_are_not_utf8_name_the_file_and_the_line(tmp_path, name):
    path = _copy(tmp_path, name)
    data = path.read_bytes()
    second = data.index(b"\n") + 1  # start of line 2
    path.write_bytes(data[:second] + b"\xff\xfe" + data[second:])
    with pytest.raises(InputError) as err:
        sources.get(name).parse(path)
    msg = str(err.value)
    assert str(path) in msg and ("UTF-8" in msg) and (f"{path}:2:" in msg or "line 2" in msg), msg


def test_text_helpers_name_file_line_and_column(tmp_path):
    from fedrepro.io import iter_jsonl, read_text

    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "\xc3\x28"}\n')
    with pytest.raises(InputError, match=r"x\.jsonl:2: not valid UTF-8 text \(byte 0xc3 at column 8"):
        list(iter_jsonl(path))
    with pytest.raises(InputError, match=r"x\.jsonl:2: not valid UTF-8"):
        read_text(path)
    with pytest.raises(InputError, match="is a folder"):
        read_text(tmp_path)
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"a": 1}\n')
    assert list(iter_jsonl(tmp_path / "bom.jsonl")) == [(1, {"a": 1})]


def test_a_json_line_may_hold_a_line_separator(tmp_path):
    """U+2028 is valid inside a JSON string; str.splitlines used to cut the record in two."""
    rec = json.loads((SAMPLES / "cnndm/train.jsonl").read_text(encoding="utf-8").split("\n")[0])
    rec["article"] = rec["article"].replace(" ", " \u2028 ", 1)
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(rec, ensure_ascii=False) + "\n", encoding="utf-8")
    assert "\u2028" in path.read_text(encoding="utf-8")
    (record,) = sources.get("cnndm").parse(path)
    assert record["meta"]["original_id"] == rec["id"]


# -- THUCNews encodings ---------------------------------------------------------------------------------
def _thucnews(tmp_path: Path, data: bytes) -> Path:
    doc = tmp_path / "THUCNews" / "体育" / "1.txt"
    doc.parent.mkdir(parents=True)
    doc.write_bytes(data)
    return doc


def test_thucnews_damaged_utf8_is_an_error_not_gb18030_mojibake(tmp_path):
    text = "标题甲\n\u3000\u3000正文第一段。\n\u3000\u3000正文第二段。\n"
    raw = text.encode("utf-8")
    cut = raw.index("第二".encode())
    doc = _thucnews(tmp_path, raw[:cut] + b"\xe2\x82" + raw[cut:])
    with pytest.raises(InputError) as err:
        sources.get("thucnews").parse(tmp_path)
    assert f"{doc}:3:" in str(err.value) and "UTF-8" in str(err.value)


def test_thucnews_still_reads_a_gb18030_document(tmp_path):
    _thucnews(tmp_path, "标题甲\n\u3000\u3000正文。\n".encode("gb18030"))
    (rec,) = sources.get("thucnews").parse(tmp_path)
    assert (rec["target"], rec["input"]) == ("标题甲", "正文。")


# -- CSV -------------------------------------------------------------------------------------------------
def test_a_csv_cut_inside_a_quoted_field_is_an_error(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text('headline,title,text\n"Do a.",How to A,"Step one. Step two."\n'
                    '"Do b.",How to B,"Step one, cut', encoding="utf-8")
    with pytest.raises(InputError, match=r"train\.csv:line 3: .*bad CSV"):
        sources.get("wikihow").parse(path)


def test_a_csv_field_over_128_kib_is_read(tmp_path):
    path = tmp_path / "train.csv"
    body = "Step one is long. " * 20_000  # 360,000 characters
    path.write_text(f'headline,title,text\n"Do a.",How to A,"{body}"\n', encoding="utf-8")
    (rec,) = sources.get("wikihow").parse(path)
    assert len(rec["input"]) == len(body.strip())


def test_a_csv_row_with_a_missing_column_names_it(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text('headline,title,text\n"Do a.",How to A\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"train\.csv:line 2: .*field `text`: missing"):
        sources.get("wikihow").parse(path)


# -- QMSum spans (property) -------------------------------------------------------------------------------
QMSUM_MEETING = json.loads(
    (SAMPLES / "qmsum/Academic/train.jsonl").read_text(encoding="utf-8").split("\n")[0]
)
span_value = st.one_of(
    st.integers(-3, 200), st.integers(-3, 200).map(str), st.sampled_from(["", "x", " 7", "1.5"]),
    st.booleans(), st.none(), st.floats(-1, 10), st.just([1]),
)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(where=st.sampled_from(["topic_list", "specific_query_list"]), start=span_value,
       end=span_value)
def test_qmsum_spans_of_topics_and_queries_are_checked(tmp_path_factory, where, start, end):
    """A ``[start, end]`` span is accepted iff both are non-negative integers (or digit strings)
    with ``start <= end < n_turns``; otherwise the error names file, line and the span's field."""
    meeting = json.loads(json.dumps(QMSUM_MEETING))
    n = len(meeting["meeting_transcripts"])
    meeting[where][0]["relevant_text_span"] = [[start, end]]
    path = tmp_path_factory.mktemp("q") / "Academic" / "train.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(meeting) + "\n", encoding="utf-8")

    def index(v):
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            return None
        if isinstance(v, str):
            return int(v.strip()) if v.strip().isdigit() else None
        return v if v >= 0 else None

    s, e = index(start), index(end)
    valid = s is not None and e is not None and s <= e < n
    if valid:
        assert sources.get("qmsum").parse(path)
    else:
        with pytest.raises(InputError) as err:
            sources.get("qmsum").parse(path)
        assert f"{path}:1: field `{where}[0].relevant_text_span[0]`" in str(err.value)


def test_qmsum_topic_list_entries_are_checked(tmp_path):
    meeting = json.loads(json.dumps(QMSUM_MEETING))
    meeting["topic_list"][1] = {"topic": "x"}
    path = tmp_path / "Academic" / "train.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(meeting) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r":1: field `topic_list\[1\]\.relevant_text_span`: missing"):
        sources.get("qmsum").parse(path)
