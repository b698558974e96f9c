"""The paper-scale rehearsal: the reduced config, the covering cells, the backbone fallback, the
report's numbers (fedrepro.rehearsal)."""

from __future__ import annotations

import copy
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedrepro.io import InputError, read_json, write_json_atomic
from fedrepro.models.backbones import builds_locally, fetch_or_shape
from fedrepro.papers.adafedseleckd import grid as ada
from fedrepro.papers.adafedseleckd.methods import METHODS as ADA_METHODS
from fedrepro.papers.fedsum import grid as fedsum_grid
from fedrepro.papers.fedsumm import grid as fedsumm_grid
from fedrepro.rehearsal import plan, report

ROOT = Path(__file__).resolve().parents[1]


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


REHEARSAL_OVERLAY = yaml.safe_load((ROOT / "config/rehearsal.yaml").read_text())


def _paper_rehearsal() -> dict:
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    over = yaml.safe_load((ROOT / "config/rehearsal.yaml").read_text())
    return plan.apply(_merge(paper, over), ROOT)


def test_apply_reduces_only_what_the_rehearsal_reduces():
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config = _paper_rehearsal()
    assert config["seeds"] == paper["seeds"][:1]
    for p in plan.PAPERS:
        assert config[p]["train"]["rounds"] == 2
        # paper's batch sizes, lengths, lr are untouched
        assert config[p]["train"]["batch_size"] == paper[p]["train"]["batch_size"]
    assert config["adafedseleckd"]["max_source_length"] == paper["adafedseleckd"]["max_source_length"] == 1024
    gen, pgen = config["adafedseleckd"]["generation"], paper["adafedseleckd"]["generation"]
    assert gen["max_new_tokens"] == 8 and gen["min_new_tokens"] == 8
    assert {k: v for k, v in gen.items() if k not in ("max_new_tokens", "min_new_tokens")} == {
        k: v for k, v in pgen.items() if k not in ("max_new_tokens", "min_new_tokens")}
    assert config["fedsumm"]["clients"] == 2  # Fig. 5(b)'s smallest N on this machine (config/rehearsal.yaml); paper.yaml alone: 50
    assert config["fedsumm"]["server_state"] == paper["fedsumm"]["server_state"]  # disk, waves: spooled
    assert config["partitions"]["fedsum"]["num_clients"] == 20
    assert config["partitions"]["fedsum"]["total"] == paper["partitions"]["fedsum"]["total"] == 2000  # fedsum_total: paper
    assert all(d["source"] == "samples" and d["samples_dir"] == f"samples/{n}"
               for n, d in config["data"].items())
    assert all(b.get("fallback") == "shape" for b in config["backbones"].values())
    assert config["fedsumm"]["backbone"]["fallback"] == "shape"
    assert config["rehearsal_original"]["seeds"] == paper["seeds"]


def test_rehearsal_jobs_declare_gpu_memory_so_cells_share_a_gpu():
    from fedrepro import grid as wf
    from fedrepro import gpu_slots

    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config = _paper_rehearsal()
    for name in config["backbones"]:
        for job in ("train", "evaluate"):
            assert wf.gpu_mem_mb(wf.job_resources(config, name, job)) == 16000, (name, job)
            # the rest of the declared resources is the paper's, but for this machine's host
            # memory (config/rehearsal.yaml, test_rehearsal_jobs_declare_their_measured_host_memory)
            declared = ((paper["backbones"][name].get("resources") or {}).get(job) or {})
            here = ((REHEARSAL_OVERLAY["backbones"].get(name, {}).get("resources") or {}).get(job) or {})
            assert set(here) <= {"mem_mb", "mem_mb_by_method"}
            assert {k: v for k, v in wf.job_resources(config, name, job).items()
                    if k != "gpu_mem_mb"} == {**wf.JOB_RESOURCES[job], **declared, **here}
    assert wf.gpu_mem_mb(fedsumm_grid.job_resources(config, "train")) == 16000
    # the paper config alone claims whole GPUs
    assert all(wf.gpu_mem_mb(wf.job_resources(paper, n, "train")) == 0 for n in paper["backbones"])
    # on an 80 GB GPU five such jobs fit beside one another (a whole-GPU job would wait)
    h100 = [gpu_slots.Gpu("0", 81559)]
    claims = []
    for pid in range(5):
        assert gpu_slots.choose_devices(h100, claims, 1, 16000) == ["0"]
        claims.append(gpu_slots.Claim(("0",), 16000, pid))
    assert gpu_slots.choose_devices(h100, claims, 1, 16000) is None  # the sixth waits
    assert gpu_slots.choose_devices(h100, claims[:1], 1, None) is None  # so does a whole-GPU job
    # a user's own declaration wins; 0 leaves the config's resources as they are
    over = yaml.safe_load((ROOT / "config/rehearsal.yaml").read_text())
    mine = _merge(paper, over)
    mine["backbones"]["bart-large"]["resources"]["train"]["gpu_mem_mb"] = 30000
    mine = plan.apply(mine, ROOT)
    assert wf.gpu_mem_mb(wf.job_resources(mine, "bart-large", "train")) == 30000
    zero = _merge(paper, over)
    zero["rehearsal_settings"]["gpu_mem_mb"] = 0
    zero = plan.apply(zero, ROOT)
    assert all(wf.gpu_mem_mb(wf.job_resources(zero, n, "train")) == 0 for n in zero["backbones"])


