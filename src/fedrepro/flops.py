"""Model FLOPs of a training step and model-FLOPs utilisation (MFU) (issue on GPU-hours, item 2).

**What is counted.**  :func:`count_flops` runs a step under PyTorch's own
``torch.utils.flop_counter.FlopCounterMode``, which adds up the floating-point operations of the
matrix products the step really dispatches -- ``mm``/``addmm``/``bmm``, the attention kernels
(``scaled_dot_product_*``, forward and backward) and convolutions -- in the forward pass, in the
backward pass (the input gradients of every layer the loss flows through and the weight gradients
of what trains only: a frozen layer computes no weight gradient) and in a double backward (FedSUMM's
eq. 7).  A multiply-add counts 2.  Elementwise work (norms, activations, softmax outside the fused
kernels, the optimizer) is not counted: it is bandwidth-bound, and MFU by convention counts the
model's matrix work only (Chowdhery et al. 2022, PaLM, App. B; Korthikanti et al. 2022).  We use
the library counter instead of a hand-written formula per model because it sees exactly what each
method computes (a frozen prefix, a teacher path without grad, a cached prefix that is not
recomputed, LoRA's low-rank products); :func:`seq2seq_adapter_step_flops` is the formula written
out for AdaFedSelecKD, and the tests hold the two equal on a small BART.

**MFU** = counted FLOPs per step / (median step time × the device's dense peak for the step's
arithmetic): :data:`PEAK_TFLOPS` from NVIDIA's datasheets (dense, no 2:4 sparsity).  ``fp32``
runs plain float32 FMA units (TF32 off, PyTorch's default), ``tf32`` and ``bf16-mixed`` the tensor
cores; :func:`mfu` reports it against the peak of the precision used *and* against the bf16 dense
peak, the physical anchor for "how much of the GPU did we buy" (the issue's 30 % target).  A device
without a row (the CPU, an unknown GPU) gives ``None``: no MFU is invented.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    # (substring of torch.cuda.get_device_name(), dense TFLOP/s per arithmetic); first match wins
    ("H200", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}),
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0}),
    ("H100", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}),  # SXM5 (e.g. "NVIDIA H100 80GB HBM3")
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.1}),
    ("A10G", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0}),
)
"""Dense peaks (TFLOP/s) from the vendor datasheets; "fp32" is the non-tensor-core FMA rate."""

ARITHMETIC = {"fp32": "fp32", "float32": "fp32", "tf32": "tf32", "bf16-mixed": "bf16",
              "bf16": "bf16", "bfloat16": "bf16", "float16": "bf16"}
"""A precision mode (:mod:`fedrepro.precision`) or a bench's dtype -> the arithmetic whose peak applies."""


def peak_flops(device_name: str | None, precision: str) -> float | None:
    """The dense peak in FLOP/s of ``device_name`` (``torch.cuda.get_device_name()``) for the
    arithmetic of ``precision``; ``None`` for the CPU or a device without a row."""
    if not device_name:
        return None
    arithmetic = ARITHMETIC.get(precision)
    if arithmetic is None:
        raise ValueError(f"unknown precision {precision!r}: one of {sorted(ARITHMETIC)}")
    for key, peaks in PEAK_TFLOPS:
        if key in device_name:
            return peaks[arithmetic] * 1e12
    return None


def mfu(flops_per_step: float | None, step_seconds: float | None, device_name: str | None,
        precision: str) -> dict:
    """``{"mfu": …, "mfu_vs_bf16_peak": …, "tflops_per_s": …, "peak_tflops": …}``: the
    utilisation against the peak of ``precision``'s arithmetic and against the bf16 dense peak;
    ``None`` values where a number is missing (no count, no time, no known peak)."""
    out: dict = {"mfu": None, "mfu_vs_bf16_peak": None, "tflops_per_s": None, "peak_tflops": None}
    if not flops_per_step or not step_seconds or step_seconds <= 0:
        return out
    rate = float(flops_per_step) / float(step_seconds)
    out["tflops_per_s"] = rate / 1e12
    peak = peak_flops(device_name, precision)
    bf16 = peak_flops(device_name, "bf16")
    if peak:
        out["peak_tflops"] = peak / 1e12
        out["mfu"] = rate / peak
    if bf16:
        out["mfu_vs_bf16_peak"] = rate / bf16
    return out


@contextlib.contextmanager
def counting() -> Iterator[Callable[[], int]]:
    """``with counting() as total: step(); flops = total()``: the FLOPs dispatched inside the
    block (forward, backward, double backward), by ``FlopCounterMode``.  The values the block
    computes are unchanged (the mode only observes each operator)."""
    from torch.utils.flop_counter import FlopCounterMode

    mode = FlopCounterMode(display=False)
    with mode:
        yield mode.get_total_flops


