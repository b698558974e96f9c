"""Architecture descriptions of the paper checkpoints, and ``kind: shape`` backbones built from them.

The model hubs cannot be reached from every machine, but a *rehearsal* of the paper grid (a few
steps of every cell at true size, see ``DESIGN.md``) needs every paper backbone at its true
dimensions.  :data:`ARCHITECTURES` holds, per hub checkpoint, the ``config.json`` that
``from_pretrained`` would read, written out here; :func:`write_shape_backbone` builds the model
class with that config at full size, **random weights** (seeded), saves it with
``save_pretrained`` (safetensors) beside a locally trained tokenizer whose special-token ids are
those of the real config, and marks the folder ``kind: shape`` in ``fedrepro_backbone.json``.
Such a folder is good for shapes, memory and speed only, never for results.

Where the values come from
--------------------------
No checkpoint could be downloaded here, so every ``config.json`` below is written from our
knowledge of the public hub files (the ``config.json`` of each repository at the revision noted).
The **dimensions** (widths, depths, heads, FFN sizes, vocabulary, positions, attention windows)
and the **special-token ids** are the well-known values and are checked by the parameter counts in
``tests/test_backbones.py`` (each against an independent arithmetic count and, where one exists,
the published figure).  The remaining fields (dropouts, generation defaults, label maps,
``transformers_version``) do not change shapes; they are from memory and marked *unverified*.
Transformers >= 5 drops the generation defaults (``num_beams``, ``no_repeat_ngram_size``, ...)
from a model config whichever way it is read, so they do not reach the built model either way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from fedrepro.io import InputError, atomic_dir, write_json_atomic

log = logging.getLogger(__name__)

SHAPE_NOTE = "random weights: shapes, memory and speed only, not results"
"""What a ``kind: shape`` folder is good for (written into ``fedrepro_backbone.json``)."""

SHAPE_TOKENIZER_MAX_CHARS = 2_000_000
"""A shape backbone's tokenizer is trained on at most this many characters of the training text
(the first texts, in file order): enough for realistic token lengths, seconds to train."""

_BART_SUMMARY_PARAMS = {
    "summarization": {"length_penalty": 1.0, "max_length": 128, "min_length": 12, "num_beams": 4},
    "summarization_cnn": {"length_penalty": 2.0, "max_length": 142, "min_length": 56, "num_beams": 4},
    "summarization_xsum": {"length_penalty": 1.0, "max_length": 62, "min_length": 11, "num_beams": 6},
}
_THREE_LABELS = {
    "id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"},
    "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
}


def _bart_config(d_model: int, layers: int, heads: int, ffn: int, **extra) -> dict:
    """facebook/bart-{base,large} ``config.json``: they differ only in the four sizes."""
    return {
        "activation_dropout": 0.1,  # unverified (no effect on shapes)
        "activation_function": "gelu",
        "add_bias_logits": False,
        "add_final_layer_norm": False,
        # the hub files name the bare BartModel (fedrepro loads BartForConditionalGeneration)
        "architectures": ["BartModel"],
        "attention_dropout": 0.1,  # unverified
        "bos_token_id": 0,
        "classif_dropout": 0.1,  # unverified
        "classifier_dropout": 0.0,  # unverified
        "d_model": d_model,
        "decoder_attention_heads": heads,
        "decoder_ffn_dim": ffn,
        "decoder_layerdrop": 0.0,
        "decoder_layers": layers,
        "decoder_start_token_id": 2,
        "dropout": 0.1,
        "early_stopping": True,  # generation default, unverified
        "encoder_attention_heads": heads,
        "encoder_ffn_dim": ffn,
        "encoder_layerdrop": 0.0,
        "encoder_layers": layers,
        "eos_token_id": 2,
        "forced_bos_token_id": 0,  # unverified (added to the hub files in 2021)
        "forced_eos_token_id": 2,
        "gradient_checkpointing": False,
        **_THREE_LABELS,
        "init_std": 0.02,
        "is_encoder_decoder": True,
        "max_position_embeddings": 1024,
        "model_type": "bart",
        "no_repeat_ngram_size": 3,  # generation default, unverified
        "normalize_before": False,
        "normalize_embedding": True,
        "num_beams": 4,  # generation default, unverified
        "num_hidden_layers": layers,
        "pad_token_id": 1,
        "scale_embedding": False,
        "task_specific_params": _BART_SUMMARY_PARAMS,  # unverified
        "use_cache": True,
        "vocab_size": 50265,
        **extra,
    }


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One hub checkpoint's architecture.

    ``config`` is the repository's ``config.json`` (what ``from_pretrained`` reads);
    ``model_class`` the class ``kind: shape`` builds from it (the one fedrepro loads);
    ``parameters`` the number of parameters of ``model_class`` built from ``config`` (tied
    weights counted once), which the tests check on the ``meta`` device; ``source`` says where
    the values come from.
    """

    hub_id: str
    revision: str
    model_class: str
    config: Mapping
    parameters: int
    source: str


