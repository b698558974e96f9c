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
    allowed: torch.Tensor | None = None,
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
    allowed : BoolTensor (...), optional
        Tokens on which KD may be used at all (ANDed with the entropy gate).  Fig. 12's noun–verb
        hard KD passes the noun/verb mask with ``tau = inf``.

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
    if allowed is not None and allowed.shape != labels.shape:
        raise ValueError(f"allowed mask shape {tuple(allowed.shape)} != labels {tuple(labels.shape)}")
    loss, kd_mask = _SelectiveKD.apply(
        student_logits, teacher_logits.detach(), labels, float(lam), float(tau), int(ignore_index),
        allowed,
    )
    return loss, kd_mask


# Rows of logits processed together: keeps the vocabulary-sized temporaries of one chunk in cache.
# Rows per chunk = these many elements // vocabulary.  On CPU a chunk's temporaries stay in cache
# (1 MB fp32).  On an accelerator the loop's cost is kernel launches, not memory: with BART's 50k
# vocabulary the CPU size gives 5 rows per chunk, ~800 chunks and ~10k launches for a 16 × 256
# batch, which made an AdaFedSelectKD step 2.8× an AdaFedAvg step on an H100 (bench/kd_step.py);
# 2^26 elements (256 MB per fp32 temporary) gives a handful of chunks.  Rows are independent, so
# the chunk size does not change any bit of the result.
_CHUNK_ELEMENTS = 1 << 18
_CHUNK_ELEMENTS_ACCELERATOR = 1 << 26


class _SelectiveKD(torch.autograd.Function):
    """Eq. 8 with its gradient computed in the forward pass, chunk by chunk.

    Hand-written because no library fuses entropy gating, distillation and cross-entropy: done
    naively it makes ~10 passes over (tokens × vocabulary) tensors, which made an AdaFedSelectKD
    step cost ~1.5× an AdaFedAvg step on the demo backbone (bench/kd_step.py).  Per token, with
    ``w = λ·1[H(q_g) < τ]`` and the soft target ``p = (1 − w)·onehot(y) + w·q_g``::

        L_t = −Σ_v p(v) log q_l(v) − w·H(q_g) = (1 − w)·CE + w·KL(q_g ‖ q_l)
        ∂L_t/∂s = q_l − p                               (s: the student's logits)

    The loss is the mean of ``L_t`` over non-ignored tokens; the teacher gets no gradient.
    """

    @staticmethod
    def forward(ctx, student, teacher, labels, lam, tau, ignore_index, allowed=None):
        vocab = student.shape[-1]
        s2 = student.detach().reshape(-1, vocab)
        t2 = teacher.reshape(-1, vocab)
        y = labels.reshape(-1)
        gate = None if allowed is None else allowed.reshape(-1).to(s2.device)
        valid = y != ignore_index
        n_valid = int(valid.sum())
        grad = torch.empty_like(s2, dtype=torch.float32)
        per_token = torch.zeros(y.shape[0], dtype=torch.float32, device=s2.device)
        kd_mask = torch.zeros(y.shape[0], dtype=torch.bool, device=s2.device)
        on_cpu = s2.device.type == "cpu"
        rows = max(1, (_CHUNK_ELEMENTS if on_cpu else _CHUNK_ELEMENTS_ACCELERATOR) // vocab)
        for a in range(0, y.shape[0], rows):
            b = min(a + rows, y.shape[0])
            v = valid[a:b]
            log_q_g = torch.log_softmax(t2[a:b].float(), dim=-1)
            q_g = log_q_g.exp()
            entropy = -(q_g * log_q_g).sum(-1)
            mask = v & (entropy < tau)
            if gate is not None:
                mask &= gate[a:b]
            w = lam * mask.float()
            target = q_g.mul_(w.unsqueeze(-1))
            target.scatter_add_(
                -1, y[a:b].masked_fill(~v, 0).unsqueeze(-1), ((1.0 - w) * v.float()).unsqueeze(-1)
            )
            log_q_l = torch.log_softmax(s2[a:b].float(), dim=-1)
            per_token[a:b] = (-torch.linalg.vecdot(target, log_q_l) - w * entropy) * v.float()
            g = log_q_l.exp_()
            if not on_cpu or not bool(v.all()):  # no host sync per chunk on an accelerator
                g.mul_(v.float().unsqueeze(-1))
            g.sub_(target)
            grad[a:b] = g
            kd_mask[a:b] = mask
        denom = max(n_valid, 1)
        grad.div_(denom)
        ctx.save_for_backward(grad)
        ctx.shape, ctx.dtype = student.shape, student.dtype
        ctx.mark_non_differentiable(kd_mask)
        loss = per_token.sum() / denom
        return loss, kd_mask.reshape(labels.shape)

    @staticmethod
    def backward(ctx, grad_loss, _grad_mask):
        (grad,) = ctx.saved_tensors
        return (grad * grad_loss).reshape(ctx.shape).to(ctx.dtype), None, None, None, None, None, None


def cross_entropy_loss(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100
) -> torch.Tensor:
    """Token-mean cross-entropy (the MLE objective of AdaSingle / AdaCentralized / AdaFedAvg)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=ignore_index
    )
