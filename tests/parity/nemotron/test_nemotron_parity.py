"""Nemotron VoiceChat against NVIDIA's reference: the same tiny checkpoint, the same session, every frame.

The reference is NeMo 3.0.0's ``NemotronVoiceChat`` (``nemo-toolkit[speechlm2]``), driven frame
by frame as NVIDIA's real-time pipeline drives it (``tools/parity/nemotron_reference.py`` says
exactly how, and where vLLM-Omni's code stands in for what NeMo 3.0.0 lacks: the function
channel and the prompt's tool format). It is too heavy for CI (a 4.7 GB environment), so
``tools/parity/nemotron_goldens.py`` ran it on the checkpoint ``duplex tiny-checkpoint`` writes
(``scenario.json``: its seed, greedy talker settings) and stored what it computed in
``goldens.npz``; ``goldens.json`` holds the checkpoint's and the audio's SHA-256, so a changed
writer or audio generator fails here with the command that regenerates them.

The session: a system prompt with instructions and two tools, 96 frames (7.7 s) of speech-like
audio, two tool results forced into the function channel, a voice that is not the default; the
slot under test is row 1 of a batch whose row 0 hears other audio. Compared per frame: the
prompt's token ids (and three more prompts), the perception's embedding, the text and function
logits and tokens, the talker's codes (also for a scripted text with two turns), the PCM.

Tolerances. The reference ran twice, in float32 (as NeMo runs on a CPU) and in float64 (the same
code in double precision; its mel stays float32, NeMo casts it), and ``goldens.json`` keeps, per
quantity, ``dev``: how far its float32 run is from its float64 run, i.e. the float32 rounding of
that computation. The plugin computes the same function in float32 in another order (other
kernels, a batch of two, streaming), so it is off the float64 goldens by the same order; it is
allowed ``SAFETY * dev``. Tokens and codes are choices (argmax, argmin) over such values: the
float64 reference's margin between its best and second-best candidate is asserted to exceed
twice that allowance on every choice made (the scenario is not a near-tie anywhere), so they
must be equal. The PCM is compared for the first ``pcm_frames`` frames (the codec's context is
a few frames; the codes of every frame are compared).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from duplex.plugins.base import SlotInput, SlotOptions, ToolResult, ToolSpec
from duplex.plugins.nemotron.plugin import NemotronVoiceChatPlugin
from duplex.plugins.nemotron.talker import TalkerState, talker_step
from duplex.plugins.nemotron.testing import folder_digest, make_tiny_checkpoint, speech_like

HERE = Path(__file__).resolve().parent
SCENARIO = json.loads((HERE / "scenario.json").read_text())
META = json.loads((HERE / "goldens.json").read_text())
with np.load(HERE / "goldens.npz") as _data:
    GOLD = {key: _data[key] for key in _data.files}
SAFETY = 8.0  # see the module docstring
ROW = 1
REGENERATE = (
    "regenerate the goldens with tools/parity/nemotron_goldens.py (its docstring has the commands, "
    "with the parity environment's)"
)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """One intra-op thread: the tiny model runs faster so on a shared 2-core machine (restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("nvc-parity"),
        seed=int(SCENARIO["checkpoint_seed"]),
        talker=SCENARIO["greedy_talker"],
    )


def _tools(tools: list[dict]) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(name=t["name"], description=t.get("description", ""), parameters=json.dumps(t["parameters"]))
        for t in tools
    )


def _options(case: dict, **extra: object) -> SlotOptions:
    return SlotOptions(instructions=case["instructions"], tools=_tools(case["tools"]), **extra)


class _Run:
    """What the plugin computed for the slot under test, frame by frame."""

    def __init__(self) -> None:
        self.perception: list[np.ndarray] = []
        self.text_logits: list[np.ndarray] = []
        self.function_logits: list[np.ndarray] = []
        self.text: list[int] = []
        self.function: list[int] = []
        self.codes: list[np.ndarray] = []
        self.pcm: list[np.ndarray] = []
        self.prompt_ids: list[int] = []
        self.prompt_cases: list[list[int]] = []
        self.script_codes: np.ndarray | None = None


