"""Latency of the embedded default model on the CPU: ASR speed, TTS first chunk, end of speech to first audio.

What it measures (each on Piper-spoken English sentences, so the run needs no recordings):

* ``asr``: Whisper tiny.en real-time factor (transcription time / audio length) per utterance.
* ``tts``: Piper time to the first spoken piece of a reply (a multi-sentence answer and the echo
  replies: what a listener waits for), and the synthesis real-time factor.
* ``plugin``: ``DefaultPlugin.respond`` with the chosen reply (``--reply``: ``lm``, the default
  plugin's own language model, or ``echo``), from the call (the end of the user's turn, as the
  engine sees it) to the first chunk with audio. This is the model's share of the
  end-of-speech-to-first-audio budget.
* ``lm`` (with ``--reply lm``): the language model alone, on the sentences as typed text: from the
  request to its first token and to the end of its first sentence (or clause), in seconds and in
  CPU seconds of the process. The model runs on one thread, so its CPU seconds are what the wall
  clock would show on an idle core: the figure to read on a shared machine.
* ``server`` (when ``duplex.engine.Engine`` and ``duplex.server.create_app`` are importable): the
  same question streamed at real-time pacing over the WebSocket of a real server on loopback,
  with server VAD; from the end of the user's speech (the last speech sample sent) to the first
  ``response.output_audio.delta``. This adds the VAD's silence window (``silence_duration_ms``)
  and the transport.

Run: ``python -m bench.default_latency [--reply lm|echo] [--repeats N] [--threads T] [--out PATH]``.
Prints a table and writes JSON (default ``bench/results/default_latency.json``, or
``default_latency_echo.json`` for the echo reply). The goal on a 2-core CPU is an
end-of-speech-to-first-audio p50 under 1 s with the default reply (``lm``). The machine's load
average is recorded: on a shared machine other work slows every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.report import percentile, print_table, write_json

if TYPE_CHECKING:
    from duplex.plugins.default.plugin import DefaultPlugin

__all__ = ["main", "summary"]

SENTENCES = (
    "What time is it in Paris?",
    "Please turn on the lights in the kitchen.",
    "How far is the moon from the earth?",
    "Tell me a short story about a brave little dog.",
    "Can you book a table for two at eight tonight?",
    "What is the weather like tomorrow morning?",
)
REPLY = (
    "Sure, here is what I found. The museum opens at nine in the morning. "
    "Tickets cost twelve euros, and children under six enter for free."
)
RESULTS = Path(__file__).parent / "results"
REPLIES = ("lm", "echo")


def summary(values: list[float]) -> dict[str, float]:
    """n, p50, p95 (``bench.report.percentile``), max and mean of ``values`` (at least one) in the
    values' unit, rounded to 4 decimals for the report."""
    ordered = sorted(values)
    return {
        "n": len(values),
        "p50": round(percentile(ordered, 50), 4),
        "p95": round(percentile(ordered, 95), 4),
        "max": round(ordered[-1], 4),
        "mean": round(statistics.fmean(ordered), 4),
    }


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def _to_16k(pcm: np.ndarray) -> np.ndarray:
    import soxr

    return soxr.resample(pcm, 22050, 16000).astype(np.float32)


