"""Knob parsing and configuration resolution (pinned settings define stock)."""

import pytest

from inferloom.workloads.base import ConfigError, Knob, config_key, resolve_config

KNOBS = [
    Knob("cache", "choice", "dynamic", "kv cache", choices=("dynamic", "static")),
    Knob("mb", "int", 8, "micro-batch", low=1, high=8),
    Knob("tf32", "bool", False, "tf32", applies_to=frozenset({"cuda"}), changes_numerics=True),
]


def test_stock_is_defaults():
    assert resolve_config(KNOBS, {}) == {"cache": "dynamic", "mb": 8, "tf32": False}


def test_strings_are_parsed():
    cfg = resolve_config(KNOBS, {"cache": "static", "mb": "2", "tf32": "true"})
    assert cfg == {"cache": "static", "mb": 2, "tf32": True}


@pytest.mark.parametrize("over, needle", [
    ({"nope": "1"}, "unknown knob"),
    ({"mb": "0"}, "integer in [1, 8]"),
    ({"mb": "x"}, "integer in [1, 8]"),
    ({"cache": "paged"}, "one of dynamic, static"),
    ({"tf32": "maybe"}, "true or false"),
])
def test_bad_candidates(over, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        resolve_config(KNOBS, over)


def test_pinned_defines_stock_and_cannot_be_overridden():
    stock = resolve_config(KNOBS, {}, pinned={"mb": 4})
    assert stock["mb"] == 4
    with pytest.raises(ConfigError, match="pinned"):
        resolve_config(KNOBS, {"mb": "2"}, pinned={"mb": 4})
    # restating the pinned value is allowed
    assert resolve_config(KNOBS, {"mb": "4"}, pinned={"mb": 4})["mb"] == 4


def test_config_key_is_order_independent():
    assert config_key({"b": 1, "a": 2}) == config_key({"a": 2, "b": 1}) == "a=2,b=1"
