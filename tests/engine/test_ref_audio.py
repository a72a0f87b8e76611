"""A session's reference voice (``session.ref_audio``, vLLM-Omni's key; the MAP dialect's
``voice.ref_audio_base64``, which its codec turns into the same data URI) reaches a plugin that reads
it (``Capabilities.session_options``) as the decoded file when its slot opens, and is fixed from then
on; a model that reads none refuses it rather than ignoring it."""

from __future__ import annotations

import msgspec
import pytest

from duplex.engine.settings import SessionSettings
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import DuplexSessionConfig
from tests.engine.conftest import CAPS, make_session

REF = "data:audio/wav;base64,UklGRg=="
VOICED = msgspec.structs.replace(CAPS["unit"], session_options=("ref_audio",))


def test_the_reference_voice_is_handed_to_the_plugin_as_a_slot_option() -> None:
    base = SessionSettings.defaults("m", VOICED)
    settings = base.apply(DuplexSessionConfig(ref_audio=REF), VOICED, audio_started=False)
    assert settings.ref_audio == b"RIFF"
    session = make_session("unit", ref_audio=settings.ref_audio)
    assert session.slot_options().extra == {"ref_audio": b"RIFF"}
    assert make_session("unit").slot_options().extra == {}


def test_once_the_slot_is_open_the_reference_voice_cannot_change() -> None:
    settings = SessionSettings.defaults("m", VOICED).apply(
        DuplexSessionConfig(ref_audio=REF), VOICED, audio_started=False
    )
    same = settings.apply(DuplexSessionConfig(ref_audio=REF), VOICED, audio_started=False, opened=True)
    assert same.ref_audio == b"RIFF"
    with pytest.raises(ProtocolError) as err:
        settings.apply(
            DuplexSessionConfig(ref_audio="data:audio/wav;base64,UklGRgAA"),
            VOICED,
            audio_started=False,
            opened=True,
        )
    assert (err.value.code, err.value.param) == ("ref_audio_update_unsupported", "session.ref_audio")


def test_a_model_that_reads_no_reference_voice_refuses_one() -> None:
    caps = CAPS["unit"]
    with pytest.raises(ProtocolError) as err:
        SessionSettings.defaults("m", caps).apply(
            DuplexSessionConfig(ref_audio=REF), caps, audio_started=False
        )
    assert (err.value.code, err.value.param) == ("invalid_session_config", "session.ref_audio")
