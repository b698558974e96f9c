"""Entropy-selective knowledge distillation (AdaFedSelecKD §III-C, eq. 6–8, Algorithm 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy H(q) in nats of softmax(logits) over the last axis (AdaFedSelecKD eq. 7)."""
    log_q = F.log_softmax(logits.float(), dim=-1)
    return -(log_q.exp() * log_q).sum(-1)


def selective_kd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    lam: float = 0.2,
    tau: float = 5.0,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Selective KD loss of AdaFedSelecKD eq. 8 (eq. 6 when ``tau = inf``).

    For every target token t with teacher distribution ``q_g`` (global adapter) and student
    distribution ``q_l`` (local adapter)::

        L_t = (1 − λ)·CE(q_l, y_t) + λ·KL(q_g ‖ q_l)   if H(q_g) < τ
        L_t = CE(q_l, y_t)                              otherwise

    Choices the paper leaves open (docs/decisions.md):

    * KL direction: ``KL(q_g ‖ q_l) = Σ q_g (log q_g − log q_l)``, the teacher distribution is the
      target (standard distillation; the paper writes ``L_KL(q_l, q_g)`` without defining the order).
    * No temperature (T = 1): the paper mentions none and τ is defined on the plain softmax.
    * The teacher is detached: the global adapter is never optimised (§III-B3).
    * Reduction: mean over the non-ignored target tokens of the batch (token-level loss as in
      Algorithm 1, lines 14–22).

    Parameters
    ----------
    student_logits, teacher_logits : Tensor (..., V)
        Unnormalised scores of the local (student) and global (teacher) paths.
    labels : LongTensor (...)
        Target token ids; ``ignore_index`` marks padding.
    lam : float
        λ, weight of the KD term (paper: 0.2).
    tau : float
        τ, entropy threshold in nats (paper: 5). ``float('inf')`` distils every token (AdaFedKD).

    Returns
    -------
    loss : Tensor ()
        Mean token loss.
    kd_mask : BoolTensor (...)
        True where the token used the KD term.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student/teacher logits shapes differ: {tuple(student_logits.shape)} vs "
            f"{tuple(teacher_logits.shape)}"
        )
    valid = labels != ignore_index
    vocab = student_logits.shape[-1]
    safe_labels = labels.masked_fill(~valid, 0)
    with torch.no_grad():
        log_q_g = F.log_softmax(teacher_logits.detach().float(), dim=-1)
        q_g = log_q_g.exp()
        entropy = -(q_g * log_q_g).sum(-1)
        kd_mask = valid & (entropy < tau)
        # One soft-target cross-entropy computes both terms at once (fused, one backward):
        #   −Σ_v [(1−w)·1{v=y} + w·q_g(v)] log q_l(v) = (1−w)·CE + w·(KL(q_g‖q_l) + H(q_g)),
        # with w = λ on KD tokens and 0 elsewhere; subtracting w·H(q_g) leaves eq. 8 exactly.
        w = lam * kd_mask.to(q_g.dtype)
        target = q_g.mul_(w.unsqueeze(-1))
        target.scatter_add_(-1, safe_labels.unsqueeze(-1), (1.0 - w).unsqueeze(-1))
    soft_ce = F.cross_entropy(
        student_logits.float().reshape(-1, vocab), target.reshape(-1, vocab), reduction="none"
    ).reshape(labels.shape)
    per_token = soft_ce - w * entropy
    n_valid = valid.sum()
    if n_valid == 0:
        return per_token.sum() * 0.0, kd_mask
    loss = (per_token * valid).sum() / n_valid
    return loss, kd_mask


def cross_entropy_loss(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100
) -> torch.Tensor:
    """Token-mean cross-entropy (the MLE objective of AdaSingle / AdaCentralized / AdaFedAvg)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=ignore_index
    )
