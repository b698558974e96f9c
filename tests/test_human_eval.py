"""AdaFedSelecKD Fig. 5 human-evaluation kit: sampling, blinding, form, aggregation, figure."""

from __future__ import annotations

import csv
import json
import logging
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd import human_eval as he

DOMAINS = ("Academic", "Committee", "Product")
METHODS = ("AdaCentralized", "AdaFedAvg", "AdaFedKD", "AdaFedSelectKD")
N_PER_DOMAIN = 25
EVIL = "<script>alert('x')</script> & more"


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _ids(domain: str, n: int = N_PER_DOMAIN) -> list[str]:
    # several queries share one meeting, as in QMSum
    return [f"qmsum-{domain}-test-{i // 3:04d}-{i % 3:02d}" for i in range(n)]


@pytest.fixture
def inputs(tmp_path):
    meetings, predictions = {}, {}
    for d in DOMAINS:
        rows = [{"id": i, "source": "qmsum", "client": d, "split": "test",
                 "input": f"What about topic {i}? #SEP# Speaker A: words on {i}. Speaker B: ok.",
                 "target": f"reference for {i}", "meta": {}} for i in _ids(d)]
        meetings[d] = str(_write_jsonl(tmp_path / "clients" / d / "test.jsonl", rows))
    for k, m in enumerate(METHODS):
        rows = []
        for d in DOMAINS:
            for i in _ids(d):
                text = f"system {k} summary of {i}"
                if k == 1 and i.endswith("0000-00"):
                    text = EVIL
                rows.append({"client": d, "id": i, "prediction": text,
                             "reference": f"reference for {i}"})
        predictions[m] = str(_write_jsonl(tmp_path / "preds" / m / "predictions.jsonl", rows))
    return predictions, meetings


def _sheet(path: Path) -> list[dict]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


def _key(kit: Path) -> dict:
    return json.loads((kit / "key" / "key.json").read_text(encoding="utf-8"))


@pytest.fixture
def kit(inputs, tmp_path):
    predictions, meetings = inputs
    he.build_kit(predictions, meetings, tmp_path / "kit", per_domain=20, seed=1)
    return tmp_path / "kit"


def test_sampling_counts_and_reproducibility(inputs, kit, tmp_path):
    predictions, meetings = inputs
    key = _key(kit)
    assert set(key["sampled"]) == set(DOMAINS)
    for d in DOMAINS:
        assert len(key["sampled"][d]) == 20
        assert len(set(key["sampled"][d])) == 20
        assert set(key["sampled"][d]) <= set(_ids(d))
    assert key["seed"] == 1 and key["per_domain"] == 20
    assert key["criteria"] == list(he.CRITERIA)

    he.build_kit(predictions, meetings, tmp_path / "same", per_domain=20, seed=1)
    assert _key(tmp_path / "same")["sampled"] == key["sampled"]
    assert (tmp_path / "same" / "sheet.csv").read_bytes() == (kit / "sheet.csv").read_bytes()
    # dict order of the inputs does not matter
    rev_m = dict(reversed(list(meetings.items())))
    rev_p = dict(reversed(list(predictions.items())))
    he.build_kit(rev_p, rev_m, tmp_path / "rev", per_domain=20, seed=1)
    assert (tmp_path / "rev" / "sheet.csv").read_bytes() == (kit / "sheet.csv").read_bytes()

    he.build_kit(predictions, meetings, tmp_path / "other", per_domain=20, seed=2)
    assert _key(tmp_path / "other")["sampled"] != key["sampled"]


def test_fewer_examples_than_per_domain_warns(inputs, tmp_path, caplog):
    predictions, meetings = inputs
    with caplog.at_level(logging.WARNING, logger=he.__name__):
        he.build_kit(predictions, meetings, tmp_path / "k", per_domain=30, seed=1)
    key = _key(tmp_path / "k")
    assert all(len(v) == N_PER_DOMAIN for v in key["sampled"].values())
    assert "only 25 test example" in caplog.text


