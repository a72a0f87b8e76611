"""The OmniInteract runner end to end against the scripted server: replay, artifacts, timing, judge."""

from __future__ import annotations

import dataclasses
import json
import wave
from pathlib import Path

import httpx
import pytest

from bench.cli import main
from bench.omniinteract.artifacts import TIMESTAMP_SEMANTICS
from bench.omniinteract.dataset import discover
from bench.omniinteract.judge import JudgeOptions, evaluate_run
from bench.omniinteract.prompts import OUR_PROMPTS
from bench.omniinteract.replay import ReplayOptions, select_frame_transport
from bench.omniinteract.runner import RunnerError, RunOptions, run_omniinteract
from duplex.protocol import SessionCapabilities
from tests.bench.scripted_server import Script, scripted_server

# The scripted model answers 0.5 s of audio ("four") after the 3rd 200 ms append (0.6 s into the
# clip), so the answer lies inside the 2 s horizon; the commit is answered with response.listen.
MID_STREAM = {"reply": "turn", "input_rate": 16000, "chunk_period_ms": 1000, "kind": "unit",
              "reply_after_appends": 3, "reply_s": 0.5, "reply_packets": 5}


def _opts(url: str, out: Path, dataset: Path, **kw: object) -> RunOptions:
    replay = ReplayOptions(url=url, settle_s=0.2, decision_timeout_s=2.0, timeout_s=30.0)
    base: dict = {"dataset_path": str(dataset), "replay": replay, "output_dir": str(out), "num": 1,
                  "subsets": ("1q1a_math",)}
    return RunOptions(**{**base, **kw})


async def test_one_case_publishes_every_artifact_with_timing(dataset_root: Path, tmp_path: Path) -> None:
    script = Script(**MID_STREAM, optional_input_modalities=("video",))
    async with scripted_server(script) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root), progress=None)
        received = next(iter(srv.received.values()))
    assert (batch["total"], batch["success"], batch["failed"]) == (1, 1, 0)
    assert batch["eligible_for_official_eval"] == 1
    result = batch["results"][0]
    case_dir = Path(result["output_dir"])
    assert case_dir.parent.name == "1q1a_math" and case_dir.name.startswith("videos__lesson--")
    for name in ("output.wav", "wav_transcript.json", "events.json", "result.json", ".done"):
        assert (case_dir / name).is_file(), name
    assert not (case_dir / ".failed.json").exists()
    # what the client sent: 10 appends of 200 ms, 2 frames riding them, one commit
    kinds = [type(c).__struct_config__.tag for c in received]
    appends = [c for c in received if type(c).__struct_config__.tag == "input_audio_buffer.append"]
    assert len(appends) == 10 and all(len(a.audio) == 6400 for a in appends)
    assert [len(a.video_frames or []) for a in appends] == [0, 0, 1, 0, 0, 0, 0, 1, 0, 0]
    assert kinds.count("input_audio_buffer.commit") == 1
    assert "playback.ack" in kinds
    # result and timing
    assert result["frame_transport"] == "video_frames" and result["input_video_frames"] == 2
    assert result["input_audio_chunks"] == 10 and result["responses"] == 1
    assert result["audio_bytes"] == 24000 and result["audio_clipped_bytes"] == 0
    m = result["duplex_session_metrics"]
    assert m["audio_turn_count"] == 1 and m["stream_audio_duration_ms"] == pytest.approx(500.0)
    assert m["stream_ttfp_ms"] >= 400.0  # the reply only exists after the third append was sent
    assert m["stream_ttft_ms"] <= m["stream_ttfp_ms"]
    req = result["duplex_request_metrics"][0]
    assert req["status"] == "completed" and req["audio_duration_ms"] == pytest.approx(500.0)
    # transcript: one chunk, serialized playback: 0.5 s long
    transcript = json.loads((case_dir / "wav_transcript.json").read_text())
    assert transcript["text"] == "four" and transcript["timestamp_semantics"] == TIMESTAMP_SEMANTICS
    (chunk,) = transcript["chunks"]
    assert chunk["timestamp"][1] - chunk["timestamp"][0] == pytest.approx(0.5, abs=0.002)
    with wave.open(str(case_dir / "output.wav")) as w:
        assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (24000, 1, 2 * 24000)
    events = json.loads((case_dir / "events.json").read_text())
    deltas = [e for e in events if e["event"]["type"] == "response.output_audio.delta"]
    assert len(deltas) == 5
    assert all("delta" not in e["event"] and e["event"]["audio_bytes"] == 4800 for e in deltas)
    # batch files
    manifest = [json.loads(x) for x in (tmp_path / "official_eval_manifest.jsonl").read_text().splitlines()]
    assert manifest[0]["sample_id"] == f"1q1a_math__{case_dir.name}"
    assert manifest[0]["model_json"] == str(case_dir / "wav_transcript.json")
    sampled = [json.loads(x) for x in (tmp_path / "sampled_cases.jsonl").read_text().splitlines()]
    assert sampled == [{"video_path": result["video"], "output_name": "1q1a_math/videos__lesson",
                        "subset": "1q1a_math"}]


