"""The core's lazy tensor mappings (fedrepro.fl.tensors): keys and order from the shapes, a tensor
made on every read and only then, shapes answered without making one, a missing key a KeyError."""

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedrepro.fl.tensors import LazyTensors, RecordTensors


def test_lazy_tensors_make_on_every_read_and_only_then():
    made = []

    def make(k):
        made.append(k)
        return torch.full((2, 3) if k == "b" else (4,), float(len(made)))

    lazy = LazyTensors({"b": (2, 3), "a": [4]}, make)
    assert list(lazy) == ["b", "a"] and len(lazy) == 2  # the shapes' order, not sorted
    assert lazy.shape_of("b") == torch.Size([2, 3]) and isinstance(lazy.shape_of("a"), torch.Size)
    assert "a" in lazy and "c" not in lazy and 3 not in lazy
    assert made == []  # nothing made by iterating, sizing or asking shapes
    assert torch.equal(lazy["a"], torch.full((4,), 1.0))
    assert torch.equal(lazy["a"], torch.full((4,), 2.0))  # made again, not cached
    with pytest.raises(KeyError):
        lazy["c"]
    assert made == ["a", "a"]  # a missing key never reaches the maker
    assert dict(lazy).keys() == {"b", "a"}


def test_record_tensors_convert_each_tensor_when_read(monkeypatch):
    rec = ArrayRecord({"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3)),
                       "h": Array(np.array([1, 2], dtype=np.int64))})
    calls = []
    real = Array.numpy
    monkeypatch.setattr(Array, "numpy", lambda self: calls.append(self.shape) or real(self))
    lazy = RecordTensors(rec)
    assert list(lazy) == ["w", "h"] and len(lazy) == 2
    assert lazy.shape_of("w") == torch.Size([2, 3]) and lazy.shape_of("h") == torch.Size([2])
    assert calls == []  # shapes from the array headers
    w = lazy["w"]
    assert w.dtype == torch.float32 and torch.equal(w, torch.arange(6.0).reshape(2, 3))
    assert lazy["h"].dtype == torch.int64
    assert len(calls) == 2
    with pytest.raises(KeyError):
        lazy["x"]
