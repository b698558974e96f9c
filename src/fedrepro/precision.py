"""Numeric precision of a cell: ``<paper>.precision`` and ``<paper>.frozen_dtype`` (issue on GPU-hours).

``<paper>.precision`` (all four papers; Lightning's vocabulary):

``fp32`` (default)
    Plain float32 with TF32 left as it is (off for matmuls, PyTorch's default): exactly the code
    path without the key -- no autocast object is even created, so a CPU run keeps its bits.
``tf32``
    float32 tensors, TF32 tensor-core matmuls and cuDNN convolutions on CUDA
    (``torch.backends.cuda.matmul.allow_tf32`` / ``torch.backends.cudnn.allow_tf32`` set for the
    training and evaluation region and restored after it).  On the CPU there is no TF32: a no-op,
    the bits are fp32's.
``bf16-mixed``
    ``torch.autocast(device_type, dtype=torch.bfloat16)`` around each forward pass and its loss;
    the backward runs outside autocast (PyTorch's recommendation: its ops take the forward ops'
    dtypes), parameters, gradients and optimizer state stay float32 (master weights); no
    ``GradScaler`` (bfloat16 has float32's exponent range).  Works on the CPU too (CPU autocast),
    which the tests use.

``<paper>.frozen_dtype`` (AdaFedSelecKD and FedMCP, whose backbone is frozen): ``fp32`` (default)
or ``bf16``: the frozen backbone's parameters and floating buffers (``requires_grad`` False) are
stored in bfloat16 -- half the memory and bfloat16 matmuls -- while what trains (adapters, heads,
LoRA tensors) stays float32; the adapters cast their input to their own dtype and their output
back to the backbone's (the boundary), so their math is float32 outside autocast.  A method that
trains the backbone (FedMCP's FedAvg-FT) has nothing frozen there: a no-op.

A cell carries ``precision`` / ``frozen_dtype`` only when they differ from ``fp32``
(:func:`precision_cell`): a default cell's description and config hash are those of a cell made
before the keys existed, so finished cells stay valid; ``provenance.json`` records the precision of
every cell (``fedrepro.fl.cell.run_cell``).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn

from fedrepro.io import InputError

PRECISIONS = ("fp32", "tf32", "bf16-mixed")
FROZEN_DTYPES = ("fp32", "bf16")
FROZEN_PAPERS = ("adafedseleckd", "fedmcp")
"""The papers with a frozen backbone: the only ones with a ``frozen_dtype`` key."""
DEFAULT = "fp32"

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def check_precision(value, paper: str = "<paper>") -> str:
    """``value`` if it is one of :data:`PRECISIONS`, else an InputError naming ``<paper>.precision``."""
    if value not in PRECISIONS:
        raise InputError(
            f"{paper}.precision must be one of {list(PRECISIONS)} (Lightning's names), got {value!r}"
        )
    return str(value)


def check_frozen_dtype(value, paper: str = "<paper>") -> str:
    """``value`` if it is one of :data:`FROZEN_DTYPES`, else an InputError naming
    ``<paper>.frozen_dtype``; a non-default value for a paper without a frozen backbone is refused."""
    if value not in FROZEN_DTYPES:
        raise InputError(f"{paper}.frozen_dtype must be one of {list(FROZEN_DTYPES)}, got {value!r}")
    if value != DEFAULT and paper not in FROZEN_PAPERS and paper != "<paper>":
        raise InputError(
            f"{paper}.frozen_dtype: {paper} has no frozen backbone (only {list(FROZEN_PAPERS)} do)"
        )
    return str(value)


@dataclasses.dataclass(frozen=True)
class Precision:
    """A cell's precision settings (module docstring); ``Precision()`` is today's fp32."""

    mode: str = DEFAULT
    frozen_dtype: str = DEFAULT
    paper: str = "<paper>"

    def __post_init__(self) -> None:
        check_precision(self.mode, self.paper)
        check_frozen_dtype(self.frozen_dtype, self.paper)

    @classmethod
    def from_cell(cls, cell: Mapping) -> Precision:
        """The settings a cell carries (absent keys: fp32, see :func:`precision_cell`)."""
        paper = str(cell.get("paper", "<paper>"))
        return cls(str(cell.get("precision", DEFAULT)), str(cell.get("frozen_dtype", DEFAULT)), paper)

    @classmethod
    def of(cls, precision: Precision | str | None) -> Precision:
        """``None`` -> fp32; a mode name -> its settings; a :class:`Precision` unchanged."""
        if precision is None:
            return cls()
        if isinstance(precision, Precision):
            return precision
        return cls(str(precision))

    @property
    def is_default(self) -> bool:
        return self.mode == DEFAULT and self.frozen_dtype == DEFAULT

    @property
    def frozen_torch_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self.frozen_dtype]

    def region(self, device: torch.device | str | None) -> contextlib.AbstractContextManager:
        """The whole training or evaluation region (forward, backward, optimizer): TF32 switched on
        for ``tf32`` on CUDA and restored after; a ``nullcontext`` otherwise (fp32, bf16-mixed, and
        tf32 on the CPU, which has no TF32)."""
        if self.mode == "tf32" and _device_type(device) == "cuda":
            return _tf32()
        return contextlib.nullcontext()

    def autocast(self, device: torch.device | str | None) -> contextlib.AbstractContextManager:
        """Around a forward pass and its loss (never the backward): bf16 autocast for
        ``bf16-mixed``, a ``nullcontext`` otherwise -- fp32 creates no autocast object at all."""
        if self.mode == "bf16-mixed":
            return torch.autocast(device_type=_device_type(device), dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def cast_frozen(self, module: nn.Module) -> int:
        """Store ``module``'s frozen tensors in :attr:`frozen_torch_dtype` (:func:`cast_frozen`);
        fp32: nothing is touched.  Returns the number of tensors cast."""
        if self.frozen_dtype == DEFAULT:
            return 0
        return cast_frozen(module, self.frozen_torch_dtype)

    def record(self) -> dict:
        """What provenance records."""
        return {"precision": self.mode, "frozen_dtype": self.frozen_dtype}

    def emulation_warning(self, device: torch.device | str | None) -> str | None:
        """A sentence when these settings compute in bfloat16 (``bf16-mixed``, ``frozen_dtype:
        bf16``) on a device that emulates it (:func:`native_bf16`'s rules: a CUDA device below
        compute capability 8.0, a CPU without AVX512-BF16 or AMX), else None.  The cell runs as
        configured -- its config says what it is -- and logs this (``run_cell``), since the paper
        config's bf16 is chosen for A100/H100-class GPUs."""
        if self.mode != "bf16-mixed" and self.frozen_dtype != "bf16":
            return None
        device = torch.device(device if device is not None else "cpu")
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            if (major, minor) >= BF16_CAPABILITY:
                return None
            why = f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) has no bf16 tensor cores"
        elif device.type == "cpu":
            native, why = _cpu_native_bf16()
            if native:
                return None
        else:
            return None
        return (f"{self.paper}: precision {self.mode} / frozen_dtype {self.frozen_dtype} computes in bfloat16, "
                f"which this device emulates -- {why}; set {self.paper}.precision: fp32 (and frozen_dtype: fp32) "
                f"for speed here")


