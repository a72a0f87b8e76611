"""The one rule every plugin parses its serve-time options by (``duplex.plugins.options``)."""

from __future__ import annotations

import pytest

from duplex.plugins.base import PluginError
from duplex.plugins.options import parse_options, pick_default_voice, voice_not_found

TYPES = {"slots": int, "scale": float, "name": str, "warm": bool}


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        ({"slots": "32"}, {"slots": 32}),
        ({"slots": " -3 "}, {"slots": -3}),
        ({"slots": 8}, {"slots": 8}),
        ({"scale": "0.5"}, {"scale": 0.5}),
        ({"scale": 2}, {"scale": 2.0}),
        ({"name": "32"}, {"name": "32"}),
        ({"warm": "Off"}, {"warm": False}),
        ({"warm": "yes"}, {"warm": True}),
        ({"warm": True}, {"warm": True}),
    ],
)
def test_strings_and_ints_are_turned_into_the_declared_type(given: dict, parsed: dict) -> None:
    assert parse_options("toy", given, TYPES) == parsed


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"slots": "many"}, "toy: option 'slots' expects int, got 'many'"),
        ({"slots": "--5"}, "toy: option 'slots' expects int, got '--5'"),
        ({"slots": True}, "toy: option 'slots' expects int, got True"),
        ({"scale": False}, "toy: option 'scale' expects float, got False"),
        ({"warm": "perhaps"}, "toy: option 'warm' expects bool, got 'perhaps'"),
        ({"warm": 1}, "toy: option 'warm' expects bool, got 1"),
        ({"name": 3}, "toy: option 'name' expects str, got 3"),
    ],
)
def test_a_value_of_another_type_is_refused_naming_the_option(given: dict, message: str) -> None:
    with pytest.raises(PluginError) as refused:
        parse_options("toy", given, TYPES)
    assert (refused.value.code, refused.value.message) == ("invalid_plugin_config", message)


def test_an_unknown_option_is_refused_with_the_valid_ones_listed() -> None:
    with pytest.raises(PluginError) as refused:
        parse_options("toy", {"colour": "red", "slots": 1}, TYPES)
    assert refused.value.code == "invalid_plugin_config"
    assert refused.value.message == "toy: unknown options ['colour']; valid options: name, scale, slots, warm"


def test_the_default_voice_is_the_option_else_the_preferred_else_the_first_by_name() -> None:
    voices = {"b": 1, "a": 2, "pref": 3}
    assert pick_default_voice("b", voices, "pref") == "b"
    assert pick_default_voice(None, voices, "pref") == "pref"
    assert pick_default_voice(None, voices, "absent") == "a"
    assert pick_default_voice(None, {}, "pref") is None
    with pytest.raises(PluginError) as refused:
        pick_default_voice("c", voices)
    assert (refused.value.code, refused.value.message) == (
        "voice_not_found",
        "default voice 'c' is not installed",
    )


def test_a_voice_not_installed_lists_the_installed_ones() -> None:
    assert voice_not_found("c", {"b", "a"}).message == "voice 'c' is not installed (installed: a, b)"
    assert voice_not_found("c", ()).message == "voice 'c' is not installed (installed: none)"
