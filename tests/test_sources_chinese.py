"""FedSUMM's Chinese sources (fedrepro.data.sources): CSL, NLPCC2017, LCSTS, THUCNews, EDUCATION."""

import contextlib
import http.server
import importlib
import inspect
import json
import socket
import threading
import time
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from fedrepro.data import sources
from fedrepro.data.download import DownloadError
from fedrepro.data.samples import chinese as chinese_samples
from fedrepro.data.sources import _chinese, csl, lcsts, nlpcc2017, thucnews
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "resources" / "samples"
NAMES = ("csl", "nlpcc2017", "lcsts", "thucnews", "education")
FIELDS = {"id", "source", "client", "split", "input", "target", "meta"}

# the committed sample of each source: files handed to parse -> expected records per split
SAMPLE_FILES = {
    "csl": {"train.tsv": {"train": 40}, "dev.tsv": {"val": 20}, "test.tsv": {"test": 20}},
    "nlpcc2017": {
        "train_with_summ.txt": {"train": 30},
        "evaluation_with_ground_truth.txt": {"test": 20},
    },
    "lcsts": {
        "train.src.txt": {"train": 40},
        "val.tgt.txt": {"val": 20},
        "test": {"test": 20},  # the common prefix of test.src.txt / test.tgt.txt
    },
    "thucnews": {".": {"train": 30, "val": 20, "test": 20}},
    "education": {
        "train.jsonl": {"train": 40},
        "val.jsonl": {"val": 20},
        "test.jsonl": {"test": 20},
    },
}


def _check_records(records, name):
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids))
    for r in records:
        assert set(r) == FIELDS
        assert r["source"] == r["client"] == name
        assert r["split"] in ("train", "val", "test")
        assert r["id"].startswith(f"{name}-{r['split']}-")
        assert isinstance(r["input"], str) and r["input"] == r["input"].strip() and r["input"]
        assert isinstance(r["target"], str) and r["target"] == r["target"].strip() and r["target"]
        assert r["meta"]["input_chars"] == len(r["input"])
        assert r["meta"]["target_chars"] == len(r["target"])


# -- registry -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_registered(name):
    src = sources.get(name)
    assert src.name == name and src.kind == "seq2seq" and src.lang == "zh"
    assert src.config_key == f"data.{name}.local_dir"
    module = importlib.import_module(sources.SOURCE_MODULES[name])
    # the registry wraps the parser to refuse inputs with no record (issue 17)
    assert inspect.unwrap(src.parse) is getattr(module, f"parse_{name}")
    assert src.upstream


# -- committed samples --------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_samples_parse(name):
    src = sources.get(name)
    all_records = []
    for rel, expected in SAMPLE_FILES[name].items():
        records = src.parse(SAMPLES / name / rel)
        assert dict(Counter(r["split"] for r in records)) == expected, rel
        assert records.skipped == []
        _check_records(records, name)
        all_records += records
    _check_records(all_records, name)  # ids unique across the splits too
    # Chinese text kept as is: no whitespace tokenisation
    assert all(" " not in r["target"][:4] for r in all_records)
    assert sum(len(r["input"]) for r in all_records) > 2 * sum(
        len(r["target"]) for r in all_records
    )


def test_sample_targets_are_stated_in_inputs():
    """Targets are learnable: most of a target's characters occur in its input."""
    for name, files in SAMPLE_FILES.items():
        for rel in files:
            for r in sources.get(name).parse(SAMPLES / name / rel):
                target = [c for c in r["target"] if not c.isspace()]
                covered = sum(c in r["input"] for c in target) / len(target)
                assert covered >= 0.8, (name, r["id"], r["target"])


@pytest.mark.parametrize("name", NAMES)
def test_samples_regenerate_byte_identical(tmp_path, name):
    committed = SAMPLES / name
    out = tmp_path / name
    sources.get(name).write_samples(out)
    files = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    assert files
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == files
    for rel in files:
        assert (out / rel).read_bytes() == (committed / rel).read_bytes(), rel
    assert sum((committed / rel).stat().st_size for rel in files) < 150_000
    other = tmp_path / "seed1"
    getattr(chinese_samples, f"write_{name}_samples")(other, seed=1)
    assert {p.relative_to(other): p.read_bytes() for p in other.rglob("*") if p.is_file()} != {
        rel: (committed / rel).read_bytes() for rel in files
    }


