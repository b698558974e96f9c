"""Demo-scale stand-in for pre-training: a short denoising warm-up of the tiny backbone.

The paper's backbones are pre-trained BART / LED checkpoints; a randomly initialised tiny model
frozen under adapters would leave the adapters nothing to build on.  At demo scale we therefore
warm the whole tiny model up with BART's own objective — reconstruct a text from a corrupted copy
(Lewis et al. 2020: span masking with a single ``<mask>`` per span) — on the *unlabelled* text of
the training splits (transcript turns and queries only, never the reference summaries), then
freeze it.  The summarisation task itself is learnt only by the adapters, as in the paper.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence

import torch

from fedrepro.data.seq2seq import collate

log = logging.getLogger(__name__)


def corrupt_spans(ids: list[int], mask_id: int, rng: random.Random, ratio: float = 0.3) -> list[int]:
    """Text infilling: replace spans (Poisson-ish lengths 1–5) covering ~``ratio`` of tokens by one mask."""
    body, out, i = ids[1:-1], [ids[0]], 0
    while i < len(body):
        if rng.random() < ratio / 3.0:
            span = rng.randint(1, 5)
            out.append(mask_id)
            i += span
        else:
            out.append(body[i])
            i += 1
    out.append(ids[-1])
    return out


def denoising_warmup(model, tokenizer, texts: Sequence[str], steps: int, batch_size: int, lr: float,
                     max_length: int, seed: int = 0) -> list[float]:
    """Train ``model`` (all parameters) for ``steps`` denoising steps; return the loss curve."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    enc = tokenizer(list(texts), max_length=max_length, truncation=True)["input_ids"]
    enc = [e for e in enc if len(e) > 4]
    if not enc:
        raise ValueError("denoising warm-up needs non-empty training text")
    pad_id = model.config.pad_token_id
    start_id = model.config.decoder_start_token_id

    def make_batch(picks: list[list[int]]) -> dict:
        batch = collate(
            [{"input_ids": corrupt_spans(p, tokenizer.mask_token_id, rng), "labels": p} for p in picks],
            pad_id,
            start_id,
        )
        return {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "decoder_input_ids": batch["decoder_input_ids"],
            "labels": batch["labels"],
        }

    return _train_steps(model, enc, steps, batch_size, lr, rng, make_batch, "warm-up")


def mask_tokens(ids: list[int], mask_id: int, vocab_size: int, special: set[int], rng: random.Random,
                ratio: float = 0.15) -> tuple[list[int], list[int]]:
    """RoBERTa's masked-LM corruption (Liu et al. 2019, §4.1 / BERT §3.1): each non-special token is
    selected with probability ``ratio``; of those 80 % become ``<mask>``, 10 % a random token, 10 %
    stay.  Returns ``(inputs, labels)`` with ``-100`` on unselected positions."""
    inputs, labels = list(ids), [-100] * len(ids)
    for i, tok in enumerate(ids):
        if tok in special or rng.random() >= ratio:
            continue
        labels[i] = tok
        r = rng.random()
        if r < 0.8:
            inputs[i] = mask_id
        elif r < 0.9:
            inputs[i] = rng.randrange(vocab_size)
    return inputs, labels


def mlm_warmup(model, tokenizer, texts: Sequence[str], steps: int, batch_size: int, lr: float,
               max_length: int, seed: int = 0) -> list[float]:
    """Demo-scale stand-in for RoBERTa pre-training: ``steps`` masked-LM steps of a
    ``RobertaForMaskedLM`` (all parameters) on unlabelled training text; returns the loss curve."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    enc = tokenizer(list(texts), max_length=max_length, truncation=True)["input_ids"]
    enc = [e for e in enc if len(e) > 3]
    if steps and not enc:
        raise ValueError("masked-LM warm-up needs non-empty training text")
    pad_id = model.config.pad_token_id
    special = set(tokenizer.all_special_ids)

    def make_batch(picks: list[list[int]]) -> dict | None:
        pairs = [mask_tokens(p, tokenizer.mask_token_id, len(tokenizer), special, rng) for p in picks]
        width = max(len(p) for p in picks)
        ids = torch.full((batch_size, width), pad_id, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (x, y) in enumerate(pairs):
            ids[row, : len(x)] = torch.tensor(x)
            labels[row, : len(y)] = torch.tensor(y)
            mask[row, : len(x)] = 1
        if (labels == -100).all():
            return None  # nothing to predict: skip the step
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return _train_steps(model, enc, steps, batch_size, lr, rng, make_batch, "MLM warm-up")


def _train_steps(
    model,
    enc: list[list[int]],
    steps: int,
    batch_size: int,
    lr: float,
    rng: random.Random,
    make_batch: Callable[[list[list[int]]], dict | None],
    label: str,
) -> list[float]:
    """The warm-ups' shared loop: ``steps`` AdamW steps (weight decay 0.01, gradients clipped to
    norm 1) of ``model`` (all parameters) on batches of ``batch_size`` token lists drawn from
    ``enc`` with ``rng``; ``make_batch`` turns the drawn lists into the model's keyword arguments,
    or ``None`` to skip the step.  Leaves ``model`` in eval mode; returns the loss curve."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    losses = []
    for step in range(steps):
        picks = [enc[rng.randrange(len(enc))] for _ in range(batch_size)]
        batch = make_batch(picks)
        if batch is None:
            continue
        out = model(**batch)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(out.loss.detach()))
        if step % 50 == 0 or step == steps - 1:
            log.info("%s step %d/%d loss %.3f", label, step + 1, steps, losses[-1])
    model.eval()
    return losses
