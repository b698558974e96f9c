"""BERTSUM (fedrepro.papers.fedsum.model): input building, trigram blocking, the tiny backbone folder,
forward/backward and the θ/ω split -- all offline on CPU."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import time

import pytest
import torch
from transformers import BertTokenizerFast

from fedrepro.io import InputError, write_jsonl_atomic
from fedrepro.papers.fedsum.model import (
    BERT_HUB_ID,
    BertSumExt,
    build_tiny_bert_backbone,
    collate,
    data_loss,
    download_bert_backbone,
    encode_document,
    encode_records,
    has_trigram_overlap,
    load_bert_backbone,
    load_bertsum,
    load_oracle_labels,
    make_batches,
    predict_extractive,
    select_sentences,
    sentence_loss_matrix,
)

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "a", "big", "red", "ball"]


@pytest.fixture(scope="module")
def word_tokenizer():
    """A WordPiece tokenizer whose vocabulary holds whole words: one token per word."""
    vocab = {
        t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "."])
    }
    return BertTokenizerFast(vocab=vocab, do_lower_case=True)


def records(n=6):
    out = []
    for i in range(n):
        sents = [
            f"The cat sat on the mat {i}.",
            "A big red ball.",
            "The dog ran far away.",
            f"The cat ran {i} far.",
        ]
        out.append(
            {
                "id": f"doc{i}",
                "input": " ".join(sents),
                "target": "the cat sat .",
                "meta": {"sentences": sents, "highlights": ["the cat sat ."]},
            }
        )
    return out


@pytest.fixture(scope="module")
def tiny_backbone(tmp_path_factory):
    texts = [r["input"] for r in records()] * 5
    out = tmp_path_factory.mktemp("bert") / "bert-tiny"
    tiny = {
        "vocab_size": 120,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 128,
    }
    return build_tiny_bert_backbone(texts, out, tiny, seed=3)


# -- input building --------------------------------------------------------------------------------
def test_cls_positions_and_interval_segments(word_tokenizer):
    doc = encode_document(
        word_tokenizer,
        ["the cat sat", "a dog", "big red ball ."],
        [1, 0, 1],
        max_tokens=64,
        doc_id="d",
    )
    cls_id, sep_id = word_tokenizer.cls_token_id, word_tokenizer.sep_token_id
    # [CLS] the cat sat [SEP] | [CLS] a dog [SEP] | [CLS] big red ball . [SEP]
    assert doc.cls_positions == [0, 5, 9]
    assert doc.token_type_ids == [0] * 5 + [1] * 4 + [0] * 6
    assert len(doc.input_ids) == 15
    assert [doc.input_ids[p] for p in doc.cls_positions] == [cls_id] * 3
    assert [i for i, t in enumerate(doc.input_ids) if t == sep_id] == [4, 8, 14]
    assert doc.labels == [1, 0, 1]


def test_truncation_keeps_sentences_whose_cls_survives(word_tokenizer):
    sents = ["the cat sat", "a dog", "big red ball ."]
    doc = encode_document(word_tokenizer, sents, [0, 1, 1], max_tokens=10)
    # 15 tokens cut to 9 + [SEP]; the third [CLS] (position 9) is gone
    assert len(doc.input_ids) == 10 and doc.input_ids[-1] == word_tokenizer.sep_token_id
    assert doc.cls_positions == [0, 5] and doc.labels == [0, 1] and doc.sentences == sents[:2]
    assert len(doc.token_type_ids) == 10
    # per-sentence cut: two word pieces per sentence at most
    short = encode_document(word_tokenizer, sents, None, max_tokens=64, max_sentence_tokens=2)
    assert short.cls_positions == [0, 4, 8] and short.labels == [0, 0, 0]


def test_collate_pads_tokens_and_sentence_slots(word_tokenizer):
    a = encode_document(word_tokenizer, ["the cat", "a dog"], [1, 0], doc_id="a")
    b = encode_document(
        word_tokenizer, ["the cat sat on the mat", "a dog", "big ball"], [0, 1, 1], doc_id="b"
    )
    batch = collate([a, b], word_tokenizer.pad_token_id)
    assert batch.input_ids.shape == (2, 16) and batch.cls_positions.shape == (2, 3)
    assert batch.attention_mask[0].tolist() == [1] * 8 + [0] * 8
    assert batch.cls_mask.tolist() == [[True, True, False], [True, True, True]]
    assert batch.labels.tolist() == [[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    assert batch.cls_positions[0].tolist() == [0, 4, 0]
    assert batch.ids == ("a", "b") and len(batch) == 2


def test_encode_records_checks_oracle_labels(word_tokenizer, tmp_path):
    recs = records(2)
    path = tmp_path / "oracle_labels.jsonl"
    write_jsonl_atomic(
        path,
        [
            {"id": r["id"], "sentences": r["meta"]["sentences"], "labels": [1, 0, 0, 1]}
            for r in recs
        ],
    )
    oracle = load_oracle_labels(path)
    docs = encode_records(recs, word_tokenizer, oracle, max_tokens=128)
    assert [d.labels for d in docs] == [[1, 0, 0, 1]] * 2
    assert docs[0].target == "the cat sat ."
    stale = {
        k: {"sentences": v["sentences"][:-1], "labels": v["labels"][:-1]} for k, v in oracle.items()
    }
    with pytest.raises(InputError, match="stale"):
        encode_records(recs, word_tokenizer, stale)
    with pytest.raises(InputError, match="no oracle labels"):
        encode_records(recs, word_tokenizer, {})
    with pytest.raises(InputError, match="meta.sentences"):
        encode_records([{"id": "x", "input": "a", "meta": {}}], word_tokenizer)
    write_jsonl_atomic(path, [{"id": "x", "sentences": ["a", "b"], "labels": [1]}])
    with pytest.raises(InputError, match="one per sentence"):
        load_oracle_labels(path)


def test_make_batches_is_a_seeded_permutation(word_tokenizer):
    docs = encode_records(records(5), word_tokenizer)
    a = make_batches(docs, 2, shuffle_seed=7)
    b = make_batches(docs, 2, shuffle_seed=7)
    assert [len(x) for x in a] == [2, 2, 1]
    assert [x.ids for x in a] == [x.ids for x in b]
    assert sorted(i for x in a for i in x.ids) == sorted(d.id for d in docs)
    assert [i for x in make_batches(docs, 2) for i in x.ids] == [d.id for d in docs]


# -- test-time selection ---------------------------------------------------------------------------
def test_trigram_blocking_hand_example():
    assert has_trigram_overlap("the cat sat on the mat", ["yesterday the cat sat down"])
    assert has_trigram_overlap("The Cat Sat here", ["the cat sat"])  # lower-cased like BertSum
    assert not has_trigram_overlap("the cat ran on the mat", ["the cat sat on a mat"])
    assert not has_trigram_overlap("the cat", ["the cat"])  # fewer than three words
    sents = [
        "the cat sat on the mat .",
        "police said the cat sat on it .",
        "a dog barked loudly .",
        "nothing new here .",
        "",
    ]
    scores = [0.9, 0.8, 0.7, 0.6, 0.95, 0.99]  # slot 5 is padding, slot 4 an empty sentence
    # by score: 4 (empty, skipped), 0, 1 (shares "the cat sat": blocked), 2, 3
    assert select_sentences(scores, sents, 3) == [0, 2, 3]
    assert select_sentences(scores, sents, 3, block_trigrams=False) == [0, 1, 2]
    assert select_sentences(scores, sents, 2) == [0, 2]
    assert select_sentences([0.5, 0.5, 0.5], ["a b c", "d e f", "g h i"], 2) == [0, 1]  # ties
    with pytest.raises(InputError):
        select_sentences(scores, sents, 0)


# -- model and backbone folder ---------------------------------------------------------------------
def test_backbone_folder_round_trip_offline(tiny_backbone):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    names = {p.name for p in tiny_backbone.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "fedrepro_backbone.json",
    } <= names
    tok1, m1 = load_bertsum(tiny_backbone, seed=5)
    tok2, m2 = load_bertsum(tiny_backbone, seed=5)
    assert tok1("The cat sat.")["input_ids"] == tok2("The cat sat.")["input_ids"]
    assert tok1.convert_ids_to_tokens(tok1("The cat")["input_ids"])[0] == "[CLS]"
    assert tok1.pad_token_id == 0
    for (k1, v1), (k2, v2) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)
    _, m3 = load_bertsum(tiny_backbone, seed=6)  # another seed: another head, same encoder
    assert not torch.equal(m1.head.linear1.weight, m3.head.linear1.weight)
    assert torch.equal(
        m1.representation.encoder.embeddings.word_embeddings.weight,
        m3.representation.encoder.embeddings.word_embeddings.weight,
    )
    assert (
        not hasattr(m1.representation.encoder, "pooler") or m1.representation.encoder.pooler is None
    )


def test_forward_backward_and_theta_omega_split(tiny_backbone):
    tok, model = load_bertsum(tiny_backbone, seed=1)
    docs = encode_records(
        records(4),
        tok,
        {
            r["id"]: {"sentences": r["meta"]["sentences"], "labels": [1, 0, 0, 1]}
            for r in records(4)
        },
    )
    batch = make_batches(docs, 4)[0]
    model.train()
    scores = model(batch)
    assert scores.shape == batch.labels.shape
    assert torch.all(scores[~batch.cls_mask] == 0) and torch.all((scores >= 0) & (scores <= 1))
    h, logits = model.logits(batch)
    assert h.shape == (*batch.labels.shape, 16)
    lm = sentence_loss_matrix(logits, batch.labels, batch.cls_mask)
    expected = (
        torch.nn.functional.binary_cross_entropy(
            torch.sigmoid(logits), batch.labels, reduction="none"
        )
        * batch.cls_mask
    )
    assert torch.allclose(lm, expected, atol=1e-5)
    loss = data_loss(lm)
    assert torch.isclose(loss, lm.sum() / 4)
    loss.backward()
    assert model.head.linear1.weight.grad.abs().sum() > 0
    assert model.representation.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    theta, omega = model.representation_state(), model.head_state()
    assert set(omega) == {"linear1.weight", "linear1.bias"}
    assert len(theta) + len(omega) == len(list(model.parameters()))
    fed = model.federated_state()
    assert set(fed) == {k for k, _ in model.named_parameters()}
    # loading: a perturbed Ω round-trips; a wrong key set is a clear error
    new = {k: v + 1.0 for k, v in fed.items()}
    model.load_federated_state(new)
    assert all(torch.equal(model.federated_state()[k], new[k]) for k in new)
    with pytest.raises(InputError, match="keys differ"):
        model.load_head_state({"linear1.weight": omega["linear1.weight"]})
    preds = predict_extractive(model, make_batches(docs, 2), n=2)
    assert len(preds) == 4 and all(len(p["selected"]) == 2 for p in preds)
    assert preds[0]["summary"].startswith(docs[0].sentences[preds[0]["selected"][0]])


def test_load_rejects_non_backbone_folder(tmp_path):
    with pytest.raises(InputError, match="no config.json"):
        load_bert_backbone(tmp_path)


def test_download_fails_fast_offline_naming_the_hub_id(tmp_path):
    start = time.monotonic()
    with pytest.raises(InputError, match=BERT_HUB_ID) as err:
        download_bert_backbone(tmp_path / "bert")
    assert "backbones.bert-base.local_dir" in str(err.value)
    assert time.monotonic() - start < 5
    assert not (tmp_path / "bert").exists()


def test_encoder_class_is_transformers_bert(tiny_backbone):
    _, model = load_bertsum(tiny_backbone)
    assert type(model.representation.encoder).__name__ == "BertModel"
    assert isinstance(model, BertSumExt)


_TRAIN_IN_A_FRESH_PROCESS = """
import hashlib, sys
from fedrepro.papers.fedsum.model import train_wordpiece_tokenizer
texts = [f"the {w} committee discussed {w}s and budgets; members agreed on item {i}"
         for i, w in enumerate(["motion", "notion", "station", "ration", "nation", "lotion"] * 5)]
