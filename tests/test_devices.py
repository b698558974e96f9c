"""GPU-aware resources: the device a cell picks and the scheduler resources its jobs declare."""

import pytest
import torch
import yaml

from fedrepro import grid as wf
from fedrepro.papers.adafedseleckd import grid as ada_grid
from fedrepro.papers.fedmcp import grid as fedmcp_grid
from fedrepro.devices import cpu_state, select_device, to_device
from fedrepro.io import InputError
from test_workflow import ROOT


def test_device_auto_picks_cuda_only_when_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_device("auto").type == "cpu"
    with pytest.raises(InputError, match="no GPU is visible"):
        select_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert select_device("auto").type == "cuda"
    assert select_device("cpu").type == "cpu"
    with pytest.raises(InputError, match="device must be one of"):
        select_device("tpu")


def test_batches_and_states_move():
    batch = to_device({"input_ids": torch.ones(2, 3), "n": 4}, torch.device("cpu"))
    assert batch["n"] == 4 and batch["input_ids"].device.type == "cpu"
    state = cpu_state({"b": torch.zeros(1), "a": torch.ones(1, requires_grad=True)})
    assert list(state) == ["b", "a"] and not state["a"].requires_grad


def test_paper_config_asks_one_gpu_per_cell_job_and_demo_none():
    paper = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    demo = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    for backbone in ("bart-large", "bart-base", "led-large", "roberta-base"):
        for job in ("train", "evaluate"):
            assert wf.job_resources(paper, backbone, job)["gpu"] == 1
            assert wf.job_resources(demo, backbone, job)["gpu"] == 0
    assert wf.job_resources(paper, "bart-large", "train")["runtime"] == 1440
    with pytest.raises(InputError, match="unknown job kind"):
        wf.job_resources(paper, "bart-large", "aggregate")


def test_cells_carry_device_and_gpu_share():
    paper = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    cell = ada_grid.make_cell(paper, "domains", "bart-large", "AdaFedKD", "all", 1)
    assert cell["device"] == "auto" and cell["gpus_per_client"] == 1.0
    fm = fedmcp_grid.make_cell(paper, "roberta-base", "FedMCP", 1)
    assert fm["device"] == "auto" and fm["engine"] == "inprocess"  # bench/round_overhead.py
