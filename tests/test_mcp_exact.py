"""FedMCP losses pinned to numbers computed here by hand (mutation testing, tests/mutation.py).

Each test computes its expectation independently of :mod:`fedrepro.papers.fedmcp.losses`:
linear CKA by its definition on small hand-made matrices, the ``eps`` of the denominators, the
clamp to [0, 1], the choice between the Gram and the feature form (which n×n / h×h products are
formed), input validation (messages name the function), dtype handling, MOON's loss with its
temperature on a two-example hand case, mean pooling of one-token rows, and the paper's defaults.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from fedrepro.papers.fedmcp import losses
from fedrepro.papers.fedmcp.losses import (
    cosine_similarity_rep,
    fedmcp_loss,
    linear_cka,
    mcp_contrastive_loss,
    mean_pool,
    moon_contrastive_loss,
)


def _cka_by_definition(X: torch.Tensor, Y: torch.Tensor) -> float:
    """Eq. 6–7 literally in float64: tr(KHLH) / sqrt(tr(KHKH)·tr(LHLH))."""
    X, Y = X.double(), Y.double()
    n = X.shape[0]
    H = torch.eye(n, dtype=torch.float64) - 1.0 / n
    K, L = X @ X.T, Y @ Y.T
    kl = torch.trace(K @ H @ L @ H)
    kk = torch.trace(K @ H @ K @ H)
    ll = torch.trace(L @ H @ L @ H)
    return float(kl / torch.sqrt(kk * ll))


# --------------------------------------------------------------------------- linear CKA values


def test_cka_hand_case_one_feature_is_squared_cosine_of_centred_columns():
    # x = (1, 0, −1), y = (0, 1, −1) are centred; x·y = 1, |x|² = |y|² = 2 → CKA = 1²/(2·2) = 1/4
    x = torch.tensor([[1.0], [0.0], [-1.0]])
    y = torch.tensor([[0.0], [1.0], [-1.0]])
    assert _cka_by_definition(x, y) == pytest.approx(0.25, abs=1e-12)
    assert linear_cka(x, y).item() == pytest.approx(0.25, abs=1e-6)  # feature form (9 > 1)
    assert linear_cka(x + 5.0, 3.0 * y - 2.0).item() == pytest.approx(0.25, abs=1e-6)
    # zero columns change nothing; 3 × 3 widths take the Gram form (9 ≤ 9)
    xz = torch.cat([x, torch.zeros(3, 2)], dim=1)
    yz = torch.cat([y, torch.zeros(3, 2)], dim=1)
    assert linear_cka(xz, yz).item() == pytest.approx(0.25, abs=1e-6)
    assert linear_cka(xz.double(), yz.double()).item() == pytest.approx(0.25, abs=1e-12)


def test_cka_identical_is_one_and_centred_orthogonal_is_zero():
    X = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.0, 0.5], [2.0, 2.0]])
    assert linear_cka(X, X).item() == pytest.approx(1.0, abs=1e-6)
    # columns orthogonal after centring (and to the ones vector): CKA = 0
    a = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]])
    b = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]])
    assert _cka_by_definition(a, b) == pytest.approx(0.0, abs=1e-12)
    assert linear_cka(a, b).item() == 0.0


@pytest.mark.parametrize("n,hx,hy", [(3, 4, 5), (9, 2, 3), (4, 2, 8), (6, 6, 6)])
def test_cka_matches_definition_on_random_small_matrices(n, hx, hy):
    g = torch.Generator().manual_seed(100 * n + 10 * hx + hy)
    X = torch.randn(n, hx, generator=g, dtype=torch.float64)
    Y = X[:, :1] @ torch.randn(1, hy, generator=g, dtype=torch.float64)
    Y = Y + torch.randn(n, hy, generator=g, dtype=torch.float64)
    assert linear_cka(X, Y).item() == pytest.approx(_cka_by_definition(X, Y), abs=1e-12)


# --------------------------------------------------------------------------- eps and clamping


@pytest.mark.parametrize(
    "X",
    [
        torch.tensor([[1.0], [-1.0]]),  # feature form: Xᶜᵀ Xᶜ = 2, hsic = 2² = 4
        torch.tensor([[1.0, 0.0], [-1.0, 0.0]]),  # Gram form: K = [[1, −1], [−1, 1]], ‖K‖² = 4
    ],
)
def test_cka_eps_is_added_to_the_denominator(X):
    # X against itself: hsic = ‖K‖² = 4 = norm_x · norm_y, so CKA = 4 / (4 + eps)
    assert linear_cka(X, X, eps=4.0).item() == pytest.approx(0.5, abs=1e-7)
    assert linear_cka(X, X, eps=12.0).item() == pytest.approx(0.25, abs=1e-7)
    assert linear_cka(X, X, eps=0.0).item() == pytest.approx(1.0, abs=1e-7)
    assert linear_cka(X, X).item() == pytest.approx(4.0 / (4.0 + 1e-12), abs=1e-7)


def test_cka_constant_representation_is_zero_with_default_eps():
    X = torch.full((4, 3), 2.5)
    Y = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0]])
    for a, b in ((X, Y), (Y, X), (X, X)):
        v = linear_cka(a, b)
        assert torch.isfinite(v) and v.item() == 0.0


def _centred_orthogonal_pair(seed: int, n: int = 8, h: int = 8):
    """X, Y (float32) whose centred column spaces are orthogonal: CKA = 0 exactly in reals."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, 4, generator=g, dtype=torch.float64)
    A = A - A.mean(dim=0, keepdim=True)
    Q, _ = torch.linalg.qr(A)
    X = Q[:, :2] @ torch.randn(2, h, generator=g, dtype=torch.float64)
    Y = Q[:, 2:4] @ torch.randn(2, h, generator=g, dtype=torch.float64)
    return X.float(), Y.float()


