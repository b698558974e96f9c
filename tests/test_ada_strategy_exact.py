"""AdaFedSelecKD's server rules at their edges (issue 24's mutation survivors of
``adafedseleckd/strategy.py`` and ``fl/algorithms.py``): defaults, where the server optimiser's
state lives, μ = 0, and FedNova with a one-step client."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_ada_methods import X0, _configure, _strategy_kwargs

from fedrepro.fl.algorithms import fednova_aggregate
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd.strategy import AdaFedOptStrategy, AdaFedProxStrategy


def test_server_optimizer_without_a_name_is_flowers_fedadam(tmp_path):
    cell = {"method": "AdaFedOPT", "train": {"lr": 0.01}, "server_optimizer": {"eta": 0.05}}
    s = AdaFedOptStrategy(cell, **_strategy_kwargs(tmp_path))
    assert s.optimizer_name == "adam" and type(s.opt).__name__ == "FedAdam"
    assert s.opt.eta == 0.05 and s.bias_correction == "flower"


def test_the_server_moments_live_in_the_cells_checkpoint_folder(tmp_path):
    """With the round checkpoints, so a finished cell's cleanup removes them and a restart
    (checkpoints deleted) never resumes stale moments."""
    s = AdaFedOptStrategy({"method": "AdaFedOPT", "train": {"lr": 0.01}, "server_optimizer": {"name": "adam"}},
                          **_strategy_kwargs(tmp_path))
    assert s.moments_path(7) == tmp_path / "checkpoints" / "server_opt_round_007.pt"


def test_fedprox_mu_zero_is_allowed_and_the_default(task_identity, tmp_path):
    """μ = 0 is FedAvg (Li et al.): allowed, sent as 0.0; a cell without ``prox_mu`` sends 0.0."""
    for cell in ({"method": "AdaFedProx", "train": {"prox_mu": 0.0}}, {"method": "AdaFedProx", "train": {}}):
        s = AdaFedProxStrategy(cell, **_strategy_kwargs(tmp_path))
        assert s.proximal_mu == 0.0
        instructions = _configure(s, 1, X0)
        assert all(m.content["config"]["proximal-mu"] == 0.0 for m in instructions)
    with pytest.raises(InputError, match="prox_mu must be >= 0"):
        AdaFedProxStrategy({"train": {"prox_mu": -1e-9}}, **_strategy_kwargs(tmp_path))


def test_fednova_accepts_a_one_step_client_and_refuses_zero():
    """τ_i = 1 (one local step) is the smallest legal count: x − τ_eff Σ p_i (x − y_i)/τ_i by hand."""
    x = {"w": torch.tensor([1.0, -2.0])}
    ys = [{"w": torch.tensor([0.0, 0.0])}, {"w": torch.tensor([3.0, 1.0])}]
    n, tau = [1, 3], [1, 2]
    p = [1 / 4, 3 / 4]
    tau_eff = p[0] * tau[0] + p[1] * tau[1]  # 1.75
    want = np.array([1.0, -2.0]) - tau_eff * sum(
        p[i] * (np.array([1.0, -2.0]) - ys[i]["w"].numpy()) / tau[i] for i in range(2))
    got = fednova_aggregate(x, ys, tau, n)
    assert np.allclose(got["w"].numpy(), want, atol=1e-6)
    with pytest.raises(InputError, match=">= 1 local step"):
        fednova_aggregate(x, ys, [0, 2], n)
