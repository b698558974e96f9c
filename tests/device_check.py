"""A client round "on an accelerator" on a CPU-only torch: catches a tensor left on the wrong device.

On an H100, FedMCP's MOON crashed in round 2 with ``Expected all tensors to be on the same device,
but got mat1 is on cuda:0, different from other tensors on cpu``: its previous-round state came
from a checkpoint on the CPU and never reached the GPU (issue 23).  CI has no GPU, so
:func:`strict_device` runs the real client-round code with the model on a *second device* that
a CPU-only torch can give, and refuses what CUDA refuses:

* :class:`OnDevice` is a tensor subclass that holds a real CPU tensor and reports the device
  ``meta`` (the one device besides ``cpu`` that every torch build has; it needs no CUDA hooks).
  Every operator on it runs for real on the held CPU tensors, so values, ``.item()``, boolean
  masks, optimizer steps and evaluation all work; its results are :class:`OnDevice` again.
* An operator that gets an :class:`OnDevice` tensor *and* a plain CPU tensor of one or more
  dimensions raises :class:`DeviceMismatch` naming the operator -- what a CUDA kernel raises for a
  ``cuda:0`` / ``cpu`` pair.  As on CUDA, 0-dim CPU tensors (scalars) may join, and the
  cross-device operators are allowed: ``copy_`` (``p.copy_(cpu_state)``), ``_to_copy`` (``.to``,
  ``.cpu()``) and indexing with CPU indices.  ``.numpy()`` of an :class:`OnDevice` tensor fails,
  as it does for a CUDA tensor.
* Code asks for CUDA through the project's :func:`fedrepro.devices.select_device`; within
  :func:`strict_device` it answers ``meta`` for ``auto`` and ``cuda``, and ``Module.to(meta)``,
  ``Tensor.to(meta)`` and factories with ``device=meta`` make :class:`OnDevice` tensors.  The
  device's ``type`` is ``"meta"``, not ``"cuda"``: code that branches on ``device.type == "cuda"``
  (CUDA timers, autocast) takes its CPU branch here, and that branch is what is checked.

What it does not see: a CUDA-only code path (those branches), kernels that exist on one device
only, and numerics.  Those need the GPU rehearsal (``../shared/gpu``, docs/rehearsal.md).
Why hand-written: PyTorch's ``FakeTensorMode`` can give fake ``cuda:0`` tensors on a CPU-only
build, but several Python bindings (``Tensor.copy_``, ``Tensor.__getitem__``) take a CUDA device
guard before any dispatch and fail with "PyTorch is not linked with support for cuda devices",
and fake tensors have no values for ``.item()`` or boolean masks (tried; see the issue note).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

ACCEL = torch.device("meta")
aten = torch.ops.aten

CROSS_DEVICE_OPS = {
    aten.copy_.default,
    aten._to_copy.default,
    aten.index.Tensor,
    aten.index_put_.default,
    aten._index_put_impl_.default,
    aten.lift_fresh.default,
}
"""Operators that take a CPU tensor beside a CUDA one on a real GPU (copies and CPU indices)."""


class DeviceMismatch(AssertionError):
    """A plain CPU tensor met one on the (stand-in) accelerator inside an operator."""


def _is_accel(dev) -> bool:
    if dev is None or isinstance(dev, int):
        return False
    return torch.device(dev).type in ("meta", "cuda")


def _caller() -> str:
    """The innermost frames outside torch and this module: where the operator was called."""
    import traceback

    frames = [f for f in traceback.extract_stack()[:-2]
              if "/torch/" not in f.filename and not f.filename.endswith("device_check.py")]
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-1] if 'site-packages' not in f.filename else f.filename.split('site-packages/')[-1]}:{f.lineno}"
                       for f in reversed(frames[-3:]))


class OnDevice(torch.Tensor):
    """A real CPU tensor that says it lives on the accelerator (device ``meta``)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False):
        assert not isinstance(elem, OnDevice) and elem.device.type == "cpu"
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=ACCEL, requires_grad=requires_grad,
        )
        r.elem = elem
        return r

    def __repr__(self) -> str:
        return f"OnDevice({self.elem!r})"

    def tolist(self):
        return self.elem.tolist()  # as a CUDA tensor's: copied to the host

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        if func not in CROSS_DEVICE_OPS:
            plain = [t for t in leaves if isinstance(t, torch.Tensor) and not isinstance(t, OnDevice)
                     and t.dim() > 0]
            if plain:
                raise DeviceMismatch(
                    f"{func}: Expected all tensors to be on the same device, but got a tensor of shape "
                    f"{tuple(plain[0].shape)} on {plain[0].device} beside tensors on the accelerator "
                    f"(at {_caller()})"
                )

        def unwrap(x):
            if isinstance(x, OnDevice):
                return x.elem
            if isinstance(x, torch.Tensor) and x.device.type == "meta":
                # a tensor the autograd engine made on the device in C++ (the zeros of an undefined
                # gradient, e.g. where()'s backward): it has no data; zeros are what it holds
                return torch.zeros(x.shape, dtype=x.dtype)
            if isinstance(x, torch.device) and x.type == "meta":
                return torch.device("cpu")
            return x

        to_cpu = func is aten._to_copy.default and kwargs.get("device") is not None and \
            torch.device(kwargs["device"]).type == "cpu"
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if to_cpu:
            return out
        mutated = args[0] if args and isinstance(args[0], OnDevice) and func._schema.is_mutable else None
        if mutated is not None and out is mutated.elem:
            return mutated

        def wrap(x):
            if isinstance(x, torch.Tensor) and not isinstance(x, OnDevice):
                if x.device.type != "cpu":
                    raise RuntimeError(f"device_check: {func} gave a {x.device} tensor from args "
                                       f"{[type(t).__name__ + str(getattr(t, 'device', '')) for t in leaves]}")
                return OnDevice(x)
            return x

        return tree_map(wrap, out)


