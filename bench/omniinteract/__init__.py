"""The OmniInteract benchmark: replay the public dataset's videos into duplex sessions, in real time.

Modules, in the order a run uses them:

* ``dataset``: layout discovery, annotation parsing (every schema and time format), validation,
  ``official_output_name``;
* ``sampling``: seeded sampling with scenario tags (cover or focus), replay lists;
* ``media``: PyAV decoding into 16 kHz PCM16 and 1 fps JPEGs;
* ``replay``: one case into one session (pacing, frame transport by capabilities, completion);
* ``playback``: the serialized playback clock and its ``playback.ack`` rules;
* ``timing``: per-response and per-session timing metrics;
* ``artifacts``: the per-case and per-run files, written atomically after timing;
* ``align``: word timestamps for a run's transcripts (our Whisper on ``output.wav``);
* ``slots``: the benchmark's slots, transcript chunks, matching and word-level early/core split;
* ``verdicts``: the judge's verdicts, read from its replies as leniently as the benchmark does;
* ``scoring``: IA-QTF1, interruption and nested diagnostics, the paper's slices (pure math);
* ``prompts``: the judge's prompt sets (the benchmark's, read from a checkout, or ours);
* ``evaluate``: one case from annotation and transcript to judge questions and scores (pure);
* ``judge``: the opt-in external judge (OpenAI-compatible) and the evaluation files;
* ``runner``: the whole run (``run_omniinteract``).
"""

from bench.omniinteract.dataset import SCENARIO_TAGS, SUBSETS, Case, DatasetError, discover
from bench.omniinteract.judge import JudgeOptions
from bench.omniinteract.replay import ReplayOptions
from bench.omniinteract.runner import RunnerError, RunOptions, run_omniinteract
from bench.omniinteract.sampling import SamplingError, sample_cases

__all__ = [
    "SCENARIO_TAGS",
    "SUBSETS",
    "Case",
    "DatasetError",
    "JudgeOptions",
    "ReplayOptions",
    "RunOptions",
    "RunnerError",
    "SamplingError",
    "discover",
    "run_omniinteract",
    "sample_cases",
]
