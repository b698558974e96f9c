"""Property-based tests of every raw-data parser (issue 17, item 1).

For each registered source, Hypothesis mutates a few valid raw records taken from the committed
samples (``resources/samples/<name>/``), writes them in the source's raw layout and parses the
result with ``fedrepro.data.sources.get(name).parse(path)``. Mutations: truncation, a missing or an
extra field, a wrong type, an empty or blank string, invalid UTF-8 bytes, an empty file, a folder
in place of the file, a huge field, and a wrong column count (CSV/TSV sources). The property: the
parser returns valid normalized records, or raises :class:`fedrepro.io.InputError` naming the file,
the line or record and (for a mutated field) the field — never another exception, never silent
garbage (an empty file, a folder or bytes that are not UTF-8 must be refused).

Runs are derandomized (``derandomize=True``) so CI sees the same cases every time; the number of
cases per source is ``CASES_PER_SOURCE``. ``pytest -s`` prints the outcomes per source.
"""

from __future__ import annotations

import collections
import copy
import csv
import io
import json
import re
import tempfile
from pathlib import Path

import pytest
from helpers import node_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrepro.data import sources
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "resources" / "samples"
CASES_PER_SOURCE = 60
N_RECORDS = 3  # valid records each case starts from
HUGE = 300_000  # characters of a "huge" field (over the csv module's default field limit)