async def test_image_items_carry_frames_for_an_image_model(dataset_root: Path, tmp_path: Path) -> None:
    script = Script(**MID_STREAM, supports_image_input=True)
    async with scripted_server(script) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root), progress=None)
        received = next(iter(srv.received.values()))
    creates = [c for c in received if type(c).__struct_config__.tag == "conversation.item.create"]
    assert [c.item.id for c in creates] == ["omniinteract_frame_0", "omniinteract_frame_1"]
    assert creates[0].item.content[0].image_url.startswith("data:image/jpeg;base64,/9j/")
    assert batch["results"][0]["frame_transport"] == "image_items"


async def test_an_audio_only_model_gets_no_frames_and_a_warning(dataset_root: Path, tmp_path: Path) -> None:
    async with scripted_server(Script(**MID_STREAM)) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root), progress=None)
    result = batch["results"][0]
    assert result["success"] and result["frame_transport"] == "none" and result["input_video_frames"] == 0
    assert any("frames not sent" in w for w in result["artifact_warnings"])


def test_frame_transport_follows_capabilities_only() -> None:
    caps = SessionCapabilities
    assert select_frame_transport(None) == "video_frames"
    assert select_frame_transport(caps(kind="unit", optional_input_modalities=["video"])) == "video_frames"
    assert select_frame_transport(caps(kind="turn", supports_image_input=True)) == "image_items"
    assert select_frame_transport(caps(kind="frame")) == "none"
    assert select_frame_transport(caps(kind="frame"), "video_frames") == "video_frames"


async def test_a_server_error_fails_the_case_and_writes_failed_json(
    dataset_root: Path, tmp_path: Path
) -> None:
    script = Script(**{**MID_STREAM, "reply": "echo"}, error_at=frozenset({1}))
    async with scripted_server(script) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root), progress=None)
    result = batch["results"][0]
    assert batch["failed"] == 1 and not result["success"]
    assert result["error"].startswith("server error scripted_error")
    case_dir = Path(result["output_dir"])
    assert (case_dir / ".failed.json").is_file() and not (case_dir / ".done").exists()
    assert result["official_eval_ineligible_reasons"] == ["case_failed"]
    assert (tmp_path / "official_eval_manifest.jsonl").read_text() == ""


async def test_a_refused_session_is_a_failed_case_not_a_crash(dataset_root: Path, tmp_path: Path) -> None:
    async with scripted_server(Script(max_sessions=0)) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root), progress=None)
    assert batch["failed"] == 1 and batch["results"][0]["error"].startswith("resource_exhausted")


async def test_a_video_list_cannot_be_combined_with_tags(dataset_root: Path, tmp_path: Path) -> None:
    listing = tmp_path / "l.jsonl"
    listing.write_text("")
    with pytest.raises(RunnerError, match="video list"):
        await run_omniinteract(_opts("ws://unused", tmp_path, dataset_root, video_list=str(listing),
                                     tags=("realtime",)), progress=None)


