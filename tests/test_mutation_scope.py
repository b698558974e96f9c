"""``tests/mutation.py``'s scope stays real: every module's file and test files exist, and every
function a task module's scope names is a top-level function of that file (a renamed function
would silently drop out of ``make mutation``'s score)."""

from __future__ import annotations

import ast
from pathlib import Path

import mutation

ROOT = Path(__file__).resolve().parents[1]


def test_every_scoped_file_test_and_function_exists():
    for module, (path, tests) in mutation.SCOPE.items():
        assert (ROOT / path).is_file(), module
        assert all((ROOT / t).is_file() for t in tests), module
    assert set(mutation.FUNCTIONS) <= set(mutation.SCOPE)
    for module, functions in mutation.FUNCTIONS.items():
        tree = ast.parse((ROOT / mutation.SCOPE[module][0]).read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert set(functions) <= defined, (module, sorted(set(functions) - defined))
        assert "client_train_round" in functions


def test_the_globs_name_mutmuts_mutants_of_the_scoped_functions():
    assert mutation.mutant_globs("fedmcp.task")[0] == (
        "fedrepro.papers.fedmcp.task.x_client_train_round__mutmut_*")
    assert len(mutation.mutant_globs("fedsumm.task")) == len(mutation.FUNCTIONS["fedsumm.task"])
    assert mutation.mutant_globs("fl.dp") == []  # a method module: every mutant of the file