FUZZ = settings(
    max_examples=CASES_PER_SOURCE,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# source -> (format, sample file or folder relative to resources/samples, file name in the copy)
LAYOUT: dict[str, tuple[str, str, str]] = {
    "qmsum": ("jsonl", "qmsum/Academic/train.jsonl", "Academic/train.jsonl"),
    "samsum": ("jsonlist", "samsum/train.json", "train.json"),
    "cnndm": ("jsonl", "cnndm/train.jsonl", "train.jsonl"),
    "pubmed": ("jsonl", "pubmed/train.txt", "train.txt"),
    "wikihow": ("csv", "wikihow/train.csv", "train.csv"),
    "reddit_tifu": ("jsonl", "reddit_tifu/train.jsonl", "train.jsonl"),
    "glue": ("tsv", "glue/RTE/train.tsv", "RTE/train.tsv"),
    "csl": ("tsv_noheader", "csl/train.tsv", "train.tsv"),
    "nlpcc2017": ("jsonl", "nlpcc2017/train_with_summ.txt", "train_with_summ.txt"),
    "lcsts": ("pair", "lcsts/train", "train"),
    "thucnews": ("thucnews", "thucnews/THUCNews", "THUCNews"),
    "education": ("jsonl", "education/train.jsonl", "train.jsonl"),
    "ami": ("jsonl", "ami/ami_abstractive.jsonl", "ami_abstractive.jsonl"),
    "icsi": ("jsonlist", "icsi/data/train.json", "data/train.json"),
    "elitr": ("elitr", "elitr/elitr-minuting-corpus-en/train", "train"),
    "meetingbank": ("parquet", "meetingbank/data/train-00000-of-00001.parquet",
                    "data/train-00000-of-00001.parquet"),
}
OUTCOMES: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
BAD_UTF8 = [b"\xff", b"\x80", b"\xc3\x28", b"\xed\xa0\x80", b"\xe2\x82", b"\xf0\x28\x8c\xbc"]
LOCATION = re.compile(r"(:\d+|line \d+|record \d+|row \d+)")


def test_every_registered_source_is_fuzzed():
    assert sorted(LAYOUT) == sources.names()


# -- base records ---------------------------------------------------------------------------------
def _base(fmt: str, src: Path):
    """The first ``N_RECORDS`` raw records of ``src`` (format-specific shape)."""
    if fmt == "jsonl":
        lines = [ln for ln in src.read_text(encoding="utf-8").split("\n") if ln.strip()]
        return [json.loads(ln) for ln in lines[:N_RECORDS]]
    if fmt == "jsonlist":
        return json.loads(src.read_text(encoding="utf-8"))[:N_RECORDS]
    if fmt == "csv":
        rows = list(csv.reader(io.StringIO(src.read_text(encoding="utf-8"), newline="")))
        return rows[: N_RECORDS + 1]  # header + rows
    if fmt == "tsv":
        return [ln.split("\t") for ln in src.read_text(encoding="utf-8-sig").split("\n") if ln][
            : N_RECORDS + 1
        ]
    if fmt == "tsv_noheader":
        return [ln.split("\t") for ln in src.read_text(encoding="utf-8").split("\n") if ln][
            :N_RECORDS
        ]
    if fmt == "pair":
        srcs = src.with_name(f"{src.name}.src.txt").read_text(encoding="utf-8").split("\n")
        tgts = src.with_name(f"{src.name}.tgt.txt").read_text(encoding="utf-8").split("\n")
        return [[a, b] for a, b in zip(srcs[:N_RECORDS], tgts[:N_RECORDS])]
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(src).to_pylist()[:N_RECORDS]
    if fmt == "thucnews":  # two categories, two documents each: {relative path: bytes}
        out = {}
        for cat in sorted(p for p in src.iterdir() if p.is_dir())[:2]:
            for doc in sorted(cat.glob("*.txt"))[:2]:
                out[f"{cat.name}/{doc.name}"] = doc.read_bytes()
        return out
    if fmt == "elitr":  # two meetings of the train split
        out = {}
        for meeting in sorted(p for p in src.iterdir() if p.is_dir())[:2]:
            for f in sorted(meeting.iterdir()):
                out[f"{meeting.name}/{f.name}"] = f.read_bytes()
        return out
    raise AssertionError(fmt)


BASE = {name: _base(fmt, SAMPLES / rel) for name, (fmt, rel, _) in LAYOUT.items()}

# the real public samples (../shared/data, see its README; absent on a user's machine): the same
# mutations start from real records -- source -> (format, file under shared/data, name in the copy)
SHARED = ROOT.parent / "shared" / "data"
REAL_LAYOUT: dict[str, tuple[str, str, str]] = {
    "qmsum": ("jsonl", "qmsum/Committee/val.jsonl", "Committee/val.jsonl"),
    "samsum": ("jsonlist", "samsum/val.json", "val.json"),
    "cnndm": ("jsonl", "cnndm/frank_cnndm_test.jsonl", "frank_cnndm_test.jsonl"),
    "pubmed": ("jsonl", "pubmed/pubmed_train_sample.armancohan.jsonl", "train.jsonl"),
    "csl": ("tsv_noheader", "csl/dev.tsv", "dev.tsv"),
    "lcsts": ("pair", "lcsts/test", "test"),
    "ami": ("jsonl", "ami/ami_abstractive.jsonl", "ami_abstractive.jsonl"),
    "glue": ("tsv", "glue/MRPC/train.tsv", "MRPC/train.tsv"),
}
REAL_CASES_PER_SOURCE = 30


# -- writing a raw copy -----------------------------------------------------------------------------
def _dump(fmt: str, records) -> dict[str, bytes]:
    """{relative file: bytes} of ``records`` in the raw layout (relative to the source's target)."""
    if fmt == "jsonl":
        return {"": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()}
    if fmt == "jsonlist":
        return {"": json.dumps(records, ensure_ascii=False, indent=1).encode()}
    if fmt == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(records)
        return {"": buf.getvalue().encode()}
    if fmt in ("tsv", "tsv_noheader"):
        return {"": "".join("\t".join(r) + "\n" for r in records).encode()}
    if fmt == "pair":
        return {
            ".src.txt": "".join(r[0] + "\n" for r in records if len(r) > 0).encode(),
            ".tgt.txt": "".join(r[1] + "\n" for r in records if len(r) > 1).encode(),
        }
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(records), buf)
        return {"": buf.getvalue()}
    raise AssertionError(fmt)


def _write(root: Path, layout: tuple, files: dict[str, bytes]) -> tuple[Path, dict[str, Path]]:
    """Write the copy under ``root``; return the path to parse and each file's path."""
    fmt, _, target_rel = layout
    target = root / target_rel
    paths = {}
    for rel, data in files.items():
        p = (
            target / rel
            if fmt in ("thucnews", "elitr")
            else target.with_name(target.name + rel) if rel else target
        )
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        paths[rel] = p
    if fmt == "pair":
        return target.with_name(f"{target.name}.src.txt"), paths
    return target, paths


