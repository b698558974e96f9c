"""ROUGE's options and entry points, each changing a number (from the mutation run of
``fedrepro.metrics.rouge``, docs/mutation.md): stemming reaches the scorer, FedSum's two scorers
behind ``rouge_f1_recall``, sentence lists, the package scorer's lower-casing and PTB tokens on
both sides, an empty side scoring 0, and the errors naming the item.

The hand values: ROUGE-1 F of ``cats running`` against ``cat run`` is 100 with the Porter stemmer
(both stem to ``cat run``) and 0 without it (no shared token)."""

from __future__ import annotations

import pytest

from fedrepro.metrics.rouge import (
    CharTokenizer,
    is_dropped_char,
    paper_text,
    rouge_f1_recall,
    rouge_package_f1_recall,
    rouge_scores,
)


def test_stemming_reaches_the_scorer():
    assert rouge_scores(["cats running"], ["cat run"])["rouge1"] == pytest.approx(100.0)
    assert rouge_scores(["cats running"], ["cat run"], stemming=False)["rouge1"] == 0.0
    out = rouge_scores(["a b", "c"], ["a b", "d"])
    assert out["n"] == 2 and out["per_example"]["rouge1"] == [100.0, 0.0] and out["rouge1"] == 50.0


def test_rouge_f1_recall_with_the_authors_scorer_is_the_package_s_numbers():
    preds, refs = [["The cat sat .", "It slept ."], "a dog ."], [["the cat sat on the mat ."], "a dog barked ."]
    assert rouge_f1_recall(preds, refs, scorer="rouge") == rouge_package_f1_recall(preds, refs)
    assert rouge_f1_recall(preds, refs, scorer="rouge")["n"] == 2
    with pytest.raises(ValueError, match="English-only, got lang='zh'"):
        rouge_f1_recall(["我们"], ["我们"], lang="zh", scorer="rouge")
    with pytest.raises(ValueError, match="scorer must be one of"):
        rouge_f1_recall(["a"], ["a"], scorer="bleu")


def test_rouge_f1_recall_joins_sentence_lists_with_spaces_for_rouge_score():
    as_lists = rouge_f1_recall([["the cat", "sat"]], [["the cat sat", "down"]])
    as_text = rouge_f1_recall(["the cat sat"], ["the cat sat down"])
    assert as_lists == as_text
    # hand values: 3 of 3 predicted unigrams in a 4-token reference -> P 1, R 3/4, F 6/7
    assert as_text["rouge1_recall"] == pytest.approx(75.0) and as_text["rouge1_f1"] == pytest.approx(600 / 7)
    assert as_text["n"] == 1
    with pytest.raises(ValueError, match=r"references\[1\] is int, expected str or a list of str"):
        rouge_f1_recall(["a", "b"], ["a", 3])
    with pytest.raises(ValueError, match=r"predictions\[0\] is int, expected str or a list of str"):
        rouge_f1_recall([3], ["a"])


def test_the_package_scorer_lower_cases_and_tokenises_both_sides():
    # default: both sides PTB-tokenised and lower-cased, so they match
    assert rouge_package_f1_recall([["The dog's bone ."]], [["the dog 's bone ."]])["rouge1_f1"] == pytest.approx(
        100.0, abs=1e-5)
    assert rouge_package_f1_recall([["the cat"]], [["The Cat"]])["rouge1_recall"] == pytest.approx(100.0)
    # lowercase=False: "The" and "the" differ (on the gold side too)
    kept_case = rouge_package_f1_recall([["the cat"]], [["The cat"]], lowercase=False)
    assert kept_case["rouge1_recall"] == pytest.approx(50.0)
    # tokenize=False: "dog's" stays one word on the gold side, so it does not match "dog 's"
    raw = rouge_package_f1_recall([["dog 's"]], [["dog's"]], tokenize=False)
    assert raw["rouge1_recall"] == 0.0
    assert rouge_package_f1_recall([["dog 's"]], [["dog's"]])["rouge1_recall"] == pytest.approx(100.0)


def test_the_package_scorer_gives_an_empty_side_zero_f_and_recall():
    # a reference of only "." is empty to the package (it splits sentences at "."): 0, not an error
    s = rouge_package_f1_recall([["a b ."], ["a b ."]], [["a b ."], ["."]])
    assert s["rouge1_f1"] == pytest.approx(50.0, abs=1e-5) and s["rouge1_recall"] == pytest.approx(50.0)
    with pytest.raises(ValueError, match=r"references\[0\] is int"):
        rouge_package_f1_recall([["a"]], [1])
    with pytest.raises(ValueError, match=r"predictions\[0\] is int"):
        rouge_package_f1_recall([1], [["a"]])


def test_paper_text_without_tokenising_collapses_whitespace():
    assert paper_text(["The  cat\tsat ."], tokenize=False) == "the cat sat ."
    assert paper_text(["The cat", "", "sat ."], lowercase=False, tokenize=False) == "The cat<q>sat ."


def test_the_char_tokenizer_without_punctuation_dropping_still_drops_whitespace():
    assert CharTokenizer(drop_punctuation=False).tokenize("我 们，\n好") == ["我", "们", "，", "好"]
    assert CharTokenizer().drop_punctuation is True


def test_control_characters_are_dropped_and_errors_name_the_side():
    # Cc characters that are not whitespace (NUL, BEL, ESC) and a Cf one (zero-width joiner)
    assert all(is_dropped_char(ch) for ch in "\x00\x07\x1b\u200d")
    assert CharTokenizer().tokenize("我\x07们") == ["我", "们"]
    with pytest.raises(ValueError, match=r"references\[1\] is int, expected str"):
        rouge_scores(["a", "b"], ["a", 2])
    with pytest.raises(ValueError, match=r"predictions\[0\] is bytes, expected str"):
        rouge_scores([b"a"], ["a"], lang="zh")