def test_items_blinding_and_sides(kit):
    key = _key(kit)
    items = key["items"]
    rows = _sheet(kit / "sheet.csv")
    assert list(rows[0]) == list(he.SHEET_COLUMNS)
    assert len(rows) == len(items) == 60 * 3
    assert [r["item_id"] for r in rows] == sorted(items)
    assert all(r["judgement"] == "" for r in rows)
    # every compared method once per sampled example
    pairs = [(it["id"], it["other_method"]) for it in items.values()]
    assert len(set(pairs)) == len(pairs)
    sampled = [i for ids in key["sampled"].values() for i in ids]
    assert set(pairs) == {(i, m) for i in sampled for m in he.COMPARED}
    # no method name anywhere in what evaluators see
    for name in ("sheet.csv", "form.html", "README.txt"):
        text = (kit / name).read_text(encoding="utf-8-sig")
        for m in METHODS:
            assert m not in text, (name, m)
            assert m.lower() not in text.lower(), (name, m)
    # sides recorded in the key, balanced per compared method, and matching the sheet
    for m in he.COMPARED:
        sides = [it["proposed_side"] for it in items.values() if it["other_method"] == m]
        assert sides.count("A") == sides.count("B") == 30
    k_of = {m: k for k, m in enumerate(METHODS)}
    for r in rows:
        it = items[r["item_id"]]
        assert r["domain"] == it["domain"]
        ours = f"system {k_of['AdaFedSelectKD']} summary of {it['id']}"
        assert r[f"summary_{it['proposed_side']}"] == ours
        other = "B" if it["proposed_side"] == "A" else "A"
        assert r[f"summary_{other}"] in (f"system {k_of[it['other_method']]} summary of {it['id']}",
                                         EVIL)
        assert r["query"] == f"What about topic {it['id']}?"
        assert r["meeting"].startswith("Speaker A:")


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.data, self.item_ids, self.radios = [], [], [], {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "section" and a.get("class") == "item":
            self.item_ids.append(a["data-item"])
        if tag == "input" and a.get("type") == "radio":
            self.radios.setdefault(a["name"], []).append(a["value"])

    def handle_data(self, data):
        self.data.append(data)


def test_form_html(kit):
    text = (kit / "form.html").read_text(encoding="utf-8")
    p = _Collect()
    p.feed(text)
    p.close()
    items = _key(kit)["items"]
    assert p.item_ids == sorted(items)
    assert p.radios == {i: ["A", "B", "tie"] for i in items}
    assert p.tags.count("script") == 1  # only the inline download script
    assert p.tags.count("details") == len(items)
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in text
    assert any(EVIL in d for d in p.data)
    assert "http://" not in text and "https://" not in text and " src=" not in text
    assert 'id="download"' in text


def _fill(kit: Path, path: Path, choose) -> Path:
    items = _key(kit)["items"]
    rows = _sheet(kit / "sheet.csv")
    for r in rows:
        r["judgement"] = choose(items[r["item_id"]])
    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _other(side: str) -> str:
    return "B" if side == "A" else "A"


def test_aggregate_hand_computed(kit, tmp_path):
    s1 = _fill(kit, tmp_path / "e1.csv", lambda it: it["proposed_side"].lower())
    s2 = _fill(kit, tmp_path / "e2.csv", lambda it: "TIE")
    # evaluator 3 uses the form's download format (item_id,judgement only)
    items = _key(kit)["items"]
    s3 = tmp_path / "e3.csv"
    s3.write_text("item_id,judgement\r\n" + "".join(
        f"{i},{_other(it['proposed_side'])}\r\n" for i, it in sorted(items.items())),
        encoding="utf-8")
    df = he.aggregate([s1, s2, s3], kit / "key" / "key.json")
    assert list(df["method"]) == list(he.COMPARED)
    for _, r in df.iterrows():
        assert (r["wins"], r["ties"], r["losses"]) == (20.0, 20.0, 20.0)
        assert r["wins_pct"] == pytest.approx(100 / 3)
        assert r["evaluators"] == 3 and r["items_per_evaluator"] == 60.0
    per = he.count_judgements([s1, s3], kit / "key" / "key.json")
    assert set(per["items"]) == {60}

    # asymmetric: evaluator 4 wins everything against AdaFedAvg, ties otherwise
    s4 = _fill(kit, tmp_path / "e4.csv",
               lambda it: it["proposed_side"] if it["other_method"] == "AdaFedAvg" else "tie")
    df = he.aggregate([s1, s4], kit / "key" / "key.json").set_index("method")
    assert df.loc["AdaFedAvg", ["wins", "ties", "losses"]].tolist() == [60.0, 0.0, 0.0]
    assert df.loc["AdaFedKD", ["wins", "ties", "losses"]].tolist() == [30.0, 30.0, 0.0]
    assert df.loc["AdaFedKD", "ties_pct"] == pytest.approx(50.0)


def _bad(kit: Path, path: Path, edit) -> Path:
    rows = _sheet(_fill(kit, path, lambda it: "tie"))
    rows = edit(rows)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(he.SHEET_COLUMNS))
        w.writeheader()
        w.writerows(rows)
    return path