def test_rehearsal_jobs_declare_their_measured_host_memory():
    """On this 2-core CPU one-thread cells run two at a time where their memory fits: make
    rehearse hands Snakemake --resources mem_mb (85 % of the machine's RAM) and each job declares
    its measured peak -- per method where a backbone's methods differ severalfold
    (fedrepro.grid.job_mem_mb): FedMCP's full fine-tuning, FedSum's SCAFFOLD."""
    from fedrepro import grid as wf

    config = _paper_rehearsal()
    assert all(config[p]["threads_per_cell"] == 1 for p in plan.PAPERS)
    assert wf.job_mem_mb(config, "roberta-base", "train", "FedAvg-FT") == 19000
    assert wf.job_mem_mb(config, "roberta-base", "train", "FedMCP") == 3000
    assert wf.job_mem_mb(config, "roberta-base", "evaluate", "FedAvg-FT") == 4000
    assert wf.job_mem_mb(config, "bert-base", "train", "SCAFFOLD") == 14000
    assert wf.job_mem_mb(config, "bert-base", "train", "FedAvg") == 9000
    assert wf.job_mem_mb(config, "bert-base", "train") == 9000
    assert fedsumm_grid.job_resources(config, "train")["mem_mb"] == 14500
    # the plan (the report's "declared MB") carries the method's value
    by = {(c["paper"], c["method"]): c for c in plan.cells(config)}
    assert by[("fedsum", "SCAFFOLD")]["jobs"]["train"]["resources"]["mem_mb"] == 14000
    assert by[("fedsum", "FedSum")]["jobs"]["train"]["resources"]["mem_mb"] == 9000
    assert by[("fedmcp", "FedAvg-FT")]["jobs"]["train"]["resources"]["mem_mb"] == 19000
    assert by[("fedmcp", "FedAvg-FT")]["jobs"]["evaluate"]["resources"]["mem_mb"] == 4000
    assert "mem_mb_by_method" not in by[("fedmcp", "FedMCP")]["jobs"]["train"]["resources"]
    # the paper config alone: one value per backbone and job
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    assert wf.job_mem_mb(paper, "bert-base", "train", "SCAFFOLD") == 32000
    bad = copy.deepcopy(config)
    bad["backbones"]["bert-base"]["resources"]["train"]["mem_mb_by_method"] = ["SCAFFOLD"]
    with pytest.raises(InputError, match="bert-base.resources.train.mem_mb_by_method"):
        wf.job_mem_mb(bad, "bert-base", "train", "SCAFFOLD")
    bad["backbones"]["bert-base"]["resources"]["train"]["mem_mb_by_method"] = {"SCAFFOLD": "22G"}
    with pytest.raises(InputError, match="mem_mb of SCAFFOLD"):
        wf.job_mem_mb(bad, "bert-base", "train", "SCAFFOLD")
    # make rehearse passes the budget (empty REHEARSE_MEM_MB: no limit)
    text = (ROOT / "Makefile").read_text()
    assert "$(if $(REHEARSE_MEM_MB),--resources mem_mb=$(REHEARSE_MEM_MB))" in text
    assert "/ 1024 * 0.85" in text


def test_paper_config_alone_keeps_table_one_clients():
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    paper["rehearsal"] = True
    config = plan.apply(paper, ROOT)
    assert config["fedsumm"]["clients"] == 50
    assert {c["setting"] for c in plan.cells(config) if c["paper"] == "fedsumm"} == {"csl/n50"}


def test_configured_data_paths_become_absolute(tmp_path):
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    paper["rehearsal"] = True
    paper["data"]["qmsum"].update(source="local", local_dir="data/qmsum")
    config = plan.apply(paper, tmp_path)
    assert config["data"]["qmsum"]["local_dir"] == str((tmp_path / "data/qmsum").resolve())
    assert config["data"]["cnndm"]["source"] == "download"


