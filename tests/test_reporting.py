"""Tests for ROUGE scoring, the reference results and the AdaFedSelecKD main tables."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from rouge_score import rouge_scorer

from fedrepro.io import InputError
from fedrepro.metrics.rouge import CharTokenizer, rouge_scores
from fedrepro.reporting.reference import load_paper_results, paper_values
from fedrepro.papers.adafedseleckd.report import (
    ADAFEDSELECKD_CLIENTS,
    ADAFEDSELECKD_METHODS,
    METHOD_SETTINGS,
    SCORE_COLUMNS,
    adafedseleckd_main_table,
    collect_scores,
    metric_columns,
    write_table,
)

# ----------------------------------------------------------------------------- ROUGE


def test_rouge_identical_is_100():
    out = rouge_scores(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert out["rouge1"] == pytest.approx(100.0)
    assert out["rouge2"] == pytest.approx(100.0)
    assert out["rougeL"] == pytest.approx(100.0)
    assert out["n"] == 1
    assert out["per_example"]["rouge1"] == [pytest.approx(100.0)]


def test_rouge_disjoint_is_0():
    out = rouge_scores(["alpha beta gamma"], ["delta epsilon zeta"])
    assert (out["rouge1"], out["rouge2"], out["rougeL"]) == (0.0, 0.0, 0.0)


def test_rouge_hand_computed():
    # prediction "the cat sat" (3 tokens) vs reference "the cat sat on the mat" (6 tokens):
    # unigram overlap 3 -> P = 1, R = 1/2, F1 = 2/3; bigram overlap 2 of 2 vs 5 -> F1 = 4/7;
    # LCS = 3 -> same as ROUGE-1.
    out = rouge_scores(["the cat sat"], ["the cat sat on the mat"])
    assert out["rouge1"] == pytest.approx(100 * 2 / 3)
    assert out["rouge2"] == pytest.approx(100 * 4 / 7)
    assert out["rougeL"] == pytest.approx(100 * 2 / 3)


def test_rouge_mean_over_examples():
    out = rouge_scores(["the cat sat", "a b"], ["the cat sat on the mat", "a b"])
    assert out["n"] == 2
    assert out["rouge1"] == pytest.approx((100 * 2 / 3 + 100) / 2)
    assert len(out["per_example"]["rouge2"]) == 2


def test_rouge_stemming():
    # Porter stemmer: "running" -> "run", "runs" -> "run"; single tokens have no bigrams -> R-2 0.
    out = rouge_scores(["running"], ["runs"])
    assert out["rouge1"] == pytest.approx(100.0)
    assert out["rougeL"] == pytest.approx(100.0)
    assert out["rouge2"] == 0.0
    plain = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=False).score("runs", "running")
    assert plain["rouge1"].fmeasure == 0.0


def test_rouge_chinese_characters():
    # 我们开会 vs 我们吃饭: 2 of 4 characters shared -> P = R = 1/2, F1 = 50;
    # bigrams {我们, 们开, 开会} vs {我们, 们吃, 吃饭}: 1 of 3 -> 33.33; LCS 我们 = 2 -> 50.
    out = rouge_scores(["我们开会"], ["我们吃饭"], lang="zh")
    assert out["rouge1"] == pytest.approx(50.0)
    assert out["rouge2"] == pytest.approx(100 / 3)
    assert out["rougeL"] == pytest.approx(50.0)
    # the default tokenizer drops non-ASCII, so it would score 0 (even for identical text)
    default = rouge_scorer.RougeScorer(["rouge1"]).score("我们吃饭", "我们吃饭")
    assert default["rouge1"].fmeasure == 0.0
    assert rouge_scores(["我们吃饭"], ["我们吃饭"], lang="zh")["rouge1"] == pytest.approx(100.0)
    assert CharTokenizer().tokenize("我们 开\n会") == ["我", "们", "开", "会"]


@pytest.mark.parametrize(
    ("preds", "refs", "lang", "match"),
    [
        (["a"], ["a", "b"], "en", "same length"),
        ([], [], "en", "empty"),
        (["a"], ["a"], "fr", "lang"),
        ([None], ["a"], "en", "expected str"),
    ],
)
def test_rouge_bad_input(preds, refs, lang, match):
    with pytest.raises(ValueError, match=match):
        rouge_scores(preds, refs, lang=lang)


# ----------------------------------------------------------------------------- reference


def test_reference_loads():
    df = load_paper_results()
    assert list(df.columns) == ["paper", "table", "backbone", "setting", "client", "method",
                                "metric", "value", "std"]
    t3 = paper_values("adafedseleckd", "Table III")
    assert len(t3) == 45
    assert set(t3["backbone"]) == {"bart-large"}
    with pytest.raises(InputError, match="Table XX"):
        paper_values("adafedseleckd", "Table XX")
    with pytest.raises(InputError, match="nopaper"):
        paper_values("nopaper", "Table III")


# ----------------------------------------------------------------------------- score files

# Our fabricated R-1 base per client, in method order (AdaSingle, AdaCentralized, AdaFedAvg,
# AdaFedKD, AdaFedSelectKD). Seed 1 scores base, seed 2 base + 1 (R-2 = R-1 - 5, R-L = R-1 - 2),
# so the mean is base + 0.5 and the sample std 1/sqrt(2) for every cell.
BASE = {
    "Academic": [10.0, 12.0, 14.0, 16.0, 18.0],  # † AdaFedSelectKD, †† AdaFedKD
    "Committee": [20.0, 18.0, 16.0, 14.0, 12.0],  # † AdaSingle, †† AdaCentralized
    "Product": [15.0, 19.0, 17.0, 21.0, 13.0],  # † AdaFedKD, †† AdaCentralized
}
OFFSET = {"rouge1": 0.0, "rouge2": -5.0, "rougeL": -2.0}
LABEL = {"rouge1": "R-1", "rouge2": "R-2", "rougeL": "R-L"}


def _value(client: str, method: str, metric: str, seed: int) -> float:
    return BASE[client][ADAFEDSELECKD_METHODS.index(method)] + OFFSET[metric] + (seed - 1)


def _per_client(clients, method, seed):
    return {c: {m: _value(c, method, m, seed) for m in OFFSET} | {"n": 7} for c in clients}


def _write_scores(tmp_path, seeds=(1, 2), methods=ADAFEDSELECKD_METHODS, backbone="bart-large"):
    paths = []
    for seed in seeds:
        for method in methods:
            groups = ([[c] for c in ADAFEDSELECKD_CLIENTS] if method == "AdaSingle"
                      else [list(ADAFEDSELECKD_CLIENTS)])
            for clients in groups:
                obj = {"paper": "adafedseleckd", "scale": "demo", "backbone": backbone,
                       "method": method, "setting": METHOD_SETTINGS[method], "seed": seed,
                       "per_client": _per_client(clients, method, seed)}
                cell = tmp_path / f"{method}_s{seed}_{'-'.join(clients)}"
                cell.mkdir(parents=True)
                (cell / "scores.json").write_text(json.dumps(obj), encoding="utf-8")
                paths.append(cell / "scores.json")
    return paths


@pytest.fixture
def scores(tmp_path):
    return collect_scores(_write_scores(tmp_path))


def test_collect_scores_long_format(scores):
    assert list(scores.columns) == list(SCORE_COLUMNS)
    # 2 seeds x 15 (file, client) pairs x 4 metrics (rouge1/2/L + n)
    assert len(scores) == 2 * 15 * 4
    assert set(scores["metric"]) == {"rouge1", "rouge2", "rougeL", "n"}
    assert set(scores["scale"]) == {"demo"}
    one = scores[(scores["method"] == "AdaFedAvg") & (scores["client"] == "Product")
                 & (scores["seed"] == 2) & (scores["metric"] == "rouge2")]
    assert one["value"].tolist() == [pytest.approx(17.0 - 5.0 + 1.0)]


def _good_obj():
    return {"paper": "adafedseleckd", "scale": "demo", "backbone": "bart-large",
            "method": "AdaFedAvg", "setting": "federated", "seed": 1,
            "per_client": {"Academic": {"rouge1": 25.1, "rouge2": 6.2, "rougeL": 18.0, "n": 49}}}


def _drop(key):
    def f(o):
        del o[key]
    return f


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (_drop("seed"), "missing key 'seed'"),
        (_drop("per_client"), "missing key 'per_client'"),
        (lambda o: o.update(seed="1"), "'seed'"),
        (lambda o: o.update(scale="huge"), "'scale'"),
        (lambda o: o["per_client"]["Academic"].update(rouge1="25.1"), "rouge1"),
        (lambda o: o["per_client"]["Academic"].pop("rougeL"), "rougeL"),
        (lambda o: o["per_client"]["Academic"].update(n=2.5), "'n'"),
        (lambda o: o["per_client"].update(Product=[1, 2]), "Product"),
        (lambda o: o.update(setting="single"), "setting"),
        (lambda o: o.update(method="AdaSingle", setting="single",
                            per_client={c: o["per_client"]["Academic"]
                                        for c in ("Academic", "Product")}), "exactly one"),
    ],
)
def test_malformed_score_file_names_file(tmp_path, mutate, match):
    obj = _good_obj()
    mutate(obj)
    bad = tmp_path / "cell_x" / "scores.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps(obj), encoding="utf-8")
    with pytest.raises(InputError, match=match) as exc:
        collect_scores([bad])
    assert str(bad) in str(exc.value)


def test_invalid_json_and_duplicates(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError, match="broken.json"):
        collect_scores([bad])
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_good_obj()), encoding="utf-8")
    b.write_text(json.dumps(_good_obj()), encoding="utf-8")
    with pytest.raises(InputError, match="duplicate"):
        collect_scores([a, b])
    with pytest.raises(InputError, match="no score files"):
        collect_scores([])


# ----------------------------------------------------------------------------- main table

EXPECTED_COLUMNS = ["Client", "Setting", "Method"] + [
    c for lab in ("R-1", "R-2", "R-L") for c in metric_columns(lab)
]


def _row(df, client, method):
    hit = df[(df["Client"] == client) & (df["Method"] == method)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_table_iii_rows_columns_and_stats(scores):
    df = adafedseleckd_main_table(scores, "bart-large", "Table III")
    assert list(df.columns) == EXPECTED_COLUMNS
    assert len(df) == 15
    expected_order = [(c, m) for c in ADAFEDSELECKD_CLIENTS for m in ADAFEDSELECKD_METHODS]
    assert list(zip(df["Client"], df["Method"], strict=True)) == expected_order
    assert df.loc[df["Method"] == "AdaSingle", "Setting"].unique().tolist() == ["Single"]
    assert df.loc[df["Method"] == "AdaFedKD", "Setting"].unique().tolist() == ["Federated"]
    for client in ADAFEDSELECKD_CLIENTS:
        for method in ADAFEDSELECKD_METHODS:
            row = _row(df, client, method)
            for metric, lab in LABEL.items():
                v1, v2 = _value(client, method, metric, 1), _value(client, method, metric, 2)
                assert row[f"{lab} ours mean"] == pytest.approx((v1 + v2) / 2)
                # sample std of two values = |v1 - v2| / sqrt(2)
                assert row[f"{lab} ours std"] == pytest.approx(abs(v1 - v2) / math.sqrt(2))
                assert row[f"{lab} n_seeds"] == 2


def test_table_iii_our_marks(scores):
    df = adafedseleckd_main_table(scores, "bart-large", "Table III")
    expected = {  # client -> (†, ††), same for every metric by construction
        "Academic": ("AdaFedSelectKD", "AdaFedKD"),
        "Committee": ("AdaSingle", "AdaCentralized"),
        "Product": ("AdaFedKD", "AdaCentralized"),
    }
    for client, (first, second) in expected.items():
        for lab in LABEL.values():
            sub = df[df["Client"] == client].set_index("Method")[f"{lab} ours mark"]
            assert sub[first] == "†"
            assert sub[second] == "††"
            assert (sub.drop([first, second]) == "").all()


def test_table_iii_paper_values_from_reference(scores):
    df = adafedseleckd_main_table(scores, "bart-large", "Table III")
    ref = paper_values("adafedseleckd", "Table III")
    for _, r in ref.iterrows():
        row = _row(df, r["client"], r["method"])
        assert row[f"{LABEL[r['metric']]} paper"] == pytest.approx(r["value"])
    # spot check against the paper's text
    assert _row(df, "Academic", "AdaFedSelectKD")["R-1 paper"] == pytest.approx(27.09)


# Daggers as printed in the paper: (table, client) -> winner of, R-L among
# C = AdaCentralized and S = AdaFedSelectKD; the other one is second in every case.
PAPER_DAGGERS = {
    ("Table III", "Academic"): "SCC", ("Table III", "Committee"): "SCS",
    ("Table III", "Product"): "CSC",
    ("Table IV", "Academic"): "CCS", ("Table IV", "Committee"): "SCC",
    ("Table IV", "Product"): "CSS",
    ("Table VI", "Academic"): "CSS", ("Table VI", "Committee"): "CSC",
    ("Table VI", "Product"): "CCS",
}


@pytest.mark.parametrize("table", ["Table III", "Table IV", "Table VI"])
def test_paper_marks_reproduce_paper(table):
    empty = pd.DataFrame(columns=list(SCORE_COLUMNS))
    df = adafedseleckd_main_table(empty, "none", table)
    names = {"C": "AdaCentralized", "S": "AdaFedSelectKD"}
    for client in ADAFEDSELECKD_CLIENTS:
        winners = PAPER_DAGGERS[(table, client)]
        sub = df[df["Client"] == client].set_index("Method")
        for lab, w in zip(("R-1", "R-2", "R-L"), winners, strict=True):
            other = "S" if w == "C" else "C"
            marks = sub[f"{lab} paper mark"]
            assert marks[names[w]] == "†", (table, client, lab)
            assert marks[names[other]] == "††", (table, client, lab)
            assert (marks.drop([names[w], names[other]]) == "").all()
        # nothing of ours: NaN means, no marks
        assert sub["R-1 ours mean"].isna().all()
        assert (sub["R-1 ours mark"] == "").all()
    assert df.loc[0, "R-1 n_seeds"] == 0


def test_missing_method_and_single_seed(tmp_path):
    methods = [m for m in ADAFEDSELECKD_METHODS if m != "AdaFedKD"]
    scores = collect_scores(_write_scores(tmp_path, seeds=(3,), methods=methods))
    df = adafedseleckd_main_table(scores, "bart-large", "Table III")
    assert len(df) == 15
    kd = _row(df, "Academic", "AdaFedKD")
    assert math.isnan(kd["R-1 ours mean"]) and kd["R-1 n_seeds"] == 0
    assert kd["R-1 paper"] == pytest.approx(26.66)
    sel = _row(df, "Academic", "AdaFedSelectKD")
    assert sel["R-1 ours mean"] == pytest.approx(18.0 + 2)  # seed 3 -> base + 2
    assert math.isnan(sel["R-1 ours std"])  # one seed: sample std undefined
    assert sel["R-1 n_seeds"] == 1
    # with AdaFedKD missing, AdaFedAvg moves up to second in Academic
    assert _row(df, "Academic", "AdaFedAvg")["R-1 ours mark"] == "††"


def test_table_ignores_other_backbones_and_rejects_mixed_scales(tmp_path, scores):
    other = collect_scores(_write_scores(tmp_path / "base", backbone="bart-base", seeds=(9,)))
    both = pd.concat([scores, other], ignore_index=True)
    df = adafedseleckd_main_table(both, "bart-large", "Table III")
    assert (df["R-1 n_seeds"] == 2).all()
    mixed = scores.copy()
    mixed.loc[mixed["seed"] == 2, "scale"] = "paper"
    with pytest.raises(InputError, match="mix scales"):
        adafedseleckd_main_table(mixed, "bart-large", "Table III")
    with pytest.raises(ValueError, match="Table V"):
        adafedseleckd_main_table(scores, "bart-large", "Table V")


# ----------------------------------------------------------------------------- writers


def test_write_table_demo(tmp_path, scores):
    df = adafedseleckd_main_table(scores, "bart-large", "Table III")
    prefix = tmp_path / "out" / "table_iii"
    write_table(df, prefix, "Table III (bart-large): ours vs. paper", scale="demo")
    csv, md, tex = (prefix.with_suffix(s) for s in (".csv", ".md", ".tex"))
    assert csv.exists() and md.exists() and tex.exists()
    back = pd.read_csv(csv)
    assert len(back) == 15
    assert set(back["scale"]) == {"demo"}
    assert back["R-1 ours mean"].dtype.kind == "f"
    assert back.loc[4, "R-1 paper"] == pytest.approx(27.09)

    md_text = md.read_text(encoding="utf-8")
    assert "demo" in md_text.lower()
    assert "DEMO-SCALE" in md_text.splitlines()[2]
    assert "Table III (bart-large): ours vs. paper" in md_text.splitlines()[0]
    academic_sel = next(line for line in md_text.splitlines() if "AdaFedSelectKD" in line)
    assert "18.50 ± 0.71 †" in academic_sel  # ours, first in Academic
    assert "27.09 †" in academic_sel  # paper
    assert "26.74 ††" in md_text

    tex_text = tex.read_text(encoding="utf-8")
    assert r"\toprule" in tex_text and r"\bottomrule" in tex_text
    assert r"\begin{tabular}" in tex_text and r"\caption{" in tex_text
    assert r"27.09$^{\dagger}$" in tex_text
    assert r"26.74$^{\dagger\dagger}$" in tex_text
    assert r"18.50 $\pm$ 0.71$^{\dagger}$" in tex_text
    assert "DEMO-SCALE" in tex_text
    assert not list(tmp_path.joinpath("out").glob(".*"))  # no temp files left behind


def test_write_table_paper_scale_has_no_demo_banner(tmp_path, scores):
    df = adafedseleckd_main_table(scores, "bart-large", "Table III")
    prefix = tmp_path / "t3"
    write_table(df, prefix, "Table III", scale="paper")
    assert "demo" not in (tmp_path / "t3.md").read_text(encoding="utf-8").lower()
    assert "demo" not in (tmp_path / "t3.tex").read_text(encoding="utf-8").lower()
    assert set(pd.read_csv(tmp_path / "t3.csv")["scale"]) == {"paper"}
    with pytest.raises(ValueError, match="scale"):
        write_table(df, prefix, "Table III", scale="tiny")
