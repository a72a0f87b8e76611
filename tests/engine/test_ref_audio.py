"""A session's reference voice (``session.ref_audio``, vLLM-Omni's key; the MAP dialect's
``voice.ref_audio_base64``) reaches the plugin when its slot opens, and is fixed from then on."""

from __future__ import annotations

import pytest

from duplex.engine.settings import SessionSettings
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import DuplexSessionConfig
from tests.engine.conftest import CAPS, make_session

REF = "data:audio/wav;base64,UklGRg=="


def test_the_reference_voice_is_handed_to_the_plugin_as_a_slot_option() -> None:
    base = SessionSettings.defaults("m", CAPS["unit"])
    settings = base.apply(DuplexSessionConfig(ref_audio=REF), CAPS["unit"], audio_started=False)
    assert settings.ref_audio == REF
    session = make_session("unit", ref_audio=REF)
    assert session.slot_options().extra == {"ref_audio": REF}
    assert make_session("unit").slot_options().extra == {}


def test_once_the_slot_is_open_the_reference_voice_cannot_change() -> None:
    caps = CAPS["unit"]
    settings = SessionSettings.defaults("m", caps).apply(
        DuplexSessionConfig(ref_audio=REF), caps, audio_started=False
    )
    same = settings.apply(DuplexSessionConfig(ref_audio=REF), caps, audio_started=False, opened=True)
    assert same.ref_audio == REF
    with pytest.raises(ProtocolError) as err:
        settings.apply(DuplexSessionConfig(ref_audio=REF + "AA"), caps, audio_started=False, opened=True)
    assert (err.value.code, err.value.param) == ("ref_audio_update_unsupported", "session.ref_audio")
