"""The FedSUMM targets (Table I, Table II, Fig. 3-6, the DP tradeoff) built by Snakemake on a smoke
config, and the grid's handling of a corpus without data (EDUCATION is not public) and of bad config."""

import copy
import json

import pandas as pd
import pytest
from helpers import ROOT, build_targets, configs, deep_update, run_snakemake

from fedrepro.papers.fedsumm import grid as wfs
from fedrepro.config import validate_config
from fedrepro.io import InputError

SMOKE = """
data:
  education: {source: download}
partitions:
  fedsumm: {corpora: [csl, education], num_clients: [2, 3]}
fedsumm:
  clients: 3
  table2_corpora: [csl, education]
  figure5: {corpus: csl, clients: [2, 3]}
  backbone:
    kind: tiny
    tiny: {d_model: 16, encoder_layers: 1, decoder_layers: 1, heads: 2, ffn_dim: 32,
           max_position_embeddings: 96, max_vocab_size: null, min_char_freq: 1}
  copy_transformer: {d_model: 16, heads: 2, encoder_layers: 1, decoder_layers: 1, ffn_dim: 32,
                     dropout: 0.1, max_positions: 96}
  train: {rounds: 2, local_epochs: 1, lr: 0.01, weight_decay: 0.0, batch_size: 8, max_grad_norm: 1.0,
          max_source_length: 96, max_target_length: 32}
  generation: {beam_size: 1, max_new_tokens: 10, min_new_tokens: 1, length_penalty: 1.0,
               no_repeat_ngram_size: 3, batch_size: 16}
"""

TARGETS = [
    "fedsumm_table1",
    "fedsumm_table2",
    "fedsumm_figure3",
    "fedsumm_figure4",
    "fedsumm_figure5",
    "fedsumm_figure6",
    "fedsumm_dp_tradeoff",
]


def _paper_config() -> dict:
    """config/paper.yaml deep-merged over config/config.yaml, as Snakemake merges them."""
    demo, paper = configs()
    deep_update(demo, paper)
    return demo


def test_education_without_a_local_copy_gets_no_cells_and_says_data_not_available():
    cfg = _paper_config()  # data.education.source: download (not public)
    status = wfs.statuses(cfg)
    assert (
        status["education"].startswith("data not available")
        and "data.education.local_dir" in status["education"]
    )
    assert all(status[c] is None for c in ("csl", "nlpcc2017", "lcsts", "thucnews"))
    cells = wfs.all_cells(cfg)
    assert cells and not [c for c in cells if "/education/" in c]
    assert "results/data/education/records.jsonl" not in wfs.backbone_inputs(cfg)
    # Table I at paper scale: 4 corpora x 2 models x 4 regimes at N = 50; Fig. 5(b): N = 2 ... 200
    assert len(wfs.target_cells(cfg, "table1")) == 32
    assert {c.split("/")[3] for c in wfs.target_cells(cfg, "figure5")} == {
        "n2",
        "n10",
        "n50",
        "n100",
        "n200",
    }
    # with a local copy EDUCATION is a corpus like the others
    local = copy.deepcopy(cfg)
    local["data"]["education"].update(source="local", local_dir="/data/education")
    assert wfs.corpus_status(local, "education") is None
    assert any("/education/" in c for c in wfs.target_cells(local, "table2"))
    local["data"]["education"]["local_dir"] = None
    assert "local_dir is not set" in wfs.corpus_status(local, "education")


def test_bad_fedsumm_config_is_a_clear_error():
    cfg = configs()[0]
    cfg["fedsumm"]["clients"] = 7
    with pytest.raises(
        InputError, match=r"fedsumm.clients = 7 is not in partitions.fedsumm.num_clients"
    ):
        wfs.target_cells(cfg, "table1")
    cfg = configs()[0]
    cfg["fedsumm"]["figure5"]["clients"] = [2, 3]
    with pytest.raises(InputError, match=r"fedsumm.figure5.clients \[3\]"):
        wfs.target_cells(cfg, "figure5")
    cfg = configs()[0]
    cfg["fedsumm"]["train"]["max_source_length"] = 4096
    with pytest.raises(InputError, match="max_positions"):
        wfs.make_cell(cfg, "csl", 4, "ct", "FedSUMM", 1)
    cfg = configs()[0]
    cfg["fedsumm"]["algorithm"]["rho_window"] = "weekly"
    cfg["fedsumm"]["algorithm"]["reading"] = "per_row"
    cfg["fedsumm"]["dp"]["sigma"] = 1.0
    with pytest.raises(InputError) as err:
        validate_config(cfg, ROOT / "config" / "schema.yaml", source="config/config.yaml")
    assert "fedsumm.algorithm.rho_window" in str(err.value) and "sigma" in str(err.value)
    assert "fedsumm.algorithm.reading" in str(err.value)


