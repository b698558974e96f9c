"""ROUGE-1/2/L F1 in percent, as the papers report it.

English uses ``rouge_score``'s default tokenizer with the Porter stemmer
(``use_stemmer=True``, the common setting for summarization ROUGE). That tokenizer lower-cases
and keeps only ``[a-z0-9]`` runs, so it silently turns Chinese text into zero tokens;
``lang="zh"`` therefore scores characters: every character is one token (the usual
character-level ROUGE for Chinese), except whitespace and punctuation, which are dropped
(FedSUMM issue: "CJK punctuation and spaces dropped").  The exact rule is
:func:`is_dropped_char`:

* whitespace (``str.isspace``: ASCII spaces, newlines, U+3000 ideographic space, …);
* invisible control/format characters (Unicode categories ``Cc``, ``Cf``: BOM, zero-width space);
* every Unicode punctuation character (categories ``P*``: ，。、；：？！“”‘’（）《》【】「」…—·);
* every printable non-alphanumeric ASCII character (``string.punctuation``, which adds the
  ``S*`` symbols ``$ + < = > ^ ` | ~`` to the ASCII ``P*`` ones -- BERT's own punctuation rule)
  and its full-width form (U+FF01–U+FF5E, e.g. ＋＝＄～).

Other symbols (``S*`` outside ASCII and its full-width forms: ×, ≥, ℃, °, ￥) are content and are
kept, as are letters and digits of every script.  Nothing is lower-cased or normalised.
"""

from __future__ import annotations

import string
import unicodedata

import numpy as np
from rouge_score import rouge_scorer

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
"""The ROUGE variants computed, in report order."""

LANGS = ("en", "zh")
"""Supported values of ``lang``."""


_ASCII_PUNCTUATION = frozenset(string.punctuation)
_FULLWIDTH_OFFSET = 0xFEE0  # U+FF01..U+FF5E are the full-width forms of ASCII U+0021..U+007E


def is_dropped_char(ch: str) -> bool:
    """Whether Chinese character-level ROUGE ignores ``ch`` (the rule in the module docstring).

    Parameters
    ----------
    ch : str
        A single character.

    Returns
    -------
    bool
        True for whitespace, control/format characters (``Cc``, ``Cf``), Unicode punctuation
        (``P*``), ASCII ``string.punctuation`` and the full-width forms of the latter.
    """
    if ch.isspace() or ch in _ASCII_PUNCTUATION:
        return True
    category = unicodedata.category(ch)
    if category.startswith("P") or category in ("Cc", "Cf"):
        return True
    code = ord(ch)
    return 0xFF01 <= code <= 0xFF5E and chr(code - _FULLWIDTH_OFFSET) in _ASCII_PUNCTUATION


class CharTokenizer:
    """Character tokenizer for Chinese (or any unsegmented script).

    Each character is a token, except the whitespace and punctuation that :func:`is_dropped_char`
    drops; nothing is lower-cased or stemmed.  Implements the ``tokenize(text)`` interface
    ``rouge_score.rouge_scorer.RougeScorer`` expects.

    Parameters
    ----------
    drop_punctuation : bool, default True
        ``False`` keeps punctuation (only whitespace is dropped), the tokenizer's behaviour
        before the FedSUMM issue.
    """

    def __init__(self, drop_punctuation: bool = True) -> None:
        self.drop_punctuation = drop_punctuation

    def tokenize(self, text: str) -> list[str]:
        """Return the kept characters of ``text``, in order.

        Parameters
        ----------
        text : str
            Text to split.

        Returns
        -------
        list of str
            One single-character string per character that is not dropped.
        """
        if self.drop_punctuation:
            return [ch for ch in text if not is_dropped_char(ch)]
        return [ch for ch in text if not ch.isspace()]


def _scorer(lang: str, stemming: bool = True) -> rouge_scorer.RougeScorer:
    if lang == "en":
        return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=bool(stemming))
    if lang == "zh":
        return rouge_scorer.RougeScorer(list(ROUGE_TYPES), tokenizer=CharTokenizer())
    raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")


def _checked_pairs(predictions, references) -> tuple[list[str], list[str]]:
    """Aligned, non-empty lists of strings, or a ValueError saying which item is wrong."""
    predictions = list(predictions)
    references = list(references)
    if len(predictions) != len(references):
        raise ValueError(
            f"predictions and references must have the same length, got {len(predictions)} "
            f"predictions and {len(references)} references"
        )
    if not predictions:
        raise ValueError("predictions and references are empty; need at least one example")
    for name, seq in (("predictions", predictions), ("references", references)):
        for i, item in enumerate(seq):
            if not isinstance(item, str):
                raise ValueError(f"{name}[{i}] is {type(item).__name__}, expected str")
    return predictions, references


