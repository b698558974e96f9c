"""Property-based tests of the config validation (issue 17, item 1).

Starting from the demo and the paper config, Hypothesis replaces one value (any depth, list items
included) by a value of another type or range, deletes a key or adds an unknown one, and calls
:func:`fedrepro.config.validate_config` with ``config/schema.yaml``. The property: the config is
accepted, or an :class:`~fedrepro.io.InputError` names the dotted key (``config key a.b.c``) —
never another exception. A value of another JSON type than the original (a mapping for a number, a
string for a list, ...) and a NaN (``.nan`` in YAML) must be refused.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml
from helpers import node_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrepro.config import validate_config
from fedrepro.io import InputError

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema.yaml"
CONFIGS = {name: yaml.safe_load((ROOT / "config" / name).read_text()) for name in
           ("config.yaml", "paper.yaml")}
CASES_PER_CONFIG = 150


PATHS = {name: list(node_paths(cfg)) for name, cfg in CONFIGS.items()}


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(v)]


def _dotted(path) -> str:
    return ".".join(str(p) for p in path)


values = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10), st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["", "x", "fast", "1e-3"]),
    st.just([]), st.lists(st.integers(-1, 3), min_size=1, max_size=3), st.just({}),
    st.dictionaries(st.sampled_from(["a", "lr", "seed"]), st.integers(), min_size=1, max_size=2),
)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_shipped_configs_validate(name):
    validate_config(copy.deepcopy(CONFIGS[name]), SCHEMA, source=name)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@settings(max_examples=CASES_PER_CONFIG, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_wrong_value_is_refused_naming_its_dotted_key(name, data):
    cfg = copy.deepcopy(CONFIGS[name])
    path = data.draw(st.sampled_from(PATHS[name]))
    parent = _get(cfg, path[:-1])
    original = parent[path[-1]]
    action = data.draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
    must_fail = False
    if action == "set":
        value = data.draw(values)
        parent[path[-1]] = value
        named = path
        must_fail = _kind(value) != _kind(original) and not (
            original is None or value is None  # null is allowed beside some types
        )
        must_fail |= isinstance(value, float) and math.isnan(value)
    elif action == "delete":
        if isinstance(parent, list):
            parent.pop(path[-1])
        else:
            del parent[path[-1]]
        named = path[:-1]
    else:
        target = original if isinstance(original, dict) else parent
        if not isinstance(target, dict):
            return
        target["zz_unknown_key"] = {"x": [None]}
        named = path if target is original else path[:-1]
        # closed mappings refuse the key; open ones (keyed by source or task name) its value
        must_fail = True
    try:
        validate_config(cfg, SCHEMA, source=name)
    except InputError as exc:
        msg = str(exc)
        keys = [f"config key {_dotted(named[:n])}" for n in range(len(named), 0, -1)]
        if not named:
            keys.append("config key (top level)")
        assert any(k in msg for k in keys), f"{_dotted(path)} ({action}) not named: {msg}"
        if action == "set":
            # the most precise key is named: the changed value's own key, unless a list item
            # fails a constraint of its list (uniqueItems) or an object fails as a whole (oneOf)
            assert keys[0] in msg or isinstance(path[-1], int) or any(
                k in msg for k in keys[1:2]
            ), msg
        return
    assert not must_fail, f"accepted {_dotted(path)} ({action}) = {parent.get(path[-1]) if isinstance(parent, dict) else '?'}"


@pytest.mark.parametrize("section", ["data", "adafedseleckd", "backbones", "partitions"])
@pytest.mark.parametrize("value", [[1, 2], "x", 3])
def test_a_section_of_the_wrong_type_is_named_not_a_crash(section, value):
    cfg = copy.deepcopy(CONFIGS["config.yaml"])
    cfg[section] = value
    with pytest.raises(InputError, match=rf"config key {section}: "):
        validate_config(cfg, SCHEMA)


@pytest.mark.parametrize("value", [[1], "config", None])
def test_a_config_that_is_not_a_mapping_is_named(value):
    with pytest.raises(InputError, match=r"config key \(top level\)"):
        validate_config(value, SCHEMA)
