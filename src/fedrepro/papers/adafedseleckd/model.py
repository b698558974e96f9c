"""Adapter-based meeting summarizer (AdaFedSelecKD §III-B, Fig. 3).

A frozen seq2seq backbone (BART, LED, or LongT5 for the long meetings of §V-B.4) with bottleneck
adapters after each of its top-k decoder layers, one adapter stack per role (``global`` /
``local``).  What differs between the backbone families (where the decoder layers and their
cross-attention projections live, the final norm, T5's position biases and output scaling) is in
one table, :data:`DECODER_LAYOUTS`.

Performance (DESIGN.md): the backbone never receives gradients and always runs in eval mode.  For
one training batch the encoder and the decoder layers *below* the adapters run once, without
grad; their output (the input of the first adapted layer, with its attention masks and encoder
states) is captured and reused by every adapter path.  Only the top-k layers run once per path,
the teacher (global) path without grad, and the cross-attention keys/values of the encoder output
(frozen projections of a frozen input) are computed once and reused by the second path.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import OrderedDict
from collections.abc import Callable, Mapping

import torch
from torch import nn

from fedrepro.papers.adafedseleckd.adapters import (
    AdaptedDecoderLayer,
    AdapterRouter,
    AdapterStack,
    FrozenProjectionMemo,
)


class _PrefixCaptured(Exception):
    """Raised by the capture hook to stop the decoder after the frozen prefix."""


@dataclasses.dataclass(frozen=True)
class DecoderLayout:
    """Where one backbone family keeps what :class:`AdapterSummarizer` reads or wraps.

    ``layers``: the decoder attribute holding its layer list (the summarizer makes it readable as
    ``decoder.layers`` for every family).  ``cross_attention``: the path (attribute names, list
    indices) from a decoder layer to its cross-attention module, whose ``cross_kv`` projections
    are memoised where they are ``nn.Linear``.  ``final_norm`` / ``final_dropout``: the decoder's
    modules after its last layer (``None``: none).  ``threaded_outputs``: layer keyword argument
    -> index of the layer output that carries it to the next layer, as the decoder's own loop does
    (T5's position biases, computed by block 0 and shared by the blocks above).
    ``output_scale(config)``: the factor on the decoder output before ``lm_head`` (``None``: none).
    ``led_global_attention``: global attention on the first token (LED's summarization
    convention).  ``lazy_generation_cache``: generate with a cache that grows a layer per decoder
    layer it meets; transformers 5.23 sizes the default one by the *encoder*'s depth for T5-style
    configs (``num_hidden_layers`` = ``num_layers``), an IndexError when the decoder is deeper.
    """

    layers: str = "layers"
    cross_attention: tuple[str | int, ...] = ("encoder_attn",)
    cross_kv: tuple[str, ...] = ("k_proj", "v_proj")
    final_norm: str | None = "layer_norm"
    final_dropout: str | None = None
    threaded_outputs: Mapping[str, int] = dataclasses.field(default_factory=dict)
    output_scale: Callable[[object], float | None] = lambda config: None
    led_global_attention: bool = False
    lazy_generation_cache: bool = False


def _t5_output_scale(config) -> float | None:
    """T5's ``d_model ** -0.5`` on the decoder output when the LM head was trained tied to the
    embeddings (transformers >= 5 keeps that as ``scale_decoder_outputs``; 4.x read
    ``tie_word_embeddings``)."""
    scale = getattr(config, "scale_decoder_outputs", None)
    if scale is None:
        scale = getattr(config, "tie_word_embeddings", True)
    return config.d_model**-0.5 if scale else None


DECODER_LAYOUTS: dict[str, DecoderLayout] = {
    # BartDecoder: ``layers``; cross-attention ``encoder_attn.{k,v}_proj``; ``layer_norm`` is None
    # for BART and LED (add_final_layer_norm False); ``final_logits_bias`` is read separately
    "Bart": DecoderLayout(),
    "LED": DecoderLayout(led_global_attention=True),
    # LongT5Stack: ``block``; LongT5Block.layer = [self-attention, cross-attention, FF]; after the
    # last block ``final_layer_norm`` then ``dropout``; block 0 computes the self-attention
    # position bias (relative buckets) and the cross-attention bias (zeros) that every later
    # block receives (outputs 1 and 3 of a block)
    "LongT5": DecoderLayout(
        layers="block",
        cross_attention=("layer", 1, "EncDecAttention"),
        cross_kv=("k", "v"),
        final_norm="final_layer_norm",
        final_dropout="dropout",
        threaded_outputs={"position_bias": 1, "encoder_decoder_position_bias": 3},
        output_scale=_t5_output_scale,
        lazy_generation_cache=True,
    ),
}
"""Backbone class-name prefix -> its :class:`DecoderLayout`."""


def decoder_layout(backbone: nn.Module) -> DecoderLayout:
    """The :class:`DecoderLayout` of ``backbone``'s family (by class name)."""
    name = type(backbone).__name__
    for prefix, layout in DECODER_LAYOUTS.items():
        if name.startswith(prefix):
            return layout
    raise ValueError(
        f"AdapterSummarizer supports {sorted(DECODER_LAYOUTS)} backbones, got {name}"
    )


def _submodule(module: nn.Module, path: tuple[str | int, ...]) -> nn.Module | None:
    for step in path:
        if module is None:
            return None
        module = module[step] if isinstance(step, int) else getattr(module, step, None)
    return module


class AdapterSummarizer(nn.Module):
    """Frozen backbone + global/local adapters on the top-k decoder layers.

    Parameters
    ----------
    backbone : transformers ``BartForConditionalGeneration``, ``LEDForConditionalGeneration`` or
        ``LongT5ForConditionalGeneration`` (:data:`DECODER_LAYOUTS`)
    adapter_top_k : int
        Number of top decoder layers followed by adapters (paper: 6 large, 3 base; LongT5: 6 of
        12, our choice).  It may be every decoder layer: for LongT5 the first adapted block then
        computes the position biases itself and hands them on, as the decoder's own loop does.
    bottleneck : int
        Adapter bottleneck m (paper: 2048 large, 1536 base; LongT5-base: 1536).
    roles : tuple of str
        ``("local",)`` for single-adapter methods, ``("global", "local")`` for the KD methods.
    backbone_dropout : bool
        Whether the frozen backbone's dropout runs while the adapters train
        (``adafedseleckd.train.backbone_dropout``; docs/decisions.md).  False: the backbone is
        always in eval mode.  True: it follows the module's train/eval mode, as in a HuggingFace
        training loop over the whole model; the frozen prefix is still computed once per batch
        (one dropout draw shared by both adapter paths) and the teacher (global) path's top layers
        run without dropout, as a distillation teacher does.
    """

    def __init__(
        self,
        backbone: nn.Module,
        adapter_top_k: int,
        bottleneck: int,
        roles: tuple[str, ...] = ("local",),
        backbone_dropout: bool = False,
    ) -> None:
        super().__init__()
        self.backbone_dropout = bool(backbone_dropout)
        self.backbone = backbone
        for p in self.backbone.parameters():
            p.requires_grad_(False)
        self.layout = decoder_layout(backbone)
        decoder = backbone.get_decoder()
        if self.layout.layers != "layers":
            # ``decoder.layers`` for every family: a plain alias of the same ModuleList (not a
            # second registration, so no duplicate parameters or state-dict keys)
            object.__setattr__(decoder, "layers", getattr(decoder, self.layout.layers))
        n_layers = len(decoder.layers)
        if not 1 <= adapter_top_k <= n_layers:
            raise ValueError(
                f"adapter_top_k={adapter_top_k} but the backbone decoder has {n_layers} layers"
            )
        self.first_adapted = n_layers - adapter_top_k
        d_model = backbone.config.d_model
        self.stacks = nn.ModuleDict(
            {role: AdapterStack(d_model, bottleneck, adapter_top_k) for role in roles}
        )
        if "global" in self.stacks:
            self.stacks["global"].requires_grad_(False)  # §III-B3: never optimised locally
        self.router = AdapterRouter(self.stacks)
        self._kv_memos: list[FrozenProjectionMemo] = []
        for j, idx in enumerate(range(self.first_adapted, n_layers)):
            cross = _submodule(decoder.layers[idx], self.layout.cross_attention)
            for name in self.layout.cross_kv:
                if cross is not None and isinstance(getattr(cross, name, None), nn.Linear):
                    memo = FrozenProjectionMemo(getattr(cross, name))
                    setattr(cross, name, memo)
                    self._kv_memos.append(memo)
            decoder.layers[idx] = AdaptedDecoderLayer(decoder.layers[idx], self.router, j)
        self.is_led = self.layout.led_global_attention
        self._output_scale = self.layout.output_scale(backbone.config)
        bias = getattr(backbone, "final_logits_bias", None)
        # BART/LED ship an all-zero logits bias: decided once here, not on every forward
        self._use_logits_bias = bias is not None and bool(bias.any())
        self.backbone.eval()

    # -- modes and parameters -------------------------------------------------------------
    def train(self, mode: bool = True) -> AdapterSummarizer:
        super().train(mode)
        if not self.backbone_dropout:
            self.backbone.eval()  # frozen backbone: no dropout, whatever the adapters' mode
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def adapter_state(self, role: str) -> OrderedDict[str, torch.Tensor]:
        return self.stacks[role].shared_state()

    def load_adapter_state(self, role: str, state: dict[str, torch.Tensor]) -> None:
        self.stacks[role].load_shared_state(state)

    # -- forward --------------------------------------------------------------------------
    def _encoder_kwargs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.is_led:
            # LED summarization convention: global attention on the first (<s>) token.
            gam = torch.zeros_like(attention_mask)
            gam[:, 0] = 1
            kwargs["global_attention_mask"] = gam
        return kwargs

    def _capture(
        self,
        layer_index: int,
        decoder_input_ids: torch.Tensor,
        encoder_states: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> tuple[tuple, dict]:
        """Run the decoder up to its ``layer_index``-th layer and return that layer's arguments."""
        decoder = self.backbone.get_decoder()
        captured: dict = {}

        def hook(_module, args, kwargs):
            captured["args"], captured["kwargs"] = args, kwargs
            raise _PrefixCaptured

        handle = decoder.layers[layer_index].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            decoder(
                input_ids=decoder_input_ids,
                encoder_hidden_states=encoder_states,
                encoder_attention_mask=attention_mask,
                use_cache=False,
            )
        except _PrefixCaptured:
            pass
        finally:
            handle.remove()
        if "args" not in captured:
            raise RuntimeError("decoder did not reach the first adapted layer")
        return captured["args"], captured["kwargs"]

    @torch.no_grad()
    def frozen_prefix(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        decoder_input_ids: torch.Tensor,
    ) -> tuple[tuple, dict]:
        """Run the encoder and the unadapted lower decoder layers once, without grad.

        Returns the positional and keyword arguments the first adapted layer receives.
        """
        for memo in self._kv_memos:
            memo.clear()
        encoder = self.backbone.get_encoder()
        enc = encoder(**self._encoder_kwargs(input_ids, attention_mask)).last_hidden_state
        args, kwargs = self._capture(self.first_adapted, decoder_input_ids, enc, attention_mask)
        if self.layout.threaded_outputs:
            # by name, so that adapted_logits can hand each layer's outputs to the next one
            decoder = self.backbone.get_decoder()
            layer = decoder.layers[self.first_adapted].layer
            bound = inspect.signature(layer.forward).bind(*args, **kwargs)
            named = dict(bound.arguments)
            for name, param in inspect.signature(layer.forward).parameters.items():
                if param.kind is inspect.Parameter.VAR_KEYWORD:
                    named.update(named.pop(name, {}))
            args, kwargs = (named.pop("hidden_states"),), named
        return args, kwargs

    # -- the canonical per-example prefix (issue 16: the frozen-prefix cache) ---------------
    @property
    def supports_example_prefix(self) -> bool:
        """Whether :meth:`assemble_prefix` can rebuild a batch's prefix from per-example parts:
        every decoder layer then receives the same mask arguments (BART, LED).  Not LongT5,
        whose lower blocks hand position biases up (``threaded_outputs``)."""
        return not self.layout.threaded_outputs

    @torch.no_grad()
    def example_prefix_parts(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        decoder_input_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One example's frozen prefix, computed on the example alone (a batch of one, unpadded):
        its encoder output ``[S, d]`` and the input of the first adapted decoder layer ``[T, d]``
        -- a function of the frozen backbone and the example only when the backbone runs without
        dropout (:mod:`fedrepro.papers.adafedseleckd.prefix_cache`)."""
        if input_ids.shape[0] != 1:
            raise ValueError("example_prefix_parts takes one unpadded example")
        encoder = self.backbone.get_encoder()
        enc = encoder(**self._encoder_kwargs(input_ids, attention_mask)).last_hidden_state
        args, _ = self._capture(self.first_adapted, decoder_input_ids, enc, attention_mask)
        return enc[0], args[0][0]

    @torch.no_grad()
    def assemble_prefix(
        self,
        parts: list[tuple[torch.Tensor, torch.Tensor]],
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        decoder_input_ids: torch.Tensor,
    ) -> tuple[tuple, dict]:
        """A padded batch's prefix (the first adapted layer's arguments) from its examples'
        :meth:`example_prefix_parts`: their tensors are zero-padded to the batch's lengths (the
        padding is masked in cross-attention, and lies after every real decoder position, so
        causal self-attention never reads it); the layer's mask arguments are those the decoder
        builds for this batch (captured at its first layer, where only the embeddings run)."""
        if not self.supports_example_prefix:
            raise ValueError(f"{type(self.backbone).__name__}: no per-example prefix (LongT5)")
        for memo in self._kv_memos:
            memo.clear()
        ref = parts[0][0]
        batch, s_max, t_max = len(parts), input_ids.shape[1], decoder_input_ids.shape[1]
        enc = ref.new_zeros((batch, s_max, ref.shape[-1]))
        hidden = ref.new_zeros((batch, t_max, ref.shape[-1]))
        for i, (e, h) in enumerate(parts):
            enc[i, : e.shape[0]] = e
            hidden[i, : h.shape[0]] = h
        args, kwargs = self._capture(0, decoder_input_ids, enc, attention_mask)
        return (hidden,) + tuple(args[1:]), kwargs

    def adapted_logits(self, prefix: tuple[tuple, dict], role: str) -> torch.Tensor:
        """Top-k decoder layers with ``role``'s adapters, then the (frozen) LM head."""
        args, kwargs = prefix
        decoder = self.backbone.get_decoder()
        layout = self.layout
        self.router.active = role
        hidden = args[0]
        threaded = layout.threaded_outputs
        if threaded:
            kwargs = dict(kwargs)  # this path's copy: the threaded values are replaced below
        top = decoder.layers[self.first_adapted :]
        for layer in top:
            out = layer(hidden, *args[1:], **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
            for name, index in threaded.items():
                kwargs[name] = out[index]
        final_norm = getattr(decoder, layout.final_norm, None) if layout.final_norm else None
        if final_norm is not None:
            hidden = final_norm(hidden)
        if layout.final_dropout is not None:
            # on when the backbone trains with dropout (backbone_dropout) and the top layers are in
            # training mode; off on the teacher path, which path_logits runs with them in eval
            drop = getattr(decoder, layout.final_dropout)
            hidden = nn.functional.dropout(hidden, drop.p, drop.training and top[-1].training)
        if self._output_scale is not None:
            hidden = hidden * self._output_scale
        logits = self.backbone.lm_head(hidden)
        if self._use_logits_bias:
            logits = logits + self.backbone.final_logits_bias.to(logits.dtype)
        return logits

    def path_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        decoder_input_ids: torch.Tensor,
        student: str = "local",
        teacher: str | None = None,
        prefix: tuple[tuple, dict] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Student logits (with grad) and, if asked, teacher logits (no grad) for one batch; both
        paths share one frozen prefix (``prefix``: one already computed, e.g. by the prefix cache's
        :meth:`~fedrepro.papers.adafedseleckd.prefix_cache.PrefixCache.batch_prefix`)."""
        if prefix is None:
            prefix = self.frozen_prefix(input_ids, attention_mask, decoder_input_ids)
        teacher_logits = None
        if teacher is not None:
            top = self.backbone.get_decoder().layers[self.first_adapted :]
            modes = [m.training for m in top.modules()]
            top.eval()  # the teacher path without dropout (a no-op when the backbone is in eval)
            try:
                with torch.no_grad():
                    teacher_logits = self.adapted_logits(prefix, teacher)
            finally:
                for m, mode in zip(top.modules(), modes):
                    m.training = mode
        student_logits = self.adapted_logits(prefix, student)
        self.router.active = "local" if "local" in self.stacks else student
        return student_logits, teacher_logits

    @torch.no_grad()
    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, role: str = "local", **gen
    ) -> torch.Tensor:
        """Beam-search (or greedy) generation through ``role``'s adapters."""
        self.router.active = role
        kwargs = self._encoder_kwargs(input_ids, attention_mask)
        if self.layout.lazy_generation_cache and "past_key_values" not in gen:
            from transformers.cache_utils import DynamicCache, EncoderDecoderCache

            kwargs["past_key_values"] = EncoderDecoderCache(DynamicCache(), DynamicCache())
        return self.backbone.generate(**kwargs, **gen)


def initial_adapter_state(
    d_model: int, bottleneck: int, adapter_top_k: int, seed: int
) -> OrderedDict[str, torch.Tensor]:
    """The server's initial adapter tensors W^1 (Algorithm 1, line 2), a function of the seed."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AdapterStack(d_model, bottleneck, adapter_top_k).shared_state()


def build_summarizer(
    backbone_dir: str,
    adapter_top_k: int,
    bottleneck: int,
    roles: tuple[str, ...],
    adapter_init_seed: int,
    backbone_dropout: bool = False,
):
    """Load a backbone folder and wrap it; every role starts from :func:`initial_adapter_state`."""
    from fedrepro.models.backbones import load_backbone

    tokenizer, backbone = load_backbone(backbone_dir)
    model = AdapterSummarizer(backbone, adapter_top_k, bottleneck, roles, backbone_dropout)
    init = initial_adapter_state(backbone.config.d_model, bottleneck, adapter_top_k, adapter_init_seed)
    for role in roles:
        model.load_adapter_state(role, init)
    return tokenizer, model
