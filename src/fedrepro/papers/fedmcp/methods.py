"""The nine methods of FedMCP's comparison (§V-B, Table I) and their client update, plus the
§V-E ablations, behind one model interface.

=============  ==================  ==========================  ================================
method         trainable           sent to the server          client objective (one round)
=============  ==================  ==========================  ================================
Local          A_g, A_p, g1        nothing                     CE(g1, both adapters)
FedAvg-FT      backbone, head      every backbone parameter    CE(head, full fine-tuning),
                                                               Adam at ``full_ft_lr`` (2e-5)
FedAvg-PEFT    A_g, A_p, g1        A_g and A_p                 CE(g1, both adapters)
FedLR          LoRA(q, v), head    LoRA tensors                CE(head, backbone + LoRA)
FedAP          A_g, g2             A_g                         CE(g2, backbone + A_g)
MOON           A_g, A_p, g1        A_g and A_p                 CE(g1) + μ_moon·ℓ_con (MOON §3.3)
FedRep         A_g, A_p (body), g1 A_g and A_p                 head epochs (body frozen), then
                                                               body epochs (head frozen), CE(g1)
FedMatch       A_g, A_p, g1        A_g and A_p (uploaded);     CE(g1, both adapters); A_p is the
                                   only A_g is loaded back     private patch
FedMCP         A_g, A_p, g1, g2    A_g                         eq. 8: (1−γ)L_a + γL_b + μL_c
FedMCP-noLc    as FedMCP           A_g                         eq. 8 with μ = 0
FedMCP-noLb    as FedMCP           A_g                         eq. 8 with γ = 0
FedMCP-cos     as FedMCP           A_g                         eq. 8, Sim = cosine (§V-E, Fig. 4)
FedMCP-cls     as FedMCP           A_g                         eq. 8, X/Y/Z = <s> state (Fig. 5)
=============  ==================  ==========================  ================================

This is the default sizing, ``baseline_adapters: "paper"`` (config ``fedmcp.baseline_adapters``):
Table I's Param. / Comm. columns (1.16 % = two adapter sets, 0.58 % = one, §V-D "0.58% for 1 and
1.16% for 2") for every method.  ``baseline_adapters: "single"`` is the earlier sizing
(:data:`SINGLE_SET_BASELINES`): MOON and FedRep on one adapter set (A_g + g2, sent: A_g) and
FedMatch's private patch A_p never uploaded.

A_g / A_p are the global / private Houlsby adapter sets of
:class:`fedrepro.papers.fedmcp.model.DualAdapterRoberta` (r = 16, §V-C); g1 is its head on
the full model (mode ``"both"``), g2 its head on backbone + A_g (mode ``"global"``).  Heads are
never shared ("we did not share the classifier parameters across tasks", §V-C).  Every method
but FedAvg-FT keeps the backbone frozen (§V-B, last paragraph).

One interface for every method (see :func:`build_model`)::

    model(input_ids, attention_mask) -> (logits, pooled)   # the model the client is evaluated with
    model.shared_state() -> OrderedDict[str, Tensor]        # exactly what goes to the server
    model.load_shared_state(state)                          # exact key check; upload-only parts kept
    model.trainable_parameters()

:func:`local_update` runs one client round (Algorithm 1, LocalUpdate) and :func:`shared_share`
gives the communicated fraction of Table I.

Choices the paper leaves open (all ours)
----------------------------------------
* **Pooling and heads.**  Every method classifies with a linear head on the masked mean of the
  last-layer token states (the FedMCP representation of §IV-D); FedAvg-FT and FedLR get the same
  kind of head rather than ``RobertaForSequenceClassification``'s two-layer ``<s>`` head, so the
  only difference between methods is what is trained and shared.
* **Sizing: every baseline as large as Table I says** (``baseline_adapters: paper``).  §V-B:
  "all baselines except FedAvg (Full FT) only fine-tune the additional adapter modules while
  keeping the architecture ... the same as FedMCP", and Table I lists 1.16 % trainable for
  Local, FedAvg (PEFT), MOON, FedRep and FedMatch (two adapter sets), 0.58 % for FedAP and FedLR
  (one), and 1.16 % *communicated* for FedAvg (PEFT), MOON, FedRep and FedMatch.  So Local,
  FedAvg-PEFT, MOON, FedRep and FedMatch train A_g + A_p with head g1 (mode ``"both"``); FedAP
  trains A_g + g2; FedLR's LoRA rank is chosen so that it holds about one adapter set (see
  FedLR).  ``baseline_adapters: single`` keeps the earlier variants (MOON, FedRep on A_g + g2;
  FedMatch uploading A_g only).
* **MOON.**  All trainable adapters (A_g and A_p) form MOON's single global model and are
  averaged; ℓ_con (:func:`fedrepro.papers.fedmcp.losses.moon_contrastive_loss`) on the
  mean-pooled representation of the evaluated model (both adapters; one in the ``single``
  variant).  MOON's projection head is not used: the paper says only that MOON contrasts "the
  representations learned by the local models and the global model".  z_glob: the *received*
  server adapters, z_prev: the client's adapters after its previous round (``prev_shared_state``;
  both computed per batch without grad).  In the first round, with no previous model, z_prev =
  z_glob (as MOON's reference code, whose "previous" model pool starts as the global model): the
  term is then the constant log 2 with zero gradient.  μ_moon = 1 and τ = 0.5 by default (MOON's
  defaults for its text-free benchmarks; the paper states neither).
* **FedRep.**  Body = the averaged adapter sets (A_g and A_p; A_g alone in ``single``), head =
  the local classifier (g1; g2 in ``single``).  Each round: ``head_epochs`` epochs on the head
  with the body frozen, then ``epochs`` epochs on the body with the head frozen (FedRep
  Algorithm 1); a fresh Adam per phase.
* **FedMatch** (Chen et al., CIKM 2021, the paper's [27]; §II: "the shared backbone learns common
  knowledge and the private patch holds information specific to each client").  With a frozen PLM
  the trainable "backbone" becomes the shared adapter A_g and the "patch" the private adapter A_p,
  combined as in FedMCP (h + ½a_g(h) + ½a_p(h)), trained jointly with CE on the full model (g1).
  Table I's 1.16 % communicated is what the authors' code does (Chriskuei/FedMatch,
  ``src/trainer.py``): the server averages *every* tensor of every client's network, patch
  included, and each client then loads back only the shared keys, keeping its own patch
  (``fed_type`` ``fed_vertical`` / ``pals``).  So here both adapter sets are uploaded
  (:attr:`MethodSpec.upload_only` = A_p: averaged by the server, never loaded back) and only A_g
  is replaced by the average.  The roles are separated by aggregation alone -- no contrastive or
  backbone-only loss -- so FedMatch here is FedMCP without L_b and L_c (and with A_p uploaded).
  ``single``: A_p is never uploaded (0.58 % communicated).
* **FedMCP** (Algorithm 1, eq. 8).  Per batch, four forward passes on the same input:
  ``"both"`` → g1 logits (L_a); ``"global"`` → g2 logits (L_b) *and* X (same pass);
  ``"private"`` → Y; ``"global"`` with A_g replaced by the received server average (via
  :func:`torch.func.functional_call`, ``no_grad``) → Z.  Z is recomputed per batch from the
  snapshot of ``server_state`` taken at the start of the round (the averaged adapter θ_g^t,
  never updated during the round).  When μ = 0 (noLc) the Y and Z passes are skipped and L_c is
  reported as 0.  FedMCP-cls uses the ``<s>`` state for X, Y, Z only; the heads still read the
  mean-pooled representation (§V-E changes "sentence representation in model-contrastive
  personalization").
* **Optimiser.**  Adam (lr 5e-4, §V-C), a fresh one each round (the paper does not say whether
  Adam's moments persist across rounds); no weight decay, no scheduler.  FedAvg (Full FT) trains
  all of roberta-base, for which 5e-4 (the adapters' rate) is far above any standard fine-tuning
  rate; the paper gives none, so it has its own ``full_ft_lr`` (default 2e-5, Adam: the middle of
  RoBERTa's GLUE fine-tuning grid {1e-5, 2e-5, 3e-5}, Liu et al. 2019, Table 10).
* **Dropout.**  The frozen backbone runs in eval mode (no dropout) for every PEFT method, as
  :class:`DualAdapterRoberta` does; FedLR's ``lora_dropout`` defaults to 0.  FedAvg-FT trains the
  backbone in train mode (ordinary fine-tuning dropout).
* **FedLR** (FedPETuning's LoRA baseline): ``peft`` ``LoraConfig(target_modules=["query",
  "value"])``.  Table I gives it 0.58 %, one adapter set.  On roberta-base a rank-r LoRA on q, v
  holds 12·2·2·768·r = 36,864·r parameters and one adapter set 608,640, which no integer rank
  matches: r = 16 (589,824, 0.969× the set; 0.473 % of full FT) and r = 17 (626,688, 1.030×)
  bracket it; the default is r = 16, the adapters' own bottleneck, with α = 32 (α/r = 2, the
  scaling of FedPETuning's r = 8, α = 16).  FedPETuning's r = 8, α = 16 (294,912 parameters,
  0.24 %) is ``fedmcp.lora: {lora_r: 8, lora_alpha: 16}``.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from fedrepro.papers.fedmcp.losses import fedmcp_loss, moon_contrastive_loss
from fedrepro.io import InputError
from fedrepro.papers.fedmcp.model import DualAdapterRoberta, head_input


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """One row of the table in the module docstring.

    ``kind``: ``"adapters"`` (DualAdapterRoberta), ``"full_ft"`` or ``"lora"``.
    ``trained`` / ``shared``: adapter roles and heads trained / sent and loaded back from the
    server's average (adapter kind only).  ``upload_only``: adapter roles also sent (and averaged
    by the server) but never loaded back -- the client keeps its own (FedMatch's private patch in
    the authors' code).
    ``eval_mode``: DualAdapterRoberta mode of the evaluated model (``"both"`` → g1,
    ``"global"`` → g2).  ``objective``: ``"ce" | "moon" | "fedrep" | "fedmcp"``.
    ``gamma`` / ``mu``: fixed overrides of ``hp.gamma`` / ``hp.mu`` (ablations), else None.
    """

    name: str
    kind: str
    federated: bool
    trained: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    eval_mode: str = "both"
    objective: str = "ce"
    similarity: str = "cka"
    rep_pooling: str = "mean"
    gamma: float | None = None
    mu: float | None = None
    upload_only: tuple[str, ...] = ()

    @property
    def sent(self) -> tuple[str, ...]:
        """Adapter roles uploaded each round (Table I's Comm.)."""
        return self.shared + self.upload_only


_BOTH = ("global", "private", "g1")
_ONE = ("global", "g2")
_MCP = ("global", "private", "g1", "g2")
_SETS = ("global", "private")

METHODS: dict[str, MethodSpec] = {
    "Local": MethodSpec("Local", "adapters", False, _BOTH, (), "both"),
    "FedAvg-FT": MethodSpec("FedAvg-FT", "full_ft", True),
    "FedAvg-PEFT": MethodSpec("FedAvg-PEFT", "adapters", True, _BOTH, _SETS),
    "FedLR": MethodSpec("FedLR", "lora", True),
    "FedAP": MethodSpec("FedAP", "adapters", True, _ONE, ("global",), "global"),
    "MOON": MethodSpec("MOON", "adapters", True, _BOTH, _SETS, "both", "moon"),
    "FedRep": MethodSpec("FedRep", "adapters", True, _BOTH, _SETS, "both", "fedrep"),
    "FedMatch": MethodSpec("FedMatch", "adapters", True, _BOTH, ("global",), "both",
                           upload_only=("private",)),
    "FedMCP": MethodSpec("FedMCP", "adapters", True, _MCP, ("global",), "both", "fedmcp"),
    "FedMCP-noLc": MethodSpec(
        "FedMCP-noLc", "adapters", True, _MCP, ("global",), "both", "fedmcp", mu=0.0
    ),
    "FedMCP-noLb": MethodSpec(
        "FedMCP-noLb", "adapters", True, _MCP, ("global",), "both", "fedmcp", gamma=0.0
    ),
    "FedMCP-cos": MethodSpec(
        "FedMCP-cos", "adapters", True, _MCP, ("global",), "both", "fedmcp", similarity="cosine"
    ),
    "FedMCP-cls": MethodSpec(
        "FedMCP-cls", "adapters", True, _MCP, ("global",), "both", "fedmcp", rep_pooling="cls"
    ),
}
"""The methods at Table I's sizing (``baseline_adapters: paper``, the default)."""

SINGLE_SET_BASELINES: dict[str, MethodSpec] = {
    "MOON": MethodSpec("MOON", "adapters", True, _ONE, ("global",), "global", "moon"),
    "FedRep": MethodSpec("FedRep", "adapters", True, _ONE, ("global",), "global", "fedrep"),
    "FedMatch": MethodSpec("FedMatch", "adapters", True, _BOTH, ("global",), "both"),
}
"""``baseline_adapters: single``: the earlier, smaller MOON / FedRep (one adapter set, 0.49 %)
and a FedMatch whose private patch never leaves the client (0.49 % sent)."""

BASELINE_ADAPTERS = ("paper", "single")


def get_method(method: str | MethodSpec, baseline_adapters: str = "paper") -> MethodSpec:
    """The spec of ``method`` at the given baseline sizing (``"paper"`` or ``"single"``)."""
    if isinstance(method, MethodSpec):
        return method
    if baseline_adapters not in BASELINE_ADAPTERS:
        raise InputError(f"fedmcp.baseline_adapters must be one of {list(BASELINE_ADAPTERS)}, "
                         f"got {baseline_adapters!r}")
    if baseline_adapters == "single" and method in SINGLE_SET_BASELINES:
        return SINGLE_SET_BASELINES[method]
    try:
        return METHODS[method]
    except KeyError:
        raise InputError(f"unknown FedMCP method {method!r}; known: {list(METHODS)}") from None


@dataclasses.dataclass(frozen=True)
class LocalHParams:
    """Client settings: Adam lr 5e-4, one epoch per round, γ = 0.5, μ = 0.05 (§V-C); FedAvg
    (Full FT)'s own rate (2e-5: not in the paper, see the module docstring); MOON's μ and τ (MOON
    defaults 1 and 0.5); FedRep's head epochs per round."""

    lr: float = 5e-4
    full_ft_lr: float = 2e-5
    epochs: int = 1
    gamma: float = 0.5
    mu: float = 0.05
    moon_mu: float = 1.0
    moon_tau: float = 0.5
    head_epochs: int = 1

    @classmethod
    def from_config(cls, cfg: Mapping) -> LocalHParams:
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        kw = {}
        for k, v in cfg.items():
            if k in fields:
                kw[k] = int(v) if k in ("epochs", "head_epochs") else float(v)
        return cls(**kw)


# -- models ------------------------------------------------------------------------------------
def _check_keys(own: Iterable[str], got: Iterable[str], what: str) -> None:
    own, got = set(own), set(got)
    if own != got:
        raise ValueError(
            f"{what} state keys differ: missing {sorted(own - got)[:5]}, "
            f"unexpected {sorted(got - own)[:5]}"
        )


class _FedModel(nn.Module):
    """Common interface; subclasses define :meth:`_shared_parameters`."""

    spec: MethodSpec

    def _shared_parameters(self) -> OrderedDict[str, nn.Parameter]:
        """Every parameter sent to the server (its uplink)."""
        raise NotImplementedError

    def _received_parameters(self) -> OrderedDict[str, nn.Parameter]:
        """The sent parameters the server's average is loaded into (all of them, except
        :attr:`MethodSpec.upload_only` roles)."""
        return self._shared_parameters()

    def shared_state(self) -> OrderedDict[str, torch.Tensor]:
        """Exactly the tensors this method sends to the server (detached copies)."""
        return OrderedDict((k, p.detach().clone()) for k, p in self._shared_parameters().items())

    def load_shared_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load the server's average into the received parameters.  ``state`` holds what was
        sent (key sets must match exactly); upload-only tensors in it are checked, not loaded."""
        own = self._shared_parameters()
        _check_keys(own, state, f"{self.spec.name} shared")
        received = self._received_parameters()
        with torch.no_grad():
            for k, p in own.items():
                v = state[k]
                if v.shape != p.shape:
                    raise ValueError(f"{k}: shape {tuple(v.shape)} != {tuple(p.shape)}")
                if k in received:
                    p.copy_(v)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def backbone_module(self) -> nn.Module:
        """The pretrained encoder (with its adapter insertions / LoRA layers): where
        ``fedmcp.frozen_dtype`` casts the frozen tensors."""
        raise NotImplementedError


class AdapterMethodModel(_FedModel):
    """DualAdapterRoberta with the spec's adapters/heads trainable (all adapter-kind methods).

    ``forward(ids, mask, mode=None, pooling="mean")`` returns ``(logits, pooled)``: logits of the
    mode's head on the *mean*-pooled state (None for ``"private"``), ``pooled`` with ``pooling``.
    Without ``mode`` it is the evaluated model (``spec.eval_mode``).
    """

    def __init__(self, spec: MethodSpec, backbone: nn.Module, num_labels: int, bottleneck: int):
        super().__init__()
        self.spec = spec
        self.net = DualAdapterRoberta(backbone, num_labels, bottleneck=bottleneck)
        parts = {"global": self.net.adapters["global"], "private": self.net.adapters["private"],
                 "g1": self.net.g1, "g2": self.net.g2}
        for name, module in parts.items():
            for p in module.parameters():
                p.requires_grad_(name in spec.trained)

    def _role_parameters(self, roles) -> OrderedDict[str, nn.Parameter]:
        return OrderedDict(
            (f"{role}.{k}", p) for role in roles for k, p in self.net.adapters[role].named_parameters()
        )

    def _shared_parameters(self) -> OrderedDict[str, nn.Parameter]:
        return self._role_parameters(self.spec.sent)

    def backbone_module(self) -> nn.Module:
        return self.net.backbone

    def _received_parameters(self) -> OrderedDict[str, nn.Parameter]:
        return self._role_parameters(self.spec.shared)

    def forward(self, input_ids, attention_mask, mode: str | None = None, pooling: str = "mean"):
        mode = mode or self.spec.eval_mode
        net = self.net
        net.router.set_mode(mode)
        try:
            out = net.backbone(input_ids=input_ids, attention_mask=attention_mask)
            hidden = out.last_hidden_state
        finally:
            net.router.set_mode("both")
        hidden = head_input(hidden, net.g1)  # bf16 frozen backbone -> float32 heads
        mean = net.pool(hidden, attention_mask, "mean")
        pooled = mean if pooling == "mean" else net.pool(hidden, attention_mask, pooling)
        head = {"both": net.g1, "global": net.g2}.get(mode)
        return (head(mean) if head is not None else None), pooled

    def body_parameters(self) -> list[nn.Parameter]:
        """FedRep's body: the averaged adapter sets (A_g and A_p; A_g in the ``single`` sizing)."""
        return [p for role in self.spec.shared for p in self.net.adapters[role].parameters()]

    def head_parameters(self) -> list[nn.Parameter]:
        return list((self.net.g1 if self.spec.eval_mode == "both" else self.net.g2).parameters())

    @torch.no_grad()
    def representation_with_global(self, global_state, input_ids, attention_mask,
                                   pooling: str = "mean") -> torch.Tensor:
        """Pooled representation of backbone + a *given* global adapter (no grad, own A_g
        untouched): Z for FedMCP, z_glob / z_prev for MOON.  ``global_state`` keys are the
        global set's own (``layers.0.attention.down.weight``...) or prefixed ``global.``."""
        params = {}
        for k, v in global_state.items():
            k = k[len("global."):] if k.startswith("global.") else k
            params[f"net.adapters.global.{k}"] = v
        _check_keys({f"net.adapters.global.{k}" for k in self.net.adapters["global"].state_dict()},
                    params, "global adapter")
        _, pooled = torch.func.functional_call(
            self, params, (input_ids, attention_mask), {"mode": "global", "pooling": pooling}
        )
        return pooled

    @torch.no_grad()
    def representation_with_shared(self, shared_state, input_ids, attention_mask,
                                   pooling: str = "mean") -> torch.Tensor:
        """Pooled representation of the evaluated model (``spec.eval_mode``) with its received
        adapter sets replaced by ``shared_state`` (keys as :meth:`shared_state`'s; upload-only
        ones ignored), no grad, own adapters untouched: MOON's z_glob / z_prev."""
        received = self._received_parameters()
        _check_keys(self._shared_parameters(), shared_state, f"{self.spec.name} shared")
        params = {f"net.adapters.{k}": v for k, v in shared_state.items() if k in received}
        _, pooled = torch.func.functional_call(
            self, params, (input_ids, attention_mask), {"pooling": pooling}
        )
        return pooled


class _HeadModel(_FedModel):
    """Encoder + local linear head on the mean-pooled last layer (FedAvg-FT, FedLR)."""

    def __init__(self, spec: MethodSpec, encoder: nn.Module, hidden: int, num_labels: int):
        super().__init__()
        self.spec = spec
        self.encoder = encoder
        self.head = nn.Linear(hidden, num_labels)

    def forward(self, input_ids, attention_mask):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        hidden = head_input(hidden, self.head)  # bf16 frozen backbone (FedLR) -> float32 head
        pooled = DualAdapterRoberta.pool(hidden, attention_mask, "mean")
        return self.head(pooled), pooled

    def head_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters())

    def backbone_module(self) -> nn.Module:
        return self.encoder


class FullFTModel(_HeadModel):
    """FedAvg (Full FT): every backbone parameter trained and averaged; the head stays local."""

    def __init__(self, spec, backbone, num_labels):
        super().__init__(spec, backbone, backbone.config.hidden_size, num_labels)
        for p in backbone.parameters():
            p.requires_grad_(True)

    def _shared_parameters(self):
        return OrderedDict((f"encoder.{k}", p) for k, p in self.encoder.named_parameters())


class LoraModel(_HeadModel):
    """FedLR: ``peft`` LoRA on RoBERTa's query/value; only the ``lora_`` tensors are averaged."""

    def __init__(self, spec, backbone, num_labels, r: int, alpha: float, dropout: float,
                 target_modules=("query", "value")):
        from peft import LoraConfig, get_peft_model

        for p in backbone.parameters():
            p.requires_grad_(False)
        config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                            target_modules=list(target_modules), bias="none")
        super().__init__(spec, get_peft_model(backbone, config), backbone.config.hidden_size,
                         num_labels)

    def train(self, mode: bool = True):
        super().train(mode)
        self.encoder.eval()  # frozen backbone: no dropout (as DualAdapterRoberta)
        for name, m in self.encoder.named_modules():  # ... but LoRA's own dropout follows mode
            if name.endswith("lora_dropout"):
                m.train(mode)
        return self

    def _shared_parameters(self):
        return OrderedDict(
            (f"encoder.{k}", p) for k, p in self.encoder.named_parameters() if "lora_" in k
        )