train_wordpiece_tokenizer(texts, 120, sys.argv[1])
print(hashlib.sha256(open(sys.argv[1] + "/tokenizer.json", "rb").read()).hexdigest())
"""


def test_wordpiece_tokenizer_is_the_same_in_every_process(tmp_path):
    """Same texts, same tokenizer bytes across processes (the library trainer's hash-map order
    made each process learn another vocabulary, and so other FedSum numbers)."""
    import subprocess
    import sys

    digests = {
        subprocess.run(
            [sys.executable, "-c", _TRAIN_IN_A_FRESH_PROCESS, str(tmp_path / f"tok{i}")],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout.strip()
        for i in range(3)
    }
    assert len(digests) == 1


def test_wordpiece_vocab_covers_every_word_without_unk():
    from fedrepro.papers.fedsum.model import BERT_SPECIAL_TOKENS, wordpiece_vocab

    vocab = wordpiece_vocab(["Zebras zig-zag; the zebra's ZIGZAG.", "the the the"], 40)
    assert vocab[: len(BERT_SPECIAL_TOKENS)] == BERT_SPECIAL_TOKENS
    assert len(vocab) == len(set(vocab)) == 40
    assert {"z", "t", "##e", "##s", "the"} <= set(vocab)


# -- kind: shape ---------------------------------------------------------------------------------
def _small_shape_model(arch, seed=0):
    """The description's BertModel with small widths (vocabulary and special ids kept): the
    dispatch and folder layout without a 440 MB build (the true-size build and its exact
    parameter count are tested in test_backbones.py)."""
    from transformers import BertModel

    from fedrepro.models.shapes import shape_config

    cfg = shape_config(arch)
    cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads = 16, 1, 2
    cfg.intermediate_size = 32
    torch.manual_seed(seed)
    return BertModel(cfg, add_pooling_layer=True)


def test_shape_bert_vocabulary_has_the_real_special_ids_and_size():
    from fedrepro.papers.fedsum.model import bert_hub_layout, wordpiece_vocab

    texts = [r["input"] for r in records()]
    vocab = bert_hub_layout(wordpiece_vocab(texts, 30522), 30522)
    assert len(vocab) == len(set(vocab)) == 30522
    assert [vocab.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
        0, 100, 101, 102, 103]  # bert-base-uncased's vocab.txt
    tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    ids = tok("The cat sat on the mat.")["input_ids"]
    assert ids[0] == 101 and ids[-1] == 102 and 100 not in ids
    assert tok("[unused150]")["input_ids"][1] != vocab.index("[unused150]")  # fillers never match


def test_prepare_bert_backbone_shape(tmp_path, monkeypatch):
    import json

    from fedrepro.models import shapes
    from fedrepro.papers.fedsum.grid import bert_settings, bert_train_files
    from fedrepro.papers.fedsum.task import prepare_bert_backbone

    cfg = {"fedsum": {"datasets": ["cnndm"]}, "backbones": {"bert-base": {"kind": "shape"}}}
    settings = bert_settings(cfg)
    assert settings["kind"] == "shape" and settings["hub_id"] == BERT_HUB_ID
    assert bert_train_files(cfg) == ["results/data/cnndm/records.jsonl"]
    with pytest.raises(InputError, match="'hub', 'tiny' or 'shape'"):
        bert_settings({"backbones": {"bert-base": {"kind": "huge"}}})
    data = tmp_path / "records.jsonl"
    write_jsonl_atomic(data, [dict(r, split="train") for r in records()])
    monkeypatch.setattr(shapes, "build_shape_model", _small_shape_model)
    out = prepare_bert_backbone(dict(settings), [str(data)], str(tmp_path / "bert-base"))
    meta = json.loads((out / "fedrepro_backbone.json").read_text())
    assert (meta["kind"], meta["hub_id"], meta["weights"]) == ("shape", BERT_HUB_ID, shapes.SHAPE_NOTE)
    tok, model = load_bertsum(out)
    assert len(tok) == model.representation.encoder.config.vocab_size == 30522
    assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id) == (0, 101, 102)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]


def test_encode_records_drops_short_sentences_and_reports_original_positions(word_tokenizer):
    """BertSum's short-sentence filter (issue 14, item 4): sentences of at most
    ``short_sentence_tokens`` tokens leave the model's input, labels follow, and selections come
    back as indices of ``meta.sentences``."""
    sents = [
        "the cat sat on the mat .",  # 7 tokens
        "a big red ball .",  # 5: dropped at 5
        "the dog ran far away .",  # 6
        "the cat ran .",  # 4: dropped
        "a big dog sat on the mat .",  # 8
    ]
    rec = {"id": "d", "input": " ".join(sents), "target": "the cat", "meta": {"sentences": sents}}
    oracle = {"d": {"sentences": sents, "labels": [1, 0, 0, 0, 1]}}
    (doc,) = encode_records([rec], word_tokenizer, oracle, max_tokens=128, short_sentence_tokens=5)
    assert doc.sentences == [sents[0], sents[2], sents[4]]
    assert doc.positions == [0, 2, 4] and doc.labels == [1, 0, 1]
    assert len(doc.cls_positions) == 3
    (unfiltered,) = encode_records([rec], word_tokenizer, oracle, max_tokens=128)
    assert unfiltered.positions == [0, 1, 2, 3, 4] and unfiltered.labels == [1, 0, 0, 0, 1]
    stale = {"d": {"sentences": sents, "labels": [0, 1, 0, 0, 0]}}  # a label on a dropped one
    with pytest.raises(InputError, match="short_sentence_tokens"):
        encode_records([rec], word_tokenizer, stale, short_sentence_tokens=5)

    class Scores(torch.nn.Module):  # prefers the last kept sentence, then the first
        def forward(self, batch):
            return torch.tensor([[0.5, 0.1, 0.9]])

    (pred,) = predict_extractive(Scores(), [collate([doc])], n=2, block_trigrams=False)
    assert pred["selected"] == [4, 0]  # meta.sentences indices, in selection order
    assert pred["sentences"] == [sents[4], sents[0]]
    assert pred["summary"] == f"{sents[4]} {sents[0]}"