ARCHITECTURES: dict[str, Architecture] = {
    a.hub_id: a
    for a in (
        Architecture(
            "facebook/bart-large",
            "main",
            "BartForConditionalGeneration",
            _bart_config(1024, 12, 16, 4096, _name_or_path="bart-large"),
            # 406,291,456: the figure the BART model card / HF docs give ("406M"), and the
            # arithmetic count in tests/test_backbones.py
            406_291_456,
            "facebook/bart-large config.json (Lewis et al. 2020, Table/§3: 12+12 layers, 1024 "
            "hidden, 16 heads; vocabulary 50,265 = GPT-2 BPE + <s>,<pad>,</s>,<unk>,<mask>)",
        ),
        Architecture(
            "facebook/bart-base",
            "main",
            "BartForConditionalGeneration",
            _bart_config(768, 6, 12, 3072, _name_or_path="bart-base"),
            139_420_416,  # "139M" (HF docs); arithmetic count in the tests
            "facebook/bart-base config.json (6+6 layers, 768 hidden, 12 heads, FFN 3072)",
        ),
        Architecture(
            "allenai/led-large-16384",
            "main",
            "LEDForConditionalGeneration",
            {
                "activation_dropout": 0.0,  # unverified
                "activation_function": "gelu",
                "architectures": ["LEDForConditionalGeneration"],
                "attention_dropout": 0.0,  # unverified
                "attention_window": [1024] * 12,
                "bos_token_id": 0,
                "classif_dropout": 0.0,  # unverified
                "d_model": 1024,
                "decoder_attention_heads": 16,
                "decoder_ffn_dim": 4096,
                "decoder_layerdrop": 0.0,
                "decoder_layers": 12,
                "decoder_start_token_id": 2,
                "dropout": 0.1,
                "encoder_attention_heads": 16,
                "encoder_ffn_dim": 4096,
                "encoder_layerdrop": 0.0,
                "encoder_layers": 12,
                "eos_token_id": 2,
                "gradient_checkpointing": False,
                **_THREE_LABELS,
                "init_std": 0.02,
                "is_encoder_decoder": True,
                "max_decoder_position_embeddings": 1024,
                "max_encoder_position_embeddings": 16384,
                "model_type": "led",
                "num_hidden_layers": 12,
                "pad_token_id": 1,
                "use_cache": True,  # unverified
                "vocab_size": 50265,
            },
            # 459,801,600 ("460M"): bart-large + 16 x its 1,024 encoder positions (LED has no
            # offset of 2) + the global-attention q/k/v projections of every encoder layer;
            # arithmetic count in the tests
            459_801_600,
            "allenai/led-large-16384 config.json (Beltagy et al. 2020, §6: initialised from "
            "bart-large, encoder positions copied 16 times to 16,384, attention window 1,024)",
        ),
        Architecture(
            "FacebookAI/roberta-base",
            "main",
            "RobertaForMaskedLM",
            {
                "architectures": ["RobertaForMaskedLM"],
                "attention_probs_dropout_prob": 0.1,
                "bos_token_id": 0,
                "eos_token_id": 2,
                "hidden_act": "gelu",
                "hidden_dropout_prob": 0.1,
                "hidden_size": 768,
                "initializer_range": 0.02,
                "intermediate_size": 3072,
                "layer_norm_eps": 1e-05,
                "max_position_embeddings": 514,
                "model_type": "roberta",
                "num_attention_heads": 12,
                "num_hidden_layers": 12,
                "pad_token_id": 1,
                "type_vocab_size": 1,
                "vocab_size": 50265,
            },
            # 124,697,433: RobertaModel without pooler 124,055,040 + LM head (dense 768x768,
            # LayerNorm, bias 50,265; decoder tied to the word embeddings) -- the figure
            # RobertaForMaskedLM.from_pretrained("roberta-base") reports; arithmetic in the tests
            124_697_433,
            "FacebookAI/roberta-base config.json (Liu et al. 2019; the file is short and its "
            "values are the well-known ones)",
        ),
        Architecture(
            "google-bert/bert-base-uncased",
            "main",
            "BertModel",
            {
                "architectures": ["BertForMaskedLM"],
                "attention_probs_dropout_prob": 0.1,
                "gradient_checkpointing": False,
                "hidden_act": "gelu",
                "hidden_dropout_prob": 0.1,
                "hidden_size": 768,
                "initializer_range": 0.02,
                "intermediate_size": 3072,
                "layer_norm_eps": 1e-12,
                "max_position_embeddings": 512,
                "model_type": "bert",
                "num_attention_heads": 12,
                "num_hidden_layers": 12,
                "pad_token_id": 0,
                "position_embedding_type": "absolute",
                "type_vocab_size": 2,
                "use_cache": True,
                "vocab_size": 30522,
            },
            # BertModel with pooler: 109,482,240 (the well-known "110M" of Devlin et al.; the
            # pooler is 590,592 of it -- BERTSUM loads the encoder without it: 108,891,648)
            109_482_240,
            "google-bert/bert-base-uncased config.json (Devlin et al. 2019: L=12, H=768, A=12; "
            "WordPiece vocabulary 30,522)",
        ),
        Architecture(
            "fnlp/bart-base-chinese",
            # the last version-1 commit, the one fedrepro pins (fedsumm/bart.py
            # CHINESE_BART_REVISION): BERT's Chinese vocabulary (21,128) and 512 positions.  The
            # 2022-12-30 version 2 has 51,271 tokens and 1,024 positions, the rest equal.
            "cac82280f9cafd2e7bb76fc32123717e335397ba",
            "BartForConditionalGeneration",
            {
                "activation_dropout": 0.1,  # unverified
                "activation_function": "gelu",
                "add_bias_logits": False,
                "add_final_layer_norm": False,
                "architectures": ["BartForConditionalGeneration"],
                "attention_dropout": 0.1,  # unverified
                "bos_token_id": 101,  # [CLS]
                "classif_dropout": 0.1,
                "classifier_dropout": 0.0,
                "d_model": 768,
                "decoder_attention_heads": 12,
                "decoder_ffn_dim": 3072,
                "decoder_layerdrop": 0.0,
                "decoder_layers": 6,
                "decoder_start_token_id": 102,  # [SEP]
                "dropout": 0.1,  # unverified (a third-party copy of v2's file names it dropout_rate)
                "early_stopping": True,
                "encoder_attention_heads": 12,
                "encoder_ffn_dim": 3072,
                "encoder_layerdrop": 0.0,
                "encoder_layers": 6,
                "eos_token_id": 102,  # [SEP]
                "forced_eos_token_id": 102,
                "gradient_checkpointing": False,
                **_THREE_LABELS,
                "init_std": 0.02,
                "is_encoder_decoder": True,
                "max_position_embeddings": 512,  # v1 (v2: 1024)
                "model_type": "bart",
                "no_repeat_ngram_size": 3,
                "normalize_before": False,
                "normalize_embedding": True,
                "num_beams": 4,
                "num_hidden_layers": 6,
                "pad_token_id": 0,  # [PAD]
                "scale_embedding": False,
                "task_specific_params": _BART_SUMMARY_PARAMS,
                "tokenizer_class": "BertTokenizer",
                "use_cache": True,
                "vocab_size": 21128,  # v1: bert-base-chinese's vocab.txt (v2: 51271)
            },
            # 116,256,768: bart-base's 6+6 layers with a 21,128 x 768 shared embedding and
            # 512 + 2 learned positions; arithmetic count in the tests only (no published figure
            # for v1; the v2 file gives 140,193,024 by the same count)
            116_256_768,
            "fnlp/bart-base-chinese config.json, version 1 (Shao et al. 2021, CPT, §4: the "
            "Chinese BART-base; v2 release notes: 'replace the old BERT vocabulary with a larger "
            "one of size 51271 ... extend the max_position_embeddings from 512 to 1024')",
        ),
        Architecture(
            "google/long-t5-tglobal-base",
            "main",
            "LongT5ForConditionalGeneration",
            {
                "architectures": ["LongT5ForConditionalGeneration"],
                "d_ff": 2048,
                "d_kv": 64,
                "d_model": 768,
                "decoder_start_token_id": 0,  # pad (T5)
                "dense_act_fn": "gelu_new",
                "dropout_rate": 0.1,
                "encoder_attention_type": "transient-global",
                "eos_token_id": 1,
                "feed_forward_proj": "gated-gelu",
                "global_block_size": 16,
                "initializer_factor": 1.0,
                "is_encoder_decoder": True,
                "is_gated_act": True,
                "layer_norm_epsilon": 1e-06,
                "local_radius": 127,
                "model_type": "longt5",
                "n_positions": 4096,  # unused by the model (relative positions)
                "num_decoder_layers": 12,
                "num_heads": 12,
                "num_layers": 12,
                "output_past": True,
                "pad_token_id": 0,
                "relative_attention_max_distance": 128,
                "relative_attention_num_buckets": 32,
                # T5 v1.1: an untied LM head and no d_model**-0.5 output scaling.  transformers 5
                # keeps the second (``scale_decoder_outputs`` False) but always builds the LM head
                # tied to the embeddings; loading the hub checkpoint unties it again (both tensors
                # present and different), so the real model has 24,674,304 parameters more
                "tie_word_embeddings": False,
                "use_cache": True,
                "vocab_size": 32128,  # 32,000 pieces + 100 sentinels = 32,100 tokens, padded to 32,128
            },
            # 222,913,152: LongT5ForConditionalGeneration built from this config (LM head tied to
            # the 32,128 x 768 embedding, as transformers 5 builds it); the hub checkpoint with
            # its own LM head: 247,587,456.  Arithmetic count in the tests
            222_913_152,
            "google/long-t5-tglobal-base config.json (Guo et al. 2022, LongT5: T5.1.1-base "
            "dimensions, transient-global attention, local radius 127, global blocks of 16). "
            "Written from copies of the file in fine-tuned repositories that name it as their "
            "_name_or_path (their shape fields agree)",
        ),
    )
}
"""The paper checkpoints' architectures, by hub id."""


