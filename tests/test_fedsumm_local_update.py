"""FedSUMM's client update (Algorithm 1's ClientUpdate with eq. 7) on a model small enough to
write every step out by hand: a linear regression with a trainable parameter the loss never
uses and a frozen one.  What the step tests of tests/test_step_fedsumm.py (one step of the real
BART / CT clients) leave open: several steps and epochs, the bookkeeping of the result (examples,
steps, mean eq. 7 term and gradient norm), eq. 7's ``loss_difference`` reading with and without
the differentiated norm, what happens to a parameter without a gradient, and the objective's
early returns.  The references are eq. 7 written out here (float64), not the project's code."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

from fedrepro.io import InputError
from fedrepro.papers.fedsumm.algorithm import (
    ClientGuidance,
    FedSummConfig,
    fedsumm_local_update,
    fedsumm_objective,
)

EPS, RHO, L_PREV, LR = 0.2, 1.7, 0.3, 0.05


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(4)
        self.w = torch.nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.tensor(0.4, dtype=torch.float64))
        self.unused = torch.nn.Parameter(torch.tensor([1.5, -2.0], dtype=torch.float64))
        self.frozen = torch.nn.Parameter(torch.tensor(3.0, dtype=torch.float64),
                                         requires_grad=False)


def _loss(model, batch) -> torch.Tensor:
    """L_b: mean squared error of ``x·w + b + frozen`` against the labels."""
    pred = batch["x"] @ model.w + model.b + model.frozen
    return ((pred - batch["labels"]) ** 2).mean()


def _batches():
    g = torch.Generator().manual_seed(8)
    return [{"x": 2.0 * torch.randn(3, 3, generator=g, dtype=torch.float64),
             "labels": torch.randn(3, generator=g, dtype=torch.float64)} for _ in range(2)]


def _eq7_step(w, b, batch, differentiate_norm: bool):
    """One SGD step ``θ ← θ − δ ∇J`` on eq. 7's J = L + ε·ρ·(L − l_prev)·max(‖∇L‖, 1) (the
    ``loss_difference`` reading; the max detached unless ``differentiate_norm``); returns the new
    (w, b), L, the term and ‖∇L‖."""
    w = w.detach().clone().requires_grad_(True)
    b = b.detach().clone().requires_grad_(True)
    pred = batch["x"] @ w + b + 3.0
    loss = ((pred - batch["labels"]) ** 2).mean()
    gw, gb = torch.autograd.grad(loss, (w, b), create_graph=True)
    norm = torch.sqrt((gw ** 2).sum() + gb ** 2)  # the unused parameter's gradient is 0
    scale = torch.clamp(norm, min=1.0)
    if not differentiate_norm:
        scale = scale.detach()
    term = EPS * RHO * (loss - L_PREV) * scale
    jw, jb = torch.autograd.grad(loss + term, (w, b))
    return w - LR * jw, b - LR * jb, float(loss), float(term), float(norm)


@pytest.mark.parametrize("differentiate_norm", [False, True])
def test_several_steps_and_epochs_follow_eq7_loss_difference(differentiate_norm):
    model = Tiny()
    unused0, frozen0 = model.unused.detach().clone(), model.frozen.detach().clone()
    config = FedSummConfig(dldt="loss_difference", differentiate_grad_norm=differentiate_norm,
                           epsilon=EPS)
    guidance = ClientGuidance(None, RHO, L_PREV, EPS)
    named = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(named, lr=LR)
    res = fedsumm_local_update(model, lambda epoch: _batches(), _loss, optimizer, guidance,
                               config, local_epochs=2)
    w, b = Tiny().w.detach(), Tiny().b.detach()
    w0, b0 = w.clone(), b.clone()
    losses, terms, norms = [], [], []
    for _ in range(2):  # epochs
        for batch in _batches():
            w, b, loss, term, norm = _eq7_step(w, b, batch, differentiate_norm)
            losses.append(loss)
            terms.append(term)
            norms.append(norm)
    assert max(norms) > 1  # the max(‖∇L‖, 1) is the norm, so differentiating it matters
    torch.testing.assert_close(res.params["w"], w.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.params["b"], b.detach(), rtol=1e-12, atol=1e-12)
    assert torch.equal(res.params["unused"], unused0)  # no gradient: not moved
    assert "frozen" not in res.params and torch.equal(model.frozen, frozen0)
    # client_gradient "delta": g^c = w_t − w^c
    torch.testing.assert_close(res.gradient["w"], w0 - w.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.gradient["b"], b0 - b.detach(), rtol=1e-12, atol=1e-12)
    assert res.n_steps == 4 and res.n_examples == 3 + 3  # the examples of one epoch
    assert res.step_losses == pytest.approx(losses, rel=1e-12)
    assert res.loss == pytest.approx(sum(losses) / 4, rel=1e-12)
    assert res.mean_objective_term == pytest.approx(sum(terms) / 4, rel=1e-12)
    assert res.mean_grad_norm == pytest.approx(sum(norms) / 4, rel=1e-12)


def test_the_differentiated_norm_changes_the_step():
    """The two readings of eq. 7's max(‖∇L‖, 1) give different steps here (so the test above
    tells them apart)."""
    batch = _batches()[0]
    w, b = Tiny().w.detach(), Tiny().b.detach()
    assert not torch.allclose(_eq7_step(w, b, batch, False)[0], _eq7_step(w, b, batch, True)[0])


def test_a_parameter_without_gradient_stays_put_under_adamw_with_decay():
    """``zero_grad(set_to_none=True)``: a trainable parameter the loss does not use keeps no
    gradient, so AdamW neither decays nor moves it (a zero gradient would decay it)."""
    model = Tiny()
    unused0 = model.unused.detach().clone()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR,
                                  weight_decay=0.5)
    res = fedsumm_local_update(model, _batches(), _loss, optimizer, None, FedSummConfig())
    assert torch.equal(res.params["unused"], unused0)
    assert not torch.equal(res.params["b"], Tiny().b.detach())


def test_the_objective_without_a_term_and_its_parts():
    model = Tiny()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    loss = _loss(model, _batches()[0])
    for config, guidance in [
        (FedSummConfig(), None),  # a client's first round
        (FedSummConfig(dldt="off"), ClientGuidance(None, RHO, L_PREV, EPS)),
        (FedSummConfig(), ClientGuidance(None, RHO, L_PREV, EPS)),  # no memory entry yet
        (FedSummConfig(dldt="loss_difference"), ClientGuidance(None, RHO, None, EPS)),
        (FedSummConfig(dldt="loss_difference"), ClientGuidance(None, None, L_PREV, EPS)),
    ]:
        total, parts = fedsumm_objective(loss, named, guidance, config)
        assert total is loss
        assert set(parts) == {"objective_term", "dldt", "grad_norm"}
        assert parts["objective_term"] == 0.0
        assert math.isnan(parts["dldt"]) and math.isnan(parts["grad_norm"])


def test_the_inner_product_term_and_a_gradient_that_lacks_a_parameter():
    """eq. 4's dL/dt = ⟨∇L, −g̃⟩ with the unused parameter's gradient 0; a g̃ without one of the
    trainable parameters is refused naming it."""
    model = Tiny()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    batch = _batches()[0]
    g_mod = OrderedDict(w=torch.tensor([0.3, -0.1, 0.2]), b=torch.tensor(-0.5),
                        unused=torch.tensor([7.0, 7.0]))  # float32: cast to the gradient's dtype
    total, parts = fedsumm_objective(_loss(model, batch), named,
                                     ClientGuidance(g_mod, RHO, L_PREV, EPS), FedSummConfig())
    gw, gb = torch.autograd.grad(_loss(model, batch), (model.w, model.b))
    dldt = -(float(gw @ g_mod["w"].double()) + float(gb * g_mod["b"].double()))
    norm = math.sqrt(float((gw ** 2).sum() + gb ** 2))
    assert parts["dldt"] == pytest.approx(dldt, rel=1e-7)
    assert parts["grad_norm"] == pytest.approx(norm, rel=1e-12)
    assert parts["objective_term"] == pytest.approx(dldt * max(norm, 1.0), rel=1e-7)
    assert total.dtype == torch.float64
    assert float(total) == pytest.approx(float(_loss(model, batch)) + parts["objective_term"])
    del g_mod["b"]
    with pytest.raises(InputError, match=r"lacks parameters \['b'\]"):
        fedsumm_objective(_loss(model, batch), named, ClientGuidance(g_mod, RHO, L_PREV, EPS),
                          FedSummConfig())
