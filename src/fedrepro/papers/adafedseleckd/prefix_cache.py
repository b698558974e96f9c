"""Frozen-prefix cache for the adapter methods (issue 16, item 1).

The adapters sit on the top-k decoder layers of a frozen backbone (AdaFedSelecKD §III-B, Fig. 3).
The encoder output and the input of the first adapted decoder layer are therefore a function of
the frozen backbone and the example only -- as long as the backbone runs without dropout
(``adafedseleckd.train.backbone_dropout: false``).  This module computes them once per example and
reuses them in the client's later epochs and rounds.

Byte-identity with the uncached run.  Batches are re-shuffled every epoch and padded to their
longest member, and a prefix computed inside a padded batch differs in float bits from the same
example's prefix computed alone (other reduction lengths, other kernels).  So the prefix is
*canonical*: every example's prefix is computed on that example alone, unpadded
(:meth:`AdapterSummarizer.example_prefix_parts`), and each batch re-assembles the per-example
tensors, zero-padded to the batch's lengths (:meth:`AdapterSummarizer.assemble_prefix`).  The
uncached run (``prefix_cache: off`` with ``backbone_dropout: false``, and a client whose examples
do not fit the budget) computes the prefix in exactly this way, just without storing it; hence an
``fp32`` cache trains byte-identical adapters (tests/test_adafedseleckd_prefix_cache.py).  With
``backbone_dropout: true`` the prefix is random on every step and the batch's prefix is computed
in one padded pass, as before; a cache is then refused (:func:`prefix_cache_settings`).

Keys: the backbone's identity (a SHA-256 of its parameters and buffers, recomputed when any of
them changes in place, e.g. a checkpoint load) and the example's tokens (its unpadded input ids
and decoder input ids).  A changed backbone empties the cache; a changed example is a new key, and
the client's entries for examples it no longer has are dropped when its next round begins.

Storage: in memory, on the model's device, under a byte budget
(``adafedseleckd.train.prefix_cache_budget_mb``) shared by the clients a process trains; entries
of other clients are evicted (least recently used client first) to make room.  A client whose
examples alone exceed the budget trains uncached, with a log line.  ``bf16`` stores the prefix in
bfloat16 (half the bytes; not byte-identical, its ROUGE difference is in docs/decisions.md).
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch

from fedrepro.data.seq2seq import IGNORE_INDEX, collate
from fedrepro.io import InputError

log = logging.getLogger(__name__)

MODES = ("off", "fp32", "bf16")
"""``adafedseleckd.train.prefix_cache``: ``off`` (no reuse), ``fp32`` (lossless), ``bf16``."""

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def prefix_cache_settings(train: Mapping) -> tuple[str, int]:
    """(mode, budget in bytes) of ``adafedseleckd.train`` (a cell's ``train`` dict).

    Raises an :class:`InputError` for an unknown mode, a negative budget, or a cache asked for
    while the backbone's dropout runs (the prefix is then random at every step and cannot be
    reused: set ``backbone_dropout: false`` to use the cache, or ``prefix_cache: off``).
    """
    mode = str(train.get("prefix_cache", "off"))
    if mode not in MODES:
        raise InputError(f"adafedseleckd.train.prefix_cache must be one of {MODES}, got {mode!r}")
    budget_mb = float(train.get("prefix_cache_budget_mb", 0))
    if budget_mb < 0:
        raise InputError(
            f"adafedseleckd.train.prefix_cache_budget_mb must be >= 0, got {budget_mb}"
        )
    if mode != "off" and bool(train.get("backbone_dropout", False)):
        raise InputError(
            f"adafedseleckd.train.prefix_cache: {mode} needs adafedseleckd.train.backbone_dropout: "
            "false -- with the frozen backbone's dropout on, its output is random at every step and "
            "cannot be reused; set backbone_dropout: false (a different reading, docs/decisions.md) "
            "or prefix_cache: off"
        )
    return mode, int(budget_mb * 2**20)


def backbone_fingerprint(backbone: torch.nn.Module) -> str:
    """SHA-256 of the backbone's parameters and buffers (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    for name, t in backbone.state_dict(keep_vars=False).items():
        t = t.detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _versions(backbone: torch.nn.Module) -> tuple[int, ...]:
    return tuple(t._version for t in backbone.state_dict(keep_vars=True).values())


