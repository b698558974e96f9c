"""The step timer behind every step time, projection and MFU of the rehearsal report, and where a
cell computes (``fedrepro.devices``; the ``devices`` mutation scope, 2026-11-28): step seconds on a
fake clock, the per-step mean, the CUDA branch (synchronise, peak memory in MiB) on a fake CUDA,
the default FLOP key, the device a cell asks for, the thread and determinism settings."""

from __future__ import annotations

import pytest
import torch

from fedrepro import cancellation, devices
from fedrepro.io import InputError


class _Clock:
    def __init__(self, step: float):
        self.t, self.step = 10.0, step

    def perf_counter(self):
        self.t += self.step
        return self.t


@pytest.fixture
def no_counting(monkeypatch):
    monkeypatch.delenv(devices.COUNT_FLOPS_ENV, raising=False)
    monkeypatch.setattr(devices, "_FLOPS_COUNTED", set())


def test_steps_are_timed_and_averaged(monkeypatch, no_counting):
    monkeypatch.setattr(devices, "time", _Clock(2.5))  # every step reads the clock twice: 2.5 s apart
    timer = devices.StepTimer()
    assert timer.stats() == {"seconds_steps": 0.0, "seconds_per_step": 0.0}  # no step yet: no division by 0
    for _ in range(3):
        with timer.step():
            pass
    assert timer.stats() == {"seconds_steps": 7.5, "seconds_per_step": 2.5}
    assert timer.steps == 3 and timer.flop_seconds == 0.0 and timer.flops is None
    assert timer.cuda is False and timer.flop_key == "default"


def test_the_cuda_branch_synchronises_and_reports_peak_memory(monkeypatch, no_counting):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synced.append(1))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * 2**20 + 2**19)
    monkeypatch.setattr(devices, "time", _Clock(1.0))
    for device in ("cuda", torch.device("cuda", 1)):
        timer = devices.StepTimer(device)
        assert timer.cuda is True
        with timer.step():
            pass
        assert timer.stats() == {"seconds_steps": 1.0, "seconds_per_step": 1.0, "peak_gpu_mb": 3.5}
    assert len(synced) == 4  # before and after each step: the kernels' time, not the launch's
    for device in (None, "cpu", "meta", torch.device("cpu")):
        assert devices.StepTimer(device).cuda is False


def test_a_counted_step_is_kept_out_of_the_step_times(monkeypatch):
    monkeypatch.setenv(devices.COUNT_FLOPS_ENV, "1")
    monkeypatch.setattr(devices, "_FLOPS_COUNTED", set())
    monkeypatch.setattr(devices, "time", _Clock(4.0))
    timer = devices.StepTimer("cpu")  # the default key
    a, b = torch.ones(4, 8), torch.ones(8, 2)
    with timer.step():
        a @ b  # 2 · 4 · 8 · 2 FLOPs
    with timer.step():
        pass
    assert timer.stats() == {"seconds_steps": 4.0, "seconds_per_step": 4.0, "flops_per_step": 128,
                             "seconds_flop_step": 4.0}
    assert devices._FLOPS_COUNTED == {"default"}
    # another timer of the same key counts nothing, and says so while counting is on
    other = devices.StepTimer("cpu")
    with other.step():
        a @ b
    assert other.stats() == {"seconds_steps": 4.0, "seconds_per_step": 4.0, "flops_per_step": 0,
                             "seconds_flop_step": 0.0}


def test_a_step_of_work_given_up_on_does_not_start(no_counting):
    token = cancellation.Token("the round")
    token.cancel()
    timer = devices.StepTimer()
    ran = []
    with cancellation.cancellable(token), pytest.raises(cancellation.Cancelled):
        with timer.step():
            ran.append(1)
    assert ran == [] and timer.steps == 0


def test_the_device_a_cell_asks_for():
    assert devices.select_device() == torch.device("cpu")  # auto, on this machine without a GPU
    assert devices.cell_device({}) == torch.device("cpu")
    assert devices.cell_device({"device": "cpu"}) == torch.device("cpu")
    with pytest.raises(InputError, match=r"no GPU is visible"):
        devices.cell_device({"device": "cuda"})
    with pytest.raises(InputError, match=r"device must be one of \('auto', 'cpu', 'cuda'\), got 'gpu' "
                                         r"\(config key <paper>\.device\)"):
        devices.cell_device({"device": "gpu"})
    model = torch.nn.Linear(2, 2)
    assert devices.model_device(model) == torch.device("cpu")
    moved = devices.to_device({"x": torch.ones(2), "n": 3, "s": "a"}, torch.device("meta"))
    assert moved["x"].device.type == "meta" and moved["n"] == 3 and moved["s"] == "a"


def test_configure_torch_fixes_threads_and_determinism():
    threads = torch.get_num_threads()
    det, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        devices.configure_torch(0)
        assert torch.get_num_threads() == 1
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        devices.configure_torch(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det, warn_only=warn)