def architecture(hub_id: str, config_key: str = "backbones.<name>.hub_id") -> Architecture:
    """The :class:`Architecture` of ``hub_id`` (an :class:`InputError` naming ``config_key`` when
    no description is kept for it)."""
    try:
        return ARCHITECTURES[hub_id]
    except KeyError:
        raise InputError(
            f"kind: shape needs an architecture description of {hub_id!r} (config key "
            f"{config_key}); descriptions are kept for {sorted(ARCHITECTURES)}"
        ) from None


def model_class(class_name: str):
    """The ``transformers`` model class named ``class_name`` (an InputError when it has none)."""
    import transformers

    try:
        return getattr(transformers, class_name)
    except AttributeError:
        raise InputError(f"transformers has no model class {class_name!r}") from None


def shape_config(arch: Architecture):
    """The ``PretrainedConfig`` ``from_pretrained`` would make of the hub's ``config.json``."""
    return model_class(arch.model_class).config_class.from_dict(json.loads(json.dumps(arch.config)))


def build_shape_model(arch: Architecture, seed: int = 0):
    """``arch.model_class`` at full size with random weights drawn after ``manual_seed(seed)``
    (on the current default device: under ``torch.device("meta")`` nothing is allocated)."""
    import torch

    config = shape_config(arch)
    torch.manual_seed(seed)
    cls = model_class(arch.model_class)
    if arch.model_class == "BertModel":
        return cls(config, add_pooling_layer=True)
    return cls(config)