def _autocast_state(device: torch.device) -> tuple:
    """(enabled, dtype) of autocast on ``device``'s type."""
    kind = device.type
    if not torch.is_autocast_enabled(kind):
        return (False, None)
    return (True, torch.get_autocast_dtype(kind))


def example_key(input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> bytes:
    """Key of one unpadded example: its input ids and decoder input ids (int64 bytes)."""
    h = hashlib.sha256()
    h.update(input_ids.to(torch.int64).cpu().numpy().tobytes())
    h.update(b"|")
    h.update(decoder_input_ids.to(torch.int64).cpu().numpy().tobytes())
    return h.digest()


def example_lengths(batch: Mapping) -> list[tuple[int, int]]:
    """(source length, target length) of every row of a collated batch: the attention mask's
    ones and the labels up to the last one that is not padding."""
    src = batch["attention_mask"].sum(dim=1).tolist()
    valid = batch["labels"] != IGNORE_INDEX
    positions = torch.arange(valid.shape[1]).expand_as(valid)
    tgt = (torch.where(valid.cpu(), positions + 1, 0)).max(dim=1).values.tolist()
    return [(int(s), max(int(t), 1)) for s, t in zip(src, tgt)]


class PrefixCache:
    """Canonical per-example frozen prefixes, stored (``fp32``/``bf16``) or not (``off``).

    Parameters
    ----------
    mode : ``off`` | ``fp32`` | ``bf16`` (:data:`MODES`)
    budget_bytes : int
        Bytes of stored tensors the cache may hold in all.
    """

    def __init__(self, mode: str, budget_bytes: int) -> None:
        if mode not in MODES:
            raise InputError(f"prefix cache mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.budget = int(budget_bytes)
        self._store: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor, str, int]] = OrderedDict()
        self._client_keys: OrderedDict[str, set[bytes]] = OrderedDict()  # LRU order of clients
        self.used = 0
        self.active = False
        self.client: str | None = None
        self._identity: tuple | None = None  # (versions, device, dtype, fingerprint)
        # the backbone itself, weakly: an id() is reused once its object is freed, so a new
        # backbone could pass for the old one and be served its cached prefixes
        self._backbone: weakref.ref | None = None
        self._autocast: tuple | None = None  # the autocast state the stored prefixes were made in
        self.hits = 0
        self.misses = 0

    # -- identity and budget --------------------------------------------------------------
    def _check_backbone(self, model) -> None:
        backbone = model.backbone
        param = next(backbone.parameters())
        versions = _versions(backbone)
        ident = self._identity
        same_object = self._backbone is not None and self._backbone() is backbone
        if ident is not None and same_object and ident[:3] == (versions, param.device, param.dtype):
            return
        fingerprint = backbone_fingerprint(backbone)
        if ident is not None and ident[3] != fingerprint:
            log.info("prefix cache: the backbone changed, %d cached examples dropped", len(self._store))
            self.clear()
        self._identity = (versions, param.device, param.dtype, fingerprint)
        self._backbone = weakref.ref(backbone)

    def clear(self) -> None:
        self._store.clear()
        self._client_keys.clear()
        self.used = 0

    def _entry_bytes(self, model, n_source: int, n_target: int) -> int:
        size = torch.empty((), dtype=self.dtype(model)).element_size()
        return (n_source + n_target) * int(model.backbone.config.d_model) * size

    def dtype(self, model) -> torch.dtype:
        return _DTYPES.get(self.mode, next(model.backbone.parameters()).dtype)

    def begin(self, model, client: str, examples: Sequence[dict]) -> None:
        """Start ``client``'s local update: check the backbone, drop the client's entries for
        examples it no longer has, and decide whether its examples fit the budget (else the
        client trains uncached, with a log line)."""
        self.client = client
        self.active = False
        if self.mode == "off":
            return
        self._check_backbone(model)
        cfg = model.backbone.config
        keys, need = set(), 0
        for e in examples:
            one = collate([{"input_ids": e["input_ids"], "labels": e["labels"]}],
                          int(cfg.pad_token_id), int(cfg.decoder_start_token_id))
            keys.add(example_key(one["input_ids"][0], one["decoder_input_ids"][0]))
            need += self._entry_bytes(model, len(e["input_ids"]), len(e["labels"]))
        for key in self._client_keys.get(client, set()) - keys:
            self._drop(key)
        if need > self.budget:
            log.info(
                "prefix cache off for client %s: its %d examples need %.1f MiB, the budget is "
                "%.1f MiB (adafedseleckd.train.prefix_cache_budget_mb)",
                client, len(examples), need / 2**20, self.budget / 2**20,
            )
            return
        held = sum(self._store[k][3] for k in self._client_keys.get(client, set()))
        for other in [c for c in self._client_keys if c != client]:
            if self.used - held + need <= self.budget:
                break
            for key in list(self._client_keys[other]):
                self._drop(key)
        self._client_keys.setdefault(client, set())
        self._client_keys.move_to_end(client)
        self.active = True

    def _drop(self, key: bytes) -> None:
        entry = self._store.pop(key, None)
        if entry is None:
            return
        self.used -= entry[3]
        keys = self._client_keys.get(entry[2])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._client_keys[entry[2]]

    # -- the prefix of a batch ------------------------------------------------------------
    def batch_prefix(self, model, batch: Mapping, device_batch: Mapping) -> tuple[tuple, dict]:
        """The frozen prefix of a collated ``batch`` (CPU tensors; ``device_batch`` the same on
        the model's device): each example's canonical prefix, from the cache or computed on the
        example alone, re-assembled and padded to the batch."""
        parts = []
        store = self.active and self.mode != "off"
        param = next(model.backbone.parameters())
        model_dtype = param.dtype
        if store:
            # a prefix computed under bf16 autocast (``adafedseleckd.precision: bf16-mixed``) is
            # not the float32 one: the store holds the prefixes of one autocast state only
            amp = _autocast_state(param.device)
            if self._autocast is not None and amp != self._autocast and self._store:
                log.info("prefix cache: autocast changed to %s, %d cached examples dropped",
                         amp, len(self._store))
                self._store.clear()
                for keys in self._client_keys.values():
                    keys.clear()
                self.used = 0
            self._autocast = amp
        for i, (s, t) in enumerate(example_lengths(batch)):
            key = example_key(batch["input_ids"][i, :s], batch["decoder_input_ids"][i, :t]) if store else None
            entry = self._store.get(key) if store else None
            if entry is not None:
                self.hits += 1
                parts.append((entry[0].to(model_dtype), entry[1].to(model_dtype)))
                continue
            self.misses += 1
            enc, hidden = model.example_prefix_parts(
                device_batch["input_ids"][i : i + 1, :s],
                device_batch["attention_mask"][i : i + 1, :s],
                device_batch["decoder_input_ids"][i : i + 1, :t],
            )
            if store:
                dtype = self.dtype(model)
                enc_c, hid_c = enc.to(dtype).clone(), hidden.to(dtype).clone()
                nbytes = enc_c.numel() * enc_c.element_size() + hid_c.numel() * hid_c.element_size()
                self._store[key] = (enc_c, hid_c, self.client, nbytes)
                self._client_keys.setdefault(self.client, set()).add(key)
                self.used += nbytes
                parts.append((enc_c.to(model_dtype), hid_c.to(model_dtype)))
            else:
                parts.append((enc, hidden))
        return model.assemble_prefix(
            parts, device_batch["input_ids"], device_batch["attention_mask"],
            device_batch["decoder_input_ids"],
        )
