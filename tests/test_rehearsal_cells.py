"""One rehearsal cell per paper at the paper models' true dimensions, through the workflow.

Marked ``rehearsal``: about ten minutes on 2 CPU cores, so not part of ``make test`` (CI) --
``make rehearse`` runs it (``FEDREPRO_REHEARSAL=1``) after the full rehearsal, pointing
``FEDREPRO_REHEARSAL_DIR`` at the repository so that Snakemake finds the four cells done and the
test checks the rehearsal's own outputs; without it the cells run in a scratch working directory.
Either way: ``config/paper.yaml`` + ``config/rehearsal.yaml``, generated
samples through the real parsers, ``kind: shape`` backbones (no hub here), the paper's clients,
batch sizes, sequence lengths and adapters, two rounds of a few steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedrepro.models.shapes import ARCHITECTURES

pytestmark = pytest.mark.rehearsal

ROOT = Path(__file__).resolve().parents[1]
WORK = "results/rehearsal"  # the rehearsal's working directory inside a repository
# make rehearse's config: the Snakefile's own `configfile: config/config.yaml` is relative to the
# working directory, which --directory moves, so it is named here; without it the backbones'
# params differ and every cell of make rehearse's own run would be retrained by these tests
CONFIGS = [str(ROOT / f"config/{name}.yaml") for name in ("config", "paper", "rehearsal")]
# (Snakemake ignores the Snakefile's ``workdir:`` when --directory is given: the tests pass the
# rehearsal's working directory itself)

# FedSUMM's N in the rehearsal on this machine (config/rehearsal.yaml; the GPU script's overlay sets 10)
FEDSUMM_N = yaml.safe_load((ROOT / "config/rehearsal.yaml").read_text())["fedsumm"]["clients"]

CELLS = {
    # paper: (cell folder, backbone folder, hub id of its architecture)
    "adafedseleckd": ("results/adafedseleckd/domains/bart-base/AdaFedSelectKD/all/seed~1",
                      "results/backbones/bart-base", "facebook/bart-base"),
    "fedmcp": ("results/fedmcp/crosstask/roberta-base/FedMCP/seed~1",
               "results/backbones/roberta-base", "FacebookAI/roberta-base"),
    "fedsum": ("results/fedsum/fedsum-cnndm-a0.1/bert-base/FedSum/seed~1",
               "results/backbones/bert-base", "google-bert/bert-base-uncased"),
    "fedsumm": (f"results/fedsumm/csl/n{FEDSUMM_N}/bart/FedSUMM/seed~1",
                "results/fedsumm/backbone/bart-base-chinese", "fnlp/bart-base-chinese"),
}


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory):
    import os

    repo = os.environ.get("FEDREPRO_REHEARSAL_DIR")
    work = Path(repo) / WORK if repo else tmp_path_factory.mktemp("rehearsal")
    targets = [f"{cell}/scores.json" for cell, _, _ in CELLS.values()]
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), *targets, "--cores", "all",
         "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
         "--configfile", *CONFIGS],
        capture_output=True, text=True, timeout=3600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return work


@pytest.mark.parametrize("paper", sorted(CELLS))
def test_one_true_size_cell_per_paper(rehearsed, paper):
    cell_dir, backbone_dir, hub_id = CELLS[paper]
    meta = json.loads((rehearsed / backbone_dir / "fedrepro_backbone.json").read_text())
    assert meta["kind"] == "shape" and meta["hub_id"] == hub_id  # no hub here: true size, random weights
    config = json.loads((rehearsed / backbone_dir / "config.json").read_text())
    arch = ARCHITECTURES[hub_id].config
    # (save_pretrained drops aliases such as BART's num_hidden_layers: compare what both hold)
    keys = [k for k in ("vocab_size", "d_model", "hidden_size", "encoder_layers", "decoder_layers",
                        "num_hidden_layers", "encoder_ffn_dim", "intermediate_size")
            if k in arch and k in config]
    assert "vocab_size" in keys and len(keys) >= 3, keys
    for key in keys:
        assert config[key] == arch[key], key
    prov = json.loads((rehearsed / cell_dir / "provenance.json").read_text())
    assert prov["cell"]["rehearsal"] == {"examples_per_client": 2, "eval_examples": 2}
    assert prov["cell"]["train"]["rounds"] == 2
    rounds = prov["timing"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    # every client-round timed its steps, except where the rehearsal counted a step's FLOPs
    # instead (one per method and process, left out of the step times: fedrepro.devices.StepTimer)
    assert all(c["seconds_per_step"] > 0 or c.get("flops_per_step", 0) > 0
               for r in rounds for c in r["clients"])
    assert sum(c.get("flops_per_step", 0) > 0 for r in rounds for c in r["clients"]) >= 1
    n_clients = {"adafedseleckd": 3, "fedmcp": 6, "fedsum": 4, "fedsumm": FEDSUMM_N}[paper]  # per round (FedSUMM: config/rehearsal.yaml)
    assert all(len(r["clients"]) == n_clients for r in rounds)
    log = json.loads((rehearsed / cell_dir / "train_log.json").read_text())
    assert len(log["rounds"]) == 2
    assert all(e["bytes_up"] > 0 and e["bytes_down"] > 0 for e in log["rounds"])
    scores = json.loads((rehearsed / cell_dir / "scores.json").read_text())
    assert scores  # evaluated (random weights: the numbers mean nothing)


def test_real_qmsum_through_the_paper_path(tmp_path, shared_data):
    """The paper path on real data: the rehearsal with ``data: configured`` and QMSum as a local
    copy (the real release in ../shared/data; skipped without it) -- the real parser, the paper's
    domain split and 1024-token truncation of real meetings -- for AdaFedSelectKD at BART-base size."""
    import os

    import yaml

    overlay = tmp_path / "real.yaml"
    overlay.write_text(yaml.safe_dump({
        "rehearsal_settings": {"data": "configured"},
        "data": {"qmsum": {"source": "local", "local_dir": str(shared_data / "qmsum")}},
    }))
    cell = CELLS["adafedseleckd"][0]
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), f"{cell}/scores.json", "--cores", "all",
         "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", *CONFIGS, str(overlay)],
        capture_output=True, text=True, timeout=3600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    work = tmp_path
    report = json.loads((work / "results/data/qmsum/prepare_report.json").read_text())
    assert report["raw_dir"] == str(shared_data / "qmsum")  # the real release, not the samples
    assert sum(report["counts"].values()) > 1000
    prov = json.loads((work / cell / "provenance.json").read_text())
    assert prov["cell"]["max_source_length"] == 1024
    assert [r["round"] for r in prov["timing"]["rounds"]] == [1, 2]