# -- record validity -------------------------------------------------------------------------------
def _check_records(name: str, records) -> None:
    """Valid normalized records: the keys of the source's kind, non-empty texts, unique ids."""
    kind = sources.get(name).kind
    assert isinstance(records, list)
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids), "duplicate record ids"
    for r in records:
        json.dumps(r, allow_nan=False)  # serialisable, no NaN
        assert r["source"] == name and isinstance(r["id"], str) and r["id"].strip()
        assert r["split"] in ("train", "val", "test") and isinstance(r["meta"], dict)
        if kind == "seq2seq":
            assert set(r) == {"id", "source", "client", "split", "input", "target", "meta"}
            for key in ("input", "target", "client"):
                assert isinstance(r[key], str) and r[key].strip(), f"{key} empty: {r}"
        else:
            assert set(r) == {"id", "source", "task", "split", "text_a", "text_b", "label", "meta"}
            assert isinstance(r["text_a"], str) and r["text_a"].strip()
            assert r["text_b"] is None or (isinstance(r["text_b"], str) and r["text_b"].strip())
            assert isinstance(r["label"], int) and not isinstance(r["label"], bool)


def _parse_and_check(name: str, target: Path, *, must_fail: bool, names_file: Path | tuple,
                     line: int | None = None, field_words: tuple[str, ...] = ()) -> str:
    """Parse ``target``: valid records, or an InputError naming ``names_file``, the line and a
    field word. Returns the outcome (``parsed``/``error``) for the statistics."""
    try:
        records = sources.get(name).parse(target)
    except InputError as exc:
        msg = str(exc)
        files = names_file if isinstance(names_file, tuple) else (names_file,)
        assert any(str(f) in msg for f in files), f"error does not name {files}: {msg}"
        if line is not None:
            assert re.search(rf"(:{line}\b|line {line}\b)", msg), f"no line {line}: {msg}"
        if field_words:
            assert LOCATION.search(msg), f"no line/record/row: {msg}"
            assert any(w in msg for w in field_words), f"none of {field_words} named: {msg}"
        return "error"
    assert not must_fail, f"{name}: parsed {len(records)} record(s) from input that must fail"
    _check_records(name, records)
    return "parsed"


# -- mutations --------------------------------------------------------------------------------------
def _pattern(path) -> tuple:
    return tuple("*" if isinstance(p, int) else p for p in path)


def _get_parent(obj, path):
    for p in path[:-1]:
        obj = obj[p]
    return obj


text_values = st.one_of(
    st.just(""),
    st.just("   \t "),
    st.just("word " * (HUGE // 5)),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    st.text(st.sampled_from("ab \t\n\r,\"'[]{}:"), max_size=20),
)
wrong_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True),
    st.just([]), st.just({}), st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.sampled_from(["a", "text", "id"]), st.integers(), max_size=2),
    text_values,
)


@st.composite
def json_mutation(draw, records):
    """(mutated records, index of the mutated record, words naming the field, kind)."""
    records = copy.deepcopy(records)
    i = draw(st.integers(0, len(records) - 1))
    rec = records[i]
    all_paths = list(node_paths(rec))
    patterns = sorted({_pattern(p) for p in all_paths}, key=repr)
    pattern = draw(st.sampled_from(patterns))
    path = draw(st.sampled_from([p for p in all_paths if _pattern(p) == pattern]))
    words = tuple(str(p) for p in path if isinstance(p, str)) or (str(path[0]),)
    parent = _get_parent(rec, path)
    kind = draw(st.sampled_from(["drop", "extra", "set"]))
    if kind == "drop":
        if isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    elif kind == "extra":
        target = parent if isinstance(parent, dict) else rec
        target[draw(st.sampled_from(["extra", "zz_unknown", "id2"]))] = draw(wrong_values)
    else:
        parent[path[-1]] = draw(wrong_values)
    return records, i, words, kind, path


