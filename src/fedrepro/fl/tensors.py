"""Lazy ``{name: Tensor}`` mappings: tensors made when read, one at a time.

A server rule that works tensor by tensor -- FedSum's SCAFFOLD and FedNova, FedSUMM's replies,
gradients, memory entries and updates -- takes any ``Mapping[str, Tensor]``.  Given one of these,
it holds one parameter-sized tensor per client at a time instead of a copy of every client's whole
model.  The standard library has no such mapping (``types.MappingProxyType`` wraps a dict whose
values already exist), so the few lines are written here, once, for both papers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server apps import this module; torch is loaded when a mapping is made
    import torch
    from flwr.app import ArrayRecord


class LazyTensors(Mapping):
    """A read-only ``{name: Tensor}`` whose tensors are made when read, one at a time.

    ``shapes`` fixes the keys, their order and :meth:`shape_of` (answered without making the
    tensor); ``make(key)`` makes the tensor.  Every read makes it again (same values when the
    maker is pure, as all of the project's are).
    """

    def __init__(self, shapes: Mapping[str, Sequence[int]], make: Callable[[str], torch.Tensor]) -> None:
        import torch

        self._shapes = OrderedDict((k, torch.Size(s)) for k, s in shapes.items())
        self._make = make

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._shapes:
            raise KeyError(key)
        return self._make(key)

    def __contains__(self, key: object) -> bool:
        return key in self._shapes

    def __iter__(self):
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def shape_of(self, key: str) -> torch.Size:
        return self._shapes[key]


class RecordTensors(LazyTensors):
    """An ``ArrayRecord``'s tensors, each converted when it is read
    (``torch.from_numpy(record[k].numpy())``, what Flower's ``to_torch_state_dict`` does for all of
    them at once), so a server rule holds one converted tensor per client, not a second copy of
    every reply.  The shapes come from the record's array headers, without converting."""

    def __init__(self, record: ArrayRecord) -> None:
        def convert(key: str) -> torch.Tensor:
            import torch

            return torch.from_numpy(record[key].numpy())

        super().__init__({k: tuple(a.shape) for k, a in record.items()}, convert)
