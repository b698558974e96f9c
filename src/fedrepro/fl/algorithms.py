"""Federated algorithms more than one paper uses (Flower-free tensor code).

* FedProx's client term (Li et al. 2020): FedSum's FedProx baseline and AdaFedSelecKD's AdaFedProx.
* FedNova's normalised averaging (Wang et al. 2020): FedSum's FedNova baseline and AdaFedSelecKD's
  AdaFedNova.

Flower has FedProx's server side (``flwr.serverapp.strategy.FedProx``, which only sends μ) and the
adaptive server optimisers of FedOpt; it has no client-side proximal term and no FedNova, so those
two are written here.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch

from fedrepro.io import InputError


# -- FedProx ---------------------------------------------------------------------------------------
def fedprox_proximal_term(
    named_params: Mapping[str, torch.Tensor], global_state: Mapping[str, torch.Tensor], mu: float
) -> torch.Tensor:
    """μ/2 · Σ ‖w − w_g‖² (FedProx, Li et al. 2020, eq. 2's proximal term) over ``named_params``
    (the trainable parameters) against the received global ``global_state`` (same keys)."""
    missing = set(named_params) - set(global_state)
    if missing:
        raise InputError(f"FedProx: global state lacks {sorted(missing)[:5]}")
    ref = next(iter(named_params.values()))
    total = ref.new_zeros(())
    for k, w in named_params.items():
        total = total + (w - global_state[k].detach().to(w.dtype)).pow(2).sum()
    return 0.5 * float(mu) * total


# -- FedNova ---------------------------------------------------------------------------------------
def fednova_aggregate(
    global_state: Mapping[str, torch.Tensor],
    client_states: Sequence[Mapping[str, torch.Tensor]],
    local_steps: Sequence[int],
    num_examples: Sequence[int],
) -> OrderedDict[str, torch.Tensor]:
    """FedNova (Wang et al. 2020, eq. 6–7) with vanilla SGD (a_i = τ_i):
    d_i = (x − y_i)/τ_i, τ_eff = Σ p_i τ_i, x ← x − τ_eff · Σ p_i d_i, p_i = n_i/n.

    τ_i is the client's number of local optimiser steps.  With an adaptive local optimiser
    (AdaFedSelecKD's AdamW) Wang et al.'s a_i has no closed form; normalising by the step count,
    as for vanilla SGD, is the reading used there (docs/decisions.md)."""
    if not (len(client_states) == len(local_steps) == len(num_examples)) or not client_states:
        raise InputError("FedNova: one state, step count and example count per client needed")
    if any(t < 1 for t in local_steps):
        raise InputError(f"FedNova: every client needs >= 1 local step, got {list(local_steps)}")
    total = math.fsum(num_examples)
    p = [n / total for n in num_examples]
    tau_eff = math.fsum(pi * t for pi, t in zip(p, local_steps))
    out = OrderedDict()
    for k, x in global_state.items():
        d = sum(
            pi * (x.double() - y[k].double()) / t for pi, y, t in zip(p, client_states, local_steps)
        )
        out[k] = (x.double() - tau_eff * d).to(x.dtype)
    return out