def _device_type(device: torch.device | str | None) -> str:
    return torch.device(device if device is not None else "cpu").type


@contextlib.contextmanager
def _tf32() -> Iterator[None]:
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def cast_frozen(module: nn.Module, dtype: torch.dtype) -> int:
    """Cast, in place, every floating parameter of ``module`` with ``requires_grad`` False, and
    every floating buffer of a submodule that has no trainable parameter of its own, to ``dtype``.

    Tied parameters (one ``Parameter`` under two names) are cast once and stay tied; trainable
    parameters are never touched (they keep float32 master weights).  ``param.data`` is replaced,
    so the module must own its frozen tensors (a resident backbone shared by other models is cast
    for all of them: cast a separate resident copy, as AdaFedSelecKD's task does).  Returns the
    number of tensors cast."""
    seen: set[int] = set()
    n = 0
    for sub in module.modules():
        for p in sub._parameters.values():
            if p is None or id(p) in seen or p.requires_grad or not p.is_floating_point():
                continue
            seen.add(id(p))
            if p.dtype != dtype:
                p.data = p.data.to(dtype)
                n += 1
        if any(p is not None and p.requires_grad for p in sub._parameters.values()):
            continue
        for name, b in sub._buffers.items():
            if b is not None and b.is_floating_point() and b.dtype != dtype and id(b) not in seen:
                seen.add(id(b))
                sub._buffers[name] = b.to(dtype)
                n += 1
    return n