def rouge_scores(
    predictions: list[str], references: list[str], lang: str = "en", stemming: bool = True
) -> dict:
    """Score predictions against references with ROUGE-1, ROUGE-2 and ROUGE-L (F1, percent).

    Parameters
    ----------
    predictions : list of str
        System outputs, one per example.
    references : list of str
        Gold summaries, aligned with ``predictions`` (one reference per example).
    lang : {"en", "zh"}, default "en"
        ``"en"``: ``rouge_score``'s default tokenizer with Porter stemming.
        ``"zh"``: :class:`CharTokenizer` (every character is a token except whitespace and
        punctuation, see :func:`is_dropped_char`; no stemming), because the default tokenizer
        drops all non-ASCII text.
    stemming : bool, default True
        English only: Porter stemming (``rouge_score``'s ``use_stemmer``).  HuggingFace
        ``evaluate``'s ROUGE, which AdaFedSelecKD cites, defaults to no stemming.

    Returns
    -------
    dict
        ``{"rouge1": float, "rouge2": float, "rougeL": float, "n": int,
        "per_example": {"rouge1": [...], "rouge2": [...], "rougeL": [...]}}`` where each score
        is an F1 measure multiplied by 100; the top-level scores are the means of the
        per-example lists (macro average over examples) and ``n`` is the number of examples.

    Raises
    ------
    ValueError
        If the inputs are empty, have different lengths, contain a non-string, or ``lang`` is
        not supported.

    Notes
    -----
    ``rouge_score`` gives 0 for a pair in which either side has no n-grams of the required
    order (e.g. ROUGE-2 of single-token texts, or empty strings).
    """
    predictions, references = _checked_pairs(predictions, references)
    scorer = _scorer(lang, stemming)
    per_example: dict[str, list[float]] = {t: [] for t in ROUGE_TYPES}
    for pred, ref in zip(predictions, references, strict=True):
        scores = scorer.score(ref, pred)  # rouge_score's signature is score(target, prediction)
        for t in ROUGE_TYPES:
            per_example[t].append(float(scores[t].fmeasure) * 100.0)
    out: dict = {t: float(np.mean(per_example[t])) for t in ROUGE_TYPES}
    out["n"] = len(predictions)
    out["per_example"] = per_example
    return out


ROUGE_MEASURES = ("f1", "recall")
"""The measures of :func:`rouge_f1_recall` (FedSum reports R-F and R-R)."""


def rouge_f1_recall(predictions: list[str], references: list[str], lang: str = "en") -> dict:
    """ROUGE-1/2/L F1 *and* recall in percent (FedSum §5.1: "R-F(1/2/L)" and "R-R(1/2/L)").

    Same tokenisation, validation and macro averaging over examples as :func:`rouge_scores`
    (whose F1 values these are); the recall is ``rouge_score``'s ``.recall`` (overlap / reference
    n-grams; for ROUGE-L, LCS / reference length).

    Parameters
    ----------
    predictions, references : list of str
        Aligned system outputs and gold summaries (one reference per example).
    lang : {"en", "zh"}, default "en"
        As in :func:`rouge_scores`.

    Returns
    -------
    dict
        ``{"rouge1_f1", "rouge2_f1", "rougeL_f1", "rouge1_recall", "rouge2_recall",
        "rougeL_recall": float, "n": int}`` -- the metric names of ``paper_results.csv``.

    Raises
    ------
    ValueError
        As :func:`rouge_scores`.
    """
    predictions, references = _checked_pairs(predictions, references)
    scorer = _scorer(lang)
    per = {f"{t}_{m}": [] for t in ROUGE_TYPES for m in ROUGE_MEASURES}
    for pred, ref in zip(predictions, references, strict=True):
        scores = scorer.score(ref, pred)
        for t in ROUGE_TYPES:
            per[f"{t}_f1"].append(float(scores[t].fmeasure) * 100.0)
            per[f"{t}_recall"].append(float(scores[t].recall) * 100.0)
    out: dict = {k: float(np.mean(v)) for k, v in per.items()}
    out["n"] = len(predictions)
    return out
