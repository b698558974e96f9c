"""The FedMCP targets (Table I, Table II, Fig. 3-5) built by Snakemake on a smoke config."""

import json

import pandas as pd
import pytest
from helpers import build_targets, run_snakemake

SMOKE = """
backbones:
  roberta-base:
    kind: tiny
    bottleneck: 16
    tiny: {vocab_size: 400, d_model: 32, encoder_layers: 1, heads: 2, ffn_dim: 64,
           max_source_length: 64, warmup_steps: 10, warmup_batch_size: 8, warmup_lr: 0.002}
fedmcp:
  seeds: [3]
  max_length: 64
  train: {rounds: 2, epochs: 1, lr: 0.005, batch_size: 16, gamma: 0.5, mu: 0.05}
"""

TARGETS = ["fedmcp_table1", "fedmcp_table2", "fedmcp_figure3", "fedmcp_figure4", "fedmcp_figure5"]


@pytest.mark.e2e
@pytest.mark.slow
def test_fedmcp_targets_build_on_a_smoke_config(tmp_path):
    path, res = build_targets(tmp_path, SMOKE, TARGETS, timeout=1200)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    t1 = pd.read_csv(tmp_path / "results/tables/fedmcp_table1.csv")
    assert list(t1.Method) == ["Local", "FedAvg (Full FT)", "FedAvg (PEFT)", "FedLR", "FedAP", "MOON",
                               "FedRep", "FedMatch", "FedMCP"]
    for task in ["MRPC", "RTE", "SST-2", "QNLI", "QQP", "MNLI", "Avg"]:
        assert t1[f"{task} ours mean"].between(0, 100).all()
        assert t1[f"{task} paper"].notna().all()  # the paper's Table I beside ours
        assert (t1[f"{task} ours mark"] == "†").any()
    assert t1.loc[t1.Method == "FedMCP", "Avg paper"].item() == 85.11
    fedmcp = t1[t1.Method == "FedMCP"].iloc[0]
    assert round(fedmcp["comm_pct roberta-base"], 4) == 0.4883 and fedmcp["comm_pct paper"] == 0.58
    moon = t1[t1.Method == "MOON"].iloc[0]  # paper sizing: two adapter sets, both sent
    assert round(moon["param_pct roberta-base"], 4) == 0.9778 and moon["param_pct paper"] == 1.16
    assert round(moon["comm_pct roberta-base"], 4) == 0.9766 and moon["comm_pct paper"] == 1.16
    assert "baseline_adapters: paper" in (tmp_path / "results/tables/fedmcp_table1.md").read_text()
    assert (t1.scale == "demo").all()
    assert "DEMO" in (tmp_path / "results/tables/fedmcp_table1.md").read_text()
    t2 = pd.read_csv(tmp_path / "results/tables/fedmcp_table2.csv")
    assert list(t2.Method) == ["FedMCP w/o CL", "FedMCP w/o BL", "FedMCP"]
    assert list(t2["Avg paper"]) == [83.57, 84.13, 85.11]
    f3 = pd.read_csv(tmp_path / "results/figures/fedmcp_figure3.csv")
    assert set(f3.method) == {"FedAvg (PEFT)", "FedMCP"} and sorted(set(f3["round"])) == [1, 2]
    for fig, variants in (("figure4", {"CKA", "cosine"}), ("figure5", {"mean pooling", "[CLS]"})):
        data = pd.read_csv(tmp_path / f"results/figures/fedmcp_{fig}.csv")
        assert set(data.variant) == variants and len(data) == 2 * 7
        assert (tmp_path / f"results/figures/fedmcp_{fig}.png").stat().st_size > 1000
    prov = json.loads((tmp_path / "results/fedmcp/crosstask/roberta-base/FedMCP/seed~3/provenance.json").read_text())
    assert prov["engine"] == "inprocess" and prov["seed"] == 3
    again = run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path), *TARGETS)
    assert "Nothing to be done" in again.stdout + again.stderr
