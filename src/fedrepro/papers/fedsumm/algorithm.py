"""FedSUMM (Pan et al., "Personalized Federated Learning via Gradient Modulation for Heterogeneous
Text Summarization"): Algorithm 1 and eq. 4–7 as pure functions plus one server-side object.

What each symbol is here
========================
The paper's text leaves most symbols loose; every reading below is a :class:`FedSummConfig` field
(config block ``fedsumm.algorithm``) where the text allows more than one.

**Parameters w / θ.**  The model's trainable parameters (``named_parameters`` with
``requires_grad``), all of them shared (full fine-tuning: "the local n clients send the model
parameters", §III-A).  Buffers are neither sent nor averaged.

**S_t — "random allocation of C clients".**  :meth:`FedSummServer.sample_clients`: a seeded
permutation of the sorted client ids (seed, round) truncated to ``clients_per_round`` (default:
all C, i.e. every client in a random order).

**g^c — the "gradient" a client sends** (``client_gradient``):
``"delta"`` (default) the round's parameter change ``g^c = w_t − w^c_{t+1}`` (a descent
direction, FedOpt's pseudo-gradient); ``"mean_batch_gradient"`` the mean over the round's
optimizer steps of the gradient each step applied (``p.grad`` after clipping).

**l^c — the client's loss.**  Mean over the round's steps of the data loss (the first term of
eq. 7, before the step).  It orders MG and is reported as the training loss.

**MG — memory gradients.**  ``MG[c]`` = the latest ``g^c`` of every client seen so far (clients
outside S_t keep their old entry), sorted ascending by their latest ``l^c`` (ties by client id).

**ρ — discrepancy ratio, eq. 5–6.**  σ = softmax over the parameter entries i of a model
(eq. 6), under the ``literal`` reading (below) taken over the concatenation of all shared
parameters (``rho_scope="global"``) or per tensor (``"per_tensor"``: ρ is then the mean of the
per-tensor ratios).  σ_c,t: client c's
parameters returned in round t; σ_g,t: the global model of round t, either this round's plain
mean of the returned client models — the model "after global optimization" — (``rho_reference=
"round_mean"``, default) or the broadcast w_t (``"broadcast"``).  The sums over t ∈ T run over the
rounds client c took part in so far (``rho_window="cumulative"``, eq. 5 as printed) or only the
current round (``"round"``).  Eq. 5 is a ratio of vectors, ``ρ_i = p_i / q_i`` with
``p = S_c / Σ S_c`` and ``q = S_g / Σ S_g`` (both sums are |T|, so this is ``S_c,i / S_g,i``;
normalising both in float64 removes the float32 softmaxes' normalisation error, ~1e-6 at 2·10^5
entries — the size of the whole literal signal at δ = 1e-3); the scalar ρ is
``rho_reduction="expected"`` (default): ``Σ_i p_i · ρ_i``, the element-wise ratio averaged under
the client's own normalised distribution (= 1 + χ²(p‖q) ≥ 1, equal to 1 iff the normalised sums
agree, matching §IV-B's "the closer to 1, the lower the drift"), or ``"mean"``: ``(1/d) Σ_i ρ_i``,
the plain mean over parameter entries (it is exactly 1 whenever the global σ is uniform, whatever
the client, and can fall below 1).  Both are 1 when client and global coincide.

**Readings of the modulation** (``reading``; issue 14).  Under eq. 6 as printed (softmax over all
raw parameters) a client's σ differs from the global one by a factor ``exp(δ_i)/E_q[exp(δ)]`` for
per-entry deviations δ, so ρ_i − 1 ≈ δ_i − E_q δ = O(δ) per entry and the scalar ρ − 1 ≈ Var_q(δ)
= O(δ²): with δ ~ 1e-3 ρ − 1 ~ 1e-6, the server step is FedAvg's times (1 + ε·ρ) ≈ (1 + ε), the
same for every client, and neither the sort of MG nor Fig. 6 can show anything.  The readings:

* ``literal`` (default): σ over the raw parameters, one softmax over all of them (``rho_scope:
  global``; ``per_tensor`` gives one softmax per tensor and ρ = the mean of the per-tensor
  values); one scalar ρ_c per client scales its whole g̃.
* ``per_tensor``: one softmax per tensor of raw parameters; each tensor k has its own ρ_{c,k}
  and g̃_k = MG[v]_k · ε · ρ_{c,k}.  ρ_c (logged, sent, Fig. 6) is the mean over tensors.
* ``per_layer``: the same per layer (:func:`layer_key`: the tensors of ``…layers.<i>`` together,
  every other module on its own); g̃ of a layer's tensors scaled by that layer's ρ.
* ``update_direction``: σ over each client's update direction ``w^c − w_t`` instead of the
  weights, each tensor scaled to unit RMS first (:func:`unit_rms`; "after normalizing … gradient
  parameters", §III-C) so that the softmax compares directions, not step sizes; the global σ is
  that of the round's mean update ``mean_c(w^c) − w_t`` (so ``rho_reference: round_mean``); one
  softmax and one ρ per tensor, applied per tensor.  ρ − 1 is then O(1) where a client's update
  points elsewhere than the mean update.
* ``update_direction_raw``: the same without the unit-RMS scaling (σ of the raw updates, whose
  entries are O(δ): as inert as ``literal``; kept to show it).
* ``update_direction_rank`` (issue 23): as ``update_direction``, but each tensor of the update
  direction (the client's and the round's mean update) is replaced by its rank-based normal
  scores before the softmax (:func:`normal_scores`: ``Φ^{-1}`` of the mid-rank of each entry,
  §III-C's "normalizing … gradient parameters" read as normalising the *distribution* of the
  entries, not only their scale).  Every tensor's softmax input is then standard normal over
  its entries whatever the model size, the scale of the step, its tails or its sparsity, so ρ
  depends only on how the client's direction ranks its entries against the mean direction (an
  AdamW first step ≈ lr·sign(g) ranks as its signs: two tied halves): for a Gaussian copula of
  correlation r, ``ρ_expected → exp(2(1 − r))`` (``rho_reduction: mean``: ``exp(1 − r)``), 1 at r
  = 1, growing as the client's direction departs from the mean one.  Under ``update_direction``
  the unit-RMS entries of a sparse or heavy-tailed tensor reach ~sqrt(d/k) (k entries moved of
  d: the rows of a position table or vocabulary a batch touches), the softmax concentrates
  exponentially on them and ρ grows with those tables, i.e. with the model (ρ ≈ 400–600 at
  bart-base-chinese's 116 M parameters with AdamW, NaN with SGD, against 1.2–1.8 at demo size);
  under this reading ρ ≈ 1.8–2.5 at every size from 62 K to 116 M parameters with either
  optimizer (one local step from random weights; issue 23, docs/decisions-fedsumm.md, *ρ at paper scale*).

Every reading keeps eq. 5's ratio of sums over t ∈ T (``rho_window``), the scalar reduction
(``rho_reduction``) per softmax group, and the adapter's form ``g̃ = MG[v]·ε·ρ``.  Per round the
log holds each client's distribution of ρ − 1 (:func:`rho_statistics`: per parameter entry, per
tensor, per softmax group) and how far the server update is from FedAvg's on the same replies
(:func:`update_difference`, and the same against the other memory assignment: what the sort by
loss changes); FedAvg cells log ρ under the same reading (Fig. 6).

**The modulated gradient (Algorithm 1, gradient_adapter).**  ``g̃ = MG[v] · ε · ρ_c`` when
``| ‖MG[v]‖₂ − 1 | > unit_norm_tolerance`` (the "‖∇‖ ≠ 1" test, with ‖·‖ the L2 norm over all
tensors of the memory entry), else ``g̃ = MG[v]`` unchanged.  ρ_c is the receiving client's.
Which entry v client c gets (``memory_assignment``): ``"own"`` (default) its own entry — "the
client's latest personalized customization gradient" — (the sort then only orders the log), or
``"rank"`` the literal indexing ``MG_new[c]`` of the *sorted* list: the client with index c in
sorted-id order gets the entry of the client with the c-th smallest loss (none while the memory
holds ≤ c entries).

**"w^c_{t+1} ← w^c_{t+1}, MG_new[c]".**  With ``apply_on_server=True`` (default) the server
steps each returned model along its modulated gradient before aggregation:
``w^c ← w^c − g̃^c``.  With ``"own"``/``"delta"`` this is ``w^c + ερ(w^c − w_t)``: the client's own
move extrapolated by ε·ρ.  ``False`` aggregates the returned models as they are.

**Global aggregation.**  ``w_{t+1} = w_t + (1/|S_t|) Σ_{c∈S_t} (w^c − w_t)``: the plain mean over
the round's clients (Algorithm 1 writes 1/C over all C; with partial participation only S_t
replied).  The mean of the deltas is a pluggable function, so the server-side DP of eq. 8–10
(:func:`fedrepro.fl.dp.dp_median_clip_mean`) can replace it.

**Sent to a client with w_t** (:class:`ClientGuidance`): its last ``g̃``, ρ and ``l`` (Algorithm 1's
``ClientUpdate(c, w, g, l)``); nothing in its first round.

**Server state** (:class:`FedSummServer`, config ``fedsumm.server_state``).  Per client the server
keeps MG[c] and S_c; S_g once per distinct set of rounds taken part in (it depends on the client
only through them); g̃ is not stored but remade from its memory entry and ε·ρ when sent (the same
multiplication, the same bits).  The vectors live in RAM (``storage="memory"``) or in files read
one tensor at a time (``"disk"``: server RAM O(one model) whatever N); MG may be kept in bfloat16.

**Eq. 7 — the client objective** :func:`fedsumm_objective`, per batch b:
``J(θ) = L_b(θ) + ε·ρ·(dL/dt)·max(‖∇_θ L_b(θ)‖₂, 1)`` with dL/dt (``dldt``):

* ``"inner_product"`` (default; eq. 4 ``dL/dt = ⟨∇_θ L, θ̇⟩``): θ̇ = −MG[v], the parameter velocity
  per round of the memory entry; since the server's ``g̃ = ε·ρ·MG[v]`` already carries ε·ρ, the
  term is ``⟨∇_θ L_b(θ), −g̃⟩ · max(‖∇_θ L_b‖, 1)``.  Its gradient needs a Hessian-vector product
  (``create_graph=True``; about twice the cost of a plain step).
* ``"loss_difference"``: dL/dt ≈ ``L_b(θ) − l^c_prev`` per round (l^c_prev: the client's loss of
  its previous round); the term is ``ε·ρ·(L_b(θ) − l_prev)·max(‖∇L_b‖, 1)``.
* ``"off"``: plain ``L_b`` (FedSUMM = FedAvg + the server-side gradient adapter).

``max(‖∇‖, 1)`` is a detached scale unless ``differentiate_grad_norm=True``.  The term is 0 while
the client has no guidance (its first round).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from fedrepro.data.seq2seq import derive_seed
from fedrepro.devices import StepTimer
from fedrepro.fl.tensors import LazyTensors
from fedrepro.io import InputError, atomic_path

Tensors = Mapping[str, torch.Tensor]

READINGS = (
    "literal",
    "per_tensor",
    "per_layer",
    "update_direction",
    "update_direction_raw",
    "update_direction_rank",
)
"""Readings of eq. 5–6 and of how ρ modulates (``fedsumm.algorithm.reading``, module docstring)."""

_CHOICES = {
    "reading": READINGS,
    "client_gradient": ("delta", "mean_batch_gradient"),
    "memory_assignment": ("own", "rank"),
    "rho_reduction": ("mean", "expected"),
    "rho_window": ("cumulative", "round"),
    "rho_scope": ("global", "per_tensor"),
    "rho_reference": ("round_mean", "broadcast"),
    "dldt": ("inner_product", "loss_difference", "off"),
}


def _dataclass_from_config(cls, cfg: Mapping | None, key: str):
    """``cls(**cfg)`` for a config block; keys ``cls`` has no field for are an error naming ``key``."""
    cfg = dict(cfg or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise InputError(f"unknown keys in {key}: {unknown}; known: {sorted(known)}")
    return cls(**cfg)


@dataclasses.dataclass(frozen=True)
class FedSummConfig:
    """Every reading of Algorithm 1 / eq. 4–7 that the paper leaves open (module docstring).

    The defaults here are the text as printed (``reading="literal"``); both configs choose
    ``reading: update_direction_rank`` (issue 23): like ``update_direction`` one of the readings
    under which ρ and the sort of MG act, and the one whose ρ does not grow with the parameter
    count (docs/decisions-fedsumm.md, *Readings of the modulation* and *ρ at paper scale*).
    """

    epsilon: float = 0.1
    reading: str = "literal"
    client_gradient: str = "delta"
    memory_assignment: str = "own"
    rho_reduction: str = "expected"
    rho_window: str = "cumulative"
    rho_scope: str = "global"
    rho_reference: str = "round_mean"
    unit_norm_tolerance: float = 1e-6
    apply_on_server: bool = True
    dldt: str = "inner_product"
    differentiate_grad_norm: bool = False
    clients_per_round: int | None = None

    def __post_init__(self) -> None:
        for key, allowed in _CHOICES.items():
            if getattr(self, key) not in allowed:
                raise InputError(
                    f"fedsumm.algorithm.{key} must be one of {allowed}, got {getattr(self, key)!r}"
                )
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise InputError(
                f"fedsumm.algorithm.epsilon must be a finite number >= 0, got {self.epsilon}"
            )
        if self.unit_norm_tolerance < 0:
            raise InputError("fedsumm.algorithm.unit_norm_tolerance must be >= 0")
        if self.clients_per_round is not None and self.clients_per_round < 1:
            raise InputError("fedsumm.algorithm.clients_per_round must be >= 1 (or null for all)")
        if self.reading != "literal" and self.rho_scope != "global":
            raise InputError(
                f"fedsumm.algorithm.rho_scope = {self.rho_scope!r} applies to reading 'literal' "
                f"only; reading {self.reading!r} sets its own softmax scope (leave rho_scope global)"
            )
        if self.rho_input == "update" and self.rho_reference != "round_mean":
            raise InputError(
                f"fedsumm.algorithm.reading {self.reading!r} compares each client's update with "
                "the round's mean update: it needs rho_reference: round_mean (the broadcast "
                "model's own update is zero)"
            )

    # -- what the reading fixes (module docstring, "Readings of eq. 5-6") --------------------
    @property
    def softmax_scope(self) -> str:
        """The entries one softmax of eq. 6 runs over: ``global``, ``per_tensor`` or ``per_layer``."""
        if self.reading == "literal":
            return self.rho_scope
        return "per_layer" if self.reading == "per_layer" else "per_tensor"

    @property
    def rho_input(self) -> str:
        """``weights`` (σ of the parameters, eq. 6 as printed) or ``update`` (σ of w^c − w_t)."""
        return "update" if self.reading.startswith("update_direction") else "weights"

    @property
    def direction_transform(self) -> str:
        """What each tensor of an update direction becomes before eq. 6's softmax: ``none``
        (``update_direction_raw``), ``unit_rms`` (``update_direction``, :func:`unit_rms`) or
        ``normal_scores`` (``update_direction_rank``, :func:`normal_scores`); ``none`` for the
        weight-based readings (their input is the raw parameters)."""
        return {"update_direction": "unit_rms", "update_direction_rank": "normal_scores"}.get(
            self.reading, "none"
        )

    @property
    def per_group_modulation(self) -> bool:
        """g̃ scaled group by group with the group's own ρ (every reading but ``literal``, whose ρ
        is one scalar per client)."""
        return self.reading != "literal"

    @classmethod
    def from_config(cls, cfg: Mapping | None) -> FedSummConfig:
        """Build from the ``fedsumm.algorithm`` config block; unknown keys are an error."""
        return _dataclass_from_config(cls, cfg, "fedsumm.algorithm")


# -- small tensor helpers ---------------------------------------------------------------------------
def _shape(tensors: Tensors, key: str) -> torch.Size:
    """A tensor's shape without making it when ``tensors`` is a :class:`LazyTensors`."""
    shape_of = getattr(tensors, "shape_of", None)
    return shape_of(key) if shape_of is not None else tensors[key].shape


