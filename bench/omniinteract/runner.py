"""The OmniInteract run: pick cases, replay each into a session, publish artifacts, optionally judge.

``run_omniinteract(options)``:

1. takes the output folder's lock (``.omniinteract.lock``: two runs never share a root at once);
2. discovers the dataset and samples it (``bench.omniinteract.sampling``), or replays a
   ``sampled_cases.jsonl``;
3. for each case (``max_concurrency`` at a time): decodes the video off the event loop, before
   timing starts; replays it (``bench.omniinteract.replay``); builds and publishes the case
   artifacts after timing ended;
4. writes the batch files; with ``align_words``, adds word timestamps to the eligible cases'
   transcripts (``bench.omniinteract.align``, our ASR on ``output.wav``); with a judge
   configured, scores the eligible cases (``bench.omniinteract.judge``) into ``evaluation/``.

A failed case is a row with ``success: false`` (the run goes on); the summary's ``failed`` counts
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from bench.omniinteract.align import align_run
from bench.omniinteract.artifacts import build_case, case_output_dir, publish_case, write_batch
from bench.omniinteract.dataset import SUBSETS, Case, discover
from bench.omniinteract.judge import JudgeOptions, evaluate_run
from bench.omniinteract.media import Media, MediaError, load_media
from bench.omniinteract.prompts import PromptError
from bench.omniinteract.replay import ReplayOptions, replay_case
from bench.omniinteract.sampling import SamplingError, read_video_list, sample_cases

__all__ = ["RunOptions", "RunnerError", "run_omniinteract", "select_cases"]


class RunnerError(RuntimeError):
    """The run cannot start (bad options, busy output folder)."""


@dataclass(frozen=True)
class RunOptions:
    dataset_path: str
    replay: ReplayOptions
    subsets: tuple[str, ...] = SUBSETS
    num: int = 3
    tags: tuple[str, ...] = ()
    focus: bool = False
    seed: int = 0
    shuffle: bool = True
    video_list: str | None = None
    output_dir: str = "omniinteract-output"
    max_concurrency: int = 1
    max_video_duration_s: float = 3600.0
    judge: JudgeOptions | None = None
    align_words: bool = False


def select_cases(opts: RunOptions) -> tuple[list[Case], list[str]]:
    """The cases to replay, in order, and sampling warnings."""
    cases = discover(opts.dataset_path, opts.subsets)
    if opts.video_list is not None:
        if opts.tags or opts.focus:
            raise RunnerError("a video list cannot be combined with scenario tags or focus")
        return read_video_list(opts.video_list, cases, opts.num), []
    return sample_cases(cases, opts.num, tags=opts.tags, focus=opts.focus, seed=opts.seed,
                        shuffle=opts.shuffle)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".omniinteract.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunnerError(f"{root} is used by another run") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


async def _one(case: Case, opts: RunOptions, root: Path) -> dict[str, Any]:
    out_dir = case_output_dir(root, case)
    media: Media | None = None
    try:
        media = await asyncio.to_thread(load_media, case.video_path,
                                        max_duration_s=opts.max_video_duration_s)
    except MediaError as exc:
        result, files = build_case(case, None, None, out_dir, error=str(exc))
        return publish_case(case, out_dir, result, files)
    run = await replay_case(media, opts.replay)
    result, files = build_case(case, media, run, out_dir)
    return publish_case(case, out_dir, result, files)


async def run_omniinteract(opts: RunOptions, *, progress: TextIO | None = sys.stderr) -> dict[str, Any]:
    """Run (module docstring); returns the batch summary (with ``evaluation`` when judged)."""
    if opts.max_concurrency < 1:
        raise RunnerError("max_concurrency must be >= 1")
    if opts.judge is not None:
        try:
            opts.judge.prompts()  # refuse a prompt set that cannot load before replaying anything
        except PromptError as exc:
            raise RunnerError(str(exc)) from None
    try:
        cases, warnings = select_cases(opts)
    except SamplingError as exc:
        raise RunnerError(str(exc)) from None
    root = Path(opts.output_dir)
    with _locked(root):
        for w in warnings:
            _say(progress, f"warning: {w}")
        gate = asyncio.Semaphore(opts.max_concurrency)
        done = 0

        async def guarded(case: Case) -> dict[str, Any]:
            nonlocal done
            async with gate:
                _say(progress, f"omniinteract: replaying {case.output_name}")
                result = await _one(case, opts, root)
            done += 1
            state = "ok" if result["success"] else f"failed ({result['error']})"
            _say(progress, f"omniinteract [{done}/{len(cases)}] {case.output_name}: {state}")
            return result

        results = await asyncio.gather(*(guarded(c) for c in cases))
        extra = {"warnings": warnings, "options": _public_options(opts)}
        batch = write_batch(root, cases, results, extra)
        if opts.align_words:
            batch["aligned_cases"] = await asyncio.to_thread(align_run, root, progress=progress)
        if opts.judge is not None:
            batch["evaluation"] = await evaluate_run(root, cases, results, opts.judge, progress=progress)
    return batch


def _public_options(opts: RunOptions) -> dict[str, Any]:
    r = opts.replay
    return {
        "subsets": list(opts.subsets), "num": opts.num, "tags": list(opts.tags), "focus": opts.focus,
        "seed": opts.seed, "shuffle": opts.shuffle, "video_list": opts.video_list,
        "max_concurrency": opts.max_concurrency, "align_words": opts.align_words,
        "chunk_ms": r.chunk_ms, "turn_detection": r.turn_detection,
        "frame_transport": r.frame_transport, "settle_s": r.settle_s, "timeout_s": r.timeout_s,
    }


def _say(stream: TextIO | None, line: str) -> None:
    if stream is not None:
        print(line, file=stream, flush=True)
