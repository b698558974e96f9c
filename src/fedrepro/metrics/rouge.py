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

import functools
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


def _aligned(predictions, references) -> tuple[list, list]:
    """Aligned, non-empty lists (of any items), or a ValueError saying what is wrong."""
    predictions = list(predictions)
    references = list(references)
    if len(predictions) != len(references):
        raise ValueError(
            f"predictions and references must have the same length, got {len(predictions)} "
            f"predictions and {len(references)} references"
        )
    if not predictions:
        raise ValueError("predictions and references are empty; need at least one example")
    return predictions, references


def _checked_pairs(predictions, references) -> tuple[list[str], list[str]]:
    """Aligned, non-empty lists of strings, or a ValueError saying which item is wrong."""
    predictions, references = _aligned(predictions, references)
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

ROUGE_SCORERS = ("rouge", "rouge-score")
"""Scorers of :func:`rouge_f1_recall`: ``rouge`` -- the ``rouge`` package (pltrdy, 1.0.1), as the
FedSum authors score (:func:`rouge_package_f1_recall`); ``rouge-score`` -- Google's
``rouge_score`` with the Porter stemmer (:func:`rouge_scores`)."""

SENTENCE_JOIN = "<q>"
"""How BertSum (and the FedSum authors' code) joins the sentences of a summary before scoring."""

_QUOTES = str.maketrans({"‘": "'", "’": "'", "‚": "'", "“": '"', "”": '"', "„": '"'})


def _sentences(item, name: str, i: int) -> list[str]:
    """A summary as a list of sentences (a string is one sentence)."""
    if isinstance(item, str):
        return [item]
    if isinstance(item, (list, tuple)) and all(isinstance(s, str) for s in item):
        return list(item)
    raise ValueError(f"{name}[{i}] is {type(item).__name__}, expected str or a list of str")


def ptb_tokens(sentence: str) -> list[str]:
    """Penn-Treebank tokens of one sentence (NLTK's ``TreebankWordTokenizer``, after mapping
    curly quotes to ASCII): the approximation of the CoreNLP tokenisation BertSum's data went
    through (``don't`` → ``do n't``, ``club's`` → ``club 's``, punctuation split off)."""
    return _treebank().tokenize(sentence.translate(_QUOTES))


@functools.lru_cache(maxsize=1)
def _treebank():
    from nltk.tokenize.treebank import TreebankWordTokenizer

    return TreebankWordTokenizer()


def paper_text(sentences: list[str], lowercase: bool = True, tokenize: bool = True) -> str:
    """A summary as the FedSum authors' scorer reads it: each sentence PTB-tokenised
    (:func:`ptb_tokens`) and lower-cased, as BertSum's preprocessing leaves its text, then the
    sentences joined by ``<q>`` (BertSum's ``'<q>'.join``).  Empty sentences are dropped."""
    out = []
    for s in sentences:
        text = " ".join(ptb_tokens(s)) if tokenize else " ".join(s.split())
        text = text.lower() if lowercase else text
        if text:
            out.append(text)
    return SENTENCE_JOIN.join(out)


