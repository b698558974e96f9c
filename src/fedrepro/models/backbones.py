"""Backbone registry: paper-scale hub checkpoints and demo-scale tiny models of the same classes.

One loading path serves both scales: :func:`load_backbone` calls ``from_pretrained`` on a
directory.  At paper scale that directory is a hub snapshot made by :func:`download_snapshot`;
at demo scale it is written by :func:`build_tiny_backbone` (a tokenizer trained locally with
``tokenizers`` on the sample training text, and a randomly initialised model of the paper
backbone's class with a small config, optionally warmed up by :mod:`fedrepro.models.pretrain`).
For a rehearsal of the paper grid where a checkpoint cannot be fetched, :func:`build_shape_backbone`
writes it at its true dimensions with random weights (``kind: shape``, :mod:`fedrepro.models.shapes`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from fedrepro.io import InputError, atomic_dir, write_json_atomic
from fedrepro.models.shapes import model_class

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BackboneSpec:
    """A paper backbone.

    ``adapter_top_k`` and ``bottleneck`` are AdaFedSelecKD §IV-D's values (top six decoder layers
    with m = 2048 for BART-large and LED-large; top three with m = 1536 for BART-base); LongT5's
    (§V-B.4, which states none) are our choice, see its entry.
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
    # AdaFedSelecKD §V-B.4 (Fig. 9, long meetings: AMI/ICSI/ELITR/MeetingBank): "LongT5 [38]" with
    # inputs up to 16,384 tokens; the paper names neither the size nor the adapter settings.  Our
    # choice: the transient-global base checkpoint (12 + 12 layers, d_model 768), adapters on the
    # top 6 of its 12 decoder layers (half the decoder, as for the 12-layer BART-large/LED-large),
    # bottleneck 1536 = 2 x d_model (the paper's BART-base ratio, 1536 at d_model 768).
    "longt5": BackboneSpec(
        "longt5", "google/long-t5-tglobal-base", "LongT5ForConditionalGeneration", 6, 1536, 16384
    ),
    # FedMCP (§V-C): frozen roberta-base, Houlsby adapters in every layer with r = 16
    # (adapter_top_k 0 = every layer).  The hub checkpoint is a RobertaForMaskedLM; the encoder
    # (``RobertaModel``) is what FedMCP loads from it.
    "roberta-base": BackboneSpec(
        "roberta-base", "FacebookAI/roberta-base", "RobertaForMaskedLM", 0, 16, 512
    ),
}

ENCODER_CLASSES = {"RobertaForMaskedLM": "RobertaModel"}
"""Checkpoint class -> the bare encoder class the methods load from the same folder."""

GENERATION_CLASSES = {
    "BartModel": "BartForConditionalGeneration",
    "LEDModel": "LEDForConditionalGeneration",
}
"""Bare seq2seq class a hub ``config.json`` may name -> the class :func:`load_backbone` loads
(facebook/bart-large and bart-base name ``BartModel``; the LM head is tied to the embeddings)."""

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # BART's ids 0..4

T5_SPECIAL_TOKENS = ["<pad>", "</s>", "<unk>", "<mask>"]
"""T5's ids: ``<pad>`` 0 (also the decoder start), ``</s>`` 1, ``<unk>`` 2, no ``<s>``; ``<mask>``
(3) is for the demo's denoising warm-up only (T5's own vocabulary has sentinel tokens instead)."""

TOKENIZER_LAYOUTS = {"LongT5ForConditionalGeneration": "t5"}
"""Model class -> the special-token layout of its locally trained tokenizer (default ``bart``)."""


def tokenizer_layout(model_class: str) -> str:
    """``t5`` or ``bart``: which special-token layout :func:`train_tokenizer` gives ``model_class``."""
    return TOKENIZER_LAYOUTS.get(model_class, "bart")


def get_spec(name: str) -> BackboneSpec:
    try:
        return BACKBONES[name]
    except KeyError:
        raise InputError(
            f"unknown backbone {name!r}; known: {sorted(BACKBONES)} (config key: backbones)"
        ) from None


