"""Small fixtures shared by tests: a tiny backbone folder, client partitions, a cell config, and
the config files and Snakemake runs of the workflow tests."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from fedrepro.io import write_jsonl_atomic
from fedrepro.models.backbones import prepare_backbone

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

CLIENT_WORDS = {
    "Academic": ["speech", "recognizer", "phd", "features", "noise", "training", "delay", "frames"],
    "Committee": ["minister", "council", "budget", "policy", "funding", "schools", "members", "vote"],
    "Product": ["remote", "button", "design", "battery", "marketing", "case", "screen", "price"],
}


def make_records(client: str, split: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(f"{client}/{split}/{seed}")
    words = CLIENT_WORDS[client]
    out = []
    for i in range(n):
        picked = rng.sample(words, 4)
        src = f"what about {picked[0]} ? #SEP# " + " ".join(
            f"speaker {rng.randint(1, 3)} : the {w} is {rng.choice(['good', 'bad', 'late'])} ." for w in picked
        )
        out.append(
            {"id": f"{client}-{split}-{i:03d}", "source": "test", "client": client, "split": split,
             "input": src, "target": f"they discussed the {picked[0]} and the {picked[1]} .", "meta": {}}
        )
    return out


def make_partitions(root: Path, clients=("Academic", "Committee", "Product"), sizes=(6, 2, 3)) -> dict:
    folders = {}
    for c in clients:
        for split, n in zip(("train", "val", "test"), sizes):
            write_jsonl_atomic(root / c / f"{split}.jsonl", make_records(c, split, n, 0))
        folders[c] = str(root / c)
    return folders


def make_backbone(root: Path, name: str = "bart-large", warmup_steps: int = 0) -> str:
    texts = [r["input"] for c in CLIENT_WORDS for r in make_records(c, "train", 20, 1)]
    texts += [r["target"] for c in CLIENT_WORDS for r in make_records(c, "train", 20, 1)]
    settings = {
        "name": name,
        "kind": "tiny",
        "tiny": {"vocab_size": 300, "d_model": 32, "encoder_layers": 1, "decoder_layers": 2,
                 "heads": 2, "ffn_dim": 64, "max_source_length": 96, "max_target_length": 24,
                 "attention_window": 16, "warmup_steps": warmup_steps},
    }
    out = root / "backbone"
    prepare_backbone(settings, texts, out)
    return str(out)


def make_cell(tmp: Path, method: str, backbone_dir: str, folders: dict, rounds: int = 2,
              out_name: str = "cell", clients=None) -> dict:
    clients = list(clients or folders)
    return {
        "paper": "adafedseleckd", "scale": "demo", "backbone": "bart-large",
        "backbone_dir": backbone_dir, "method": method, "seed": 3, "partition": "domains",
        "setting": "federated" if method.startswith("AdaFed") else "single",
        "clients": clients, "eval_clients": clients,
        "client_data": {c: folders[c] for c in clients},
        "adapter_top_k": 1, "bottleneck": 16, "max_source_length": 96, "max_target_length": 24,
        "train": {"rounds": rounds, "local_epochs": 1, "lr": 0.003, "weight_decay": 0.01,
                  "batch_size": 4, "lam": 0.2, "tau": 5.0},
        "generation": {"num_beams": 2, "max_new_tokens": 8, "batch_size": 4},
        "threads": 1, "clients_per_round": None, "keep_round_checkpoints": False,
        "round_timeout_s": 300, "out_dir": str(tmp / out_name),
    }


# -- workflow tests: config files and Snakemake runs ---------------------------------------------
def run_snakemake(*args, cwd=ROOT, timeout=600) -> subprocess.CompletedProcess:
    """Run this environment's ``snakemake`` with ``args`` (output captured as text)."""
    return subprocess.run(
        [SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def configs() -> list[dict]:
    """``config/config.yaml`` and ``config/paper.yaml`` as loaded (not merged)."""
    return [yaml.safe_load((ROOT / "config" / n).read_text()) for n in ("config.yaml", "paper.yaml")]


def deep_update(base: dict, over: dict) -> None:
    """Merge ``over`` into ``base`` in place, mapping by mapping (as Snakemake merges configs)."""
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_update(base[k], v)
        else:
            base[k] = v


def demo_config_absolute() -> dict:
    """The demo config with sample folders made absolute (the test runs in a scratch folder)."""
    cfg = configs()[0]
    for name, d in cfg["data"].items():
        d["samples_dir"] = str(ROOT / d.get("samples_dir", f"resources/samples/{name}"))
    return cfg


def write_config(tmp: Path, overrides: str | dict | None = None, name: str = "smoke.yaml") -> Path:
    """Write :func:`demo_config_absolute` deep-merged with ``overrides`` (YAML text or a mapping)
    to ``tmp / name``; return the file's path."""
    cfg = demo_config_absolute()
    if overrides:
        deep_update(cfg, yaml.safe_load(overrides) if isinstance(overrides, str) else overrides)
    path = tmp / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def build_targets(
    tmp: Path,
    overrides: str | dict | None,
    targets: Sequence[str],
    timeout: int = 600,
    name: str = "smoke.yaml",
) -> tuple[Path, subprocess.CompletedProcess]:
    """Write the config (:func:`write_config`) and build ``targets`` with two cores in ``tmp``;
    return the config file's path and the Snakemake run."""
    path = write_config(tmp, overrides, name)
    res = run_snakemake(
        "--cores", "2", "--configfile", str(path), "--directory", str(tmp), *targets, timeout=timeout
    )
    return path, res


# -- what reaches the server (issue 17, item 5) ---------------------------------------------------
class WireTap:
    """Every reply the server pulls from the in-process engine, recorded as ``(message type,
    partition id, {record name: record})`` -- installed on :class:`fedrepro.fl.engine.InProcessGrid`
    by the ``wire`` fixture (tests/conftest.py), so it sees exactly what a strategy receives."""

    def __init__(self) -> None:
        self.replies: list[tuple[str, int, dict]] = []

    def record(self, replies) -> None:
        for m in replies:
            assert not m.has_error(), m.error.reason
            content = dict(m.content.items())
            pid = int(content["metrics"]["partition-id"]) if "metrics" in content else -1
            self.replies.append((m.metadata.message_type, pid, content))


def check_wire(tap: WireTap, shared: dict, examples: dict[int, int], declared: dict | None = None) -> dict:
    """Assert that the replies ``tap`` saw hold only what a method shares:

    * a train reply's ``arrays`` record holds exactly ``shared`` (name -> shape: the tensors the
      server broadcasts, i.e. the method's shared set);
    * any other record is named in ``declared`` (record name -> a callable ``check(record,
      partition)`` asserting its names and shapes or values);
    * no ArrayRecord holds an integer array (token ids), and none but a tensor of the shared model's
      own name and shape (fixed by the architecture) has a dimension equal to the client's number
      of training examples ``examples[partition]`` (per-example values);
    * MetricRecords and ConfigRecords not declared otherwise hold scalars only (no text, no lists).

    Returns counts of what was inspected (replies, per message type, arrays, scalars)."""
    import numpy as np
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

    declared = declared or {}
    counts = {"replies": 0, "arrays": 0, "scalars": 0}
    for kind, pid, content in tap.replies:
        counts["replies"] += 1
        counts[kind] = counts.get(kind, 0) + 1
        for name, record in content.items():
            where = f"{kind} reply of partition {pid}, record {name!r}"
            if name == "arrays" and kind == "train":
                shapes = {k: tuple(a.shape) for k, a in record.items()}
                expected = {k: tuple(v) for k, v in shared.items()}
                assert shapes == expected, (where, sorted(set(shapes) ^ set(expected))[:6],
                                            len(shapes), len(expected))
            elif name in declared:
                declared[name](record, pid)
            elif not isinstance(record, (MetricRecord, ConfigRecord)):
                raise AssertionError(f"{where}: a {type(record).__name__} the method does not declare")
            if isinstance(record, ArrayRecord):
                for k, a in record.items():
                    arr = a.numpy()
                    counts["arrays"] += 1
                    assert np.issubdtype(arr.dtype, np.floating), f"{where}: {k} has dtype {arr.dtype}"
                    model_shaped = tuple(shared.get(k, ())) == arr.shape  # fixed by the architecture
                    assert model_shaped or examples[pid] not in arr.shape, (
                        f"{where}: {k} {arr.shape} has a dimension of the client's "
                        f"{examples[pid]} examples")
            elif name not in declared:
                for k, v in record.items():
                    counts["scalars"] += 1
                    assert isinstance(v, (int, float)), f"{where}: {k} is {type(v).__name__}, not a scalar"
    return counts


def array_shapes(expected: dict):
    """A ``declared`` check: an ArrayRecord with exactly these names and shapes."""

    def check(record, pid) -> None:
        got = {k: tuple(a.shape) for k, a in record.items()}
        assert got == {k: tuple(v) for k, v in expected.items()}, (pid, got)

    return check


def node_paths(obj, prefix=()):
    """Every path (tuple of keys/indices) to a node below ``obj``."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield (*prefix, k)
            yield from node_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield (*prefix, i)
            yield from node_paths(v, (*prefix, i))


def cell_outputs(cell: dict) -> tuple[str, str, str]:
    """``run_cell``'s three outputs in the cell's ``out_dir``: adapters, train log, provenance."""
    out = Path(cell["out_dir"])
    return str(out / "adapters.safetensors"), str(out / "train_log.json"), str(out / "provenance.json")


def disk_full_at(monkeypatch, owner, attr: str, bad: Path, path_arg: int = 0) -> None:
    """Patch the writer ``owner.attr`` so that writing ``bad`` (its positional argument
    ``path_arg``) raises ENOSPC ("No space left on device"); every other write goes through."""
    real = getattr(owner, attr)

    def failing(*args, **kwargs):
        if Path(args[path_arg]) == Path(bad):
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, failing)


class TrainReply:
    """A duck-typed Flower train reply for calling a strategy's ``aggregate_train`` directly: the
    strategies read only ``content`` (``arrays`` and ``metrics``) and ``has_error()``."""

    def __init__(self, pid: int, n: int, state: dict, metrics: dict | None = None):
        from collections import OrderedDict

        from flwr.app import ArrayRecord, MetricRecord, RecordDict

        self.content = RecordDict({
            "arrays": ArrayRecord(OrderedDict(state)),
            "metrics": MetricRecord({"num-examples": n, "partition-id": pid, **(metrics or {})}),
        })

    def has_error(self) -> bool:
        return False