def capped_texts(texts: Iterable[str], max_chars: int = SHAPE_TOKENIZER_MAX_CHARS) -> list[str]:
    """The first non-empty ``texts`` holding at most ``max_chars`` characters in all (at least one)."""
    out: list[str] = []
    total = 0
    for t in texts:
        if not t or not t.strip():
            continue
        if out and total + len(t) > max_chars:
            break
        out.append(t)
        total += len(t)
    return out


def _token_id(tokenizer, which: str):
    tid = getattr(tokenizer, f"{which}_token_id", None)
    if tid is None and which in ("bos", "eos"):  # BERT vocabularies: [CLS] / [SEP]
        tid = getattr(tokenizer, "cls_token_id" if which == "bos" else "sep_token_id", None)
    return tid


DECODER_START_TOKEN = {"t5": "pad", "mt5": "pad", "longt5": "pad"}
"""``model_type`` -> the special token the decoder starts with (default ``eos``, the BART family)."""


def check_tokenizer(arch: Architecture, tokenizer) -> None:
    """The tokenizer's ids fit the embedding and its special tokens sit at the real config's ids
    (pad, bos, eos, and decoder start = eos for the BART family, pad for T5)."""
    config = arch.config
    if len(tokenizer) > int(config["vocab_size"]):
        raise RuntimeError(
            f"shape tokenizer of {arch.hub_id} has {len(tokenizer)} entries, more than the "
            f"model's {config['vocab_size']} embeddings"
        )
    start = DECODER_START_TOKEN.get(config.get("model_type"), "eos")
    wanted = [("pad_token_id", "pad"), ("bos_token_id", "bos"), ("eos_token_id", "eos"),
              ("decoder_start_token_id", start)]
    for key, which in wanted:
        if config.get(key) is not None and _token_id(tokenizer, which) != config[key]:
            raise RuntimeError(
                f"shape tokenizer of {arch.hub_id}: {which} id {_token_id(tokenizer, which)} "
                f"!= config.json {key} {config[key]}"
            )