class _RecursionLimit:
    """The package's LCS reconstruction recurses once per token pair; the FedSum code raises
    Python's limit to 10,000 (``sys.setrecursionlimit(10000)`` in ``tool/utils.py``)."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit

    def __enter__(self):
        import sys

        self.before = sys.getrecursionlimit()
        sys.setrecursionlimit(max(self.before, self.limit))

    def __exit__(self, *exc):
        import sys

        sys.setrecursionlimit(self.before)


def rouge_package_f1_recall(
    predictions, references, lowercase: bool = True, tokenize: bool = True
) -> dict:
    """ROUGE-1/2/L F1 and recall (%) with the ``rouge`` package (pltrdy ``rouge==1.0.1``), as the
    FedSum authors compute them (``tool/utils.py``: ``Rouge().get_scores(candidates, references,
    avg=True, ignore_empty=True)`` on BertSum's text).

    What that means, all of it the package's or BertSum's, none of it ours:

    * no stemming, no stop words; the text is what :func:`paper_text` makes of the sentences
      (PTB tokens, lower-cased -- BertSum's preprocessing -- joined by ``<q>``);
    * the package splits a summary into "sentences" at every ``.`` and into words at every
      space, so ``<q>`` stays glued to the next sentence's first word (``<q>the``) on both sides,
      exactly as in the authors' evaluation;
    * ROUGE-N counts *distinct* n-grams (sets, the package's default ``exclusive=True``); F =
      2PR / (P + R + 1e-8); ROUGE-L is the summary-level union LCS over those sentences;
    * the macro average over documents (``avg=True``).  A pair with an empty side scores 0 (the
      package raises; the authors drop such pairs with ``ignore_empty`` -- a selection is never
      empty here).

    Parameters
    ----------
    predictions, references : list of (str or list of str)
        Aligned summaries; each a list of its sentences (a string counts as one sentence).
    lowercase, tokenize : bool, default True
        :func:`paper_text`'s lower-casing and PTB tokenisation (``False`` scores the text as
        given, whitespace collapsed).

    Returns
    -------
    dict
        As :func:`rouge_f1_recall`.
    """
    from rouge import Rouge

    predictions, references = _aligned(predictions, references)  # items may be sentence lists
    rouge = Rouge()
    keys = {"rouge1": "rouge-1", "rouge2": "rouge-2", "rougeL": "rouge-l"}
    per = {f"{t}_{m}": [] for t in ROUGE_TYPES for m in ROUGE_MEASURES}
    with _RecursionLimit():
        for i, (pred, ref) in enumerate(zip(predictions, references, strict=True)):
            hyp = paper_text(_sentences(pred, "predictions", i), lowercase, tokenize)
            gold = paper_text(_sentences(ref, "references", i), lowercase, tokenize)
            if not any(p for p in hyp.split(".")) or not any(p for p in gold.split(".")):
                scores = {k: {"f": 0.0, "r": 0.0} for k in keys.values()}
            else:
                scores = rouge.get_scores(hyp, gold)[0]
            for t, k in keys.items():
                per[f"{t}_f1"].append(float(scores[k]["f"]) * 100.0)
                per[f"{t}_recall"].append(float(scores[k]["r"]) * 100.0)
    out: dict = {k: float(np.mean(v)) for k, v in per.items()}
    out["n"] = len(predictions)
    return out


def scorer_version(scorer: str) -> str:
    """``<scorer> <installed version>`` (for the records and the table captions)."""
    from importlib.metadata import PackageNotFoundError, version

    if scorer not in ROUGE_SCORERS:
        raise ValueError(f"ROUGE scorer must be one of {ROUGE_SCORERS}, got {scorer!r}")
    try:
        return f"{scorer} {version(scorer)}"
    except PackageNotFoundError:
        return scorer


def rouge_f1_recall(
    predictions, references, lang: str = "en", scorer: str = "rouge-score"
) -> dict:
    """ROUGE-1/2/L F1 *and* recall in percent (FedSum §5.1: "R-F(1/2/L)" and "R-R(1/2/L)").

    ``scorer="rouge-score"``: same tokenisation, validation and macro averaging over examples as
    :func:`rouge_scores` (whose F1 values these are); the recall is ``rouge_score``'s ``.recall``
    (overlap / reference n-grams; for ROUGE-L, LCS / reference length).  ``scorer="rouge"``: the
    FedSum authors' scorer, :func:`rouge_package_f1_recall`.

    Parameters
    ----------
    predictions, references : list of str (or of lists of sentences)
        Aligned system outputs and gold summaries (one reference per example).  A list of
        sentences is joined by spaces for ``rouge-score`` and by ``<q>`` for ``rouge``.
    lang : {"en", "zh"}, default "en"
        As in :func:`rouge_scores` (``rouge``: English only).
    scorer : {"rouge-score", "rouge"}, default "rouge-score"
        See :data:`ROUGE_SCORERS`.

    Returns
    -------
    dict
        ``{"rouge1_f1", "rouge2_f1", "rougeL_f1", "rouge1_recall", "rouge2_recall",
        "rougeL_recall": float, "n": int}`` -- the metric names of ``paper_results.csv``.

    Raises
    ------
    ValueError
        As :func:`rouge_scores`; an unknown scorer; ``rouge`` with ``lang="zh"``.
    """
    if scorer not in ROUGE_SCORERS:
        raise ValueError(f"ROUGE scorer must be one of {ROUGE_SCORERS}, got {scorer!r}")
    if scorer == "rouge":
        if lang != "en":
            raise ValueError(f"the rouge package scorer is English-only, got lang={lang!r}")
        return rouge_package_f1_recall(predictions, references)
    predictions = [
        " ".join(_sentences(p, "predictions", i)) if not isinstance(p, str) else p
        for i, p in enumerate(predictions)
    ]
    references = [
        " ".join(_sentences(r, "references", i)) if not isinstance(r, str) else r
        for i, r in enumerate(references)
    ]
    predictions, references = _checked_pairs(predictions, references)
    rscorer = _scorer(lang)
    per = {f"{t}_{m}": [] for t in ROUGE_TYPES for m in ROUGE_MEASURES}
    for pred, ref in zip(predictions, references, strict=True):
        scores = rscorer.score(ref, pred)
        for t in ROUGE_TYPES:
            per[f"{t}_f1"].append(float(scores[t].fmeasure) * 100.0)
            per[f"{t}_recall"].append(float(scores[t].recall) * 100.0)
    out: dict = {k: float(np.mean(v)) for k, v in per.items()}
    out["n"] = len(predictions)
    return out
