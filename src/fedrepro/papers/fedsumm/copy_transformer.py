"""CopyTransformer (CT) and the copy distribution ("CD") switch for BART (FedSUMM §III-B, Fig. 2;
Table II's ablation "Bart + CD").

The paper describes CT only as "Transformer with a copy distribution attention mechanism" that
"constrains the model to generating summaries" by "choosing probabilities that filter possible
phrases" (its [28]/[29]).  We implement the standard pointer-generator mixture (See et al., 2017,
eq. 9) on a Transformer encoder–decoder::

    P(w) = p_gen · P_vocab(w) + (1 − p_gen) · Σ_{i: x_i = w} a_i                     (copy mixture)
    p_gen = sigmoid(w_h·s_t + w_c·c_t + w_y·y_{t-1} + b),   c_t = Σ_i a_i h_i

over an *extended vocabulary*: the model vocabulary (ids ``0..V-1``) plus, per example, the source
tokens the vocabulary lacks (ids ``V, V+1, …`` in order of first appearance in the source).  Such a
source-only token has ``P_vocab = 0`` and gets probability mass only through copying.  A target
token that is neither in the vocabulary nor in its source stays ``[UNK]``.  Decoder inputs use
``[UNK]`` for extended ids (the embedding table has only V rows).

Where the copy attention ``a`` comes from (our choice; the paper does not say):

* **CT** (:class:`CopyTransformer`): ``torch.nn.Transformer`` layers do not expose their attention
  weights, so a learned single-head scaled dot-product attention from the last decoder states to
  the encoder states (:class:`CopyHead`) gives ``a``.
* **BART + CD** (:class:`BartWithCopy`): by default the *last decoder layer's cross-attention*,
  averaged over heads (the pretrained attention BART already computes; the only new parameters
  are p_gen's, so the ablation changes BART as little as possible).  ``attention="learned"``
  switches to the same learned attention as CT.  Cross-attention weights need the ``eager``
  attention implementation, which the wrapper selects.

Loss (:func:`copy_nll_loss`): mean over non-padding target tokens of ``−log P(y_t)`` (clamped at
1e-12 so a zero probability gives a large finite loss instead of ``inf``).  Generation
(:func:`generate_with_copy`): greedy (beam 1) or beam search over the extended vocabulary, the
decoder re-run over the whole prefix at each step (no cache: demo-scale lengths).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedrepro.data.seq2seq import IGNORE_INDEX, shift_right
from fedrepro.io import InputError, safetensors_save_atomic, write_text_atomic

PROB_FLOOR = 1e-12
"""Probabilities are clamped at this value before the log in the loss and in beam scores."""


# -- the mixture ------------------------------------------------------------------------------------
def copy_mixture(
    vocab_logits: torch.Tensor,
    copy_attention: torch.Tensor,
    p_gen: torch.Tensor,
    src_ext_ids: torch.Tensor,
    n_oov: int,
) -> torch.Tensor:
    """Pointer-generator mixture over the extended vocabulary (See et al. 2017, eq. 9; FedSUMM's CD).

    Parameters
    ----------
    vocab_logits : Tensor (B, T, V)
        Decoder logits over the model vocabulary.
    copy_attention : Tensor (B, T, S)
        Copy attention over source positions; each row sums to 1 over the real (non-pad) source
        tokens and is 0 on padding.
    p_gen : Tensor (B, T, 1) or (B, T)
        Generation probability in [0, 1].
    src_ext_ids : Tensor (B, S)
        Source token ids in the extended vocabulary (``>= V`` for source-only tokens).
    n_oov : int
        Number of extended ids (the largest number of source-only tokens of an example).

    Returns
    -------
    Tensor (B, T, V + n_oov)
        ``P(w) = p_gen·P_vocab(w) + (1 − p_gen)·Σ_{i: x_i = w} a_i``; every row sums to 1.
    """
    if vocab_logits.dim() != 3 or copy_attention.dim() != 3:
        raise InputError(
            f"vocab_logits and copy_attention must be (B, T, ·), got {tuple(vocab_logits.shape)} "
            f"and {tuple(copy_attention.shape)}"
        )
    b, t, v = vocab_logits.shape
    if copy_attention.shape[:2] != (b, t) or src_ext_ids.shape != (b, copy_attention.shape[2]):
        raise InputError(
            f"shape mismatch: logits {tuple(vocab_logits.shape)}, attention "
            f"{tuple(copy_attention.shape)}, src_ext_ids {tuple(src_ext_ids.shape)}"
        )
    if n_oov < 0:
        raise InputError(f"n_oov must be >= 0, got {n_oov}")
    if src_ext_ids.numel() and int(src_ext_ids.max()) >= v + n_oov:
        raise InputError(
            f"src_ext_ids has id {int(src_ext_ids.max())} but the extended vocabulary has only "
            f"{v} + {n_oov} entries"
        )
    if p_gen.dim() == 2:
        p_gen = p_gen.unsqueeze(-1)
    p_vocab = torch.softmax(vocab_logits.float(), dim=-1)
    mixed = torch.cat([p_gen * p_vocab, p_vocab.new_zeros(b, t, n_oov)], dim=-1)
    index = src_ext_ids.unsqueeze(1).expand(b, t, src_ext_ids.shape[1])
    return mixed.scatter_add(2, index, (1.0 - p_gen) * copy_attention.float())


def copy_nll_loss(
    probs: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """Mean negative log-likelihood of the mixed distribution over non-ignored target tokens.

    Parameters
    ----------
    probs : Tensor (B, T, V_ext)
        Output of :func:`copy_mixture`.
    labels : Tensor (B, T)
        Extended-vocabulary target ids, ``ignore_index`` on padding.
    """
    mask = labels != ignore_index
    if not bool(mask.any()):
        raise InputError("the batch has no target tokens (every label is padding)")
    if int(labels[mask].max()) >= probs.shape[-1]:
        raise InputError(
            f"label id {int(labels[mask].max())} outside the {probs.shape[-1]}-entry extended vocabulary"
        )
    picked = probs.gather(2, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    nll = -torch.log(picked.clamp_min(PROB_FLOOR))
    return nll[mask].mean()


class CopyHead(nn.Module):
    """p_gen and (optionally) a learned copy attention.

    ``p_gen = sigmoid(W [s_t; c_t; e(y_{t-1})] + b)`` with ``c_t = Σ_i a_i h_i``.  When no
    attention is passed in, ``a = softmax_i((W_q s_t)·(W_k h_i) / √d)`` over the non-pad source
    positions (single head).
    """

    def __init__(self, d_model: int, learned_attention: bool) -> None:
        super().__init__()
        self.d_model = d_model
        self.learned_attention = learned_attention
        if learned_attention:
            self.query = nn.Linear(d_model, d_model, bias=False)
            self.key = nn.Linear(d_model, d_model, bias=False)
        self.p_gen = nn.Linear(3 * d_model, 1)

    def attention(
        self, dec_states: torch.Tensor, enc_states: torch.Tensor, src_mask: torch.Tensor
    ) -> torch.Tensor:
        scores = (
            self.query(dec_states) @ self.key(enc_states).transpose(1, 2) / math.sqrt(self.d_model)
        )
        scores = scores.masked_fill(~src_mask.bool().unsqueeze(1), float("-inf"))
        return torch.softmax(scores.float(), dim=-1)

    def forward(self, dec_states, enc_states, src_mask, dec_input_embeds, attention=None):
        """Return ``(a, p_gen)``: (B, T, S) copy attention and (B, T, 1) generation probability."""
        if attention is None:
            if not self.learned_attention:
                raise InputError(
                    "this CopyHead has no learned attention: pass the attention weights"
                )
            attention = self.attention(dec_states, enc_states, src_mask)
        else:  # renormalise over real source tokens (eager attention leaves ~0 on padding)
            attention = attention.float() * src_mask.unsqueeze(1).float()
            attention = attention / attention.sum(-1, keepdim=True).clamp_min(PROB_FLOOR)
        context = attention.to(enc_states.dtype) @ enc_states
        p_gen = torch.sigmoid(
            self.p_gen(torch.cat([dec_states, context, dec_input_embeds], dim=-1))
        )
        return attention, p_gen


# -- CopyTransformer --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CopyTransformerConfig:
    """Architecture of :class:`CopyTransformer` (saved as ``copy_transformer.json``)."""

    vocab_size: int
    pad_token_id: int
    unk_token_id: int
    bos_token_id: int
    eos_token_id: int
    decoder_start_token_id: int
    d_model: int = 256
    heads: int = 4
    encoder_layers: int = 3
    decoder_layers: int = 3
    ffn_dim: int = 1024
    dropout: float = 0.1
    max_positions: int = 1024
    use_copy: bool = True

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise InputError(f"CT d_model {self.d_model} is not divisible by heads {self.heads}")
        for name in (
            "pad_token_id",
            "unk_token_id",
            "bos_token_id",
            "eos_token_id",
            "decoder_start_token_id",
        ):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise InputError(
                    f"CT {name} = {getattr(self, name)} outside the vocabulary of {self.vocab_size}"
                )


def _sinusoidal(max_positions: int, d_model: int) -> torch.Tensor:
    position = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div[: d_model // 2])
    return table


class _CopyModel(nn.Module):
    """What both copy models share: ``forward`` = :meth:`decode` of :meth:`encode`'s states.

    Subclasses define ``encode(input_ids, attention_mask)`` -> encoder states (B, S, d) and
    ``decode(enc_states, attention_mask, decoder_input_ids, src_ext_ids, n_oov)`` -> the
    extended-vocabulary distribution (B, T, V + n_oov); :func:`generate_with_copy` calls the two
    separately (encoding once per batch).
    """

    def forward(
        self, input_ids, attention_mask, decoder_input_ids, src_ext_ids, n_oov
    ) -> torch.Tensor:
        return self.decode(
            self.encode(input_ids, attention_mask),
            attention_mask,
            decoder_input_ids,
            src_ext_ids,
            n_oov,
        )


class CopyTransformer(_CopyModel):
    """Transformer encoder–decoder with a pointer-generator copy distribution (FedSUMM's CT).

    Shared source/target embedding scaled by √d plus sinusoidal positions (Vaswani et al.),
    post-norm ``nn.TransformerEncoder``/``Decoder`` layers, output projection tied to the
    embedding, and a :class:`CopyHead` with learned attention.  ``config.use_copy = False`` gives
    the plain Transformer (``P = P_vocab``, zero mass on extended ids).
    """

    def __init__(self, config: CopyTransformerConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        nn.init.normal_(self.embed.weight, std=d**-0.5)
        with torch.no_grad():
            self.embed.weight[config.pad_token_id].zero_()
        self.register_buffer("positions", _sinusoidal(config.max_positions, d), persistent=False)
        enc_layer = nn.TransformerEncoderLayer(
            d, config.heads, config.ffn_dim, config.dropout, batch_first=True
        )
        dec_layer = nn.TransformerDecoderLayer(
            d, config.heads, config.ffn_dim, config.dropout, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(
            enc_layer, config.encoder_layers, enable_nested_tensor=False
        )
        self.decoder = nn.TransformerDecoder(dec_layer, config.decoder_layers)
        self.copy_head = CopyHead(d, learned_attention=True)

    @classmethod
    def from_tokenizer(cls, tokenizer, **arch) -> CopyTransformer:
        """A CT over ``tokenizer``'s vocabulary (BERT-style specials: [CLS] bos, [SEP] eos/start)."""
        return cls(
            CopyTransformerConfig(
                vocab_size=len(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
                unk_token_id=tokenizer.unk_token_id,
                bos_token_id=tokenizer.cls_token_id,
                eos_token_id=tokenizer.sep_token_id,
                decoder_start_token_id=tokenizer.sep_token_id,
                **arch,
            )
        )

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] > self.config.max_positions:
            raise InputError(
                f"sequence of {ids.shape[1]} tokens exceeds CT max_positions {self.config.max_positions}"
            )
        return self.embed(ids) * math.sqrt(self.config.d_model) + self.positions[: ids.shape[1]]

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Encoder states (B, S, d)."""
        return self.encoder(self._embed(input_ids), src_key_padding_mask=~attention_mask.bool())

    def decode(
        self, enc_states, attention_mask, decoder_input_ids, src_ext_ids, n_oov
    ) -> torch.Tensor:
        """Extended-vocabulary distribution (B, T, V + n_oov) given encoder states."""
        t = decoder_input_ids.shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf"), device=decoder_input_ids.device), 1)
        dec_in = self._embed(decoder_input_ids)
        dec = self.decoder(
            dec_in, enc_states, tgt_mask=causal, memory_key_padding_mask=~attention_mask.bool()
        )
        logits = F.linear(dec, self.embed.weight)
        if not self.config.use_copy:
            p_vocab = torch.softmax(logits.float(), dim=-1)
            return torch.cat([p_vocab, p_vocab.new_zeros(*p_vocab.shape[:2], n_oov)], dim=-1)
        attn, p_gen = self.copy_head(dec, enc_states, attention_mask, self.embed(decoder_input_ids))
        return copy_mixture(logits, attn, p_gen, src_ext_ids, n_oov)

    def save_pretrained(self, out_dir: str | os.PathLike) -> None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(
            out_dir / "copy_transformer.json",
            json.dumps(dataclasses.asdict(self.config), indent=2, sort_keys=True) + "\n",
        )
        safetensors_save_atomic(
            {k: v.contiguous() for k, v in self.state_dict().items()},
            out_dir / "copy_transformer.safetensors",
        )

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> CopyTransformer:
        from safetensors.torch import load_file

        path = Path(path)
        cfg_path = path / "copy_transformer.json"
        if not cfg_path.is_file():
            raise InputError(f"{path}: not a CopyTransformer folder (no copy_transformer.json)")
        model = cls(CopyTransformerConfig(**json.loads(cfg_path.read_text(encoding="utf-8"))))
        model.load_state_dict(load_file(str(path / "copy_transformer.safetensors")))
        return model.eval()  # as transformers' from_pretrained: call .train() to fine-tune


# -- BART + CD --------------------------------------------------------------------------------------
class BartWithCopy(_CopyModel):
    """``BartForConditionalGeneration`` with the copy distribution switched on (Table II, "+ CD").

    Parameters
    ----------
    bart : BartForConditionalGeneration
        The backbone; its parameters stay the module's parameters (fine-tuned together).
    attention : {"cross_attention", "learned"}
        Copy attention: the last decoder layer's cross-attention averaged over heads (default),
        or a learned single-head attention (:class:`CopyHead`).
    """

    ATTENTIONS = ("cross_attention", "learned")

    def __init__(self, bart, attention: str = "cross_attention") -> None:
        super().__init__()
        if attention not in self.ATTENTIONS:
            raise InputError(f"copy attention must be one of {self.ATTENTIONS}, got {attention!r}")
        self.bart = bart
        self.attention_source = attention
        if attention == "cross_attention":
            bart.set_attn_implementation("eager")
        self.copy_head = CopyHead(bart.config.d_model, learned_attention=attention == "learned")
        cfg = bart.config
        self.ids = {
            "pad_token_id": cfg.pad_token_id,
            "eos_token_id": cfg.eos_token_id,
            "decoder_start_token_id": cfg.decoder_start_token_id,
        }

    @property
    def vocab_size(self) -> int:
        return int(self.bart.config.vocab_size)

    def encode(self, input_ids, attention_mask) -> torch.Tensor:
        return self.bart.get_encoder()(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state

    def decode(
        self, enc_states, attention_mask, decoder_input_ids, src_ext_ids, n_oov
    ) -> torch.Tensor:
        cross = self.attention_source == "cross_attention"
        from transformers.modeling_outputs import BaseModelOutput

        out = self.bart(
            encoder_outputs=BaseModelOutput(last_hidden_state=enc_states),
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            output_attentions=cross,
            output_hidden_states=True,
            use_cache=False,
        )
        attention = out.cross_attentions[-1].mean(dim=1) if cross else None
        dec_embeds = self.bart.get_decoder().embed_tokens(decoder_input_ids)
        attn, p_gen = self.copy_head(
            out.decoder_hidden_states[-1], enc_states, attention_mask, dec_embeds, attention
        )
        return copy_mixture(out.logits, attn, p_gen, src_ext_ids, n_oov)

    def save_pretrained(self, out_dir: str | os.PathLike) -> None:
        out_dir = Path(out_dir)
        self.bart.save_pretrained(out_dir)
        write_text_atomic(
            out_dir / "copy_head.json", json.dumps({"attention": self.attention_source}) + "\n"
        )
        safetensors_save_atomic(
            {k: v.contiguous() for k, v in self.copy_head.state_dict().items()},
            out_dir / "copy_head.safetensors",
        )

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> BartWithCopy:
        from safetensors.torch import load_file
        from transformers import BartForConditionalGeneration

        path = Path(path)
        head_cfg = path / "copy_head.json"
        if not head_cfg.is_file():
            raise InputError(
                f"{path}: no copy_head.json (not saved by BartWithCopy.save_pretrained)"
            )
        attention = json.loads(head_cfg.read_text(encoding="utf-8"))["attention"]
        model = cls(BartForConditionalGeneration.from_pretrained(path), attention=attention)
        model.copy_head.load_state_dict(load_file(str(path / "copy_head.safetensors")))
        return model.eval()


def _special_ids(model) -> dict:
    if isinstance(model, BartWithCopy):
        return model.ids
    return {
        "pad_token_id": model.config.pad_token_id,
        "eos_token_id": model.config.eos_token_id,
        "decoder_start_token_id": model.config.decoder_start_token_id,
    }


# -- batches ----------------------------------------------------------------------------------------
def _copy_tokens(tokenizer, text: str, max_tokens: int) -> list[tuple[int, str]]:
    """(vocabulary id, surface string) per WordPiece token; ``[UNK]`` tokens keep their source text."""
    enc = tokenizer(
        text,
        add_special_tokens=False,
        return_offsets_mapping=True,
        truncation=True,
        max_length=max_tokens,
    )
    unk = tokenizer.unk_token_id
    out = []
    for tid, (start, end) in zip(enc["input_ids"], enc["offset_mapping"]):
        surface = text[start:end] if tid == unk else tokenizer.convert_ids_to_tokens(tid)
        out.append((int(tid), surface))
    return out


def make_copy_batch(
    tokenizer,
    sources: Sequence[str],
    targets: Sequence[str] | None,
    vocab_size: int,
    max_source_length: int,
    max_target_length: int,
    decoder_start_token_id: int | None = None,
) -> dict:
    """Tensors for a copy model: ``[CLS] x [SEP]`` sources, ``[CLS] y [SEP]`` labels.

    Parameters
    ----------
    tokenizer : BertTokenizer
        The model's tokenizer.
    sources, targets : sequences of str
        Inputs and reference summaries (``targets=None`` for generation).
    vocab_size : int
        The model's output vocabulary size V; extended ids start at V.
    max_source_length, max_target_length : int
        Limits including the two special tokens.
    decoder_start_token_id : int, optional
        Defaults to the tokenizer's ``[SEP]`` (BART's decoder start).

    Returns
    -------
    dict
        ``input_ids``, ``attention_mask``, ``src_ext_ids`` (B, S); ``n_oov`` (int);
        ``oov_tokens`` (per example, the source-only strings for ids V, V+1, …); with targets also
        ``labels`` (B, T; extended ids, -100 on padding) and ``decoder_input_ids`` (labels shifted
        right, extended ids mapped to ``[UNK]``).
    """
    if targets is not None and len(targets) != len(sources):
        raise InputError(f"{len(sources)} sources but {len(targets)} targets")
    if not sources:
        raise InputError("no examples to batch")
    if max_source_length < 3 or max_target_length < 3:
        raise InputError(
            "max_source_length and max_target_length must be >= 3 (two special tokens + text)"
        )
    if len(tokenizer) > vocab_size:
        raise InputError(
            f"tokenizer has {len(tokenizer)} entries, more than the model vocabulary {vocab_size}"
        )
    cls_id, sep_id, pad_id, unk_id = (
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
    )
    start_id = sep_id if decoder_start_token_id is None else decoder_start_token_id
    src_rows, ext_rows, oov_lists, label_rows = [], [], [], []
    for i, src in enumerate(sources):
        if not isinstance(src, str):
            raise InputError(f"sources[{i}] is {type(src).__name__}, expected str")
        oov: list[str] = []
        ids, ext = [cls_id], [cls_id]
        for tid, surface in _copy_tokens(tokenizer, src, max_source_length - 2):
            ids.append(tid)
            if tid == unk_id:
                if surface not in oov:
                    oov.append(surface)
                ext.append(vocab_size + oov.index(surface))
            else:
                ext.append(tid)
        ids.append(sep_id)
        ext.append(sep_id)
        src_rows.append(ids)
        ext_rows.append(ext)
        oov_lists.append(oov)
        if targets is not None:
            if not isinstance(targets[i], str):
                raise InputError(f"targets[{i}] is {type(targets[i]).__name__}, expected str")
            lab = [cls_id]
            for tid, surface in _copy_tokens(tokenizer, targets[i], max_target_length - 2):
                lab.append(
                    vocab_size + oov.index(surface) if tid == unk_id and surface in oov else tid
                )
            lab.append(sep_id)
            label_rows.append(lab)
    s = max(len(r) for r in src_rows)
    batch = {
        "input_ids": torch.full((len(sources), s), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((len(sources), s), dtype=torch.long),
        "src_ext_ids": torch.full((len(sources), s), pad_id, dtype=torch.long),
        "n_oov": max(len(o) for o in oov_lists),
        "oov_tokens": oov_lists,
    }
    for i, (ids, ext) in enumerate(zip(src_rows, ext_rows)):
        batch["input_ids"][i, : len(ids)] = torch.tensor(ids)
        batch["attention_mask"][i, : len(ids)] = 1
        batch["src_ext_ids"][i, : len(ext)] = torch.tensor(ext)
    if targets is not None:
        t = max(len(r) for r in label_rows)
        labels = torch.full((len(sources), t), IGNORE_INDEX, dtype=torch.long)
        for i, lab in enumerate(label_rows):
            labels[i, : len(lab)] = torch.tensor(lab)
        in_vocab = labels.masked_fill(labels >= vocab_size, unk_id)
        batch["labels"] = labels
        batch["decoder_input_ids"] = shift_right(in_vocab, pad_id, start_id)
    return batch


def copy_probs(model, batch: dict) -> torch.Tensor:
    """A copy model's mixture distribution over the extended vocabulary for a
    :func:`make_copy_batch` batch (teacher forcing)."""
    return model(
        batch["input_ids"],
        batch["attention_mask"],
        batch["decoder_input_ids"],
        batch["src_ext_ids"],
        batch["n_oov"],
    )


def copy_loss(model, batch: dict) -> torch.Tensor:
    """Training loss of a copy model on a :func:`make_copy_batch` batch (NLL of the mixture)."""
    return copy_nll_loss(copy_probs(model, batch), batch["labels"])


# -- generation -------------------------------------------------------------------------------------
def _banned_by_ngram(seq: list[int], n: int) -> set[int]:
    if n <= 0 or len(seq) < n:
        return set()
    prefix = tuple(seq[-(n - 1) :]) if n > 1 else ()
    return {seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i : i + n - 1]) == prefix}


@torch.no_grad()
def generate_with_copy(
    model,
    tokenizer,
    batch: dict,
    max_new_tokens: int = 64,
    beam_size: int = 1,
    min_new_tokens: int = 0,
    length_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
) -> list[str]:
    """Greedy (``beam_size=1``) or beam search decoding of a copy model over the extended vocabulary.

    At each step the decoder sees the prefix with extended ids replaced by ``[UNK]``; the chosen
    extended id is turned back into its source string.  A hypothesis ends at ``[SEP]`` (eos);
    finished hypotheses are ranked by ``log P / length**length_penalty`` and the search stops when
    ``beam_size`` of them are finished or after ``max_new_tokens`` steps.

    Returns
    -------
    list of str
        One summary per example (special tokens dropped, WordPieces joined, see
        :func:`fedrepro.papers.fedsumm.bart.join_tokens`).
    """
    from fedrepro.papers.fedsumm.bart import join_tokens

    if beam_size < 1 or max_new_tokens < 1:
        raise InputError("beam_size and max_new_tokens must be >= 1")
    was_training = model.training
    model.eval()
    ids = _special_ids(model)
    eos, start = ids["eos_token_id"], ids["decoder_start_token_id"]
    v = model.vocab_size
    unk = tokenizer.unk_token_id
    special = set(tokenizer.all_special_ids)
    enc = model.encode(batch["input_ids"], batch["attention_mask"])
    outputs = []
    for b in range(batch["input_ids"].shape[0]):
        mem, mask, ext = (
            enc[b : b + 1],
            batch["attention_mask"][b : b + 1],
            batch["src_ext_ids"][b : b + 1],
        )
        n_oov = batch["n_oov"]
        beams: list[tuple[float, list[int]]] = [(0.0, [start])]
        finished: list[tuple[float, list[int]]] = []
        for step in range(max_new_tokens):
            k = len(beams)
            # made on the CPU and moved (not device=): the same on CUDA, and the device-strict
            # stand-in of tests/device_check.py sees the move
            prefix = torch.tensor([seq for _, seq in beams], dtype=torch.long).to(mem.device)
            prefix = prefix.masked_fill(prefix >= v, unk)
            probs = model.decode(
                mem.expand(k, -1, -1), mask.expand(k, -1), prefix, ext.expand(k, -1), n_oov
            )[:, -1]
            logp = torch.log(probs.clamp_min(PROB_FLOOR))
            logp[:, v + len(batch["oov_tokens"][b]) :] = float("-inf")  # other examples' OOV slots
            if step < min_new_tokens:
                logp[:, eos] = float("-inf")
            for j, (_, seq) in enumerate(beams):
                for banned in _banned_by_ngram(seq[1:], no_repeat_ngram_size):
                    logp[j, banned] = float("-inf")
            scores = torch.tensor([s for s, _ in beams]).to(logp.device).unsqueeze(1) + logp
            top = torch.topk(scores.flatten(), min(2 * beam_size, scores.numel()))
            new_beams = []
            for score, flat in zip(top.values.tolist(), top.indices.tolist()):
                if score == float("-inf"):
                    break
                j, w = divmod(flat, scores.shape[1])
                seq = beams[j][1] + [w]
                if w == eos:
                    finished.append((score / (len(seq) - 1) ** length_penalty, seq))
                else:
                    new_beams.append((score, seq))
                if len(new_beams) == beam_size:
                    break
            beams = new_beams
            if len(finished) >= beam_size or not beams:
                break
        if not finished:
            finished = [(s / max(len(seq) - 1, 1) ** length_penalty, seq) for s, seq in beams]
        best = max(finished, key=lambda fs: fs[0])[1][1:]
        tokens = []
        for w in best:
            if w >= v:
                tokens.append(batch["oov_tokens"][b][w - v])
            elif w not in special and w < len(tokenizer):
                tokens.append(tokenizer.convert_ids_to_tokens(w))
        outputs.append(join_tokens(tokens))
    if was_training:
        model.train()
    return outputs