def write_shape_backbone(
    arch: Architecture,
    out_dir: str | os.PathLike,
    write_tokenizer: Callable[[Path], object],
    name: str,
    seed: int = 0,
    reason: str = "kind: shape",
) -> Path:
    """Write a ``kind: shape`` backbone folder at ``out_dir`` (assembled in a temporary sibling).

    ``write_tokenizer(tmp)`` saves a tokenizer into the folder and returns it (checked by
    :func:`check_tokenizer`); the model is :func:`build_shape_model`, saved with
    ``save_pretrained`` (safetensors), its ``config.json`` then given the hub file's
    ``architectures`` back (``save_pretrained`` writes the class it saved), so the folder reads as
    the hub checkpoint would.
    """
    log.warning(
        "%s: checkpoint %s not fetched (%s); building %s at its true dimensions with random "
        "weights (%s)", name, arch.hub_id, reason, arch.model_class, SHAPE_NOTE,
    )
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        tokenizer = write_tokenizer(tmp)
        check_tokenizer(arch, tokenizer)
        model = build_shape_model(arch, seed)
        n_params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp)
        del model
        cfg_path = tmp / "config.json"
        saved = json.loads(cfg_path.read_text(encoding="utf-8"))
        saved["architectures"] = list(arch.config["architectures"])
        write_json_atomic(cfg_path, saved)
        write_json_atomic(
            tmp / "fedrepro_backbone.json",
            {
                "name": name,
                "kind": "shape",
                "scale": "shape",
                "hub_id": arch.hub_id,
                "revision": arch.revision,
                "model_class": arch.model_class,
                "parameters": n_params,
                "seed": seed,
                "weights": SHAPE_NOTE,
                "tokenizer": {"trained_locally": True, "size": len(tokenizer)},
            },
        )
    return out_dir