BACKBONE_DOWNLOAD_PATTERNS = ("*.json", "*.txt", "*.model", "*.safetensors")
"""Files :func:`download_snapshot` fetches by default: configs, tokenizer files, weights."""


def download_snapshot(
    hub_id: str,
    revision: str,
    dest: str | os.PathLike,
    config_key: str,
    allow_patterns: Sequence[str] = BACKBONE_DOWNLOAD_PATTERNS,
    timeout: float = 10.0,
) -> Path:
    """Download the hub snapshot ``hub_id`` at ``revision`` (files matching ``allow_patterns``)
    into ``dest``, atomically (no partial folder is left behind).

    Fails fast: at once when ``HF_HUB_OFFLINE`` is set, within about ``timeout`` seconds when the
    hub endpoint cannot be reached.  Every failure is an :class:`~fedrepro.io.InputError` naming
    the hub id, the revision and ``config_key``, the config key that points at a local copy
    instead (e.g. ``backbones.<name>.local_dir``).
    """
    from huggingface_hub import constants, snapshot_download

    from fedrepro.data.download import check_reachable

    def fail(reason: str) -> InputError:
        return InputError(
            f"could not download {hub_id} at revision {revision} from the Hugging Face hub "
            f"({reason}). Offline? Download that revision elsewhere (model + tokenizer files) and "
            f"set the config key {config_key} to the folder holding config.json"
        )

    # the flag as the hub client read it at import, or as the environment says now
    env = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    if constants.HF_HUB_OFFLINE or env:
        raise fail("HF_HUB_OFFLINE is set")
    try:
        check_reachable(constants.ENDPOINT, timeout)
        with atomic_dir(dest) as tmp:
            snapshot_download(
                repo_id=hub_id,
                revision=revision,
                local_dir=tmp,
                allow_patterns=list(allow_patterns),
            )
    except Exception as exc:  # re-raised with the user-facing explanation
        raise fail(f"{type(exc).__name__}: {exc}") from exc
    return Path(dest)


def download_backbone(
    hub_id: str,
    revision: str,
    dest: str | os.PathLike,
    config_key: str = "backbones.<name>.local_dir",
) -> Path:
    """Download a backbone's hub snapshot (model + tokenizer files) at ``revision`` into ``dest``;
    :func:`download_snapshot` with the backbone file patterns."""
    return download_snapshot(hub_id, revision, dest, config_key)