def build_model(method: str | MethodSpec, backbone: nn.Module, num_labels: int,
                cfg: Mapping | None = None) -> _FedModel:
    """Wrap a transformers ``RobertaModel`` (modified in place) into ``method``'s client model.

    ``cfg`` keys (all optional): ``bottleneck`` (16), ``lora_r`` (16), ``lora_alpha`` (32),
    ``lora_dropout`` (0.0), ``baseline_adapters`` (``"paper"``; or ``"single"``, see
    :func:`get_method`).
    """
    cfg = dict(cfg or {})
    spec = get_method(method, str(cfg.get("baseline_adapters", "paper")))
    if spec.kind == "adapters":
        return AdapterMethodModel(spec, backbone, num_labels, int(cfg.get("bottleneck", 16)))
    if spec.kind == "full_ft":
        return FullFTModel(spec, backbone, num_labels)
    if spec.kind == "lora":
        return LoraModel(spec, backbone, num_labels, r=int(cfg.get("lora_r", 16)),
                         alpha=float(cfg.get("lora_alpha", 32)),
                         dropout=float(cfg.get("lora_dropout", 0.0)))
    raise ValueError(f"unknown method kind {spec.kind!r}")


def shared_share(model: _FedModel, full_ft_params: int) -> float:
    """Fraction of parameters sent per round relative to full fine-tuning (Table I "Comm.")."""
    return sum(t.numel() for t in model.shared_state().values()) / full_ft_params


