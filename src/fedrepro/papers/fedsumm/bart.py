"""Chinese BART for FedSUMM (Pan et al., §III-A and §IV-B: "Bart-Base-Chinese … by Fudan University").

One loading path serves both scales: :func:`load_chinese_bart` calls ``from_pretrained`` on a folder
that holds a ``BertTokenizer`` vocabulary and a ``BartForConditionalGeneration`` checkpoint.

* **Paper scale**: ``fnlp/bart-base-chinese`` (CPT paper, the FedSUMM paper's [35]), downloaded at
  the pinned :data:`CHINESE_BART_REVISION` by :func:`download_chinese_bart`.
* **Demo scale**: :func:`build_tiny_chinese_bart` writes a tiny model of the same two classes with a
  *character-level* vocabulary built locally from the training texts (:func:`build_char_vocab`):
  every character the BERT pre-tokenizer sees becomes one token, and every non-CJK character
  also gets its ``##`` continuation piece, so a Latin word or a number splits into characters
  (``2010`` → ``2 ##0 ##1 ##0``) instead of becoming ``[UNK]``.

Special tokens follow the hub checkpoint: ``[PAD]`` pad, ``[CLS]`` bos, ``[SEP]`` eos and
decoder start, ``[UNK]``, ``[MASK]``.  The tokenizer is told to return only ``input_ids`` and
``attention_mask`` (BART takes no ``token_type_ids``).

Revision
--------
The hub repository was re-released on 2022-12-30 ("version 2.0": a new 51,271-token vocabulary and
1,024 positions instead of BERT's 21,128-token vocabulary and 512 positions).  FedSUMM was an ICASSP
2023 submission (deadline October 2022), so its experiments predate the re-release: we pin the last
commit of version 1, ``cac82280f9cafd2e7bb76fc32123717e335397ba`` ("Update README.md", 2021-10-31;
the v2 commit is ``4e93f21dca95a07747f434b0f9fe5d49cacc0441``).  Both SHAs were read from the hub's
public commit pages; **they are unverified by a download** from this offline machine.  Version 1
ships ``pytorch_model.bin`` (no safetensors), so the download allows ``*.bin``.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from fedrepro.io import InputError, atomic_dir, write_json_atomic, write_text_atomic

CHINESE_BART_HUB_ID = "fnlp/bart-base-chinese"
"""Hub id of the paper's backbone (FedSUMM §IV-B, [35])."""

CHINESE_BART_REVISION = "cac82280f9cafd2e7bb76fc32123717e335397ba"
"""Last commit of the version-1 release (BERT vocabulary, 21,128 tokens).  Unverified offline."""

CHINESE_BART_V2_REVISION = "4e93f21dca95a07747f434b0f9fe5d49cacc0441"
"""The 2022-12-30 re-release (51,271-token vocabulary); not the paper's.  Unverified offline."""

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""Ids 0..4 of the demo vocabulary (the hub vocabulary has them at other ids)."""

TOKENIZER_CONFIG = {
    "tokenizer_class": "BertTokenizer",
    "do_lower_case": False,
    "tokenize_chinese_chars": True,
    "strip_accents": None,
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
    "model_input_names": ["input_ids", "attention_mask"],
}
"""``tokenizer_config.json`` of the demo tokenizer (the hub's settings; no lower-casing)."""

DEFAULT_TINY = {
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "heads": 4,
    "ffn_dim": 128,
    "max_position_embeddings": 512,
    "max_vocab_size": None,
    "min_char_freq": 1,
}
"""Demo-scale architecture (keys of the ``tiny`` mapping :func:`build_tiny_chinese_bart` takes)."""

_DOWNLOAD_PATTERNS = ["*.json", "*.txt", "*.safetensors", "*.bin"]
LOCAL_DIR_KEY = "fedsumm.backbone.local_dir"
"""The config key of a local copy of the checkpoint (instead of the download)."""


def _is_cjk(ch: str) -> bool:
    """The code-point ranges BERT's tokenizer treats as Chinese characters (split one by one)."""
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _pre_tokenize(texts: Iterable[str]) -> Iterable[str]:
    """The words BertTokenizer's normalizer + pre-tokenizer (no lower-casing) make of ``texts``."""
    from tokenizers import normalizers, pre_tokenizers

    norm = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
    )
    pre = pre_tokenizers.BertPreTokenizer()
    for text in texts:
        for word, _ in pre.pre_tokenize_str(norm.normalize_str(text)):
            yield word


