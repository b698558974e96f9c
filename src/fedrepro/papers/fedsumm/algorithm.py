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
(eq. 6), taken over the concatenation of all shared parameters (``rho_scope="global"``) or per
tensor (``"per_tensor"``: ρ is then the mean of the per-tensor ratios).  σ_c,t: client c's
parameters returned in round t; σ_g,t: the global model of round t, either this round's plain
mean of the returned client models — the model "after global optimization" — (``rho_reference=
"round_mean"``, default) or the broadcast w_t (``"broadcast"``).  The sums over t ∈ T run over the
rounds client c took part in so far (``rho_window="cumulative"``, eq. 5 as printed) or only the
current round (``"round"``).  Eq. 5 is a ratio of vectors; the scalar ρ is
``rho_reduction="expected"`` (default): ``Σ_i p_i · S_c,i / S_g,i`` with ``p = S_c / Σ S_c``, the
element-wise ratio averaged under the client's own normalised distribution (= 1 + χ²(p‖q) ≥ 1,
equal to 1 iff the normalised sums agree, matching §IV-B's "the closer to 1, the lower the drift"),
or ``"mean"``: ``(1/d) Σ_i S_c,i / S_g,i``, the plain mean over parameter entries (it is exactly 1
whenever the global σ is uniform, whatever the client, and can fall below 1).  Both are 1 when
client and global coincide.

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

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from fedrepro.data.seq2seq import derive_seed
from fedrepro.io import InputError

Tensors = Mapping[str, torch.Tensor]

_CHOICES = {
    "client_gradient": ("delta", "mean_batch_gradient"),
    "memory_assignment": ("own", "rank"),
    "rho_reduction": ("mean", "expected"),
    "rho_window": ("cumulative", "round"),
    "rho_scope": ("global", "per_tensor"),
    "rho_reference": ("round_mean", "broadcast"),
    "dldt": ("inner_product", "loss_difference", "off"),
}


@dataclasses.dataclass(frozen=True)
class FedSummConfig:
    """Every reading of Algorithm 1 / eq. 4–7 that the paper leaves open (module docstring)."""

    epsilon: float = 0.1
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

    @classmethod
    def from_config(cls, cfg: Mapping | None) -> FedSummConfig:
        """Build from the ``fedsumm.algorithm`` config block; unknown keys are an error."""
        cfg = dict(cfg or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise InputError(
                f"unknown keys in fedsumm.algorithm: {unknown}; known: {sorted(known)}"
            )
        return cls(**cfg)


# -- small tensor helpers ---------------------------------------------------------------------------
def _check_same_keys(reference: Tensors, other: Tensors, what: str) -> None:
    if list(reference) != list(other):
        missing = [k for k in reference if k not in other]
        extra = [k for k in other if k not in reference]
        raise InputError(
            f"{what}: tensor names differ from the global model (missing {missing[:3]}, "
            f"unexpected {extra[:3]})"
        )
    for k, v in reference.items():
        if other[k].shape != v.shape:
            raise InputError(
                f"{what}: tensor {k!r} has shape {tuple(other[k].shape)}, expected {tuple(v.shape)}"
            )


def l2_norm(tensors: Tensors) -> float:
    """‖g‖₂ over all entries of all tensors (float64 accumulation)."""
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors.values()))


def _detached(tensors: Tensors) -> OrderedDict[str, torch.Tensor]:
    return OrderedDict((k, v.detach().clone()) for k, v in tensors.items())