def test_dp_keys_are_validated_in_the_schema_and_in_code_naming_the_key():
    for key, value in (("noise_multiplier", 0.0), ("delta", 1.0), ("delta", 0.0),
                       ("target_quantile", 1.5), ("target_quantile", 0.0)):
        cfg = configs()[0]
        cfg["fedsumm"]["dp"][key] = value
        with pytest.raises(InputError, match=rf"config key fedsumm\.dp\.{key}"):
            validate_config(cfg, ROOT / "config" / "schema.yaml", source="config/config.yaml")
        with pytest.raises(InputError, match=rf"config key fedsumm\.dp\.{key}"):
            wfs.make_cell(cfg, "csl", 4, "ct", "FedSUMM", 1)  # the same check in code
    cfg = configs()[0]
    cfg["fedsumm"]["dp_tradeoff"]["noise_multipliers"] = [0.5, 0.0]
    with pytest.raises(InputError, match=r"fedsumm\.dp_tradeoff\.noise_multipliers"):
        validate_config(cfg, ROOT / "config" / "schema.yaml", source="config/config.yaml")
    with pytest.raises(InputError, match=r"fedsumm\.dp_tradeoff\.noise_multipliers"):
        wfs.target_cells(cfg, "dp_tradeoff")
    # σ must stay below 2 x clipped_count_stddev (the count's share of the budget)
    cfg = configs()[0]
    cfg["fedsumm"]["dp_tradeoff"]["noise_multipliers"] = [2.5]
    with pytest.raises(InputError, match=r"fedsumm\.dp\.clipped_count_stddev"):
        wfs.target_cells(cfg, "dp_tradeoff")


def test_dp_tradeoff_cells_keep_dp_off_in_the_tables():
    demo = configs()[0]
    assert demo["fedsumm"]["dp"]["enabled"] is False and _paper_config()["fedsumm"]["dp"]["enabled"] is False
    cells = wfs.target_cells(demo, "dp_tradeoff")
    assert cells == [
        "results/fedsumm/csl/n4/ct/FedSUMM/seed~1",
        "results/fedsumm/csl/n4/ct/FedSUMM-dp/sigma~0.3/seed~1",
        "results/fedsumm/csl/n4/ct/FedSUMM-dp/sigma~0.6/seed~1",
        "results/fedsumm/csl/n4/ct/FedSUMM-dp/sigma~1.2/seed~1",
    ]
    table = wfs.make_cell(demo, "csl", 4, "ct", "FedSUMM", 1)
    assert table["dp"]["enabled"] is False and table["out_dir"] == cells[0]
    dp_cells = wfs.dp_row_cells(demo, "csl", 4, "ct", "FedSUMM", 1)
    assert [c["out_dir"] for c in dp_cells] == cells[1:]
    assert [c["dp"]["noise_multiplier"] for c in dp_cells] == [0.3, 0.6, 1.2]
    assert all(c["dp"]["enabled"] and c["dp"]["clipping"] == "adaptive" for c in dp_cells)
    paper = wfs.target_cells(_paper_config(), "dp_tradeoff")
    assert paper[0] == "results/fedsumm/csl/n50/bart/FedSUMM/seed~1" and len(paper) == 4


