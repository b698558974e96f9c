"""Extractive oracle labels for BERTSUM (Liu & Lapata 2019), as FedSum's authors build them.

The FedSum authors' code takes its data from BertSum's preprocessing (``Li-Evan/FedSum``'s README:
"please refer to bertsum"), whose ``format_to_bert`` labels every document with
``greedy_selection(source, tgt, 3)`` and then drops the short sentences (``BertData.preprocess``).
This module does the same:

* **Greedy selection** (BertSum's ``greedy_selection``): starting from an empty selection,
  repeatedly add the sentence that most increases ROUGE-1 F + ROUGE-2 F (set-based n-grams of
  lower-cased alphanumeric tokens, BertSum's ``cal_rouge`` with its ``+ 1e-8`` in the F
  denominator) between the selected sentences and the reference, and stop when no sentence
  improves the score or ``max_sentences`` are selected.  The label count (``max_sentences``,
  BertSum's ``summary_size``) is 3 in BertSum and PreSumm, for every dataset; it is a separate
  number from how many sentences a model extracts at test time.
* **Short-sentence filter** (BertSum's ``min_src_ntokens`` = 5, kept iff ``len(tokens) > 5``):
  the oracle runs on *all* sentences, then a sentence with at most ``short_sentence_tokens``
  tokens is dropped from the model's input together with its label, so a short oracle sentence
  leaves the document with one positive fewer.  Here the label file keeps every sentence (the
  model input is cut at encoding, :func:`kept_sentences` is the one rule for both) and writes 0
  for the dropped ones.  Tokens are whitespace tokens of ``meta.sentences``.  BertSum counts
  CoreNLP tokens: the PubMed release is tokenised that way already, while the raw text of the
  other sources (CNN/DM's ``article_lines``, WikiHow, Reddit) counts a word with its punctuation
  as one token -- on the 250 real CNN/DM test articles, 205 of 7,225 sentences (2.8 %) fall on
  the other side of the threshold than with PTB tokens.

Hand-written because it needs thousands of n-gram overlap evaluations per document over cached
n-gram sets -- a ROUGE library call per candidate would be orders of magnitude slower -- and
because matching BertSum's tokenisation exactly matters for the labels.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9 ]")

LABEL_SENTENCES = 3
"""BertSum's / PreSumm's oracle size (``greedy_selection(source, tgt, 3)``), the authors' labels."""

SHORT_SENTENCE_TOKENS = 5
"""BertSum's ``min_src_ntokens``: a sentence of at most this many tokens is dropped."""


def _tokens(text: str) -> list[str]:
    return _NON_ALNUM.sub("", text.lower()).split()


def _ngrams(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def _f1(candidate: set, reference: set) -> float:
    """BertSum's ``cal_rouge(...)["f"]``: 2·p·r / (p + r + 1e-8), 0 without candidate/reference."""
    if not candidate or not reference:
        return 0.0
    overlap = len(candidate & reference)
    p, r = overlap / len(candidate), overlap / len(reference)
    return 2.0 * ((p * r) / (p + r + 1e-8))


def greedy_oracle(sentences: Sequence[str], reference: str, max_sentences: int = 3) -> list[int]:
    """Indices (sorted) of the sentences the greedy ROUGE-1+2 oracle selects."""
    if max_sentences < 1:
        raise ValueError(f"the oracle label count must be >= 1, got {max_sentences}")
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


def sentence_tokens(sentence: str) -> int:
    """Tokens of a sentence for the short-sentence filter (whitespace tokens)."""
    return len(sentence.split())


def kept_sentences(sentences: Sequence[str], short_sentence_tokens: int = 0) -> list[int]:
    """Indices of the sentences BertSum's filter keeps: more than ``short_sentence_tokens``
    tokens (``0`` keeps every non-empty sentence).  A document whose sentences would all go keeps
    them all (BertSum drops such a document; we keep every record, see the decisions file)."""
    if short_sentence_tokens < 0:
        raise ValueError(f"short_sentence_tokens must be >= 0, got {short_sentence_tokens}")
    kept = [i for i, s in enumerate(sentences) if sentence_tokens(s) > short_sentence_tokens]
    return kept or list(range(len(sentences)))


def oracle_labels(
    sentences: Sequence[str],
    reference: str,
    max_sentences: int = 3,
    short_sentence_tokens: int = 0,
) -> list[int]:
    """0/1 label per sentence (1 = in the oracle summary and kept by the short-sentence filter)."""
    chosen = set(greedy_oracle(sentences, reference, max_sentences))
    kept = set(kept_sentences(sentences, short_sentence_tokens))
    return [int(i in chosen and i in kept) for i in range(len(sentences))]


def write_oracle_labels(
    records_path: str, out_path: str, max_sentences: int, short_sentence_tokens: int = 0
) -> int:
    """Oracle labels for every record of a prepared source: ``{id, sentences, labels}`` per line
    (``max_sentences`` = the label count, ``short_sentence_tokens`` = the filter, see the module
    docstring).

    Sentences come from ``meta["sentences"]`` (set by the English parsers from the raw release's
    own sentence boundaries); a record without them is an error naming the record.
    """
    from fedrepro.io import InputError, read_jsonl, write_jsonl_atomic

    out = []
    for rec in read_jsonl(records_path):
        sents = (rec.get("meta") or {}).get("sentences")
        if not sents:
            raise InputError(f"{records_path}: record {rec.get('id')} has no meta.sentences to label")
        labels = oracle_labels(sents, rec["target"], max_sentences, short_sentence_tokens)
        out.append({"id": rec["id"], "sentences": sents, "labels": labels})
    return write_jsonl_atomic(out_path, out)
