"""PersonaPlex against its vendor's rules on stock moshi: the same checkpoint, the same sessions.

The reference (``personaplex_upstream``) runs NVIDIA/personaplex's session rules (commit
3428dfd95309a7f3c84fd93259ded0f810d1ff91: the persona's ``<system>`` tags, the voice file's
replay and its ``V + 1`` offset, the silences, the conversation's calls) on moshi 0.2.13's own
loaders, stock ``LMGen(use_sampling=False)`` and Mimi, one session at a time, as the vendor's
server does. The plugin runs the same five sessions from the same tiny checkpoint (random weights,
a Mimi that hears and speaks), batched in four slots: three open together, one opens while they
talk (its prompt prefilled in chunks between their ticks), one reuses a closed slot; greedy
decoding. Every frame is compared: the prompt's token ids and embeddings, the columns the
transformer reads (with the user's Mimi codes), the text and agent logits, the text token, the
agent's codes and the PCM.

Alignment. The vendor's call ``i + 1`` returns the frame that hears the user's frame ``i``; its
call 0 returns the prompt's last frame (silence, every token given). The plugin answers frame ``i``
at its step ``i`` (80 ms sooner) and does not send that silence frame; its Mimi decoder has
decoded it, as the vendor's has (``test_the_first_frame_the_vendor_returns_is_the_prompts_last``).

Tolerances. Both sides compute the same float32 functions in other groupings (the plugin
prefills a prompt 8 positions a pass and steps 4 rows at once, the reference one position of one
row at a time), so they agree to rounding. To first order a float32 sum of ``n`` terms is off by
at most ``n`` units of roundoff (2**-24) of the magnitudes summed: ``_logit_bounds`` counts the
terms along the chain of sums from the input embeddings to a logit (each projection's inner width,
the attended positions, the norms, layer after layer), and the tolerance is that many units of
the logits' peak. PCM and the encoder's latents likewise (``testing.rounding_bound`` over Mimi's
decoder and encoder). Tokens and Mimi codes are argmaxes and argmins: where the two sides' values
differ by at most ``d``, a choice whose margin over the runner-up exceeds ``2 d`` cannot differ,
so a different choice fails the test unless the reference's margin is within ``2 d``; such a near
tie may go either way, the conversations part after it, and the session is compared up to it
(``d``: the logits' actual difference; for codes, the encoder's bound). None was met where this
was written: every session compared whole, logits within 2.7e-6, PCM within 8.7e-7 (the table
that ``pytest -s`` prints).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pytest
import sentencepiece
import torch

from duplex.plugins.base import SlotInput, SlotOptions
from duplex.plugins.personaplex.config import FRAME_SAMPLES, tiny_config
from duplex.plugins.personaplex.generation import frames_to_columns
from duplex.plugins.personaplex.loading import TOKENIZER_FILE
from duplex.plugins.personaplex.plugin import PersonaPlexPlugin
from duplex.plugins.personaplex.testing import (
    LogitWatch,
    make_tiny_checkpoint,
    rounding_bound,
    same_choice,
    speech_like,
)
from tests.parity.personaplex_upstream import Frame, Upstream, system_prompt, wrap_with_system_tags

SLOTS = 4
FRAMES = 24
CHUNK = 8  # prompt positions per prefill pass: a prompt takes several
#: A voice shaped as the vendor writes them: a token ring of 4 columns, V = 6 (the tiny
#: checkpoint's own voices have a ring of 3 and V = 4).
RING4_VOICE = "RING4"


@dataclass(frozen=True)
class Session:
    """A session of the run: its options, slot, the tick it opens at and its audio's seed."""

    options: SlotOptions
    slot: int
    opens: int
    audio_seed: int


def _session(instructions: str, voice: str, slot: int, opens: int, audio_seed: int) -> Session:
    return Session(SlotOptions(instructions=instructions, voice=voice), slot, opens, audio_seed)


SESSIONS = {
    "helpful": _session("you are a helpful assistant", "NATF2", slot=0, opens=0, audio_seed=1),
    "cooking": _session("  talk about cooking with friends ", "VARM0", slot=2, opens=0, audio_seed=2),
    "tagged": _session("<system> be brief <system>", "VARM0", slot=1, opens=0, audio_seed=3),
    "late": _session("book a table for two tonight", RING4_VOICE, slot=3, opens=5, audio_seed=4),
    "reused": _session("thank you for calling", RING4_VOICE, slot=0, opens=FRAMES + 3, audio_seed=5),
}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> Path:
    """The tiny checkpoint, plus a voice laid out exactly as the vendor's are."""
    root = make_tiny_checkpoint(tmp_path_factory.mktemp("pp-parity"), seed=7)
    cfg = tiny_config()
    gen = torch.Generator().manual_seed(70)
    ring = torch.randint(0, int(cfg.lm["card"]), (1, cfg.num_streams, 4), generator=gen)
    ring[0, 0] = cfg.text_pad
    voice = {"embeddings": torch.randn(6, 1, 1, int(cfg.lm["dim"]), generator=gen) * 0.1, "cache": ring}
    torch.save(voice, str(root / "voices" / f"{RING4_VOICE}.pt"))
    return root


