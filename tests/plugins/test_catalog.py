"""Each plugin's registered ``PluginInfo`` (what ``duplex plugins`` shows without importing it)
says what its class says, and each plugin's options are the ones ``from_options`` takes."""

from __future__ import annotations

import re

import pytest

from duplex.plugins import registry
from duplex.plugins.base import PluginError
from duplex.plugins.info import info_from_capabilities

#: Options that build each model plugin without a checkpoint (random weights), to read its
#: capabilities; None: the plugin cannot be built without one.
_NO_CHECKPOINT: dict[str, dict[str, object] | None] = {
    "personaplex": {"random_weights": True, "config": "tiny"},
    "minicpmo_4_5": {"random_weights": True, "config": "tiny"},
    "nemotron_voicechat": None,
    "qwen3_tts": None,
    "sd_turbo": None,
    "helios": None,
}


@pytest.mark.parametrize("name", registry.available())
def test_every_installed_plugin_registers_its_info_under_its_name(name: str) -> None:
    info = registry.info(name)
    assert info.name == name and info.summary and info.outputs


@pytest.mark.parametrize("name", registry.available())
def test_the_registered_info_says_what_the_plugin_class_says(name: str) -> None:
    info = registry.info(name)
    cls = registry.load_class(name)
    if name in _NO_CHECKPOINT:
        assert info.needs_model_path and info.weights
        options = _NO_CHECKPOINT[name]
        if options is None:
            with pytest.raises(PluginError, match="model path"):
                cls.from_options()
            return
        caps = cls.from_options(**options).capabilities()
    else:
        assert not info.needs_model_path
        caps = cls.from_options().capabilities()
    from_class = info_from_capabilities(name, info.summary, caps)
    assert (info.kind, info.inputs, info.outputs) == (from_class.kind, from_class.inputs, from_class.outputs)
    assert set(caps.voices) <= set(info.voices) or info.voices_note  # piper's own come from load()


@pytest.mark.parametrize("name", registry.available())
def test_an_unknown_option_is_refused_with_exactly_the_options_the_plugin_lists(name: str) -> None:
    cls = registry.load_class(name)
    with pytest.raises(PluginError) as refused:
        cls.from_options(no_such_option=1)
    found = re.search(r"unknown options \['no_such_option'\]; valid options: (.*)$", refused.value.message)
    assert found is not None, refused.value.message
    assert found[1].split(", ") == sorted(cls.option_defaults())


def test_each_client_presets_model_name_is_a_public_name_of_its_plugin() -> None:
    """A preset sends its vendor's model name; a server serving that plugin under any name, beside
    other models, answers it exactly only when the plugin declares it (``PluginInfo.model_aliases``)."""
    from clients.presets import PRESETS

    sent = {name: make().session.model for name, make in PRESETS.items()}
    named = {name: model for name, model in sent.items() if model is not None}
    assert set(named) == {"minicpmo_4_5", "personaplex", "nemotron_voicechat"}
    for name, model in named.items():
        assert model in registry.info(name).model_aliases, name
