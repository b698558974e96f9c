"""``tests/mutation.py``'s scope stays real: every module's file and test files exist, and every
function a module's scope names is a top-level function (or ``Class.method``) of that file (a renamed function
would silently drop out of ``make mutation``'s score)."""

from __future__ import annotations

import ast
from pathlib import Path

import mutation

ROOT = Path(__file__).resolve().parents[1]


def _functions(path: Path) -> set[str]:
    """Top-level functions, and methods as ``Class.method`` (how ``FUNCTIONS`` names them)."""
    body = ast.parse(path.read_text()).body
    return {n.name for n in body if isinstance(n, ast.FunctionDef)} | {
        f"{c.name}.{m.name}" for c in body if isinstance(c, ast.ClassDef)
        for m in c.body if isinstance(m, ast.FunctionDef)}


def test_every_scoped_file_test_and_function_exists():
    for module, (path, tests) in mutation.SCOPE.items():
        assert (ROOT / path).is_file(), module
        for test in tests:  # a file, or a test id (file::test_function)
            file, _, name = test.partition("::")
            assert (ROOT / file).is_file(), (module, test)
            assert not name or name in _functions(ROOT / file), (module, test)
    assert set(mutation.FUNCTIONS) <= set(mutation.SCOPE)
    for module, functions in mutation.FUNCTIONS.items():
        defined = _functions(ROOT / mutation.SCOPE[module][0])
        assert set(functions) <= defined, (module, sorted(set(functions) - defined))
        if module.endswith(".task"):  # a task module's scope is its client round
            assert "client_train_round" in functions


def test_the_globs_name_mutmuts_mutants_of_the_scoped_functions():
    assert mutation.mutant_globs("fedmcp.task")[0] == (
        "fedrepro.papers.fedmcp.task.x_client_train_round__mutmut_*")
    assert len(mutation.mutant_globs("fedsumm.task")) == len(mutation.FUNCTIONS["fedsumm.task"])
    assert mutation.mutant_globs("fl.dp") == []  # a method module: every mutant of the file
