"""Every FedSum target (Tables 1-4, the appendix tables, Fig. 3-5) built by Snakemake on a smoke
config: samples -> splits -> oracle labels -> client data -> cells through Flower -> reports."""

import json
import math
import re

import pandas as pd
import pytest
import yaml
from helpers import build_targets, configs, run_snakemake, write_config

SMOKE = """
backbones:
  bert-base:
    kind: tiny
    tiny: {vocab_size: 300, d_model: 16, encoder_layers: 1, heads: 2, ffn_dim: 32, max_source_length: 128}
fedsum:
  methods: [Separate, FedAvg, FedProto, FedSum]
  table3_alphas: [0.1, 8]
  figure3_totals: [10, 20]
  figure5_lambdas: [0.3, 0.5]
  eval: {batch_size: 16, max_test_docs: 5, heldout_test_docs: 5}
  train: {rounds: 2, local_epochs: 1, lr: 0.005, batch_size: 4, max_tokens: 128, max_sentence_tokens: 32}
"""

TARGETS = [
    "fedsum_table1",
    "fedsum_table2",
    "fedsum_table_wikihow",
    "fedsum_table_reddit",
    "fedsum_table3",
    "fedsum_table4",
    "fedsum_figure3",
    "fedsum_figure4",
    "fedsum_figure5",
]
METHODS = ["Separate", "FedAvg", "FedProto", "FedSum"]