def build_char_vocab(
    texts: Iterable[str], min_freq: int = 1, max_size: int | None = None
) -> list[str]:
    """Character-level WordPiece vocabulary for ``BertTokenizer`` (demo scale).

    Parameters
    ----------
    texts : iterable of str
        Training inputs and targets.
    min_freq : int, default 1
        Characters seen fewer times are left out (they become ``[UNK]``; the copy distribution
        can still copy them from the source).
    max_size : int or None
        Upper bound on the vocabulary size, specials included; the most frequent entries are kept.

    Returns
    -------
    list of str
        :data:`SPECIAL_TOKENS`, then word-initial characters, then ``##`` continuation pieces
        (only for non-CJK characters, which BERT never splits off on their own); each group
        sorted by descending frequency, ties by code point.  Deterministic for the same texts.
    """
    if min_freq < 1:
        raise InputError(f"min_char_freq must be >= 1, got {min_freq}")
    initial: collections.Counter[str] = collections.Counter()
    continuation: collections.Counter[str] = collections.Counter()
    n_words = 0
    for word in _pre_tokenize(texts):
        n_words += 1
        initial[word[0]] += 1
        for ch in word[1:]:
            if not _is_cjk(ch):
                continuation[ch] += 1
    if n_words == 0:
        raise InputError("no characters to build a vocabulary from: the training texts are empty")

    def ranked(counter: collections.Counter[str], prefix: str) -> list[str]:
        kept = [(c, n) for c, n in counter.items() if n >= min_freq]
        kept.sort(key=lambda cn: (-cn[1], cn[0]))
        return [prefix + c for c, _ in kept]

    entries = ranked(initial, "")
    pieces = ranked(continuation, "##")
    vocab = list(SPECIAL_TOKENS) + entries + pieces
    if max_size is not None:
        if max_size <= len(SPECIAL_TOKENS):
            raise InputError(f"max_vocab_size must exceed {len(SPECIAL_TOKENS)}, got {max_size}")
        # interleave by frequency so a cap keeps the most frequent characters of both groups
        freq = {c: initial[c] for c in entries} | {p: continuation[p[2:]] for p in pieces}
        body = sorted(entries + pieces, key=lambda t: (-freq[t], t.startswith("##"), t))
        vocab = list(SPECIAL_TOKENS) + body[: max_size - len(SPECIAL_TOKENS)]
    return vocab


def write_char_tokenizer(vocab: Sequence[str], out_dir: str | os.PathLike):
    """Write ``vocab.txt`` + ``tokenizer_config.json`` (the hub repository's layout), load it with
    ``BertTokenizer.from_pretrained`` and ``save_pretrained`` it back into ``out_dir``.

    Returns the loaded tokenizer.
    """
    if list(vocab[: len(SPECIAL_TOKENS)]) != list(SPECIAL_TOKENS):
        raise InputError(f"a demo vocabulary must start with {SPECIAL_TOKENS}")
    return _save_vocab(vocab, out_dir)


def _save_vocab(vocab: Sequence[str], out_dir: str | os.PathLike):
    """``vocab.txt`` + ``tokenizer_config.json`` into ``out_dir``, loaded back with
    ``BertTokenizer`` and saved with ``save_pretrained``; returns the tokenizer."""
    from transformers import BertTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(set(vocab)) != len(vocab):
        raise InputError("the vocabulary has duplicate entries")
    bad = [t for t in vocab if not t or any(ch.isspace() for ch in t)]
    if bad:
        raise InputError(
            f"vocabulary entries must be non-empty and contain no whitespace: {bad[:5]}"
        )
    write_text_atomic(out_dir / "vocab.txt", "\n".join(vocab) + "\n")
    write_json_atomic(out_dir / "tokenizer_config.json", TOKENIZER_CONFIG)
    tokenizer = BertTokenizer.from_pretrained(out_dir)
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    if len(tokenizer) != len(vocab):
        raise RuntimeError(
            f"BertTokenizer read {len(tokenizer)} entries from a {len(vocab)}-line vocab.txt"
        )
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def build_tiny_chinese_bart(
    texts: Sequence[str],
    out_dir: str | os.PathLike,
    tiny: dict | None = None,
    seed: int = 0,
) -> Path:
    """Write a demo-scale Chinese BART folder: character vocabulary + tiny randomly initialised model.

    Parameters
    ----------
    texts : sequence of str
        Training inputs and targets (the vocabulary's characters come from them only).
    out_dir : path
        Destination; assembled in a temporary sibling and renamed into place.
    tiny : dict, optional
        Overrides of :data:`DEFAULT_TINY` (``d_model``, ``encoder_layers``, ``decoder_layers``,
        ``heads``, ``ffn_dim``, ``max_position_embeddings``, ``max_vocab_size``,
        ``min_char_freq``).
    seed : int
        Seed of the model initialisation.

    Returns
    -------
    Path
        ``out_dir``, loadable with :func:`load_chinese_bart`.
    """
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    settings = dict(DEFAULT_TINY)
    unknown = set(tiny or {}) - set(DEFAULT_TINY)
    if unknown:
        raise InputError(
            f"unknown tiny Chinese BART settings {sorted(unknown)}; known: {sorted(DEFAULT_TINY)}"
        )
    settings.update(tiny or {})
    if int(settings["d_model"]) % int(settings["heads"]):
        raise InputError(
            f"d_model {settings['d_model']} is not divisible by heads {settings['heads']}"
        )
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        vocab = build_char_vocab(texts, int(settings["min_char_freq"]), settings["max_vocab_size"])
        tokenizer = write_char_tokenizer(vocab, tmp)
        config = BartConfig(
            vocab_size=len(tokenizer),
            d_model=int(settings["d_model"]),
            encoder_layers=int(settings["encoder_layers"]),
            decoder_layers=int(settings["decoder_layers"]),
            encoder_attention_heads=int(settings["heads"]),
            decoder_attention_heads=int(settings["heads"]),
            encoder_ffn_dim=int(settings["ffn_dim"]),
            decoder_ffn_dim=int(settings["ffn_dim"]),
            max_position_embeddings=int(settings["max_position_embeddings"]),
            dropout=0.0,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
            decoder_start_token_id=tokenizer.sep_token_id,
            forced_eos_token_id=tokenizer.sep_token_id,
        )
        torch.manual_seed(seed)
        model = BartForConditionalGeneration(config)
        model.save_pretrained(tmp)
        write_json_atomic(
            tmp / "fedrepro_backbone.json",
            {
                "name": "bart-base-chinese",
                "scale": "tiny",
                "tiny": settings,
                "seed": seed,
                "vocab_size": len(tokenizer),
            },
        )
    return out_dir