@st.composite
def row_mutation(draw, rows, first_data_row):
    """Cell-level mutation of a CSV/TSV row: drop/add a cell (wrong column count) or set one."""
    rows = copy.deepcopy(rows)
    i = draw(st.integers(first_data_row, len(rows) - 1))
    row = rows[i]
    kind = draw(st.sampled_from(["drop_cell", "add_cell", "set"]))
    j = draw(st.integers(0, len(row) - 1))
    if kind == "drop_cell":
        row.pop(j)
    elif kind == "add_cell":
        row.insert(j, draw(text_values))
    else:
        row[j] = draw(text_values)
    return rows, i, kind


def _byte_mutation(draw, data: bytes):
    kind = draw(st.sampled_from(["truncate", "bad_utf8"]))
    if kind == "truncate":
        return kind, data[: draw(st.integers(0, max(len(data) - 1, 0)))], None
    pos = draw(st.integers(0, len(data)))
    bad = draw(st.sampled_from(BAD_UTF8))
    # keep a multi-byte character whole, so that only the inserted bytes are invalid
    while 0 < pos < len(data) and (data[pos] & 0xC0) == 0x80:
        pos -= 1
    return kind, data[:pos] + bad + data[pos:], data.count(b"\n", 0, pos) + 1


# -- the properties ---------------------------------------------------------------------------------
def _fuzz_case(name: str, layout: tuple, base, data, tag: str = "") -> None:
    fmt = layout[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if fmt in ("thucnews", "elitr"):
            outcome = _fuzz_folder(name, layout, root, base, data)
        else:
            outcome = _fuzz_file(name, layout, root, base, data)
    OUTCOMES[name + tag][outcome] += 1


def _fuzz_file(name, layout, root, base, data) -> str:
    fmt = layout[0]
    structural = fmt not in ("parquet",)
    kinds = ["record", "bytes", "empty", "folder"] if structural else ["record", "truncate",
                                                                        "empty", "folder"]
    what = data.draw(st.sampled_from(kinds))
    files = _dump(fmt, base)
    rel = data.draw(st.sampled_from(sorted(files)))  # LCSTS: the .src or the .tgt file
    if what == "empty":
        files[rel] = b""
        target, paths = _write(root, layout, files)
        return f"{what}:" + _parse_and_check(name, target, must_fail=True, names_file=paths[rel])
    if what == "folder":
        target, paths = _write(root, layout, files)
        paths[rel].unlink()
        paths[rel].mkdir()
        (paths[rel] / "x.txt").write_text("not data\n")
        return f"{what}:" + _parse_and_check(name, target, must_fail=True, names_file=paths[rel])
    if what == "truncate":  # parquet
        cut = data.draw(st.integers(0, len(files[rel]) - 1))
        files[rel] = files[rel][:cut]
        target, paths = _write(root, layout, files)
        return f"{what}:" + _parse_and_check(name, target, must_fail=True, names_file=paths[rel])
    if what == "bytes":
        kind, files[rel], line = _byte_mutation(data.draw, files[rel])
        target, paths = _write(root, layout, files)
        return f"{kind}:" + _parse_and_check(
            name, target, must_fail=kind == "bad_utf8",
            names_file=paths[rel] if kind == "bad_utf8" else tuple(paths.values()), line=line
        )
    # record-level
    if fmt in ("jsonl", "jsonlist"):
        records, i, words, kind, _ = data.draw(json_mutation(base))
        files = _dump(fmt, records)
        target, paths = _write(root, layout, files)
        line = i + 1 if fmt == "jsonl" else None
        return f"{kind}:" + _parse_and_check(
            name, target, must_fail=False, names_file=paths[""], line=line, field_words=words
        )
    if fmt == "parquet":
        records, i, words, kind, path = data.draw(json_mutation(base))
        if kind == "set" and len(path) == 1:  # one type per column: the value goes in every row
            for r in records:
                r[path[0]] = records[i][path[0]]
        try:
            files = _dump(fmt, records)
        except (TypeError, ValueError, NotImplementedError):  # pyarrow cannot store it: no case
            return "unstorable"
        target, paths = _write(root, layout, files)
        return f"{kind}:" + _parse_and_check(
            name, target, must_fail=False, names_file=paths[""], field_words=words
        )
    header = fmt in ("tsv", "csv")
    rows, i, kind = data.draw(row_mutation(base, 1 if header else 0))
    files = _dump(fmt, rows)
    target, paths = _write(root, layout, files)
    field_words = tuple(base[0]) + ("column", "field `") if header else ("field `",)
    if fmt == "pair":  # a line too many or too few in one file of the pair: no single field
        field_words += ("no partner",)
    # a mutated cell may hold a line break: the error may name a later line of the same row
    return f"{kind}:" + _parse_and_check(
        name, target, must_fail=False, names_file=tuple(paths.values()), field_words=field_words
    )


def _fuzz_folder(name, layout, root, base, data) -> str:
    files = dict(base)
    rel = data.draw(st.sampled_from(sorted(files)))
    what = data.draw(st.sampled_from(["bytes", "empty", "folder", "empty_tree", "huge"]))
    line = None
    must_fail = what in ("empty", "empty_tree")
    if what == "bytes":
        what, files[rel], line = _byte_mutation(data.draw, files[rel])
        must_fail = what == "bad_utf8"
    elif what == "empty":
        files[rel] = b""
    elif what == "huge":
        files[rel] = files[rel] + ("word " * (HUGE // 5) + "\n").encode()
    elif what == "empty_tree":
        files = {}
    target, paths = _write(root, layout, files)
    target.mkdir(parents=True, exist_ok=True)
    names = target
    if what == "folder":
        paths[rel].unlink()
        paths[rel].mkdir()
        # a folder named like a data file: ELITR reads transcript/minutes files by name
        must_fail = name == "elitr" and rel.split("/")[-1].startswith(("transcript", "minutes_GENER"))
    if what in ("empty", "bad_utf8", "folder") and must_fail:
        names = paths[rel]
    if name == "elitr" and "minutes_GENER" not in rel and "transcript" not in rel:
        must_fail = what == "empty_tree"  # an unused file (minutes_ORIG.txt) is never read
    return f"{what}:" + _parse_and_check(name, target, must_fail=must_fail, names_file=names,
                                         line=line if must_fail else None)


@pytest.mark.parametrize("name", sorted(LAYOUT))
@FUZZ
@given(data=st.data())
def test_parser_takes_mutated_records_or_names_the_problem(name, data):
    _fuzz_case(name, LAYOUT[name], BASE[name], data)


@pytest.mark.parametrize("name", sorted(LAYOUT))
def test_unmutated_copies_parse(name, tmp_path):
    """The fuzz starts from valid records: the unmutated copy parses into N_RECORDS records (QMSum:
    one record per specific query; ELITR: one per minutes file; LCSTS pairs; THUCNews docs)."""
    fmt = LAYOUT[name][0]
    files = dict(BASE[name]) if fmt in ("thucnews", "elitr") else _dump(fmt, BASE[name])
    target, _ = _write(tmp_path, LAYOUT[name], files)
    records = sources.get(name).parse(target)
    _check_records(name, records)
    if fmt not in ("thucnews", "elitr") and name != "qmsum":
        assert len(records) == N_RECORDS


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"real data samples not here ({SHARED})")
@pytest.mark.parametrize("name", sorted(REAL_LAYOUT))
@settings(FUZZ, max_examples=REAL_CASES_PER_SOURCE)
@given(data=st.data())
def test_parser_takes_mutated_real_records_or_names_the_problem(name, data):
    fmt, rel, _ = REAL_LAYOUT[name]
    if name not in _REAL_BASE:
        _REAL_BASE[name] = _base(fmt, SHARED / rel)
    _fuzz_case(name, REAL_LAYOUT[name], _REAL_BASE[name], data, tag=" (real)")


_REAL_BASE: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _report_outcomes():
    yield
    if OUTCOMES:
        print("\nfuzzed parser cases (outcome counts per source):")
        for name in sorted(OUTCOMES):
            print(f"  {name:12s} {sum(OUTCOMES[name].values()):4d}  {dict(sorted(OUTCOMES[name].items()))}")