@pytest.mark.e2e
@pytest.mark.slow
def test_fedsum_targets_build_on_a_smoke_config(tmp_path):
    path, res = build_targets(tmp_path, SMOKE, TARGETS, timeout=1200)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    tables = tmp_path / "results" / "tables"
    t1 = pd.read_csv(tables / "fedsum_table1.csv")
    assert list(t1.Method) == METHODS and (t1.scale == "demo").all()
    for m in ("R-F-1", "R-F-2", "R-F-L", "R-R-1", "R-R-2", "R-R-L"):
        assert t1[f"{m} ours mean"].between(0, 100).all() and t1[f"{m} paper"].notna().all()
    assert t1.loc[t1.key == "FedSum", "R-R-1 paper"].item() == 44.98  # Table 1
    assert "DEMO" in (tables / "fedsum_table1.md").read_text()
    t2 = pd.read_csv(tables / "fedsum_table2.csv")
    assert t2.loc[t2.key == "FedAvg", "R-F-1 paper"].item() == 31.1  # Table 2 (PubMed)
    for name in ("fedsum_table_wikihow", "fedsum_table_reddit"):  # appendix: no numbers in the text
        t = pd.read_csv(tables / f"{name}.csv")
        assert (
            list(t.Method) == METHODS
            and t["R-R-1 paper"].isna().all()
            and t["R-R-1 ours mean"].notna().all()
        )
    t3 = pd.read_csv(tables / "fedsum_table3.csv")
    assert t3.loc[t3.key == "FedSum", "Dir=8 R-R-1 paper"].item() == 44.42
    assert t3.loc[t3.key == "FedSum", "Dir=0.1 R-R-1 paper"].item() == 44.98  # Table 1's numbers
    assert t3["Dir=8 R-R-1 ours mean"].notna().all()
    t4 = pd.read_csv(tables / "fedsum_table4.csv")
    assert list(t4.Method) == ["FedAvg", "+ Depth Extension", "+ Two Extensions"]
    assert list(t4["R-R-1 paper"]) == [42.8, 44.42, 44.98]
    assert t4["R-R-1 paper improvement"].round(2).tolist() == [0.0, 1.62, 2.18]
    figures = tmp_path / "results" / "figures"
    f3 = pd.read_csv(figures / "fedsum_figure3.csv")
    assert set(f3.total) == {10, 20} and set(f3.method) == {"FedAvg", "FedSum"}
    assert {a for a in f3.alpha if not math.isinf(a)} == {0.1} and any(
        math.isinf(a) for a in f3.alpha
    )
    f4 = pd.read_csv(figures / "fedsum_figure4.csv")
    assert set(f4.model) == {"FedSum", "FedAvg", "Oracle"} and set(f4.dataset) == {
        "cnndm",
        "pubmed",
    }
    for _, g in f4.groupby(["dataset", "model"]):
        assert g.proportion.sum() == pytest.approx(1.0)
    assert (f4[f4.model == "Oracle"].total_abs_deviation_from_oracle == 0).all()
    f5 = pd.read_csv(figures / "fedsum_figure5.csv")
    assert set(f5.lam) == {0.3, 0.5} and set(f5.method) == {"FedSum"}
    for fig in ("figure3", "figure4", "figure5"):
        assert (figures / f"fedsum_{fig}.png").stat().st_size > 1000
    cell = tmp_path / "results/fedsum/fedsum-cnndm-a0.1/bert-base/FedSum/seed~1"
    scores = json.loads((cell / "scores.json").read_text())
    log = json.loads((cell / "train_log.json").read_text())["rounds"]
    assert scores["round"] in (1, 2) and scores["metrics"]["rouge1_recall"] == max(
        e["evaluation"]["metrics"]["rouge1_recall"] for e in log
    )
    assert json.loads((cell / "provenance.json").read_text())["engine"] == "inprocess"
    assert not (cell / "checkpoints").exists()
    again = run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path), *TARGETS)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_grid_and_bad_config_errors_name_the_key():
    """The grid (plain Python over the config) and its errors, without running anything."""
    from fedrepro.papers.fedsum import grid as wfsum
    from fedrepro.io import InputError

    demo, paper = configs()
    cell = wfsum.make_fedsum_cell(paper, "fedsum-cnndm-a0.1", "FedProx", 2)
    assert cell["baselines"] == {"mu": 1.0} and "fedsum" not in cell  # only its own hyperparameters
    assert (
        cell["clients_per_round"] == 4
        and len(cell["clients"]) == 20
        and cell["extract_sentences"] == 3
    )
    lam = wfsum.make_fedsum_cell(paper, "fedsum-cnndm-ainf", "FedSum-lam0.3", 1)
    assert lam["method"] == "FedSum" and lam["fedsum"]["lam"] == 0.3 and lam["alpha"] == "inf"
    assert wfsum.manifest_path(paper, "fedsum-cnndm-a0.1-n4000", 1).startswith(
        "results/fedsum/partitions/"
    )
    assert len(wfsum.target_cells(paper, "table3")) == 4 * 8 * 3
    assert wfsum.row_settings(demo) == [
        "fedsum-cnndm-a0.1",
        "fedsum-cnndm-a8",
        "fedsum-pubmed-a0.1",
        "fedsum-reddit_tifu-a0.1",
        "fedsum-wikihow-a0.1",
    ]
    bad = yaml.safe_load(yaml.safe_dump(demo))
    bad["fedsum"]["table3_alphas"] = [0.1, 3]
    with pytest.raises(InputError, match=r"Dir = 3.*partitions.fedsum.alphas"):
        wfsum.target_cells(bad, "table3")
    bad = yaml.safe_load(yaml.safe_dump(demo))
    bad["fedsum"]["seeds"] = [5]
    with pytest.raises(InputError, match="partitions.seeds"):
        wfsum.target_cells(bad, "table1")
    bad = yaml.safe_load(yaml.safe_dump(demo))
    bad["fedsum"]["methods"] = ["FedAvg"]
    with pytest.raises(InputError, match=r"fedsum_table4 needs \['FedSum'\] in fedsum.methods"):
        wfsum.target_cells(bad, "table4")
    with pytest.raises(InputError, match="unknown FedSum method"):
        wfsum.make_fedsum_cell(demo, "fedsum-cnndm-a0.1", "FedMagic", 1)


def test_one_job_per_run_when_rows_are_off(tmp_path):
    path = write_config(tmp_path, {"fedsum": {"cells_per_job": "cell"}}, "cells.yaml")
    res = run_snakemake(
        "-n", "--configfile", str(path), "--directory", str(tmp_path), "fedsum", timeout=300
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "fedsum_train_row" not in out and re.search(r"^fedsum_train_cell\s+51$", out, flags=re.MULTILINE)
