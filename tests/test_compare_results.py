"""tests/compare_results.py: the whole-output comparison used to show a change kept every result."""

from __future__ import annotations

import json

from compare_results import compare, main


def _tree(root, wall, commit, score=1.0):
    (root / "a" / "cell").mkdir(parents=True)
    (root / "a" / "cell" / "provenance.json").write_text(
        json.dumps({"seed": 1, "wall_time_s": wall, "git_commit": commit, "config_hash": "x"})
    )
    (root / "a" / "cell" / "scores.json").write_text(json.dumps({"rouge1": score}))
    return root


def test_equal_up_to_volatile_provenance(tmp_path):
    a = _tree(tmp_path / "A", 1.5, "abc")
    b = _tree(tmp_path / "B", 9.25, "def")
    assert compare(a, b) == []
    assert main([str(a), str(b)]) == 0


def test_reports_each_difference(tmp_path, capsys):
    a = _tree(tmp_path / "A", 1.5, "abc")
    b = _tree(tmp_path / "B", 1.5, "abc", score=1.0000001)
    (a / "extra.csv").write_text("x\n")
    prov = json.loads((b / "a/cell/provenance.json").read_text()) | {"seed": 2}
    (b / "a/cell/provenance.json").write_text(json.dumps(prov))
    assert compare(a, b) == [
        f"only in {a}: extra.csv",
        "differs (beyond wall_time_s, git_commit, timing): a/cell/provenance.json",
        "differs: a/cell/scores.json",
    ]
    assert main([str(a), str(b)]) == 1
    assert "3 differ" in capsys.readouterr().out
