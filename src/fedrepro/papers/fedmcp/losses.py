"""Model-contrastive personalization of FedMCP (§IV-B–IV-E, eq. 3–8) and the MOON baseline term.

FedMCP (Zhao et al.) puts a *global* adapter (federated) and a *private* adapter (kept local) into
a frozen PLM and trains, per client, eq. 8::

    L = (1 − γ)·L_a + γ·L_b + μ·L_c,      L_c = Sim(X, Y) − Sim(X, Z)          (eq. 5)

with ``Sim`` the linear CKA of eq. 6–7 (Kornblith et al., ICML 2019).  MOON (Li et al., CVPR 2021,
the paper's [17] and a §V-B baseline) is in :func:`moon_contrastive_loss`.  All functions are pure
torch and differentiable; model plumbing (two forward passes, heads g1/g2) lives elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_SIMILARITIES = ("cka", "cosine")


def _upcast(t: torch.Tensor) -> torch.Tensor:
    """At least float32 (half/bfloat16 upcast; float64 kept)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _check_pair(X: torch.Tensor, Y: torch.Tensor, name: str, same_width: bool) -> None:
    if X.ndim != 2 or Y.ndim != 2:
        raise ValueError(
            f"{name} expects (n × h) matrices, got shapes {tuple(X.shape)} and {tuple(Y.shape)}"
        )
    if X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"{name}: X and Y must have the same number of examples, "
            f"got {X.shape[0]} and {Y.shape[0]}"
        )
    if X.shape[0] < 2:
        raise ValueError(f"{name} needs at least 2 examples, got n = {X.shape[0]}")
    if same_width and X.shape[1] != Y.shape[1]:
        raise ValueError(
            f"{name} needs equal widths to pair rows, got h = {X.shape[1]} and {Y.shape[1]}"
        )


