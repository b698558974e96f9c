"""Extractive oracle labels for BERTSUM (Liu & Lapata 2019), as FedSum uses them.

The greedy procedure of BertSum's data builder: starting from an empty selection, repeatedly add
the sentence that most increases ROUGE-1 F + ROUGE-2 F (on lower-cased alphanumeric tokens)
between the selected sentences and the reference, and stop when no sentence improves the score
or ``max_sentences`` are selected.  Hand-written because it needs thousands of n-gram overlap
evaluations per document over cached n-gram sets — a ROUGE library call per candidate would be
orders of magnitude slower — and because matching BertSum's tokenisation exactly matters for the
labels.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9 ]")


def _tokens(text: str) -> list[str]:
    return _NON_ALNUM.sub("", text.lower()).split()


def _ngrams(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def _f1(candidate: set, reference: set) -> float:
    if not candidate or not reference:
        return 0.0
    overlap = len(candidate & reference)
    if overlap == 0:
        return 0.0
    p, r = overlap / len(candidate), overlap / len(reference)
    return 2 * p * r / (p + r)


def greedy_oracle(sentences: Sequence[str], reference: str, max_sentences: int = 3) -> list[int]:
    """Indices (sorted) of the sentences the greedy ROUGE-1+2 oracle selects."""
    ref_tokens = _tokens(reference)
    ref1, ref2 = _ngrams(ref_tokens, 1), _ngrams(ref_tokens, 2)
    sent_tokens = [_tokens(s) for s in sentences]
    uni = [_ngrams(t, 1) for t in sent_tokens]
    bi = [_ngrams(t, 2) for t in sent_tokens]
    selected: list[int] = []
    best = 0.0
    for _ in range(max_sentences):
        choice, choice_score = None, best
        for i in range(len(sentences)):
            if i in selected:
                continue
            cand = selected + [i]
            c1 = set().union(*(uni[j] for j in cand))
            c2 = set().union(*(bi[j] for j in cand))
            score = _f1(c1, ref1) + _f1(c2, ref2)
            if score > choice_score:
                choice, choice_score = i, score
        if choice is None:
            break
        selected.append(choice)
        best = choice_score
    return sorted(selected)


def oracle_labels(sentences: Sequence[str], reference: str, max_sentences: int = 3) -> list[int]:
    """0/1 label per sentence (1 = in the oracle summary)."""
    chosen = set(greedy_oracle(sentences, reference, max_sentences))
    return [int(i in chosen) for i in range(len(sentences))]


def write_oracle_labels(records_path: str, out_path: str, max_sentences: int) -> int:
    """Oracle labels for every record of a prepared source: ``{id, sentences, labels}`` per line.

    Sentences come from ``meta["sentences"]`` (set by the English parsers from the raw release's
    own sentence boundaries); a record without them is an error naming the record.
    """
    from fedrepro.io import InputError, read_jsonl, write_jsonl_atomic

    out = []
    for rec in read_jsonl(records_path):
        sents = (rec.get("meta") or {}).get("sentences")
        if not sents:
            raise InputError(f"{records_path}: record {rec.get('id')} has no meta.sentences to label")
        out.append({"id": rec["id"], "sentences": sents, "labels": oracle_labels(sents, rec["target"], max_sentences)})
    return write_jsonl_atomic(out_path, out)