def test_cover_runs_every_method_backbone_and_model():
    config = _paper_rehearsal()
    cells = plan.cells(config)
    by = {}
    for c in cells:
        by.setdefault(c["paper"], []).append(c)
    a = by["adafedseleckd"]
    main = [c for c in a if c["setting"].startswith("domains/") and "~" not in c["method"]]
    assert {c["method"] for c in main} >= set(ADA_METHODS)
    assert {c["backbone"] for c in a} == {"bart-large", "bart-base", "led-large", "longt5"}
    # the main grid: 5 methods on bart-large, AdaFedSelectKD on the two others; then one cell per
    # code path the other experiments add: Table V's 3 methods, hard KD, post-addition, extreme,
    # one tau, iid, noniid, long (LongT5), sampling
    assert len(a) == 5 + 2 + 11
    assert {c["method"] for c in a} >= {"AdaFedOPT", "AdaFedProx", "AdaFedNova", "AdaFedHardKD",
                                        "AdaFedSelectKD~post"}
    assert {c["setting"].split("/")[0] for c in a} == {"domains", "iid", "noniid", "extreme", "long"}
    assert {c["method"] for c in by["fedmcp"]} == set(config["fedmcp"]["methods"])
    fs = by["fedsum"]
    assert set(config["fedsum"]["methods"]) | {"FedSum-depth"} <= {c["method"] for c in fs}
    # every dataset's split is built: Table 1's trains every method, the others are data jobs
    # under fedsum_settings: first (test_fedsum_settings_first_trains_table_one_and_still_builds_every_split)
    built = {c["setting"] for c in fs} | {d.split("/")[3] for d in plan.data_files(config) if "/fedsum/data/" in d}
    assert {fedsum_grid.setting_name(config, ds, float(config["fedsum"]["alpha"]))
            for ds in config["fedsum"]["datasets"]} < built
    fsm = by["fedsumm"]
    assert {(c["backbone"], c["method"]) for c in fsm} == {
        (m, r) for m in fedsumm_grid.MODELS for r in fedsumm_grid.REGIMES}
    assert all(c["setting"].endswith(f"/n{config['fedsumm']['clients']}") for c in fsm)
    # every cell's files are produced by the workflow's rules (checked by the dry run below)
    assert all(f.startswith("results/") for c in cells for f in c["files"])


def test_fedsum_settings_first_trains_table_one_and_still_builds_every_split():
    """``fedsum_settings: first`` (config/rehearsal.yaml, a 2-core CPU): FedSum's cells are Table
    1's setting only -- every method and the depth ablation -- while the client data of the other
    datasets and of the uniform split (their partition rule, oracle labels, test set) is still
    built: the rehearse rule asks for it.  ``every`` (the GPU script's overlay) trains FedSum on
    each of them too."""
    config = _paper_rehearsal()
    f = config["fedsum"]
    assert config["rehearsal_settings"]["fedsum_settings"] == "first"
    table1 = fedsum_grid.setting_name(config, f["datasets"][0], float(f["alpha"]))
    others = {fedsum_grid.setting_name(config, ds, float(f["alpha"])) for ds in f["datasets"][1:]}
    others.add(fedsum_grid.setting_name(config, fedsum_grid.SWEEP_DATASET, float(f["uniform_alpha"])))
    assert len(others) == 4 and table1 not in others
    fs = [c for c in plan.cells(config) if c["paper"] == "fedsum"]
    assert {c["setting"] for c in fs} == {table1}
    assert sorted(c["method"] for c in fs) == sorted(f["methods"] + f["ablation"])
    data = plan.data_files(config)
    assert {fedsum_grid.data_dir(s, 1) for s in others} <= set(data)
    assert plan.document(config)["data_files"] == data

    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    over = yaml.safe_load((ROOT / "config/rehearsal.yaml").read_text())
    over["rehearsal_settings"]["fedsum_settings"] = "every"
    every = plan.apply(_merge(paper, over), ROOT)
    fs_every = [c for c in plan.cells(every) if c["paper"] == "fedsum"]
    assert {c["setting"] for c in fs_every} == {table1} | others
    assert len(fs_every) == len(fs) + 4
    assert {c["method"] for c in fs_every if c["setting"] in others} == {"FedSum"}
    assert not any("/fedsum/data/" in d for d in plan.data_files(every))  # the cells' inputs