def linear_cka(X: torch.Tensor, Y: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Linear centered kernel alignment CKA(X, Y) of FedMCP eq. 6–7 (Kornblith et al. 2019).

    The paper's definition, with linear kernels ``K = XXᵀ``, ``L = YYᵀ`` and the centering matrix
    ``H = I − 11ᵀ/n``::

        HSIC(K, L) = tr(K H L H) / (n − 1)²                                        (eq. 7)
        CKA(X, Y)  = HSIC(K, L) / sqrt(HSIC(K, K) · HSIC(L, L))                    (eq. 6)

    The ``(n − 1)²`` factors cancel, and with column-centred ``Xᶜ = HX``, ``Yᶜ = HY``
    ``tr(KHLH) = ‖Yᶜᵀ Xᶜ‖_F²`` (Kornblith et al. 2019, eq. 3), so the value computed is::

        CKA = ‖Yᶜᵀ Xᶜ‖_F² / (‖Xᶜᵀ Xᶜ‖_F · ‖Yᶜᵀ Yᶜ‖_F)
            = ⟨Kᶜ, Lᶜ⟩_F  / (‖Kᶜ‖_F · ‖Lᶜ‖_F)           (Kᶜ = XᶜXᶜᵀ, Lᶜ = YᶜYᶜᵀ)

    Implementation choices (the paper gives only the formula):

    * The cheaper of the two equal forms is used: the n × n Gram form when ``n² ≤ h_X·h_Y``
      (the usual case: batch 64, h = 768 in §V-C), the feature form otherwise.
    * Computed in float32 at least (half-precision inputs are upcast; float64 is kept).
    * ``eps`` is added to the denominator; a constant representation (``Xᶜ = 0``) gives CKA = 0
      with a zero (finite) gradient instead of 0/0.  The result is clamped to [0, 1] against
      rounding (mathematically it already lies there: ⟨Kᶜ, Lᶜ⟩ ≥ 0 for PSD matrices, and
      Cauchy–Schwarz bounds it by 1).
    * Rows are examples (the paper's ``X ∈ R^{n×h}``, n the batch size); ``h`` may differ
      between X and Y.

    Parameters
    ----------
    X : Tensor (n, h_x)
    Y : Tensor (n, h_y)
        Representations of the same n examples.
    eps : float
        Added to the denominator.

    Returns
    -------
    Tensor ()
        CKA in [0, 1]; 1 means identical up to an orthogonal transform and isotropic scaling.

    Raises
    ------
    ValueError
        If X or Y is not 2-D, their numbers of rows differ, or n < 2.
    """
    _check_pair(X, Y, "linear_cka", same_width=False)
    dtype = torch.promote_types(_upcast(X).dtype, _upcast(Y).dtype)
    X, Y = X.to(dtype), Y.to(dtype)
    Xc = X - X.mean(dim=0, keepdim=True)
    Yc = Y - Y.mean(dim=0, keepdim=True)
    n, hx, hy = X.shape[0], X.shape[1], Y.shape[1]
    if n * n <= hx * hy:
        K = Xc @ Xc.T
        L = Yc @ Yc.T
        hsic_xy = (K * L).sum()
        norm_x = torch.linalg.norm(K)
        norm_y = torch.linalg.norm(L)
    else:
        hsic_xy = (Yc.T @ Xc).pow(2).sum()
        norm_x = torch.linalg.norm(Xc.T @ Xc)
        norm_y = torch.linalg.norm(Yc.T @ Yc)
    return (hsic_xy / (norm_x * norm_y + eps)).clamp(0.0, 1.0)


def cosine_similarity_rep(X: torch.Tensor, Y: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Cosine-similarity alternative to CKA in eq. 5 (the FedMCP ablation of §V-E, Fig. 4).

    The paper does not say how two (n × h) representations are reduced to one cosine; chosen
    here: the mean over the n examples of the cosine similarity of paired rows::

        Sim(X, Y) = (1/n) Σ_i cos(X_i, Y_i)

    i.e. the per-example comparison MOON uses, averaged over the batch.  Unlike CKA it lies in
    [−1, 1], is not invariant to orthogonal transforms, and needs ``h_X = h_Y``.  ``eps`` is the
    norm floor of :func:`torch.nn.functional.cosine_similarity`.

    Raises
    ------
    ValueError
        If X or Y is not 2-D, their shapes differ, or n < 2.
    """
    _check_pair(X, Y, "cosine_similarity_rep", same_width=True)
    return F.cosine_similarity(_upcast(X), _upcast(Y), dim=-1, eps=eps).mean()


def _similarity(name: str):
    if name == "cka":
        return linear_cka
    if name == "cosine":
        return cosine_similarity_rep
    raise ValueError(f"unknown similarity {name!r}; expected one of {_SIMILARITIES}")


def mcp_contrastive_loss(
    x_global: torch.Tensor,
    y_private: torch.Tensor,
    z_server: torch.Tensor,
    similarity: str = "cka",
) -> torch.Tensor:
    """Model-contrastive personalization loss L_c of FedMCP eq. 5, ``Sim(X, Y) − Sim(X, Z)``.

    Roles (§IV-D, first paragraph, which we follow): X comes from the backbone with the client's
    (local) global adapter, Y from the backbone with the private adapter, Z from the backbone with
    the averaged global adapter received from the server at the start of the round; each is the
    mean pooling of the last encoder layer's token states (:func:`mean_pool`), n = batch size.

    Minimising L_c *decreases* the similarity between the local global adapter and the private
    adapter (they learn different knowledge) and *increases* the similarity between the local
    global adapter and the server average (less drift).  The loss lies in [−1, 1] for CKA and in
    [−2, 2] for cosine.

    Choices the paper leaves open:

    * The paper's second paragraph of §IV-D names the private adapter X and the global adapter Y,
      which contradicts both its first paragraph and the stated goals (with X private, the term
      −Sim(X, Z) would pull the *private* adapter to the server average).  We use X = local global,
      Y = private, Z = server average, consistent with eq. 5 and the goals.
    * ``z_server`` is detached: the averaged global adapter is a fixed snapshot for the round
      (Algorithm 1 trains only θ_g, θ_p and the heads), as MOON does with its global model.
      Gradients flow into both X and Y.

    Parameters
    ----------
    x_global, y_private, z_server : Tensor (n, h)
        Pooled representations of the same batch.
    similarity : {"cka", "cosine"}
        ``"cka"`` (the paper's choice, eq. 6–7) or ``"cosine"`` (Fig. 4 ablation).

    Returns
    -------
    Tensor ()
    """
    sim = _similarity(similarity)
    return sim(x_global, y_private) - sim(x_global, z_server.detach())


def fedmcp_loss(
    logits_full: torch.Tensor,
    logits_global: torch.Tensor,
    labels: torch.Tensor,
    x_global: torch.Tensor,
    y_private: torch.Tensor,
    z_server: torch.Tensor,
    gamma: float = 0.5,
    mu: float = 0.05,
    similarity: str = "cka",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Client objective of FedMCP eq. 8: ``(1 − γ)·L_a + γ·L_b + μ·L_c``.

    * ``L_a`` (eq. 3): cross-entropy of head g1 on the full model (backbone + both adapters,
      outputs averaged as in §IV-B).
    * ``L_b`` (eq. 4): cross-entropy of head g2 on the backbone with only the global adapter.
    * ``L_c`` (eq. 5): :func:`mcp_contrastive_loss`.

    Defaults γ = 0.5, μ = 0.05 are the paper's (§V-C).  Cross-entropies are means over the batch
    (the paper does not state the reduction; sequence classification, one label per example).

    Parameters
    ----------
    logits_full, logits_global : Tensor (n, C)
        Outputs of g1 and g2.
    labels : LongTensor (n,)
    x_global, y_private, z_server : Tensor (n, h)
        See :func:`mcp_contrastive_loss`.
    gamma, mu : float
        γ and μ of eq. 8.
    similarity : {"cka", "cosine"}

    Returns
    -------
    loss : Tensor ()
        Eq. 8, differentiable.
    parts : dict
        ``{"L_a", "L_b", "L_c"}`` as Python floats (unweighted).
    """
    loss_a = F.cross_entropy(_upcast(logits_full), labels)
    loss_b = F.cross_entropy(_upcast(logits_global), labels)
    if x_global.shape[0] < 2:
        # Linear CKA (eq. 6) centres over the batch: one example has no variance (0/0); the
        # similarities are batch statistics, so both readings need two examples.  A client
        # whose last batch holds a single example (|D_i| = 1 mod the batch size) trains that batch
        # on eq. 8 without L_c (docs/decisions.md, FedMCP); the paper's batches of 64 never do.
        loss_c = torch.zeros((), dtype=loss_a.dtype, device=loss_a.device)
    else:
        loss_c = mcp_contrastive_loss(x_global, y_private, z_server, similarity=similarity)
    loss = (1.0 - gamma) * loss_a + gamma * loss_b + mu * loss_c
    parts = {
        "L_a": float(loss_a.detach()),
        "L_b": float(loss_b.detach()),
        "L_c": float(loss_c.detach()),
    }
    return loss, parts


def moon_contrastive_loss(
    z: torch.Tensor,
    z_global: torch.Tensor,
    z_prev: torch.Tensor,
    temperature: float = 0.5,
) -> torch.Tensor:
    """Model-contrastive loss of MOON (Li et al., CVPR 2021, §3.3), FedMCP's [17] baseline::

        ℓ_con = −log( exp(cos(z, z_glob)/τ) / (exp(cos(z, z_glob)/τ) + exp(cos(z, z_prev)/τ)) )

    averaged over the batch.  z is the current local model's representation, z_glob the
    representation of the received global model (positive), z_prev that of the client's model
    from the previous round (negative).  ``z_global`` and ``z_prev`` are detached (those models are
    frozen in MOON).  τ = 0.5 is MOON's default; MOON weights this term by its own μ, which the
    caller applies.

    Parameters
    ----------
    z, z_global, z_prev : Tensor (n, h)
    temperature : float
        τ > 0.

    Returns
    -------
    Tensor ()
    """
    if not (z.shape == z_global.shape == z_prev.shape):
        raise ValueError(
            f"shapes differ: z {tuple(z.shape)}, z_global {tuple(z_global.shape)}, "
            f"z_prev {tuple(z_prev.shape)}"
        )
    pos = F.cosine_similarity(_upcast(z), _upcast(z_global.detach()), dim=-1)
    neg = F.cosine_similarity(_upcast(z), _upcast(z_prev.detach()), dim=-1)
    logits = torch.stack([pos, neg], dim=-1) / temperature
    return -F.log_softmax(logits, dim=-1)[..., 0].mean()


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the non-pad token states (FedMCP §IV-D: "average pooling to the token
    representations from the encoder's last layer").

    Padding is excluded (mask 0); special tokens such as ``<s>``/``</s>`` are kept, as the paper
    says "all tokens" (§V-E).  A row with no valid token yields zeros.

    Parameters
    ----------
    hidden : Tensor (n, T, h)
    attention_mask : Tensor (n, T)
        1 for real tokens, 0 for padding.

    Returns
    -------
    Tensor (n, h)
    """
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


def cls_pool(hidden: torch.Tensor) -> torch.Tensor:
    """State of the first token ([CLS] / RoBERTa ``<s>``), the FedMCP §V-E Fig. 5 ablation.

    Parameters
    ----------
    hidden : Tensor (n, T, h)

    Returns
    -------
    Tensor (n, h)
    """
    return hidden[:, 0]
