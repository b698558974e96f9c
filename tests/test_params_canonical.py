"""A config that means the same never reruns a job (issue 17, item 7).

Snakemake compares each job's ``params`` with the ``repr`` it recorded, and a dict's ``repr``
follows insertion order; every rule's params therefore go through
:func:`fedrepro.config.canonical` (keys sorted, recursively).  Here a small finished run is
dry-run again with the same config saved in other key orders and with a float spelled
differently (nothing to be done), then with one real change (exactly the jobs whose cells hold
that value rerun).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, deep_update, demo_config_absolute, run_snakemake
from test_workflow import TINY_CONFIG

from fedrepro.config import canonical

CELL = "results/adafedseleckd/domains/bart-large/{method}/all/seed~7/train_log.json"
TARGETS = [CELL.format(method=m) for m in ("AdaFedAvg", "AdaFedOPT")]


def test_canonical_sorts_every_mapping_and_keeps_lists_and_values():
    value = {"b": {"y": [3, {"q": 1, "p": 2.5}], "x": None}, "a": (1, "s"), 2: True}
    out = canonical(value)
    assert out == value  # the same values
    assert repr(out) == "{2: True, 'a': (1, 's'), 'b': {'x': None, 'y': [3, {'p': 2.5, 'q': 1}]}}"
    reordered = {"a": (1, "s"), 2: True, "b": {"x": None, "y": [3, {"p": 2.5, "q": 1}]}}
    assert repr(canonical(reordered)) == repr(out)
    assert canonical([2, 1]) == [2, 1]  # list order can mean something: kept


def test_every_params_entry_of_every_rule_is_canonical():
    """Static check over rules/*.smk: each ``params`` entry is a string literal or goes through
    ``canonical(...)`` (a new rule that forgets it fails here)."""
    bad = []
    for smk in sorted((ROOT / "rules").glob("*.smk")):
        block_indent = None
        for n, line in enumerate(smk.read_text().splitlines(), 1):
            indent = len(line) - len(line.lstrip())
            if re.match(r"\s*params:\s*$", line):
                block_indent = indent
                continue
            if block_indent is None or not line.strip() or line.strip().startswith("#"):
                continue
            if indent <= block_indent:
                block_indent = None
                continue
            m = re.match(r"\s*(\w+)=(.*)$", line)
            if m and indent == block_indent + 4:
                value = m.group(2)
                if not (re.match(r'(lambda \w+: )?canonical\(', value) or re.match(r'"[^"]*",$', value)):
                    bad.append(f"{smk.name}:{n}: {line.strip()}")
    assert bad == []


def _reversed(value):
    """``value`` with every mapping's keys in reverse-sorted order."""
    if isinstance(value, dict):
        return {k: _reversed(value[k]) for k in sorted(value, reverse=True)}
    if isinstance(value, list):
        return [_reversed(v) for v in value]
    return value


def _jobs(res) -> list[str]:
    """``rule: output`` of every job a dry run would run."""
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    jobs = re.findall(r"^rule (\w+):\n(?:\s+\w+:.*\n)*?\s+output: ([^\n,]+)", out, flags=re.MULTILINE)
    return sorted(f"{rule}: {path}" for rule, path in jobs)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_reordered_config_reruns_nothing_and_a_real_change_reruns_its_cells(tmp_path):
    cfg = demo_config_absolute()  # the whole demo config, as a user saves it, with tiny settings
    deep_update(cfg, yaml.safe_load(TINY_CONFIG.format(samples=ROOT / "resources" / "samples" / "qmsum")))
    text = yaml.safe_dump(cfg, sort_keys=False)
    written = tmp_path / "written.yaml"
    written.write_text(text)

    def dry_run(name: str, body: str):
        path = tmp_path / name
        path.write_text(body)
        return run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path), *TARGETS)

    res = run_snakemake("--cores", "2", "--configfile", str(written), "--directory", str(tmp_path),
                        *TARGETS, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]

    # the same meaning, written otherwise: nothing to be done
    same = {
        "sorted.yaml": yaml.safe_dump(cfg, sort_keys=True),
        "reversed.yaml": yaml.safe_dump(_reversed(cfg), sort_keys=False),
        "respelled.yaml": text.replace("lr: 0.003", "lr: 3.0e-3"),
    }
    assert yaml.safe_load(same["respelled.yaml"]) == cfg
    for name, body in same.items():
        res = dry_run(name, body)
        assert _jobs(res) == [], (name, (res.stdout + res.stderr)[-3000:])
        assert "Nothing to be done" in res.stdout + res.stderr, name

    # one real change: the server optimizer's eta is in AdaFedOPT's cell only
    changed = yaml.safe_load(text)
    assert changed["adafedseleckd"]["server_optimizer"]["eta"] == 0.01  # what the run used
    changed["adafedseleckd"]["server_optimizer"]["eta"] = 0.02
    res = dry_run("eta.yaml", yaml.safe_dump(changed, sort_keys=True))
    cell = "results/adafedseleckd/domains/bart-large/{}/all/seed~7/adapters.safetensors"
    assert _jobs(res) == [f"adafedseleckd_cell: {cell.format('AdaFedOPT')}"]
    assert "Params have changed" in res.stdout + res.stderr

    # lambda (the KD weight) is in every AdaFedSelecKD cell's train dict: both cells, nothing else
    changed = yaml.safe_load(text)
    changed["adafedseleckd"]["train"]["lam"] = 0.3
    res = dry_run("lam.yaml", yaml.safe_dump(changed))
    # (the demo trains AdaFedAvg, AdaFedKD and AdaFedSelectKD in one row job: cells_per_job: row)
    assert _jobs(res) == [f"adafedseleckd_cell: {cell.format('AdaFedOPT')}",
                          f"adafedseleckd_row: {cell.format('AdaFedAvg')}"]
    assert Path(tmp_path / "results/backbones/bart-large").exists()
