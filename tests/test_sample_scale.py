"""Scaled samples: ``write_samples(out_dir, seed=..., scale=k)`` of every registered source writes
``k`` times the records of every split in the same raw schema (a rehearsal of the paper-scale grid),
and ``scale=1`` stays the committed ``resources/samples/<source>/`` byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fedrepro.data import sources
from fedrepro.data.prepare import data_files, prepare_source
from fedrepro.data.samples.__main__ import main as samples_main
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "resources" / "samples"
NAMES = sorted(sources.SOURCE_MODULES)


def _files(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _parse_release(name: str, root: Path) -> dict[str, dict]:
    """The records of a raw folder, parsed as :func:`fedrepro.data.prepare.prepare_source` does
    (the folder at once for a ``whole_folder`` source, else every data file); ids must be unique
    within each parse, and an id met again in another file (LCSTS' ``.src``/``.tgt`` pair) must be
    the same record."""
    src = sources.get(name)
    files = [root] if src.whole_folder else data_files(root)
    assert files, (name, root)
    by_id: dict[str, dict] = {}
    for path in files:
        records = src.parse(path)
        assert records.skipped == [], (name, path)
        ids = [r["id"] for r in records]
        assert len(ids) == len(set(ids)), (name, path)
        for rec in records:
            assert by_id.setdefault(rec["id"], rec) == rec, (name, rec["id"])
    return by_id


def _text(rec: dict) -> tuple:
    if "input" in rec:  # seq2seq
        return rec["input"], rec["target"]
    return rec["task"], rec["text_a"], rec["text_b"], rec["label"]  # classification


def _per_split(name: str, records: dict[str, dict]) -> Counter:
    if sources.get(name).kind == "classification":
        return Counter(f"{r['task']}/{r['split']}" for r in records.values())
    return Counter(r["split"] for r in records.values())


@pytest.mark.parametrize("name", NAMES)
def test_scale3_triples_every_split(name, tmp_path):
    committed = _parse_release(name, SAMPLES / name)
    sources.get(name).write_samples(tmp_path / name, seed=0, scale=3)
    scaled = _parse_release(name, tmp_path / name)
    base = _per_split(name, committed)
    assert base and all(base.values())
    assert _per_split(name, scaled) == Counter({k: 3 * n for k, n in base.items()})
    # unique ids, none from the parsers' duplicate handling (English sources suffix `-dup<n>`)
    assert not any("-dup" in i for i in scaled)
    # the scale=1 records come first and unchanged; the extra ones are new texts, not copies
    for rec_id, rec in committed.items():
        assert scaled.get(rec_id) == rec, rec_id
    extra = [r for i, r in scaled.items() if i not in committed]
    base_texts = {_text(r) for r in committed.values()}
    new_texts = {_text(r) for r in extra} - base_texts
    assert len(new_texts) >= len(extra) // 2, (len(new_texts), len(extra))
    # and the workflow's preparation step counts the same
    report = prepare_source(
        name, tmp_path / name, str(tmp_path / "records.jsonl"), str(tmp_path / "report.json")
    )
    assert report["counts"] == {k: 3 * n for k, n in base.items()}
    assert report["skipped"] == 0


@pytest.mark.parametrize("name", NAMES)
def test_cli_scale1_is_the_committed_sample(name, tmp_path, capsys):
    assert samples_main([name, str(tmp_path / name), "--seed", "0", "--scale", "1"]) == 0
    assert _files(tmp_path / name) == _files(SAMPLES / name)
    # the default scale and seed are the committed sample too
    assert samples_main([name, str(tmp_path / "default")]) == 0
    assert _files(tmp_path / "default") == _files(SAMPLES / name)


def test_cli_runs_as_module(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "csl"
    proc = subprocess.run(
        [sys.executable, "-m", "fedrepro.data.samples", "csl", str(out), "--scale", "2"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    records = _parse_release("csl", out)
    assert _per_split("csl", records) == {"train": 80, "val": 40, "test": 40}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_invalid_scale_raises(name, bad, tmp_path):
    with pytest.raises(InputError, match="scale"):
        sources.get(name).write_samples(tmp_path / name, seed=0, scale=bad)
    assert not (tmp_path / name).exists()  # nothing written


def test_cli_rejects_bad_scale_and_source(tmp_path, capsys):
    assert samples_main(["csl", str(tmp_path / "a"), "--scale", "0"]) == 2
    assert "scale" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert samples_main(["no_such_source", str(tmp_path / "b")]) == 2
    assert "no_such_source" in capsys.readouterr().err


def test_scale_is_deterministic_and_seeded(tmp_path):
    write = sources.get("samsum").write_samples
    write(tmp_path / "a", seed=0, scale=2)
    write(tmp_path / "b", seed=0, scale=2)
    write(tmp_path / "c", seed=1, scale=2)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert _files(tmp_path / "a") != _files(tmp_path / "c")


def test_ami_scale_limit(tmp_path):
    """An AMI id's split is fixed by its meeting series (five val and five test series), so a
    split holds at most 135 distinct ids: scale 16 fits, 17 is refused up front."""
    counts = sources.get("ami").write_samples(tmp_path / "ok", scale=16)
    assert counts == {"train": 24 * 16, "val": 8 * 16, "test": 8 * 16}
    assert _per_split("ami", _parse_release("ami", tmp_path / "ok")) == counts
    with pytest.raises(InputError, match="scale"):
        sources.get("ami").write_samples(tmp_path / "too_many", scale=17)
    assert not (tmp_path / "too_many").exists()