def test_cka_is_clamped_to_the_unit_interval_against_rounding():
    # CKA is in [0, 1] mathematically; float32 rounding of ⟨Kᶜ, Lᶜ⟩ lands on either side of 0
    # (centred-orthogonal pairs) and of 1 (a matrix with itself) -- the result must not.
    for seed in range(40):
        X, Y = _centred_orthogonal_pair(seed)
        v = linear_cka(X, Y).item()
        assert 0.0 <= v < 1e-6
        g = torch.Generator().manual_seed(seed)
        Z = torch.randn(8, 8, generator=g)
        w = linear_cka(Z, Z).item()
        assert 1.0 - 1e-6 < w <= 1.0


# --------------------------------------------------------------------------- which form is used


class _MatmulShapes(TorchFunctionMode):
    """Records the shapes of all matrix products computed inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if "matmul" in getattr(func, "__name__", ""):
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize(
    "n,hx,hy,gram",
    [
        (2, 2, 3, True),  # 4 ≤ 6
        (2, 1, 4, True),  # 4 ≤ 4 (boundary)
        (2, 4, 1, True),  # 4 ≤ 4 (boundary, hx > hy)
        (64, 768, 768, True),  # the paper's batch and width (§V-C)
        (3, 2, 2, False),  # 9 > 4, hx = hy
        (5, 3, 2, False),  # 25 > 6
        (4, 1, 15, False),  # 16 > 15 (boundary)
    ],
)
def test_cka_uses_the_cheaper_form(n, hx, hy, gram):
    """Docstring: the n × n Gram form when n² ≤ h_X·h_Y, the feature form otherwise."""
    g = torch.Generator().manual_seed(n + hx + hy)
    X = torch.randn(n, hx, generator=g)
    Y = torch.randn(n, hy, generator=g)
    with _MatmulShapes() as rec:
        v = linear_cka(X, Y)
    assert rec.shapes, "no matrix product recorded"
    if gram:
        assert set(rec.shapes) == {(n, n)}
    else:
        assert (n, n) not in rec.shapes
        assert set(rec.shapes) <= {(hy, hx), (hx, hx), (hy, hy)}
    assert v.item() == pytest.approx(_cka_by_definition(X, Y), abs=1e-5)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "X,Y",
    [
        (torch.randn(5, 3, 2), torch.randn(5, 3)),  # not 2-D
        (torch.randn(5, 3), torch.randn(5)),  # not 2-D
        (torch.randn(5, 3), torch.randn(6, 3)),  # different n
        (torch.randn(1, 3), torch.randn(1, 3)),  # n < 2
        (torch.randn(0, 3), torch.randn(0, 3)),  # n < 2
    ],
)
def test_validation_errors_name_the_function(X, Y):
    with pytest.raises(ValueError, match=r"^linear_cka\b"):
        linear_cka(X, Y)
    with pytest.raises(ValueError, match=r"^cosine_similarity_rep\b"):
        cosine_similarity_rep(X, Y)


def test_widths_may_differ_for_cka_but_not_for_cosine():
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    Y = torch.tensor([[1.0], [0.0], [2.0]])
    assert 0.0 <= linear_cka(X, Y).item() <= 1.0
    with pytest.raises(ValueError, match=r"^cosine_similarity_rep needs equal widths"):
        cosine_similarity_rep(X, Y)
    # two examples are enough
    assert linear_cka(X[:2], Y[:2]).item() == pytest.approx(_cka_by_definition(X[:2], Y[:2]), abs=1e-6)
    assert cosine_similarity_rep(X[:2], X[:2]).item() == pytest.approx(1.0, abs=1e-6)


# --------------------------------------------------------------------------- dtypes


def test_upcast_is_at_least_float32():
    assert losses._upcast(torch.ones(2, dtype=torch.float16)).dtype == torch.float32
    assert losses._upcast(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert losses._upcast(torch.ones(2, dtype=torch.float32)).dtype == torch.float32
    assert losses._upcast(torch.ones(2, dtype=torch.float64)).dtype == torch.float64


def test_half_inputs_are_computed_in_float32_without_overflow():
    # Values ~300 in float16: Gram entries ~300²·16 ≈ 1.4e6 overflow float16 (max 65504), not float32.
    g = torch.Generator().manual_seed(11)
    X = (300.0 * torch.randn(8, 16, generator=g)).half()
    Y = (X[:, :4].float() @ torch.randn(4, 12, generator=g) + 300.0 * torch.randn(8, 12, generator=g)).half()
    ref = _cka_by_definition(X, Y)
    for a, b, r in ((X, Y, ref), (X, X, 1.0), (Y, Y, 1.0), (X.float(), Y, ref), (X, Y.float(), ref)):
        v = linear_cka(a, b)
        assert v.dtype == torch.float32
        assert v.item() == pytest.approx(r, abs=1e-5)
    assert linear_cka(X.bfloat16(), Y).dtype == torch.float32
    assert linear_cka(X, Y.double()).dtype == torch.float64
    assert linear_cka(X.double(), Y.double()).item() == pytest.approx(ref, abs=1e-12)
    cos = cosine_similarity_rep(X, X)
    assert cos.dtype == torch.float32 and cos.item() == pytest.approx(1.0, abs=1e-6)


def test_single_example_batch_zero_follows_the_cross_entropy_dtype():
    # L_c's placeholder 0 has the dtype of the cross-entropies, not torch's default dtype.
    labels = torch.tensor([1])
    lf = torch.tensor([[0.2, -0.4, 1.0]])
    lg = torch.tensor([[1.0, 0.0, 0.0]])
    x, y, z = (torch.ones(1, 4) for _ in range(3))
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        loss, parts = fedmcp_loss(lf, lg, labels, x, y, z)
    finally:
        torch.set_default_dtype(old)
    assert loss.dtype == torch.float32
    assert parts["L_c"] == 0.0
    loss64, _ = fedmcp_loss(lf.double(), lg.double(), labels, x, y, z)
    assert loss64.dtype == torch.float64


# --------------------------------------------------------------------------- cosine similarity


def test_cosine_hand_readings_and_eps():
    X = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    Y = torch.tensor([[6.0, 8.0], [0.0, 5.0], [0.0, -1.0], [1.0, 0.0]])
    # row cosines 1, 0, −1, 1/√2 → mean (1 + 0 − 1 + 1/√2) / 4
    want = (1.0 / math.sqrt(2.0)) / 4.0
    assert cosine_similarity_rep(X, Y).item() == pytest.approx(want, abs=1e-6)
    # the default eps (1e-8) leaves rows of norm 0.1 alone: cos = 1
    small = torch.tensor([[0.1, 0.0], [0.0, 0.1]])
    assert cosine_similarity_rep(small, small).item() == pytest.approx(1.0, abs=1e-6)
    assert cosine_similarity_rep(small, -small).item() == pytest.approx(-1.0, abs=1e-6)
    # eps is the norm floor: with eps = 1 both norms 0.1 are floored, cos = 0.01 / (1·1)
    assert cosine_similarity_rep(small, small, eps=1.0).item() == pytest.approx(0.01, abs=1e-7)
    assert cosine_similarity_rep(small, 30 * small, eps=1.0).item() == pytest.approx(0.1, abs=1e-6)
    assert inspect.signature(cosine_similarity_rep).parameters["eps"].default == 1e-8
    assert inspect.signature(linear_cka).parameters["eps"].default == 1e-12


# --------------------------------------------------------------------------- eq. 5 and eq. 8


def test_two_example_batch_keeps_the_contrastive_term():
    # with cosine similarity (CKA of two examples is 1 for any pair) L_c is nonzero at n = 2
    labels = torch.tensor([0, 1])
    lf = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    lg = torch.tensor([[0.5, 0.5], [1.0, -1.0]])
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # cos 1, 1  → Sim(X, Y) = 1
    z = torch.tensor([[0.0, 1.0], [0.0, 1.0]])  # cos 0, 1  → Sim(X, Z) = 1/2
    loss, parts = fedmcp_loss(lf, lg, labels, x, y, z, gamma=0.25, mu=2.0, similarity="cosine")
    assert parts["L_c"] == pytest.approx(0.5, abs=1e-6)
    la = -torch.log_softmax(lf.double(), -1)[[0, 1], labels].mean().item()
    lb = -torch.log_softmax(lg.double(), -1)[[0, 1], labels].mean().item()
    assert parts["L_a"] == pytest.approx(la, abs=1e-6)
    assert parts["L_b"] == pytest.approx(lb, abs=1e-6)
    assert loss.item() == pytest.approx(0.75 * la + 0.25 * lb + 2.0 * 0.5, abs=1e-5)
    assert mcp_contrastive_loss(x, y, z, similarity="cosine").item() == pytest.approx(0.5, abs=1e-6)
    # with CKA at n = 2 a constant private representation gives Sim(X, Y) = 0, Sim(X, Z) = 1
    yc = torch.ones(2, 2)
    _, pc = fedmcp_loss(lf, lg, labels, x, yc, z + x)
    assert pc["L_c"] == pytest.approx(-1.0, abs=1e-6)


def test_default_hyperparameters_are_the_papers():
    # §V-C: "decided γ = 0.5 and μ = 0.05"; MOON's τ = 0.5 (Li et al. 2021)
    p = inspect.signature(fedmcp_loss).parameters
    assert p["gamma"].default == 0.5 and p["mu"].default == 0.05
    assert p["similarity"].default == "cka"
    assert inspect.signature(mcp_contrastive_loss).parameters["similarity"].default == "cka"
    assert inspect.signature(moon_contrastive_loss).parameters["temperature"].default == 0.5


# --------------------------------------------------------------------------- MOON


def _moon_term(pos: float, neg: float, tau: float) -> float:
    return -math.log(math.exp(pos / tau) / (math.exp(pos / tau) + math.exp(neg / tau)))


def test_moon_two_example_hand_case_with_temperature():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[2.0, 0.0], [1.0, 1.0]])  # cos 1, 1/√2
    z_prev = torch.tensor([[0.0, 3.0], [0.0, -1.0]])  # cos 0, −1
    c = 1.0 / math.sqrt(2.0)
    for tau in (0.5, 0.25, 2.0):
        want = 0.5 * (_moon_term(1.0, 0.0, tau) + _moon_term(c, -1.0, tau))
        got = moon_contrastive_loss(z, z_glob, z_prev, temperature=tau)
        assert got.shape == () and got.item() == pytest.approx(want, abs=1e-6)
    # default τ = 0.5: log(1 + e^{−2}) and log(1 + e^{−2(c + 1)})
    want = 0.5 * (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-2.0 * (c + 1.0))))
    assert moon_contrastive_loss(z, z_glob, z_prev).item() == pytest.approx(want, abs=1e-6)
    # half inputs are computed (and returned) in float32
    h = moon_contrastive_loss(z.half(), z_glob.half(), z_prev.half())
    assert h.dtype == torch.float32 and h.item() == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError):
        moon_contrastive_loss(z, z_glob, z_prev[:1])


def test_moon_pairs_are_rows_over_any_leading_dims():
    """The last dimension is the representation; every leading index is one (z, z_glob, z_prev)
    triple, and the loss is the mean over the triples (a single (h,) triple included)."""
    g = torch.Generator().manual_seed(21)
    z, zg, zp = (torch.randn(3, 4, 5, generator=g) for _ in range(3))
    tau = 0.7
    terms = []
    for i in range(3):
        for j in range(4):
            a, b, c = z[i, j].double(), zg[i, j].double(), zp[i, j].double()
            pos = float(a @ b / (a.norm() * b.norm()))
            neg = float(a @ c / (a.norm() * c.norm()))
            terms.append(_moon_term(pos, neg, tau))
    want = sum(terms) / len(terms)
    assert moon_contrastive_loss(z, zg, zp, tau).item() == pytest.approx(want, abs=1e-5)
    flat = moon_contrastive_loss(z.reshape(12, 5), zg.reshape(12, 5), zp.reshape(12, 5), tau)
    assert flat.item() == pytest.approx(want, abs=1e-5)
    single = moon_contrastive_loss(z[0, 0], zg[0, 0], zp[0, 0], tau)
    assert single.item() == pytest.approx(terms[0], abs=1e-5)


# --------------------------------------------------------------------------- pooling


def test_mean_pool_one_token_rows_and_dtype():
    hidden = torch.tensor(
        [
            [[2.0, -4.0], [9.0, 9.0], [7.0, 7.0]],  # one real token
            [[1.0, 1.0], [3.0, 5.0], [5.0, 0.0]],  # three
            [[8.0, 8.0], [8.0, 8.0], [8.0, 8.0]],  # none → zeros
        ]
    )
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [0, 0, 0]])
    want = torch.tensor([[2.0, -4.0], [3.0, 2.0], [0.0, 0.0]])
    assert torch.allclose(mean_pool(hidden, mask), want)
    assert torch.allclose(mean_pool(hidden, mask.bool()), want)
    # the pooled states keep the hidden states' dtype whatever the mask's
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        for m in (mask, mask.bool(), mask.float()):
            out = mean_pool(hidden.to(dt), m)
            assert out.dtype == dt
            assert torch.allclose(out.double(), want.double())