@pytest.fixture(scope="module")
def run(checkpoint: Path) -> _Run:
    frames = int(SCENARIO["frames"])
    audio = speech_like(frames, seed=int(SCENARIO["audio_seed"]))
    other = speech_like(frames, seed=int(SCENARIO["audio_seed"]) + 1)
    results = {item["frame"]: item["output"] for item in SCENARIO["tool_results"]}
    out = _Run()
    with NemotronVoiceChatPlugin.from_options(str(checkpoint), max_sessions=2) as plugin:
        model = plugin.generator.model
        step = model.perception.step

        def perception_step(*args, **kwargs):
            y = step(*args, **kwargs)
            out.perception.append(y[ROW].double().numpy())
            return y

        model.perception.step = perception_step
        hooks = [
            model.thinker.lm_head.register_forward_hook(
                lambda _m, _a, y: out.text_logits.append(y[ROW].double().numpy())
            ),
            model.thinker.function_head.register_forward_hook(
                lambda _m, _a, y: out.function_logits.append(y[ROW].double().numpy())
            ),
        ]
        options = _options(SCENARIO, voice=SCENARIO["voice"], seed=0)
        out.prompt_ids = plugin.prompt_for(options)
        out.prompt_cases = [plugin.prompt_for(_options(case)) for case in SCENARIO["prompt_cases"]]
        plugin.open_slot(0, SlotOptions(instructions="hello there", seed=1))
        plugin.open_slot(ROW, options)
        for k in range(frames):
            window = slice(k * 1280, (k + 1) * 1280)
            tool = (ToolResult(call_id="call_0", output=results[k]),) if k in results else ()
            plugin.step(
                [
                    SlotInput(slot=0, epoch=0, pcm=other[window]),
                    SlotInput(slot=ROW, epoch=0, pcm=audio[window], tool_results=tool),
                ]
            )
            last = plugin.last_step
            out.text.append(int(last.text[ROW]))
            out.function.append(int(last.function[ROW]))
            out.codes.append(last.codes[ROW].copy())
            out.pcm.append(last.pcm[ROW].astype(np.float64))
        for hook in hooks:
            hook.remove()
        model.perception.step = step

        # The talker alone on a scripted text (two turns: BOS, words, EOS), after the same voice.
        talker, tokens = model.talker, model.talker.tokens
        guidance = plugin.generator.talker.guidance
        state = TalkerState(talker, 1, 2048, guidance)
        state.start(talker, 0, talker.prefill_voice(SCENARIO["voice"], tokens.eos, tokens.pad, guidance))
        script = []
        with torch.no_grad():
            for k, token in enumerate(GOLD["script_text"].tolist()):
                codes = talker_step(
                    talker,
                    state,
                    1,
                    torch.tensor([token]),
                    torch.ones(1, dtype=torch.bool),
                    torch.zeros(1, dtype=torch.long),
                    torch.tensor([k]),
                    tokens.eos,
                )
                script.append(codes[0].numpy())
        out.script_codes = np.stack(script)
    return out


def _allowed(key: str) -> float:
    return SAFETY * META["dev"][key]


def _assert_close(name: str, ours: np.ndarray, gold: np.ndarray, key: str) -> None:
    diff = np.abs(ours - gold.astype(np.float64)).reshape(len(ours), -1).max(-1)
    bad = np.flatnonzero(diff > _allowed(key))
    assert not len(bad), (
        f"{name}: frames {bad.tolist()[:10]} differ from the reference by up to {diff.max():.3g} "
        f"(allowed {_allowed(key):.3g} = {SAFETY} x its float32 rounding {META['dev'][key]:.3g})"
    )


def _assert_well_separated(key: str) -> None:
    margin, allowed = META["margin"][key], _allowed(key)
    assert margin > 2 * allowed, (
        f"the reference's closest {key} choice is {margin:.3g} apart, within twice the rounding allowed "
        f"({allowed:.3g}): a near-tie; choose another scenario and {REGENERATE}"
    )


def test_the_checkpoint_and_the_audio_are_those_the_goldens_were_computed_from(checkpoint):
    assert folder_digest(checkpoint) == META["checkpoint_sha256"], (
        f"the tiny checkpoint's bytes changed (its writer, seed or talker settings): {REGENERATE}"
    )
    audio = speech_like(int(SCENARIO["frames"]), seed=int(SCENARIO["audio_seed"]))
    digest = hashlib.sha256(audio.tobytes()).hexdigest()
    assert digest == META["audio_sha256"], f"speech_like() changed: {REGENERATE}"


def test_the_prompt_token_ids_are_the_references(run):
    assert run.prompt_ids == GOLD["prompt_ids"].tolist()
    for i, ids in enumerate(run.prompt_cases):
        assert ids == GOLD[f"prompt_case_{i}"].tolist(), SCENARIO["prompt_cases"][i]


def test_the_first_frame_hears_a_stream_that_starts_after_zeros(run):
    """NeMo's mel pads the stream's start with zeros (not a reflection of its first samples)."""
    _assert_close("perception, frame 0", np.stack(run.perception[:1]), GOLD["perception"][:1], "perception")


def test_the_second_frame_is_encoded_as_the_references_streaming_encoder_does(run):
    """The cache-aware encoder's second frame reads eight zero mel columns before the first."""
    _assert_close("perception, frame 1", np.stack(run.perception[1:2]), GOLD["perception"][1:2], "perception")


def test_the_perception_of_every_frame_is_the_references(run):
    _assert_close("perception", np.stack(run.perception), GOLD["perception"], "perception")


def test_the_text_and_function_logits_are_the_references(run):
    _assert_close("text logits", np.stack(run.text_logits), GOLD["text_logits"], "text_logits")
    function = np.stack(run.function_logits)
    _assert_close("function logits", function, GOLD["function_logits"], "function_logits")


def test_the_text_and_function_tokens_are_the_references(run):
    _assert_well_separated("text_logits")
    _assert_well_separated("function_logits")
    assert run.text == GOLD["text"].tolist()
    assert run.function == GOLD["function"].tolist()


def test_the_speech_codes_are_the_references(run):
    _assert_well_separated("mog_logits")
    _assert_well_separated("rvq_scores")
    ours = np.stack(run.codes)
    differ = np.flatnonzero((ours != GOLD["codes"]).any(-1))
    assert not len(differ), f"codes differ from frame {differ[0]} on (frames {differ.tolist()})"


def test_the_talker_starts_and_ends_turns_like_the_reference(run):
    """A scripted text with two turns: BOS, words, EOS (the silence frame fed back), PAD between."""
    differ = np.flatnonzero((run.script_codes != GOLD["script_codes"]).any(-1))
    assert not len(differ), f"scripted codes differ from frame {differ[0]} on (frames {differ.tolist()})"


def test_the_pcm_is_the_references(run):
    frames = int(SCENARIO["pcm_frames"])
    gold = GOLD["pcm"].reshape(frames, -1)
    _assert_close("pcm", np.stack(run.pcm[:frames]), gold, "pcm")