def _check_same_keys(reference: Tensors, other: Tensors, what: str) -> None:
    if list(reference) != list(other):
        missing = [k for k in reference if k not in other]
        extra = [k for k in other if k not in reference]
        raise InputError(
            f"{what}: tensor names differ from the global model (missing {missing[:3]}, "
            f"unexpected {extra[:3]})"
        )
    for k in reference:
        shape, expected = _shape(other, k), _shape(reference, k)
        if shape != expected:
            raise InputError(
                f"{what}: tensor {k!r} has shape {tuple(shape)}, expected {tuple(expected)}"
            )


def l2_norm(tensors: Tensors) -> float:
    """‖g‖₂ over all entries of all tensors (float64 accumulation)."""
    return math.sqrt(sum(_square_sum(t) for t in tensors.values()))


_COMPUTE: list[torch.device | None] = [None]
"""The device of the server's parameter-sized arithmetic (:func:`server_compute_device`);
``None``: where the tensors are (the CPU)."""


@contextlib.contextmanager
def server_compute_device(device: torch.device | str | None):
    """Run the server's parameter-sized arithmetic -- the update directions (:func:`normal_scores`,
    :func:`unit_rms`), eq. 6's softmax, eq. 5's ratios and their statistics, the float64 sums and
    norms -- on ``device`` (the cell's GPU) while the server's state stays where it is (RAM or
    disk, :class:`ServerStateConfig`).  Each function moves its inputs there and hands back CPU
    tensors or Python numbers, so nothing else changes.

    Why: at bart-base-chinese's 116 M parameters these passes over every entry are nearly all of a
    FedSUMM round beyond the clients' steps (bench/fedsumm_round_overhead.py: 74-94 % of a round
    at N = 3 on the CPU, ~10 s per client on the GPU machine's CPU).  ``None`` or a CPU device:
    nothing moves -- the CPU bits are the same as without it.  On CUDA the values agree with the
    CPU's to float rounding (reduction order), as everything on CUDA."""
    dev = None if device is None else torch.device(device)
    if dev is not None and dev.type == "cpu":
        dev = None
    old, _COMPUTE[0] = _COMPUTE[0], dev
    try:
        yield
    finally:
        _COMPUTE[0] = old


_RESIDENT: list[bool] = [False]
"""Inside :func:`_resident`: results stay on the compute device (:func:`_from_compute` keeps
them there)."""


@contextlib.contextmanager
def _resident():
    """Within: the functions of :func:`server_compute_device` leave their results on the compute
    device instead of handing back CPU tensors, so a chain of them (ρ's update directions → eq. 6's
    softmax → eq. 5's sums, ratios and statistics: :meth:`FedSummServer._rho`) moves each
    parameter-sized vector to the device once, not once per function.  What is stored
    (:meth:`MemoryVectorStore.put`, :meth:`DiskVectorStore.put`) still goes to the CPU.  No
    compute device: nothing changes (the CPU's bits)."""
    old, _RESIDENT[0] = _RESIDENT[0], True
    try:
        yield
    finally:
        _RESIDENT[0] = old


