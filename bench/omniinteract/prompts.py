"""The judge's prompt sets, and the values a prompt is filled with.

A prompt set is six texts: a system prompt and a user template for each stage (early, core,
partial). Two sets exist, chosen by name (``prompt_set``):

* ``official``: the benchmark's own prompts (the English versions of the paper's judge
  prompts), read from ``eval/evaluation/llm_judge.py`` of a local checkout of the benchmark's
  repository (``load_official_prompts``). The repository carries no licence, so its text is not
  shipped here; the file is parsed, never executed. Numbers comparable with published ones need
  this set.
* ``ours``: our own wording of the same three questions, asking for the same JSON replies. It
  needs nothing else, so it is the built-in fallback, but its numbers are only
  protocol-compatible.

Whatever the set, a template is filled by ``str.format`` with the values of ``prompt_fields``,
computed as the benchmark computes them: the slot as its evaluation code numbers it (scene
``multi_turn`` / ``nested`` / ``1QnA``, ``Hard`` / ``Soft``, ``step_index`` ``None`` outside 1QnA),
the stage's text (its pieces' texts joined without a separator), the whole chunks around it
(``full_context``) and, for the core stage, the answers of the later slots of the scene.
"""

from __future__ import annotations

import ast
import hashlib
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.omniinteract.slots import OFFICIAL_SCENES, Piece, SlotPlan

__all__ = [
    "FIELDS",
    "OFFICIAL_JUDGE_FILE",
    "OUR_PROMPTS",
    "PINNED_COMMIT",
    "PINNED_JUDGE_BLOB",
    "PromptError",
    "PromptSet",
    "load_official_prompts",
    "load_prompt_set",
    "prompt_fields",
]

PINNED_COMMIT = "de304cef35fd9a50a5caadb5090c34cfbf0dd868"
"""The benchmark repository's commit our scorer was checked against (``tests/omniinteract_goldens``)."""
PINNED_JUDGE_BLOB = "1a9b7a5b55811c470203ead529cb6092f542cc64"
"""The git blob id of ``eval/evaluation/llm_judge.py`` at ``PINNED_COMMIT``."""
OFFICIAL_JUDGE_FILE = "eval/evaluation/llm_judge.py"
_OFFICIAL_NAMES = {
    "early_system": "EARLY_SYSTEM_PROMPT",
    "early_user": "EARLY_USER_TEMPLATE",
    "core_system": "CORE_SYSTEM_PROMPT",
    "core_user": "CORE_USER_TEMPLATE",
    "partial_system": "INTERRUPT_PARTIAL_SYSTEM_PROMPT",
    "partial_user": "INTERRUPT_PARTIAL_USER_TEMPLATE",
}
_SLOT_FIELDS = ("scene_type", "slot_id", "turn_index", "step_index", "boundary_type", "is_interrupted",
                "question", "gt_answer", "full_context", "actual_text")
FIELDS = {
    "early": frozenset(_SLOT_FIELDS),
    "core": frozenset((*_SLOT_FIELDS, "future_answers")),
    "partial": frozenset(("question", "gt_answer", "actual_text")),
}
"""The values each stage's user template may use."""


class PromptError(ValueError):
    """A prompt set cannot be loaded (missing file or text, a placeholder we do not fill)."""


@dataclass(frozen=True)
class PromptSet:
    name: str
    source: str
    early_system: str
    early_user: str
    core_system: str
    core_user: str
    partial_system: str
    partial_user: str

    def __post_init__(self) -> None:
        for stage, allowed in FIELDS.items():
            template = getattr(self, f"{stage}_user")
            try:
                used = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as exc:
                raise PromptError(f"{self.source}: the {stage} template does not parse: {exc}") from None
            unknown = sorted(used - allowed)
            if unknown:
                raise PromptError(f"{self.source}: the {stage} template uses {', '.join(unknown)}, "
                                  f"which the judge does not fill")

    def messages(self, stage: str, fields: dict[str, Any]) -> tuple[str, str]:
        """``(system, user)`` of one judge question."""
        return getattr(self, f"{stage}_system"), getattr(self, f"{stage}_user").format(**fields)

    @property
    def digest(self) -> str:
        """SHA-256 of the six texts (a judged case's cache depends on it)."""
        h = hashlib.sha256()
        for key in _OFFICIAL_NAMES:
            h.update(getattr(self, key).encode() + b"\0")
        return h.hexdigest()


_REPLY_EARLY = '{{"flag": "Neutral|FP_Hallucination", "score": <0..1>, "rationale": "<one sentence>"}}'
_REPLY_CORE = ('{{"score": <0..1>, "trigger_phrase": "<verbatim substring or empty>", "spoiler": '
               'true|false, "rationale": "<one sentence>"}}')
_REPLY_PARTIAL = '{{"score": <0..1>, "hallucination": true|false, "rationale": "<one sentence>"}}'
_SLOT = """Scene: {scene_type}; slot {slot_id} (turn {turn_index}, step {step_index}); \
boundary {boundary_type}; interrupted: {is_interrupted}.
The user asked: {question}
The reference answer: {gt_answer}
Everything the assistant said in the chunks involved: {full_context}"""

