"""Where a cell computes: CUDA when a GPU is visible, the CPU otherwise -- no code changes.

``<paper>.device`` in the config: ``auto`` (default: the first visible GPU, else the CPU), ``cpu``
or ``cuda`` (fails clearly when no GPU is visible).  Which GPU ``cuda`` is: under SLURM the
scheduler sets ``CUDA_VISIBLE_DEVICES`` for a job that asked for ``gpu: 1``; elsewhere the job's
script claims its device(s) first (:mod:`fedrepro.gpu_slots`: one job per GPU, or several when
their declared memory fits).  In Flower's simulation engine a client actor sees a GPU only when
``gpus_per_client`` > 0.  Bit-identical reruns are promised on the CPU; CUDA kernels are not all
deterministic.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Mapping

import torch

from fedrepro import cancellation
from fedrepro.io import InputError

DEVICES = ("auto", "cpu", "cuda")


def select_device(preference: str = "auto") -> torch.device:
    if preference not in DEVICES:
        raise InputError(f"device must be one of {DEVICES}, got {preference!r} (config key <paper>.device)")
    if preference == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if preference == "cuda":
        raise InputError("the config asks for device: cuda but no GPU is visible (CUDA_VISIBLE_DEVICES, "
                         "the job's gpu request); use device: auto to fall back to the CPU")
    return torch.device("cpu")


def cell_device(cell: Mapping) -> torch.device:
    return select_device(str(cell.get("device", "auto")))


def to_device(batch: Mapping, device: torch.device) -> dict:
    """Move every tensor of a batch dict to ``device`` (no copy when already there)."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def cpu_state(state: Mapping[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    """Tensors for the wire or the disk: on the CPU (order kept)."""
    return OrderedDict((k, v.detach().cpu()) for k, v in state.items())


def configure_torch(threads: int) -> None:
    """Fix the intra-op thread count: same count, same reduction order, same bits."""
    torch.set_num_threads(max(1, int(threads)))
    torch.use_deterministic_algorithms(True, warn_only=True)


_FLOPS_COUNTED: set = set()
"""The ``flop_key``s whose step this process has counted (:class:`StepTimer`)."""

COUNT_FLOPS_ENV = "FEDREPRO_COUNT_FLOPS"
"""Set to 1 (the rehearsal does: rules/rehearsal.smk) to count the FLOPs of one step per key."""


def _counting_enabled() -> bool:
    import os

    return os.environ.get(COUNT_FLOPS_ENV) == "1"


class StepTimer:
    """Time optimizer steps (forward, backward, update) for the rehearsal report and provenance.

    ``with timer.step(): ...`` around one step; :meth:`stats` gives ``seconds_steps`` (the sum),
    ``steps`` is not repeated here (the training loops count their batches themselves) and, on
    CUDA, ``peak_gpu_mb`` (``torch.cuda.max_memory_allocated`` of this process).
    On CUDA the timer synchronises before reading the clock, so a step's time is its kernels' time.
    Keys starting with ``seconds``, ``peak`` or ``flops`` are measurements: the strategy
    moves them out of the round log (a result) into the cell's timing files (provenance), see
    :data:`fedrepro.fl.strategy.MEASUREMENT_PREFIXES`.

    **Model FLOPs** (for MFU, :mod:`fedrepro.flops`): with ``FEDREPRO_COUNT_FLOPS=1`` in the
    environment, the first step of each ``flop_key`` (the method; once per process) runs under
    PyTorch's FLOP counter and is reported as ``flops_per_step``; the counter slows that step
    down, so it is left out of ``seconds_steps``/``seconds_per_step`` (its time is
    ``seconds_flop_step``; while counting is on, every timer reports both keys, 0 where it counted
    nothing).  Counting only observes the operators: the step's values are the same.
    """

    def __init__(self, device: torch.device | str | None = None, flop_key: str | None = None) -> None:
        self.cuda = torch.device(device or "cpu").type == "cuda"
        self.seconds = 0.0
        self.steps = 0
        self.flop_key = flop_key or "default"
        self.flops: int | None = None
        self.flop_seconds = 0.0

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _count_this_step(self) -> bool:
        return _counting_enabled() and self.flop_key not in _FLOPS_COUNTED

    @contextlib.contextmanager
    def step(self):
        cancellation.check()  # a client call given up on stops here (fedrepro.cancellation)
        counted = self._count_this_step()
        if counted:
            from fedrepro.flops import counting

            _FLOPS_COUNTED.add(self.flop_key)
            mode = counting()
        else:
            mode = contextlib.nullcontext()
        self._sync()
        t0 = time.perf_counter()
        with mode as total:
            yield
        self._sync()
        seconds = time.perf_counter() - t0
        if counted:  # the counter slows the step: its time is kept apart
            self.flop_seconds += seconds
            self.flops = int(total())
        else:
            self.seconds += seconds
            self.steps += 1

    def stats(self) -> dict:
        out = {"seconds_steps": self.seconds, "seconds_per_step": self.seconds / max(self.steps, 1)}
        if self.flops is not None or _counting_enabled():
            # every client reports the keys while counting is on (Flower's FedAvg refuses replies
            # whose metric keys differ); 0: this timer counted no step (its key was counted)
            out["flops_per_step"] = self.flops or 0
            out["seconds_flop_step"] = self.flop_seconds
        if self.cuda:
            out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        return out