# -- losses per batch ----------------------------------------------------------------------------
def fedmcp_batch_loss(model: AdapterMethodModel, batch: Mapping, spec: MethodSpec,
                      hp: LocalHParams, z_state: Mapping[str, torch.Tensor]):
    """Eq. 8 on one batch (passes and roles in the module docstring); returns (loss, parts)."""
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    gamma = hp.gamma if spec.gamma is None else spec.gamma
    mu = hp.mu if spec.mu is None else spec.mu
    logits_full, _ = model(ids, mask, mode="both")
    logits_global, x = model(ids, mask, mode="global", pooling=spec.rep_pooling)
    if mu == 0.0:  # noLc: the Y and Z passes do not enter the loss
        loss_a = F.cross_entropy(logits_full.float(), labels)
        loss_b = F.cross_entropy(logits_global.float(), labels)
        loss = (1.0 - gamma) * loss_a + gamma * loss_b
        return loss, {"L_a": float(loss_a.detach()), "L_b": float(loss_b.detach()), "L_c": 0.0}
    _, y = model(ids, mask, mode="private", pooling=spec.rep_pooling)
    z = model.representation_with_global(z_state, ids, mask, pooling=spec.rep_pooling)
    return fedmcp_loss(logits_full, logits_global, labels, x, y, z, gamma=gamma, mu=mu,
                       similarity=spec.similarity)