async def test_judging_scores_the_eligible_cases(dataset_root: Path, tmp_path: Path) -> None:
    asked: list[list[dict[str, str]]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        asked.append(body["messages"])
        assert (body["temperature"], body["stream"], body["max_tokens"]) == (0.0, False, 512)
        early = body["messages"][0]["content"] == OUR_PROMPTS.early_system
        reply = '{"flag": "Neutral", "score": 1}' if early else '{"score": 1}'
        return httpx.Response(200, json={"choices": [{"message": {"content": reply}}]})

    judge = JudgeOptions(base_url="http://judge", model="judge-model", transport=httpx.MockTransport(answer))
    # The answer comes after the 6th append (1.0 s): in the core stage of the slot [0.5, 1.0, 61).
    async with scripted_server(Script(**{**MID_STREAM, "reply_after_appends": 6})) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root, judge=judge), progress=None)
    ev = batch["evaluation"]
    assert ev["status"] == "ok" and ev["evaluated"] == 1 and ev["failed"] == 0
    summary = json.loads((tmp_path / "evaluation" / "unified_eval_summary.json").read_text())
    assert summary["summary"]["global"]["slots"] == 1
    assert summary["summary"]["global"]["TP"] > 0 and summary["summary"]["global"]["IA_QTF1"] > 0
    assert summary["prompt_set"] == "ours" and summary["judge_replies"]["llm_json"] == 1
    ((system, user),) = asked
    assert (system["role"], system["content"], user["role"]) == ("system", OUR_PROMPTS.core_system, "user")
    assert "The reference answer: four" in user["content"]
    assert "Scene: multi_turn; slot 1 (turn 1, step None); boundary Hard;" in user["content"]
    cache = tmp_path / "evaluation" / f"{ev['items'][0]['sample_id']}.unified_eval.json"
    cached = json.loads(cache.read_text())
    assert cached["status"] == "ok" and cached["inputs_fingerprint"]["judge_model"] == "judge-model"
    # a second evaluation with skip_existing reuses the cache (same fingerprint): no new judge call
    again = await evaluate_run(tmp_path, discover(dataset_root, ["1q1a_math"]), batch["results"],
                               dataclasses.replace(judge, skip_existing=True), progress=None)
    assert again["skipped"] == 1 and again["evaluated"] == 1 and len(asked) == 1
    assert again["summary"]["global"] == ev["summary"]["global"]
    # a different judge model changes the fingerprint: the case is judged again
    await evaluate_run(tmp_path, discover(dataset_root, ["1q1a_math"]), batch["results"],
                       dataclasses.replace(judge, skip_existing=True, model="other"), progress=None)
    assert len(asked) == 2


async def test_the_image_window_deletes_the_oldest_item_first(dataset_root: Path, tmp_path: Path) -> None:
    script = Script(**MID_STREAM, supports_image_input=True)
    async with scripted_server(script) as srv:
        opts = _opts(srv.url, tmp_path, dataset_root)
        opts = dataclasses.replace(opts, replay=dataclasses.replace(opts.replay, max_image_items=1))
        await run_omniinteract(opts, progress=None)
        received = next(iter(srv.received.values()))
    items = [(type(c).__struct_config__.tag, getattr(c, "item_id", None) or c.item.id) for c in received
             if type(c).__struct_config__.tag.startswith("conversation.item.")]
    assert items == [("conversation.item.create", "omniinteract_frame_0"),
                     ("conversation.item.delete", "omniinteract_frame_0"),
                     ("conversation.item.create", "omniinteract_frame_1")]


async def test_a_dropped_connection_fails_the_case_and_the_run_goes_on(
    dataset_root: Path, tmp_path: Path
) -> None:
    async with scripted_server(Script(**MID_STREAM, drop_after_appends=4)) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root), progress=None)
    result = batch["results"][0]
    assert batch["failed"] == 1 and not result["success"]
    assert result["error"] == "the session ended before the case completed"


