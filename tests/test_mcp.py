"""FedMCP linear CKA (eq. 6–7), contrastive loss (eq. 5), objective (eq. 8), MOON term, pooling."""

import math

import pytest
import torch
import torch.nn.functional as F

from fedrepro.papers.fedmcp.losses import (
    cls_pool,
    cosine_similarity_rep,
    fedmcp_loss,
    linear_cka,
    mcp_contrastive_loss,
    mean_pool,
    moon_contrastive_loss,
)


def _cka_hsic_reference(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """FedMCP eq. 6–7 literally: K = XXᵀ, L = YYᵀ, HSIC = tr(KHLH)/(n−1)² (float64)."""
    X, Y = X.double(), Y.double()
    n = X.shape[0]
    H = torch.eye(n, dtype=torch.float64) - torch.ones(n, n, dtype=torch.float64) / n
    K, L = X @ X.T, Y @ Y.T

    def hsic(A, B):
        return torch.trace(A @ H @ B @ H) / (n - 1) ** 2

    return hsic(K, L) / torch.sqrt(hsic(K, K) * hsic(L, L))


@pytest.mark.parametrize("n,hx,hy", [(16, 32, 24), (50, 5, 7), (8, 8, 8)])
def test_linear_cka_equals_hsic_definition(n, hx, hy):
    # (16, 32, 24) takes the Gram path, (50, 5, 7) the feature path.
    g = torch.Generator().manual_seed(n + hx)
    X = torch.randn(n, hx, generator=g)
    Y = X[:, :1].repeat(1, hy) * 0.5 + torch.randn(n, hy, generator=g)
    ref = _cka_hsic_reference(X, Y)
    got = linear_cka(X, Y)
    assert got.shape == ()
    assert got.item() == pytest.approx(ref.item(), abs=1e-5)
    assert 0.0 < ref.item() < 1.0


def test_linear_cka_float64_matches_reference_tightly():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(12, 20, generator=g, dtype=torch.float64)
    Y = torch.randn(12, 9, generator=g, dtype=torch.float64)
    assert linear_cka(X, Y).item() == pytest.approx(_cka_hsic_reference(X, Y).item(), abs=1e-12)


def test_linear_cka_invariances():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(20, 10, generator=g)
    Y = X @ torch.randn(10, 6, generator=g) + 0.3 * torch.randn(20, 6, generator=g)
    base = linear_cka(X, Y).item()
    Q, _ = torch.linalg.qr(torch.randn(10, 10, generator=g))
    assert linear_cka(X @ Q, Y).item() == pytest.approx(base, abs=1e-5)
    assert linear_cka(X, 7.5 * Y).item() == pytest.approx(base, abs=1e-5)
    assert linear_cka(X, 1e-3 * Y).item() == pytest.approx(base, abs=1e-5)
    # translation is removed by centering
    assert linear_cka(X + 4.0, Y - 2.0).item() == pytest.approx(base, abs=1e-5)


def test_linear_cka_self_is_one_and_range():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(32, 16, generator=g)
    assert linear_cka(X, X).item() == pytest.approx(1.0, abs=1e-6)
    for _ in range(5):
        A = torch.randn(10, 4, generator=g)
        B = torch.randn(10, 30, generator=g)
        v = linear_cka(A, B).item()
        assert 0.0 <= v <= 1.0


def test_linear_cka_independent_small_vs_noisy_copy():
    g = torch.Generator().manual_seed(4)
    n, h = 256, 16
    X = torch.randn(n, h, generator=g)
    indep = linear_cka(X, torch.randn(n, h, generator=g)).item()
    noisy = linear_cka(X, X + 0.3 * torch.randn(n, h, generator=g)).item()
    # E[CKA] of independent data ≈ h/n-ish; a noisy copy stays near 1.
    assert indep < 0.15
    assert noisy > 0.85
    assert noisy > indep + 0.5


def test_linear_cka_gradient_flows_and_constant_is_safe():
    g = torch.Generator().manual_seed(5)
    X = torch.randn(8, 6, generator=g, requires_grad=True)
    Y = torch.randn(8, 5, generator=g, requires_grad=True)
    linear_cka(X, Y).backward()
    assert X.grad is not None and Y.grad is not None
    assert torch.isfinite(X.grad).all() and X.grad.abs().sum() > 0
    assert torch.isfinite(Y.grad).all() and Y.grad.abs().sum() > 0
    # a constant representation: no NaN, value 0, finite gradient
    C = torch.full((8, 6), 3.0, requires_grad=True)
    Y2 = torch.randn(8, 5, generator=g, requires_grad=True)
    v = linear_cka(C, Y2)
    v.backward()
    assert v.item() == 0.0
    assert torch.isfinite(C.grad).all() and torch.isfinite(Y2.grad).all()


def test_linear_cka_errors():
    with pytest.raises(ValueError):
        linear_cka(torch.randn(5, 3), torch.randn(6, 3))
    with pytest.raises(ValueError):
        linear_cka(torch.randn(1, 3), torch.randn(1, 3))
    with pytest.raises(ValueError):
        linear_cka(torch.randn(5, 3, 2), torch.randn(5, 3))
    with pytest.raises(ValueError):
        cosine_similarity_rep(torch.randn(5, 3), torch.randn(5, 4))


def test_cosine_similarity_rep_is_mean_of_row_cosines():
    X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    Y = torch.tensor([[2.0, 0.0], [-1.0, -1.0], [1.0, 0.0]])
    # row cosines: 1, -1, 0
    assert cosine_similarity_rep(X, Y).item() == pytest.approx(0.0, abs=1e-7)
    assert cosine_similarity_rep(X, 3 * X).item() == pytest.approx(1.0, abs=1e-6)


def test_mcp_contrastive_loss_sign_hand_case():
    g = torch.Generator().manual_seed(6)
    X = torch.randn(16, 8, generator=g)
    Z = 2.0 * X  # server average represents like the local global adapter: CKA 1
    Y = torch.randn(16, 8, generator=g)  # private adapter unrelated
    # eq. 5: Sim(X, Y) − Sim(X, Z) — desired configuration → strongly negative
    good = mcp_contrastive_loss(X, Y, Z)
    expected = linear_cka(X, Y) - 1.0
    assert good.item() == pytest.approx(expected.item(), abs=1e-6)
    assert good.item() < -0.5
    # swapped roles (private ≈ global, server unrelated) → strongly positive
    bad = mcp_contrastive_loss(X, Z, Y)
    assert bad.item() == pytest.approx(-good.item(), abs=1e-6)
    # cosine variant on the same case: cos(X, 2X) = 1
    cos = mcp_contrastive_loss(X, Y, Z, similarity="cosine")
    assert cos.item() == pytest.approx(cosine_similarity_rep(X, Y).item() - 1.0, abs=1e-6)
    with pytest.raises(ValueError):
        mcp_contrastive_loss(X, Y, Z, similarity="l2")


def test_mcp_contrastive_loss_gradients_and_detached_server():
    g = torch.Generator().manual_seed(7)
    X = torch.randn(10, 6, generator=g, requires_grad=True)
    Y = torch.randn(10, 6, generator=g, requires_grad=True)
    Z = torch.randn(10, 6, generator=g, requires_grad=True)
    mcp_contrastive_loss(X, Y, Z).backward()
    assert X.grad is not None and X.grad.abs().sum() > 0
    assert Y.grad is not None and Y.grad.abs().sum() > 0
    assert Z.grad is None


def test_fedmcp_loss_equals_hand_combination():
    g = torch.Generator().manual_seed(8)
    n, C, h = 6, 3, 5
    lf = torch.randn(n, C, generator=g, requires_grad=True)
    lg = torch.randn(n, C, generator=g, requires_grad=True)
    y = torch.tensor([0, 1, 2, 1, 0, 2])
    X, Y, Z = (torch.randn(n, h, generator=g) for _ in range(3))
    gamma, mu = 0.3, 0.1
    loss, parts = fedmcp_loss(lf, lg, y, X, Y, Z, gamma=gamma, mu=mu)

    def ce(logits):
        lp = logits.detach().double().log_softmax(-1)
        return -lp[torch.arange(n), y].mean().item()

    la, lb = ce(lf), ce(lg)
    lc = (_cka_hsic_reference(X, Y) - _cka_hsic_reference(X, Z)).item()
    assert parts["L_a"] == pytest.approx(la, abs=1e-5)
    assert parts["L_b"] == pytest.approx(lb, abs=1e-5)
    assert parts["L_c"] == pytest.approx(lc, abs=1e-5)
    assert loss.item() == pytest.approx((1 - gamma) * la + gamma * lb + mu * lc, abs=1e-5)
    assert set(parts) == {"L_a", "L_b", "L_c"} and all(isinstance(v, float) for v in parts.values())
    loss.backward()
    assert lf.grad is not None and lg.grad is not None
    # defaults are the paper's γ = 0.5, μ = 0.05
    d, p = fedmcp_loss(lf, lg, y, X, Y, Z)
    assert d.item() == pytest.approx(0.5 * la + 0.5 * lb + 0.05 * lc, abs=1e-5)


def test_moon_loss_hand_case_and_direction():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z_glob = torch.tensor([[1.0, 1.0], [0.0, 3.0]])  # cos: 1/√2, 1
    z_prev = torch.tensor([[0.0, -1.0], [-1.0, 0.0]])  # cos: 0, 0
    tau = 0.5

    def term(pos, neg):
        return -math.log(math.exp(pos / tau) / (math.exp(pos / tau) + math.exp(neg / tau)))

    expected = 0.5 * (term(1 / math.sqrt(2), 0.0) + term(1.0, 0.0))
    got = moon_contrastive_loss(z, z_glob, z_prev, temperature=tau)
    assert got.item() == pytest.approx(expected, abs=1e-6)

    # moving z toward z_global lowers the loss
    closer = z + 0.5 * (F.normalize(z_glob, dim=-1) - z)
    assert moon_contrastive_loss(closer, z_glob, z_prev, tau).item() < got.item()
    # and a gradient step on z lowers it too
    zz = z.clone().requires_grad_(True)
    moon_contrastive_loss(zz, z_glob, z_prev, tau).backward()
    stepped = (zz - 0.1 * zz.grad).detach()
    assert moon_contrastive_loss(stepped, z_glob, z_prev, tau).item() < got.item()


def test_mean_pool_ignores_padding_and_cls_pool():
    hidden = torch.tensor(
        [
            [[1.0, 2.0], [3.0, 4.0], [100.0, -100.0]],
            [[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]],
        ]
    )
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    pooled = mean_pool(hidden, mask)
    assert torch.allclose(pooled, torch.tensor([[2.0, 3.0], [7.0, 8.0]]))
    # changing the padded position does not change the result
    hidden2 = hidden.clone()
    hidden2[0, 2] = torch.tensor([-5e3, 5e3])
    assert torch.allclose(mean_pool(hidden2, mask), pooled)
    assert torch.equal(cls_pool(hidden), torch.tensor([[1.0, 2.0], [5.0, 6.0]]))


def test_a_one_example_batch_trains_eq8_without_the_cka_term():
    """Linear CKA is 0/0 for one example: eq. 8 then is (1 − γ)L_a + γL_b (docs/decisions.md);
    with two examples L_c is there."""
    import torch.nn.functional as F

    from fedrepro.papers.fedmcp.losses import fedmcp_loss

    g = torch.Generator().manual_seed(3)
    la, lb = torch.randn(1, 3, generator=g), torch.randn(1, 3, generator=g)
    x, y, z = (torch.randn(1, 5, generator=g, requires_grad=True) for _ in range(3))
    labels = torch.tensor([2])
    loss, parts = fedmcp_loss(la, lb, labels, x, y, z, gamma=0.3, mu=1.7)
    want = 0.7 * F.cross_entropy(la, labels) + 0.3 * F.cross_entropy(lb, labels)
    assert torch.allclose(loss, want) and parts["L_c"] == 0.0
    cos, _ = fedmcp_loss(la, lb, labels, x, y, z, gamma=0.3, mu=1.7, similarity="cosine")
    assert torch.allclose(cos, want)
    # three examples (with two, centred CKA is 1 for any pair: both Grams are rank one)
    more = [torch.cat([t, torch.randn(2, t.shape[1], generator=g)]) for t in (la, lb, x, y, z)]
    _, parts3 = fedmcp_loss(*more[:2], torch.tensor([2, 0, 1]), *more[2:], gamma=0.3, mu=1.7)
    assert parts3["L_c"] != 0.0
