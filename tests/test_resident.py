"""The frozen backbone is loaded once per process (issue 16, item 2): counted loads across
multi-round, multi-client runs on the in-process engine (AdaFedSelecKD with two methods in one
process, FedMCP) and on Flower's Ray simulation (each actor process loads once)."""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import helpers
import pytest
import torch
from test_fedmcp_runner import _cell as fedmcp_cell
from test_fedmcp_runner import _run as fedmcp_run
from test_fedmcp_runner import world as fedmcp_world  # noqa: F401 - a pytest fixture

from fedrepro.fl.cell import run_cell
from fedrepro.models import resident
from fedrepro.papers.adafedseleckd import task as ada_task


@pytest.fixture(autouse=True)
def fresh_process_caches():
    resident.clear()
    ada_task._cached_model.cache_clear()
    yield
    resident.clear()
    ada_task._cached_model.cache_clear()


@pytest.fixture(scope="module")
def ada_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("resident")
    folders = helpers.make_partitions(root / "data", sizes=(6, 2, 3))
    return root, folders, helpers.make_backbone(root)


def _run(cell: dict) -> Path:
    out = Path(cell["out_dir"])
    run_cell(cell, out / "adapters.safetensors", out / "train_log.json", out / "provenance.json")
    return out


def _loads(name: str, folder: str) -> int:
    return resident.LOADS[(name, str(Path(folder).resolve()))]


def test_resident_loads_once_and_again_when_the_folder_changes(tmp_path):
    folder = tmp_path / "bb"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    calls = []

    def load():
        calls.append(1)
        return object()

    a = resident.resident("x", folder, load)
    assert resident.resident("x", folder, load) is a and len(calls) == 1
    assert resident.resident("x", folder, load, extra=7) is not a and len(calls) == 2  # another key
    time.sleep(0.01)
    (folder / "config.json").write_text('{"changed": 1}')  # rewritten folder: loaded again
    b = resident.resident("x", folder, load)
    assert b is not a and len(calls) == 3 and _loads("x", folder) == 3
    for i in range(resident.MAX_RESIDENT + 1):  # bounded: the least recently used goes first
        resident.resident(f"y{i}", folder, load)
    assert len(resident._CACHE) == resident.MAX_RESIDENT


def test_share_frozen_shares_tensors_not_modules():
    base = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    twin = resident.share_frozen(base)
    assert twin is not base and twin[0] is not base[0]
    assert twin[0].weight is base[0].weight and twin[1].bias is base[1].bias
    twin[0] = torch.nn.Identity()  # rewiring the copy leaves the original alone
    assert isinstance(base[0], torch.nn.Linear)


def test_adafedseleckd_inprocess_loads_the_backbone_once_for_every_client_round_and_method(ada_world, tmp_path):
    _, folders, backbone = ada_world

    for method in ("AdaFedAvg", "AdaFedSelectKD"):  # a row job: two methods, one process
        cell = helpers.make_cell(tmp_path, method, backbone, folders, rounds=3, out_name=method)
        cell["engine"] = "inprocess"
        _run(cell)
    assert _loads("seq2seq", backbone) == 1  # 2 methods x 3 rounds x 3 clients + evaluation: 1 load
    # the two summarizers wrap one copy of the frozen weights
    (_, a), (_, b) = (ada_task.get_model(helpers.make_cell(tmp_path, m, backbone, folders)) for m in
                      ("AdaFedAvg", "AdaFedSelectKD"))
    assert a is not b and a.backbone.lm_head.weight is b.backbone.lm_head.weight
    assert _loads("seq2seq", backbone) == 1


def test_shared_backbone_gives_the_same_bits_as_a_fresh_load(ada_world, tmp_path):
    """AdaFedSelectKD trained after AdaFedAvg in one process (sharing its backbone) == trained
    alone in a fresh cache."""
    _, folders, backbone = ada_world
    for m in ("AdaFedAvg", "AdaFedSelectKD"):
        cell = helpers.make_cell(tmp_path, m, backbone, folders, out_name=f"shared-{m}")
        cell["engine"] = "inprocess"
        shared = _run(cell)
    resident.clear()
    ada_task._cached_model.cache_clear()
    cell = helpers.make_cell(tmp_path, "AdaFedSelectKD", backbone, folders, out_name="alone")
    cell["engine"] = "inprocess"
    alone = _run(cell)
    assert (shared / "adapters.safetensors").read_bytes() == (alone / "adapters.safetensors").read_bytes()
    assert (shared / "train_log.json").read_bytes() == (alone / "train_log.json").read_bytes()


def test_fedmcp_inprocess_loads_the_encoder_once(fedmcp_world, tmp_path):  # noqa: F811
    root, _ = fedmcp_world
    fedmcp_run(fedmcp_cell(fedmcp_world, tmp_path, "FedMCP", rounds=3))
    fedmcp_run(fedmcp_cell(fedmcp_world, tmp_path, "FedAvg-FT", rounds=2))
    assert _loads("encoder", str(root / "backbone")) == 1  # 2 methods x 3 clients x 2-3 rounds


@pytest.mark.slow
def test_ray_simulation_loads_the_backbone_once_per_actor_process(ada_world, tmp_path, monkeypatch):
    _, folders, backbone = ada_world
    record = tmp_path / "loads.tsv"
    monkeypatch.setenv(resident.LOAD_LOG_ENV, str(record))
    cell = helpers.make_cell(tmp_path, "AdaFedSelectKD", backbone, folders, rounds=3, out_name="ray")
    cell["engine"] = "simulation"
    _run(cell)
    lines = [ln.split("\t") for ln in record.read_text().splitlines()]
    per_pid = collections.Counter(pid for pid, name, _ in lines if name == "seq2seq")
    # 3 clients x 3 rounds ran in a Ray actor process; it loaded once, and so did this (driver)
    # process for what it does after the rounds (AdaFedSelecKD's final states / trace)
    actors = {int(p) for p in per_pid} - {os.getpid()}
    assert actors and set(per_pid.values()) == {1}, per_pid
    assert len(actors) == 1  # one actor: the cell's threads are Ray's CPUs and one client's