def hub_snapshot(
    dest: str | os.PathLike,
    hub_id: str,
    revision: str,
    local_dir: str | os.PathLike | None,
    config_key: str,
    contents: str = "a folder saved with save_pretrained (model + tokenizer)",
    allow_patterns: Sequence[str] = BACKBONE_DOWNLOAD_PATTERNS,
    timeout: float = 10.0,
) -> Path:
    """A hub backbone at ``dest``: the user's local copy linked file by file when ``local_dir`` is
    set (the value of ``config_key``; it must hold ``config.json``), else the snapshot of
    ``hub_id`` at ``revision`` downloaded by :func:`download_snapshot`. Written atomically."""
    if not local_dir:
        return download_snapshot(hub_id, revision, dest, config_key, allow_patterns, timeout)
    src = Path(local_dir).resolve()
    if not (src / "config.json").is_file():
        raise InputError(f"{config_key} = {src} holds no config.json; point it at {contents}")
    with atomic_dir(dest) as tmp:
        for f in src.iterdir():
            (tmp / f.name).symlink_to(f)
    return Path(dest)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike, layout: str = "bart"
):
    """Train a byte-level BPE tokenizer locally (demo scale) and save it in HF format.

    ``layout`` places the special tokens: ``bart`` -- ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2,
    ``<unk>`` 3, ``<mask>`` 4, texts encoded ``<s> ... </s>``; ``t5`` -- :data:`T5_SPECIAL_TOKENS`,
    texts encoded ``... </s>`` (T5 has no beginning-of-sequence token).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if layout not in ("bart", "t5"):
        raise ValueError(f"tokenizer layout must be 'bart' or 't5', got {layout!r}")
    specials = SPECIAL_TOKENS if layout == "bart" else T5_SPECIAL_TOKENS
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    if layout == "bart":
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
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
        )
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            eos_token="</s>",
            pad_token="<pad>",
            unk_token="<unk>",
            mask_token="<mask>",
        )
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_backbone(
    spec: BackboneSpec,
    texts: Sequence[str],
    out_dir: str | os.PathLike,
    tiny: dict,
    seed: int = 0,
    warmup_texts: Sequence[str] | None = None,
) -> Path:
    """Write a demo-scale backbone folder: locally trained tokenizer + tiny model of ``spec``'s class.

    ``tiny`` holds the config overrides (d_model, layers, heads, ffn dim, vocab size, max
    positions) and the denoising warm-up (``warmup_steps``, ``warmup_lr``, ``warmup_batch_size``;
    see :mod:`fedrepro.models.pretrain`).  The folder is assembled in a temporary sibling and
    renamed into place.
    """
    import torch


    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        tokenizer = train_tokenizer(
            texts, int(tiny["vocab_size"]), tmp, tokenizer_layout(spec.model_class)
        )
        cls = model_class(spec.model_class)
        if spec.model_class == "RobertaForMaskedLM":
            from fedrepro.models.pretrain import mlm_warmup as warmup

            config = cls.config_class(**_encoder_kwargs(tokenizer, tiny))
        elif spec.model_class.startswith("LongT5"):
            from fedrepro.models.pretrain import denoising_warmup as warmup

            config = cls.config_class(**_longt5_kwargs(spec, tokenizer, tiny))
        else:
            from fedrepro.models.pretrain import denoising_warmup as warmup

            config = cls.config_class(
                vocab_size=len(tokenizer),
                d_model=int(tiny["d_model"]),
                encoder_layers=int(tiny["encoder_layers"]),
                decoder_layers=int(tiny["decoder_layers"]),
                encoder_attention_heads=int(tiny["heads"]),
                decoder_attention_heads=int(tiny["heads"]),
                encoder_ffn_dim=int(tiny["ffn_dim"]),
                decoder_ffn_dim=int(tiny["ffn_dim"]),
                dropout=0.0,
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                decoder_start_token_id=tokenizer.eos_token_id,
                forced_eos_token_id=tokenizer.eos_token_id,
                **_position_kwargs(spec.model_class, tiny),
            )
        torch.manual_seed(seed)
        model = cls(config)
        losses = warmup(
            model,
            tokenizer,
            texts if warmup_texts is None else warmup_texts,
            steps=int(tiny.get("warmup_steps", 0)),
            batch_size=int(tiny.get("warmup_batch_size", 8)),
            lr=float(tiny.get("warmup_lr", 1e-3)),
            max_length=int(tiny["max_source_length"]),
            seed=seed,
        )
        model.save_pretrained(tmp)
        write_json_atomic(
            tmp / "fedrepro_backbone.json",
            {"name": spec.name, "scale": "tiny", "tiny": tiny, "seed": seed,
             "warmup_loss_first": losses[:1], "warmup_loss_last": losses[-1:]},
        )
    return out_dir


def build_shape_backbone(
    spec: BackboneSpec,
    texts: Sequence[str],
    out_dir: str | os.PathLike,
    hub_id: str | None = None,
    seed: int = 0,
) -> Path:
    """Write a ``kind: shape`` backbone folder: ``hub_id``'s architecture
    (:data:`fedrepro.models.shapes.ARCHITECTURES`; default ``spec.hub_id``) at its true dimensions
    with random weights, and a byte-level BPE tokenizer trained locally on (the first
    :data:`~fedrepro.models.shapes.SHAPE_TOKENIZER_MAX_CHARS` characters of) ``texts``, with the
    tiny path's special tokens -- ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3 as in the real
    vocabulary (``<mask>`` is 4, the real one 50,264); for LongT5 T5's ``<pad>`` 0, ``</s>`` 1,
    ``<unk>`` 2 (:data:`T5_SPECIAL_TOKENS`) -- and at most the model's vocabulary size.
    Shapes, memory and speed only, not results.
    """
    from fedrepro.models.shapes import architecture, capped_texts, write_shape_backbone

    arch = architecture(hub_id or spec.hub_id, f"backbones.{spec.name}.hub_id")
    if arch.model_class != spec.model_class:
        raise InputError(
            f"backbones.{spec.name}: {arch.hub_id} is a {arch.model_class}, the backbone a "
            f"{spec.model_class}"
        )
    tokenizer_texts = capped_texts(texts)
    if not tokenizer_texts:
        raise InputError(f"backbones.{spec.name}: no training text to train the tokenizer on")

    def write_tokenizer(tmp: Path):
        return train_tokenizer(
            tokenizer_texts, int(arch.config["vocab_size"]), tmp, tokenizer_layout(spec.model_class)
        )

    return write_shape_backbone(arch, out_dir, write_tokenizer, spec.name, seed)


def _longt5_kwargs(spec: BackboneSpec, tokenizer, tiny: dict) -> dict:
    """A small ``LongT5Config`` with google/long-t5-tglobal-base's conventions: transient-global
    encoder attention, gated-GELU feed-forward, head size d_model / heads, no decoder-output
    scaling (``tie_word_embeddings: false`` in the hub file), and T5's ids -- pad 0 = decoder
    start, eos 1 (:data:`T5_SPECIAL_TOKENS`).  ``local_radius`` / ``global_block_size`` (hub:
    127 / 16 for 16,384-token inputs) default to 15 / 8: local blocks of 16 tokens and a global
    token per 8, so a few-hundred-token demo input has several of each.  Relative positions: no
    position-embedding size to set."""
    d_model, heads = int(tiny["d_model"]), int(tiny["heads"])
    if d_model % heads:
        raise InputError(
            f"backbones.{spec.name}.tiny: d_model {d_model} is not a multiple of heads {heads}"
        )
    return {
        "vocab_size": len(tokenizer),
        "d_model": d_model,
        "d_kv": d_model // heads,
        "d_ff": int(tiny["ffn_dim"]),
        "num_layers": int(tiny["encoder_layers"]),
        "num_decoder_layers": int(tiny["decoder_layers"]),
        "num_heads": heads,
        "encoder_attention_type": "transient-global",
        "local_radius": int(tiny.get("local_radius", 15)),
        "global_block_size": int(tiny.get("global_block_size", 8)),
        "feed_forward_proj": "gated-gelu",
        "dropout_rate": 0.0,
        "tie_word_embeddings": False,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.pad_token_id,
    }


def _encoder_kwargs(tokenizer, tiny: dict) -> dict:
    """A small ``RobertaConfig`` with roberta-base's conventions (positions offset by pad id + 1,
    one token type, LayerNorm eps 1e-5; the tokenizer's ids <s>=0, <pad>=1, </s>=2 as RoBERTa's)."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": int(tiny["d_model"]),
        "num_hidden_layers": int(tiny["encoder_layers"]),
        "num_attention_heads": int(tiny["heads"]),
        "intermediate_size": int(tiny["ffn_dim"]),
        "max_position_embeddings": int(tiny["max_source_length"]) + tokenizer.pad_token_id + 1,
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "hidden_dropout_prob": float(tiny.get("dropout", 0.1)),
        "attention_probs_dropout_prob": float(tiny.get("dropout", 0.1)),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }


