"""FedSum (*Data-Efficient Federated Learning under Data Scarcity Scenario for Text
Summarization*, ``../shared/papers/fedsum.md``): Algorithms 1–3 and eq. 2–7 on BERTSUM.

FedSum extends FedAvg in *depth* and *breadth* (§1, Fig. 1):

* **depth** -- Data Partition (§4.1, Alg. 3) puts each batch in the *normal* or the *prime*
  subset by comparing its local significance ε and bias level Q with last round's global
  ε̄, Q̄ (eq. 2); the Data skip mechanism (§4.2, Alg. 2 lines 6–9) drops the data loss of a normal
  batch with probability ρ = (t/T)·(e/E)·(j/τ_i);
* **breadth** -- Multi-knowledge Local Training (§4.2): prototype knowledge L_po (eq. 3–5) and
  parameter knowledge L_pm (eq. 6–7: semantic portraits, the server's Portrait Distance Table,
  Bernoulli-perturbed heads of the other clients).

The representation model r(θ) trains on L_data + L_pm (per batch) and L_po (one step after the
local epochs, Alg. 2 line 24); the head h(ω) on L_data only.

Interface for the runner (no Flower here)
-----------------------------------------
Server, per round (state in :class:`FedSumServerState`)::

    bc = fedsum_broadcast(state, client, total_rounds, variant)          # Alg. 1 line 4
    ... client runs fedsum_local_update(model, batches, bc, hp, variant, ...) -> FedSumUpload
    omega_g = fedsum_server_round(state, {client: upload}, hp, seed)     # Alg. 1 lines 8–15

Before round 1 (paper: "the PDT can be initialized randomly or according to the initial semantic
portrait provided by clients"), with ``pdt_init="portraits"`` every client computes
:func:`initial_semantic_portrait` with the initial global model and the server stores it with
``state.pdt.update(client, portrait)``.  Clients keep no state between rounds: everything
FedSum carries over (ε̄, Q̄, P̄_c, PDT, perturbed heads) lives on the server.

Table 4's ablation: :data:`VARIANTS` -- ``"FedSum-depth"`` is FedAvg + the depth extension (Data
Partition + Data skip), ``"FedSum"`` both extensions; the FedAvg reference row is the plain
FedAvg baseline (:mod:`fedrepro.papers.fedsum.baselines`), which is what this local update
computes with every switch off.

Choices the paper leaves open (all ours; ``docs/decisions-fedsum.md`` lists them with the config
keys)
-------------------------------------------------------------------------------------------------
* **n in the n_i/n weights** (eq. 2, Alg. 1 lines 14–15): the sum over the round's participants
  C_α, so the weights sum to 1 (with §3's n over all K clients, 20 % participation would shrink
  θ, ω, ε̄, Q̄ and P̄ five-fold).
* **Q (Alg. 3 lines 3–8)**: the 1-based position of the first sentence column at which the
  cumulative per-document count of key sentences reaches λ × the batch's per-document total
  (``≥``, the paper's comparison; line 5's square brackets read as grouping, not a ceiling);
  compared with a 1e-9 relative tolerance so that e.g. 0.3 × 10 = 3 holds.  A batch without any
  key sentence gets Q = 1.  m = the batch's padded sentence count.
* **Normal iff Q < Q̄ and ε < ε̄** (Alg. 3 line 9, strict); round 1 has ε̄ = Q̄ = 0, so nothing is
  normal.  The decision is per batch and per epoch (batches are re-sampled each epoch), not a
  set that grows over the round.
* **Every batch's ε and Q enter eq. 2**, skipped or not; the client uploads their mean over its
  E·τ_i batches and the server weights those means by n_i/n (eq. 2).
* **Skip draw**: ρ̂ ~ U(0,1) drawn for *every* batch (Alg. 2 line 6) from a NumPy generator seeded
  by (seed, client, round), so the stream does not depend on the partition outcomes; skip iff the
  batch is normal and ρ̂ ≤ ρ.  t, e, j are 1-based; τ_i is the number of batches of that epoch.
* **A skipped batch** contributes no L_data, but L_pm still trains θ on it (Alg. 2 lines 9–17).
* **Loss per batch**: L_θ, L_ω are reset per batch (Alg. 2 line 10's ``:=`` accumulation read as
  the batch's loss); since L_pm uses frozen received heads, ∇_ω(L_data + L_pm) = ∇_ω L_data, so one
  backward of L_data + L_pm gives both updates of lines 19–20.
* **L_pm** is summed over the received heads (Alg. 2 lines 13–16; the authors' code divides by
  their number -- ``parameter_knowledge_reduction: mean``).  PK_i holds the perturbed heads of the
  *previous round's* participants other than i (Alg. 1 line 12's ω̃_i read as ω̃_p, as eq. 7
  writes it), weighted by ζ_p = PDT[i][p].
* **Perturbation** ω̃ = Dropout(ω, γ) (Alg. 1 line 11): every head parameter element is zeroed
  with probability γ (Bernoulli), without the 1/(1−γ) rescaling by default (as the authors' code;
  ``dropout_rescale: true`` gives PyTorch's inverted dropout); γ = 0.3 (authors' code; the paper
  gives no value).  Drawn once per uploaded head per round from (seed, round, client).
* **Prototypes** (eq. 3–4) are measured over the client's whole training set after the local
  epochs, with the model in eval mode (no dropout); a sentence is *predicted* class 1 when its
  score φ̂ > 0.5.  A class with no sentence has no prototype: its terms drop out of L_po, it is
  averaged on the server over the clients that have it (weights renormalised), and its block of
  the semantic portrait is zeros.
* **L_po step** (Alg. 2 line 24): one SGD step of θ (head untouched) on eq. 5 with the client's
  learning rate, in round t ≥ 2.  Its exact gradient is computed in two passes over the data
  (prototypes and ∂L_po/∂P first, then Σ ⟨∂L_po/∂P, ∂P/∂θ⟩ batch by batch), so no pass holds the
  whole client set in one graph; the uploaded prototypes and portrait are those before the step
  (Alg. 2 line 22 precedes line 24).  Norms are Euclidean, not squared.
* **PDT** = tanh(‖SP_i − SP_p‖₂), with the latest portrait of each client (clients that have not
  participated since keep their last one); ``pdt_init="portraits"`` (default, as the authors'
  code: every client's portrait under the initial model) or ``"random"`` (U[0,1) symmetric, zero
  diagonal, replaced once both portraits are known).
* **Optimiser**: plain SGD (authors' code; lr 5e-3), a fresh one each round; the seed of the
  round's dropout is set from (seed, client, round) at the start of the local update.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from fedrepro.io import InputError
from fedrepro.papers.fedsum.model import (
    BertSumBatch,
    BertSumExt,
    SentenceClassifier,
    data_loss,
    sentence_loss_matrix,
)

CLASSES = (0, 1)


# -- settings --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FedSumHParams:
    """Client/server settings.  λ = 0.5 (Fig. 5's best, the authors' code); γ = 0.3 (authors'
    code); SGD lr 5e-3, 2 local epochs (authors' code); ``pdt_init`` for
    :func:`new_server_state` (see the module docstring)."""

    lam: float = 0.5
    gamma: float = 0.3
    dropout_rescale: bool = False
    lr: float = 5e-3
    local_epochs: int = 2
    parameter_knowledge_reduction: str = "sum"
    prediction_threshold: float = 0.5
    pdt_init: str = "portraits"

    def __post_init__(self):
        if not 0.0 <= self.lam <= 1.0:
            raise InputError(f"fedsum.lam (λ) must be in [0, 1], got {self.lam}")
        if not 0.0 <= self.gamma < 1.0:
            raise InputError(f"fedsum.gamma (γ) must be in [0, 1), got {self.gamma}")
        if self.lr <= 0 or self.local_epochs < 1:
            raise InputError(
                f"fedsum: lr must be > 0 and local_epochs >= 1, got {self.lr}, {self.local_epochs}"
            )
        if self.parameter_knowledge_reduction not in ("sum", "mean"):
            raise InputError(
                "fedsum.parameter_knowledge_reduction must be 'sum' or 'mean', got "
                f"{self.parameter_knowledge_reduction!r}"
            )
        if self.pdt_init not in ("portraits", "random"):
            raise InputError(
                f"fedsum.pdt_init must be 'portraits' or 'random', got {self.pdt_init!r}"
            )

    @classmethod
    def from_config(cls, cfg: Mapping) -> FedSumHParams:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(cfg) - set(fields)
        if unknown:
            raise InputError(
                f"fedsum: unknown hyperparameters {sorted(unknown)}; known: {sorted(fields)}"
            )
        kw = {}
        for k, v in cfg.items():
            default = fields[k].default
            kw[k] = type(default)(v) if not isinstance(default, bool) else bool(v)
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class FedSumVariant:
    """Which extensions are on (Table 4).  ``depth`` = Data Partition + Data skip (§4.1, §4.2
    "Data knowledge and Data skip"); breadth = ``prototype_knowledge`` (L_po, eq. 3–5) and
    ``parameter_knowledge`` (L_pm, eq. 6–7)."""

    name: str
    depth: bool
    prototype_knowledge: bool
    parameter_knowledge: bool

    @property
    def needs_prototypes(self) -> bool:
        return self.prototype_knowledge or self.parameter_knowledge


VARIANTS: dict[str, FedSumVariant] = {
    "FedSum": FedSumVariant("FedSum", True, True, True),  # Table 4 "+ Two Extensions"
    "FedSum-depth": FedSumVariant("FedSum-depth", True, False, False),  # "+ Depth Extension"
    "FedSum-breadth": FedSumVariant("FedSum-breadth", False, True, True),  # not in the paper
}


def get_variant(variant: str | FedSumVariant) -> FedSumVariant:
    if isinstance(variant, FedSumVariant):
        return variant
    try:
        return VARIANTS[variant]
    except KeyError:
        raise InputError(f"unknown FedSum variant {variant!r}; known: {list(VARIANTS)}") from None


# -- Data Partition (Alg. 3) and Data skip ---------------------------------------------------------
def masked_loss_matrix(label_matrix: torch.Tensor, loss_matrix: torch.Tensor) -> torch.Tensor:
    """MM = LD ⊙ LM (FedSum Alg. 3 line 1): the loss of the key sentences only."""
    if label_matrix.shape != loss_matrix.shape:
        raise InputError(f"LD {tuple(label_matrix.shape)} and LM {tuple(loss_matrix.shape)} differ")
    return label_matrix.to(loss_matrix.dtype) * loss_matrix


def local_significance(label_matrix: torch.Tensor, loss_matrix: torch.Tensor) -> float:
    """ε_(i,j) = Σ_b Σ_c MM[b][c] / B (FedSum Alg. 3 line 2)."""
    mm = masked_loss_matrix(label_matrix, loss_matrix)
    return float(mm.detach().double().sum() / mm.shape[0])


def bias_level(label_matrix: torch.Tensor, lam: float) -> int:
    """Q_(i,j) (FedSum Alg. 3 lines 3–8): the smallest Q ∈ 1..m with
    Σ_b Σ_{c≤Q} LD[b][c] / B ≥ λ · Σ_b Σ_{c≤m} LD[b][c] / B.

    ``label_matrix`` is LD (B × m, 0/1, zero at padded sentence slots).  The smaller Q, the more
    the batch's key sentences sit at the front (leading bias).
    """
    if label_matrix.dim() != 2 or label_matrix.shape[1] < 1:
        raise InputError(f"LD must be B × m with m >= 1, got {tuple(label_matrix.shape)}")
    if not 0.0 <= lam <= 1.0:
        raise InputError(f"λ must be in [0, 1], got {lam}")
    b = label_matrix.shape[0]
    per_column = label_matrix.detach().double().sum(0) / b
    cumulative = torch.cumsum(per_column, 0)
    threshold = lam * float(per_column.sum())
    tol = 1e-9 * max(1.0, abs(threshold))
    hits = torch.nonzero(cumulative >= threshold - tol)
    return int(hits[0, 0]) + 1 if len(hits) else int(label_matrix.shape[1])


@dataclasses.dataclass(frozen=True)
class PartitionDecision:
    """Alg. 3's output for one batch: Q, ε and the subset (normal or prime)."""

    bias_level: int
    significance: float
    normal: bool


def data_partition(
    label_matrix: torch.Tensor,
    loss_matrix: torch.Tensor,
    lam: float,
    global_significance: float,
    global_bias_level: float,
) -> PartitionDecision:
    """FedSum Alg. 3: normal iff Q < Q̄^(t−1) and ε < ε̄^(t−1) (line 9), else prime."""
    q = bias_level(label_matrix, lam)
    eps = local_significance(label_matrix, loss_matrix)
    return PartitionDecision(q, eps, bool(q < global_bias_level and eps < global_significance))


def skip_probability(t: int, total_rounds: int, e: int, epochs: int, j: int, tau: int) -> float:
    """ρ_(i,j) = (t/T)·(e/E)·(j/τ_i) (FedSum §4.2, Alg. 2 line 6); all indices 1-based."""
    for name, i, n in (("round t", t, total_rounds), ("epoch e", e, epochs), ("batch j", j, tau)):
        if not 1 <= i <= n:
            raise InputError(f"skip probability: {name} = {i} outside 1..{n}")
    return (t / total_rounds) * (e / epochs) * (j / tau)


def skip_decision(rng: np.random.Generator, rho: float, normal: bool) -> tuple[float, bool]:
    """Draw ρ̂ ~ U(0,1) (always, Alg. 2 line 6); skip iff the batch is normal and ρ̂ ≤ ρ (line 8)."""
    rho_hat = float(rng.random())
    return rho_hat, bool(normal and rho_hat <= rho)


def skip_rng(seed: int, client: str | int, t: int) -> np.random.Generator:
    """The Data-skip generator of one client round, from (seed, client, round)."""
    from fedrepro.data.seq2seq import derive_seed

    return np.random.default_rng(derive_seed(seed, "fedsum-skip", client, t))


# -- prototypes (eq. 3–5) and portraits (eq. 6) ----------------------------------------------------
@dataclasses.dataclass
class ClientPrototypes:
    """P_(i,c)^ξ (eq. 3), P_(i,p)^ξ (eq. 4) and their counts n_(i,c)^ξ, n̂_(i,p)^ξ; None = no
    sentence of that class."""

    class_prototypes: dict[int, torch.Tensor | None]
    class_counts: dict[int, int]
    prediction_prototypes: dict[int, torch.Tensor | None]
    prediction_counts: dict[int, int]


def prototypes_by_class(
    vectors: torch.Tensor, classes: torch.Tensor
) -> tuple[dict[int, torch.Tensor | None], dict[int, int]]:
    """Mean of the rows of ``vectors`` (N × H) per class ξ ∈ {0, 1} of ``classes`` (N): the core of
    eq. 3 (classes = labels φ) and eq. 4 (classes = predicted classes)."""
    if vectors.dim() != 2 or classes.shape != vectors.shape[:1]:
        raise InputError(
            f"prototypes: vectors must be N × H and classes N, got "
            f"{tuple(vectors.shape)} and {tuple(classes.shape)}"
        )
    protos, counts = {}, {}
    for xi in CLASSES:
        sel = classes == xi
        counts[xi] = int(sel.sum())
        protos[xi] = vectors[sel].mean(0) if counts[xi] else None
    return protos, counts


def predicted_classes(scores: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """1(φ̂ = ξ) of eq. 4: class 1 iff the score exceeds ``threshold``."""
    return (scores > threshold).long()


def compute_prototypes(
    vectors: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor, threshold: float = 0.5
) -> ClientPrototypes:
    """Class (eq. 3) and prediction (eq. 4) prototypes of the valid sentences (rows of
    ``vectors``) with their labels and scores."""
    cp, cc = prototypes_by_class(vectors, labels.long())
    pp, pc = prototypes_by_class(vectors, predicted_classes(scores, threshold))
    return ClientPrototypes(cp, cc, pp, pc)


def prototype_loss(
    global_class_prototypes: Mapping[int, torch.Tensor | None],
    class_prototypes: Mapping[int, torch.Tensor | None],
    prediction_prototypes: Mapping[int, torch.Tensor | None],
) -> torch.Tensor:
    """L_po = Σ_ξ ‖P̄_c^(ξ,t−1) − P_(i,c)^(ξ,t)‖₂ − ‖P_(i,p)^(1,t) − P_(i,p)^(0,t)‖₂ (FedSum eq. 5).

    The first ("generalizable") term pulls the local class prototypes toward the server's;
    the second ("discriminative") pushes the two prediction prototypes apart.  A term whose
    prototypes are missing (None) is left out.
    """
    terms = []
    for xi in CLASSES:
        g, p = global_class_prototypes.get(xi), class_prototypes.get(xi)
        if g is not None and p is not None:
            terms.append(torch.linalg.vector_norm(g.detach().to(p.dtype) - p))
    p0, p1 = prediction_prototypes.get(0), prediction_prototypes.get(1)
    if p0 is not None and p1 is not None:
        terms.append(-torch.linalg.vector_norm(p1 - p0))
    if not terms:
        ref = next(
            (
                v
                for v in (*class_prototypes.values(), *prediction_prototypes.values())
                if v is not None
            ),
            None,
        )
        return torch.zeros((), dtype=ref.dtype if ref is not None else torch.float32)
    return torch.stack(terms).sum()


def semantic_portrait(class_prototypes: Mapping[int, torch.Tensor | None], hidden_size: int):
    """SP_i = Concat(P_(i,c)^0, P_(i,c)^1) (FedSum eq. 6); a missing class contributes zeros."""
    present = [p for p in class_prototypes.values() if p is not None]
    device = present[0].device if present else None  # zeros beside a CUDA prototype live on CUDA
    parts = []
    for xi in CLASSES:
        p = class_prototypes.get(xi)
        parts.append(p.detach().float() if p is not None else torch.zeros(hidden_size, device=device))
    return torch.cat(parts)


def portrait_distance(sp_i: torch.Tensor, sp_p: torch.Tensor) -> float:
    """PDT[i][p] = tanh(‖SP_i − SP_p‖₂) (FedSum Alg. 1 line 10)."""
    return float(torch.tanh(torch.linalg.vector_norm(sp_i.double() - sp_p.double())))


def portrait_distance_table(portraits: Sequence[torch.Tensor]) -> torch.Tensor:
    """K × K table of :func:`portrait_distance` (symmetric, zero diagonal, values in [0, 1))."""
    sp = torch.stack([p.double() for p in portraits])
    return torch.tanh(torch.linalg.vector_norm(sp[:, None, :] - sp[None, :, :], dim=-1))


class PortraitDistanceTable:
    """The server's PDT over all K clients, from each client's latest semantic portrait.

    ``init="portraits"``: every client's portrait must be known before its entries are used
    (store the initial ones with :meth:`update` before round 1).  ``init="random"``: unknown
    pairs use a seeded U[0,1) value (symmetric), replaced once both portraits are known.
    """

    def __init__(self, clients: Sequence[str], init: str = "portraits", seed: int = 0):
        if init not in ("portraits", "random"):
            raise InputError(f"fedsum.pdt_init must be 'portraits' or 'random', got {init!r}")
        self.clients = sorted(str(c) for c in clients)
        if len(set(self.clients)) != len(self.clients):
            raise InputError("PDT: duplicate client ids")
        self.init = init
        self.seed = int(seed)
        self.portraits: dict[str, torch.Tensor] = {}
        k = len(self.clients)
        rng = np.random.default_rng(seed)
        upper = np.triu(rng.random((k, k)), 1)
        self._random = upper + upper.T

    def _index(self, client: str) -> int:
        try:
            return self.clients.index(str(client))
        except ValueError:
            raise InputError(f"PDT: unknown client {client!r}") from None

    def update(self, client: str, portrait: torch.Tensor) -> None:
        self._index(client)
        self.portraits[str(client)] = portrait.detach().clone()

    def weight(self, i: str, p: str) -> float:
        """ζ_p = PDT[i][p]."""
        a, b = self._index(i), self._index(p)
        if a == b:
            return 0.0
        si, sp = self.portraits.get(str(i)), self.portraits.get(str(p))
        if si is not None and sp is not None:
            return portrait_distance(si, sp)
        if self.init == "random":
            return float(self._random[a, b])
        missing = [c for c, s in ((i, si), (p, sp)) if s is None]
        raise InputError(
            f"PDT[{i}][{p}]: no semantic portrait of client(s) {missing} yet; store "
            f"the initial portraits before round 1 or set fedsum.pdt_init: random"
        )

    def table(self) -> torch.Tensor:
        """The full K × K table (clients in sorted order)."""
        k = len(self.clients)
        out = torch.zeros((k, k), dtype=torch.float64)
        for a in range(k):
            for b in range(a + 1, k):
                out[a, b] = out[b, a] = self.weight(self.clients[a], self.clients[b])
        return out


# -- parameter knowledge (Alg. 1 line 11, eq. 7) ---------------------------------------------------
def perturb_head(
    head_state: Mapping[str, torch.Tensor],
    gamma: float,
    generator: torch.Generator,
    rescale: bool = False,
) -> OrderedDict[str, torch.Tensor]:
    """ω̃ = Dropout(ω, γ) (FedSum Alg. 1 line 11): each element kept with probability 1 − γ
    (Bernoulli noise), zeroed otherwise; ``rescale`` divides the kept ones by 1 − γ."""
    if not 0.0 <= gamma < 1.0:
        raise InputError(f"γ must be in [0, 1), got {gamma}")
    out = OrderedDict()
    for k in sorted(head_state):
        w = head_state[k].detach()
        keep = torch.bernoulli(
            torch.full(w.shape, 1.0 - gamma, dtype=torch.float64), generator=generator
        ).to(w.dtype)
        out[k] = w * keep / (1.0 - gamma) if rescale else w * keep
    return out


def frozen_head(template: SentenceClassifier, state: Mapping[str, torch.Tensor]):
    """A copy of ``template`` holding ``state``, with no parameter requiring grad."""
    head = copy.deepcopy(template)
    BertSumExt._load(head, state, "received head (ω̃)")
    for p in head.parameters():
        p.requires_grad_(False)
    return head


def parameter_knowledge_loss(
    sentence_vectors: torch.Tensor,
    labels: torch.Tensor,
    cls_mask: torch.Tensor,
    received_heads: Sequence[tuple[float, SentenceClassifier]],
    reduction: str = "sum",
) -> torch.Tensor:
    """L_pm = Σ_p ζ_p · Σ_b Σ_c ℓ(h(ω̃_p, H_j), LD)[b][c] / B (FedSum eq. 7, Alg. 2 lines 13–16).

    ``received_heads``: (ζ_p = PDT[i][p], frozen perturbed head ω̃_p); gradients reach θ only,
    through H_j.  ``reduction="mean"`` divides by the number of heads (the authors' code).
    """
    total = sentence_vectors.new_zeros(())
    for zeta, head in received_heads:
        lm = sentence_loss_matrix(head.logits(sentence_vectors), labels, cls_mask)
        total = total + float(zeta) * data_loss(lm)
    if reduction == "mean" and received_heads:
        total = total / len(received_heads)
    return total


# -- aggregation (eq. 2, Alg. 1 lines 14–15) -------------------------------------------------------
def _normalised(weights: Sequence[float]) -> list[float]:
    w = [float(x) for x in weights]
    if not w or any(x < 0 for x in w) or sum(w) <= 0:
        raise InputError(f"aggregation weights must be >= 0 with a positive sum, got {w}")
    s = math.fsum(w)
    return [x / s for x in w]


def weighted_average(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> OrderedDict[str, torch.Tensor]:
    """Σ_i (n_i/n)·state_i over the participants, n = Σ_i n_i (FedSum Alg. 1 line 14; FedAvg).

    Summed in float64 in the order given (sort the replies first for bit-identical reruns).
    """
    if len(states) != len(weights) or not states:
        raise InputError(f"weighted_average: {len(states)} states for {len(weights)} weights")
    w = _normalised(weights)
    keys = list(states[0])
    for s in states[1:]:
        if set(s) != set(keys):
            raise InputError("weighted_average: client states have different keys")
    out = OrderedDict()
    for k in keys:
        acc = torch.zeros(states[0][k].shape, dtype=torch.float64)
        for wi, s in zip(w, states):
            acc += wi * s[k].detach().double()
        out[k] = acc.to(states[0][k].dtype)
    return out


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """Σ_i (n_i/n)·v_i: the server half of eq. 2 (ε̄, Q̄) given each client's mean over its
    E·τ_i batches."""
    if len(values) != len(weights):
        raise InputError(f"weighted_mean: {len(values)} values for {len(weights)} weights")
    return math.fsum(wi * float(v) for wi, v in zip(_normalised(weights), values))


def aggregate_class_prototypes(
    prototypes: Sequence[Mapping[int, torch.Tensor | None]], weights: Sequence[float]
) -> dict[int, torch.Tensor | None]:
    """P̄_c^(ξ,t) = Σ_i (n_i/n)·P_(i,c)^(ξ,t) (FedSum Alg. 1 line 15), per class over the clients
    that have a prototype of it (weights renormalised); None if none has."""
    out: dict[int, torch.Tensor | None] = {}
    for xi in CLASSES:
        have = [(p[xi], w) for p, w in zip(prototypes, weights) if p.get(xi) is not None]
        if not have:
            out[xi] = None
            continue
        w = _normalised([x[1] for x in have])
        acc = torch.zeros(have[0][0].shape, dtype=torch.float64)
        for wi, (p, _) in zip(w, have):
            acc += wi * p.detach().double()
        out[xi] = acc.float()
    return out


# -- messages and server state ---------------------------------------------------------------------
@dataclasses.dataclass
class FedSumBroadcast:
    """What the server sends client i for round t (Alg. 1 line 4, plus PK_i and P̄_c)."""

    round: int  # t, 1-based
    total_rounds: int  # T
    global_significance: float = 0.0  # ε̄^(t−1)
    global_bias_level: float = 0.0  # Q̄^(t−1)
    global_class_prototypes: dict[int, torch.Tensor | None] = dataclasses.field(
        default_factory=lambda: {0: None, 1: None}
    )  # P̄_c^(ξ,t−1)
    parameter_knowledge: list[tuple[float, OrderedDict]] = dataclasses.field(
        default_factory=list
    )  # PK_i = [(PDT[i][p], ω̃_p)]


@dataclasses.dataclass
class FedSumUpload:
    """What client i returns (Alg. 2 line 26): Ω_i, the means of ε and Q over its batches (its
    part of eq. 2), its class prototypes and semantic portrait, plus logging statistics."""

    num_examples: int
    federated_state: OrderedDict  # Ω_i = {representation.*, head.*}
    mean_significance: float
    mean_bias_level: float
    class_prototypes: dict[int, torch.Tensor | None] | None
    semantic_portrait: torch.Tensor | None
    stats: dict


@dataclasses.dataclass
class FedSumServerState:
    """Everything FedSum keeps between rounds besides Ω_g (which the strategy holds)."""

    pdt: PortraitDistanceTable
    round: int = 0  # the last finished round t
    global_significance: float = 0.0  # ε̄ (0 before round 1: Alg. 1 line 1)
    global_bias_level: float = 0.0  # Q̄
    global_class_prototypes: dict[int, torch.Tensor | None] = dataclasses.field(
        default_factory=lambda: {0: None, 1: None}
    )
    perturbed_heads: dict[str, OrderedDict] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain dict of floats, strings and tensors (``torch.save``-able) for checkpoints."""
        return {
            "round": self.round,
            "global_significance": self.global_significance,
            "global_bias_level": self.global_bias_level,
            "global_class_prototypes": dict(self.global_class_prototypes),
            "perturbed_heads": {c: OrderedDict(h) for c, h in self.perturbed_heads.items()},
            "pdt": {
                "clients": list(self.pdt.clients),
                "init": self.pdt.init,
                "seed": self.pdt.seed,
                "portraits": dict(self.pdt.portraits),
            },
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> FedSumServerState:
        pdt = PortraitDistanceTable(d["pdt"]["clients"], d["pdt"]["init"], d["pdt"]["seed"])
        for c, sp in d["pdt"]["portraits"].items():
            pdt.update(c, sp)
        return cls(
            pdt,
            int(d["round"]),
            float(d["global_significance"]),
            float(d["global_bias_level"]),
            dict(d["global_class_prototypes"]),
            {c: OrderedDict(h) for c, h in d["perturbed_heads"].items()},
        )


def new_server_state(clients: Sequence[str], pdt_init: str = "portraits", seed: int = 0):
    """Alg. 1 line 1: ε̄ = Q̄ = 0, no prototypes, no heads; an empty PDT over ``clients``."""
    from fedrepro.data.seq2seq import derive_seed

    return FedSumServerState(PortraitDistanceTable(clients, pdt_init, derive_seed(seed, "pdt")))


def fedsum_broadcast(
    state: FedSumServerState,
    client: str,
    total_rounds: int,
    variant: str | FedSumVariant = "FedSum",
) -> FedSumBroadcast:
    """The message for ``client`` in round ``state.round + 1``: ε̄, Q̄, P̄_c and, with parameter
    knowledge, PK_i = {(PDT[i][p], ω̃_p) | p ∈ last round's participants, p ≠ i} (Alg. 1 line 12)."""
    variant = get_variant(variant)
    t = state.round + 1
    if t > total_rounds:
        raise InputError(f"round {t} > total rounds {total_rounds}")
    pk = []
    if variant.parameter_knowledge:
        pk = [
            (state.pdt.weight(str(client), p), state.perturbed_heads[p])
            for p in sorted(state.perturbed_heads)
            if p != str(client)
        ]
    return FedSumBroadcast(
        t,
        int(total_rounds),
        state.global_significance,
        state.global_bias_level,
        dict(state.global_class_prototypes),
        pk,
    )


def fedsum_server_round(
    state: FedSumServerState,
    uploads: Mapping[str, FedSumUpload],
    hp: FedSumHParams,
    seed: int = 0,
) -> OrderedDict[str, torch.Tensor]:
    """FedSum Alg. 1 lines 8–15 for one round; returns Ω_g^(t) and updates ``state``.

    Ω_g, ε̄, Q̄ (eq. 2) and P̄_c are n_i/n-weighted over the participants; the PDT takes their new
    portraits; each participant's head ω_i is perturbed (Dropout(ω_i, γ)) for next round's PK.
    """
    from fedrepro.data.seq2seq import derive_seed

    if not uploads:
        raise InputError("fedsum_server_round: no client replies")
    ids = sorted(str(c) for c in uploads)
    ups = [uploads[c] for c in ids]
    n = [u.num_examples for u in ups]
    omega = weighted_average([u.federated_state for u in ups], n)
    t = state.round + 1
    state.global_significance = weighted_mean([u.mean_significance for u in ups], n)
    state.global_bias_level = weighted_mean([u.mean_bias_level for u in ups], n)
    with_protos = [
        (u.class_prototypes, w) for u, w in zip(ups, n) if u.class_prototypes is not None
    ]
    if with_protos:
        state.global_class_prototypes = aggregate_class_prototypes(
            [p for p, _ in with_protos], [w for _, w in with_protos]
        )
    for c, u in zip(ids, ups):
        if u.semantic_portrait is not None:
            state.pdt.update(c, u.semantic_portrait)
    state.perturbed_heads = {}
    for c, u in zip(ids, ups):
        head = OrderedDict(
            (k[len("head.") :], v) for k, v in u.federated_state.items() if k.startswith("head.")
        )
        g = torch.Generator().manual_seed(derive_seed(seed, "fedsum-perturb", t, c))
        state.perturbed_heads[c] = perturb_head(head, hp.gamma, g, hp.dropout_rescale)
    state.round = t
    return omega


# -- client ----------------------------------------------------------------------------------------
def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else 0.0


@torch.no_grad()
def _collect(model: BertSumExt, batches: Iterable[BertSumBatch]):
    vecs, labels, scores = [], [], []
    for batch in batches:
        h, logits = model.logits(batch)
        m = batch.cls_mask
        vecs.append(h[m])
        labels.append(batch.labels[m])
        scores.append(torch.sigmoid(logits)[m])
    return torch.cat(vecs), torch.cat(labels), torch.cat(scores)


def client_prototypes(
    model: BertSumExt, batches: Iterable[BertSumBatch], threshold: float = 0.5
) -> ClientPrototypes:
    """Eq. 3–4 over a client's data under the current model (eval mode, no grad)."""
    was = model.training
    model.eval()
    try:
        vecs, labels, scores = _collect(model, batches)
    finally:
        model.train(was)
    return compute_prototypes(vecs, labels, scores, threshold)


def initial_semantic_portrait(
    model: BertSumExt, batches: Iterable[BertSumBatch], threshold: float = 0.5
) -> torch.Tensor:
    """SP_i (eq. 6) under the initial global model, for ``pdt_init="portraits"``."""
    protos = client_prototypes(model, batches, threshold)
    return semantic_portrait(protos.class_prototypes, model.representation.hidden_size)


def prototype_knowledge_step(
    model: BertSumExt,
    batches: Sequence[BertSumBatch],
    global_class_prototypes: Mapping[int, torch.Tensor | None] | None,
    lr: float,
    threshold: float = 0.5,
    apply_step: bool = True,
) -> tuple[ClientPrototypes, float]:
    """Alg. 2 lines 22–24: measure the prototypes (eq. 3–4), then (``apply_step`` and global
    prototypes given) one SGD step θ ← θ − η∇_θ L_po (eq. 5).  Returns the prototypes measured
    *before* the step and the value of L_po (0.0 when no step).

    Exact gradient in two passes (eval mode, so both passes see the same H): pass 1 measures the
    prototypes and g = ∂L_po/∂P; pass 2 back-propagates Σ_k ⟨g_k, Σ_{s∈k} H_s⟩ / n_k batch by batch
    (k over the label and predicted-class groups), which accumulates ∇_θ L_po.
    """
    batches = list(batches)
    was = model.training
    model.eval()
    try:
        vecs, labels, scores = _collect(model, batches)
        protos = compute_prototypes(vecs, labels, scores, threshold)
        if not apply_step or not global_class_prototypes:
            return protos, 0.0
        leaves = {}
        for kind, table in (("c", protos.class_prototypes), ("p", protos.prediction_prototypes)):
            for xi, p in table.items():
                if p is not None:
                    leaves[(kind, xi)] = p.clone().requires_grad_(True)
        loss = prototype_loss(
            global_class_prototypes,
            {xi: leaves.get(("c", xi)) for xi in CLASSES},
            {xi: leaves.get(("p", xi)) for xi in CLASSES},
        )
        if not loss.requires_grad:
            return protos, float(loss.detach())
        keys = list(leaves)
        grads = torch.autograd.grad(loss, [leaves[k] for k in keys], allow_unused=True)
        coeff = {}
        for k, g in zip(keys, grads):
            if g is not None:
                n = protos.class_counts[k[1]] if k[0] == "c" else protos.prediction_counts[k[1]]
                coeff[k] = g / n
        rep_params = [p for p in model.representation.parameters() if p.requires_grad]
        for p in rep_params:
            p.grad = None
        for batch in batches:
            h = model.sentence_vectors(batch)
            m = batch.cls_mask
            with torch.no_grad():
                pred = predicted_classes(torch.sigmoid(model.head.logits(h)), threshold)
            surrogate = h.new_zeros(())
            for (kind, xi), c in coeff.items():
                sel = m & ((batch.labels.long() if kind == "c" else pred) == xi)
                if bool(sel.any()):
                    surrogate = surrogate + (h[sel].sum(0) * c).sum()
            if surrogate.requires_grad:
                surrogate.backward()
        with torch.no_grad():
            for p in rep_params:
                if p.grad is not None:
                    p -= lr * p.grad
                    p.grad = None
        return protos, float(loss.detach())
    finally:
        model.train(was)


def fedsum_local_update(
    model: BertSumExt,
    epoch_batches: Callable[[int], Sequence[BertSumBatch]] | Sequence[BertSumBatch],
    broadcast: FedSumBroadcast,
    hp: FedSumHParams,
    variant: str | FedSumVariant = "FedSum",
    *,
    client: str,
    seed: int = 0,
    global_state: Mapping[str, torch.Tensor] | None = None,
    precision=None,
) -> FedSumUpload:
    """One FedSum client round (Alg. 2, with Alg. 3 per batch).

    ``epoch_batches(e)`` gives epoch e's batches (e = 1..E; τ_i = their number) or one fixed list
    for every epoch.  ``global_state`` (Ω_g, ``model.federated_state()`` keys) is loaded first
    when given.  Per batch j: forward → LM; Data Partition (ε, Q vs ε̄, Q̄) and Data skip (depth);
    loss L_data (0 if skipped) + L_pm (parameter knowledge, t ≥ 2); one SGD step.  After the
    epochs: prototypes and portrait (breadth), then the L_po step (prototype knowledge, t ≥ 2).
    ``precision`` (a :class:`fedrepro.precision.Precision` or its mode name; ``None``: fp32):
    ``bf16-mixed`` runs each batch's forward and losses (L_data, L_pm) under bf16 autocast, the
    prototypes and the L_po step in float32; ``tf32``: the round with TF32 matmuls on CUDA.
    """
    from fedrepro.devices import model_device
    from fedrepro.precision import Precision

    precision = Precision.of(precision)
    with precision.region(model_device(model)):
        return _fedsum_local_update(model, epoch_batches, broadcast, hp, variant, client=client,
                                    seed=seed, global_state=global_state, precision=precision)


def _fedsum_local_update(model, epoch_batches, broadcast, hp, variant, *, client, seed,
                         global_state, precision) -> FedSumUpload:
    from fedrepro.data.seq2seq import derive_seed
    from fedrepro.devices import StepTimer, model_device

    variant = get_variant(variant)
    device = model_device(model)
    timer = StepTimer(device, flop_key=f"fedsum:{variant.name}")
    t, total = int(broadcast.round), int(broadcast.total_rounds)
    if not 1 <= t <= total:
        raise InputError(f"broadcast round {t} outside 1..{total}")
    if global_state is not None:
        model.load_federated_state(global_state)
    torch.manual_seed(derive_seed(seed, "fedsum-local", client, t))
    rng = skip_rng(seed, client, t)

    def batches_of(e: int) -> list[BertSumBatch]:
        out = list(epoch_batches(e) if callable(epoch_batches) else epoch_batches)
        if not out:
            raise InputError(f"client {client}: no training batches")
        return out

    received = []
    if variant.parameter_knowledge and t != 1:
        received = [
            (float(z), frozen_head(model.head, s)) for z, s in broadcast.parameter_knowledge
        ]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=hp.lr)
    sig, bias, l_data, l_pm = [], [], [], []
    n_normal = n_skipped = n_steps = 0
    last_batches: list[BertSumBatch] = []
    model.train()
    for e in range(1, hp.local_epochs + 1):
        batches = batches_of(e)
        last_batches = batches
        tau = len(batches)
        for j, batch in enumerate(batches, start=1):
            with timer.step():
                with precision.autocast(device):  # forward + losses; backward outside autocast
                    h, logits = model.logits(batch)
                    lm = sentence_loss_matrix(logits, batch.labels, batch.cls_mask)
                    ld = batch.labels * batch.cls_mask
                    decision = data_partition(
                        ld, lm, hp.lam, broadcast.global_significance, broadcast.global_bias_level
                    )
                    sig.append(decision.significance)
                    bias.append(decision.bias_level)
                    skip = False
                    if variant.depth:
                        rho = skip_probability(t, total, e, hp.local_epochs, j, tau)
                        _, skip = skip_decision(rng, rho, decision.normal)
                        n_normal += int(decision.normal)
                        n_skipped += int(skip)
                    loss_data = data_loss(lm)
                    loss = h.new_zeros(()) if skip else loss_data
                    l_data.append(0.0 if skip else float(loss_data.detach()))
                    if received:
                        pm = parameter_knowledge_loss(
                            h, batch.labels, batch.cls_mask, received,
                            hp.parameter_knowledge_reduction,
                        )
                        l_pm.append(float(pm.detach()))
                        loss = loss + pm
                if loss.requires_grad:
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    n_steps += 1
    n_examples = sum(len(b) for b in last_batches)
    protos, portrait, l_po = None, None, 0.0
    if variant.needs_prototypes:
        po_step = variant.prototype_knowledge and t != 1
        with timer.step() if po_step else contextlib.nullcontext():  # the L_po SGD step
            measured, l_po = prototype_knowledge_step(
                model,
                last_batches,
                broadcast.global_class_prototypes,
                hp.lr,
                hp.prediction_threshold,
                apply_step=po_step,
            )
        protos = measured.class_prototypes
        portrait = semantic_portrait(protos, model.representation.hidden_size)
    model.eval()
    return FedSumUpload(
        num_examples=n_examples,
        federated_state=model.federated_state(),
        mean_significance=_mean(sig),
        mean_bias_level=_mean(bias),
        class_prototypes=protos,
        semantic_portrait=portrait,
        stats={
            "batches": len(sig),
            "steps": n_steps,
            "normal_batches": n_normal,
            "skipped_batches": n_skipped,
            "L_data": _mean(l_data),
            "L_pm": _mean(l_pm),
            "L_po": l_po,
            "received_heads": len(received),
            **timer.stats(),  # seconds_*/peak_*: measurements, moved to provenance by the runner
        },
    )
