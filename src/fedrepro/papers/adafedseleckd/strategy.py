"""AdaFedSelecKD's server rules: FedAvg (eq. 2) and Table V's FedOpt, FedProx and FedNova.

Every class subclasses the runner's :class:`~fedrepro.fl.strategy.SortedCheckpointFedAvg` (replies
sorted by partition id for same-bits reruns, a failed client stops the run, seeded client
sampling, a checkpoint after every round).  Flower's strategies are used for what they do:

==============  ==================================================================================
method          server step per round
==============  ==================================================================================
AdaFedAvg, KD   the base strategy: Flower's weighted average of the replies (n_i/n)
AdaFedOPT       Flower's ``FedAdam`` / ``FedYogi`` / ``FedAdagrad`` (Reddi et al. 2021, Alg. 2):
                the weighted average minus the broadcast is the pseudo-gradient Δ_t;
                m_t = β₁m + (1−β₁)Δ_t, v_t per the optimiser, x ← x + η·m_t/(√v_t + τ)
                (``adafedseleckd.server_optimizer``; the optimiser's m_t, v_t are saved per round)
AdaFedProx      Flower's ``FedProx`` (sends ``proximal-mu``) + FedAvg; the client adds
                μ/2‖w − w^r‖² (:func:`fedrepro.fl.algorithms.fedprox_proximal_term`)
AdaFedNova      FedNova (Wang et al. 2020): x ← x − τ_eff·Σ p_i (x − y_i)/τ_i with τ_i the
                client's local optimiser steps (:func:`fedrepro.fl.algorithms.fednova_aggregate`)
==============  ==================================================================================

The paper (§V-A, Table V) names the algorithms and nothing else; the optimiser, its η, β₁, β₂, τ
and FedProx's μ are config keys (docs/decisions.md).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, Message
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedProx, FedYogi

from fedrepro.fl.algorithms import fednova_aggregate
from fedrepro.fl.strategy import SortedCheckpointFedAvg
from fedrepro.io import InputError, torch_save_atomic
from fedrepro.papers.adafedseleckd.methods import get_method

log = logging.getLogger(__name__)

BIAS_CORRECTIONS = ("flower", "adam", "none")
"""``adafedseleckd.server_optimizer.bias_correction`` (FedAdam only; see :class:`AdaFedOptStrategy`)."""

SERVER_OPTIMIZERS = {"adam": FedAdam, "yogi": FedYogi, "adagrad": FedAdagrad}
"""``adafedseleckd.server_optimizer.name`` -> Flower's FedOpt strategy (Reddi et al. 2021)."""


