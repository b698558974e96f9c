"""Backbone registry: paper-scale hub checkpoints and demo-scale tiny models of the same classes.

One loading path serves both scales: :func:`load_backbone` calls ``from_pretrained`` on a
directory.  At paper scale that directory is a hub snapshot made by :func:`download_backbone`;
at demo scale it is written by :func:`build_tiny_backbone` (a tokenizer trained locally with
``tokenizers`` on the sample training text, and a randomly initialised model of the paper
backbone's class with a small config, optionally warmed up by :mod:`fedrepro.models.pretrain`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

from fedrepro.io import InputError, atomic_path, write_json_atomic


@dataclasses.dataclass(frozen=True)
class BackboneSpec:
    """A paper backbone.

    ``adapter_top_k`` and ``bottleneck`` are AdaFedSelecKD §IV-D's values (top six decoder layers
    with m = 2048 for BART-large and LED-large; top three with m = 1536 for BART-base).
    """

    name: str
    hub_id: str
    model_class: str
    adapter_top_k: int
    bottleneck: int
    max_source_length: int


BACKBONES: dict[str, BackboneSpec] = {
    "bart-large": BackboneSpec(
        "bart-large", "facebook/bart-large", "BartForConditionalGeneration", 6, 2048, 1024
    ),
    "bart-base": BackboneSpec(
        "bart-base", "facebook/bart-base", "BartForConditionalGeneration", 3, 1536, 1024
    ),
    "led-large": BackboneSpec(
        "led-large", "allenai/led-large-16384", "LEDForConditionalGeneration", 6, 2048, 16384
    ),
}

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # BART's ids 0..4


def get_spec(name: str) -> BackboneSpec:
    try:
        return BACKBONES[name]
    except KeyError:
        raise InputError(
            f"unknown backbone {name!r}; known: {sorted(BACKBONES)} (config key: backbones)"
        ) from None


def model_class(class_name: str):
    import transformers

    try:
        return getattr(transformers, class_name)
    except AttributeError:
        raise InputError(f"transformers has no model class {class_name!r}") from None


def download_backbone(hub_id: str, revision: str, dest: str | os.PathLike) -> Path:
    """Download a hub snapshot (model + tokenizer files) at ``revision`` into ``dest``.

    Fails fast and clearly when the hub is unreachable (set ``HF_HUB_OFFLINE=1`` to fail in about
    a second instead of retrying); the error names the hub id and the config key that points at a
    local copy instead (``backbones.<name>.local_dir``).
    """
    from huggingface_hub import snapshot_download

    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.partial")
    try:
        snapshot_download(
            repo_id=hub_id,
            revision=revision,
            local_dir=tmp,
            allow_patterns=["*.json", "*.txt", "*.model", "*.safetensors", "merges.txt"],
        )
    except Exception as exc:  # noqa: BLE001 - re-raised with the user-facing explanation
        raise RuntimeError(
            f"could not download backbone {hub_id}@{revision} from the Hugging Face hub "
            f"({type(exc).__name__}: {exc}). Offline? Download it elsewhere and set the config key "
            f"backbones.<name>.local_dir to the folder holding config.json and the tokenizer."
        ) from exc
    os.replace(tmp, dest)
    return dest


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike):
    """Train a byte-level BPE tokenizer locally (demo scale) and save it in HF format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_backbone(
    spec: BackboneSpec,
    texts: Iterable[str],
    out_dir: str | os.PathLike,
    tiny: dict,
    seed: int = 0,
) -> Path:
    """Write a demo-scale backbone folder: locally trained tokenizer + tiny model of ``spec``'s class.

    ``tiny`` holds the config overrides (d_model, layers, heads, ffn dim, vocab size, max
    positions).  The folder is assembled in a temporary sibling and renamed into place.
    """
    import torch

    out_dir = Path(out_dir)
    with atomic_path(out_dir, suffix=".d") as tmp:
        tmp.unlink()
        tmp.mkdir()
        tokenizer = train_tokenizer(texts, int(tiny["vocab_size"]), tmp)
        cls = model_class(spec.model_class)
        config = cls.config_class(
            vocab_size=len(tokenizer),
            d_model=int(tiny["d_model"]),
            encoder_layers=int(tiny["encoder_layers"]),
            decoder_layers=int(tiny["decoder_layers"]),
            encoder_attention_heads=int(tiny["heads"]),
            decoder_attention_heads=int(tiny["heads"]),
            encoder_ffn_dim=int(tiny["ffn_dim"]),
            decoder_ffn_dim=int(tiny["ffn_dim"]),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.eos_token_id,
            forced_eos_token_id=tokenizer.eos_token_id,
            **_position_kwargs(spec.model_class, int(tiny["max_source_length"]), int(tiny["max_target_length"]), tiny),
        )
        torch.manual_seed(seed)
        model = cls(config)
        model.save_pretrained(tmp)
        write_json_atomic(tmp / "fedrepro_backbone.json", {"name": spec.name, "scale": "tiny", **tiny})
    return out_dir


def _position_kwargs(class_name: str, max_source: int, max_target: int, tiny: dict) -> dict:
    if class_name.startswith("LED"):
        window = int(tiny.get("attention_window", 32))
        return {
            "max_encoder_position_embeddings": max_source,
            "max_decoder_position_embeddings": max_target,
            "attention_window": [window] * int(tiny["encoder_layers"]),
        }
    return {"max_position_embeddings": max(max_source, max_target)}


def load_backbone(path: str | os.PathLike):
    """Load (tokenizer, model) from a backbone folder with ``from_pretrained`` — both scales."""
    from transformers import AutoConfig, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise InputError(
            f"{path}: not a backbone folder (no config.json); run the backbone rule or set "
            f"backbones.<name>.local_dir"
        )
    config = AutoConfig.from_pretrained(path)
    arch = (config.architectures or [None])[0]
    if arch is None:
        raise InputError(f"{path}/config.json names no architecture")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = model_class(arch).from_pretrained(path)
    return tokenizer, model