def test_cross_runs_methods_times_backbones():
    config = _paper_rehearsal()
    config["rehearsal_settings"]["coverage"] = "cross"
    a = [c for c in plan.cells(config) if c["paper"] == "adafedseleckd"]
    # 5 methods x 3 backbones, and every other experiment cell of the first seed (Table V 3,
    # post-addition 1, taus 4, Figs. 6/7/8/9/10 3 each, hard KD 1)
    assert len(a) == 5 * 3 + 3 + 1 + 4 + 5 * 3 + 1


def test_rehearsal_cells_carry_limits_normal_cells_do_not():
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    normal = ada.make_cell(paper, "domains", "bart-large", "AdaFedAvg", "all", 1)
    assert "rehearsal" not in normal
    reh = ada.make_cell(_paper_rehearsal(), "domains", "bart-large", "AdaFedAvg", "all", 1)
    assert reh["rehearsal"] == {"examples_per_client": 2, "eval_examples": 2}
    assert reh["train"]["rounds"] == 2 and reh["max_source_length"] == 1024


# -- precision: auto ------------------------------------------------------------------------
def _emulated():
    return False, "CPU (AVX2) without AVX512-BF16 or AMX"


def _native():
    return True, "a CUDA device is visible"


def _never():
    raise AssertionError("the pinned answer must be used, not a new probe")


def test_precision_auto_decides_once_and_pins_it_for_the_processes_below():
    env: dict[str, str] = {}
    assert plan.resolve_precision("auto", env, _emulated) == {
        "setting": "auto", "ran": "fp32", "reason": "CPU (AVX2) without AVX512-BF16 or AMX"}
    assert env == {plan.PRECISION_ENV: "fp32"}
    # a job that re-reads the workflow under it decides as its parent did, whatever its own device
    assert plan.resolve_precision("auto", env, _never) == {
        "setting": "auto", "ran": "fp32", "reason": f"{plan.PRECISION_ENV}=fp32 in the environment"}
    env = {}
    assert plan.resolve_precision("auto", env, _native) == {
        "setting": "auto", "ran": "paper", "reason": "bf16 is native here: a CUDA device is visible"}
    assert env == {plan.PRECISION_ENV: "paper"}
    # by default the process's own environment (Snakemake's: its jobs inherit it; conftest undoes it)
    os.environ.pop(plan.PRECISION_ENV, None)
    plan.resolve_precision("auto", probe=_emulated)
    assert os.environ[plan.PRECISION_ENV] == "fp32"
    # a value set beforehand wins (a cluster whose submitting node has no GPU)
    assert plan.resolve_precision("auto", {plan.PRECISION_ENV: "paper"}, _emulated)["ran"] == "paper"
    for setting in ("paper", "fp32"):  # explicit settings neither probe nor pin
        env = {plan.PRECISION_ENV: "fp32" if setting == "paper" else "paper"}
        assert plan.resolve_precision(setting, env, _never) == {
            "setting": setting, "ran": setting, "reason": f"rehearsal_settings.precision: {setting}"}
        assert len(env) == 1
    with pytest.raises(InputError, match=plan.PRECISION_ENV + ".*'bf16'"):
        plan.resolve_precision("auto", {plan.PRECISION_ENV: "bf16"}, _emulated)


def _precision_rehearsal(probe, **settings) -> dict:
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    over = yaml.safe_load((ROOT / "config/rehearsal.yaml").read_text())
    over["rehearsal_settings"].update(settings)
    return plan.apply(_merge(paper, over), ROOT, environ={}, probe=probe)