def moon_batch_loss(model: AdapterMethodModel, batch: Mapping, hp: LocalHParams,
                    glob_state, prev_state):
    """CE + μ_moon·ℓ_con(z, z_glob, z_prev) (MOON eq. 3–4) on the evaluated model (both adapters
    and g1; A_g and g2 in the ``single`` sizing); returns (loss, parts)."""
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    logits, z = model(ids, mask)
    z_glob = model.representation_with_shared(glob_state, ids, mask)
    z_prev = model.representation_with_shared(prev_state, ids, mask)
    ce = F.cross_entropy(logits.float(), labels)
    con = moon_contrastive_loss(z, z_glob, z_prev, temperature=hp.moon_tau)
    return ce + hp.moon_mu * con, {"L_ce": float(ce.detach()), "L_con": float(con.detach())}


# -- client round --------------------------------------------------------------------------------
def _epoch_batches(batches, epoch: int):
    return batches(epoch) if callable(batches) else batches


def _run(model, params, batches, epochs, lr, loss_fn: Callable, stats: dict, phase: str, timer,
         precision=None):
    if epochs <= 0 or not params:
        return
    from fedrepro.devices import model_device
    from fedrepro.precision import Precision

    precision, device = Precision.of(precision), model_device(model)
    opt = torch.optim.Adam(params, lr=lr)
    n_ex = 0
    for epoch in range(epochs):
        n_ex = 0
        for batch in _epoch_batches(batches, epoch):
            with timer.step():  # fedrepro.devices.StepTimer
                with precision.autocast(device):  # forward + loss; backward outside autocast
                    loss, parts = loss_fn(batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            stats["_loss"] += float(loss.detach())
            stats["_steps"] += 1
            n_ex += int(batch["labels"].shape[0])
            for k, v in parts.items():
                stats["_parts"][k] = stats["_parts"].get(k, 0.0) + v
    stats["phases"].append((phase, epochs))
    stats["n_examples"] = n_ex


def local_update(model: _FedModel, method: str | MethodSpec, batches, hp: LocalHParams,
                 server_state: Mapping[str, torch.Tensor] | None,
                 prev_shared_state: Mapping[str, torch.Tensor] | None = None,
                 precision=None) -> dict:
    """One client round (FedMCP Algorithm 1, LocalUpdate; the baselines' equivalents).

    ``server_state`` (the averaged shared tensors) is loaded first (ignored for Local; ``None``
    keeps the current shared part, e.g. before the first aggregation).  ``batches``: a re-iterable
    of dicts with ``input_ids``, ``attention_mask``, ``labels`` -- or ``batches(epoch)`` giving one.
    ``prev_shared_state``: MOON only, the client's shared state after its previous round.

    Returns ``{"loss": mean batch loss (pre-step), "n_examples": examples per epoch,
    "n_steps", "phases", "lr" (the Adam rate used), <mean loss parts>, <StepTimer measurements:
    seconds_steps, seconds_per_step (+ peak_gpu_mb on CUDA)>}``; send ``model.shared_state()``
    afterwards.  The model's own spec (its sizing) decides; ``method`` must name it.
    ``precision`` (a :class:`fedrepro.precision.Precision` or its mode name; ``None``: fp32):
    ``bf16-mixed`` runs every step's forward passes and loss under bf16 autocast, ``tf32`` the
    round with TF32 matmuls on CUDA; trained tensors and Adam's state stay float32.
    """
    from fedrepro.devices import model_device
    from fedrepro.precision import Precision

    precision = Precision.of(precision)
    with precision.region(model_device(model)):
        return _local_update(model, method, batches, hp, server_state, prev_shared_state,
                             precision)


def _local_update(model, method, batches, hp, server_state, prev_shared_state, precision) -> dict:
    from fedrepro.devices import StepTimer, model_device

    spec = model.spec  # the model's own sizing (get_method(name) would give the paper's)
    named = method.name if isinstance(method, MethodSpec) else method
    if named != spec.name:
        raise ValueError(f"local_update for {named!r} on a {spec.name} model")
    lr = hp.full_ft_lr if spec.kind == "full_ft" else hp.lr
    timer = StepTimer(model_device(model), flop_key=f"fedmcp:{spec.name}")
    if spec.federated and server_state is not None:
        model.load_shared_state(server_state)
    snapshot = model.shared_state()  # the received average, fixed for the round
    model.train()
    stats = {"_loss": 0.0, "_steps": 0, "_parts": {}, "phases": [], "n_examples": 0}

    def ce(batch):
        logits, _ = model(batch["input_ids"], batch["attention_mask"])
        loss = F.cross_entropy(logits.float(), batch["labels"])
        return loss, {"L_ce": float(loss.detach())}

    if spec.objective == "ce":
        _run(model, model.trainable_parameters(), batches, hp.epochs, lr, ce, stats, "all", timer,
             precision)
    elif spec.objective == "fedmcp":
        z_state = OrderedDict((k[len("global."):], v) for k, v in snapshot.items())
        _run(model, model.trainable_parameters(), batches, hp.epochs, lr,
             lambda b: fedmcp_batch_loss(model, b, spec, hp, z_state), stats, "all", timer, precision)
    elif spec.objective == "moon":
        prev = snapshot if prev_shared_state is None else prev_shared_state
        _check_keys(snapshot, prev, "MOON previous-round")
        # the previous round's state comes from the client's checkpoint, on the CPU: z_prev is
        # computed with the model on its device (a GPU run of MOON crashed in round 2 without this)
        device = model_device(model)
        prev = OrderedDict((k, v.to(device)) for k, v in prev.items())
        _run(model, model.trainable_parameters(), batches, hp.epochs, lr,
             lambda b: moon_batch_loss(model, b, hp, snapshot, prev), stats, "all", timer, precision)
    elif spec.objective == "fedrep":
        body, head = model.body_parameters(), model.head_parameters()
        for frozen, trained, epochs, phase in ((body, head, hp.head_epochs, "head"),
                                               (head, body, hp.epochs, "body")):
            for p in frozen:
                p.requires_grad_(False)
            try:
                _run(model, trained, batches, epochs, lr, ce, stats, phase, timer, precision)
            finally:
                for p in frozen:
                    p.requires_grad_(True)
    else:
        raise ValueError(f"unknown objective {spec.objective!r}")
    model.eval()
    steps = max(stats["_steps"], 1)
    out = {"loss": stats["_loss"] / steps, "n_steps": stats["_steps"],
           "n_examples": stats["n_examples"], "phases": stats["phases"], "lr": lr}
    out.update({k: v / steps for k, v in stats["_parts"].items()})
    out.update(timer.stats())
    return out