@pytest.mark.e2e
@pytest.mark.slow
def test_every_fedsumm_target_builds_on_a_smoke_config(tmp_path):
    path, res = build_targets(tmp_path, SMOKE, TARGETS, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    t1 = pd.read_csv(tmp_path / "results/tables/fedsumm_table1.csv")
    assert len(t1) == 2 * 2 * 4 and list(t1.Regime[:4]) == ["single", "all", "FedAvg", "FedSUMM"]
    csl, edu = t1[t1.Dataset == "CSL"], t1[t1.Dataset == "EDUCATION"]
    for label in ("R-1", "R-2", "R-L"):
        assert csl[f"{label} ours"].between(0, 100).all() and t1[f"{label} paper"].notna().all()
        assert edu[f"{label} ours"].isna().all()
    assert edu.status.str.startswith("data not available").all() and (csl.status == "ok").all()
    assert (
        t1.loc[
            (t1.Dataset == "EDUCATION") & (t1.Model == "BART") & (t1.Regime == "FedSUMM"),
            "R-1 paper",
        ].item()
        == 49.5
    )
    md = (tmp_path / "results/tables/fedsumm_table1.md").read_text(encoding="utf-8")
    assert "DEMO" in md and "| EDUCATION | BART | FedSUMM | data not available | 49.5 |" in md
    t2 = pd.read_csv(tmp_path / "results/tables/fedsumm_table2.csv")
    assert list(t2.Model[:4]) == ["Bart", "+ CD", "+ CD & FedAvg", "+ CD & FedSUMM"]
    assert t2["CSL ours"].notna().all() and list(t2["CSL paper"][:4]) == [39.5, 39.7, 41.2, 42.8]
    assert t2["EDUCATION ours"].isna().all() and (t2["EDUCATION status"] != "ok").all()
    f3 = pd.read_csv(tmp_path / "results/figures/fedsumm_figure3.csv")
    assert len(f3.groupby(["model", "regime"])) == 8 and sorted(set(f3["round"])) == [1, 2]
    assert (f3.perplexity > 1).all()
    f4 = pd.read_csv(tmp_path / "results/figures/fedsumm_figure4.csv")
    assert (
        f4.x.between(0, 2).all()
        and f4.loss.gt(0).all()
        and len(f4.groupby(["model", "regime"])) == 8
    )
    f5 = pd.read_csv(tmp_path / "results/figures/fedsumm_figure5.csv")
    assert set(f5[f5.panel == "a"]["round"]) == {1, 2} and set(f5[f5.panel == "b"]["n"]) == {2, 3}
    f6 = pd.read_csv(tmp_path / "results/figures/fedsumm_figure6.csv")
    assert set(f6.regime) == {"FedAvg", "FedSUMM"} and f6.rho_mean.notna().all()
    # the ρ distribution per round for both regimes, the update difference for FedSUMM's rounds
    assert f6[["param_p1", "param_p50", "param_p99", "tensor_max", "group_max"]].notna().all().all()
    summ = f6[f6.regime == "FedSUMM"]
    assert summ.update_rel_diff.gt(0).all() and f6[f6.regime == "FedAvg"].update_rel_diff.isna().all()
    for fig in ("figure3", "figure4", "figure5", "figure6"):
        assert (tmp_path / f"results/figures/fedsumm_{fig}.png").stat().st_size > 1000
    dp = pd.read_csv(tmp_path / "results/figures/fedsumm_dp_tradeoff.csv")
    a = dp[dp.panel == "a"].sort_values("noise_multiplier")
    assert list(a.noise_multiplier.dropna()) == [0.3, 0.6, 1.2] and (~a.dp).sum() == 1
    assert a[a.dp].epsilon.is_monotonic_decreasing and a[~a.dp].epsilon.item() == float("inf")
    assert a.rougeL.between(0, 100).all()
    for sigma in ("0.3", "0.6", "1.2"):  # ε in every round of every DP cell's log
        dp_cell = tmp_path / f"results/fedsumm/csl/n3/ct/FedSUMM-dp/sigma~{sigma}/seed~1"
        rounds = json.loads((dp_cell / "train_log.json").read_text())["rounds"]
        assert [r["dp"]["epsilon"] > 0 for r in rounds] == [True, True]
        assert json.loads((dp_cell / "provenance.json").read_text())["dp"]["epsilon"] == (
            rounds[-1]["dp"]["epsilon"]
        )
    cell = tmp_path / "results/fedsumm/csl/n3/ct/FedSUMM/seed~1"
    prov = json.loads((cell / "provenance.json").read_text())
    assert "dp" not in prov and "dp" not in json.loads((cell / "train_log.json").read_text())["rounds"][0]
    assert prov["engine"] == "inprocess" and prov["cell"]["regime"] == "FedSUMM"
    assert not (cell / "checkpoints").exists()
    assert not (tmp_path / "logs/download_source/education.log").exists()  # never attempted
    again = run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path), *TARGETS)
    assert "Nothing to be done" in again.stdout + again.stderr
