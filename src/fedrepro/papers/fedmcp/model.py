"""Global/private Houlsby adapter pair on a frozen RoBERTa (FedMCP §IV-B, Fig. 2b/2c).

FedMCP inserts two bottleneck adapters -- the *global* adapter ``A_g`` (averaged by the server)
and the *private* adapter ``A_p`` (never leaves the client) -- at the same positions of a frozen
PLM and averages their outputs (§IV-B):

    h ← h + ½·GeLU(h·W_g^down)·W_g^up + ½·GeLU(h·W_p^down)·W_p^up        (§IV-B, after Eq. 2)

The positions are Houlsby et al.'s [14] (§III "PEFT with Adapters": "an adapter is added after
the attention and feedforward network layers"; Fig. 2c): in *every* transformer layer, once on
the output of the attention output projection and once on the output of the FFN output
projection, in both cases before the residual add + LayerNorm.  In transformers 5 those two
sublayers are ``RobertaSelfOutput`` (``layer.attention.output``) and ``RobertaOutput``
(``layer.output``), whose forward is ``LayerNorm(dropout(dense(x)) + input)``.  We wrap their
``dropout`` module so the computation becomes

    h = dropout(dense(x));  h ← combine(h);  out = LayerNorm(h + input)

Wrapping the parameter-free ``dropout`` (rather than replacing ``dense``) leaves the backbone's
state-dict keys unchanged, so pretrained weights still load into a wrapped backbone.

Modes (the :class:`DualAdapterRouter` decides what ``combine`` does at every position):

``"both"``     ``h + ½·a_g(h) + ½·a_p(h)`` -- the full model (red path, head g1, ``L_a`` Eq. 3).
``"global"``   ``h + a_g(h)`` -- backbone + global adapter (brown path, head g2, ``L_b`` Eq. 4;
               representation X of §IV-D, and Z when the averaged global adapter is loaded).
``"private"``  ``h + a_p(h)`` -- backbone + private adapter (representation Y of §IV-D).
``"none"``     ``h`` -- the plain frozen backbone.

Why the single-adapter modes use weight 1 rather than ½: the paper describes the brown path as
"the backbone with only the global adapter" and §IV-C asks the global adapter to "adapt to each
client's downstream tasks, even without the help of private adapters"; a backbone with one
adapter is, by the paper's own definition, Eq. (2) ``h ← h + GeLU(h·W^down)·W^up`` -- the same
form FedAvg (PEFT) uses for ``A_g`` (Fig. 1).  The ½ weights are introduced specifically as the
*average* of two adapters' outputs ("their outputs are averaged"); with a single adapter the
average is that adapter's output.  The paper does not state this explicitly: it is our choice.

An adapter is ``a(h) = GeLU(h·W_down + b_down)·W_up + b_up`` (``nn.Linear`` with biases, as in
Houlsby et al.; the paper's equations omit biases).  ``W_down ~ N(0, 0.02)``, ``W_up = b_up = 0``,
so at initialisation every mode equals the plain backbone.  Bottleneck r = 16 (§V-A).  Houlsby's
adapter-internal LayerNorm training is *not* used: the backbone, including its LayerNorms, is
frozen ("All the parameters in the backbone remain fixed", §IV-E).

Parameter shares (:func:`parameter_shares` on :func:`roberta_base_config`, the released
roberta-base: 12 layers, hidden 768, vocab 50265, 514 positions, 1 token type; 2-class task,
linear heads):

===========================================  ============  =========================
quantity                                     count         share of full FT (124,647,170)
===========================================  ============  =========================
backbone (``RobertaModel`` incl. pooler)     124,645,632
one adapter, r=16 (2·768·16 + 16 + 768)       25,360
one adapter set (12 layers × 2 positions)    608,640       0.4883 %
trainable: 2 adapter sets + heads g1, g2     1,220,356     0.9790 %
communicated per round: global set only      608,640       0.4883 %
===========================================  ============  =========================

Full fine-tuning = backbone + one linear head (768·2 + 2 = 1,538).  The paper reports 1.16 %
trainable / 0.58 % communicated (§V-C, Table I); our exact counts are ≈ 0.84× those.  The paper's
ratio 2:1 is reproduced (communicated = exactly half of the adapter parameters).  Its absolute
figures are not reproducible from the stated setup (r = 16, two Houlsby positions per layer):
0.58 % of ~124.6 M is ~723 k parameters per adapter set, i.e. ~30.1 k per adapter position,
which no standard variant gives exactly (with Houlsby's two trainable adapter-side LayerNorms,
+1,536 per position, it would be 26,896 → 0.518 %).  Note ``RobertaConfig()`` defaults in
transformers 5 are *not* exactly roberta-base (512 positions, 2 token types, eps 1e-12): its
backbone has 124,644,864 parameters, 768 fewer; the shares agree to 4 decimals.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn
from torch.nn import functional as F

ADAPTER_ROLES = ("global", "private")
MODES = ("both", "global", "private", "none")
POSITIONS = ("attention", "ffn")  # Houlsby positions inside one transformer layer
POOLINGS = ("mean", "cls")


class GeluAdapter(nn.Module):
    """One bottleneck adapter of FedMCP Eq. (2), returning only the residual branch.

    ``a(h) = GeLU(h·W_down + b_down)·W_up + b_up``; the caller adds it (with its weight) to ``h``.

    Parameters
    ----------
    hidden : int
        Hidden size h of the backbone.
    bottleneck : int
        r, the bottleneck size (paper: 16).
    """

    def __init__(self, hidden: int, bottleneck: int) -> None:
        super().__init__()
        self.down = nn.Linear(hidden, bottleneck)
        self.up = nn.Linear(bottleneck, hidden)
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # the boundary with a bf16 frozen backbone (``fedmcp.frozen_dtype: bf16``): the adapter
        # computes in its own dtype (float32) and hands the backbone's dtype on; with a float32
        # backbone both casts are the identity (the tensor itself, no op)
        x = h if h.dtype == self.down.weight.dtype else h.to(self.down.weight.dtype)
        out = self.up(F.gelu(self.down(x)))
        return out if out.dtype == h.dtype else out.to(h.dtype)


class HoulsbyPair(nn.Module):
    """The two adapters of one role in one transformer layer (after attention, after FFN)."""

    def __init__(self, hidden: int, bottleneck: int) -> None:
        super().__init__()
        self.attention = GeluAdapter(hidden, bottleneck)
        self.ffn = GeluAdapter(hidden, bottleneck)


def head_input(hidden: torch.Tensor, head: nn.Module) -> torch.Tensor:
    """``hidden`` in the dtype of ``head``'s weight: a bf16 frozen backbone's last hidden state
    (``fedmcp.frozen_dtype: bf16``) enters the float32 heads as float32; with a float32 backbone
    the tensor itself."""
    dtype = head.weight.dtype
    return hidden if hidden.dtype == dtype else hidden.to(dtype)


class HoulsbyAdapterSet(nn.Module):
    """All adapters of one role (global or private): one :class:`HoulsbyPair` per layer.

    State-dict keys are role-independent (``layers.{i}.{attention|ffn}.{down|up}.{weight|bias}``),
    so a global set's state can be averaged and loaded into any client's global set.
    """

    def __init__(self, hidden: int, bottleneck: int, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(HoulsbyPair(hidden, bottleneck) for _ in range(n_layers))

    def adapter(self, layer: int, position: str) -> GeluAdapter:
        return getattr(self.layers[layer], position)


class DualAdapterRouter:
    """Decides how the wrapped sublayers combine the two adapters (see the module docstring)."""

    def __init__(self, sets: nn.ModuleDict) -> None:
        self.sets = sets
        self.mode = "both"

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode

    def combine(self, layer: int, position: str, h: torch.Tensor) -> torch.Tensor:
        mode = self.mode
        if mode == "none":
            return h
        if mode == "both":  # §IV-B: h + ½ a_g(h) + ½ a_p(h)
            a_g = self.sets["global"].adapter(layer, position)
            a_p = self.sets["private"].adapter(layer, position)
            return h + 0.5 * a_g(h) + 0.5 * a_p(h)
        return h + self.sets[mode].adapter(layer, position)(h)  # Eq. (2), single adapter


class HoulsbyInsertion(nn.Module):
    """Replaces the ``dropout`` of a ``RobertaSelfOutput`` / ``RobertaOutput``.

    That sublayer computes ``LayerNorm(dropout(dense(x)) + input)``; with this wrapper it computes
    ``LayerNorm(combine(dropout(dense(x))) + input)``, i.e. the adapters act on the projected
    sublayer output before the residual add and LayerNorm (Houlsby position).  The adapters are
    owned by :class:`DualAdapterRoberta`; this module holds only a plain reference to the router.
    """

    def __init__(
        self, dropout: nn.Module, router: DualAdapterRouter, layer: int, position: str
    ) -> None:
        super().__init__()
        self.dropout = dropout
        object.__setattr__(self, "_router", router)  # plain reference, not a submodule
        self.layer = layer
        self.position = position

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._router.combine(self.layer, self.position, self.dropout(h))


def _wrap_sublayer(sublayer: nn.Module, router: DualAdapterRouter, layer: int, position: str):
    for name in ("dense", "dropout", "LayerNorm"):
        if not hasattr(sublayer, name):
            raise TypeError(
                f"{type(sublayer).__name__} has no {name!r}: not a RoBERTa output sublayer "
                "(expected transformers' RobertaSelfOutput / RobertaOutput)"
            )
    if isinstance(sublayer.dropout, HoulsbyInsertion):
        raise ValueError("backbone already carries Houlsby insertions")
    sublayer.dropout = HoulsbyInsertion(sublayer.dropout, router, layer, position)


class DualAdapterRoberta(nn.Module):
    """Frozen RoBERTa + global/private adapter sets + heads g1, g2 (FedMCP Fig. 2b).

    Parameters
    ----------
    backbone : transformers ``RobertaModel``
        Frozen (``requires_grad=False``, always in eval mode); modified in place (every layer's
        two output sublayers get a :class:`HoulsbyInsertion`).
    num_labels : int
        Classes of this client's task (heads are not shared across tasks, §V-A).
    bottleneck : int
        Adapter bottleneck r (paper: 16).

    Notes
    -----
    g1 (full model, ``L_a`` Eq. 3) and g2 (backbone + global adapter, ``L_b`` Eq. 4) are linear
    classifiers on the pooled last-layer representation.  The paper calls them "MLP classifiers"
    without giving their depth; a single linear layer is used here.
    """

    def __init__(self, backbone: nn.Module, num_labels: int, bottleneck: int = 16) -> None:
        super().__init__()
        if getattr(backbone.config, "add_cross_attention", False):
            raise ValueError("cross-attention RoBERTa decoders are not supported")
        self.backbone = backbone
        for p in self.backbone.parameters():
            p.requires_grad_(False)
        hidden = backbone.config.hidden_size
        layers = backbone.encoder.layer
        self.adapters = nn.ModuleDict(
            {role: HoulsbyAdapterSet(hidden, bottleneck, len(layers)) for role in ADAPTER_ROLES}
        )
        self.router = DualAdapterRouter(self.adapters)
        for i, layer in enumerate(layers):
            _wrap_sublayer(layer.attention.output, self.router, i, "attention")
            _wrap_sublayer(layer.output, self.router, i, "ffn")
        self.g1 = nn.Linear(hidden, num_labels)
        self.g2 = nn.Linear(hidden, num_labels)
        self.backbone.eval()

    # -- modes and parameters -------------------------------------------------------------
    def train(self, mode: bool = True) -> DualAdapterRoberta:
        super().train(mode)
        self.backbone.eval()  # frozen backbone: no dropout, whatever the adapters' mode
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def global_adapter_state(self) -> OrderedDict[str, torch.Tensor]:
        """The global adapter tensors -- the only ones FedMCP sends to the server (§IV-E)."""
        return OrderedDict(
            (k, v.detach().clone()) for k, v in self.adapters["global"].state_dict().items()
        )

    def load_global_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load the server's averaged global adapter; the key set must match exactly."""
        own = set(self.adapters["global"].state_dict())
        got = set(state)
        if own != got:
            raise ValueError(
                f"global adapter state keys differ: missing {sorted(own - got)[:5]}, "
                f"unexpected {sorted(got - own)[:5]}"
            )
        self.adapters["global"].load_state_dict(state, strict=True)

    # -- forward --------------------------------------------------------------------------
    @staticmethod
    def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
        """Sentence representation: masked token mean (§IV-D, default) or the ``<s>`` token."""
        if pooling == "cls":
            return hidden[:, 0]
        if pooling != "mean":
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mode: str = "both",
        pooling: str = "mean",
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Encode with ``mode``'s adapters; return ``(logits, pooled)``.

        ``logits`` come from g1 for ``"both"`` and from g2 for ``"global"``; the paper defines no
        head for ``"private"`` / ``"none"`` (the private path only yields Y for the contrastive
        loss), so ``logits`` is ``None`` there.
        """
        self.router.set_mode(mode)
        try:
            hidden = self.backbone(
                input_ids=input_ids, attention_mask=attention_mask
            ).last_hidden_state
        finally:
            self.router.set_mode("both")
        hidden = head_input(hidden, self.g1)
        pooled = self.pool(hidden, attention_mask, pooling)
        if mode == "both":
            return self.g1(pooled), pooled
        if mode == "global":
            return self.g2(pooled), pooled
        return None, pooled


# -- parameter accounting ---------------------------------------------------------------------
def roberta_base_config():
    """The released ``FacebookAI/roberta-base`` architecture, built offline."""
    from transformers import RobertaConfig

    return RobertaConfig(
        vocab_size=50265,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=514,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )


def adapter_set_params(hidden: int, n_layers: int, bottleneck: int = 16) -> int:
    """Parameters of one adapter set: 2 positions × n_layers × (2·h·r + r + h)."""
    return 2 * n_layers * (2 * hidden * bottleneck + bottleneck + hidden)


def parameter_shares(config, bottleneck: int = 16, num_labels: int = 2) -> dict:
    """Exact parameter counts and shares of FedMCP on ``config`` (FedMCP §V-C, Table I).

    The backbone is instantiated on the meta device (no memory, no weights) and counted, pooler
    included (what ``RobertaModel.from_pretrained`` gives).  Shares are relative to full
    fine-tuning, i.e. backbone + one linear head.  For roberta-base see the module docstring:
    trainable 0.9790 %, communicated 0.4883 % (paper: 1.16 % / 0.58 %).
    """
    from transformers import RobertaModel

    with torch.device("meta"):
        backbone = RobertaModel(config)
    backbone_params = sum(p.numel() for p in backbone.parameters())
    hidden = config.hidden_size
    one_set = adapter_set_params(hidden, config.num_hidden_layers, bottleneck)
    head = hidden * num_labels + num_labels
    full_ft = backbone_params + head
    trainable = 2 * one_set + 2 * head
    communicated = one_set
    return {
        "backbone_params": backbone_params,
        "head_params": head,
        "adapter_set_params": one_set,
        "adapter_params": 2 * one_set,
        "full_finetune_params": full_ft,
        "trainable_params": trainable,
        "communicated_params": communicated,
        "trainable_share": trainable / full_ft,
        "communicated_share": communicated / full_ft,
    }