class AdaFedOptStrategy(SortedCheckpointFedAvg):
    """AdaFedOPT: Flower's FedAdam / FedYogi / FedAdagrad applied to the sorted replies.

    A Flower FedOpt strategy held inside does the step: its ``aggregate_train`` averages the
    replies (FedAvg) and applies the adaptive update to the broadcast ``current_arrays``; its
    moment estimates m_t, v_t are the server state saved after every round (resume, same bits).
    The bias correction uses the absolute round, so a resumed run steps as an uninterrupted one.

    FedAdam's bias correction (``server_optimizer.bias_correction``; FedYogi and FedAdagrad have
    none in Flower): Reddi et al.'s Algorithm 2 has **no** bias correction; Flower's ``FedAdam``
    scales η by Kingma & Ba's α_t = √(1 − β₂^(t+1)) / (1 − β₁^(t+1)) at server round t, i.e. one
    round later than Adam's usual t (round 1 is corrected as Adam's step 2).  ``flower`` (both
    configs' default: the library's step, today's bits); ``adam``: Adam's exponent t (Flower's
    step given round t − 1, exact); ``none``: Reddi's η, no correction (η divided by Flower's
    factor for that round before its step, equal to η up to one rounding).

    FedAdagrad has no β₁ or β₂ (Flower fixes β₁ = 0: no momentum; v_t sums Δ²): the config's
    ``beta_1``/``beta_2`` (set for adam/yogi in both configs) are ignored with a log line.
    """

    def __init__(self, cell: Mapping, **kwargs):
        super().__init__(**kwargs)
        opt = dict(cell.get("server_optimizer") or {})
        name = opt.pop("name", "adam")
        if name not in SERVER_OPTIMIZERS:
            raise InputError(
                f"adafedseleckd.server_optimizer.name must be one of {sorted(SERVER_OPTIMIZERS)}, "
                f"got {name!r}"
            )
        unknown = set(opt) - {"eta", "beta_1", "beta_2", "tau"}
        unknown.discard("bias_correction")
        if unknown:
            raise InputError(f"adafedseleckd.server_optimizer: unknown keys {sorted(unknown)}")
        self.bias_correction = str(opt.pop("bias_correction", "flower"))
        if self.bias_correction not in BIAS_CORRECTIONS:
            raise InputError(
                f"adafedseleckd.server_optimizer.bias_correction must be one of {BIAS_CORRECTIONS}, "
                f"got {self.bias_correction!r}")
        if self.bias_correction != "flower" and name != "adam":
            raise InputError(
                f"adafedseleckd.server_optimizer.bias_correction: {self.bias_correction!r} applies to "
                f"name: adam only ({name} has no bias correction in Flower); leave it at 'flower'")
        if name == "adagrad":  # FedAdagrad has no β₁/β₂ (the config's values are for adam/yogi)
            dropped = {k: opt.pop(k) for k in ("beta_1", "beta_2") if k in opt}
            if dropped:
                log.info("AdaFedOPT with FedAdagrad ignores adafedseleckd.server_optimizer %s "
                         "(Flower's FedAdagrad has beta_1 = 0: no momentum)", dropped)
        self.optimizer_name = name
        self.opt = SERVER_OPTIMIZERS[name](
            eta_l=float(cell["train"]["lr"]), **{k: float(v) for k, v in opt.items()}
        )
        if self.round_offset > 0:
            self.load_moments(self.round_offset)

    def configure_train(self, server_round, arrays, config, grid):
        self.opt.current_arrays = {k: a.numpy() for k, a in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        if self.bias_correction == "adam":  # Flower corrects with round + 1: give it Adam's t - 1
            arrays, metrics = self.opt.aggregate_train(absolute_round - 1, replies)
        elif self.bias_correction == "none":  # Reddi et al. Alg. 2: η itself
            eta = self.opt.eta
            b1, b2, t = self.opt.beta_1, self.opt.beta_2, absolute_round + 1.0
            self.opt.eta = eta / (np.sqrt(1 - np.power(b2, t)) / (1 - np.power(b1, t)))
            try:
                arrays, metrics = self.opt.aggregate_train(absolute_round, replies)
            finally:
                self.opt.eta = eta
        else:
            arrays, metrics = self.opt.aggregate_train(absolute_round, replies)
        # Flower computes in the arrays' dtype (float32); keep the adapters' dtype and key order
        return ArrayRecord(OrderedDict(
            (k, torch.from_numpy(np.ascontiguousarray(
                arrays[k].numpy().astype(self.opt.current_arrays[k].dtype, copy=False))))
            for k in self.opt.current_arrays
        )), metrics

    # -- m_t, v_t per round -------------------------------------------------------------------
    def moments_path(self, absolute_round: int) -> Path:
        return self.out_dir / "checkpoints" / f"server_opt_round_{absolute_round:03d}.pt"

    def save_server_state(self, absolute_round: int) -> None:
        state = {
            "m_t": {k: torch.from_numpy(v.copy()) for k, v in (self.opt.m_t or {}).items()},
            "v_t": {k: torch.from_numpy(v.copy()) for k, v in (self.opt.v_t or {}).items()},
        }
        torch_save_atomic(state, self.moments_path(absolute_round))

    def load_moments(self, absolute_round: int) -> None:
        path = self.moments_path(absolute_round)
        if not path.exists():
            raise InputError(
                f"{path}: the server optimiser state of round {absolute_round} is missing; delete "
                f"{self.out_dir / 'checkpoints'} to restart this cell"
            )
        state = torch.load(path, weights_only=True)
        self.opt.m_t = {k: v.numpy() for k, v in state["m_t"].items()} or None
        self.opt.v_t = {k: v.numpy() for k, v in state["v_t"].items()} or None


class AdaFedProxStrategy(FedProx, SortedCheckpointFedAvg):
    """AdaFedProx's server: Flower's ``FedProx`` (writes ``proximal-mu`` into the round's config)
    before the runner strategy in the MRO; aggregation is FedAvg.  The client reads the same μ
    from the cell (``train.prox_mu``), since the shared ClientApp hands a task its tensors only."""

    def __init__(self, cell: Mapping, **kwargs):
        SortedCheckpointFedAvg.__init__(self, **kwargs)
        self.proximal_mu = float(cell["train"].get("prox_mu", 0.0))
        if self.proximal_mu < 0:
            raise InputError(f"adafedseleckd.train.prox_mu must be >= 0, got {self.proximal_mu}")


class AdaFedNovaStrategy(SortedCheckpointFedAvg):
    """AdaFedNova: FedNova's normalised averaging by the clients' local step counts."""

    def __init__(self, cell: Mapping, **kwargs):
        super().__init__(**kwargs)
        self._current: OrderedDict | None = None

    def configure_train(self, server_round, arrays, config, grid):
        self._current = arrays.to_torch_state_dict()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        _, metrics = super().aggregate_arrays(absolute_round, replies)  # metrics: Flower's average
        steps = [int(m.content["metrics"]["n-batches"]) for m in replies]
        ns = [int(m.content["metrics"]["num-examples"]) for m in replies]
        states = [m.content["arrays"].to_torch_state_dict() for m in replies]
        return ArrayRecord(fednova_aggregate(self._current, states, steps, ns)), metrics

    def round_extras(self, absolute_round: int, replies: list[Message]) -> dict:
        return {"local_steps": [int(m.content["metrics"]["n-batches"]) for m in replies]}


def make_strategy(cell: Mapping, **kwargs) -> SortedCheckpointFedAvg:
    """The server of ``cell['method']`` (the runner's base strategy for FedAvg and the KD methods)."""
    server = get_method(cell["method"]).server
    if server == "fedopt":
        return AdaFedOptStrategy(cell, **kwargs)
    if server == "fedprox":
        return AdaFedProxStrategy(cell, **kwargs)
    if server == "fednova":
        return AdaFedNovaStrategy(cell, **kwargs)
    return SortedCheckpointFedAvg(**kwargs)
