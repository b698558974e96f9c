"""Bottleneck adapters (AdaFedSelecKD §III-B3, eq. 5) and the global/local adapter pair.

Adapters sit after the top-k decoder layers of a frozen seq2seq backbone.  Each adapted layer
has one adapter per *role*: ``global`` (holds the server's parameters, never trained locally,
teacher in knowledge distillation) and ``local`` (trained on the client's data, student).
Methods that have a single adapter (AdaSingle, AdaCentralized, AdaFedAvg) only have ``local``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

ROLES = ("global", "local")


class BottleneckAdapter(nn.Module):
    """Houlsby-style bottleneck adapter of AdaFedSelecKD eq. 5.

    ``Ŷ = LayerNorm(Y + ReLU(Y · W_down) · W_up)`` with ``W_down ∈ R^{n×m}``, ``W_up ∈ R^{m×n}``.

    The paper does not state biases or the initialisation; we use ``nn.Linear`` with biases (as
    Houlsby et al. do) and initialise ``W_up`` and its bias to zero, so that at initialisation the
    adapter reduces to ``LayerNorm(Y)`` (see docs/decisions.md, "adapter initialisation").

    Parameters
    ----------
    d_model : int
        n, the hidden size of the decoder layer the adapter follows.
    bottleneck : int
        m, the bottleneck dimension (paper: 2048 for the large backbones, 1536 for BART-base).
    """

    def __init__(self, d_model: int, bottleneck: int) -> None:
        super().__init__()
        self.down = nn.Linear(d_model, bottleneck)
        self.up = nn.Linear(bottleneck, d_model)
        self.layer_norm = nn.LayerNorm(d_model)
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        # the boundary with a bf16 frozen backbone (``adafedseleckd.frozen_dtype: bf16``): the
        # adapter computes in its own dtype (float32) and hands the backbone's dtype on; with a
        # float32 backbone both casts are the identity (the tensor itself, no op)
        x = y if y.dtype == self.down.weight.dtype else y.to(self.down.weight.dtype)
        out = self.layer_norm(x + self.up(torch.relu(self.down(x))))
        return out if out.dtype == y.dtype else out.to(y.dtype)


class AdapterStack(nn.Module):
    """One adapter per adapted decoder layer (all of one role)."""

    def __init__(self, d_model: int, bottleneck: int, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(BottleneckAdapter(d_model, bottleneck) for _ in range(n_layers))

    def shared_state(self) -> OrderedDict[str, torch.Tensor]:
        """The tensors this stack exchanges with the server, under role-independent names."""
        return OrderedDict((k, v.detach().clone()) for k, v in self.state_dict().items())

    def load_shared_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load server tensors; the key set must match exactly (no silent partial loads)."""
        own = set(self.state_dict())
        got = set(state)
        if own != got:
            raise ValueError(
                f"adapter state keys differ: missing {sorted(own - got)[:5]}, "
                f"unexpected {sorted(got - own)[:5]}"
            )
        self.load_state_dict(state, strict=True)


class AdaptedDecoderLayer(nn.Module):
    """Wraps one frozen decoder layer and applies the *active* adapter to its output.

    The adapters themselves are owned by the summarizer (so each parameter is registered once);
    this wrapper only holds the layer and a reference to a :class:`AdapterRouter`.
    """

    def __init__(self, layer: nn.Module, router: AdapterRouter, index: int) -> None:
        super().__init__()
        self.layer = layer
        object.__setattr__(self, "_router", router)  # plain reference, not a submodule
        self.index = index

    def forward(self, hidden_states, *args, **kwargs):
        out = self.layer(hidden_states, *args, **kwargs)
        adapter = self._router.adapter(self.index)
        if adapter is None:
            return out
        if isinstance(out, tuple):  # LED layers return tuples, BART layers a tensor
            return (adapter(out[0]),) + tuple(out[1:])
        return adapter(out)


class AdapterRouter:
    """Chooses which role's adapter the wrapped layers apply (``None``: plain backbone)."""

    def __init__(self, stacks: nn.ModuleDict) -> None:
        self.stacks = stacks
        self.active: str | None = "local"

    def adapter(self, index: int) -> nn.Module | None:
        if self.active is None:
            return None
        return self.stacks[self.active].layers[index]


class FrozenProjectionMemo(nn.Module):
    """A frozen linear projection that remembers its last output for the identical input tensor.

    Wrapped around the cross-attention key/value projections of the adapted decoder layers: their
    input is the encoder output, which is the same tensor for the teacher and the student path of
    a batch, and their weights are frozen, so the second path reuses the first one's keys/values
    instead of recomputing them.  The memo is keyed by tensor identity *and* version counter, so an
    in-place change or a new batch always recomputes.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear
        self._memo: tuple | None = None

    def clear(self) -> None:
        self._memo = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memo = self._memo
        if memo is not None and memo[0] is x and memo[1] == x._version:
            return memo[2]
        out = self.linear(x)
        if not out.requires_grad:  # only memoise outputs that carry no autograd history
            self._memo = (x, x._version, out)
        return out