async def test_a_server_vad_model_gets_a_silent_tail_instead_of_a_commit(
    dataset_root: Path, tmp_path: Path
) -> None:
    async with scripted_server(Script(**MID_STREAM, server_vad=True)) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root), progress=None)
        received = next(iter(srv.received.values()))
    result = batch["results"][0]
    assert result["success"] and result["turn_detection"] == "server_vad"
    kinds = [type(c).__struct_config__.tag for c in received]
    assert "input_audio_buffer.commit" not in kinds
    update = [c for c in received if type(c).__struct_config__.tag == "session.update"][-1]
    assert type(update.session.audio.input.turn_detection).__struct_config__.tag == "server_vad"
    assert kinds.count("input_audio_buffer.append") == 10 + 8  # 2 s of video + 1.5 s of silence


async def test_an_unreadable_judge_reply_scores_as_the_benchmark_scores_it_and_is_counted(
    dataset_root: Path, tmp_path: Path
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"message": {"content": "I think it is fine."}}]})

    judge = JudgeOptions(base_url="http://judge", model="m", transport=httpx.MockTransport(answer))
    async with scripted_server(Script(**{**MID_STREAM, "reply_after_appends": 6})) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root, judge=judge), progress=None)
    ev = batch["evaluation"]
    assert (ev["status"], ev["evaluated"], ev["failed"]) == ("ok", 1, 0)
    assert ev["judge_replies"] == {"llm_json": 0, "llm_float_text": 0, "llm_parse_failed": 1}
    g = ev["summary"]["global"]
    assert (g["TP"], g["FP"], g["FN"]) == (0.0, 1, 1)  # a core score of 0: below the threshold, no answer


async def test_a_judge_failure_fails_the_case(dataset_root: Path, tmp_path: Path) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="busy")

    judge = JudgeOptions(base_url="http://judge", model="m", transport=httpx.MockTransport(answer))
    async with scripted_server(Script(**{**MID_STREAM, "reply_after_appends": 6})) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root, judge=judge), progress=None)
    ev = batch["evaluation"]
    assert (ev["status"], ev["evaluated"], ev["failed"]) == ("failed", 0, 1)
    assert ev["items"][0]["status"] == "failed" and "503" in ev["items"][0]["error"]


async def test_the_official_prompt_set_without_a_checkout_is_refused_before_replaying(
    dataset_root: Path, tmp_path: Path
) -> None:
    judge = JudgeOptions(base_url="http://judge", model="m", prompt_set="official")
    with pytest.raises(RunnerError, match="checkout of the benchmark's repository"):
        await run_omniinteract(_opts("ws://unused", tmp_path, dataset_root, judge=judge), progress=None)
    assert not (tmp_path / "batch_summary.json").exists()


def test_the_cli_refuses_the_official_prompts_without_a_checkout(
    dataset_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["omniinteract", "--dataset-path", str(dataset_root), "--judge-url", "http://j",
                   "--judge-model", "m", "--judge-prompts", "official", "--output-dir", str(tmp_path),
                   "--quiet"])
    assert status == 2 and "--benchmark-repo" in capsys.readouterr().err
    assert not (tmp_path / "batch_summary.json").exists()


async def test_aligned_words_are_written_and_the_judge_scores_them(
    dataset_root: Path, tmp_path: Path
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"message": {"content": '{"score": 1}'}}]})

    judge = JudgeOptions(base_url="http://judge", model="m", transport=httpx.MockTransport(answer))
    async with scripted_server(Script(**{**MID_STREAM, "reply_after_appends": 6})) as srv:
        batch = await run_omniinteract(_opts(srv.url, tmp_path, dataset_root, judge=judge, align_words=True),
                                       progress=None)
    assert batch["aligned_cases"] == 1
    case_dir = Path(batch["results"][0]["output_dir"])
    aligned = json.loads((case_dir / "wav_transcript_aligned.json").read_text())
    (chunk,) = aligned["chunks"]
    assert chunk["text"] == "four" and [w["text"] for w in chunk["aligned_words"]] == ["four"]
    ev = batch["evaluation"]
    assert ev["items"][0]["inputs_fingerprint"]["transcript"] == "wav_transcript_aligned.json"
    assert ev["timing_precision"] == "word-level" and ev["evaluated"] == 1
