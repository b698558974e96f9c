"""BERTSUM extractive summarizer (Liu & Lapata 2019, "Text Summarization with Pretrained Encoders"),
the model of every FedSum experiment, split into FedSum's representation model and head.

Input (Liu & Lapata §3.1, BertSum's ``BertData``): every sentence becomes ``[CLS] tokens [SEP]``,
the sentences are concatenated, and *interval segment ids* alternate per sentence (E_A for odd,
E_B for even sentences: 0, 1, 0, …).  The vector of sentence s is the top-layer encoder state at
its ``[CLS]`` position.  BertSum's ``Classifier`` scores it: ``sigmoid(W·v + b)``, zeroed at
padded sentence slots.

FedSum §3 splits a summarizer f(Ω) = h(ω, r(θ, ·)) into the representation model r(θ) and the
classification head h(ω).  Here:

* r(θ) = :class:`SentenceRepresentation` -- the ``BertModel`` encoder + the gather of the
  ``[CLS]`` states (sentence vectors, zero at padded slots; FedSum's H_j and the "hidden
  representation of sentences" of eq. 3–4);
* h(ω) = :class:`SentenceClassifier` -- BertSum's linear + sigmoid ``Classifier``.

:class:`BertSumExt` holds both as ``model.representation`` and ``model.head`` and exposes
``representation_state()`` / ``head_state()`` and their loaders.

Backbone folders (one loading path for both scales, ``from_pretrained`` on a directory):

* paper scale: ``google-bert/bert-base-uncased`` (:data:`BERT_HUB_ID`), fetched with
  :func:`download_bert_backbone`, which fails within seconds offline and names the hub id;
* demo scale: :func:`build_tiny_bert_backbone` -- a WordPiece tokenizer trained locally with
  ``tokenizers`` (BERT's uncased normalizer and pre-tokenizer) wrapped as ``BertTokenizerFast``,
  and a randomly initialised small ``BertModel``; both saved with ``save_pretrained``.

Choices the paper leaves open (all ours; also in ``docs/decisions-fedsum.md``)
-----------------------------------------------------------------------------
* **Truncation.**  Each sentence is cut to ``max_sentence_tokens`` word pieces (BertSum cuts to
  200 *words* per sentence at preprocessing), the sequence to ``max_tokens`` (512, BERT's limit)
  with a final ``[SEP]``, as BertSum's loader does (``src[:-1][:max_pos-1] + [SEP]``).  A sentence
  is kept when its ``[CLS]`` survives the cut; the labels are cut to the kept sentences.
* **Short sentences.**  As BertSum's preprocessing (``min_src_ntokens``), :func:`encode_records`
  drops the sentences of at most ``short_sentence_tokens`` whitespace tokens (the rule of
  :func:`fedrepro.data.oracle.kept_sentences`, which also zeroes their oracle labels) from
  training and test documents alike; every encoded sentence remembers its index in
  ``meta.sentences`` (``positions``), and selections are reported in those indices.
* **Loss.**  ℓ = binary cross entropy per sentence (BertSum's ``BCELoss(reduction="none")``),
  computed from the logits (``binary_cross_entropy_with_logits``: the same value, without the
  saturation of BCE on sigmoid outputs).  L_data = Σ_b Σ_c LM[b][c] / B (FedSum Alg. 2 line 7):
  a sum over sentences, a mean over documents.
* **Head initialisation.**  As BertSum: Xavier-uniform weight; the bias keeps ``nn.Linear``'s
  uniform(±1/√H) -- both drawn from a generator seeded by the caller's seed.
* **Test-time selection.**  BertSum's: sentences by descending score (ties by position: a stable
  sort), skipping one that shares a word trigram with an already selected sentence
  (``_block_tri``, on whitespace tokens -- lower-cased, as BertSum's preprocessed text is), until n
  are selected; sentences cut off by truncation cannot be selected.  The selection is returned
  in selection (score) order, as BertSum writes its candidates.
* **The tiny backbone is not pre-trained** (demo scale): FedSum fine-tunes every encoder
  parameter, and the FedSum authors' own code has a randomly initialised 2-layer BERT variant.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from fedrepro.io import InputError, atomic_dir, read_jsonl, write_json_atomic

BERT_HUB_ID = "google-bert/bert-base-uncased"
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] = 0, as BERT's vocab

#: Demo-scale BertConfig values (``tiny`` of :func:`build_tiny_bert_backbone` overrides them).
TINY_BERT_DEFAULTS = {
    "vocab_size": 2000,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
}


# -- backbone folders ------------------------------------------------------------------------------
def wordpiece_vocab(texts: Iterable[str], vocab_size: int) -> list[str]:
    """A WordPiece vocabulary learnt from ``texts``, the same list in every process.

    Hand-written because the ``tokenizers`` WordPiece trainer is not deterministic: its ``##``
    continuation pieces get ids in hash-map order, so merges with equal counts are taken in a
    different order in each process (four runs on the demo's FedSum text gave four different
    vocabularies), and the demo's BERT backbone -- and every FedSum number after it -- changed from
    run to run. Words are split exactly as bert-base-uncased's tokenizer splits them
    (``BertNormalizer(lowercase)``, ``BertPreTokenizer``); the vocabulary is the special tokens,
    every word-initial character and every ``##`` continuation character (so any word
    tokenizes without ``[UNK]``), then whole words, word beginnings and ``##`` word endings by
    how many word occurrences they cover (ties: alphabetical) up to ``vocab_size``.
    """
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers

    norm = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(text)))
    initial = sorted({w[0] for w in counts})
    continuation = sorted({"##" + c for w in counts for c in w[1:]})
    vocab = list(dict.fromkeys([*BERT_SPECIAL_TOKENS, *initial, *continuation]))
    pieces: Counter[str] = Counter()
    for word, n in counts.items():
        pieces[word] += n
        for k in range(2, len(word)):
            pieces[word[:k]] += n  # a word's beginning
            pieces["##" + word[k:]] += n  # the rest of it, as a continuation piece
    known = set(vocab)
    for piece, _ in sorted(pieces.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= vocab_size:
            break
        if piece not in known:
            vocab.append(piece)
            known.add(piece)
    return vocab


def train_wordpiece_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike):
    """Train an uncased WordPiece tokenizer on ``texts`` and save it as ``BertTokenizerFast``.

    The pipeline is bert-base-uncased's (``BertNormalizer(lowercase)``, ``BertPreTokenizer``,
    WordPiece with ``##`` continuation, ``[CLS] … [SEP]`` template), so the saved folder loads with
    ``AutoTokenizer.from_pretrained`` exactly like the real checkpoint's. The vocabulary is
    :func:`wordpiece_vocab` (deterministic: same texts, same tokenizer bytes).
    """
    from transformers import BertTokenizerFast

    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise InputError("train_wordpiece_tokenizer: no non-empty training text given")
    vocab = wordpiece_vocab(texts, int(vocab_size))
    bert_tok = BertTokenizerFast(vocab={tok: i for i, tok in enumerate(vocab)}, do_lower_case=True)
    bert_tok.save_pretrained(out_dir)
    return bert_tok


def build_tiny_bert_backbone(
    texts: Sequence[str],
    out_dir: str | os.PathLike,
    tiny: Mapping | None = None,
    seed: int = 0,
) -> Path:
    """Write a demo-scale BERT backbone folder: locally trained WordPiece tokenizer + small
    randomly initialised ``BertModel`` (no pooler), both via ``save_pretrained``.

    ``tiny`` overrides :data:`TINY_BERT_DEFAULTS` (``vocab_size`` is the tokenizer's target size;
    the model gets the trained vocabulary's actual size).  Assembled in a temporary sibling folder
    and renamed into place.
    """
    from transformers import BertConfig, BertModel

    cfg = dict(TINY_BERT_DEFAULTS)
    unknown = set(tiny or {}) - set(cfg)
    if unknown:
        raise InputError(
            f"tiny BERT settings: unknown keys {sorted(unknown)}; known: {sorted(cfg)}"
        )
    cfg.update(tiny or {})
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        tokenizer = train_wordpiece_tokenizer(texts, int(cfg["vocab_size"]), tmp)
        config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=int(cfg["hidden_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=int(cfg["num_attention_heads"]),
            intermediate_size=int(cfg["intermediate_size"]),
            max_position_embeddings=int(cfg["max_position_embeddings"]),
            hidden_dropout_prob=float(cfg["hidden_dropout_prob"]),
            attention_probs_dropout_prob=float(cfg["attention_probs_dropout_prob"]),
            type_vocab_size=2,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(seed)
        BertModel(config, add_pooling_layer=False).save_pretrained(tmp)
        write_json_atomic(
            tmp / "fedrepro_backbone.json",
            {
                "name": "bert-tiny",
                "scale": "tiny",
                "tiny": cfg,
                "seed": seed,
                "vocab_size": len(tokenizer),
            },
        )
    return out_dir


def bert_hub_layout(vocab: Sequence[str], vocab_size: int) -> list[str]:
    """``vocab`` (a :func:`wordpiece_vocab`) rearranged as bert-base-uncased's ``vocab.txt``:
    ``[PAD]`` 0, ``[unused0]``..``[unused98]`` 1-99, ``[UNK]`` 100, ``[CLS]`` 101, ``[SEP]`` 102,
    ``[MASK]`` 103, then the learnt entries, then ``[unused99]``, ``[unused100]``, ... filling it
    to exactly ``vocab_size`` entries (they never match text: BERT's pre-tokenizer splits
    brackets off).  Entries beyond ``vocab_size`` are dropped."""
    learnt = [t for t in vocab if t not in BERT_SPECIAL_TOKENS]
    head = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    body = [t for t in learnt if t not in set(head)][: max(vocab_size - len(head), 0)]
    fill = vocab_size - len(head) - len(body)
    return head + body + [f"[unused{99 + i}]" for i in range(fill)]


def build_shape_bert_backbone(
    texts: Sequence[str],
    out_dir: str | os.PathLike,
    hub_id: str = BERT_HUB_ID,
    seed: int = 0,
) -> Path:
    """Write a ``kind: shape`` BERT folder: ``hub_id``'s architecture (the registry's
    description, :data:`fedrepro.models.shapes.ARCHITECTURES`) at its true dimensions with random
    weights (a ``BertModel`` with pooler, 109,482,240 parameters for bert-base-uncased), and an
    uncased WordPiece tokenizer learnt from (the first characters of) ``texts`` laid out as the
    real ``vocab.txt`` (:func:`bert_hub_layout`: the special tokens at their real ids, exactly the
    model's vocabulary size).  Shapes, memory and speed only, not results."""
    from transformers import BertTokenizerFast

    from fedrepro.models.shapes import architecture, capped_texts, write_shape_backbone

    arch = architecture(hub_id, "backbones.bert-base.hub_id")
    if arch.config["model_type"] != "bert":
        raise InputError(f"backbones.bert-base.hub_id: {hub_id} is not a BERT checkpoint")
    texts = capped_texts(texts)
    if not texts:
        raise InputError("backbones.bert-base: no training text to learn the tokenizer from")
    size = int(arch.config["vocab_size"])

    def write_tokenizer(tmp: Path):
        vocab = bert_hub_layout(wordpiece_vocab(texts, size), size)
        tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
        tok.save_pretrained(tmp)
        return tok

    return write_shape_backbone(arch, out_dir, write_tokenizer, "bert-base", seed)


def download_bert_backbone(
    dest: str | os.PathLike,
    hub_id: str = BERT_HUB_ID,
    revision: str = "main",
    timeout: float = 10.0,
) -> Path:
    """Fetch the paper-scale BERT (``hub_id`` at ``revision``) into ``dest`` (model + tokenizer).

    Fails within about ``timeout`` seconds when the hub cannot be reached (immediately when
    ``HF_HUB_OFFLINE`` is set) with an :class:`~fedrepro.io.InputError` naming the hub id, the
    revision and the config key for a local copy (``backbones.bert-base.local_dir``).
    """
    from fedrepro.models.backbones import download_snapshot

    key = "backbones.bert-base.local_dir"
    return download_snapshot(hub_id, revision, dest, key, timeout=timeout)


def load_bert_backbone(path: str | os.PathLike):
    """(tokenizer, ``BertModel`` without pooler) from a backbone folder -- both scales."""
    from transformers import AutoConfig, AutoTokenizer, BertModel

    path = Path(path)
    if not (path / "config.json").exists():
        raise InputError(
            f"{path}: not a backbone folder (no config.json); build the tiny backbone "
            f"or download {BERT_HUB_ID} (download_bert_backbone)"
        )
    config = AutoConfig.from_pretrained(path)
    if config.model_type != "bert":
        raise InputError(
            f"{path}: BERTSUM needs a BERT checkpoint, got model_type {config.model_type!r}"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    for name in ("cls_token_id", "sep_token_id", "pad_token_id"):
        if getattr(tokenizer, name) is None:
            raise InputError(f"{path}: tokenizer has no {name[:-3]} ([CLS]/[SEP]/[PAD] needed)")
    encoder = BertModel.from_pretrained(path, add_pooling_layer=False)
    return tokenizer, encoder


# -- model -----------------------------------------------------------------------------------------
class SentenceRepresentation(nn.Module):
    """r(θ): BERT encoder → top-layer state at each ``[CLS]`` (zero at padded sentence slots)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    @property
    def hidden_size(self) -> int:
        return int(self.encoder.config.hidden_size)

    def forward(self, input_ids, attention_mask, token_type_ids, cls_positions, cls_mask):
        top = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        rows = torch.arange(top.size(0), device=top.device).unsqueeze(1)
        return top[rows, cls_positions] * cls_mask.unsqueeze(-1).to(top.dtype)


class SentenceClassifier(nn.Module):
    """h(ω): BertSum's ``Classifier`` -- ``sigmoid(linear(v))`` per sentence, 0 at padding."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear1 = nn.Linear(hidden_size, 1)

    def logits(self, sentence_vectors: torch.Tensor) -> torch.Tensor:
        return self.linear1(sentence_vectors).squeeze(-1)

    def forward(self, sentence_vectors: torch.Tensor, cls_mask: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(sentence_vectors)) * cls_mask.to(sentence_vectors.dtype)

    def reset_parameters(self, seed: int) -> None:
        """BertSum's init: Xavier-uniform weight; bias uniform(±1/√H) (``nn.Linear``'s), seeded."""
        g = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            nn.init.xavier_uniform_(self.linear1.weight, generator=g)
            bound = 1.0 / math.sqrt(self.linear1.in_features)
            self.linear1.bias.uniform_(-bound, bound, generator=g)


def _check_state(own: Mapping[str, torch.Tensor], got: Mapping[str, torch.Tensor], what: str):
    if set(own) != set(got):
        raise InputError(
            f"{what} state keys differ: missing {sorted(set(own) - set(got))[:5]}, "
            f"unexpected {sorted(set(got) - set(own))[:5]}"
        )
    for k, v in got.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise InputError(f"{what} state {k}: shape {tuple(v.shape)} != {tuple(own[k].shape)}")


class BertSumExt(nn.Module):
    """BERTSUM = h(ω, r(θ, ·)) with r = ``self.representation`` and h = ``self.head``.

    ``forward(batch)`` → sentence scores in [0, 1] (B × S, 0 at padding);
    ``sentence_vectors(batch)`` → H (B × S × hidden); ``logits(batch)`` → (H, logits).
    """

    def __init__(self, encoder: nn.Module, head_seed: int = 0):
        super().__init__()
        self.representation = SentenceRepresentation(encoder)
        self.head = SentenceClassifier(self.representation.hidden_size)
        self.head.reset_parameters(head_seed)

    def sentence_vectors(self, batch: BertSumBatch) -> torch.Tensor:
        return self.representation(
            batch.input_ids,
            batch.attention_mask,
            batch.token_type_ids,
            batch.cls_positions,
            batch.cls_mask,
        )

    def logits(self, batch: BertSumBatch) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.sentence_vectors(batch)
        return h, self.head.logits(h)

    def forward(self, batch: BertSumBatch) -> torch.Tensor:
        return self.head(self.sentence_vectors(batch), batch.cls_mask)

    # FedSum's θ / ω
    def representation_state(self) -> OrderedDict[str, torch.Tensor]:
        """θ: every encoder parameter (detached copies), keys of ``self.representation``."""
        return OrderedDict(
            (k, p.detach().clone()) for k, p in self.representation.named_parameters()
        )

    def head_state(self) -> OrderedDict[str, torch.Tensor]:
        """ω: the classifier's weight and bias (detached copies)."""
        return OrderedDict((k, p.detach().clone()) for k, p in self.head.named_parameters())

    def load_representation_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self._load(self.representation, state, "representation (θ)")

    def load_head_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self._load(self.head, state, "head (ω)")

    def federated_state(self) -> OrderedDict[str, torch.Tensor]:
        """Ω = {θ, ω}, keys prefixed ``representation.`` / ``head.`` (what FedAvg methods send)."""
        out = OrderedDict(
            (f"representation.{k}", v) for k, v in self.representation_state().items()
        )
        out.update((f"head.{k}", v) for k, v in self.head_state().items())
        return out

    def load_federated_state(self, state: Mapping[str, torch.Tensor]) -> None:
        rep = {
            k[len("representation.") :]: v
            for k, v in state.items()
            if k.startswith("representation.")
        }
        head = {k[len("head.") :]: v for k, v in state.items() if k.startswith("head.")}
        if len(rep) + len(head) != len(state):
            bad = [k for k in state if not k.startswith(("representation.", "head."))]
            raise InputError(
                f"federated state: keys without representation./head. prefix: {bad[:5]}"
            )
        self.load_representation_state(rep)
        self.load_head_state(head)

    @staticmethod
    def _load(module: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
        own = dict(module.named_parameters())
        _check_state(own, state, what)
        with torch.no_grad():
            for k, p in own.items():
                p.copy_(state[k])


def load_bertsum(backbone_dir: str | os.PathLike, seed: int = 0):
    """(tokenizer, :class:`BertSumExt`) from a backbone folder; the head is drawn from ``seed``."""
    tokenizer, encoder = load_bert_backbone(backbone_dir)
    return tokenizer, BertSumExt(encoder, head_seed=seed)


# -- losses ----------------------------------------------------------------------------------------
def sentence_loss_matrix(logits: torch.Tensor, labels: torch.Tensor, cls_mask: torch.Tensor):
    """LM[b][c] = ℓ(φ̂_bc, φ_bc), binary cross entropy per sentence, 0 at padded slots (FedSum
    Alg. 2 line 4; BertSum's ``BCELoss(reduction='none')`` masked by ``mask_cls``)."""
    loss = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    return loss * cls_mask.to(loss.dtype)


def data_loss(loss_matrix: torch.Tensor) -> torch.Tensor:
    """L_data = Σ_b Σ_c LM[b][c] / B (FedSum Alg. 2 line 7)."""
    return loss_matrix.sum() / loss_matrix.shape[0]


# -- inputs ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EncodedDocument:
    """One document as BERTSUM input (before padding)."""

    id: str
    input_ids: list[int]
    token_type_ids: list[int]
    cls_positions: list[int]
    labels: list[int]  # one per kept sentence (zeros when the document has no labels)
    sentences: list[str]  # the kept sentences
    target: str = ""
    positions: list[int] | None = None  # index of each kept sentence in meta.sentences (None: 0, 1, …)


@dataclasses.dataclass(frozen=True)
class BertSumBatch:
    """A padded batch.  ``cls_positions`` is 0 at padded sentence slots (masked by ``cls_mask``);
    ``labels`` is 0 there.  Text fields serve test-time selection."""

    input_ids: torch.Tensor  # B × L (long)
    attention_mask: torch.Tensor  # B × L (long)
    token_type_ids: torch.Tensor  # B × L (long), interval segments
    cls_positions: torch.Tensor  # B × S (long)
    cls_mask: torch.Tensor  # B × S (bool)
    labels: torch.Tensor  # B × S (float)
    ids: tuple[str, ...]
    sentences: tuple[tuple[str, ...], ...]
    targets: tuple[str, ...]
    positions: tuple[tuple[int, ...], ...] = ()  # per document, meta.sentences index per sentence

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def encode_document(
    tokenizer,
    sentences: Sequence[str],
    labels: Sequence[int] | None = None,
    max_tokens: int = 512,
    max_sentence_tokens: int | None = 200,
    doc_id: str = "",
    target: str = "",
    positions: Sequence[int] | None = None,
) -> EncodedDocument:
    """``[CLS] s1 [SEP] [CLS] s2 [SEP] …`` with interval segments 0/1/0/…, truncated (module
    docstring).  ``labels`` (0/1 per sentence) and ``positions`` (each sentence's index in the
    record's ``meta.sentences``; default 0, 1, …) are cut to the kept sentences."""
    if not sentences:
        raise InputError(f"document {doc_id!r}: no sentences")
    if labels is not None and len(labels) != len(sentences):
        raise InputError(
            f"document {doc_id!r}: {len(labels)} labels for {len(sentences)} sentences"
        )
    if positions is not None and len(positions) != len(sentences):
        raise InputError(
            f"document {doc_id!r}: {len(positions)} positions for {len(sentences)} sentences"
        )
    if max_tokens < 3:
        raise InputError(f"max_tokens must be >= 3, got {max_tokens}")
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    pieces = tokenizer(list(sentences), add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    segs: list[int] = []
    clss: list[int] = []
    for i, toks in enumerate(pieces):
        if max_sentence_tokens is not None:
            toks = toks[:max_sentence_tokens]
        clss.append(len(ids))
        span = [cls_id, *toks, sep_id]
        ids.extend(span)
        segs.extend([i % 2] * len(span))
    if len(ids) > max_tokens:
        ids = ids[: max_tokens - 1] + [sep_id]
        segs = segs[:max_tokens]
    kept = sum(1 for c in clss if c < len(ids) - 1)
    return EncodedDocument(
        id=doc_id,
        input_ids=ids,
        token_type_ids=segs,
        cls_positions=clss[:kept],
        labels=[int(x) for x in (labels[:kept] if labels is not None else [0] * kept)],
        sentences=list(sentences[:kept]),
        target=target,
        positions=[int(p) for p in (positions[:kept] if positions is not None else range(kept))],
    )


def collate(docs: Sequence[EncodedDocument], pad_token_id: int = 0) -> BertSumBatch:
    """Pad documents into a :class:`BertSumBatch`."""
    if not docs:
        raise InputError("collate: empty batch")
    length = max(len(d.input_ids) for d in docs)
    nsent = max(len(d.cls_positions) for d in docs)
    b = len(docs)
    input_ids = torch.full((b, length), int(pad_token_id), dtype=torch.long)
    attention = torch.zeros((b, length), dtype=torch.long)
    segs = torch.zeros((b, length), dtype=torch.long)
    clss = torch.zeros((b, nsent), dtype=torch.long)
    cls_mask = torch.zeros((b, nsent), dtype=torch.bool)
    labels = torch.zeros((b, nsent), dtype=torch.float32)
    for i, d in enumerate(docs):
        n, s = len(d.input_ids), len(d.cls_positions)
        input_ids[i, :n] = torch.tensor(d.input_ids)
        attention[i, :n] = 1
        segs[i, :n] = torch.tensor(d.token_type_ids)
        clss[i, :s] = torch.tensor(d.cls_positions)
        cls_mask[i, :s] = True
        labels[i, :s] = torch.tensor(d.labels, dtype=torch.float32)
    return BertSumBatch(
        input_ids,
        attention,
        segs,
        clss,
        cls_mask,
        labels,
        ids=tuple(d.id for d in docs),
        sentences=tuple(tuple(d.sentences) for d in docs),
        targets=tuple(d.target for d in docs),
        positions=tuple(
            tuple(d.positions if d.positions is not None else range(len(d.sentences)))
            for d in docs
        ),
    )


def load_oracle_labels(path: str | os.PathLike) -> dict[str, dict]:
    """``{id: {"sentences": [...], "labels": [...]}}`` from an ``oracle_labels.jsonl`` file."""
    out: dict[str, dict] = {}
    for lineno, rec in enumerate(read_jsonl(path), start=1):
        rid, sents, labels = rec.get("id"), rec.get("sentences"), rec.get("labels")
        if rid is None or not isinstance(sents, list) or not isinstance(labels, list):
            raise InputError(f"{path}: record {lineno} lacks id/sentences/labels")
        if len(sents) != len(labels) or any(x not in (0, 1) for x in labels):
            raise InputError(f"{path}: record {rid}: labels must be 0/1, one per sentence")
        out[rid] = {"sentences": sents, "labels": labels}
    return out


REFERENCE_SENTENCE_KEYS = ("highlights", "abstract_sentences", "headline_sentences")
"""``meta`` keys holding a record's reference summary as sentences (CNN/DM, PubMed, WikiHow)."""


def reference_sentences(record: Mapping) -> list[str]:
    """The reference summary as its sentences (``meta.highlights`` / ``abstract_sentences`` /
    ``headline_sentences``), else the whole ``target`` as one (Reddit TIFU's one-line TL;DR)."""
    meta = record.get("meta") or {}
    for key in REFERENCE_SENTENCE_KEYS:
        sents = meta.get(key)
        if isinstance(sents, list) and any(isinstance(x, str) and x.strip() for x in sents):
            return [x for x in sents if isinstance(x, str) and x.strip()]
    return [str(record.get("target", ""))]


def encode_records(
    records: Iterable[Mapping],
    tokenizer,
    oracle: Mapping[str, Mapping] | None = None,
    max_tokens: int = 512,
    max_sentence_tokens: int | None = 200,
    short_sentence_tokens: int = 0,
) -> list[EncodedDocument]:
    """Encode normalized records ``{id, input, target, meta: {sentences}}``.

    ``oracle`` (from :func:`load_oracle_labels`) gives each record's labels; a record missing from
    it, or whose oracle sentences differ from ``meta.sentences`` (a stale oracle file), is an
    error naming the record.  Without ``oracle`` every label is 0 (test-time encoding).
    ``short_sentence_tokens`` > 0 drops the sentences of at most that many tokens (BertSum's
    ``min_src_ntokens``, :func:`fedrepro.data.oracle.kept_sentences`); a positive label on a
    dropped sentence means the oracle file was made with another threshold (an error).
    """
    from fedrepro.data.oracle import kept_sentences

    out = []
    for rec in records:
        rid = rec.get("id")
        sents = (rec.get("meta") or {}).get("sentences")
        if not sents:
            raise InputError(
                f"record {rid!r} has no meta.sentences (BERTSUM needs sentence splits)"
            )
        labels = None
        if oracle is not None:
            if rid not in oracle:
                raise InputError(
                    f"record {rid!r} has no oracle labels; rerun the oracle_labels rule"
                )
            if list(oracle[rid]["sentences"]) != list(sents):
                raise InputError(
                    f"record {rid!r}: oracle sentences differ from meta.sentences "
                    f"(stale oracle_labels.jsonl); rerun the oracle_labels rule"
                )
            labels = oracle[rid]["labels"]
        kept = kept_sentences(sents, short_sentence_tokens)
        if labels is not None:
            if len(labels) != len(sents):
                raise InputError(
                    f"record {rid!r}: {len(labels)} oracle labels for {len(sents)} sentences"
                )
            if any(labels[i] for i in set(range(len(sents))) - set(kept)):
                raise InputError(
                    f"record {rid!r}: a positive oracle label on a sentence of at most "
                    f"{short_sentence_tokens} tokens (the oracle file was made with another "
                    f"partitions.fedsum.short_sentence_tokens); rerun the oracle_labels rule"
                )
            labels = [labels[i] for i in kept]
        out.append(
            encode_document(
                tokenizer,
                [sents[i] for i in kept],
                labels,
                max_tokens,
                max_sentence_tokens,
                doc_id=str(rid),
                target=str(rec.get("target", "")),
                positions=kept,
            )
        )
    return out


def make_batches(
    docs: Sequence[EncodedDocument],
    batch_size: int,
    pad_token_id: int = 0,
    shuffle_seed: int | None = None,
) -> list[BertSumBatch]:
    """Cut ``docs`` into batches of ``batch_size`` (last one smaller), shuffled with
    ``shuffle_seed`` (a seeded permutation; None keeps the order)."""
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    order = list(range(len(docs)))
    if shuffle_seed is not None:
        g = torch.Generator().manual_seed(int(shuffle_seed))
        order = torch.randperm(len(docs), generator=g).tolist()
    return [
        collate([docs[i] for i in order[k : k + batch_size]], pad_token_id)
        for k in range(0, len(order), batch_size)
    ]


def epoch_batches(
    docs: Sequence[EncodedDocument],
    batch_size: int,
    seed: int,
    *salt: int | str,
    pad_token_id: int = 0,
) -> Callable[[int], list[BertSumBatch]]:
    """``f(epoch)`` → that epoch's batches, shuffled by ``derive_seed(seed, *salt, epoch)``
    (pass e.g. the client id and the round as ``salt``): what the local updates take."""
    from fedrepro.data.seq2seq import derive_seed

    def batches(epoch: int) -> list[BertSumBatch]:
        return make_batches(docs, batch_size, pad_token_id, derive_seed(seed, *salt, epoch))

    return batches


# -- test-time selection ---------------------------------------------------------------------------
def _trigrams(text: str) -> set[tuple[str, ...]]:
    toks = text.lower().split()
    return {tuple(toks[i : i + 3]) for i in range(len(toks) - 2)}


def has_trigram_overlap(candidate: str, selected: Iterable[str]) -> bool:
    """BertSum's ``_block_tri``: does ``candidate`` share a word trigram with a chosen sentence?"""
    tri = _trigrams(candidate)
    return any(tri & _trigrams(s) for s in selected)


def select_sentences(
    scores: Sequence[float] | torch.Tensor,
    sentences: Sequence[str],
    n: int,
    block_trigrams: bool = True,
) -> list[int]:
    """Indices of the top-``n`` sentences by score with trigram blocking, in selection order.

    ``scores`` may be longer than ``sentences`` (padded slots) -- those slots are never chosen.
    """
    if n < 1:
        raise InputError(f"number of sentences to extract must be >= 1, got {n}")
    s = torch.as_tensor(scores, dtype=torch.float64)[: len(sentences)]
    order = torch.sort(s, descending=True, stable=True).indices.tolist()
    chosen: list[int] = []
    texts: list[str] = []
    for j in order:
        cand = sentences[j].strip()
        if not cand:
            continue
        if block_trigrams and has_trigram_overlap(cand, texts):
            continue
        chosen.append(j)
        texts.append(cand)
        if len(chosen) == n:
            break
    return chosen


@torch.no_grad()
def predict_extractive(
    model: BertSumExt, batches: Iterable[BertSumBatch], n: int, block_trigrams: bool = True
) -> list[dict]:
    """Score and select per document: ``{"id", "selected", "sentences", "summary", "target"}``
    (``selected`` = the chosen sentences' indices in the record's ``meta.sentences``, in
    selection order; ``sentences`` = their text; summary = them joined by a space)."""
    was_training = model.training
    model.eval()
    out = []
    try:
        for batch in batches:
            scores = model(batch)
            for b, doc_id in enumerate(batch.ids):
                sel = select_sentences(scores[b], batch.sentences[b], n, block_trigrams)
                pos = batch.positions[b] if batch.positions else range(len(batch.sentences[b]))
                texts = [batch.sentences[b][j].strip() for j in sel]
                out.append(
                    {
                        "id": doc_id,
                        "selected": [int(pos[j]) for j in sel],
                        "sentences": texts,
                        "summary": " ".join(texts),
                        "target": batch.targets[b],
                    }
                )
    finally:
        model.train(was_training)
    return out
