"""Tokenisation and deterministic batching of normalized seq2seq records."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

IGNORE_INDEX = -100


def tokenize_records(
    records: Sequence[dict], tokenizer, max_source_length: int, max_target_length: int
) -> list[dict]:
    """Tokenise ``{input, target}`` records (truncating) into id lists, keeping record ids."""
    sources = [r["input"] for r in records]
    targets = [r["target"] for r in records]
    enc = tokenizer(sources, max_length=max_source_length, truncation=True)
    dec = tokenizer(text_target=targets, max_length=max_target_length, truncation=True)
    return [
        {"id": r["id"], "input_ids": s, "labels": t}
        for r, s, t in zip(records, enc["input_ids"], dec["input_ids"])
    ]


def shift_right(labels: torch.Tensor, pad_token_id: int, start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: ``[start, y_1, …, y_{T-1}]`` with ignored positions as pad."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = start_token_id
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_token_id)


def collate(examples: Sequence[dict], pad_token_id: int, start_token_id: int) -> dict:
    """Pad a list of tokenised examples into tensors (dynamic padding to the batch maximum)."""
    src_len = max(len(e["input_ids"]) for e in examples)
    tgt_len = max(len(e["labels"]) for e in examples)
    input_ids = torch.full((len(examples), src_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), src_len), dtype=torch.long)
    labels = torch.full((len(examples), tgt_len), IGNORE_INDEX, dtype=torch.long)
    for i, e in enumerate(examples):
        input_ids[i, : len(e["input_ids"])] = torch.tensor(e["input_ids"])
        attention_mask[i, : len(e["input_ids"])] = 1
        labels[i, : len(e["labels"])] = torch.tensor(e["labels"])
    out = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "decoder_input_ids": shift_right(labels, pad_token_id, start_token_id),
    }
    if all("kd_allowed" in e for e in examples):  # one bool per label token (AdaFedHardKD)
        allowed = torch.zeros((len(examples), tgt_len), dtype=torch.bool)
        for i, e in enumerate(examples):
            if len(e["kd_allowed"]) != len(e["labels"]):
                raise ValueError(f"example {e.get('id')}: kd_allowed and labels differ in length")
            allowed[i, : len(e["kd_allowed"])] = torch.tensor(e["kd_allowed"], dtype=torch.bool)
        out["kd_allowed"] = allowed
    return out


def iterate_batches(
    examples: Sequence[dict],
    batch_size: int,
    pad_token_id: int,
    start_token_id: int,
    shuffle_seed: int | None = None,
) -> Iterator[dict]:
    """Yield padded batches (with the examples' ``ids`` where they have one); the order is a
    seeded permutation (or file order if no seed)."""
    order = list(range(len(examples)))
    if shuffle_seed is not None:
        g = torch.Generator().manual_seed(shuffle_seed)
        order = torch.randperm(len(examples), generator=g).tolist()
    for start in range(0, len(order), batch_size):
        chosen = [examples[i] for i in order[start : start + batch_size]]
        batch = collate(chosen, pad_token_id, start_token_id)
        if all("id" in e for e in chosen):
            batch["ids"] = [e["id"] for e in chosen]
        yield batch


def derive_seed(*parts: int | str) -> int:
    """A stable 63-bit seed from (seed, client, round, epoch, …) — independent of PYTHONHASHSEED."""
    import hashlib

    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)