def bench_models(repeats: int, threads: int, reply: str = "lm") -> dict[str, object]:
    """ASR real-time factor, TTS first-piece time, and plugin end-of-turn to first audio."""
    from duplex.plugins.base import SlotOptions, TurnRequest
    from duplex.plugins.default.asr import WhisperTranscriber
    from duplex.plugins.default.plugin import DefaultPlugin, DefaultPluginConfig
    from duplex.plugins.default.reply import echo_text
    from duplex.plugins.default.sentences import SentenceSplitter
    from duplex.plugins.default.tts import PiperSpeaker

    t0 = time.perf_counter()
    asr = WhisperTranscriber(cpu_threads=threads)
    asr.load()
    asr_load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tts = PiperSpeaker()
    tts.load()
    tts_load_s = time.perf_counter() - t0
    plugin = DefaultPlugin(DefaultPluginConfig(reply=reply, asr_threads=threads), asr=asr, tts=tts)
    t0 = time.perf_counter()
    plugin.load()
    warm_s = time.perf_counter() - t0
    plugin.open_slot(0, SlotOptions())

    spoken = [_to_16k(tts.speak(s)) for s in SENTENCES]
    tail = np.zeros(3200, dtype=np.float32)  # 200 ms of the silence that ends a turn

    asr_rtf, asr_s, exact = [], [], 0
    tts_first, tts_rtf, plugin_first, plugin_asr_share = [], [], [], []
    for r in range(repeats):
        for sentence, pcm in zip(SENTENCES, spoken, strict=True):
            t0 = time.perf_counter()
            text = asr.transcribe(pcm)
            dt = time.perf_counter() - t0
            asr_s.append(dt)
            asr_rtf.append(dt / (len(pcm) / 16000))
            exact += _words(text) == _words(sentence)

            turn = np.concatenate([pcm, tail])
            t0 = time.perf_counter()
            t_transcript = None
            response = plugin.respond(TurnRequest(slot=0, epoch=r, pcm=turn))
            for out in response:
                if out.user_transcript is not None and t_transcript is None:
                    t_transcript = time.perf_counter() - t0
                if out.pcm is not None:
                    plugin_first.append(time.perf_counter() - t0)
                    plugin_asr_share.append(t_transcript or 0.0)
                    break
            response.close()  # a language model's reply stops here, as on a barge-in

        for spoken_reply in (REPLY, *(echo_text(s) for s in SENTENCES)):
            t0 = time.perf_counter()
            splitter = SentenceSplitter(
                max_chars=plugin.config.max_sentence_chars,
                max_piece_chars=plugin.config.max_piece_chars,
                first_clause=plugin.config.first_clause,
            )
            pieces = splitter.feed(spoken_reply) + splitter.flush()
            audio_s = 0.0
            audible = (piece for piece in tts.speak_all(pieces) if piece is not None)  # None: silent
            for i, piece in enumerate(audible):
                if i == 0:
                    tts_first.append(time.perf_counter() - t0)
                audio_s += len(piece.pcm) / tts.sample_rate
            tts_rtf.append((time.perf_counter() - t0) / audio_s)

    lm = bench_lm(plugin, repeats) if reply == "lm" else None
    plugin.close()
    return {
        "load_s": {"asr": round(asr_load_s, 3), "tts": round(tts_load_s, 3), "warm_up": round(warm_s, 3)},
        "asr": {
            "rtf": summary(asr_rtf),
            "seconds": summary(asr_s),
            "word_exact_transcripts": f"{exact}/{len(asr_s)}",
        },
        "tts": {"first_piece_s": summary(tts_first), "rtf": summary(tts_rtf)},
        "plugin": {
            "end_of_turn_to_first_audio_s": summary(plugin_first),
            "end_of_turn_to_transcript_s": summary(plugin_asr_share),
        },
        **({"lm": lm} if lm is not None else {}),
    }


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def bench_lm(plugin: DefaultPlugin, repeats: int) -> dict[str, object]:
    """The ``lm`` reply alone: time and CPU time to the first token and to the first piece the
    plugin would speak (its first sentence, or first clause)."""
    from duplex.plugins.default.reply import ReplyPrompt
    from duplex.plugins.default.sentences import SentenceSplitter

    config = plugin.config
    first_s, first_cpu, sentence_s, sentence_cpu, answers = [], [], [], [], {}
    for _ in range(repeats):
        for sentence in SENTENCES:
            splitter = SentenceSplitter(
                max_chars=config.max_sentence_chars,
                max_piece_chars=config.max_piece_chars,
                first_clause=config.first_clause,
            )
            text, t0, c0 = "", time.perf_counter(), _cpu_s()
            reply = plugin.reply_strategy.reply(ReplyPrompt(user_text=sentence))
            for i, delta in enumerate(reply):
                if i == 0:
                    first_s.append(time.perf_counter() - t0)
                    first_cpu.append(_cpu_s() - c0)
                pieces = splitter.feed(delta)
                if pieces:
                    text = pieces[0]
                    break
            else:
                text = "".join(splitter.flush())
            reply.close()
            sentence_s.append(time.perf_counter() - t0)
            sentence_cpu.append(_cpu_s() - c0)
            answers[sentence] = text
    return {
        "first_token_s": summary(first_s),
        "first_token_cpu_s": summary(first_cpu),
        "first_sentence_s": summary(sentence_s),
        "first_sentence_cpu_s": summary(sentence_cpu),
        "first_sentences": answers,
    }