# -- ρ (eq. 5–6) ------------------------------------------------------------------------------------
def softmax_normalize(params: Tensors, scope: str = "global") -> list[torch.Tensor]:
    """σ of eq. 6: ``exp(w_i) / Σ_j exp(w_j)`` over the parameter entries.

    ``scope="global"``: one softmax over the concatenation of all tensors (a list of one flat
    tensor); ``"per_tensor"``: one softmax per tensor (flattened).
    """
    if not params:
        raise InputError("no parameters to normalise")
    flats = [t.detach().float().reshape(-1) for t in params.values()]
    if scope == "global":
        return [torch.softmax(torch.cat(flats), dim=0)]
    if scope == "per_tensor":
        return [torch.softmax(f, dim=0) for f in flats]
    raise InputError(f"rho_scope must be 'global' or 'per_tensor', got {scope!r}")


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
        ``"mean"``: ``(1/d) Σ_i S_c,i / S_g,i``; ``"expected"``: ``Σ_i p_i S_c,i / S_g,i`` with
        ``p = S_c / Σ_j S_c,j``.  With several scopes (per tensor) the scalars are averaged.
    """
    if len(client_sum) != len(global_sum) or not client_sum:
        raise InputError(
            "client and global softmax sums must have the same, non-zero number of scopes"
        )
    values = []
    for sc, sg in zip(client_sum, global_sum):
        ratio = sc.double() / sg.double()
        if reduction == "mean":
            values.append(float(ratio.mean()))
        elif reduction == "expected":
            values.append(float((sc.double() / sc.double().sum() * ratio).sum()))
        else:
            raise InputError(f"rho_reduction must be 'mean' or 'expected', got {reduction!r}")
    return sum(values) / len(values)


class DiscrepancyTracker:
    """ρ per client across rounds (eq. 5), usable for any method (Fig. 6 compares FedAvg's ρ).

    Keeps, per client, ``S_c`` and ``S_g`` summed over the rounds the client took part in
    (``window="cumulative"``; memory: two parameter-sized vectors per client) or nothing
    (``window="round"``).
    """

    def __init__(
        self, scope: str = "global", reduction: str = "expected", window: str = "cumulative"
    ):
        FedSummConfig(rho_scope=scope, rho_reduction=reduction, rho_window=window)  # validates
        self.scope, self.reduction, self.window = scope, reduction, window
        self.sums: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    def update(self, client: str, client_params: Tensors, global_params: Tensors) -> float:
        """Add round t's σ_c,t and σ_g,t for ``client`` and return its ρ."""
        _check_same_keys(global_params, client_params, f"client {client!r}")
        sc = softmax_normalize(client_params, self.scope)
        sg = softmax_normalize(global_params, self.scope)
        if self.window == "cumulative":
            if client in self.sums:
                old_c, old_g = self.sums[client]
                sc = [a + b for a, b in zip(old_c, sc)]
                sg = [a + b for a, b in zip(old_g, sg)]
            self.sums[client] = (sc, sg)
        return discrepancy_ratio(sc, sg, self.reduction)

    def state_dict(self) -> dict:
        return {
            "scope": self.scope,
            "reduction": self.reduction,
            "window": self.window,
            "sums": {
                c: ([t.clone() for t in a], [t.clone() for t in b])
                for c, (a, b) in self.sums.items()
            },
        }

    def load_state_dict(self, state: Mapping) -> None:
        if (state["scope"], state["reduction"], state["window"]) != (
            self.scope,
            self.reduction,
            self.window,
        ):
            raise InputError(
                "saved ρ state was made with other rho_scope/rho_reduction/rho_window settings"
            )
        self.sums = {c: (list(a), list(b)) for c, (a, b) in state["sums"].items()}


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


def fedsumm_local_update(
    model: torch.nn.Module,
    batches: Iterable[dict] | Callable[[int], Iterable[dict]],
    loss_fn: Callable[[torch.nn.Module, dict], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    guidance: ClientGuidance | None,
    config: FedSummConfig,
    local_epochs: int = 1,
    max_grad_norm: float | None = None,
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

    Returns
    -------
    LocalUpdateResult
        ``params`` (w^c_{t+1}), ``gradient`` (g^c per ``config.client_gradient``), ``loss`` (mean
        data loss, l^c), per-step losses and the mean eq. 7 term and gradient norm.
    """
    if local_epochs < 1:
        raise InputError(f"local_epochs must be >= 1, got {local_epochs}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise InputError("the model has no trainable parameters")
    start = OrderedDict((n, p.detach().clone()) for n, p in named)
    grad_sum = OrderedDict((n, torch.zeros_like(p)) for n, p in named)
    step_losses: list[float] = []
    terms: list[float] = []
    norms: list[float] = []
    n_examples = 0
    model.train()
    for epoch in range(local_epochs):
        n_examples = 0
        for batch in batches(epoch) if callable(batches) else batches:
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
    )


# -- server ---------------------------------------------------------------------------------------
def plain_mean(updates: Sequence[Tensors]) -> tuple[OrderedDict[str, torch.Tensor], dict]:
    """Algorithm 1's global aggregation of the updates: ``(1/|S_t|) Σ_c Δ^c``."""
    if not updates:
        raise InputError("no client updates to aggregate")
    keys = list(updates[0])
    out = OrderedDict((k, sum(u[k] for u in updates) / len(updates)) for k in keys)
    return out, {"num_clients": len(updates)}


class FedSummServer:
    """The server side of Algorithm 1: allocation, memory gradients, gradient adapter, aggregation.

    Per round the runner calls::

        clients = server.sample_clients(t)                      # S_t
        guidance = {c: server.guidance_for(c) for c in clients}  # sent with w_t
        ... clients run fedsumm_local_update(...) and return ClientReply ...
        w_next, log = server.server_round(t, w_t, replies)       # replies: {client: ClientReply}

    State that must persist between rounds (and across a resume): :meth:`state_dict` — the
    memory gradients, the clients' latest losses, the guidance to send, the ρ sums.
    """

    def __init__(self, config: FedSummConfig, client_ids: Sequence[str], seed: int) -> None:
        if not client_ids:
            raise InputError("FedSUMM needs at least one client")
        if len(set(client_ids)) != len(client_ids):
            raise InputError("client ids must be unique")
        self.config = config
        self.client_ids = sorted(str(c) for c in client_ids)
        self.client_index = {c: i for i, c in enumerate(self.client_ids)}
        self.seed = int(seed)
        self.memory: dict[str, OrderedDict[str, torch.Tensor]] = {}
        self.losses: dict[str, float] = {}
        self.guidance: dict[str, ClientGuidance] = {}
        self.tracker = DiscrepancyTracker(config.rho_scope, config.rho_reduction, config.rho_window)
        self.last_round = 0

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
        return self.guidance.get(client)

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
            _check_same_keys(
                w_t, replies[c].gradient, f"round {round_index}, client {c!r} gradient"
            )
            self.memory[c] = _detached(replies[c].gradient)
            self.losses[c] = float(replies[c].loss)
        order = sort_memory_by_loss(self.losses)

        if self.config.rho_reference == "round_mean":
            reference = OrderedDict(
                (k, sum(replies[c].params[k].detach() for c in clients) / len(clients)) for k in w_t
            )
        else:
            reference = w_t
        rho = {c: self.tracker.update(c, replies[c].params, reference) for c in clients}

        log: dict = {
            "round": round_index,
            "clients": clients,
            "rho": rho,
            "rho_mean": sum(rho.values()) / len(rho),
            "memory_order": order,
            "losses": {c: self.losses[c] for c in clients},
            "gradient_norms": {},
            "modulated": {},
            "memory_source": {},
        }
        updates = []
        for c in clients:
            source = c
            if self.config.memory_assignment == "rank":
                idx = self.client_index[c]
                source = order[idx] if idx < len(order) else None
            if source is None:
                g_mod, modulated, norm = None, False, math.nan
            else:
                g_mod, modulated, norm = modulate_gradient(
                    self.memory[source],
                    self.config.epsilon,
                    rho[c],
                    self.config.unit_norm_tolerance,
                )
            log["gradient_norms"][c] = norm
            log["modulated"][c] = modulated
            log["memory_source"][c] = source
            self.guidance[c] = ClientGuidance(g_mod, rho[c], self.losses[c], self.config.epsilon)
            w_c = replies[c].params
            if self.config.apply_on_server and g_mod is not None:
                updates.append(OrderedDict((k, w_c[k].detach() - g_mod[k] - w_t[k]) for k in w_t))
            else:
                updates.append(OrderedDict((k, w_c[k].detach() - w_t[k]) for k in w_t))
        mean_update, info = aggregate(updates)
        log["aggregate"] = info
        self.last_round = round_index
        return OrderedDict((k, w_t[k] + mean_update[k].to(w_t[k].dtype)) for k in w_t), log

    def state_dict(self) -> dict:
        """Everything that must survive between rounds (save with ``torch.save``)."""
        return {
            "config": dataclasses.asdict(self.config),
            "client_ids": list(self.client_ids),
            "seed": self.seed,
            "last_round": self.last_round,
            "memory": {c: _detached(g) for c, g in self.memory.items()},
            "losses": dict(self.losses),
            "guidance": {c: dataclasses.asdict(g) for c, g in self.guidance.items()},
            "tracker": self.tracker.state_dict(),
        }

    def load_state_dict(self, state: Mapping) -> None:
        if (
            state["config"] != dataclasses.asdict(self.config)
            or state["client_ids"] != self.client_ids
            or state["seed"] != self.seed
        ):
            raise InputError(
                "saved FedSUMM server state was made with another config, client list or seed"
            )
        self.last_round = int(state["last_round"])
        self.memory = {c: OrderedDict(g) for c, g in state["memory"].items()}
        self.losses = dict(state["losses"])
        self.guidance = {c: ClientGuidance(**g) for c, g in state["guidance"].items()}
        self.tracker.load_state_dict(state["tracker"])
