"""The Snakemake workflow: lint, paper-grid dry run, config validation, env pins, end to end."""

import json
import os
import re
import subprocess

import pytest
import yaml

from helpers import (
    ROOT,
    SNAKEMAKE,
    build_targets,
    configs,
    deep_update,
    demo_config_absolute,
    run_snakemake,
)

from fedrepro.config import validate_config
from fedrepro.io import InputError


def test_snakemake_lint_is_clean():
    res = run_snakemake("--lint")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Congratulations" in res.stdout + res.stderr


def test_paper_config_dry_run_lists_every_cell_of_the_paper_grids():
    res = run_snakemake("-n", "--configfile", "config/paper.yaml", timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out, flags=re.M))
    # 3 backbones x 3 seeds x (3 AdaSingle clients + AdaCentralized + 3 federated methods) = 63,
    # + the other experiments on bart-large x 3 seeds: Table V 3 methods, Table VII post-addition,
    # Fig. 4 four more taus, Figs. 6/7/8 (extreme)/9 (longt5)/10 (sampled) 3 methods each, Fig. 12
    # hard KD: 3 x (3 + 1 + 4 + 5 x 3 + 1) = 72
    assert counts["train_cell"] == "135"
    assert counts["evaluate_cell"] == "135"
    assert counts["adafedseleckd_table"] == "3"
    assert counts["adafedseleckd_experiment_table"] == "3" and counts["adafedseleckd_experiment_figure"] == "8"
    assert counts["adafedseleckd_human_eval_kit"] == "1" and counts["adafedseleckd_pos_tags"] == "9"
    assert counts["download_qmsum"] == "1" and counts["backbone"] == "5"  # + longt5, roberta-base
    # FedMCP: 13 methods and ablations x 3 runs; Tables I-II and Figures 3-5
    assert counts["fedmcp_train_cell"] == "39" and counts["fedmcp_evaluate_cell"] == "39"
    assert counts["fedmcp_table"] == "2" and counts["fedmcp_figure"] == "3"
    for cell in (
        "results/adafedseleckd/domains/bart-large/AdaSingle/Academic/seed~3/adapters.safetensors",
        "results/adafedseleckd/domains/led-large/AdaFedSelectKD/all/seed~2/scores.json",
        "results/adafedseleckd/domains/bart-base/AdaCentralized/all/seed~1/adapters.safetensors",
        "results/adafedseleckd/extreme/bart-large/AdaFedSelectKD~post/all/seed~3/scores.json",
        "results/adafedseleckd/long/longt5/AdaFedKD/all/seed~2/scores.json",
        "results/adafedseleckd/domains/bart-large/AdaFedAvg~sample2/all/seed~1/scores.json",
        "results/adafedseleckd/domains/bart-large/AdaFedSelectKD~tau9/all/seed~1/scores.json",
        "results/adafedseleckd/iid/bart-large/AdaFedKD/all/seed~3/scores.json",
    ):
        assert cell in out


def test_both_configs_validate():
    for cfg in configs():
        validate_config(cfg, ROOT / "config" / "schema.yaml")


def test_bad_config_names_the_key_and_the_problem():
    cfg = configs()[0]
    cfg["adafedseleckd"]["train"]["lr"] = "fast"
    cfg["adafedseleckd"]["methods"].append("AdaFedMagic")
    cfg["data"]["qmsum"]["source"] = "local"
    with pytest.raises(InputError) as err:
        validate_config(cfg, ROOT / "config" / "schema.yaml", source="config/config.yaml")
    msg = str(err.value)
    assert "config/config.yaml" in msg
    assert "adafedseleckd.train.lr: 'fast' is not of type 'number'" in msg
    assert "adafedseleckd.methods.5" in msg and "AdaFedMagic" in msg
    assert "data.qmsum.local_dir: required when data.qmsum.source is 'local'" in msg


def _pins(lines):
    out = {}
    for line in lines:
        line = line.strip().lstrip("- ").strip()
        m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s#]+)", line)
        if m:
            out[re.sub(r"\[.*\]", "", m.group(1)).lower().replace("_", "-")] = m.group(2)
    return out


def test_conda_envs_pin_the_same_versions_as_requirements():
    req = _pins((ROOT / "requirements.txt").read_text().splitlines())
    envs = sorted((ROOT / "envs").glob("*.yaml"))
    assert {e.stem for e in envs} >= {"data", "train", "analysis"}
    for env in envs:
        spec = yaml.safe_load(env.read_text())
        pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict) and "pip" in d)
        pins = _pins(pip)
        assert pins, f"{env} pins nothing"
        for name, version in pins.items():
            assert req.get(name) == version, f"{env.name}: {name}=={version} but requirements.txt has {req.get(name)}"
    # every rule that runs something has a conda env (named targets only collect inputs)
    for smk in (ROOT / "rules").glob("*.smk"):
        text = smk.read_text()
        # (rules inside an ``if config...:`` block, as rules/rehearsal.smk's, are indented deeper)
        n_jobs = len(re.findall(r"^\s+(?:script|shell|run):", text, flags=re.M))
        assert text.count("conda:") == n_jobs, smk.name


