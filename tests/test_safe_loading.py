"""Checkpoints are loaded without unpickling arbitrary objects (issue 17, item 5): every
``torch.load`` in the code passes ``weights_only=True`` (tensors, numbers, strings and containers
only); everything else is safetensors.  No pickle, no ``allow_pickle=True`` anywhere."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CODE = [p for d in ("src", "workflow_scripts", "bench") for p in sorted((ROOT / d).rglob("*.py"))]


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            yield node


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return f"{_name(func.value)}.{func.attr}"
    return func.id if isinstance(func, ast.Name) else "?"


def test_every_torch_load_is_weights_only():
    loads, bad = 0, []
    for path in CODE:
        for call in _calls(path):
            if _name(call.func) != "torch.load":
                continue
            loads += 1
            kw = {k.arg: k.value for k in call.keywords}
            value = kw.get("weights_only")
            if not (isinstance(value, ast.Constant) and value.value is True):
                bad.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert bad == [], f"torch.load without weights_only=True: {bad}"
    assert loads >= 6  # the resumable optimiser and server states


def test_no_pickle_loading_anywhere():
    bad = []
    for path in CODE:
        for call in _calls(path):
            name = _name(call.func)
            kw = {k.arg: k.value for k in call.keywords}
            allow = kw.get("allow_pickle")
            if name in ("pickle.load", "pickle.loads", "joblib.load", "dill.load") or (
                allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False)
            ):
                bad.append(f"{path.relative_to(ROOT)}:{call.lineno}: {name}")
    assert bad == []


def test_weights_only_refuses_a_pickled_object():
    """What the flag buys: a checkpoint holding an arbitrary object is refused, not executed."""

    class Payload:
        def __reduce__(self):
            return (print, ("code ran while loading",))

    buf = io.BytesIO()
    torch.save({"state": torch.ones(2), "payload": Payload()}, buf)
    buf.seek(0)
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(buf, weights_only=True)