def count_flops(fn: Callable[[], object]) -> tuple[object, int]:
    """``(fn(), FLOPs fn dispatched)``."""
    with counting() as total:
        out = fn()
    return out, int(total())


def _linear(tokens: int, d_in: int, d_out: int) -> int:
    return 2 * tokens * d_in * d_out


def seq2seq_adapter_step_flops(*, batch: int, source_len: int, target_len: int, d_model: int,
                               ffn_dim: int, encoder_layers: int, decoder_layers: int,
                               vocab: int, top_k: int, bottleneck: int, teacher: bool,
                               prefix_computed: bool = True, attention: bool = True) -> dict[str, int]:
    """Matrix FLOPs of one AdaFedSelecKD training step (:func:`fedrepro.papers.adafedseleckd.methods._step`)
    on a BART-type model with bottleneck adapters after the top ``top_k`` decoder layers (padded
    lengths ``source_len`` = s / ``target_len`` = t, ``batch`` = b examples).  With S = b·s and
    T = b·t tokens, d = d_model, f = ffn_dim, m = bottleneck, V = vocab, a linear map of n tokens
    from a to b costs 2·n·a·b, and the attention of q queries over k keys 4·b·q·k·d (scores and mix):

    * prefix (no grad; skipped when it comes from the prefix cache): each encoder layer
      8·S·d² + 4·S·d·f [+ 4·b·s²·d]; each of the ``decoder_layers − top_k`` bottom decoder layers
      ``dec`` + 4·S·d² (the cross-attention's k/v of the encoder output);
    * ``dec`` = one decoder layer's maps over the target: self-attention 8·T·d² [+ 4·b·t²·d],
      cross-attention q/o 4·T·d² [+ 4·b·t·s·d], FFN 4·T·d·f;
    * adapted forward: K·(dec + 4·S·d²) + K·4·T·d·m (adapters) + 2·T·d·V (LM head);
    * backward (the loss flows into the adapters only): input gradients through the head
      (2·T·d·V) and through the bodies of the K − 1 upper adapted layers ((K − 1)·dec, its
      attention terms 2.5× -- the fused kernel's backward recomputes the scores and forms
      dQ, dK, dV, five products for the forward's two, as PyTorch counts it; the lowest
      adapted layer's body sees a no-grad input and frozen weights: no backward, nor does any
      cross-attention k/v); each adapter's weight gradients (4·T·d·m) and input gradients
      (4·T·d·m), except the lowest adapter's down-projection input gradient (2·T·d·m);
    * ``teacher`` (the KD methods): the global adapters' path forward, K·(dec + 4·T·d·m) + 2·T·d·V
      (the cross-attention k/v are memoised from the student's path: not recomputed).

    ``attention`` False leaves the bracketed attention terms out (PyTorch's FLOP counter does not
    count the CPU's fused attention kernel; the tests compare with it that way).  Checked against
    ``FlopCounterMode`` on a small BART in tests/test_flops.py."""
    if top_k < 1:
        raise ValueError("top_k must be >= 1")
    b, s, t = batch, source_len, target_len
    S, T = b * s, b * t
    d, f, m, v = d_model, ffn_dim, bottleneck, vocab
    att = 1 if attention else 0
    enc_layer = 4 * _linear(S, d, d) + _linear(S, d, f) + _linear(S, f, d) + att * 4 * b * s * s * d
    dec_att = att * (4 * b * t * t * d + 4 * b * t * s * d)          # self- and cross-attention mix
    dec = (4 * _linear(T, d, d) + 2 * _linear(T, d, d)               # self q/k/v/o, cross q/o
           + _linear(T, d, f) + _linear(T, f, d)) + dec_att          # FFN
    kv = 2 * _linear(S, d, d)
    adapter = _linear(T, d, m) + _linear(T, m, d)
    head = _linear(T, d, v)
    prefix = encoder_layers * enc_layer + (decoder_layers - top_k) * (dec + kv)
    out = {
        "prefix_forward": prefix if prefix_computed else 0,
        "adapted_forward": top_k * (dec + kv + adapter) + head,
        # the fused attention's backward recomputes the scores and forms dQ, dK, dV: 5 products
        # of the forward's 2 (PyTorch's count), so 2.5x its forward where a linear map's input
        # gradient is 1x
        "adapted_backward": (head + (top_k - 1) * (dec - dec_att + 5 * dec_att // 2)
                             + top_k * 2 * adapter - _linear(T, d, m)),
        "teacher_forward": top_k * (dec + adapter) + head if teacher else 0,
    }
    out["total"] = sum(out.values())
    return out
