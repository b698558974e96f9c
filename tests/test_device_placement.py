"""Every method's cell runs with its model on an accelerator -- checked on a CPU-only machine.

A GPU rehearsal found FedMCP's MOON crashing in round 2 (``mat1 is on cuda:0, different from
other tensors on cpu``): the previous round's state, read from a checkpoint, stayed on the CPU.
CI has no GPU, so each cell here runs two federated rounds under
:func:`device_check.strict_device` -- the model on a stand-in accelerator that refuses an operator
mixing it with a CPU tensor, as CUDA does, while computing for real -- and must finish; and
because the stand-in computes with the CPU's own kernels, a cell there gives the same bytes as on
the CPU to rounding (checked for one method of each paper: the harness changes where tensors say
they are, not what is computed; not bit for bit, because composite operators choose their kernel
by device -- scaled-dot-product attention takes its math path on the stand-in, the CPU's fused
kernel on the CPU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import device_check as D  # noqa: E402
import helpers  # noqa: E402

from fedrepro.fl.cell import run_cell  # noqa: E402


class _Factory:
    def __init__(self, tmp_path_factory, prefix):
        self.f, self.prefix = tmp_path_factory, prefix

    def mktemp(self, name):
        return self.f.mktemp(f"{self.prefix}-{name}")


def _run(cell: dict) -> Path:
    out = Path(cell["out_dir"])
    run_cell(cell, str(out / "adapters.safetensors"), str(out / "train_log.json"), str(out / "provenance.json"))
    return out


def _on_device(cell: dict) -> Path:
    with D.strict_device() as seen:
        out = _run(dict(cell, device="auto"))
    assert seen.moves > 0, "no model moved to the accelerator: the check checked nothing"
    return out


def _check(cell: dict, tmp_path: Path, compare_with_cpu: bool) -> None:
    """The cell on the stand-in accelerator; with ``compare_with_cpu`` also on the CPU, the two
    compared (:func:`_same_results`)."""
    dev = _on_device(cell)
    if compare_with_cpu:
        _same_results(_run(dict(cell, out_dir=str(tmp_path / "cpu"))), dev)


def _numbers(x, path=""):
    if isinstance(x, dict):
        return {k2: v for k, v in x.items() for k2, v in _numbers(v, f"{path}/{k}").items()}
    if isinstance(x, list):
        return {k2: v for i, v in enumerate(x) for k2, v in _numbers(v, f"{path}/{i}").items()}
    return {path: x}


def _same_results(a: Path, b: Path) -> None:
    """The same run on the CPU and on the stand-in: the same log (keys, counts, shapes, bytes on
    the wire exactly) and round 1's losses equal to rounding.  Not later numbers or the final
    tensors: Adam's first steps are ~lr·sign(g), so a last-bit difference in a near-zero gradient
    entry flips that entry's step (seen: one bias entry of eight), and the rounds after inherit it;
    a wrong computation would change the losses by far more than the tolerance."""
    from safetensors.torch import load_file

    la, lb = (_numbers(json.loads((p / "train_log.json").read_text())) for p in (a, b))
    assert la.keys() == lb.keys()
    for k in la:
        if not isinstance(la[k], float):
            assert la[k] == lb[k], k
        elif k.startswith("/rounds/0/") and ("loss" in k or "/L_" in k):
            assert lb[k] == pytest.approx(la[k], rel=1e-3, abs=1e-5), k
    ta, tb = (load_file(str(p / "adapters.safetensors")) for p in (a, b))
    assert {k: (v.shape, v.dtype) for k, v in ta.items()} == {k: (v.shape, v.dtype) for k, v in tb.items()}


# -- the harness itself -------------------------------------------------------------------------
def test_the_stand_in_refuses_what_cuda_refuses_and_allows_what_it_allows():
    from fedrepro.devices import cell_device

    with D.strict_device() as seen:
        dev = cell_device({"device": "auto"})  # what every paper's task asks for
        lin = torch.nn.Linear(3, 2).to(dev)
        x = torch.ones(4, 3)
        with pytest.raises(D.DeviceMismatch, match="same device"):
            lin(x)  # a CPU batch into a model on the GPU
        y = lin(x.to(dev))
        assert isinstance(y, D.OnDevice) and y.device == dev
        y.sum().backward()  # autograd runs on the device
        assert isinstance(lin.weight.grad, D.OnDevice)
        with torch.no_grad():
            lin.weight.copy_(torch.zeros(2, 3))  # a CPU state loaded into the model: allowed
        assert float(lin.weight.sum()) == 0.0 and lin(x.to(dev)).shape == (4, 2)
        assert float(y.sum() * torch.tensor(2.0)) == pytest.approx(2 * float(y.sum()))  # 0-dim CPU scalar
        mask = torch.triu(torch.full((3, 3), float("-inf"), device=dev), 1)  # a factory on the device
        assert isinstance(mask, D.OnDevice) and (x.to(dev)[:3, :3] + mask).shape == (3, 3)
        assert lin(x.to(dev)).argmax(-1).tolist() == lin(x.to(dev)).detach().cpu().argmax(-1).tolist()  # to the host
        back = lin.weight.detach().cpu()
        assert type(back) is torch.Tensor and back.device.type == "cpu"
        with pytest.raises(D.DeviceMismatch):
            torch.nn.functional.linear(x.to(dev), lin.weight, torch.zeros(2))  # a CPU bias (MOON's bug)
        with pytest.raises(D.DeviceMismatch):
            torch.nn.functional.linear(x.to(dev), lin.weight.detach().cpu())
    assert seen.moves == 1


def test_values_are_the_cpus():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)
    x = torch.randn(7, 5)
    ref = lin(x)
    with D.strict_device():
        lin.to("cuda")  # Module.to("cuda") too
        out = lin(x.to(D.ACCEL)).detach().cpu()
    assert torch.equal(out, ref.detach())


# -- FedMCP: all 13 methods (MOON crashed on the H100) --------------------------------------------
@pytest.fixture(scope="module")
def mcp_world(tmp_path_factory):
    import test_fedmcp_runner as T

    return T.world.__wrapped__(_Factory(tmp_path_factory, "mcp"))


def _mcp_methods():
    from fedrepro.papers.fedmcp.methods import METHODS

    return sorted(METHODS)


@pytest.mark.parametrize("method", _mcp_methods())
def test_fedmcp_method_runs_on_an_accelerator(mcp_world, tmp_path, method):
    import test_fedmcp_runner as T

    _on_device(T._cell(mcp_world, tmp_path, method, name=f"{method}-dev"))


def test_moon_fails_without_its_fix_and_matches_the_cpu_with_it(mcp_world, tmp_path, monkeypatch):
    """The H100's MOON crash, reproduced here: with the previous round's state left where the
    checkpoint put it (the CPU), round 2 raises the device error."""
    import test_fedmcp_runner as T
    from fedrepro.papers.fedmcp import methods

    cell = T._cell(mcp_world, tmp_path, "MOON", name="moon-cpu")
    cpu = _run(cell)
    dev = _on_device(dict(cell, out_dir=str(tmp_path / "moon-dev")))
    _same_results(cpu, dev)

    real = methods.moon_batch_loss

    def unmoved(model, batch, hp, glob_state, prev_state):  # the bug: prev state from the CPU file
        return real(model, batch, hp, glob_state, {k: v.cpu() for k, v in prev_state.items()})

    monkeypatch.setattr(methods, "moon_batch_loss", unmoved)
    with pytest.raises(Exception, match="same device"):
        _on_device(dict(cell, out_dir=str(tmp_path / "moon-bug")))


# -- FedSum: every method (Separate, the baselines, FedSum and its ablations) ---------------------------------------------
@pytest.fixture(scope="module")
def sum_world(tmp_path_factory):
    import test_fedsum_runner as T

    return T.world.__wrapped__(_Factory(tmp_path_factory, "sum"))


def _sum_methods():
    from fedrepro.papers.fedsum.task import METHODS

    return sorted(METHODS)


@pytest.mark.parametrize("method", _sum_methods())
def test_fedsum_method_runs_on_an_accelerator(sum_world, tmp_path, method):
    import test_fedsum_runner as T

    _check(T._cell(sum_world, tmp_path, method, name=f"{method}-dev"), tmp_path, method == "FedSum")


# -- FedSUMM: the three models x the federated regimes, single/all locally -------------------------
@pytest.fixture(scope="module")
def summ_world(tmp_path_factory):
    import test_fedsumm_runner as T

    return T.world.__wrapped__(_Factory(tmp_path_factory, "summ"))


@pytest.mark.parametrize("model", ["bart", "ct", "bart-cd"])
@pytest.mark.parametrize("regime", ["FedAvg", "FedSUMM", "single", "all"])
def test_fedsumm_cell_runs_on_an_accelerator(summ_world, tmp_path, model, regime):
    import test_fedsumm_runner as T
    from fedrepro.papers.fedsumm import task

    cell = T._cell(summ_world, tmp_path, model, regime, f"{model}-{regime}-dev")
    _check(cell, tmp_path, (model, regime) == ("bart", "FedSUMM"))
    if regime in ("FedSUMM", "single") and model != "bart":
        # the cell's evaluation job too: the copy models' own beam search, where the GPU
        # rehearsal found a CPU tensor beside the model's (BART's is HuggingFace's generate, which
        # ran on the H100; its special-token set-up makes meta tensors the stand-in cannot hold)
        out = Path(cell["out_dir"])
        with D.strict_device() as seen:
            scores = task.evaluate_cell(dict(cell, device="auto"), str(out / "adapters.safetensors"),
                                        str(out / "predictions.jsonl"), str(out / "scores.json"))
        assert seen.moves > 0 and scores


# -- AdaFedSelecKD: the methods of the main tables and Table V ------------------------------------
@pytest.fixture(scope="module")
def ada_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("ada-dev")
    folders = helpers.make_partitions(root / "data", sizes=(4, 2, 3))
    return root, folders, helpers.make_backbone(root)


ADA = ["AdaSingle", "AdaCentralized", "AdaFedAvg", "AdaFedKD", "AdaFedSelectKD", "AdaFedProx",
       "AdaFedNova", "AdaFedOPT"]


def _ada_cell(ada_world, tmp_path, method):
    """An AdaFedSelecKD cell on the in-process engine: its clients train in threads of this
    process, under :func:`device_check.strict_device` (under Flower's Ray simulation they would
    train in Ray's worker processes, which the stand-in never reaches: a client step that mixed
    devices passed there)."""
    _root, folders, backbone = ada_world
    cell = helpers.make_cell(tmp_path, method, backbone, folders, rounds=2, out_name=f"{method}-dev")
    cell["engine"] = "inprocess"
    return cell


def test_a_client_step_that_mixes_devices_fails_the_adafedseleckd_cell(ada_world, tmp_path, monkeypatch):
    """The check reaches the clients' training step: a CPU tensor joined to the loss there fails
    the cell naming the operator, as CUDA would."""
    from fedrepro.papers.adafedseleckd import methods

    real = methods.cross_entropy_loss

    def mixed(logits, labels):
        return (real(logits, labels).reshape(1) + torch.zeros(1)).sum()

    monkeypatch.setattr(methods, "cross_entropy_loss", mixed)
    says = r"DeviceMismatch: aten\.add\.Tensor.*on cpu beside tensors on the accelerator"
    with pytest.raises(RuntimeError, match=says):
        _on_device(_ada_cell(ada_world, tmp_path, "AdaFedAvg"))


@pytest.mark.parametrize("method", ADA)
def test_adafedseleckd_method_runs_on_an_accelerator(ada_world, tmp_path, method):
    _root, folders, _backbone = ada_world
    cell = _ada_cell(ada_world, tmp_path, method)
    if method == "AdaSingle":
        cell.update(clients=["Academic"], eval_clients=["Academic"],
                    client_data={"Academic": folders["Academic"]})
    if method == "AdaFedOPT":
        cell["server_optimizer"] = {"name": "adam", "eta": 0.01, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3}
    if method == "AdaFedProx":
        cell["train"]["prox_mu"] = 0.1
    _check(cell, tmp_path, method == "AdaFedSelectKD")