def _audio(session: Session) -> list[np.ndarray]:
    return list(speech_like(FRAMES, seed=session.audio_seed).reshape(FRAMES, FRAME_SAMPLES))


def _persona_ids(root: Path, instructions: str) -> list[int]:
    sp = sentencepiece.SentencePieceProcessor(model_file=str(root / TOKENIZER_FILE))
    return list(sp.encode(wrap_with_system_tags(instructions)))


@pytest.fixture(scope="module")
def reference(ckpt: Path) -> dict[str, list[Frame]]:
    """Every session through the vendor's rules, alone."""
    cfg = tiny_config()
    upstream = Upstream(ckpt, cfg)
    out = {}
    for name, session in SESSIONS.items():
        voice = torch.load(str(ckpt / "voices" / f"{session.options.voice}.pt"), weights_only=True)
        prompt = system_prompt(cfg, voice, _persona_ids(ckpt, session.options.instructions))
        out[name] = upstream.run(prompt, _audio(session))
    return out


@dataclass
class Step:
    """What the plugin did for one session in one step (the frame that heard its audio frame)."""

    column: list[int]
    text: int
    agent: list[int]
    text_logits: np.ndarray
    agent_logits: np.ndarray
    pcm: np.ndarray


@dataclass
class PluginRun:
    steps: dict[str, list[Step]]
    prompts: dict[str, tuple[torch.Tensor, torch.Tensor | None]]  # columns [P, 17], embeddings
    waited: dict[str, int]  # frames a session sent before its prompt was ready (not heard)


@pytest.fixture(scope="module")
def plugin_run(ckpt: Path) -> PluginRun:
    """The five sessions through the plugin, batched (see the module docstring)."""
    cfg = tiny_config()
    A = cfg.num_audio_codebooks
    steps: dict[str, list[Step]] = {name: [] for name in SESSIONS}
    prompts = {}
    waited = dict.fromkeys(SESSIONS, 0)
    audio = {name: _audio(s) for name, s in SESSIONS.items()}
    with PersonaPlexPlugin.from_options(str(ckpt), max_sessions=SLOTS, prefill_chunk_frames=CHUNK) as plugin:
        gen = plugin.generator
        watch = LogitWatch(gen.lm, A)  # dies with the plugin
        delays = torch.tensor(cfg.delays)
        initial = gen._initial.cpu()
        for name, s in SESSIONS.items():
            script = plugin.prompt_for(s.options)
            prompts[name] = (frames_to_columns(script.tokens, delays, initial), script.embeddings)
        open_now: dict[int, str] = {}
        last = max(s.opens for s in SESSIONS.values()) + FRAMES + 8
        for tick in range(last):
            for name, s in SESSIONS.items():
                if tick == s.opens:
                    assert s.slot not in open_now
                    plugin.open_slot(s.slot, msgspec.structs.replace(s.options, temperature=0.0))
                    open_now[s.slot] = name
            batch, heard = [], []
            for slot, name in sorted(open_now.items()):
                ready = bool(gen.ready[slot])
                pos = len(steps[name])
                pcm = audio[name][pos] if ready else np.zeros(FRAME_SAMPLES, np.float32)  # not heard
                batch.append(SlotInput(slot=slot, epoch=0, pcm=pcm))
                if ready:
                    heard.append((slot, name))
                else:
                    waited[name] += 1
            if not batch:
                continue
            watch.arm()
            outputs = {o.slot: o for o in plugin.step(batch)}
            if not heard:
                continue
            seen = watch.take()
            assert seen.text.shape[0] == SLOTS  # every step runs all rows (no buckets)
            for slot, name in heard:
                result = plugin.last_step
                assert result is not None
                steps[name].append(
                    Step(
                        column=seen.column[slot].tolist(),
                        text=int(result.text[slot]),
                        agent=[int(c) for c in result.agent[slot]],
                        text_logits=seen.text[slot],
                        agent_logits=seen.agent[slot],
                        pcm=outputs[slot].pcm.copy(),
                    )
                )
                if len(steps[name]) == FRAMES:
                    plugin.close_slot(slot)
                    del open_now[slot]
    assert all(len(v) == FRAMES for v in steps.values()), {k: len(v) for k, v in steps.items()}
    return PluginRun(steps, prompts, waited)