def bench_server(turns: int, reply: str = "lm") -> dict[str, object]:
    """End of speech to first audio through a real server on loopback (see the module docstring)."""
    try:
        from duplex.engine import Engine  # noqa: F401
        from duplex.server.app import create_app  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"engine or server not available: {exc}"}
    return asyncio.run(_bench_server(turns, reply))


async def _bench_server(turns: int, reply: str) -> dict[str, object]:
    import soxr

    from clients.collector import event_type
    from clients.pacing import Pacer
    from clients.websocket import DuplexClient
    from duplex.engine import Engine, EngineConfig
    from duplex.plugins.default.plugin import DefaultPlugin, DefaultPluginConfig
    from duplex.protocol.audio import encode_audio
    from duplex.protocol.formats import AudioFormat
    from duplex.server.app import create_app
    from duplex.server.config import ServeConfig, ServerConfig
    from duplex.server.serve import DrainingServer, uvicorn_config

    plugin = DefaultPlugin(DefaultPluginConfig(reply=reply, max_sessions=1))
    plugin.load()
    rate, append = 24000, 960  # the client's format: PCM16 at 24 kHz, 40 ms appends
    fmt = AudioFormat("pcm16", rate)
    lead, tail = np.zeros(rate * 3 // 10, np.float32), np.zeros(rate * 12 // 10, np.float32)
    clips = []
    for sentence in SENTENCES:
        speech = soxr.resample(plugin.tts.speak(sentence), 22050, rate).astype(np.float32)
        clips.append((np.concatenate([lead, speech, tail]), len(lead) + len(speech)))

    engine = Engine(plugin, EngineConfig(max_sessions=2), model_name="default")
    cfg = ServeConfig(server=ServerConfig(port=0))
    server = DrainingServer(uvicorn_config(create_app(engine, cfg.server), cfg, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait({serving, ready}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        ready.cancel()
        serving.result()
        raise RuntimeError("the server did not start")
    silence_ms = None
    eos_to_audio, stopped_to_audio, stopped_lag = [], [], []
    try:
        url = f"ws://127.0.0.1:{server.port}/v1/realtime"
        async with DuplexClient(url, model="default") as client:
            vad = client.session.audio.input.turn_detection
            silence_ms = getattr(vad, "silence_duration_ms", None)
            marks: dict[str, float] = {}

            def on_event(event: object) -> None:
                kind = event_type(event)
                if kind not in marks and kind in (
                    "input_audio_buffer.speech_stopped",
                    "response.output_audio.delta",
                ):
                    marks[kind] = time.perf_counter()
                if kind == "response.done":
                    marks.setdefault("done", time.perf_counter())

            client.add_listener(on_event)
            for turn in range(turns):
                pcm, speech_end = clips[turn % len(clips)]
                marks.clear()
                pacer = Pacer(append / rate)
                end_of_speech = None
                for start in range(0, len(pcm), append):
                    await pacer.wait_next()
                    await client.append_audio(encode_audio(pcm[start : start + append], fmt))
                    if end_of_speech is None and start + append >= speech_end:
                        # the append that carries the last speech sample: speech ended inside it
                        end_of_speech = pacer.due(pacer.index - 1) + (speech_end - start) / rate
                # Only the first audio is measured: the rest of a long reply is cancelled, not played.
                first = await client.wait_for("response.output_audio.delta", "response.done", timeout=30)
                if event_type(first) != "response.done":
                    await client.cancel_response()
                    await client.wait_for("response.done", timeout=30)
                first_audio = marks.get("response.output_audio.delta")
                stopped = marks.get("input_audio_buffer.speech_stopped")
                if first_audio is None or stopped is None or end_of_speech is None:
                    continue
                eos_to_audio.append(first_audio - end_of_speech)
                stopped_to_audio.append(first_audio - stopped)
                stopped_lag.append(stopped - end_of_speech)
    finally:
        server.should_exit = True
        await serving
        plugin.close()
    return {
        "turns": turns,
        "answered": len(eos_to_audio),
        "vad_silence_duration_ms": silence_ms,
        "end_of_speech_to_first_audio_s": summary(eos_to_audio),
        "end_of_speech_to_speech_stopped_s": summary(stopped_lag),
        "speech_stopped_to_first_audio_s": summary(stopped_to_audio),
    }


#: The printed table: one row per figure, seconds (or a ratio) to three decimals.
COLUMNS = ["metric", "n", *((key, key, ".3f") for key in ("p50", "p95", "max"))]


def _print_table(results: dict[str, object]) -> None:
    models = results["models"]
    assert isinstance(models, dict)
    figures = [
        ("ASR real-time factor", models["asr"]["rtf"]),
        ("ASR seconds per utterance", models["asr"]["seconds"]),
        ("TTS first piece (s)", models["tts"]["first_piece_s"]),
        ("TTS real-time factor", models["tts"]["rtf"]),
        ("plugin end of turn -> transcript (s)", models["plugin"]["end_of_turn_to_transcript_s"]),
        ("plugin end of turn -> first audio (s)", models["plugin"]["end_of_turn_to_first_audio_s"]),
    ]
    lm = models.get("lm")
    if isinstance(lm, dict):
        figures += [
            ("lm first token (s)", lm["first_token_s"]),
            ("lm first token (CPU s)", lm["first_token_cpu_s"]),
            ("lm first sentence (s)", lm["first_sentence_s"]),
            ("lm first sentence (CPU s)", lm["first_sentence_cpu_s"]),
        ]
    server = results.get("server")
    if isinstance(server, dict) and "end_of_speech_to_first_audio_s" in server:
        figures += [
            ("server end of speech -> first audio (s)", server["end_of_speech_to_first_audio_s"]),
            ("server end of speech -> speech_stopped (s)", server["end_of_speech_to_speech_stopped_s"]),
            ("server speech_stopped -> first audio (s)", server["speech_stopped_to_first_audio_s"]),
        ]
    print_table([{"metric": name, **stats} for name, stats in figures], COLUMNS)
    print(f"ASR transcripts with every word right: {models['asr']['word_exact_transcripts']}")


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reply", choices=REPLIES, default="lm", help="the default plugin's reply strategy")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the sentence list")
    parser.add_argument("--threads", type=int, default=0, help="Whisper CPU threads (0: CTranslate2 decides)")
    parser.add_argument("--server-turns", type=int, default=6, help="turns through the server (0: skip)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: by the reply)")
    args = parser.parse_args(argv)
    suffix = "" if args.reply == "lm" else f"_{args.reply}"
    out = args.out or RESULTS / f"default_latency{suffix}.json"

    results: dict[str, object] = {
        "benchmark": "default_latency",
        "host": {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        },
        "reply": args.reply,
        "goal": "end of speech to first audio under 1 s",
        "models": bench_models(args.repeats, args.threads, args.reply),
    }
    if args.server_turns > 0:
        results["server"] = bench_server(args.server_turns, args.reply)
    results["host"]["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)  # type: ignore[index]
    _print_table(results)
    print(f"wrote {write_json(out, results)}")
    return results


if __name__ == "__main__":
    main()
