"""``clients.audio_device`` block by block: the stand-in's streams run no thread here (``pump``), so
every callback happens exactly when the test says. The jitter buffer, the flush on barge-in, the
bounds of both buffers and the acks and truncations ``SpeakerPlayback`` derives from the frames the
device consumed."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from clients.audio_device import AudioDeviceError, MicrophoneStream, SpeakerPlayback, SpeakerStream
from duplex.protocol import (
    AudioFormat,
    ConversationItemTruncate,
    DuplexResponseOutputAudioDelta,
    InputAudioBufferSpeechStarted,
    OverlapDecision,
    PlaybackAck,
    ResponseDone,
)
from duplex.protocol.audio import encode_audio
from duplex.protocol.realtime.responses import Response
from tests.clients.test_talk_fake_sounddevice import FakeSoundDevice, FakeStream

PCM16 = AudioFormat("pcm16", 24000)


def tone(ms: int, value: float = 0.25, rate: int = 24000) -> np.ndarray:
    return np.full(rate * ms // 1000, value, dtype=np.float32)


def delta(rid: str, pcm: np.ndarray):
    return DuplexResponseOutputAudioDelta(
        event_id="e",
        response_id=rid,
        item_id=f"item_{rid}",
        output_index=0,
        content_index=0,
        delta=encode_audio(pcm, PCM16),
        format="pcm16",
        sample_rate_hz=24000,
    )


def done(rid: str):
    return ResponseDone(event_id="e", response=Response(id=rid, status="completed"))


SPEECH_STARTED = InputAudioBufferSpeechStarted(event_id="e", audio_start_ms=0, item_id="item_user")


def output(sd: FakeSoundDevice) -> FakeStream:
    (stream,) = [s for s in sd.streams if s.kind == "output"]
    return stream


def test_playback_waits_for_the_prebuffer_then_plays_in_order_and_counts_what_was_played() -> None:
    sd = FakeSoundDevice(realtime=False)
    with SpeakerStream(sd, prebuffer_ms=60, block_ms=20) as speaker:
        speaker.push("r", tone(40, 0.1), 24000)
        output(sd).pump(1)
        assert not sd.played().any() and speaker.played_ms("r") == 0.0  # 40 ms < the prebuffer
        speaker.push("r", tone(40, 0.2), 24000)
        output(sd).pump(3)
        assert speaker.played_ms("r") == 60.0 and speaker.queued_ms == 20.0
        output(sd).pump(2)  # plays the last 20 ms, then runs dry: silence, not garbage
        assert speaker.played_ms("r") == 80.0 and not speaker.finished("r")
        speaker.end("r")
        assert speaker.finished("r")
    played = sd.played()
    assert np.array_equal(played[480:2400], np.r_[tone(40, 0.1), tone(40, 0.2)])
    assert not played[:480].any() and not played[2400:].any()
    assert output(sd).closed


def test_an_ended_response_plays_without_waiting_for_the_prebuffer() -> None:
    sd = FakeSoundDevice(realtime=False)
    with SpeakerStream(sd, prebuffer_ms=500, block_ms=20) as speaker:
        speaker.push("r", tone(20), 24000)
        speaker.end("r")
        output(sd).pump(1)
        assert speaker.finished("r") and speaker.played_ms("r") == 20.0


def test_a_device_at_another_rate_gets_resampled_audio_and_positions_stay_in_ms() -> None:
    sd = FakeSoundDevice(output_rate=48000, realtime=False)
    with SpeakerStream(sd, prebuffer_ms=0, block_ms=20) as speaker:
        assert speaker.device_rate == 48000
        speaker.push("r", tone(100), 24000)
        speaker.end("r")
        output(sd).pump(6)
        assert speaker.finished("r") and speaker.played_ms("r") == 100.0
    assert np.count_nonzero(sd.played()) == pytest.approx(4800, abs=2)


def test_flush_drops_the_queue_at_once_and_reports_the_played_position() -> None:
    sd = FakeSoundDevice(realtime=False)
    with SpeakerStream(sd, prebuffer_ms=0, block_ms=20) as speaker:
        speaker.push("r", tone(200), 24000)
        output(sd).pump(3)
        assert speaker.flush() == {"r": 60.0}
        output(sd).pump(2)
        assert speaker.queued_ms == 0.0 and speaker.played_ms("r") == 60.0
    assert np.count_nonzero(sd.played()) == 1440


def test_audio_beyond_the_buffer_bound_is_dropped_counted_and_never_acknowledged() -> None:
    sd = FakeSoundDevice(realtime=False)
    with SpeakerStream(sd, prebuffer_ms=0, block_ms=20, max_buffer_ms=100) as speaker:
        playback = SpeakerPlayback(speaker, PCM16)
        playback.on_event(delta("r", tone(150)), 0.0)
        playback.on_event(done("r"), 0.0)
        assert speaker.dropped_ms == 50.0
        output(sd).pump(6)
        acks = playback.acks_due(1.0)
    assert acks == [PlaybackAck(response_id="r", item_id="item_r", played_ms=100.0)]


def test_acks_follow_the_device_at_most_once_per_interval_and_once_more_when_fully_played() -> None:
    sd = FakeSoundDevice(realtime=False)
    with SpeakerStream(sd, prebuffer_ms=0, block_ms=20) as speaker:
        playback = SpeakerPlayback(speaker, PCM16, interval_ms=100)
        playback.on_event(delta("r", tone(100)), 0.0)
        assert playback.acks_due(0.0) == []  # nothing played yet
        output(sd).pump(2)
        assert [a.played_ms for a in playback.acks_due(0.01)] == [40.0]
        output(sd).pump(1)
        assert playback.acks_due(0.05) == []  # within the interval
        playback.on_event(done("r"), 0.06)
        output(sd).pump(2)
        assert [a.played_ms for a in playback.acks_due(0.07)] == [100.0]  # finished: at once
        assert playback.items == {} and not playback.busy


def test_speech_while_the_reply_plays_flushes_and_truncates_at_the_played_position() -> None:
    sd = FakeSoundDevice(realtime=False)
    with SpeakerStream(sd, prebuffer_ms=0, block_ms=20) as speaker:
        playback = SpeakerPlayback(speaker, PCM16)
        playback.on_event(delta("r", tone(500)), 0.0)
        output(sd).pump(7)
        playback.on_event(SPEECH_STARTED, 0.2)
        assert speaker.queued_ms == 0.0 and not playback.busy
        assert playback.acks_due(0.2) == [
            ConversationItemTruncate(item_id="item_r", content_index=0, audio_end_ms=140)
        ]
        playback.on_event(delta("r", tone(100)), 0.25)  # in flight before the server stopped
        output(sd).pump(3)
        assert playback.acks_due(1.0) == [] and playback.barge_ins == 1
    assert np.count_nonzero(sd.played()) == 7 * 480


def test_an_overlap_decision_to_barge_in_stops_the_reply_too() -> None:
    sd = FakeSoundDevice(realtime=False)
    with SpeakerStream(sd, prebuffer_ms=0, block_ms=20) as speaker:
        playback = SpeakerPlayback(speaker, PCM16)
        playback.on_event(delta("r", tone(500)), 0.0)
        output(sd).pump(2)
        playback.on_event(OverlapDecision(event_id="e", action="listen", reason="short"), 0.1)
        assert playback.busy  # listening is no barge-in
        playback.on_event(OverlapDecision(event_id="e", action="barge_in", reason="overlap"), 0.2)
        assert not playback.busy and playback.barge_ins == 1
        assert playback.acks_due(0.2) == [
            ConversationItemTruncate(item_id="item_r", content_index=0, audio_end_ms=40)
        ]


def test_speech_after_the_reply_was_played_is_no_barge_in() -> None:
    sd = FakeSoundDevice(realtime=False)
    with SpeakerStream(sd, prebuffer_ms=0, block_ms=20) as speaker:
        playback = SpeakerPlayback(speaker, PCM16)
        playback.on_event(delta("r", tone(40)), 0.0)
        playback.on_event(done("r"), 0.0)
        output(sd).pump(2)
        playback.on_event(SPEECH_STARTED, 0.1)
        assert playback.acks_due(0.1) == [PlaybackAck(response_id="r", item_id="item_r", played_ms=40.0)]
        assert playback.barge_ins == 0


async def test_the_microphone_resamples_to_the_session_rate_and_drops_the_oldest_audio_when_unread() -> None:
    sd = FakeSoundDevice(input_rate=24000, realtime=False)
    sd.say(np.arange(1, 4801, dtype=np.float32) / 8192, 24000)  # 200 ms, every sample distinct
    with MicrophoneStream(sd, rate=24000, block_ms=20, max_buffer_ms=100) as mic:
        (stream,) = sd.streams
        stream.pump(10)
        await asyncio.sleep(0)  # the loop takes the hand-overs
        assert mic.dropped_ms == 100.0
        got = await mic.read(2400)
    assert np.array_equal(got, np.arange(2401, 4801, dtype=np.float32) / 8192)
    assert stream.closed


async def test_a_stopped_microphone_ends_the_reader() -> None:
    sd = FakeSoundDevice(realtime=False)
    with MicrophoneStream(sd, rate=24000) as mic:
        sd.streams[0].stop()  # the device went away: PortAudio calls the finished callback
        with pytest.raises(AudioDeviceError, match="the microphone stopped"):
            await mic.read(480)