def hub_char_vocab(texts: Iterable[str], vocab_size: int) -> list[str]:
    """A character vocabulary laid out as bert-base-chinese's ``vocab.txt`` (the one
    fnlp/bart-base-chinese v1 ships): ``[PAD]`` 0, ``[unused1]``..``[unused99]`` 1-99, ``[UNK]``
    100, ``[CLS]`` 101, ``[SEP]`` 102, ``[MASK]`` 103, then :func:`build_char_vocab`'s entries of
    ``texts`` by frequency, then ``[unused100]``, ``[unused101]``, ... filling it to exactly
    ``vocab_size`` entries (they never match text: BERT's pre-tokenizer splits brackets off)."""
    head = ["[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    learnt = build_char_vocab(texts)[len(SPECIAL_TOKENS):]
    body = learnt[: max(vocab_size - len(head), 0)]
    fill = vocab_size - len(head) - len(body)
    return head + body + [f"[unused{100 + i}]" for i in range(fill)]


def build_shape_chinese_bart(
    texts: Sequence[str],
    out_dir: str | os.PathLike,
    hub_id: str = CHINESE_BART_HUB_ID,
    revision: str = CHINESE_BART_REVISION,
    seed: int = 0,
) -> Path:
    """Write a ``kind: shape`` Chinese BART folder: the registry's description of ``hub_id`` at
    the pinned version-1 ``revision`` (:data:`fedrepro.models.shapes.ARCHITECTURES`: 6+6 layers,
    d_model 768, 21,128 tokens, 512 positions; 116,256,768 parameters) with random weights, and
    a character vocabulary of (the first characters of) ``texts`` laid out as the real one
    (:func:`hub_char_vocab`: ``[PAD]`` 0, ``[CLS]`` 101 = bos, ``[SEP]`` 102 = eos and decoder
    start, exactly 21,128 entries).  Shapes, memory and speed only, not results."""
    from fedrepro.models.shapes import architecture, capped_texts, write_shape_backbone

    arch = architecture(hub_id, "fedsumm.backbone.hub_id")
    if revision != arch.revision:
        raise InputError(
            f"fedsumm.backbone.revision {revision} has no architecture description (kind: "
            f"shape); the description is of {hub_id}@{arch.revision}"
        )
    texts = capped_texts(texts)
    if not texts:
        raise InputError("fedsumm.backbone: no training text to build the vocabulary from")
    size = int(arch.config["vocab_size"])

    def write_tokenizer(tmp: Path):
        return _save_vocab(hub_char_vocab(texts, size), tmp)

    return write_shape_backbone(arch, out_dir, write_tokenizer, "bart-base-chinese", seed)


def download_chinese_bart(
    dest: str | os.PathLike,
    hub_id: str = CHINESE_BART_HUB_ID,
    revision: str = CHINESE_BART_REVISION,
    connect_timeout: float = 5.0,
) -> Path:
    """Download the paper-scale checkpoint (model + ``vocab.txt``) at ``revision`` into ``dest``.

    Offline, this fails within about ``connect_timeout`` seconds (or at once with
    ``HF_HUB_OFFLINE=1``) with an :class:`~fedrepro.io.InputError` naming the hub id, the revision
    and the config key to point at a local copy instead.
    """
    from fedrepro.models.backbones import download_snapshot

    return download_snapshot(
        hub_id, revision, dest, LOCAL_DIR_KEY, allow_patterns=_DOWNLOAD_PATTERNS, timeout=connect_timeout
    )


def load_chinese_bart(path: str | os.PathLike, attn_implementation: str | None = None):
    """Load ``(BertTokenizer, BartForConditionalGeneration)`` from a folder — both scales.

    Parameters
    ----------
    path : path
        A folder written by :func:`build_tiny_chinese_bart`, :func:`download_chinese_bart` or any
        ``save_pretrained`` of the two classes.
    attn_implementation : str, optional
        E.g. ``"eager"``, which the copy distribution on BART needs to read cross-attention
        weights (:class:`fedrepro.papers.fedsumm.copy_transformer.BartWithCopy` switches it itself).

    Raises
    ------
    InputError
        If the folder has no ``config.json``/vocabulary or holds another architecture.
    """
    from transformers import AutoConfig, BartForConditionalGeneration, BertTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise InputError(
            f"{path}: not a Chinese BART folder (no config.json); build it with "
            f"build_tiny_chinese_bart or download {CHINESE_BART_HUB_ID}@{CHINESE_BART_REVISION}"
        )
    if not ((path / "vocab.txt").is_file() or (path / "tokenizer.json").is_file()):
        raise InputError(f"{path}: no vocab.txt or tokenizer.json (the BertTokenizer vocabulary)")
    config = AutoConfig.from_pretrained(path)
    if config.model_type != "bart":
        raise InputError(f"{path}/config.json is a {config.model_type!r} model, expected 'bart'")
    tokenizer = BertTokenizer.from_pretrained(path)
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = BartForConditionalGeneration.from_pretrained(path, **kwargs)
    if model.config.vocab_size < len(tokenizer):
        raise InputError(
            f"{path}: the tokenizer has {len(tokenizer)} entries but the model only "
            f"{model.config.vocab_size} embeddings (mismatched revision of vocab.txt and weights?)"
        )
    return tokenizer, model


def prepare_chinese_bart(
    settings: dict, texts: Sequence[str], out_dir: str | os.PathLike, seed: int = 0
) -> Path:
    """Make ``out_dir`` a loadable Chinese BART folder per ``settings`` (config ``fedsumm.backbone``).

    ``kind: tiny`` builds the demo model from ``texts`` with ``settings["tiny"]``; ``kind: hub``
    links ``local_dir`` when given, else downloads ``hub_id`` at ``revision``; ``kind: shape``
    builds ``hub_id``'s architecture at true size with random weights and a vocabulary of
    ``texts`` (:func:`build_shape_chinese_bart`).
    """
    kind = settings.get("kind")
    if kind == "tiny":
        return build_tiny_chinese_bart(texts, out_dir, settings.get("tiny"), seed)
    if kind == "shape":
        return build_shape_chinese_bart(
            texts,
            out_dir,
            settings.get("hub_id", CHINESE_BART_HUB_ID),
            settings.get("revision", CHINESE_BART_REVISION),
            seed,
        )
    if kind != "hub":
        raise InputError(
            f"fedsumm.backbone.kind must be 'tiny', 'hub' or 'shape', got {kind!r}"
        )
    from fedrepro.models.backbones import hub_snapshot

    return hub_snapshot(
        out_dir,
        settings.get("hub_id", CHINESE_BART_HUB_ID),
        settings.get("revision", CHINESE_BART_REVISION),
        settings.get("local_dir"),
        LOCAL_DIR_KEY,
        contents=f"a folder with {CHINESE_BART_HUB_ID}'s files (config.json, vocab.txt, weights)",
        allow_patterns=_DOWNLOAD_PATTERNS,
        timeout=5.0,
    )


_SPACE_NEXT_TO_NON_ASCII = re.compile(r"\s+(?=[^\x00-\x7f])|(?<=[^\x00-\x7f])\s+")


def join_tokens(tokens: Sequence[str]) -> str:
    """Text of WordPiece tokens: ``##`` pieces glued to their word, and no space next to a
    non-ASCII character (BertTokenizer's decoder puts a space between every CJK token); spaces
    between two ASCII words are kept."""
    words: list[str] = []
    for tok in tokens:
        if tok.startswith("##") and words:
            words[-1] += tok[2:]
        else:
            words.append(tok)
    return _SPACE_NEXT_TO_NON_ASCII.sub("", " ".join(words))


def decode_text(tokenizer, ids: Sequence[int]) -> str:
    """Decode generated ids to Chinese text (special tokens dropped, see :func:`join_tokens`)."""
    special = set(tokenizer.all_special_ids)
    return join_tokens(
        tokenizer.convert_ids_to_tokens([int(i) for i in ids if int(i) not in special])
    )