def test_aggregate_rejects_bad_sheets(kit, tmp_path):
    key = kit / "key" / "key.json"

    def unknown(rows):
        rows[4]["item_id"] = "H9999"
        return rows

    def empty(rows):
        rows[2]["judgement"] = ""
        return rows

    def invalid(rows):
        rows[0]["judgement"] = "maybe"
        return rows

    def duplicate(rows):
        return rows[:7] + [dict(rows[3])] + rows[7:]

    cases = [(unknown, "row 6", "H9999"), (empty, "row 4", None),
             (invalid, "row 2", "'maybe'"), (duplicate, "row 9", "first at row 5")]
    for edit, row, what in cases:
        path = _bad(kit, tmp_path / f"{edit.__name__}.csv", edit)
        with pytest.raises(InputError) as exc:
            he.aggregate([path], key)
        msg = str(exc.value)
        assert str(path) in msg and row in msg, msg
        if what:
            assert what in msg, msg
    # the empty-judgement message names the item
    sheet = _sheet(tmp_path / "empty.csv")
    with pytest.raises(InputError, match=sheet[2]["item_id"]):
        he.aggregate([tmp_path / "empty.csv"], key)

    # missing items: rejected unless allow_partial
    part = _bad(kit, tmp_path / "partial.csv", lambda rows: rows[:-1])
    with pytest.raises(InputError, match="partial.csv.*1 item"):
        he.aggregate([part], key)
    df = he.aggregate([part], key, allow_partial=True)
    assert df["items_per_evaluator"].sum() == 179

    no_col = tmp_path / "nocol.csv"
    no_col.write_text("item_id,answer\nH0001,A\n", encoding="utf-8")
    with pytest.raises(InputError, match="nocol.csv.*'judgement'"):
        he.aggregate([no_col], key)
    with pytest.raises(InputError, match="twice"):
        he.aggregate([part, part], key, allow_partial=True)


def test_build_kit_rejects_mismatched_predictions(inputs, tmp_path):
    predictions, meetings = inputs
    path = Path(predictions["AdaFedKD"])
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    dropped = json.loads(lines[5])["id"]
    path.write_text("".join(lines[:5] + lines[6:]), encoding="utf-8")
    with pytest.raises(InputError) as exc:
        he.build_kit(predictions, meetings, tmp_path / "k")
    assert str(path) in str(exc.value) and dropped in str(exc.value)
    assert not (tmp_path / "k").exists()

    with pytest.raises(InputError, match="no predictions file"):
        he.build_kit({"AdaFedSelectKD": predictions["AdaFedSelectKD"]}, meetings, tmp_path / "k")


def test_write_figure5(kit, tmp_path):
    s1 = _fill(kit, tmp_path / "e1.csv", lambda it: it["proposed_side"])
    s2 = _fill(kit, tmp_path / "e2.csv", lambda it: "tie")
    df = he.aggregate([s1, s2], kit / "key" / "key.json")
    prefix = tmp_path / "out" / "figure5"
    he.write_figure5(df, prefix, "demo")
    for ext in (".csv", ".md", ".png"):
        assert (tmp_path / "out" / f"figure5{ext}").stat().st_size > 0
    assert (tmp_path / "out" / "figure5.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "out" / "figure5.md").read_text(encoding="utf-8")
    assert "DEMO SCALE" in md and "not given in the text" in md
    avg = next(line for line in md.splitlines() if line.startswith("| AdaFedAvg"))
    assert "| 52 | 4 | 4 | 87.0% |" in avg
    kd = next(line for line in md.splitlines() if line.startswith("| AdaFedKD"))
    assert kd.count("—") == 4
    cen = next(line for line in md.splitlines() if line.startswith("| AdaCentralized"))
    assert "43.0%" in cen
    out = pd.read_csv(tmp_path / "out" / "figure5.csv")
    assert set(out["scale"]) == {"demo"}
    assert out.set_index("method").loc["AdaFedAvg", "paper_wins"] == 52
    assert pd.isna(out.set_index("method").loc["AdaFedKD", "paper_wins"])
    with pytest.raises(ValueError):
        he.write_figure5(df, prefix, "huge")


def test_cli_roundtrip(inputs, tmp_path):
    predictions, meetings = inputs
    argv = ["kit", "--out", str(tmp_path / "kit"), "--per-domain", "5"]
    argv += [x for m, p in predictions.items() for x in ("--pred", f"{m}={p}")]
    argv += [x for c, p in meetings.items() for x in ("--meetings", f"{c}={p}")]
    assert he.main(argv) == 0
    s = _fill(tmp_path / "kit", tmp_path / "e.csv", lambda it: it["proposed_side"])
    assert he.main(["aggregate", str(s), "--key", str(tmp_path / "kit" / "key" / "key.json"),
                    "--out-prefix", str(tmp_path / "fig5"), "--scale", "paper"]) == 0
    assert (tmp_path / "fig5.png").exists()
    assert he.main(["aggregate", str(tmp_path / "nope.csv"), "--key",
                    str(tmp_path / "kit" / "key" / "key.json"), "--out-prefix",
                    str(tmp_path / "x"), "--scale", "paper"]) == 2


def test_form_script_is_valid_javascript(kit, tmp_path):
    import re
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node not installed")
    text = (kit / "form.html").read_text(encoding="utf-8")
    script = re.search(r"<script>(.*)</script>", text, re.DOTALL).group(1)
    js = tmp_path / "form.js"
    js.write_text(script, encoding="utf-8")
    res = subprocess.run([node, "--check", str(js)], check=False, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert 'lines.join("\\r\\n")' in script