def _chain(transformer: torch.nn.Module, positions: int) -> int:
    """Terms summed along one path through ``transformer``: per layer, each projection's inner width
    (one step's weights where they are per step), the attended positions and two norms' widths."""
    terms = 0
    for layer in transformer.layers:
        for name, module in layer.named_modules():
            per_step = any(part.isdigit() and part != "0" for part in name.split("."))
            if isinstance(module, torch.nn.Linear) and not per_step:
                terms += module.in_features
        terms += positions + 2 * layer.self_attn.embed_dim
    return terms


def _logit_bounds(lm: torch.nn.Module) -> tuple[float, float]:
    """The first-order rounding bounds of the module docstring for the text and agent logits,
    relative to the logits' peak: unit roundoff times the terms summed on the way to them."""
    temporal = _chain(lm.transformer, int(lm.context)) + int(lm.dim)
    text = temporal + lm.text_linear.in_features
    agent = temporal + lm.depformer_in[0].in_features + _chain(lm.depformer, int(lm.dep_q))
    agent += lm.linears[0].in_features + lm.linears[0].in_features
    return text * 2.0**-24, agent * 2.0**-24


@dataclass
class Compared:
    """One session's comparison, frame by frame (see ``_compare``)."""

    frames: int = 0  # frames compared
    stopped: str = ""  # why the comparison stopped before the end (a near tie), if it did
    failures: list[str] = dataclasses.field(default_factory=list)
    text_logits: float = 0.0  # largest difference
    agent_logits: float = 0.0
    pcm: float = 0.0
    text_bound: float = 0.0  # the tolerances used
    agent_bound: float = 0.0
    pcm_bound: float = 0.0


def _decision(name: str, got: np.ndarray, want: np.ndarray, out: Compared) -> bool:
    """Whether the greedy choice on ``got`` is the reference's (``testing.same_choice``); a near
    tie stops the session's comparison (``out.stopped``), another difference fails it."""
    same = same_choice(got, want)
    if same is None:
        out.stopped = f"{name}: a near tie in the reference's logits"
    elif not same:
        out.failures.append(f"{name}: chose {int(got.argmax())}, the reference {int(want.argmax())}")
    return bool(same)


def _compare(
    got: list[Step], ref: list[Frame], upstream: Upstream, bounds: tuple[float, float, float, float]
) -> Compared:
    """Walk one session: the plugin's step ``i`` against the reference's call ``i + 1``."""
    text_bound, agent_bound, pcm_bound, code_bound = bounds
    out = Compared()
    A = 8
    for i, g in enumerate(got):
        r = ref[i + 1]
        where = f"frame {i}"
        # The Mimi codes of the user's frame i: the plugin reads codebook 0 in this column and the
        # others in the next one (the reference encoded it in call i).
        want_codes = ref[i].user_codes
        assert want_codes is not None
        got_codes = [g.column[9]] + (got[i + 1].column[10:] if i + 1 < len(got) else want_codes[1:])
        if got_codes != want_codes:
            margins = upstream.code_margins(ref[i].latent)
            level = next(k for k in range(A) if got_codes[k] != want_codes[k])
            scale = float(ref[i].latent.abs().max())
            if margins[level] <= 2 * code_bound * scale * ref[i].latent.shape[1] ** 0.5:
                out.stopped = f"{where}: Mimi code {level}, the reference's margin {margins[level]:.3g}"
            else:
                out.failures.append(f"{where}: Mimi codes {got_codes} != {want_codes}")
            return out
        if g.column != r.column:
            out.failures.append(f"{where}: column {g.column} != {r.column}")
            return out
        out.text_logits = max(out.text_logits, float(np.abs(g.text_logits - r.text_logits).max()))
        if np.abs(g.text_logits - r.text_logits).max() > text_bound * np.abs(r.text_logits).max():
            out.failures.append(f"{where}: text logits past the rounding bound")
        tie = not _decision(f"{where} text", g.text_logits, r.text_logits, out)
        for j in range(A):
            diff = float(np.abs(g.agent_logits[j] - r.agent_logits[j]).max())
            out.agent_logits = max(out.agent_logits, diff)
            if diff > agent_bound * np.abs(r.agent_logits[j]).max():
                out.failures.append(f"{where}: agent logits {j} past the rounding bound")
            if not _decision(f"{where} codebook {j}", g.agent_logits[j], r.agent_logits[j], out):
                tie = True
                break  # the later codebooks are fed this one: no longer comparable
        if out.failures or tie:
            return out
        if (g.text, g.agent) != (r.text, r.agent):
            out.failures.append(f"{where}: frame {(g.text, g.agent)} != {(r.text, r.agent)}")
            return out
        gap = float(np.abs(g.pcm - r.pcm).max())
        out.pcm = max(out.pcm, gap)
        if gap > pcm_bound * np.abs(r.pcm).max():
            out.failures.append(f"{where}: PCM differs by {gap:.3g}")
        out.frames += 1
    return out


