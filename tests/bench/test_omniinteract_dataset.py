"""OmniInteract dataset discovery, annotation schemas, time formats, validation and sampling."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from bench.omniinteract.dataset import (
    DatasetError,
    case_dir_name,
    discover,
    official_output_name,
    parse_annotation,
    parse_time,
    resolve_dataset_root,
)
from bench.omniinteract.media import MediaError, load_media
from bench.omniinteract.sampling import SamplingError, read_video_list, sample_cases, sampled_cases_rows


@pytest.mark.parametrize(("text", "seconds"), [
    (3, 3.0), (2.5, 2.5), ("4.25", 4.25), ("01:05", 65.0), ("00:01.5", 1.5), ("01:02:03", 3723.0),
    ("00:00:00.5", 0.5),
])
def test_parse_time_accepts_seconds_and_clock_formats(text: object, seconds: float) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "", "-1", None, True, "1:2:3:4", float("nan")])
def test_parse_time_refuses_anything_else(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_time(bad)


def test_official_output_name_and_case_dir() -> None:
    assert official_output_name("1q1a", "videos/clip_a.mp4") == "1q1a/videos__clip_a"
    assert official_output_name("1qna", "videos_bench/nested/guide.mp4") == "1qna/nested__guide"
    name = case_dir_name("1q1a", "videos/clip_a.mp4")
    assert name.startswith("videos__clip_a--") and len(name) == len("videos__clip_a--") + 8


def test_discover_reads_every_subset_schema_and_tag(dataset_root: Path) -> None:
    cases = {c.output_name: c for c in discover(dataset_root)}
    assert sorted(cases) == ["1q1a/videos__clip_a", "1q1a/videos__clip_nested", "1q1a_math/videos__lesson",
                             "1qna/cook__soup", "1qna/nested__guide"]
    clip = cases["1q1a/videos__clip_a"]
    assert [(r.question_time, r.answer_time, r.question_type, r.interrupted) for r in clip.rows] == [
        (0.2, 1.0, "realtime", False), (1.5, 2.5, "proactive", True)]
    assert clip.tags == {"realtime", "proactive", "interrupted"}
    assert cases["1q1a/videos__clip_nested"].scene_type == "nested"
    assert "nested" in cases["1q1a/videos__clip_nested"].tags
    assert cases["1q1a_math/videos__lesson"].scene_type == "multi_turn"  # omitted scene_type
    soup = cases["1qna/cook__soup"]
    assert soup.inferred_knowledge == "The user is making soup."
    assert [(r.question_time, r.answer_time, r.answer_text) for r in soup.rows] == [
        (0.0, 1.0, "boil the water"), (0.0, 2.0, "add the vegetables")]
    assert cases["1qna/nested__guide"].tags == {"1qna", "proactive", "interrupted"}


def test_discover_accepts_the_data_folder_itself_and_a_tarball(dataset_root: Path, tmp_path: Path) -> None:
    assert resolve_dataset_root(dataset_root) == dataset_root / "data"
    assert resolve_dataset_root(dataset_root / "data") == dataset_root / "data"
    archive = tmp_path / "data.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(dataset_root / "data", arcname="data")
    root = resolve_dataset_root(archive)
    assert root.name == "data" and ".data.duplex_extracted" in str(root)
    assert len(discover(archive, ["1q1a"])) == 2
    assert resolve_dataset_root(archive) == root  # published once, reused


def test_an_unsafe_tarball_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.txt"
    evil.write_text("x")
    archive = tmp_path / "bad.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(evil, arcname="../escape.txt")
    with pytest.raises(DatasetError, match="unsafe member"):
        resolve_dataset_root(archive)


def test_validation_errors_name_the_problem(dataset_root: Path, tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unknown subset"):
        discover(dataset_root, ["2q2a"])
    with pytest.raises(DatasetError, match="twice"):
        discover(dataset_root, ["1q1a", "1q1a"])
    with pytest.raises(DatasetError, match="hub dataset id"):
        resolve_dataset_root("lucky-lance/OmniInteract")
    with pytest.raises(DatasetError, match="question_type"):
        parse_annotation([{"question_time": 1, "answer_time": 2, "question_type": "often"}], subset="1q1a")
    with pytest.raises(DatasetError, match="answer_time"):
        parse_annotation([{"question_time": 1}], subset="1q1a")
    broken = tmp_path / "broken"
    (broken / "1q1a").mkdir(parents=True)
    (broken / "1q1a" / "video_json_map.json").write_text(json.dumps(
        {"entries": [{"video": "../outside.mp4", "annotation": "a.json"}]}))
    with pytest.raises(DatasetError, match="relative and inside"):
        discover(broken, ["1q1a"])


def test_cover_sampling_picks_one_case_per_tag_then_fills(dataset_root: Path) -> None:
    cases = discover(dataset_root)
    picked, warnings = sample_cases(cases, 3, tags=["nested", "1qna"], seed=1)
    assert len(picked) == 3 and warnings == []
    assert any("nested" in c.tags for c in picked) and any("1qna" in c.tags for c in picked)
    again, _ = sample_cases(cases, 3, tags=["nested", "1qna"], seed=1)
    assert again == picked  # the seed fixes the draw


def test_focus_sampling_only_takes_matching_cases(dataset_root: Path) -> None:
    picked, _ = sample_cases(discover(dataset_root), 0, tags=["interrupted"], focus=True)
    assert {c.output_name for c in picked} == {"1q1a/videos__clip_a", "1qna/nested__guide"}


def test_sampling_budget_rules(dataset_root: Path) -> None:
    cases = discover(dataset_root)
    assert len(sample_cases(cases, 0)[0]) == 5
    picked, warnings = sample_cases(cases, 50)
    assert len(picked) == 5 and "taking all" in warnings[0]
    assert sample_cases(cases, 5, shuffle=False)[0] == cases
    with pytest.raises(SamplingError, match="no case carries"):
        sample_cases([c for c in cases if "nested" not in c.tags], 2, tags=["nested"])
    with pytest.raises(SamplingError, match="needs scenario tags"):
        sample_cases(cases, 2, focus=True)


def test_a_video_list_replays_the_same_cases_in_order(dataset_root: Path, tmp_path: Path) -> None:
    cases = discover(dataset_root)
    chosen = [cases[3], cases[0]]
    listing = tmp_path / "sampled_cases.jsonl"
    listing.write_text("".join(json.dumps(r) + "\n" for r in sampled_cases_rows(chosen)))
    assert read_video_list(listing, cases) == chosen
    assert read_video_list(listing, cases, num=1) == chosen[:1]
    rows = sampled_cases_rows(chosen)
    listing.write_text(json.dumps({**rows[0], "output_name": "1q1a/wrong"}) + "\n")
    with pytest.raises(SamplingError, match="should be"):
        read_video_list(listing, cases)
    listing.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[0]) + "\n")
    with pytest.raises(SamplingError, match="twice"):
        read_video_list(listing, cases)


def test_media_decodes_whole_seconds_of_16k_audio_and_mid_second_frames(dataset_root: Path) -> None:
    case = discover(dataset_root, ["1q1a_math"])[0]
    media = load_media(case.video_path)
    assert media.horizon_s == 2
    assert len(media.pcm16) == 2 * 16000 * 2
    assert [t for t, _ in media.frames] == [0.5, 1.5]
    assert all(jpeg[:2] == b"\xff\xd8" for _, jpeg in media.frames)
    with pytest.raises(MediaError, match="duration"):
        load_media(case.video_path, max_duration_s=1.0)


def test_a_synthetic_video_can_speak_its_question(tmp_path: Path) -> None:
    from tests.bench.synthetic import make_video

    video = make_video(tmp_path / "q.mp4", 2, speech=[(0.8, "What colour is it?")])
    pcm = np.frombuffer(load_media(video).pcm16, np.int16).astype(np.float32)
    before, during = pcm[: int(0.7 * 16000)], pcm[int(0.8 * 16000) : int(1.6 * 16000)]
    assert np.abs(before).max() < 50 < np.abs(during).max()