class _ToDevice(TorchDispatchMode):
    """Below Python: ``_to_copy`` to the accelerator (``Tensor.to``, ``.cuda()``) and factories with
    ``device=meta`` (or ``cuda``) make :class:`OnDevice` tensors from plain ones; every other
    operator goes on to the tensors' own dispatch.  A dispatch mode (not a torch-function mode)
    because it must see the factories called inside Python-implemented functions
    (``F.multi_head_attention_forward`` builds masks with ``device=``), which a torch-function
    mode runs with itself switched off."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_accel(kwargs.get("device")) and not any(
                isinstance(t, OnDevice) for t in tree_leaves(args)):
            kwargs["device"] = torch.device("cpu")
            out = func(*args, **kwargs)
            return tree_map(lambda x: OnDevice(x) if isinstance(x, torch.Tensor) and not isinstance(x, OnDevice)
                            else x, out)
        return func(*args, **kwargs)


class Seen:
    """What a :func:`strict_device` block saw: ``moves``, the modules moved to the accelerator."""

    def __init__(self) -> None:
        self.moves = 0


def _module_to(original: Callable, seen: Seen) -> Callable:
    def to(self, *args, **kwargs):
        device, dtype, _nb, _fmt = torch._C._nn._parse_to(*args, **kwargs)
        if not _is_accel(device):
            if device is not None and any(isinstance(p, OnDevice) for p in self.parameters()):
                raise DeviceMismatch(f"a module on the accelerator moved back to {device}")
            return original(self, *args, **kwargs)
        seen.moves += 1
        memo: dict[int, torch.Tensor] = {}

        def move(t):
            if id(t) not in memo:
                data = t.detach()
                if isinstance(data, OnDevice):
                    data = data.elem
                if dtype is not None and data.is_floating_point():
                    data = data.to(dtype)
                memo[id(t)] = OnDevice(data.clone())
            return memo[id(t)]

        for mod in self.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None:
                    if id(p) not in memo:
                        memo[id(p)] = nn.Parameter(move(p), requires_grad=p.requires_grad)
                    mod._parameters[name] = memo[id(p)]
            for name, b in list(mod._buffers.items()):
                if b is not None:
                    mod._buffers[name] = move(b)
        return self

    return to


def clear_process_caches() -> None:
    """Forget the models the papers' tasks keep per process (``functools.lru_cache`` in
    ``fedrepro.papers.*.task``, the resident backbones): a model cached on the CPU must not serve
    a cell on the stand-in (nothing would move), nor one moved there leak out of the block."""
    import sys as _sys

    for name, module in list(_sys.modules.items()):
        if name.startswith("fedrepro.papers.") and name.endswith(".task"):
            for value in vars(module).values():
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()
    resident = _sys.modules.get("fedrepro.models.resident")
    if resident is not None:
        resident._CACHE.clear()


@contextlib.contextmanager
def strict_device() -> Iterator[Seen]:
    """Within: the project's device choice answers the stand-in accelerator; see the module."""
    from fedrepro import devices

    saved: dict[tuple[object, str], object] = {}

    def patch(obj, name, new):
        saved[(obj, name)] = getattr(obj, name)
        setattr(obj, name, new)

    original = devices.select_device

    def select(preference: str = "auto") -> torch.device:
        if preference not in devices.DEVICES:
            return original(preference)  # the project's error naming the key
        return torch.device("cpu") if preference == "cpu" else ACCEL

    patch(devices, "select_device", select)
    seen = Seen()
    patch(nn.Module, "to", _module_to(nn.Module.to, seen))
    patch(nn.Module, "cuda", lambda self, device=None: self.to(ACCEL))
    # torch function modes are per thread, and the runner trains each client in a thread of its
    # own (fedrepro.fl.client_app's round time limit): threads started inside run under it too
    thread_run = threading.Thread.run

    def run(self):
        with _ToDevice():
            thread_run(self)

    patch(threading.Thread, "run", run)
    clear_process_caches()
    try:
        with _ToDevice():
            yield seen
    finally:
        clear_process_caches()
        for (obj, name), value in reversed(list(saved.items())):
            setattr(obj, name, value)


def on_accelerator(module: nn.Module) -> bool:
    """Whether every parameter of ``module`` is on the stand-in accelerator."""
    return all(isinstance(p, OnDevice) for p in module.parameters())