@pytest.fixture(scope="module")
def compared(ckpt: Path, reference: dict[str, list[Frame]], plugin_run: PluginRun) -> dict[str, Compared]:
    cfg = tiny_config()
    upstream = Upstream(ckpt, cfg)
    text_bound, agent_bound = _logit_bounds(upstream.lm)
    mimi = upstream.mimi
    decoder = rounding_bound(mimi.upsample, mimi.decoder_transformer, mimi.decoder)
    encoder = rounding_bound(mimi.encoder, mimi.encoder_transformer, mimi.downsample, mimi.quantizer)
    bounds = (text_bound, agent_bound, decoder, encoder)
    out = {}
    for name in SESSIONS:
        result = _compare(plugin_run.steps[name], reference[name], upstream, bounds)
        result.text_bound, result.agent_bound, result.pcm_bound = bounds[:3]
        out[name] = result
    print("\nsession   frames  text logits  agent logits  PCM        stopped")
    for name, c in out.items():
        row = f"{name:9} {c.frames:6}  {c.text_logits:11.3g}  {c.agent_logits:12.3g}  {c.pcm:9.3g}"
        print(f"{row}  {c.stopped}")
    return out


def test_the_prompt_reads_what_the_vendors_reads(ckpt: Path, plugin_run: PluginRun) -> None:
    """Token ids and embeddings of every prompt position: the voice file's replay (its embeddings,
    then the whole ring column ``V % W`` at position ``V``, silence from ``V + 1``), the
    persona's tags and ids, the silences."""
    cfg = tiny_config()
    for name, session in SESSIONS.items():
        voice = torch.load(str(ckpt / "voices" / f"{session.options.voice}.pt"), weights_only=True)
        want = system_prompt(cfg, voice, _persona_ids(ckpt, session.options.instructions))
        columns, embeddings = plugin_run.prompts[name]
        V = int(want.embeddings.shape[0])
        assert embeddings is not None and torch.equal(embeddings, want.embeddings), name
        assert columns.shape[0] == want.length, (name, columns.shape[0], want.length)
        assert columns[V:].tolist() == want.columns.tolist(), name


def test_the_persona_is_tagged_as_the_vendor_tags_it(ckpt: Path) -> None:
    """``<system>`` tags are added unless the text already has them; the text is stripped."""
    with PersonaPlexPlugin.from_options(str(ckpt), max_sessions=1) as plugin:
        for text in ("<system> be brief <system>", "  talk about cooking with friends ", "hello"):
            script = plugin.prompt_for(SlotOptions(instructions=text, voice="NATF2"))
            ids = script.tokens[[p == "text" for p in script.phases], 0].tolist()
            assert ids == _persona_ids(ckpt, text), text
    assert wrap_with_system_tags(" <system> be brief <system> ") == "<system> be brief <system>"


def test_the_first_frame_the_vendor_returns_is_the_prompts_last(reference: dict[str, list[Frame]]) -> None:
    """The alignment of the module docstring: the vendor's call 0 returns the prompt's last frame."""
    cfg = tiny_config()
    for frames in reference.values():
        assert (frames[0].text, frames[0].agent) == (cfg.text_pad, list(cfg.silence_tokens))


def test_a_session_opened_mid_run_waits_for_its_prompt_in_chunks(plugin_run: PluginRun) -> None:
    assert plugin_run.waited["helpful"] == plugin_run.waited["tagged"] == 0
    for name in ("late", "reused"):
        prompt = plugin_run.prompts[name][0].shape[0]
        assert plugin_run.waited[name] == -(-prompt // CHUNK) > 1, name


def test_every_frame_is_the_vendors(compared: dict[str, Compared]) -> None:
    """Per session and frame: the user's Mimi codes, the column read, the text and agent logits
    (within rounding), the text token, the agent's codes and the PCM (within rounding)."""
    for name, c in compared.items():
        assert c.failures == [], (name, c.failures)
        assert c.frames == FRAMES or c.stopped, name
        assert c.frames > 0, (name, c.stopped)