def test_samples_cli_writes_all_sources(tmp_path):
    assert chinese_samples.main([str(tmp_path), "--only", "csl", "lcsts"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csl", "lcsts"]
    assert (tmp_path / "csl" / "dev.tsv").read_bytes() == (SAMPLES / "csl" / "dev.tsv").read_bytes()


# -- real data ----------------------------------------------------------------------------------
def test_csl_real(shared_data):
    csl = sources.get("csl")
    dev = csl.parse(shared_data / "csl" / "dev.tsv")
    test = csl.parse(shared_data / "csl" / "test.tsv")
    assert (len(dev), len(test)) == (1000, 1000)
    assert (dev.skipped, test.skipped) == ([], [])
    _check_records(dev, "csl")
    _check_records(test, "csl")
    assert {r["split"] for r in dev} == {"val"} and {r["split"] for r in test} == {"test"}
    first = dev[0]
    assert first["id"] == "csl-val-000001"
    assert first["target"] == "一种基于平方和优化的飞行器大角度机动镇定控制器设计方法"
    assert first["input"].startswith(
        "采用修正的Rodrigues参数(MRP),建立了飞行器姿态控制系统的数学模型"
    )
    # line 8's abstract starts with a space in the release: ends are stripped, the rest kept
    assert dev[7]["input"].startswith("今年是蜚声中外的著名哲学家和伦理学家")
    # quotes are text, not CSV quoting
    assert dev[12]["target"] == '"外部性"问题与"科斯定理"的伦理追问'
    assert test[-1]["target"] == "多振子串联压电俘能器性能分析与测试"
    # abstracts are ~10x longer than titles (CSL README: len(A) ~ 210, len(T) ~ 19)
    mean_in = sum(r["meta"]["input_chars"] for r in dev) / len(dev)
    mean_out = sum(r["meta"]["target_chars"] for r in dev) / len(dev)
    assert 180 < mean_in < 240 and 16 < mean_out < 22


def test_lcsts_real(shared_data):
    lcsts = sources.get("lcsts")
    folder = shared_data / "lcsts"
    records = lcsts.parse(folder / "test.src.txt")
    assert len(records) == 10666 and records.skipped == []
    _check_records(records, "lcsts")
    assert {r["split"] for r in records} == {"test"}
    assert records[0]["id"] == "lcsts-test-0000001"
    assert records[0]["target"] == "林志颖公司疑涉虚假营销无厂房无研发"
    assert records[0]["input"].startswith("日前，方舟子发文直指林志颖旗下爱碧丽推销假保健品")
    assert records[2]["target"] == "女子用板车拉九旬老母环游中国1年走2万4千里"
    # the other file of the pair and the common prefix give the same records
    assert lcsts.parse(folder / "test.tgt.txt") == records
    assert lcsts.parse(folder / "test") == records


# -- download -----------------------------------------------------------------------------------
def _reachable(host: str, port: int = 443) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _assert_fails_fast_and_cleanly(tmp_path, name, must_mention):
    dest = tmp_path / "dl" / name
    (tmp_path / "dl").mkdir()
    t0 = time.monotonic()
    with pytest.raises(DownloadError) as err:
        sources.get(name).download(dest, timeout=3)
    assert time.monotonic() - t0 < 10
    msg = str(err.value)
    for part in (*must_mention, f"data.{name}.local_dir"):
        assert part in msg, (part, msg)
    assert list((tmp_path / "dl").iterdir()) == []  # no staging folder, no partial file


URL_SOURCES = {
    "csl": ("raw.githubusercontent.com", ["CSL", csl.CSL_COMMIT, "benchmark/ts/train.tsv"]),
    "thucnews": ("thuctc.thunlp.org", ["THUCNews", thucnews.THUCNEWS_URL]),
}
HUB_SOURCES = {
    "nlpcc2017": ["NLPCC 2017", nlpcc2017.NLPCC2017_HUB_ID, nlpcc2017.NLPCC2017_REVISION],
    "lcsts": ["LCSTS", lcsts.LCSTS_HUB_ID, lcsts.LCSTS_REVISION],
}


@pytest.mark.parametrize("name", sorted(URL_SOURCES))
def test_url_download_offline_fails_fast_and_cleanly(tmp_path, name):
    host, must_mention = URL_SOURCES[name]
    if _reachable(host, 443 if name == "csl" else 80):
        pytest.skip(f"{host} is reachable; the offline failure path is not testable here")
    _assert_fails_fast_and_cleanly(tmp_path, name, must_mention)


@pytest.mark.parametrize("offline_flag", [True, False], ids=["HF_HUB_OFFLINE", "no-network"])
@pytest.mark.parametrize("name", sorted(HUB_SOURCES))
def test_hub_download_offline_fails_fast_and_cleanly(tmp_path, monkeypatch, name, offline_flag):
    from huggingface_hub import constants

    if not offline_flag and _reachable("huggingface.co"):
        pytest.skip("huggingface.co is reachable; the offline failure path is not testable here")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline_flag)
    _assert_fails_fast_and_cleanly(tmp_path, name, HUB_SOURCES[name])


def test_education_download_refuses_at_once(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(InputError) as err:
        sources.get("education").download(tmp_path / "edu", timeout=10)
    assert time.monotonic() - t0 < 1
    msg = str(err.value)
    assert "not publicly available" in msg and "data.education.local_dir" in msg
    assert '"id"' in msg and '"content"' in msg and '"summary"' in msg and "train.jsonl" in msg
    assert list(tmp_path.iterdir()) == []


@contextlib.contextmanager
def _serve(files: dict[str, bytes]):
    """A loopback HTTP server answering GET <path> with ``files[path]`` (404 otherwise)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_csl_download_end_to_end(tmp_path, monkeypatch):
    files = {f"/c0ffee/{n}": (SAMPLES / "csl" / n).read_bytes() for n in csl.CSL_FILES}
    with _serve(files) as base:
        monkeypatch.setattr(csl, "CSL_URL_TEMPLATE", base + "/{commit}/{file}")
        out = csl.download_csl(tmp_path / "csl", timeout=5, commit="c0ffee")
        assert sorted(p.name for p in out.iterdir()) == sorted(csl.CSL_FILES)
        assert len(sources.get("csl").parse(out / "dev.tsv")) == 20
        # a missing file fails the whole download and leaves the previous state alone
        del files["/c0ffee/test.tsv"]
        with pytest.raises(DownloadError, match="test.tsv"):
            csl.download_csl(tmp_path / "csl2", timeout=5, commit="c0ffee")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csl"]


class _LegacyNameInfo(zipfile.ZipInfo):
    """A member whose name is stored GBK-encoded without the UTF-8 flag (Windows-made zips)."""

    def _encodeFilenameFlags(self):
        return self.filename.encode("gbk"), self.flag_bits


def test_thucnews_download_end_to_end(tmp_path):
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(_LegacyNameInfo("THUCNews/体育/7.txt"), "标题甲\n\u3000\u3000正文甲。\n")
        zf.writestr("THUCNews/财经/800000.txt", "标题乙\n\u3000\u3000正文乙。\n")  # UTF-8 flag
        zf.writestr("__MACOSX/THUCNews/._7.txt", "junk")
    with _serve({"/THUCNews.zip": buf.getvalue()}) as base:
        out = thucnews.download_thucnews(tmp_path / "thuc", timeout=5, url=base + "/THUCNews.zip")
    docs = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert docs == ["THUCNews/体育/7.txt", "THUCNews/财经/800000.txt"]  # archive deleted
    recs = sources.get("thucnews").parse(out)
    assert [(r["target"], r["meta"]["category"]) for r in recs] == [
        ("标题甲", "体育"),
        ("标题乙", "财经"),
    ]


def test_hub_download_places_only_the_data_files(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    calls = []

    def fake_hf_hub_download(repo_id, filename, *, repo_type, revision, local_dir, etag_timeout):
        calls.append((repo_id, filename, repo_type, revision, etag_timeout))
        (Path(local_dir) / ".cache" / "huggingface").mkdir(parents=True, exist_ok=True)
        target = Path(local_dir) / filename
        target.write_text(
            json.dumps({"text": "正文", "summary": "摘要"}, ensure_ascii=False) + "\n"
        )
        return str(target)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(_chinese, "_check_reachable", lambda url, timeout: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    out = sources.get("lcsts").download(tmp_path / "lcsts", timeout=4)
    assert sorted(p.name for p in out.iterdir()) == sorted(lcsts.LCSTS_HUB_FILES)
    assert calls == [
        (lcsts.LCSTS_HUB_ID, f, "dataset", lcsts.LCSTS_REVISION, 4)
        for f in lcsts.LCSTS_HUB_FILES
    ]
    splits = [sources.get("lcsts").parse(out / f)[0]["split"] for f in lcsts.LCSTS_HUB_FILES]
    assert splits == ["train", "val", "test"]


# -- malformed records --------------------------------------------------------------------------
def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _malformed(name, path, *, where, field, n_good):
    with pytest.raises(InputError) as err:
        sources.get(name).parse(path)
    msg = str(err.value)
    assert str(path) in msg and where in msg and f"`{field}`" in msg, msg
    records = sources.get(name).parse(path, skip_malformed=True)
    assert len(records) == n_good
    assert len(records.skipped) == 1 and field in records.skipped[0][1]
    return records


def test_csl_malformed(tmp_path):
    good = "to title\t摘要内容一。\t标题一\n"
    path = _write(tmp_path / "train.tsv", good + "to title\t摘要内容二。\t \n" + good)
    recs = _malformed("csl", path, where=":2:", field="title", n_good=2)
    assert [r["id"] for r in recs] == ["csl-train-000001", "csl-train-000003"]
    assert recs.skipped[0][0] == "2"
    path = _write(tmp_path / "dev.tsv", good + "to keywords\t摘要\t关键词\n")
    _malformed("csl", path, where=":2:", field="prompt", n_good=1)
    path = _write(tmp_path / "test.tsv", "摘要内容\t标题\n" + good)
    _malformed("csl", path, where=":1:", field="<columns>", n_good=1)


def test_lcsts_malformed(tmp_path):
    src = _write(
        tmp_path / "train.src.txt", "第一条微博正文。\n第二条微博正文。\n第三条微博正文。\n"
    )
    tgt = _write(tmp_path / "train.tgt.txt", "摘要一\n\n摘要三\n")
    with pytest.raises(InputError) as err:
        sources.get("lcsts").parse(src)
    assert str(tgt) in str(err.value) and ":2:" in str(err.value) and "`summary`" in str(err.value)
    recs = sources.get("lcsts").parse(tgt, skip_malformed=True)
    assert [r["id"] for r in recs] == ["lcsts-train-0000001", "lcsts-train-0000003"]
    assert recs.skipped == [("2", recs.skipped[0][1])] and "summary" in recs.skipped[0][1]
    # a line-count mismatch names both files, even when skipping malformed records
    _write(tmp_path / "val.src.txt", "一\n二\n")
    _write(tmp_path / "val.tgt.txt", "一\n")
    for skip in (False, True):
        with pytest.raises(InputError) as err:
            sources.get("lcsts").parse(tmp_path / "val.src.txt", skip_malformed=skip)
        msg = str(err.value)
        assert str(tmp_path / "val.src.txt") in msg and str(tmp_path / "val.tgt.txt") in msg
        assert "2 lines" in msg and "1" in msg
    with pytest.raises(InputError, match="not found"):
        sources.get("lcsts").parse(tmp_path / "test.src.txt")


def test_lcsts_jsonl_layout(tmp_path):
    """The hub copy's JSON lines (what download_lcsts fetches) parse through the same entry."""
    lines = [
        {"text": "正文一，内容较长。", "summary": "摘要一"},
        {"text": "正文二，内容较长。", "summary": "摘要二", "human_label": 5},
        {"text": "正文三", "summary": ""},
    ]
    path = _write(
        tmp_path / "test_public.jsonl",
        "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
    )
    recs = _malformed("lcsts", path, where=":3:", field="summary", n_good=2)
    assert [r["split"] for r in recs] == ["test", "test"]
    assert recs[1]["meta"]["human_label"] == 5 and recs[1]["target"] == "摘要二"


def test_nlpcc2017_malformed_and_hub_layout(tmp_path):
    good = {"summarization": "摘要。", "article": "第一段。<Paragraph>第二段。"}
    path = _write(
        tmp_path / "train_with_summ.txt",
        "\n".join(
            json.dumps(x, ensure_ascii=False) for x in (good, {"summarization": "摘要"}, good)
        )
        + "\n",
    )
    recs = _malformed("nlpcc2017", path, where=":2:", field="article", n_good=2)
    assert recs[0]["input"] == "第一段。\n第二段。" and recs[0]["meta"]["paragraphs"] == 2
    path = _write(tmp_path / "evaluation_with_ground_truth.txt", "{not json\n")
    _malformed("nlpcc2017", path, where=":1:", field="<line>", n_good=0)
    # the hub copy: one JSON document {"data": [{"title": <summary>, "content": <article>}]}
    hub = {
        "data": [{"title": "标题摘要", "content": "新闻正文。"}, {"title": 3, "content": "正文"}]
    }
    path = _write(tmp_path / "nlpcc_data.json", json.dumps(hub, ensure_ascii=False))
    recs = _malformed("nlpcc2017", path, where="record 1", field="title", n_good=1)
    assert recs[0]["id"] == "nlpcc2017-train-r000000"
    assert (recs[0]["input"], recs[0]["target"]) == ("新闻正文。", "标题摘要")


def test_thucnews_malformed_and_single_files(tmp_path):
    root = tmp_path / "THUCNews"
    _write(
        root / "体育" / "10.txt", "标题一\n\u3000\u3000正文第一段。\n\n\u3000\u3000正文第二段。\n"
    )
    bad = _write(root / "财经" / "20.txt", "标题二\n\n")
    _write(root / "财经" / "21.txt", "标题三\n\u3000\u3000正文。\n")
    with pytest.raises(InputError) as err:
        sources.get("thucnews").parse(tmp_path)
    assert str(bad) in str(err.value) and "`content`" in str(err.value)
    recs = sources.get("thucnews").parse(tmp_path, skip_malformed=True)
    assert (
        len(recs) == 2 and len(recs.skipped) == 1 and recs.skipped[0][0].startswith("财经/20.txt")
    )
    first = recs[0]
    assert first["input"] == "正文第一段。\n正文第二段。" and first["target"] == "标题一"
    assert first["id"] == f"thucnews-{thucnews.thucnews_split('体育', '10')}-sports-10"
    assert first["meta"]["category"] == "体育"
    # one document at a time (how the prepare step hands files over) gives the same records
    assert sources.get("thucnews").parse(root / "体育" / "10.txt") == [first]
    assert sources.get("thucnews").parse(root / "财经", skip_malformed=True) == recs[1:]


def test_thucnews_split_is_a_fixed_hash():
    assert thucnews.thucnews_split("体育", "0") == thucnews.thucnews_split("体育", "0")
    counts = Counter(thucnews.thucnews_split("科技", str(n)) for n in range(20000))
    assert 0.88 < counts["train"] / 20000 < 0.92
    assert 0.04 < counts["val"] / 20000 < 0.06 and 0.04 < counts["test"] / 20000 < 0.06


def test_education_malformed(tmp_path):
    rows = [
        {"id": 1, "content": "内容一", "summary": "摘要一"},
        {"id": "1", "content": "内容二", "summary": "摘要二"},
        {"id": "x3", "content": "内容三", "summary": "摘要三"},
    ]
    path = _write(
        tmp_path / "val.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    )
    recs = _malformed("education", path, where=":2:", field="id", n_good=2)
    assert [r["id"] for r in recs] == ["education-val-1", "education-val-x3"]
    path = _write(tmp_path / "train.jsonl", json.dumps({"id": "a", "content": "内容"}) + "\n")
    _malformed("education", path, where=":1:", field="summary", n_good=0)


def test_split_names_are_normalised(tmp_path):
    row = json.dumps({"id": "a", "content": "内容", "summary": "摘要"}) + "\n"
    for name, split in (
        ("dev", "val"),
        ("valid", "val"),
        ("validation", "val"),
        ("test_public", "test"),
    ):
        recs = sources.get("education").parse(_write(tmp_path / f"{name}.jsonl", row))
        assert recs[0]["split"] == split
    with pytest.raises(InputError, match="cannot tell the split"):
        sources.get("education").parse(_write(tmp_path / "edu.jsonl", row))