def test_precision_auto_runs_fp32_cells_where_bf16_is_emulated_and_the_paper_s_where_native():
    from fedrepro.papers.fedmcp import grid as mcp
    from fedrepro.precision import Precision

    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    assert REHEARSAL_OVERLAY["rehearsal_settings"]["precision"] == "auto"  # this CPU machine's overlay

    def cells(config):
        return {"adafedseleckd": ada.make_cell(config, "domains", "bart-large", "AdaFedSelectKD", "all", 1),
                "fedmcp": mcp.make_cell(config, "roberta-base", "FedMCP", 1),
                "fedsum": fedsum_grid.make_fedsum_cell(config, "fedsum-cnndm-a0.1", "FedSum", 1),
                "fedsumm": fedsumm_grid.make_cell(config, "csl", 2, "bart", "FedSUMM", 1)}

    own = {p: {k: paper[p].get(k, "fp32") for k in ("precision", "frozen_dtype")} for p in plan.PAPERS}
    changed = {p: {k: v for k, v in keys.items() if v != "fp32"} for p, keys in own.items()}
    changed = {p: keys for p, keys in changed.items() if keys}
    assert set(changed) == {"adafedseleckd", "fedmcp"}  # the paper config's bf16 papers

    emulated = _precision_rehearsal(_emulated)
    assert emulated["rehearsal_precision"] == {"setting": "auto", "ran": "fp32", "reason": _emulated()[1],
                                               "fp32_instead_of": changed}
    for p, cell in cells(emulated).items():
        assert Precision.from_cell(cell).is_default, p  # the cell the job trains: fp32, no keys
        assert "precision" not in cell and "frozen_dtype" not in cell
    native = _precision_rehearsal(_native)
    assert native["rehearsal_precision"]["ran"] == "paper" and native["rehearsal_precision"]["fp32_instead_of"] == {}
    for p, cell in cells(native).items():
        assert Precision.from_cell(cell).record() == own[p], p
    # paper: the paper's own, whatever the machine; fp32: fp32, whatever the machine
    for p, cell in cells(_precision_rehearsal(_never, precision="paper")).items():
        assert Precision.from_cell(cell).record() == own[p], p
    forced = _precision_rehearsal(_never, precision="fp32")
    assert forced["rehearsal_precision"]["fp32_instead_of"] == changed
    assert all(Precision.from_cell(c).is_default for c in cells(forced).values())
    # a config without one paper's section: the others are still changed
    paper_less = _merge(paper, yaml.safe_load((ROOT / "config/rehearsal.yaml").read_text()))
    del paper_less["adafedseleckd"]
    partial = plan.apply(paper_less, ROOT, environ={}, probe=_emulated)
    assert partial["rehearsal_precision"]["fp32_instead_of"] == {"fedmcp": changed["fedmcp"]}
    # the plan carries the decision to the report
    assert plan.document(emulated)["precision"] == emulated["rehearsal_precision"]


def test_report_says_which_papers_ran_fp32_and_why(tmp_path):
    entry = _fake_cell(tmp_path)
    decision = {"setting": "auto", "ran": "fp32", "reason": "CPU (AVX2) without AVX512-BF16 or AMX",
                "fp32_instead_of": {"fedmcp": {"precision": "bf16-mixed", "frozen_dtype": "bf16"},
                                    "adafedseleckd": {"precision": "bf16-mixed"}}}
    plan_doc = {"settings": plan.DEFAULTS, "cells": [entry], "full_rounds": {"p": 10}, "grids": {},
                "backbone_dirs": {}, "machine": "test", "precision": decision}
    write_json_atomic(tmp_path / "plan.json", plan_doc)
    assert report.main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert ("Precision: **fp32 in place of the paper config's** adafedseleckd: precision bf16-mixed; "
            "fedmcp: frozen_dtype bf16, precision bf16-mixed (`rehearsal_settings.precision: auto`; "
            "CPU (AVX2) without AVX512-BF16 or AMX)") in md
    rep = read_json(tmp_path / "report.json")
    assert rep["precision"] == decision
    assert report.summary_lines(rep)[1] == (
        "  precision: fp32 in place of adafedseleckd, fedmcp's own (CPU (AVX2) without AVX512-BF16 or AMX)")
    # the paper's own precision: said in the report, nothing added to the verdict
    for kept in ({**decision, "ran": "paper", "fp32_instead_of": {}}, None):
        write_json_atomic(tmp_path / "plan.json", {**plan_doc, "precision": kept})
        report.main([str(tmp_path)])
        assert "Precision: each paper's own" in (tmp_path / "report.md").read_text()
        assert len(report.summary_lines(read_json(tmp_path / "report.json"))) == 1


@pytest.mark.parametrize("key,value", [("rounds", 0), ("coverage", "all"), ("data", "hub"),
                                       ("typo", 1), ("examples_per_client", True),
                                       ("gpu_mem_mb", -1), ("gpu_mem_mb", "16G"),
                                       ("fedsum_settings", "all"), ("precision", "bf16")])
def test_bad_settings_name_the_key(key, value):
    config = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config["rehearsal_settings"][key] = value
    with pytest.raises(InputError, match="rehearsal_settings"):
        plan.apply(config, ROOT)