def to_dtype_of(x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``x`` in ``reference``'s dtype (the boundary between a bf16 frozen backbone and float32
    trained modules); ``x`` itself when they agree, so the fp32 path is unchanged."""
    return x if x.dtype == reference.dtype else x.to(reference.dtype)


def precision_cell(section: Mapping, paper: str) -> dict:
    """The cell keys of a paper's config section: ``{"precision": ...}`` and, for AdaFedSelecKD
    and FedMCP, ``{"frozen_dtype": ...}`` -- each only when it is not ``fp32``, so a default cell's
    description and config hash are unchanged (spread it into a paper's ``make_cell``)."""
    mode = check_precision(section.get("precision", DEFAULT), paper)
    frozen = check_frozen_dtype(section.get("frozen_dtype", DEFAULT), paper)
    out = {}
    if mode != DEFAULT:
        out["precision"] = mode
    if frozen != DEFAULT:
        out["frozen_dtype"] = frozen
    return out


_CPU_SLOW_BF16 = ("bf16 autocast is emulated here: a bart-large AdaFedAvg step in bf16-mixed took 13.1x "
                  "fp32's on an AMD EPYC with AVX2 (bench/results/kd_step_bart_large_cpu_amd_epyc_precisions.json)")


BF16_CAPABILITY = (8, 0)
"""The CUDA compute capability from which GPUs have bf16 tensor cores (Ampere: A100, A10, L4, L40S,
H100, H200); below it (V100 7.0, T4 7.5) PyTorch emulates bf16 with float32 arithmetic."""

_CAPABILITY_PROBE = (
    "import torch\n"
    "print([tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())])\n"
)


def cuda_capabilities(timeout_s: float = 180.0) -> list[tuple[int, int]]:
    """The compute capability of every visible CUDA device, asked in a child Python process: the
    query initialises CUDA on the device, and a process that only plans (Snakemake's) should hold no
    CUDA context -- it would keep ~0.5 GB of GPU 0 for the whole run.  A child that fails, hangs
    past ``timeout_s`` or prints something else raises RuntimeError with what it said."""
    try:
        out = subprocess.run([sys.executable, "-c", _CAPABILITY_PROBE], capture_output=True, text=True,
                             timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"the CUDA capability probe did not answer: {exc}") from exc
    lines = out.stdout.strip().splitlines()
    try:
        if out.returncode != 0 or not lines:
            raise ValueError
        caps = ast.literal_eval(lines[-1])
        caps = [(int(major), int(minor)) for major, minor in caps]
    except (ValueError, SyntaxError, TypeError):
        said = (out.stderr.strip().splitlines() or lines or ["nothing"])[-1]
        raise RuntimeError(f"the CUDA capability probe exited {out.returncode}: {said}") from None
    if not caps:
        raise RuntimeError("the CUDA capability probe saw no device")
    return caps


def native_bf16(capabilities: Callable[[], list[tuple[int, int]]] = cuda_capabilities) -> tuple[bool, str]:
    """Whether this machine's default device (the visible GPUs, else the CPU: the device a cell's
    ``device: auto`` picks) computes bfloat16 natively, and why, in words.

    * Visible CUDA devices: yes when every one has compute capability >= 8.0
      (:data:`BF16_CAPABILITY`: A100, H100, H200, L40S...), no when one is older (a V100 or T4
      emulates bf16: fp32 is faster there).  ``capabilities`` (:func:`cuda_capabilities`) asks a
      child process, so the process calling this (Snakemake's) creates no CUDA context; where it
      cannot answer, no (fp32), with its error in the reason.
    * An x86 CPU: yes with AVX512-BF16 or AMX (``torch.cpu._is_avx512_bf16_supported`` /
      ``_is_amx_tile_supported``), no otherwise -- oneDNN then converts every bf16 matmul to
      float32 and back.  On another architecture, oneDNN's own bf16 check (ARM's BF16 extension).
      Measured: the step above, 0.60-0.68x fp32's time on a host with native bf16, 13.1x on an
      AVX2-only AMD EPYC.  These are PyTorch's private probes: where one is missing the answer is
      no (fp32: the project's default bits).
    """
    if torch.cuda.is_available():
        try:
            caps = capabilities()
        except RuntimeError as exc:
            return False, f"a CUDA device is visible but its compute capability is unknown ({exc})"
        named = ", ".join(f"GPU {i}: {major}.{minor}" for i, (major, minor) in enumerate(caps))
        if min(caps) < BF16_CAPABILITY:
            return False, (f"a visible CUDA device has no bf16 tensor cores (compute capability {named}; "
                           f"bf16 needs {BF16_CAPABILITY[0]}.{BF16_CAPABILITY[1]}: a V100 or T4 emulates it)")
        return True, f"CUDA devices with bf16 tensor cores (compute capability {named})"
    return _cpu_native_bf16()


def _cpu_native_bf16() -> tuple[bool, str]:
    """:func:`native_bf16`'s answer for this machine's CPU."""
    capability = torch.backends.cpu.get_cpu_capability()
    probes = {name: getattr(torch.cpu, f"_is_{name}_supported", None) for name in ("avx512_bf16", "amx_tile")}
    have = [name for name, probe in probes.items() if probe is not None and probe()]
    if have:
        return True, f"CPU ({capability}) with {' and '.join(have)}"
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        check = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
        if check is not None and check():
            return True, f"{platform.machine()} CPU with oneDNN bf16 support"
    return False, f"CPU ({capability}) without AVX512-BF16 or AMX: {_CPU_SLOW_BF16}"