def load_encoder(path: str | os.PathLike, seed: int = 0):
    """Load the bare encoder (``RobertaModel``) of an encoder backbone folder -- both scales.

    The checkpoints (hub roberta-base, our tiny one) are ``RobertaForMaskedLM``: the pooler is not
    in them and is initialised fresh; ``seed`` makes that initialisation reproducible (only
    FedAvg (Full FT) trains it, and no method reads it).
    """
    import torch
    from transformers import AutoConfig

    path = Path(path)
    if not (path / "config.json").exists():
        raise InputError(
            f"{path}: not a backbone folder (no config.json); run the backbone rule or set "
            f"backbones.<name>.local_dir"
        )
    arch = (AutoConfig.from_pretrained(path).architectures or [None])[0]
    name = ENCODER_CLASSES.get(arch, arch)
    if name != "RobertaModel":
        raise InputError(f"{path}: {arch} is not an encoder backbone (expected RobertaForMaskedLM)")
    torch.manual_seed(seed)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "pooler newly initialised" is expected, see above
    try:
        return model_class(name).from_pretrained(path)
    finally:
        hf_logging.set_verbosity(verbosity)


def _position_kwargs(class_name: str, tiny: dict) -> dict:
    max_source, max_target = int(tiny["max_source_length"]), int(tiny["max_target_length"])
    if class_name.startswith("LED"):
        window = int(tiny.get("attention_window", 32))
        return {
            "max_encoder_position_embeddings": max_source,
            # the denoising warm-up decodes whole source texts, so the decoder gets source-length
            # positions (real LED-large: 16384 encoder / 1024 decoder positions)
            "max_decoder_position_embeddings": max(max_source, max_target),
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
    arch = GENERATION_CLASSES.get(arch, arch)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = model_class(arch).from_pretrained(path)
    contiguous_sequence_first_inputs(model)
    return tokenizer, model


# attention modules that transpose their input to (sequence, batch, features) before their Linear
# projections (Longformer's sliding-window attention, which LED's encoder uses)
SEQUENCE_FIRST_ATTENTION = ("LEDEncoderSelfAttention", "LongformerSelfAttention")


def _contiguous_input(module, args):
    x = args[0] if args else None
    if x is not None and x.dim() >= 3 and not x.is_contiguous():
        return (x.contiguous(), *args[1:])
    return None


def contiguous_sequence_first_inputs(model) -> int:
    """Give the Linear projections of Longformer-style encoder attention (LED-large's
    ``LEDEncoderSelfAttention``) a contiguous input; returns how many Linear layers got the hook.

    Those modules call their ``query``/``key``/``value`` (and ``*_global``) Linear layers on
    ``hidden_states.transpose(0, 1)``.  PyTorch's ``matmul`` folds such a 3-D input into one
    ``mm`` only when the weight requires grad; for a *frozen* weight (AdaFedSelecKD's backbone,
    FedMCP's) it broadcasts the weight to a batch of one copy per sequence position and calls
    ``bmm``, and on the CPU in bfloat16 (oneDNN) that batch is materialised: a 1,024 x 1,024 weight
    copied 2,048 times, 4 GB, per projection and pass.  Measured on this project's 2-core machine,
    one thread, a frozen ``Linear(1024, 1024)`` on a transposed (512, 2, 1024) input: 2.2-2.8 s in
    bfloat16 (weights or autocast) vs 0.016-0.018 s contiguous, and 0.088 vs 0.029 s in float32.
    That made the CPU rehearsal's LED-large cell take over an hour (issue 23).  A forward pre-hook
    (transformers has no option for it) copies the activation once to contiguous memory -- what
    ``matmul`` itself does for a trainable weight -- so the projection is one ``mm``: the same
    mathematics, not the same float32 rounding as the ``bmm`` path.  Other architectures do not
    transpose before their projections and are left unchanged.
    """
    from torch import nn

    hooked = 0
    for module in model.modules():
        if type(module).__name__ not in SEQUENCE_FIRST_ATTENTION:
            continue
        for child in module.children():
            if isinstance(child, nn.Linear) and not getattr(child, "_fedrepro_contiguous", False):
                child.register_forward_pre_hook(_contiguous_input)
                child._fedrepro_contiguous = True
                hooked += 1
    return hooked


def prepare_backbone(
    settings: dict,
    texts: Sequence[str],
    out_dir: str | os.PathLike,
    seed: int = 0,
    warmup_texts: Sequence[str] | None = None,
) -> Path:
    """Make ``out_dir`` a loadable backbone folder, per ``settings`` (see workflow.backbone_settings).

    ``kind: tiny`` builds the demo model; ``kind: hub`` links a user's local copy
    (``local_dir``) or downloads ``hub_id`` at ``revision``; ``kind: shape`` builds ``hub_id``'s
    architecture at its true dimensions with random weights (:func:`build_shape_backbone`).
    """
    spec = get_spec(settings["name"])
    if settings["kind"] == "tiny":
        return build_tiny_backbone(spec, texts, out_dir, settings["tiny"], seed, warmup_texts)
    if settings["kind"] == "shape":
        return build_shape_backbone(spec, texts, out_dir, settings.get("hub_id"), seed)
    return hub_snapshot(
        out_dir,
        settings["hub_id"],
        settings["revision"],
        settings.get("local_dir"),
        f"backbones.{settings['name']}.local_dir",
    )


def prepare_backbone_from_files(settings: dict, train_files: Sequence[str], out_dir: str) -> Path:
    """Workflow entry for a tiny or shape backbone (a shape backbone only trains its tokenizer
    on the texts below, see :func:`build_shape_backbone`).

    Summarization records (``input``/``target``): the tokenizer learns its vocabulary from the
    training inputs *and* targets, the denoising warm-up sees the training *inputs* only (never
    a summary).  Sentence-pair records (GLUE, ``text_a``/``text_b``): the tokenizer learns from
    every text (no labels are read), the masked-LM warm-up sees only the official *test* split,
    which is unlabelled and never part of any client's data (FedMCP's client test sets are carved
    from train/dev, see :func:`fedrepro.data.partition.fedmcp_cross_task`).
    """
    from fedrepro.io import read_jsonl

    records = [r for f in train_files for r in read_jsonl(f)]
    if records and "text_a" in records[0]:
        def texts(rs):
            return [t for r in rs for t in (r.get("text_a"), r.get("text_b")) if t]

        tokenizer_texts = texts(records)
        warmup_texts = texts([r for r in records if r.get("split") == "test"])
        return prepare_backbone(settings, tokenizer_texts, out_dir, warmup_texts=warmup_texts)
    records = [r for r in records if r.get("split", "train") == "train"]
    tokenizer_texts = [r["input"] for r in records] + [r["target"] for r in records]
    warmup_texts = [r["input"] for r in records]
    return prepare_backbone(settings, tokenizer_texts, out_dir, warmup_texts=warmup_texts)


def builds_locally(settings: Mapping) -> bool:
    """Whether preparing a backbone may need the training text: a tiny or shape backbone, or a hub
    backbone with the rehearsal's ``fallback: shape`` (:func:`fetch_or_shape`)."""
    return settings.get("kind") in ("tiny", "shape") or (
        settings.get("kind", "hub") == "hub" and settings.get("fallback") == "shape"
    )


def fetch_or_shape(settings: Mapping, prepare: Callable[[dict], Path]) -> Path:
    """``prepare(settings)``; for a rehearsal's hub backbone (``fallback: shape``, set by
    :func:`fedrepro.rehearsal.plan.apply`) whose checkpoint cannot be fetched, log why and
    ``prepare`` it as ``kind: shape`` instead (the true dimensions, random weights).  Outside a
    rehearsal nothing falls back: a missing checkpoint is an error, never random weights."""
    settings = dict(settings)
    fallback = settings.pop("fallback", None)
    if fallback is None:
        return prepare(settings)
    if fallback != "shape":
        raise InputError(f"backbone fallback must be 'shape', got {fallback!r}")
    if settings.get("kind", "hub") != "hub":
        return prepare(settings)
    try:
        return prepare(settings)
    except Exception as exc:  # noqa: BLE001 - any fetch failure: the rehearsal goes on, logged
        name = settings.get("name") or settings.get("hub_id")
        log.warning(
            "%s: checkpoint %s@%s could not be fetched (%s: %s); REHEARSAL: building %s at its "
            "true dimensions with random weights (kind: shape) -- shapes, memory and speed only",
            name, settings.get("hub_id"), settings.get("revision"), type(exc).__name__,
            str(exc).splitlines()[0][:300] if str(exc) else "", settings.get("hub_id"),
        )
        return prepare({**settings, "kind": "shape"})