def test_rehearsal_dry_run_resolves_every_cell(tmp_path):
    """The whole rehearsal DAG resolves from the paper config (no job runs), in a scratch
    directory (the repository's own results/rehearsal/ may hold a finished rehearsal)."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "-n", "--quiet", "rules",
         "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", str(ROOT / "config/paper.yaml"), str(ROOT / "config/rehearsal.yaml")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    for rule in ("rehearse", "rehearsal_samples", "train_cell", "fedmcp_train_cell",
                 "fedsum_train_cell", "fedsumm_row", "backbone"):
        assert rule in out, rule


def test_every_cell_rule_declares_its_methods_memory(tmp_path):
    """mem_mb_by_method reaches every paper's cell jobs in the DAG (not only the plan's table):
    AdaFedSelecKD's train and evaluate jobs (a variant such as AdaFedSelectKD~post declares as
    its method), FedMCP's and FedSum's."""
    from fedrepro import grid as wf

    config = _paper_rehearsal()
    config["backbones"]["bart-large"]["resources"]["train"]["mem_mb_by_method"] = {"AdaFedSelectKD": 7777}
    assert wf.job_mem_mb(config, "bart-large", "train", "AdaFedSelectKD~post") == 7777
    assert wf.job_mem_mb(config, "bart-large", "train", "AdaFedAvg") == \
        config["backbones"]["bart-large"]["resources"]["train"]["mem_mb"]
    over = tmp_path / "over.yaml"
    over.write_text(yaml.safe_dump({"backbones": {
        "bart-large": {"resources": {"train": {"mem_mb_by_method": {"AdaFedSelectKD": 7777}},
                                     "evaluate": {"mem_mb_by_method": {"AdaFedKD": 6666}}}},
        "bert-base": {"resources": {"train": {"mem_mb_by_method": {"FedProx": 5555}}}}}}))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "-n",
         "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", str(ROOT / "config/paper.yaml"), str(ROOT / "config/rehearsal.yaml"), str(over)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = {}  # (rule, method) -> mem_mb, bart-large's and Table 1's setting's jobs
    for block in re.split(r"\n(?=(?:local)?rule )", proc.stdout):
        rule = re.match(r"(?:local)?rule (\w+):", block)
        mem = re.search(r"\bmem_mb=(\d+)", block)
        wildcards = dict(re.findall(r"(\w+)=([^,\s]+)", (re.search(r"wildcards: (.*)", block) or [""])[0]))
        method = wildcards.get("method") or wildcards.get("fsum_method")
        if rule and mem and method and wildcards.get("backbone", "bart-large") == "bart-large" \
                and wildcards.get("fsum_setting", "fedsum-cnndm-a0.1") == "fedsum-cnndm-a0.1":
            jobs[(rule.group(1), method)] = int(mem.group(1))
    assert jobs[("train_cell", "AdaFedSelectKD")] == 7777
    assert jobs[("train_cell", "AdaFedSelectKD~post")] == 7777
    assert jobs[("train_cell", "AdaFedAvg")] == config["backbones"]["bart-large"]["resources"]["train"]["mem_mb"]
    assert jobs[("evaluate_cell", "AdaFedKD")] == 6666
    assert jobs[("fedsum_train_cell", "FedProx")] == 5555
    assert jobs[("fedsum_train_cell", "SCAFFOLD")] == 14000


# -- backbone fallback ----------------------------------------------------------------------
def test_fetch_or_shape_falls_back_only_in_a_rehearsal(caplog):
    calls = []

    def prepare(settings):
        calls.append(settings["kind"])
        if settings["kind"] == "hub":
            raise InputError("cannot reach the hub")
        return Path("built")

    hub = {"name": "bart-large", "kind": "hub", "hub_id": "facebook/bart-large", "revision": "main"}
    with pytest.raises(InputError):
        fetch_or_shape(hub, prepare)  # a real run never gets random weights
    calls.clear()
    with caplog.at_level(logging.WARNING):
        assert fetch_or_shape({**hub, "fallback": "shape"}, prepare) == Path("built")
    assert calls == ["hub", "shape"]
    assert "random weights" in caplog.text and "facebook/bart-large" in caplog.text
    assert builds_locally({**hub, "fallback": "shape"}) and not builds_locally(hub)


# -- the report -----------------------------------------------------------------------------
def _fake_cell(root: Path, clients: int = 3, n_train: int = 10) -> dict:
    cell_dir = "results/x/cellA"
    client_data = {}
    for i in range(clients):
        d = root / f"results/data/c{i}"
        d.mkdir(parents=True)
        (d / "train.jsonl").write_text("{}\n" * n_train)
        client_data[f"c{i}"] = f"results/data/c{i}"
    rounds = [
        {"round": r, "seconds": 10.0, "clients": [
            {"partition_id": i, "seconds_steps": 2.0, "seconds_per_step": 2.0} for i in range(clients)]}
        for r in (1, 2)
    ]
    write_json_atomic(root / cell_dir / "provenance.json", {
        "cell": {"clients": list(client_data), "client_data": client_data,
                 "train": {"batch_size": 4, "local_epochs": 1}},
        "engine": "simulation", "machine": {"cuda": False}, "wall_time_s": 25.0,
        "timing": {"rounds": rounds, "peak_rss_mb": 900.0},
        "bytes_per_round": [{"round": 1, "down": 100, "up": 50}, {"round": 2, "down": 100, "up": 50}],
        "parameters": {"total": 10},
    })
    write_json_atomic(root / cell_dir / "scores.json", {})
    bench = root / "benchmarks/train/a.tsv"
    bench.parent.mkdir(parents=True)
    bench.write_text("s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
                     "30.0\t0:00:30\t1500.0\t0\t0\t0\t0\t0\t0\t20\n")
    return {"paper": "p", "method": "M", "backbone": "B", "setting": "s", "cell": cell_dir,
            "files": [f"{cell_dir}/provenance.json", f"{cell_dir}/scores.json"],
            "jobs": {"train": {"rule": "train", "log": "logs/train/a.log", "benchmark": "benchmarks/train/a.tsv",
                               "resources": {"mem_mb": 1000, "runtime": 60}, "shared_by": 1}}}


def test_report_measures_and_projects(tmp_path):
    entry = _fake_cell(tmp_path)
    settings = {**plan.DEFAULTS, "examples_per_client": 2}
    row = report.measure_cell(entry, tmp_path, settings, full_rounds=10)
    assert row["status"] == "ok"
    # no round log in this fake cell: every check says why it did not judge (no warn)
    assert {c["status"] for c in row["checks"].values()} == {"skip"} and "warnings" not in row
    assert row["round_s"] == [10.0, 10.0] and row["step_s"] == 2.0
    assert row["effective_batch"] == 2 and row["batch_size"] == 4
    assert row["peak_rss_mb"] == 1500.0
    assert row["bytes_per_round"] == 150
    p = row["projection"]
    # 3 clients x ceil(10 / 4) = 9 steps per round, each 2 s x (4 / 2) = 4 s; overhead 10 - 6 = 4 s
    assert p["steps_per_round"] == 9 and p["step_s_at_paper_batch"] == 4.0
    assert p["round_s"] == 9 * 4.0 + 4.0
    assert math.isclose(p["train_hours"], (10 * 40.0 + (25.0 - 20.0)) / 3600)
    assert p["runtime_covered"] is True  # 6.75 min <= 60
    assert p["memory_covered"] is False  # 1500 MB > 1000 MB declared
    hours = report.table_hours([row], {"p": {"t1": ["results/x/B/M/seed~1", "results/x/B/M/seed~2"]}})
    assert hours[0]["cells"] == 2 and math.isclose(hours[0]["train_hours"], round(2 * p["train_hours"], 2))


def test_report_takes_a_pooled_trainer_s_batch_from_its_round_log(tmp_path):
    """FedSUMM's ``all`` and AdaFedSelecKD's AdaCentralized pool every client's
    ``examples_per_client``: their measured step ran at that pooled batch, not at 2."""
    entry = _fake_cell(tmp_path)
    settings = {**plan.DEFAULTS, "examples_per_client": 2}
    write_json_atomic(tmp_path / entry["cell"] / "train_log.json",
                      {"rounds": [{"round": 1, "clients": [{"client": "pooled", "num_examples": 3}]}]})
    row = report.measure_cell(entry, tmp_path, settings, full_rounds=10)
    assert row["effective_batch"] == 3 and row["batch_size"] == 4
    assert row["projection"]["step_s_at_paper_batch"] == pytest.approx(2.0 * 4 / 3)
    write_json_atomic(tmp_path / entry["cell"] / "train_log.json",  # more than a batch: the batch
                      {"rounds": [{"round": 1, "clients": [{"num_examples": 2}, {"num_examples": 9}]}]})
    assert report.measure_cell(entry, tmp_path, settings, full_rounds=10)["effective_batch"] == 4


def test_report_gives_flops_and_mfu_from_the_counted_step_and_the_gpu(tmp_path):
    from fedrepro.io import read_json

    entry = _fake_cell(tmp_path)
    prov_path = tmp_path / entry["cell"] / "provenance.json"
    prov = read_json(prov_path)
    row = report.measure_cell(entry, tmp_path, plan.DEFAULTS, full_rounds=10)
    assert row["flops_per_step"] is None and row["mfu"] is None and row["device"] == "cpu"
    prov["timing"]["rounds"][0]["clients"][1]["flops_per_step"] = 3.0e12
    for r in prov["timing"]["rounds"]:
        for c in r["clients"]:
            c["peak_gpu_mb"] = 100.0
    prov["machine"] = {"cuda": True, "gpu": "NVIDIA H100 80GB HBM3"}
    prov["cell"]["precision"] = "bf16-mixed"
    write_json_atomic(prov_path, prov)
    row = report.measure_cell(entry, tmp_path, plan.DEFAULTS, full_rounds=10)
    # 3 TFLOP per 2 s step = 1.5 TFLOP/s of the H100's 989.4 bf16 dense peak
    assert row["device"] == "cuda" and row["precision"] == "bf16-mixed"
    assert row["flops_per_step"] == 3.0e12 and row["tflops_per_s"] == pytest.approx(1.5)
    assert row["mfu"] == pytest.approx(1.5 / 989.4) == row["mfu_vs_bf16_peak"]
    prov["cell"].pop("precision")  # fp32: against the FMA peak, and the bf16 one beside it
    write_json_atomic(prov_path, prov)
    row = report.measure_cell(entry, tmp_path, plan.DEFAULTS, full_rounds=10)
    assert row["mfu"] == pytest.approx(1.5 / 66.9)
    assert row["mfu_vs_bf16_peak"] == pytest.approx(1.5 / 989.4)
    assert "2.2 % (0.2 %)" in report._mfu_text(row)
    # a cell whose process found its bf16 emulated (provenance precision.emulated_bf16) says why
    assert row["emulated_bf16"] is None
    prov["precision"] = {"precision": "bf16-mixed", "frozen_dtype": "fp32", "emulated_bf16": "a V100"}
    write_json_atomic(prov_path, prov)
    assert report.measure_cell(entry, tmp_path, plan.DEFAULTS, full_rounds=10)["emulated_bf16"] == "a V100"


def test_report_names_the_failure(tmp_path):
    entry = _fake_cell(tmp_path)
    (tmp_path / entry["cell"] / "scores.json").unlink()
    log = tmp_path / "logs/train/a.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 1\nTraceback (most recent call last):\nRuntimeError: CUDA out of memory\n")
    row = report.measure_cell(entry, tmp_path, plan.DEFAULTS, full_rounds=10)
    assert row["status"] == "failed"
    assert "CUDA out of memory" in row["reason"] and "logs/train/a.log" in row["reason"]
    plan_doc = {"settings": plan.DEFAULTS, "cells": [entry], "full_rounds": {"p": 10}, "grids": {},
                "backbone_dirs": {}, "machine": "test"}
    write_json_atomic(tmp_path / "plan.json", plan_doc)
    assert report.main([str(tmp_path)]) == 1
    md = (tmp_path / "report.md").read_text()
    assert "0 of 1 cells ok" in md and "CUDA out of memory" in md
    assert read_json(tmp_path / "report.json")["summary"] == {"cells": 1, "ok": 0, "warn": 0, "failed": 1}


def test_samples_rule_writes_where_the_plan_points():
    text = (ROOT / "rules/rehearsal.smk").read_text()
    assert f'directory("{plan.SAMPLES_DIR}/{{source}}")' in text


def test_the_rehearsal_starts_its_long_poles_first():
    """config/rehearsal.yaml's priorities (fedrepro.grid.rule_priority): FedSUMM's rows before
    FedSum's cells and AdaFedSelecKD's training (LED-large's) before everything else (0); a bad
    value names its key."""
    from fedrepro import grid

    cfg = yaml.safe_load((Path(__file__).parents[1] / "config" / "rehearsal.yaml").read_text())
    data = ("rehearsal_samples", "download_source", "prepare_source", "partition_setting", "oracle_labels",
            "client_files", "fedsum_client_data", "backbone", "fedsum_backbone", "fedsumm_backbone")
    assert min(grid.rule_priority(cfg, r) for r in data) > grid.rule_priority(cfg, "fedsumm_row")
    assert (grid.rule_priority(cfg, "fedsumm_row") == grid.rule_priority(cfg, "fedsumm_federated_row")
            > grid.rule_priority(cfg, "fedsum_train_cell") == grid.rule_priority(cfg, "train_cell")
            > grid.rule_priority(cfg, "fedmcp_train_cell") == grid.rule_priority(cfg, "evaluate_cell") == 0)
    # every rule named there reads its priority from the config (a name no rule reads does nothing)
    rules_text = "".join(p.read_text() for p in (ROOT / "rules").glob("*.smk"))
    for rule in cfg["priority"]:
        assert f'priority: wf.rule_priority(config, "{rule}")' in rules_text, rule
    assert grid.rule_priority({}, "fedsumm_row") == 0  # the paper config: Snakemake's default
    with pytest.raises(InputError, match="priority.fedsum_train_cell"):
        grid.rule_priority({"priority": {"fedsum_train_cell": "high"}}, "fedsum_train_cell")