TINY_CONFIG = """
scale: demo
seeds: [7]
data:
  qmsum:
    source: samples
    samples_dir: {samples}
backbones:
  bart-large:
    kind: tiny
    adapter_top_k: 1
    bottleneck: 32
    tiny:
      vocab_size: 600
      d_model: 32
      encoder_layers: 1
      decoder_layers: 2
      heads: 2
      ffn_dim: 64
      max_source_length: 128
      max_target_length: 32
      warmup_steps: 10
      warmup_batch_size: 4
      warmup_lr: 0.002
adafedseleckd:
  backbones: [bart-large]
  max_source_length: 128
  max_target_length: 32
  train:
    rounds: 2
    local_epochs: 1
    lr: 0.003
    weight_decay: 0.01
    batch_size: 8
    lam: 0.2
    tau: 5.0
  generation:
    num_beams: 1
    max_new_tokens: 12
    min_new_tokens: 2
    no_repeat_ngram_size: 3
    length_penalty: 1.0
    batch_size: 16
"""


@pytest.mark.slow
def test_end_to_end_tiny_config_produces_table3(tmp_path):
    """Raw samples -> clients -> all five methods (three through Flower) -> ROUGE -> Table III."""
    cfg, res = build_targets(
        tmp_path,
        TINY_CONFIG.format(samples=ROOT / "resources" / "samples" / "qmsum"),
        ["adafedseleckd_table3", "dataset_stats"],
        timeout=900,
        name="tiny.yaml",
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    table = tmp_path / "results" / "tables" / "adafedseleckd_table3.csv"
    import pandas as pd

    df = pd.read_csv(table)
    assert list(df["Client"]) == [c for c in ("Academic", "Committee", "Product") for _ in range(5)]
    assert list(df["Method"][:5]) == ["AdaSingle", "AdaCentralized", "AdaFedAvg", "AdaFedKD", "AdaFedSelectKD"]
    assert df["R-1 ours mean"].notna().all() and (df["R-1 ours mean"] > 0).all()
    assert (df["scale"] == "demo").all()
    md = (tmp_path / "results" / "tables" / "adafedseleckd_table3.md").read_text()
    assert "DEMO" in md.upper()
    assert (tmp_path / "results" / "tables" / "adafedseleckd_table3.tex").exists()
    stats = pd.read_csv(tmp_path / "results" / "data" / "qmsum" / "table2_stats.csv")
    assert len(stats) == 9
    cell = tmp_path / "results/adafedseleckd/domains/bart-large/AdaFedSelectKD/all/seed~7"
    prov = json.loads((cell / "provenance.json").read_text())
    assert prov["seed"] == 7 and len(prov["bytes_per_round"]) == 2
    # every job starts with glibc's malloc limited to one arena (rules/common.smk, host_memory)
    assert prov["machine"]["malloc_arena_max"] == os.environ.get("MALLOC_ARENA_MAX", "1")
    assert prov["bytes_per_round"][0]["up"] > 0
    assert not (cell / "checkpoints").exists()  # cleaned after a finished run
    # nothing to do on a second invocation
    again = run_snakemake("-n", "--configfile", str(cfg), "--directory", str(tmp_path), "adafedseleckd_table3")
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_dataset_stats_rule_runs_every_source_and_split_setting_on_the_demo_config(tmp_path):
    """Every source's samples are parsed and every split setting of the four papers is built."""
    _, res = build_targets(
        tmp_path,
        None,
        ["dataset_stats", "results/data/cnndm/oracle_labels.jsonl"],
        timeout=600,
        name="demo.yaml",
    )
    cfg = demo_config_absolute()
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    import pandas as pd

    src = pd.read_csv(tmp_path / "results/stats/sources.csv")
    assert set(src["source"]) == set(cfg["data"])
    part = pd.read_csv(tmp_path / "results/stats/partitions.csv")
    expected = {"adafedseleckd-domains", "adafedseleckd-iid", "adafedseleckd-noniid", "adafedseleckd-extreme",
                "adafedseleckd-long", "fedmcp-crosstask", "fedsum-cnndm-a0.1", "fedsum-wikihow-ainf",
                "fedsumm-csl-n4", "fedsumm-education-n4"}
    assert expected <= set(part["setting"])
    extreme = part[part.setting == "adafedseleckd-extreme"]
    assert set(extreme["client"]) == {"Academic", "Committee", "Product", "samsum"}
    fedsum = part[(part.setting == "fedsum-cnndm-a0.1") & (part.split == "train")]
    assert len(fedsum) == cfg["partitions"]["fedsum"]["num_clients"]
    assert fedsum["examples"].sum() == cfg["partitions"]["fedsum"]["total"] and (fedsum["examples"] > 0).all()
    labels = [json.loads(line) for line in (tmp_path / "results/data/cnndm/oracle_labels.jsonl").open()]
    assert labels and all(len(r["labels"]) == len(r["sentences"]) and 1 <= sum(r["labels"]) <= 3 for r in labels)
    figures = list((tmp_path / "results/stats/figures").glob("*.png"))
    assert len(figures) == part["setting"].nunique()


@pytest.mark.slow
def test_download_rule_offline_fails_fast_and_leaves_nothing(tmp_path):
    cfg = demo_config_absolute()
    cfg["data"]["samsum"] = {"source": "download", "download_timeout_s": 5}
    path = tmp_path / "dl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    import time

    t0 = time.time()
    res = subprocess.run(
        [SNAKEMAKE, "--cores", "1", "--configfile", str(path), "--directory", str(tmp_path),
         "--retries", "0", "results/data/samsum/records.jsonl"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert res.returncode != 0
    assert time.time() - t0 < 60
    log = (tmp_path / "logs/download_source/samsum.log").read_text()
    assert "samsum" in log.lower() and "data.samsum.local_dir" in log
    assert not (tmp_path / "resources" / "downloads" / "samsum").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_adafedseleckd_row_jobs_write_the_bytes_of_cell_jobs(tmp_path):
    """``cells_per_job: row`` (one process trains and evaluates AdaFedAvg, AdaFedKD and
    AdaFedSelectKD) gives every file a train job + an evaluation job per cell gives."""
    from compare_results import compare

    from fedrepro.papers.adafedseleckd.grid import CELL_FILES, ROW_METHODS

    targets = [f"results/adafedseleckd/domains/bart-large/{m}/all/seed~7/{f}"
               for m in ROW_METHODS for f in CELL_FILES]
    trees = {}
    for mode in ("cell", "row"):
        d = tmp_path / mode
        d.mkdir()
        text = TINY_CONFIG.format(samples=ROOT / "resources" / "samples" / "qmsum")
        _, res = build_targets(d, text + f"  cells_per_job: {mode}\n", targets, timeout=900)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert bool(re.search(r"rule adafedseleckd_row:", out)) == (mode == "row")
        trees[mode] = d / "results" / "adafedseleckd"
    assert compare(trees["cell"], trees["row"]) == []


@pytest.mark.e2e
@pytest.mark.slow
def test_adafedseleckd_cell_jobs_write_the_bytes_of_train_and_evaluate_jobs(tmp_path):
    """``cells_per_job: row`` trains and evaluates a cell outside the rows (here AdaFedProx, a
    Table V method) in one job (rule ``adafedseleckd_cell``); its files are the bytes a train job
    + an evaluation job give."""
    from compare_results import compare

    from fedrepro.papers.adafedseleckd.grid import CELL_FILES

    targets = [f"results/adafedseleckd/domains/bart-large/AdaFedProx/all/seed~7/{f}" for f in CELL_FILES]
    trees = {}
    for mode in ("cell", "row"):
        d = tmp_path / mode
        d.mkdir()
        text = TINY_CONFIG.format(samples=ROOT / "resources" / "samples" / "qmsum")
        _, res = build_targets(d, text + f"  cells_per_job: {mode}\n", targets, timeout=900)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert bool(re.search(r"rule adafedseleckd_cell:", out)) == (mode == "row")
        assert bool(re.search(r"rule (train|evaluate)_cell:", out)) == (mode == "cell")
        trees[mode] = d / "results" / "adafedseleckd"
    assert compare(trees["cell"], trees["row"]) == []


def test_paper_config_sets_every_key_the_demo_config_sets():
    """Snakemake merges ``--configfile config/paper.yaml`` *over* the Snakefile's demo config, so a
    key the demo sets and the paper config leaves out keeps its demo value in a paper run (this
    once gave the paper's BART cells the demo's 2 adapters of bottleneck 128).  Only the ``tiny``
    blocks may be demo-only: they are read for ``kind: tiny`` backbones alone."""
    demo, paper = configs()

    def demo_only(a, b, path=""):
        out = []
        for k, v in a.items():
            q = f"{path}.{k}" if path else k
            if k not in b:
                out.append(q)
            elif isinstance(v, dict) and isinstance(b[k], dict):
                out += demo_only(v, b[k], q)
        return out

    assert [q for q in demo_only(demo, paper) if not q.endswith(".tiny")] == []
    merged = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    deep_update(merged, paper)
    from fedrepro.grid import backbone_settings

    got = {b: (backbone_settings(merged, b)["adapter_top_k"], backbone_settings(merged, b)["bottleneck"])
           for b in ("bart-large", "bart-base", "led-large", "longt5")}
    assert got == {"bart-large": (6, 2048), "bart-base": (3, 1536), "led-large": (6, 2048),
                   "longt5": (6, 1536)}
