"""Shared by the AdaFedSelecKD benchmarks: a paper-size summarizer with random weights, random
examples, and the machine record.

The backbone is the rehearsal's ``kind: shape`` architecture (:mod:`fedrepro.models.shapes`: the
hub checkpoint's ``config.json`` at its true dimensions) built in memory with random weights, so
no tokenizer, hub or dataset is needed; the adapter sizes are the paper's (config/paper.yaml,
§IV-D).  The import chain needs only torch, transformers, numpy and PyYAML (no flwr, ray,
snakemake, jsonschema, spacy, rouge): run with ``PYTHONPATH=src``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fedrepro.models.shapes import architecture, build_shape_model
from fedrepro.papers.adafedseleckd.model import AdapterSummarizer, initial_adapter_state

PAPER_BACKBONES = {
    # name: (hub architecture, adapter_top_k, bottleneck) -- config/paper.yaml, §IV-D
    "bart-large": ("facebook/bart-large", 6, 2048),
    "bart-base": ("facebook/bart-base", 3, 1536),
    "led-large": ("allenai/led-large-16384", 6, 2048),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def paper_summarizer(name: str, roles: tuple[str, ...], device: str, dtype: str, seed: int = 0):
    """(summarizer, settings): ``name``'s true-size architecture with random weights, the
    paper's adapters on top, every role starting from W^1; on ``device`` in ``dtype``."""
    hub_id, top_k, bottleneck = PAPER_BACKBONES[name]
    arch = architecture(hub_id)
    with torch.device(device):
        backbone = build_shape_model(arch, seed)
    model = AdapterSummarizer(backbone, top_k, bottleneck, roles, backbone_dropout=False)
    init = initial_adapter_state(backbone.config.d_model, bottleneck, top_k, seed)
    for role in roles:
        model.load_adapter_state(role, init)
    model = model.to(device=device, dtype=DTYPES[dtype])
    settings = {"backbone": name, "architecture": hub_id, "adapter_top_k": top_k,
                "bottleneck": bottleneck, "d_model": backbone.config.d_model,
                "vocab_size": backbone.config.vocab_size,
                "parameters": sum(p.numel() for p in model.parameters()),
                "weights": "random (kind: shape): speed and memory only"}
    return model, settings


def random_examples(n: int, vocab: int, source_length: int, target_length: int, seed: int = 0,
                    min_fraction: float = 0.5):
    """``n`` examples of random tokens, lengths uniform in [length·min_fraction, length] (the
    default 1/2: batches pad; 1.0: every example at full length)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        s_lo = min(max(int(source_length * min_fraction), 1), source_length)
        t_lo = min(max(int(target_length * min_fraction), 1), target_length)
        s = int(torch.randint(s_lo, source_length + 1, (1,), generator=g))
        t = int(torch.randint(t_lo, target_length + 1, (1,), generator=g))
        out.append({"id": f"ex{i}",
                    "input_ids": torch.randint(5, vocab, (s,), generator=g).tolist(),
                    "labels": torch.randint(5, vocab, (t,), generator=g).tolist()})
    return out


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def machine(device: str) -> dict:
    out = {
        "hostname": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "device": device,
    }
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - transformers is required to build the model
        pass
    if torch.device(device).type == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
        out["cuda"] = torch.version.cuda
    return out


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