OUR_PROMPTS = PromptSet(
    name="ours",
    source="bench.omniinteract.prompts (our wording)",
    early_system="You grade a real-time voice assistant from text alone. Reply with JSON only.",
    early_user=_SLOT + """
What it said before the answer was due: {actual_text}

Is that early output harmless (a greeting, an acknowledgement, a short remark about what it sees,
a request to wait), or does it already answer, guess what it cannot see yet, reveal later steps or
state facts (an early hallucination)? For a harmless one rate how well it served the user, 0 to 1.
Reply with one JSON object: """ + _REPLY_EARLY,
    core_system="You grade a real-time voice assistant's answers strictly, from text alone. "
                "Reply with JSON only.",
    core_user=_SLOT + """
The answers of the later slots: {future_answers}
What it said once the answer was due: {actual_text}

Rate from 0 to 1 how correct and complete that answer is against the reference (off-topic, wrong
or missing content scores low; in a step-by-step task only the current step counts, and giving
away later steps or skipping this one is penalised). When the score is above 0, quote the
shortest earliest part of the answer, verbatim, that already gives it (trigger_phrase).
Reply with one JSON object: """ + _REPLY_CORE,
    partial_system="You grade interrupted answers of a voice assistant strictly, from text alone. "
                   "Reply with JSON only.",
    partial_user="""The user interrupted the assistant before it finished; it did not have to complete
the answer.
The user asked: {question}
The reference answer: {gt_answer}
What the assistant had said: {actual_text}

Rate from 0 to 1 how relevant, correct and useful the spoken part is for the reference answer,
without penalising it for being incomplete (an acknowledgement alone, filler, or an answer to
another question scores low). Mark hallucination true when it states wrong or unsupported facts.
How long it kept talking is measured elsewhere: ignore it.
Reply with one JSON object: """ + _REPLY_PARTIAL,
)


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def load_official_prompts(repo: str | Path) -> PromptSet:
    """The benchmark's prompts from a checkout (its root, or ``llm_judge.py`` itself).

    The file is parsed with ``ast`` and its six prompt constants read as literals; nothing in it
    runs. ``PromptError`` when the file or a constant is missing or a template uses a value we do
    not fill. The set's ``source`` names the file's git blob id and whether it is the pinned one.
    """
    path = Path(repo).expanduser()
    if path.is_dir():
        path = path / OFFICIAL_JUDGE_FILE
    try:
        data = path.read_bytes()
        tree = ast.parse(data, filename=str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise PromptError(f"cannot read the benchmark's judge prompts from {path}: {exc}") from None
    constants: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, str):
                constants[node.targets[0].id] = value
    missing = [name for name in _OFFICIAL_NAMES.values() if name not in constants]
    if missing:
        raise PromptError(f"{path}: no {', '.join(missing)}")
    blob = _git_blob_id(data)
    pinned = "the pinned version" if blob == PINNED_JUDGE_BLOB else f"not the version at {PINNED_COMMIT[:7]}"
    return PromptSet(name="official", source=f"{OFFICIAL_JUDGE_FILE} blob {blob[:12]} ({pinned})",
                     **{key: constants[name] for key, name in _OFFICIAL_NAMES.items()})


def load_prompt_set(name: str, benchmark_repo: str | Path | None = None) -> PromptSet:
    """The prompt set called ``name`` (``official`` needs ``benchmark_repo``)."""
    if name == "ours":
        return OUR_PROMPTS
    if name == "official":
        if benchmark_repo is None:
            raise PromptError("the official prompts are read from a checkout of the benchmark's repository: "
                              "give its path (--benchmark-repo), or choose the prompt set 'ours'")
        return load_official_prompts(benchmark_repo)
    raise PromptError(f"unknown prompt set {name!r}; choose official or ours")


def _text(pieces: Sequence[Any]) -> str:
    return "".join(p.text for p in pieces).strip()


def _full_context(pieces: Sequence[Piece], plan: SlotPlan) -> str:
    """The whole text of the chunks a stage's pieces come from, in time order."""
    if not pieces:
        return ""
    wanted = {p.chunk_id for p in pieces}
    texts = [c.text.strip() for c in plan.chunks if c.chunk_id in wanted and c.text.strip()]
    if not texts:
        texts = [t for p in pieces if (t := (p.full_text or p.text).strip())]
    return "".join(texts).strip()


def _future_answers(plans: Sequence[SlotPlan], index: int) -> str:
    scene = plans[index].slot.scene
    rows = [f"- slot {p.slot.slot_id}: {p.slot.answer.strip()}"
            for p in plans[index + 1 :] if p.slot.scene == scene]
    return "\n".join(rows).strip() if rows else "(none)"


def prompt_fields(stage: str, plans: Sequence[SlotPlan], index: int) -> dict[str, Any]:
    """The values the ``stage`` template of slot ``plans[index]`` is filled with (module docstring)."""
    plan = plans[index]
    s = plan.slot
    if stage == "partial":
        return {"question": s.question.strip(), "gt_answer": s.answer.strip(),
                "actual_text": "".join(c.text for c in plan.chunks).strip()}
    pieces = plan.early if stage == "early" else plan.core
    fields: dict[str, Any] = {
        "scene_type": OFFICIAL_SCENES[s.scene], "slot_id": s.slot_id, "turn_index": s.turn,
        "step_index": s.step, "boundary_type": "Soft" if s.boundary == "soft" else "Hard",
        "is_interrupted": "true" if s.interrupted else "false", "question": s.question.strip(),
        "gt_answer": s.answer.strip(), "full_context": _full_context(pieces, plan),
        "actual_text": _text(pieces),
    }
    if stage == "core":
        fields["future_answers"] = _future_answers(plans, index)
    return fields