def _to_compute(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the compute device (itself when there is none or it is there already)."""
    dev = _COMPUTE[0]
    return t if dev is None else t.to(dev)


def _from_compute(t: torch.Tensor) -> torch.Tensor:
    """``t`` back on the CPU when the server computes elsewhere (itself otherwise, and inside
    :func:`_resident`)."""
    return t if _COMPUTE[0] is None or _RESIDENT[0] else t.cpu()


def _square_sum(t: torch.Tensor) -> float:
    return float(_to_compute(t.detach()).double().pow(2).sum())


def _detached(tensors: Tensors) -> OrderedDict[str, torch.Tensor]:
    return OrderedDict((k, v.detach().clone()) for k, v in tensors.items())


# -- where the server keeps its parameter-sized vectors ----------------------------------------------
STATE_STORAGES = ("memory", "disk")
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_NUMPY_VIEW = {"float32": (np.float32, None), "bfloat16": (np.int16, torch.int16)}


@dataclasses.dataclass(frozen=True)
class ServerStateConfig:
    """Where :class:`FedSummServer` keeps its per-client vectors (config ``fedsumm.server_state``).

    ``storage="memory"``: in RAM (the default; small models).  ``"disk"``: one file per vector under
    ``state_dir`` (the cell's ``checkpoints/server_state/``), written once and read back one tensor
    at a time, so the server's RAM stays O(one model) whatever the number of clients.  ``dtype``:
    storage type of the memory gradients MG (``"float32"``: exact; ``"bfloat16"``: half the bytes,
    MG and so g̃ rounded to bfloat16, computed on in float32).  The ρ sums are always float32 (their
    entries differ from each other by far less than bfloat16's 8-bit mantissa resolves).
    ``wave_size``: the server sends a round's messages to at most this many clients at a time and
    moves each reply's tensors to disk when it arrives (:class:`fedrepro.fl.strategy.WaveGrid`),
    so it never holds N models of messages; ``None``: all at once (Flower's way).  Same bits.
    """

    storage: str = "memory"
    dtype: str = "float32"
    wave_size: int | None = None

    def __post_init__(self) -> None:
        if self.storage not in STATE_STORAGES:
            raise InputError(
                f"fedsumm.server_state.storage must be one of {STATE_STORAGES}, got {self.storage!r}"
            )
        if self.dtype not in STATE_DTYPES:
            raise InputError(
                f"fedsumm.server_state.dtype must be one of {tuple(STATE_DTYPES)}, got {self.dtype!r}"
            )
        if self.wave_size is not None and (
            isinstance(self.wave_size, bool) or not isinstance(self.wave_size, int) or self.wave_size < 1
        ):
            raise InputError(
                f"fedsumm.server_state.wave_size must be a positive integer or null, got {self.wave_size!r}"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return STATE_DTYPES[self.dtype]

    @classmethod
    def from_config(cls, cfg: Mapping | None) -> ServerStateConfig:
        """Build from the ``fedsumm.server_state`` config block; unknown keys are an error."""
        return _dataclass_from_config(cls, cfg, "fedsumm.server_state")


def _dtype_name(dtype: torch.dtype) -> str:
    for name, d in STATE_DTYPES.items():
        if d == dtype:
            return name
    raise InputError(f"server-state vectors are float32 or bfloat16, not {dtype}")


class MemoryVectorStore:
    """Named, immutable parameter-sized vectors ({tensor name: Tensor}) in RAM.

    A vector is never changed after :meth:`put`; a new value gets a new name (names come from a
    counter, so a rerun makes the same names).  :meth:`get` returns float32 tensors.  ``put(...,
    norm=True)`` also records ‖vector‖₂ of the stored values (:meth:`l2_norm`; what
    :func:`l2_norm` of :meth:`get` gives, without reading the vector again).
    """

    kind = "memory"
    fresh_reads = False  # get() returns the stored tensors: never change them

    def __init__(self) -> None:
        self.counter = 0
        self.vectors: dict[str, OrderedDict[str, torch.Tensor]] = {}
        self.norms: dict[str, float] = {}

    def _new_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter:08d}"

    def put(
        self,
        prefix: str,
        tensors: Tensors,
        dtype: torch.dtype = torch.float32,
        copy: bool = True,
        norm: bool = False,
    ) -> str:
        """Store ``tensors`` (cast to ``dtype``; ``copy=False`` keeps a float32 tensor as is)."""
        _dtype_name(dtype)
        name = self._new_name(prefix)
        self.vectors[name] = OrderedDict(  # on the CPU (a vector made on the compute device too)
            (k, v.detach().to(device="cpu", dtype=dtype, copy=copy)) for k, v in tensors.items()
        )
        if norm:
            self.norms[name] = math.sqrt(sum(_square_sum(v) for v in self.vectors[name].values()))
        return name

    def l2_norm(self, name: str) -> float:
        """‖vector‖₂ (float64 accumulation, as :func:`l2_norm`)."""
        if name in self.norms:
            return self.norms[name]
        return l2_norm(self.get(name))

    def get(self, name: str) -> Mapping[str, torch.Tensor]:
        vec = self.vectors[name]
        if all(v.dtype == torch.float32 for v in vec.values()):
            return vec  # read-only by convention
        return LazyTensors({k: v.shape for k, v in vec.items()}, lambda k: vec[k].float())

    def retain(self, names: Iterable[str]) -> None:
        """Forget every vector not in ``names``."""
        keep = set(names)
        for n in [n for n in self.vectors if n not in keep]:
            del self.vectors[n]
        self.norms = {n: v for n, v in self.norms.items() if n in keep}

    def nbytes(self) -> int:
        """Bytes of the vectors held."""
        return sum(
            v.numel() * v.element_size() for vec in self.vectors.values() for v in vec.values()
        )

    def collect(self, keep: Iterable[str] = ()) -> int:
        return 0  # RAM is freed by retain()

    def state_dict(self, names: Iterable[str]) -> dict:
        names = sorted(set(names))
        return {
            "kind": self.kind,
            "counter": self.counter,
            **self._payload_state(names),
            "norms": {n: self.norms[n] for n in names if n in self.norms},
        }

    def load_state_dict(self, state: Mapping) -> None:
        if state.get("kind") != self.kind:
            raise InputError(
                f"saved FedSUMM server state was kept in {state.get('kind')!r} storage, not "
                f"{self.kind!r} (fedsumm.server_state.storage)"
            )
        self._load_payload(state)
        self.counter = int(state["counter"])
        self.norms = dict(state["norms"])

    # what each storage saves of its vectors (the rest of the state is shared)
    def _payload_state(self, names: list[str]) -> dict:
        return {"vectors": {n: self.vectors[n] for n in names}}

    def _load_payload(self, state: Mapping) -> None:
        self.vectors = {n: OrderedDict(v) for n, v in state["vectors"].items()}


class DiskVectorStore(MemoryVectorStore):
    """The same vectors as files ``<directory>/<name>.bin``: the raw tensors one after the other
    (float32 or bfloat16, native byte order), written atomically (temporary file + rename) and
    never rewritten; :meth:`get` reads one tensor at a time (one read of its byte range),
    so RAM holds at most the tensor being used.  Names, keys, shapes and dtypes are kept in
    :attr:`meta` and go into the server-state checkpoint; :meth:`collect` deletes the files that
    neither the live state nor a kept checkpoint names (the caller says which those are).
    """

    kind = "disk"
    fresh_reads = True  # get() reads new tensors every time

    def __init__(self, directory: str | os.PathLike) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.meta: dict[str, dict] = {}

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.bin"

    def put(
        self,
        prefix: str,
        tensors: Tensors,
        dtype: torch.dtype = torch.float32,
        copy: bool = True,
        norm: bool = False,
    ) -> str:
        dname = _dtype_name(dtype)
        view = _NUMPY_VIEW[dname][1]
        name = self._new_name(prefix)
        keys, shapes, squares = [], [], []
        with atomic_path(self.path(name), suffix=".tmp") as tmp:
            with open(tmp, "wb", buffering=0) as f:
                for k, v in tensors.items():
                    t = v.detach().to(device="cpu", dtype=dtype).contiguous()
                    _write_all(f, (t.view(view) if view is not None else t).numpy())
                    keys.append(k)
                    shapes.append(list(t.shape))
                    if norm:
                        squares.append(_square_sum(t))
        self.meta[name] = {"dtype": dname, "keys": keys, "shapes": shapes}
        if norm:
            self.norms[name] = math.sqrt(sum(squares))
        return name

    def get(self, name: str) -> Mapping[str, torch.Tensor]:
        m = self.meta[name]
        np_dtype, view = _NUMPY_VIEW[m["dtype"]]
        item = np.dtype(np_dtype).itemsize
        path = self.path(name)
        spans, offset = {}, 0
        for k, s in zip(m["keys"], m["shapes"]):
            n = math.prod(s)
            spans[k] = (offset, n, s)
            offset += n

        def read(k: str) -> torch.Tensor:
            start, n, shape = spans[k]
            arr = np.empty(n, dtype=np_dtype)
            with open(path, "rb", buffering=0) as f:
                f.seek(start * item)
                if _read_all(f, arr) != arr.nbytes:
                    raise InputError(f"{path}: server-state file is truncated")
            t = torch.from_numpy(arr)
            if view is not None:
                t = t.view(torch.bfloat16).float()
            return t.reshape(shape)

        return LazyTensors(dict(zip(m["keys"], m["shapes"])), read)

    def retain(self, names: Iterable[str]) -> None:
        keep = set(names)
        self.meta = {n: m for n, m in self.meta.items() if n in keep}
        self.norms = {n: v for n, v in self.norms.items() if n in keep}

    def nbytes(self) -> int:
        """Bytes of the live vectors (on disk; what RAM would hold)."""
        return sum(_file_bytes(m) for m in self.meta.values())

    def disk_bytes(self) -> int:
        """Bytes of every file in the directory (live vectors, those of kept checkpoints, leftovers)."""
        if not self.directory.exists():
            return 0
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())

    def collect(self, keep: Iterable[str] = ()) -> int:
        """Delete the files of vectors neither live nor in ``keep`` (and unfinished temporaries);
        returns the bytes freed."""
        if not self.directory.exists():
            return 0
        names = set(self.meta) | set(keep)
        freed = 0
        for p in self.directory.iterdir():
            if p.is_file() and not (p.suffix == ".bin" and p.stem in names):
                freed += p.stat().st_size
                p.unlink()
        return freed

    def _payload_state(self, names: list[str]) -> dict:
        return {"directory": str(self.directory), "meta": {n: self.meta[n] for n in names}}

    def _load_payload(self, state: Mapping) -> None:
        meta = {n: dict(m) for n, m in state["meta"].items()}
        for n, m in meta.items():
            path, expected = self.path(n), _file_bytes(m)
            if not path.exists() or path.stat().st_size != expected:
                raise InputError(
                    f"{path}: server-state file missing or of the wrong size (expected {expected} "
                    f"bytes); delete {self.directory.parent} to restart this cell"
                )
        self.meta = meta


def _write_all(f, arr: np.ndarray) -> None:
    buf = memoryview(arr.reshape(-1)).cast("B")
    while buf:
        buf = buf[f.write(buf) :]


def _read_all(f, arr: np.ndarray) -> int:
    buf, got = memoryview(arr).cast("B"), 0
    while got < len(buf):
        n = f.readinto(buf[got:])
        if not n:
            break
        got += n
    return got


def _file_bytes(meta: Mapping) -> int:
    return STATE_DTYPES[meta["dtype"]].itemsize * sum(math.prod(s) for s in meta["shapes"])


def make_vector_store(
    config: ServerStateConfig, directory: str | os.PathLike | None = None
) -> MemoryVectorStore:
    """The store ``config.storage`` asks for (``disk`` needs ``directory``)."""
    if config.storage == "memory":
        return MemoryVectorStore()
    if directory is None:
        raise InputError("fedsumm.server_state.storage: disk needs a folder for the state files")
    return DiskVectorStore(directory)


def _numbered(tensors: Sequence[torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    return OrderedDict((str(i), t) for i, t in enumerate(tensors))


# -- ρ (eq. 5–6) ------------------------------------------------------------------------------------
_RATIO_CHUNK = 1 << 18
"""Entries per element-wise step of ρ's float64 passes on the CPU: 2 MB float64 temporaries stay
in the cache (1 << 22 measured 2-3× slower at 116 M entries on the 2-core VM)."""
_DEVICE_RATIO_CHUNK = 1 << 24
"""The same on a compute device (GPU): larger steps, fewer kernel launches."""


SOFTMAX_SCOPES = ("global", "per_tensor", "per_layer")


def layer_key(name: str) -> str:
    """The layer a parameter belongs to (``per_layer``): its name up to the first numeric
    component (``model.encoder.layers.0.fc1.weight`` -> ``model.encoder.layers.0``), else the
    name without its last component (``model.shared.weight`` -> ``model.shared``)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or name


def parameter_groups(names: Iterable[str], scope: str = "global") -> list[list[str]]:
    """The tensors each softmax of eq. 6 runs over, in order: one group of all (``global``), one
    per tensor (``per_tensor``), one per :func:`layer_key` in order of first appearance
    (``per_layer``)."""
    names = list(names)
    if scope == "global":
        return [names]
    if scope == "per_tensor":
        return [[n] for n in names]
    if scope == "per_layer":
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(layer_key(n), []).append(n)
        return list(groups.values())
    raise InputError(f"softmax scope must be one of {SOFTMAX_SCOPES}, got {scope!r}")


def group_slices(params: Tensors, scope: str) -> list[list[tuple[str, int, int]]]:
    """Per softmax group, its tensors as ``(name, start, numel)`` in the group's flat vector."""
    out = []
    for group in parameter_groups(params, scope):
        start, slices = 0, []
        for k in group:
            n = math.prod(_shape(params, k))
            slices.append((k, start, n))
            start += n
        out.append(slices)
    return out


def softmax_normalize(params: Tensors, scope: str = "global") -> list[torch.Tensor]:
    """σ of eq. 6: ``exp(w_i) / Σ_j exp(w_j)`` over the parameter entries.

    ``scope="global"``: one softmax over the concatenation of all tensors (a list of one flat
    tensor); ``"per_tensor"``: one softmax per tensor (flattened); ``"per_layer"``: one per layer
    (:func:`parameter_groups`: the layer's tensors concatenated in order).
    """
    if not params:
        raise InputError("no parameters to normalise")
    if scope == "global":
        # the concatenation, filled tensor by tensor (a lazy mapping makes one at a time)
        flat = torch.empty(sum(math.prod(_shape(params, k)) for k in params), dtype=torch.float32,
                           device=_COMPUTE[0])
        start = 0
        for t in params.values():
            n = t.numel()
            flat[start : start + n] = t.detach().float().reshape(-1)
            start += n
        return [_from_compute(torch.softmax(flat, dim=0))]
    if scope == "per_tensor":
        return [_from_compute(torch.softmax(_to_compute(t.detach()).float().reshape(-1), dim=0))
                for t in params.values()]
    if scope == "per_layer":
        return [
            _from_compute(torch.softmax(
                torch.cat([_to_compute(params[k].detach()).float().reshape(-1) for k in g]), dim=0))
            for g in parameter_groups(params, scope)
        ]
    raise InputError(f"rho scope must be one of {SOFTMAX_SCOPES}, got {scope!r}")


def unit_rms(t: torch.Tensor) -> torch.Tensor:
    """``t / sqrt(mean(t²))`` (the RMS in float64; a zero tensor stays zero): the
    ``update_direction`` reading's normalisation of a tensor before its softmax."""
    t = _to_compute(t.detach()).float()
    rms = math.sqrt(float(t.double().pow(2).mean())) if t.numel() else 0.0
    return _from_compute(t / rms if rms > 0 else torch.zeros_like(t))


SCORE_BUCKETS = 1 << 16
""":func:`normal_scores` ranks the entries of a tensor truncated to their top 16 bits (sign, 8-bit
exponent, 7 mantissa bits: bfloat16 rounded toward zero), so a tensor has at most this many
distinct scores."""


def normal_scores(t: torch.Tensor) -> torch.Tensor:
    """Rank-based inverse normal transform of a tensor's entries (``update_direction_rank``).

    FedSUMM eq. 6 takes a softmax over "normalized … gradient parameters" (§III-C).  The
    ``update_direction`` reading normalises each tensor of the update to unit RMS; this one
    normalises the whole *distribution* of its entries: entry i becomes

        ``z_i = Φ^{-1}((#{j : x_j < x_i} + #{j : x_j = x_i} / 2) / d)``

    (the mid-distribution function of the tensor's d entries: ties share their mid-rank), with
    ``x`` the entries truncated toward zero to bfloat16 — their top 16 bits, i.e. the values
    rounded to 8 significant bits (relative resolution 2^-7; ±0 are one value).  So the scores are
    standard normal over the entries of every tensor (exactly so, up to ties and that rounding),
    whatever the tensor's size, sparsity or tails, and invariant to any increasing transform of the
    entries up to that rounding (a positive power-of-two scale exactly, bit for bit; any other
    positive scale or power moves only entries across rounding buckets).  AdamW's first step
    ``lr·g/(|g| + eps)`` is ±lr to within 2^-8 wherever |g| > 256·eps, so it ranks as the signs of
    g (two tied halves, scores ≈ ±Φ^{-1}(3/4)) where SGD's ``lr·g`` ranks as g.  A zero tensor (one
    tie) gets scores 0; a constant tensor likewise.

    Cost O(d): the truncated values are bucket indices of a 2^16-bucket histogram
    (``torch.bincount``), the mid-ranks a cumulative sum over the buckets and the scores one table
    look-up per entry (``index_select``); no sort.  Integer counts and one float64 table: the same
    bits on every run.  Returns float32 of ``t``'s shape.
    """
    x = _to_compute(t.detach()).reshape(-1).float()
    d = x.numel()
    if d == 0:
        return _from_compute(torch.zeros_like(x).reshape(t.shape))
    key = (x + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0 (a new tensor)
    # IEEE bits -> an int32 key in the float order: negative floats have all but the sign bit
    # flipped; the top 16 bits of the key are the bucket (its sign, exponent, 7 mantissa bits)
    key ^= (key >> 31) & 0x7FFFFFFF
    key >>= 16
    key += SCORE_BUCKETS // 2
    counts = torch.bincount(key, minlength=SCORE_BUCKETS).to(torch.float64)
    below = torch.cumsum(counts, 0).sub_(counts)
    table = torch.special.ndtri(below.add_(counts, alpha=0.5).div_(d)).to(torch.float32)
    return _from_compute(table.index_select(0, key).reshape(t.shape))


def update_direction(t: torch.Tensor, transform: str) -> torch.Tensor:
    """One tensor of an update ``w^c − w_t`` (or of the round's mean update) as eq. 6's softmax
    input under ``transform`` (:attr:`FedSummConfig.direction_transform`): unchanged (float32),
    :func:`unit_rms` or :func:`normal_scores`."""
    if transform == "unit_rms":
        return unit_rms(t)
    if transform == "normal_scores":
        return normal_scores(t)
    if transform == "none":
        return t.detach().float()
    raise InputError(f"unknown update-direction transform {transform!r}")


def discrepancy_ratios(
    client_sum: Sequence[torch.Tensor],
    global_sum: Sequence[torch.Tensor],
    reduction: str = "expected",
    global_totals: Sequence[torch.Tensor] | None = None,
) -> list[float]:
    """Eq. 5 per softmax group: ``ρ_G = Σ_t σ_c,t / Σ_t σ_g,t`` over the group's entries, reduced
    to a scalar (:func:`discrepancy_ratio` for the reductions); one value per group.
    ``global_totals``: ``_float64_sum`` of each ``global_sum`` entry when the caller has them
    (:func:`global_totals`; the same values, not computed again).  One float64 pass over each
    group (:func:`_ratio_sums`)."""
    totals = _check_ratio_inputs(client_sum, global_sum, reduction, global_totals)
    values = []
    for sc, sg, total_g in zip(client_sum, global_sum, totals):
        ((c, c2, r),) = _ratio_sums(sc, sg, [(0, sc.numel())])
        values.append(_reduce(reduction, c, c2, r, sc.numel(), _total(sg, total_g) / c))
    return values


def _check_ratio_inputs(client_sum, global_sum, reduction: str, global_totals=None) -> list:
    """Check eq. 5's inputs; returns the caller's ``ΣS_g`` per group, or ``None`` per group where
    the caller has none (computed by :func:`_total` then)."""
    if len(client_sum) != len(global_sum) or not client_sum:
        raise InputError(
            "client and global softmax sums must have the same, non-zero number of scopes"
        )
    if reduction not in ("mean", "expected"):
        raise InputError(f"rho_reduction must be 'mean' or 'expected', got {reduction!r}")
    for sc, sg in zip(client_sum, global_sum):
        if sc.shape != sg.shape:
            raise InputError(f"softmax sums of shapes {tuple(sc.shape)} and {tuple(sg.shape)}")
    if global_totals is None:
        return [None] * len(global_sum)
    if len(global_totals) != len(global_sum):
        raise InputError(f"{len(global_sum)} softmax groups but global totals for {len(global_totals)}")
    return list(global_totals)


def _total(sg: torch.Tensor, total_g) -> float:
    return float(_float64_sum(sg) if total_g is None else total_g)


def _reduce(reduction: str, c: float, c2: float, r: float, n: int, factor: float) -> float:
    """ρ over entries with ``Σ S_c = c``, ``Σ S_c²/S_g = c2``, ``Σ S_c/S_g = r`` (``n`` of them),
    ``factor = Σ_group S_g / Σ_group S_c``: with ``p = S_c/ΣS_c`` and ``q = S_g/ΣS_g`` (the whole
    group's sums) ``p_i/q_i = factor·S_c,i/S_g,i``, so ``expected``, ``Σ p_i·(p_i/q_i) / Σ p_i``,
    is ``factor·c2/c`` (``c`` = the group's ΣS_c: Σ p = 1) and ``mean``, ``(1/n) Σ p_i/q_i``, is
    ``factor·r/n``."""
    return factor * c2 / c if reduction == "expected" else factor * r / n


def _chunk() -> int:
    """Entries per element-wise step: ``_RATIO_CHUNK`` on the CPU (a few float64 temporaries that
    stay in the cache), ``_DEVICE_RATIO_CHUNK`` on a compute device (fewer kernel launches)."""
    return _RATIO_CHUNK if _COMPUTE[0] is None else _DEVICE_RATIO_CHUNK


def _ratio_sums(
    client_sum: torch.Tensor,
    global_sum: torch.Tensor,
    spans: Sequence[tuple[int, int]],
    ratios: torch.Tensor | None = None,
) -> list[tuple[float, float, float]]:
    """One float64 pass over one softmax group's ``S_c`` and ``S_g``: per span ``(start, n)`` of
    the flat vectors ``(Σ S_c,i, Σ S_c,i²/S_g,i, Σ S_c,i/S_g,i)``, from which :func:`_reduce`
    makes eq. 5's ratios and every statistic of :func:`rho_statistics` (all linear in these sums
    once the group's ``ΣS_c`` is known, so one read of each vector suffices).  ``ratios``: a
    float32 vector as long as the spans together; ``S_c,i/S_g,i`` is written there span after
    span.

    Hand-written (no library reduces two streams to these three sums): chunk by chunk, in float64
    (a float32 value squared is exact in float64), each chunk's sums by PyTorch's cascade
    summation and added in float64 on the compute device (one synchronisation at the end).
    """
    sc, sg = _to_compute(client_sum.reshape(-1)), _to_compute(global_sum.reshape(-1))
    chunk = _chunk()
    sums = torch.zeros(len(spans), 3, dtype=torch.float64, device=sc.device)
    pos = 0
    for k, (start, n) in enumerate(spans):
        row = sums[k]
        for i in range(start, start + n, chunk):
            j = min(i + chunk, start + n)
            s = sc[i:j].to(torch.float64)
            r = s / sg[i:j].to(torch.float64)
            row[0] += s.sum()
            row[2] += r.sum()
            row[1] += s.mul_(r).sum()
            if ratios is not None:
                ratios[pos + i - start : pos + j - start] = r
        pos += n
    return [tuple(v) for v in sums.tolist()]


def global_totals(global_sum: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``Σ S_g`` of every softmax group in float64 (:func:`_float64_sum`): what
    :func:`discrepancy_ratios` and :func:`rho_statistics` compute from S_g, once for every client
    that shares S_g."""
    return [_float64_sum(sg) for sg in global_sum]


def _float64_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ t accumulated in float64, chunk by chunk (no parameter-sized float64 copy)."""
    t = _to_compute(t.reshape(-1))
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    chunk = _chunk()
    for i in range(0, t.numel(), chunk):
        total += t[i : i + chunk].sum(dtype=torch.float64)
    return _from_compute(total)


def discrepancy_ratio(
    client_sum: Sequence[torch.Tensor],
    global_sum: Sequence[torch.Tensor],
    reduction: str = "expected",
) -> float:
    """Eq. 5: ``ρ = Σ_t σ_c,t / Σ_t σ_g,t``, reduced to a scalar.

    Parameters
    ----------
    client_sum, global_sum : sequences of Tensor
        ``S_c = Σ_{t∈T} σ_c,t`` and ``S_g = Σ_{t∈T} σ_g,t``, one entry per softmax scope.
    reduction : {"mean", "expected"}
        ``"mean"``: ``(1/d) Σ_i p_i / q_i``; ``"expected"``: ``Σ_i p_i · p_i / q_i`` with
        ``p = S_c / Σ_j S_c,j`` and ``q = S_g / Σ_j S_g,j`` (both sums are |T| exactly, so this is
        eq. 5's ``S_c,i / S_g,i``; normalising both removes the float32 softmaxes' normalisation
        error: in float32 each softmax's sum is off by ~1e-7 … 1e-6 at 1e5 … 1e8 entries, as large
        as the literal reading's whole signal).  With several scopes (per tensor, per layer) the
        scalars (:func:`discrepancy_ratios`) are averaged.

    In float64, in one pass over the entries without a parameter-sized temporary
    (:func:`_ratio_sums`): the normalisations are scalars, so they are applied to the sums
    (:func:`_reduce`).
    """
    values = discrepancy_ratios(client_sum, global_sum, reduction)
    return sum(values) / len(values)


QUANTILES = {"min": 0.0, "p1": 0.01, "p50": 0.5, "p99": 0.99, "max": 1.0}
"""The quantiles of ρ − 1 the round log records (plus ``mean``)."""


def deviation_summary(values: np.ndarray | Sequence[float]) -> dict[str, float]:
    """``{min, p1, p50, p99, max, mean}`` of ``values`` (NumPy's linear quantiles; the array may
    be reordered in place)."""
    if isinstance(values, torch.Tensor):
        return _deviation_summary_torch(values)
    arr = np.asarray(values)
    if arr.size == 0:
        raise InputError("no values to summarise")
    # float64 accumulation without a float64 copy (ρ − 1 of every parameter: 0.9 GB at 116 M)
    mean = float(arr.mean(dtype=np.float64))
    q = np.quantile(arr, list(QUANTILES.values()), overwrite_input=isinstance(values, np.ndarray))
    return {**{k: float(v) for k, v in zip(QUANTILES, q)}, "mean": mean}


def _deviation_summary_torch(values: torch.Tensor) -> dict[str, float]:
    """:func:`deviation_summary` of a tensor where it is (the server's compute device): NumPy's
    ``linear`` quantiles, ``x[⌊h⌋] + (h − ⌊h⌋)(x[⌊h⌋+1] − x[⌊h⌋])`` at ``h = q (n − 1)`` of the
    sorted values, the mean in float64."""
    x = values.reshape(-1)
    n = x.numel()
    if n == 0:
        raise InputError("no values to summarise")
    mean = float(x.double().mean())
    srt = torch.sort(x).values
    out = {}
    for k, q in QUANTILES.items():
        h = q * (n - 1)
        lo = math.floor(h)
        a = float(srt[lo])
        b = float(srt[min(lo + 1, n - 1)])
        out[k] = a + (h - lo) * (b - a)
    return {**out, "mean": mean}


def rho_statistics(
    client_sum: Sequence[torch.Tensor],
    global_sum: Sequence[torch.Tensor],
    slices: Sequence[Sequence[tuple[str, int, int]]],
    reduction: str = "expected",
    group_values: Sequence[float] | None = None,
    global_totals: Sequence[torch.Tensor] | None = None,
) -> dict[str, dict[str, float]]:
    """The distribution of ρ − 1 behind one client's scalar ρ (the round log's ``rho_statistics``).

    ``parameter``: over the parameter entries i of eq. 5's vector ``ρ_i = p_i / q_i`` (the
    normalised ``S_c,i / S_g,i`` of :func:`discrepancy_ratio`; every entry of every group;
    ``mean`` unweighted); ``tensor``: over the tensors k of the reduction
    restricted to the tensor (``expected``: ``Σ_{i∈k} S_c,i ρ_i / Σ_{i∈k} S_c,i``; ``mean``: the mean
    of ρ_i over k); ``group``: over the softmax groups' ρ_G (``group_values``, the values that
    modulate per group; one value for ``global``).  Each as :func:`deviation_summary`.

    :func:`rho_and_statistics` computes ρ_G and these in one pass; this returns its statistics
    (``group`` from ``group_values`` when given, as before; none otherwise).
    """
    groups, stats = rho_and_statistics(client_sum, global_sum, slices, reduction, global_totals)
    if group_values is None:
        del stats["group"]
    else:
        stats["group"] = deviation_summary(np.asarray([v - 1.0 for v in group_values]))
    return stats


def rho_and_statistics(
    client_sum: Sequence[torch.Tensor],
    global_sum: Sequence[torch.Tensor],
    slices: Sequence[Sequence[tuple[str, int, int]]],
    reduction: str = "expected",
    global_totals: Sequence[torch.Tensor] | None = None,
) -> tuple[list[float], dict[str, dict[str, float]]]:
    """Eq. 5's ρ_G of every softmax group (:func:`discrepancy_ratios`) and the distribution of
    ρ − 1 (:func:`rho_statistics`, with ``group`` over these ρ_G) in one float64 pass over each
    group (:func:`_ratio_sums`): per tensor the three sums, from which ρ_G and every tensor's value
    follow (:func:`_reduce`), and ``S_c,i/S_g,i`` of every entry in one parameter-sized float32
    vector, scaled to ρ_i − 1 in place for the quantiles (NumPy's partition, in place, on the CPU;
    a sort on a compute device).  ``global_totals``: as :func:`discrepancy_ratios`."""
    totals = _check_ratio_inputs(client_sum, global_sum, reduction, global_totals)
    if len(slices) != len(client_sum):
        raise InputError(f"{len(client_sum)} softmax groups but slices for {len(slices)}")
    total = sum(n for group in slices for _, _, n in group)
    dev = torch.empty(total, dtype=torch.float32, device=_COMPUTE[0])  # None: the CPU
    groups, tensor_values, pos = [], [], 0
    for sc, sg, group, total_g in zip(client_sum, global_sum, slices, totals):
        size = sum(n for _, _, n in group)
        if size != sc.numel():
            raise InputError(f"softmax group of {sc.numel()} entries, its slices cover {size}")
        sums = _ratio_sums(sc, sg, [(start, n) for _, start, n in group], dev[pos : pos + size])
        group_c = sum(c for c, _, _ in sums)
        factor = _total(sg, total_g) / group_c
        c2 = sum(v for _, v, _ in sums)
        r = sum(v for _, _, v in sums)
        groups.append(_reduce(reduction, group_c, c2, r, size, factor))
        for (_, _, n), (c, c2, r) in zip(group, sums):
            tensor_values.append(_reduce(reduction, c, c2, r, n, factor) - 1.0)
        dev[pos : pos + size].mul_(factor).sub_(1.0)  # ρ_i − 1
        pos += size
    stats = {
        "parameter": deviation_summary(dev if _COMPUTE[0] is not None else dev.numpy()),
        "tensor": deviation_summary(np.asarray(tensor_values)),
        "group": deviation_summary(np.asarray([v - 1.0 for v in groups])),
    }
    del dev
    return groups, stats


@dataclasses.dataclass
class RhoResult:
    """One client's ρ in a round: the scalar (logged, sent, Fig. 6), the per-group values (the
    modulation of the per-group readings) and, when asked for, :func:`rho_statistics`."""

    rho: float
    groups: list[float]
    statistics: dict | None = None


class DiscrepancyTracker:
    """ρ per client across rounds (eq. 5), usable for any method (Fig. 6 compares FedAvg's ρ).

    ``window="cumulative"``: per client ``S_c = Σ_{t∈T_c} σ_c,t`` over the rounds T_c it took part
    in (one parameter-sized vector per client) and ``S_g = Σ_{t∈T_c} σ_g,t``.  σ_g,t is the same for
    every client of round t, so S_g depends on the client only through T_c: clients with the same
    rounds share one S_g vector (made once, by the same additions in the same order, hence the same
    bits as one copy each).  With full participation all clients share one S_g; with partial
    participation at most one per distinct T_c.  ``window="round"``: nothing is kept.  The vectors
    (float32) live in ``store`` (RAM, or files: :class:`ServerStateConfig`).
    """

    def __init__(
        self,
        scope: str = "global",
        reduction: str = "expected",
        window: str = "cumulative",
        store: MemoryVectorStore | None = None,
        release: Callable[[], None] | None = None,
    ):
        if scope not in SOFTMAX_SCOPES:
            raise InputError(f"rho scope must be one of {SOFTMAX_SCOPES}, got {scope!r}")
        FedSummConfig(rho_reduction=reduction, rho_window=window)  # validates
        self.scope, self.reduction, self.window = scope, reduction, window
        self._owns_store = store is None
        self.store = MemoryVectorStore() if store is None else store
        # called after each client's sums are replaced: lets the store drop the superseded ones
        # at once (in RAM: one client's old S_c at a time, not the whole round's)
        if release is None and self._owns_store:
            release = lambda: self.store.retain(self.names())  # noqa: E731
        self._release = release or (lambda: None)
        self.client_sums: dict[str, str] = {}  # client -> name of S_c in the store
        self.global_sums: dict[str, str] = {}  # client -> name of its (shared) S_g

    def _vector(self, name: str) -> list[torch.Tensor]:
        return list(self.store.get(name).values())

    def _add(self, old: list[torch.Tensor], new: list[torch.Tensor]) -> list[torch.Tensor]:
        """``old + new`` (old first, as eq. 5's running sum); in place when ``old`` was read fresh
        from disk (same values, one parameter-sized tensor less)."""
        # ``old`` comes from the store (the CPU); ``new`` may be on the compute device
        if self.store.fresh_reads:
            return [a.to(b.device).add_(b) for a, b in zip(old, new)]
        return [a.to(b.device) + b for a, b in zip(old, new)]

    def names(self) -> set[str]:
        """The store names this tracker refers to."""
        return set(self.client_sums.values()) | set(self.global_sums.values())

    def update(self, client: str, client_params: Tensors, global_params: Tensors) -> float:
        """Add round t's σ_c,t and σ_g,t for ``client`` and return its ρ."""
        return self.update_round({client: client_params}, global_params)[client]

    def update_round(
        self,
        clients_params: Mapping[str, Tensors],
        global_params: Tensors,
        global_sigma: list[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """One round: σ_g,t of ``global_params`` (once; or ``global_sigma`` when the caller has
        it, ``global_params`` then only gives the names and shapes), then every client's σ_c,t and
        ρ_c, in the order of ``clients_params``; one client's vectors at a time."""
        out = self.update_round_detailed(clients_params, global_params, global_sigma)
        return {c: r.rho for c, r in out.items()}

    def update_round_detailed(
        self,
        clients_params: Mapping[str, Tensors],
        global_params: Tensors,
        global_sigma: list[torch.Tensor] | None = None,
        statistics: bool = False,
    ) -> dict[str, RhoResult]:
        """:meth:`update_round` with each client's per-group ρ and (``statistics``) the
        distribution of ρ − 1 (:func:`rho_statistics`)."""
        sg_t = (
            global_sigma
            if global_sigma is not None
            else softmax_normalize(global_params, self.scope)
        )
        slices = group_slices(global_params, self.scope) if statistics else None
        new_global: dict[str | None, str] = {}  # S_g before this round -> S_g after it
        read: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}  # S_g, its sums
        out: dict[str, RhoResult] = {}
        for c, params in clients_params.items():
            _check_same_keys(global_params, params, f"client {c!r}")
            sc = softmax_normalize(params, self.scope)
            if self.window == "round":
                if "round" not in read:
                    read = {"round": (sg_t, global_totals(sg_t))}
                out[c] = self._result(sc, *read["round"], slices)
                continue
            old = self.client_sums.get(c)
            if old is not None:
                sc = self._add(self._vector(old), sc)
            prev = self.global_sums.get(c)
            if prev not in new_global:
                sg = sg_t if prev is None else self._add(self._vector(prev), sg_t)
                new_global[prev] = self.store.put("rho-global", _numbered(sg), copy=False)
                # kept for the clients that share it, where it already is (the stored float32
                # values: the same bits as reading it back from the store)
                read = {new_global[prev]: (sg, global_totals(sg))}
                del sg
            self.client_sums[c] = self.store.put("rho-client", _numbered(sc), copy=False)
            self.global_sums[c] = new_global[prev]
            name = new_global[prev]
            if name not in read:  # read (and summed) once for the clients that share it
                sg = [_to_compute(t) for t in self._vector(name)]  # and moved once
                read = {name: (sg, global_totals(sg))}
            out[c] = self._result(sc, *read[name], slices)
            del sc
            self._release()
        return out

    def _result(self, sc, sg, totals, slices) -> RhoResult:
        if slices is None:
            groups, stats = discrepancy_ratios(sc, sg, self.reduction, totals), None
        else:
            groups, stats = rho_and_statistics(sc, sg, slices, self.reduction, totals)
        return RhoResult(sum(groups) / len(groups), groups, stats)

    def state_dict(self) -> dict:
        state = {
            "scope": self.scope,
            "reduction": self.reduction,
            "window": self.window,
            "client_sums": dict(self.client_sums),
            "global_sums": dict(self.global_sums),
        }
        if self._owns_store:
            state["store"] = self.store.state_dict(self.names())
        return state

    def load_state_dict(self, state: Mapping) -> None:
        if (state["scope"], state["reduction"], state["window"]) != (
            self.scope,
            self.reduction,
            self.window,
        ):
            raise InputError(
                "saved ρ state was made with other rho_scope/rho_reduction/rho_window settings"
            )
        self.client_sums = dict(state["client_sums"])
        self.global_sums = dict(state["global_sums"])
        if self._owns_store:
            self.store.load_state_dict(state["store"])


# -- the gradient adapter (Algorithm 1) ---------------------------------------------------------------
def sort_memory_by_loss(losses: Mapping[str, float]) -> list[str]:
    """Algorithm 1: MG ordered so that ``l^i ≤ l^j`` for i < j (ties broken by client id)."""
    for c, loss in losses.items():
        if not math.isfinite(loss):
            raise InputError(f"client {c!r} reported a non-finite loss {loss}")
    return sorted(losses, key=lambda c: (losses[c], c))


def modulate_gradient(
    gradient: Tensors, epsilon: float, rho: float, unit_norm_tolerance: float = 1e-6
) -> tuple[OrderedDict[str, torch.Tensor], bool, float]:
    """Algorithm 1: ``g̃ = MG[v]·ε·ρ`` when ``‖MG[v]‖ ≠ 1`` (beyond the tolerance), else ``MG[v]``.

    Returns ``(g̃, modulated, ‖MG[v]‖₂)``.
    """
    norm = l2_norm(gradient)
    if abs(norm - 1.0) > unit_norm_tolerance:
        scale = epsilon * rho
        return OrderedDict((k, v.detach() * scale) for k, v in gradient.items()), True, norm
    return _detached(gradient), False, norm


@dataclasses.dataclass
class ClientGuidance:
    """What the server sends client c with w_t (Algorithm 1's g and l; plus ρ for eq. 7).

    ``modulated_gradient`` is keyed like the model's trainable parameters; ``None`` fields mean
    "not available yet" and switch the corresponding eq. 7 term off.
    """

    modulated_gradient: OrderedDict[str, torch.Tensor] | None
    rho: float | None
    previous_loss: float | None
    epsilon: float


@dataclasses.dataclass
class ClientReply:
    """What a client returns: w^c_{t+1}, g^c_{t+1}, l^c_{t+1} (Algorithm 1, ClientUpdate)."""

    params: Tensors
    gradient: Tensors
    loss: float


# -- eq. 7 ------------------------------------------------------------------------------------------
def fedsumm_objective(
    data_loss: torch.Tensor,
    named_params: Sequence[tuple[str, torch.nn.Parameter]],
    guidance: ClientGuidance | None,
    config: FedSummConfig,
) -> tuple[torch.Tensor, dict]:
    """FedSUMM eq. 7 for one batch: ``L_b(θ) + ε·ρ·(dL/dt)·max(‖∇_θ L_b(θ)‖, 1)``.

    Parameters
    ----------
    data_loss : Tensor
        ``L_b(θ)``, the batch's summarisation loss (with a graph to the parameters).
    named_params : sequence of (name, Parameter)
        The trainable parameters θ, named like ``guidance.modulated_gradient``.
    guidance : ClientGuidance or None
        From the server; ``None`` (first round) gives ``J = L_b``.
    config : FedSummConfig
        ``dldt`` selects eq. 4's inner product ⟨∇L, −g̃⟩ or the loss difference ``L_b − l_prev``.

    Returns
    -------
    (Tensor, dict)
        ``J`` and ``{"objective_term", "dldt", "grad_norm"}`` as floats (``nan`` when unused).
    """
    parts = {"objective_term": 0.0, "dldt": math.nan, "grad_norm": math.nan}
    if config.dldt == "off" or guidance is None:
        return data_loss, parts
    if config.dldt == "inner_product" and guidance.modulated_gradient is None:
        return data_loss, parts
    if config.dldt == "loss_difference" and (
        guidance.previous_loss is None or guidance.rho is None
    ):
        return data_loss, parts
    params = [p for _, p in named_params]
    need_graph = config.dldt == "inner_product" or config.differentiate_grad_norm
    grads = torch.autograd.grad(
        data_loss, params, create_graph=need_graph, retain_graph=True, allow_unused=True
    )
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    grad_norm = torch.sqrt(sum((g * g).sum() for g in grads))
    scale = torch.clamp(grad_norm, min=1.0)
    if not config.differentiate_grad_norm:
        scale = scale.detach()
    if config.dldt == "inner_product":
        g_mod = guidance.modulated_gradient
        missing = [n for n, _ in named_params if n not in g_mod]
        if missing:
            raise InputError(f"the server's modulated gradient lacks parameters {missing[:3]}")
        dldt = -sum(
            (g * g_mod[n].to(device=g.device, dtype=g.dtype)).sum()
            for (n, _), g in zip(named_params, grads)
        )
        term = dldt * scale
    else:
        dldt = data_loss - guidance.previous_loss
        term = guidance.epsilon * guidance.rho * dldt * scale
    parts.update(
        objective_term=float(term.detach()),
        dldt=float(dldt.detach()),
        grad_norm=float(grad_norm.detach()),
    )
    return data_loss + term, parts


@dataclasses.dataclass
class LocalUpdateResult:
    """A client round's outcome: send ``params``, ``gradient`` and ``loss`` (a :class:`ClientReply`)."""

    params: OrderedDict[str, torch.Tensor]
    gradient: OrderedDict[str, torch.Tensor]
    loss: float
    step_losses: list[float]
    n_steps: int
    n_examples: int
    mean_objective_term: float
    mean_grad_norm: float
    timing: dict = dataclasses.field(default_factory=dict)
    """Measured optimizer steps (:meth:`fedrepro.devices.StepTimer.stats`: ``seconds_steps``,
    ``seconds_per_step``, on CUDA ``peak_gpu_mb``): provenance, not a result."""

    def reply(self) -> ClientReply:
        return ClientReply(self.params, self.gradient, self.loss)


def trainable_state(model: torch.nn.Module) -> OrderedDict[str, torch.Tensor]:
    """The shared tensors of a model: its trainable parameters, detached copies."""
    return OrderedDict(
        (n, p.detach().clone()) for n, p in model.named_parameters() if p.requires_grad
    )


def load_trainable_state(model: torch.nn.Module, state: Tensors) -> None:
    """Copy ``state`` into the model's trainable parameters (exact names and shapes)."""
    named = OrderedDict((n, p) for n, p in model.named_parameters() if p.requires_grad)
    _check_same_keys(named, state, "received parameters")
    with torch.no_grad():
        for n, p in named.items():
            p.copy_(state[n])


def _math_attention():
    """``scaled_dot_product_attention`` restricted to its math kernel (differentiable twice)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def fedsumm_local_update(
    model: torch.nn.Module,
    batches: Iterable[dict] | Callable[[int], Iterable[dict]],
    loss_fn: Callable[[torch.nn.Module, dict], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    guidance: ClientGuidance | None,
    config: FedSummConfig,
    local_epochs: int = 1,
    max_grad_norm: float | None = None,
    precision=None,
    flop_key: str = "fedsumm",
) -> LocalUpdateResult:
    """Algorithm 1, ClientUpdate(c, w, g, l): local epochs of ``w ← w − δ∇J(w, b)`` with eq. 7's J.

    The caller loads w_t into ``model`` first (:func:`load_trainable_state`) and builds the
    optimizer over the trainable parameters (its learning rate is δ).

    Parameters
    ----------
    model : nn.Module
        Holds w_t on entry and w^c_{t+1} on exit.
    batches : iterable of dict, or callable epoch -> iterable
        The client's training batches (a callable gives a different seeded order per epoch).
    loss_fn : callable (model, batch) -> Tensor
        The data loss L_b (e.g. BART's cross-entropy, :func:`fedrepro.papers.fedsumm.copy_transformer.copy_loss`).
    optimizer : torch.optim.Optimizer
    guidance : ClientGuidance or None
        From :meth:`FedSummServer.guidance_for`.
    config : FedSummConfig
    local_epochs : int
    max_grad_norm : float, optional
        Gradient clipping of the objective's gradient before each step.
    precision : :class:`fedrepro.precision.Precision`, mode name or None (fp32)
        ``bf16-mixed``: the data loss L_b (the forward) under bf16 autocast; eq. 7's gradient
        (``autograd.grad``, with ``create_graph`` for its Hessian-vector product), the backward
        and the update outside it, on float32 parameters.  ``tf32``: TF32 matmuls on CUDA for the
        whole update.
    flop_key : str
        The :class:`fedrepro.devices.StepTimer` key under which a rehearsal counts one step's FLOPs
        (once per key and process): the task passes ``fedsumm:<model>:<regime>``, so each of a
        row job's four regimes counts its own step; a guided step (eq. 7's double backward) is
        counted apart, under ``<flop_key>:eq7``.

    Returns
    -------
    LocalUpdateResult
        ``params`` (w^c_{t+1}), ``gradient`` (g^c per ``config.client_gradient``), ``loss`` (mean
        data loss, l^c), per-step losses, the mean eq. 7 term and gradient norm, and ``timing``
        (each optimizer step timed with :class:`fedrepro.devices.StepTimer`).
    """
    from fedrepro.precision import Precision

    if local_epochs < 1:
        raise InputError(f"local_epochs must be >= 1, got {local_epochs}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise InputError("the model has no trainable parameters")
    precision = Precision.of(precision)
    with precision.region(named[0][1].device):
        return _local_update(model, batches, loss_fn, optimizer, guidance, config, local_epochs,
                             max_grad_norm, named, precision, flop_key)


def _local_update(model, batches, loss_fn, optimizer, guidance, config, local_epochs,
                  max_grad_norm, named, precision, flop_key) -> LocalUpdateResult:
    start = OrderedDict((n, p.detach().clone()) for n, p in named)
    grad_sum = OrderedDict((n, torch.zeros_like(p)) for n, p in named)
    step_losses: list[float] = []
    terms: list[float] = []
    norms: list[float] = []
    n_examples = 0
    device = named[0][1].device
    # eq. 7's inner product (or a differentiated norm) backpropagates through the gradient, a
    # double backward that PyTorch's fused attention kernels lack (CPU flash attention without
    # dropout, CUDA flash / memory-efficient): the forward then runs the math kernel (CT's
    # nn.Transformer; BART is loaded with eager attention anyway)
    double_backward = guidance is not None and (
        config.dldt == "inner_product"
        or (config.dldt == "loss_difference" and config.differentiate_grad_norm)
    )
    timer = StepTimer(device, flop_key=f"{flop_key}:eq7" if double_backward else flop_key)
    model.train()
    for epoch in range(local_epochs):
        n_examples = 0
        for batch in batches(epoch) if callable(batches) else batches:
            with timer.step():  # forward, eq. 7's objective, backward, update
                with (_math_attention() if double_backward else contextlib.nullcontext(),
                      precision.autocast(device)):  # the forward; eq. 7 and backward outside
                    data_loss = loss_fn(model, batch)
                if not torch.isfinite(data_loss):
                    raise FloatingPointError(
                        f"non-finite training loss {float(data_loss)} at step {len(step_losses)}"
                    )
                total, parts = fedsumm_objective(data_loss, named, guidance, config)
                optimizer.zero_grad(set_to_none=True)
                total.backward()
                if max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_([p for _, p in named], max_grad_norm)
                if config.client_gradient == "mean_batch_gradient":
                    for n, p in named:
                        if p.grad is not None:
                            grad_sum[n] += p.grad.detach()
                optimizer.step()
            step_losses.append(float(data_loss.detach()))
            terms.append(parts["objective_term"])
            if not math.isnan(parts["grad_norm"]):
                norms.append(parts["grad_norm"])
            labels = batch.get("labels") if isinstance(batch, Mapping) else None
            n_examples += int(labels.shape[0]) if isinstance(labels, torch.Tensor) else 0
    if not step_losses:
        raise InputError("the client has no training batches")
    final = OrderedDict((n, p.detach().clone()) for n, p in named)
    if config.client_gradient == "delta":
        gradient = OrderedDict((n, start[n] - final[n]) for n in final)
    else:
        gradient = OrderedDict((n, g / len(step_losses)) for n, g in grad_sum.items())
    return LocalUpdateResult(
        params=final,
        gradient=gradient,
        loss=sum(step_losses) / len(step_losses),
        step_losses=step_losses,
        n_steps=len(step_losses),
        n_examples=n_examples,
        mean_objective_term=sum(terms) / len(terms),
        mean_grad_norm=sum(norms) / len(norms) if norms else math.nan,
        timing=timer.stats(),
    )


# -- server ---------------------------------------------------------------------------------------
def plain_mean(updates: Sequence[Tensors]) -> tuple[OrderedDict[str, torch.Tensor], dict]:
    """Algorithm 1's global aggregation of the updates: ``(1/|S_t|) Σ_c Δ^c``.

    Tensor by tensor: with :class:`LazyTensors` updates only one tensor per client is made at a time.
    """
    if not updates:
        raise InputError("no client updates to aggregate")
    keys = list(updates[0])
    out = OrderedDict((k, sum(u[k] for u in updates) / len(updates)) for k in keys)
    return out, {"num_clients": len(updates)}


def update_difference(modulated: Sequence[Tensors], plain: Sequence[Tensors]) -> dict[str, float]:
    """How far FedSUMM's server update is from FedAvg's on the same replies (the round log's
    ``update_difference``).

    ``Δ_S`` = plain mean of the modulated updates ``w^c − g̃^c − w_t``, ``Δ_A`` = plain mean of
    ``w^c − w_t`` (both :func:`plain_mean`'s arithmetic, before any DP clipping or noise), and
    ``d = Δ_S − Δ_A``; in float64, tensor by tensor:

    * ``rel_diff`` = ‖d‖ / ‖Δ_A‖ (the issue's ‖Δ_FedSUMM − Δ_FedAvg‖ / ‖Δ_FedAvg‖);
    * ``best_scale`` s = ⟨Δ_S, Δ_A⟩ / ‖Δ_A‖²: the FedAvg step length that comes closest;
    * ``rel_diff_beyond_scale`` = ‖Δ_S − s·Δ_A‖ / ‖Δ_A‖ = sqrt(‖d‖² − ⟨d, Δ_A⟩²/‖Δ_A‖²) / ‖Δ_A‖:
      what FedSUMM changes besides the step length (0 when it only rescales FedAvg's step);
    * ``cosine`` between Δ_S and Δ_A; ``norm_fedavg`` = ‖Δ_A‖.
    """
    if len(modulated) != len(plain) or not plain:
        raise InputError("update_difference needs the same, non-zero number of updates")
    d2 = a2 = da = 0.0
    for k in plain[0]:
        a = (sum(u[k] for u in plain) / len(plain)).double()
        d = (sum(u[k] for u in modulated) / len(modulated)).double() - a
        d2 += float(d.pow(2).sum())
        a2 += float(a.pow(2).sum())
        da += float((d * a).sum())
    return _difference_summary(d2, a2, da)


def _difference_summary(d2: float, a2: float, da: float) -> dict[str, float]:
    """:func:`update_difference`'s values from ‖d‖², ‖Δ_A‖² and ⟨d, Δ_A⟩."""
    if a2 == 0.0:
        return {"rel_diff": math.nan, "best_scale": math.nan, "rel_diff_beyond_scale": math.nan,
                "cosine": math.nan, "norm_fedavg": 0.0}
    s2 = d2 + 2 * da + a2  # ‖Δ_S‖²
    return {
        "rel_diff": math.sqrt(d2 / a2),
        "best_scale": 1.0 + da / a2,
        "rel_diff_beyond_scale": math.sqrt(max(d2 - da * da / a2, 0.0) / a2),
        "cosine": (da + a2) / math.sqrt(s2 * a2) if s2 > 0 else math.nan,
        "norm_fedavg": math.sqrt(a2),
    }


def mean_difference_norm(a: Sequence[Tensors], b: Sequence[Tensors]) -> float:
    """‖mean(a) − mean(b)‖₂ of two lists of updates (plain means, float64 accumulation)."""
    total = 0.0
    for k in a[0]:
        x = (sum(u[k] for u in a) / len(a)).double() - (sum(u[k] for u in b) / len(b)).double()
        total += float(x.pow(2).sum())
    return math.sqrt(total)


def client_update(
    client_params: Tensors,
    global_params: Tensors,
    gradient: Tensors | None = None,
    scale: float | Mapping[str, float] | None = None,
) -> LazyTensors:
    """The update a client contributes to the mean, made tensor by tensor: ``w^c − w_t``, or with
    the server step ``w^c − g̃^c − w_t`` (``g̃ = gradient·scale``, or ``gradient`` when ``scale`` is
    None: the unmodulated unit-norm case)."""

    def make(k: str) -> torch.Tensor:
        g_k = None if gradient is None else gradient[k]
        return _update_term(client_params[k], global_params[k], g_k, scale, k)

    return LazyTensors({k: _shape(global_params, k) for k in global_params}, make)


def _update_term(p_k: torch.Tensor, w_k: torch.Tensor, g_k: torch.Tensor | None,
                 scale: float | Mapping[str, float] | None, k: str) -> torch.Tensor:
    """Tensor ``k`` of :func:`client_update` from the client's tensor ``p_k``, w_t's ``w_k`` and
    the gradient's ``g_k`` (all on one device): the one expression :func:`client_update`,
    :func:`plain_update_mean` and :meth:`FedSummServer._round_sums` use (the same bits)."""
    if g_k is None:
        return p_k.detach() - w_k
    g = g_k.detach() if scale is None else g_k.detach() * _scale_of(scale, k)
    return p_k.detach() - g - w_k


def plain_update_mean(
    w_t: Tensors, params: Sequence[Tensors]
) -> tuple[OrderedDict[str, torch.Tensor], dict]:
    """:func:`plain_mean` of the updates ``w^c − w_t`` (``client_update(p, w_t)`` for each client's
    ``p`` in ``params``), the same expression and order (the same bits), each client's tensor read
    once and the arithmetic on the compute device (:func:`server_compute_device`); CPU tensors
    back."""
    if not params:
        raise InputError("no client updates to aggregate")
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for k in w_t:
        w_k = _to_compute(w_t[k])
        total = 0
        for p in params:
            total = total + _update_term(_to_compute(p[k].detach()), w_k, None, None, k)
        out[k] = (total / len(params)).cpu()
        del total
    return out, {"num_clients": len(params)}


@dataclasses.dataclass
class _Guidance:
    """The server's record of what client c gets next: ``ClientGuidance`` without the tensors.

    ``gradient`` names the memory entry (the version the adapter used) in the store; ``scale`` is
    ε·ρ (``None``: the entry is sent unmodulated); g̃ = entry·scale is made when it is sent.
    """

    gradient: str | None
    scale: float | dict[str, float] | None
    rho: float | None
    previous_loss: float | None
    epsilon: float

    def state(self) -> dict:
        return dataclasses.asdict(self)


def _scale_of(scale: float | Mapping[str, float], key: str) -> float:
    return scale[key] if isinstance(scale, Mapping) else scale


def _modulated(
    entry: Tensors, scale: float | Mapping[str, float] | None
) -> OrderedDict[str, torch.Tensor]:
    if scale is None:
        return OrderedDict((k, v.detach().clone()) for k, v in entry.items())
    return OrderedDict((k, v.detach() * _scale_of(scale, k)) for k, v in entry.items())


SERVER_STATE_FORMAT = 2


class FedSummServer:
    """The server side of Algorithm 1: allocation, memory gradients, gradient adapter, aggregation.

    Per round the runner calls::

        clients = server.sample_clients(t)                      # S_t
        guidance = {c: server.guidance_for(c) for c in clients}  # sent with w_t
        ... clients run fedsumm_local_update(...) and return ClientReply ...
        w_next, log = server.server_round(t, w_t, replies)       # replies: {client: ClientReply}

    State that must persist between rounds (and across a resume): :meth:`state_dict` — the
    memory gradients, the clients' latest losses, the guidance to send, the ρ sums.

    What is kept per client, and where
    ----------------------------------
    The parameter-sized vectors are named, immutable entries of a store (RAM, or one file each on
    disk: ``state``, :class:`ServerStateConfig`): MG[c] (``memory``, ``state.dtype``), S_c
    (``tracker.client_sums``) and S_g (``tracker.global_sums``, shared by the clients with the same
    rounds).  The guidance is *not* a vector of its own: g̃^c = MG[v]·ε·ρ_c is a memory entry times
    a scalar, so ``guidance`` keeps the entry's name and the scalar and :meth:`guidance_for` makes
    g̃ when it is sent (the same multiplication as when it was stored, so the same bits); an entry
    a client's guidance still names stays in the store after MG[v] is replaced (``rank``).  The
    round itself works client by client and tensor by tensor (:class:`LazyTensors`): besides the
    replies it holds O(1) parameter-sized tensors, whatever the number of clients.
    """

    def __init__(
        self,
        config: FedSummConfig,
        client_ids: Sequence[str],
        seed: int,
        state: ServerStateConfig | None = None,
        state_dir: str | os.PathLike | None = None,
    ) -> None:
        if not client_ids:
            raise InputError("FedSUMM needs at least one client")
        if len(set(client_ids)) != len(client_ids):
            raise InputError("client ids must be unique")
        self.config = config
        self.state_config = state or ServerStateConfig()
        self.client_ids = sorted(str(c) for c in client_ids)
        self.client_index = {c: i for i, c in enumerate(self.client_ids)}
        self.seed = int(seed)
        self.store = make_vector_store(self.state_config, state_dir)
        self.memory: dict[str, str] = {}  # client -> name of MG[c] in the store
        self.losses: dict[str, float] = {}
        self.guidance: dict[str, _Guidance] = {}
        self.tracker = DiscrepancyTracker(
            config.softmax_scope,
            config.rho_reduction,
            config.rho_window,
            store=self.store,
            release=self._release,
        )
        self.last_round = 0

    # -- the store ------------------------------------------------------------------------------
    def live_names(self) -> set[str]:
        """The store entries the state refers to (MG, the guidance's entries, the ρ sums)."""
        names = set(self.memory.values()) | self.tracker.names()
        names |= {g.gradient for g in self.guidance.values() if g.gradient is not None}
        return names

    def _release(self) -> None:
        """Drop the store entries the state no longer refers to (RAM: freed; disk: the files stay
        until :meth:`collect_garbage`, a kept checkpoint may still name them)."""
        self.store.retain(self.live_names())

    def state_bytes(self) -> int:
        """Bytes of the parameter-sized vectors the state holds (in RAM, or on disk)."""
        return self.store.nbytes()

    def collect_garbage(self, keep: Iterable[str] = ()) -> int:
        """Disk storage: delete the files neither the state nor ``keep`` (the names a kept
        checkpoint refers to, :func:`state_names`) needs; returns the bytes freed."""
        return self.store.collect(set(keep) | self.live_names())

    def memory_entry(self, client: str) -> Mapping[str, torch.Tensor] | None:
        """MG[client] (float32 tensors; read from disk with disk storage), or None."""
        name = self.memory.get(client)
        return None if name is None else self.store.get(name)

    # -- Algorithm 1 ------------------------------------------------------------------------------
    def sample_clients(self, round_index: int) -> list[str]:
        """S_t: a random allocation of the C clients (seeded by seed and round), of size
        ``clients_per_round`` (default all)."""
        g = torch.Generator().manual_seed(derive_seed(self.seed, "fedsumm-allocation", round_index))
        order = [
            self.client_ids[i] for i in torch.randperm(len(self.client_ids), generator=g).tolist()
        ]
        k = self.config.clients_per_round or len(order)
        if k > len(order):
            raise InputError(
                f"fedsumm.algorithm.clients_per_round = {k} exceeds the {len(order)} clients"
            )
        return order[:k]

    def guidance_for(self, client: str) -> ClientGuidance | None:
        """What to send ``client`` with w_t: its modulated gradient, ρ and last loss (None at first)."""
        if client not in self.client_index:
            raise InputError(f"unknown client {client!r}")
        rec = self.guidance.get(client)
        if rec is None:
            return None
        gradient = None
        if rec.gradient is not None:
            gradient = _modulated(self.store.get(rec.gradient), rec.scale)
        return ClientGuidance(gradient, rec.rho, rec.previous_loss, rec.epsilon)

    def _start_round(
        self,
        round_index: int,
        global_params: Tensors,
        replies: Mapping[str, ClientReply],
        check_gradient: bool,
    ) -> tuple[list[str], OrderedDict[str, torch.Tensor]]:
        if not replies:
            raise InputError(f"round {round_index}: no client replied")
        unknown = [c for c in replies if c not in self.client_index]
        if unknown:
            raise InputError(f"round {round_index}: replies from unknown clients {unknown}")
        if round_index <= self.last_round:
            raise InputError(
                f"round {round_index} already aggregated (last round {self.last_round})"
            )
        clients = sorted(replies)  # fixed order: reruns give the same bits
        w_t = _detached(global_params)
        for c in clients:
            _check_same_keys(
                w_t, replies[c].params, f"round {round_index}, client {c!r} parameters"
            )
            if check_gradient:
                _check_same_keys(
                    w_t, replies[c].gradient, f"round {round_index}, client {c!r} gradient"
                )
        return clients, w_t

    def _rho(
        self, w_t: Tensors, replies: Mapping[str, ClientReply], clients: Sequence[str]
    ) -> dict[str, RhoResult]:
        """ρ_c of every replying client (eq. 5–6, under ``config.reading``) against the round's
        reference, with its per-group values and the distribution of ρ − 1."""
        with _resident():  # on a compute device: each vector moved there once (see _resident)
            return self._rho_resident(w_t, replies, clients)

    def _rho_resident(
        self, w_t: Tensors, replies: Mapping[str, ClientReply], clients: Sequence[str]
    ) -> dict[str, RhoResult]:
        cfg = self.config
        if cfg.rho_input == "update":
            # σ of the update directions: w^c − w_t against the round's mean update
            shape = {k: _shape(w_t, k) for k in w_t}
            w_c = OrderedDict((k, _to_compute(v)) for k, v in w_t.items())  # w_t, moved once

            def direction(t: torch.Tensor) -> torch.Tensor:
                return update_direction(t, cfg.direction_transform)

            inputs = {
                c: LazyTensors(
                    shape,
                    lambda k, p=replies[c].params: direction(_to_compute(p[k].detach()) - w_c[k]),
                )
                for c in clients
            }
            reference = OrderedDict(
                (
                    k,
                    direction(
                        sum(_to_compute(replies[c].params[k].detach()) - w_c[k] for c in clients)
                        / len(clients)
                    ),
                )
                for k in w_t
            )
        else:
            inputs = {c: replies[c].params for c in clients}
            if cfg.rho_reference == "round_mean":
                reference = OrderedDict(
                    (k, sum(replies[c].params[k].detach() for c in clients) / len(clients))
                    for k in w_t
                )
            else:
                reference = w_t
        sigma = softmax_normalize(reference, cfg.softmax_scope)
        del reference  # only σ_g,t is needed from here on
        return self.tracker.update_round_detailed(
            inputs, w_t, global_sigma=sigma, statistics=True
        )

    def _scale(self, names: Iterable[str], result: RhoResult) -> float | dict[str, float]:
        """ε·ρ for the adapter: one scalar (``literal``), or per tensor ε·ρ_G of its group."""
        if not self.config.per_group_modulation:
            return self.config.epsilon * result.rho
        groups = parameter_groups(names, self.config.softmax_scope)
        return {
            k: self.config.epsilon * value
            for group, value in zip(groups, result.groups, strict=True)
            for k in group
        }

    def _finish_round(
        self,
        round_index: int,
        w_t: Tensors,
        updates: Sequence[Tensors],
        aggregate: Callable[[Sequence[Tensors]], tuple[Tensors, dict]],
        mean: Tensors | None = None,
    ) -> tuple[OrderedDict[str, torch.Tensor], dict]:
        """``w_{t+1} = w_t + aggregate(updates)``; ``mean``: :func:`plain_mean` of ``updates``
        already computed (the same bits), so the updates are not read again."""
        if mean is not None:
            mean_update, info = mean, {"num_clients": len(updates)}
        else:
            mean_update, info = aggregate(updates)
        w_next = OrderedDict((k, w_t[k] + mean_update[k].to(w_t[k].dtype)) for k in w_t)
        self.last_round = round_index
        self._release()
        return w_next, info

    def server_round(
        self,
        round_index: int,
        global_params: Tensors,
        replies: Mapping[str, ClientReply],
        aggregate: Callable[[Sequence[Tensors]], tuple[Tensors, dict]] = plain_mean,
    ) -> tuple[OrderedDict[str, torch.Tensor], dict]:
        """Algorithm 1, one server round after the clients of S_t replied.

        Steps: update MG and the losses; ρ_c for every replying client; sort MG by loss; the
        gradient adapter ``g̃^c``; (``apply_on_server``) ``w^c ← w^c − g̃^c``; aggregation
        ``w_{t+1} = w_t + aggregate([w^c − w_t])`` (plain mean, or DP).

        Returns
        -------
        (OrderedDict, dict)
            ``w_{t+1}`` and the round's log: ``rho`` {client: ρ}, ``rho_mean``, ``memory_order``
            (MG sorted by loss), ``losses``, ``gradient_norms`` (‖MG[v]‖ used per client),
            ``modulated`` {client: bool}, ``memory_source`` {client: whose MG entry},
            ``aggregate`` (info of the aggregation function, e.g. DP noise scale).
        """
        clients, w_t = self._start_round(round_index, global_params, replies, check_gradient=True)
        for c in clients:  # their guidance was sent with w_t and is replaced below
            self.guidance.pop(c, None)
        for c in clients:
            self.memory[c] = self.store.put(
                f"mg-{self.client_index[c]:04d}",
                replies[c].gradient,
                self.state_config.torch_dtype,
                norm=True,
            )
            self.losses[c] = float(replies[c].loss)
            self._release()  # the superseded MG[c], unless a guidance still names it
        order = sort_memory_by_loss(self.losses)
        results = self._rho(w_t, replies, clients)
        rho = {c: r.rho for c, r in results.items()}

        log: dict = {
            "round": round_index,
            "clients": clients,
            "rho": rho,
            "rho_mean": sum(rho.values()) / len(rho),
            "rho_statistics": {c: r.statistics for c, r in results.items()},
            "memory_order": order,
            "losses": {c: self.losses[c] for c in clients},
            "gradient_norms": {},
            "modulated": {},
            "memory_source": {},
        }
        updates, chosen = [], []
        for c in clients:
            source, entry_name, entry, scale, modulated, norm = self._adapter(
                c, order, results[c], w_t, self.config.memory_assignment
            )
            log["gradient_norms"][c] = norm
            log["modulated"][c] = modulated
            log["memory_source"][c] = source
            self.guidance[c] = _Guidance(
                entry_name, scale, rho[c], self.losses[c], self.config.epsilon
            )
            updates.append(self._server_update(replies[c].params, w_t, entry, scale))
            chosen.append(self._applied(entry, scale))
        # the other memory assignment on the same replies: what the sort by loss changes
        other = "own" if self.config.memory_assignment == "rank" else "rank"
        alternative = [
            self._applied(*self._adapter(c, order, results[c], w_t, other)[2:4]) for c in clients
        ]
        mean, diff, other_norm = self._round_sums(w_t, [replies[c].params for c in clients],
                                                  chosen, alternative)
        diff[f"rel_diff_vs_{other}"] = (
            other_norm / diff["norm_fedavg"] if diff["norm_fedavg"] > 0 else math.nan
        )
        log["update_difference"] = diff
        w_next, log["aggregate"] = self._finish_round(
            round_index, w_t, updates, aggregate,
            mean=mean if aggregate is plain_mean else None,
        )
        return w_next, log

    def _applied(self, entry, scale) -> tuple:
        """``(gradient, scale)`` of :func:`client_update` for :meth:`_server_update`'s update."""
        if self.config.apply_on_server and entry is not None:
            return entry, scale
        return None, None

    def _round_sums(
        self,
        w_t: Tensors,
        params: Sequence[Tensors],
        chosen: Sequence[tuple],
        alternative: Sequence[tuple],
    ) -> tuple[OrderedDict[str, torch.Tensor], dict[str, float], float]:
        """One pass over the round's tensors for what FedSUMM's server round computes from the
        clients' updates: the plain mean of the updates ``w^c − g̃^c − w_t`` (:func:`plain_mean`),
        :func:`update_difference` against the plain updates ``w^c − w_t`` and
        :func:`mean_difference_norm` against the other memory assignment's updates -- the same
        expressions in the same order (the same bits), but each client's tensor and memory
        entries read once per tensor (the reply from the wave spool, MG from disk), not once per
        quantity, and the arithmetic on the compute device (:func:`server_compute_device`).
        ``chosen`` / ``alternative``: per client ``(gradient, scale)`` of its update."""
        n = len(params)
        mean: OrderedDict[str, torch.Tensor] = OrderedDict()
        d2 = a2 = da = other2 = 0.0
        for k in w_t:
            w_k = _to_compute(w_t[k])
            s_sum = a_sum = o_sum = 0  # sum(...) of the separate functions: the same left fold
            for p, (g, sc), (g_o, sc_o) in zip(params, chosen, alternative, strict=True):
                p_k = _to_compute(p[k].detach())
                plain = p_k - w_k
                s_sum = s_sum + (plain if g is None
                                 else _update_term(p_k, w_k, _to_compute(g[k]), sc, k))
                a_sum = a_sum + plain
                o_sum = o_sum + (plain if g_o is None
                                 else _update_term(p_k, w_k, _to_compute(g_o[k]), sc_o, k))
                del p_k, plain
            mean_s = s_sum / n
            a = (a_sum / n).double()
            d = mean_s.double() - a
            d2 += float(d.pow(2).sum())
            a2 += float(a.pow(2).sum())
            da += float((d * a).sum())
            x = mean_s.double() - (o_sum / n).double()
            other2 += float(x.pow(2).sum())
            mean[k] = mean_s.cpu()
            del s_sum, a_sum, o_sum, a, d, x
        return mean, _difference_summary(d2, a2, da), math.sqrt(other2)

    def _adapter(
        self, client: str, order: Sequence[str], result: RhoResult, w_t: Tensors, assignment: str
    ) -> tuple:
        """Algorithm 1's gradient adapter for ``client`` under a memory ``assignment``:
        ``(source, entry name, entry, scale, modulated, ‖entry‖)`` with g̃ = entry·scale (scale
        None: sent unmodulated; entry None: nothing to send yet)."""
        source = client
        if assignment == "rank":
            idx = self.client_index[client]
            source = order[idx] if idx < len(order) else None
        entry_name = None if source is None else self.memory[source]
        entry, scale, modulated, norm = None, None, False, math.nan
        if entry_name is not None:
            # Algorithm 1's adapter (modulate_gradient), g̃ kept as (entry, ε·ρ_c)
            entry = self.store.get(entry_name)
            norm = self.store.l2_norm(entry_name)
            modulated = abs(norm - 1.0) > self.config.unit_norm_tolerance
            scale = self._scale(w_t, result) if modulated else None
        return source, entry_name, entry, scale, modulated, norm

    def _server_update(self, params: Tensors, w_t: Tensors, entry, scale) -> LazyTensors:
        """``w^c − g̃^c − w_t`` (``apply_on_server`` and an entry to apply), else ``w^c − w_t``."""
        if self.config.apply_on_server and entry is not None:
            return client_update(params, w_t, entry, scale)
        return client_update(params, w_t)

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything that must survive between rounds (save with ``torch.save``).

        With disk storage the vectors stay in their files and the state names them (a few kB);
        with memory storage the state holds the tensors (shared ones once).
        """
        return {
            "format": SERVER_STATE_FORMAT,
            "config": dataclasses.asdict(self.config),
            "server_state": dataclasses.asdict(self.state_config),
            "client_ids": list(self.client_ids),
            "seed": self.seed,
            "last_round": self.last_round,
            "memory": dict(self.memory),
            "losses": dict(self.losses),
            "guidance": {c: g.state() for c, g in self.guidance.items()},
            "tracker": self.tracker.state_dict(),
            "store": self.store.state_dict(self.live_names()),
        }

    def load_state_dict(self, state: Mapping) -> None:
        if state.get("format") != SERVER_STATE_FORMAT:
            raise InputError(
                f"saved FedSUMM server state has format {state.get('format')}, expected "
                f"{SERVER_STATE_FORMAT}; delete the cell's checkpoints to restart it"
            )
        if (
            state["config"] != dataclasses.asdict(self.config)
            or state["server_state"] != dataclasses.asdict(self.state_config)
            or state["client_ids"] != self.client_ids
            or state["seed"] != self.seed
        ):
            raise InputError(
                "saved FedSUMM server state was made with another config, server_state, client "
                "list or seed"
            )
        self.store.load_state_dict(state["store"])
        self.last_round = int(state["last_round"])
        self.memory = dict(state["memory"])
        self.losses = dict(state["losses"])
        self.guidance = {c: _Guidance(**g) for c, g in state["guidance"].items()}
        self.tracker.load_state_dict(state["tracker"])


def state_names(state: Mapping) -> set[str]:
    """The store entries a saved server state (:meth:`FedSummServer.state_dict`) refers to."""
    store = state.get("store") or {}
    return set(store.get("meta") or store.get("vectors") or {})
