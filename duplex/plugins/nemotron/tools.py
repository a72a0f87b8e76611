"""Tools: the system prompt that lists them, the model's calls, and the client's results.

How the model uses tools (learned from the checkpoint's serving contract):

* The tools are listed in the system prompt (``system_prompt``), fixed when the
  session opens; at most ``MAX_TOOLS``.
* The model writes a call on its *function channel*, one token per frame:
  ``<SPECIAL_20>`` opens it, the JSON of the call follows (optionally wrapped in
  ``<TOOLCALL>...</TOOLCALL>``: a list of ``{"name", "arguments"}``, or one
  object), ``<SPECIAL_21>`` closes it. ``ToolCallParser`` follows one slot's
  channel and returns the finished calls.
* A client's result goes back on the same channel: ``tool_response_text``
  renders it as ``<TOOL_RESPONSE>[output]</TOOL_RESPONSE>``; its tokens are forced
  into the function channel one per frame while the text channel is held at PAD
  (the model listens while it reads the result), then the model continues.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from duplex.plugins.base import ToolCall, ToolSpec

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "MAX_TOOLS",
    "ToolCallParser",
    "parse_tool_calls",
    "system_prompt",
    "tool_response_text",
]

log = logging.getLogger(__name__)

MAX_TOOLS = 5

# The checkpoint's default persona, used when a session gives no instructions.
DEFAULT_INSTRUCTIONS = (
    "You are an AI voice assistant developed by NVIDIA. "
    "Your name is NVIDIA Voice Chat. "
    "Answer in a spoken, conversational style rather than a written one. "
    "Do not repeat the same sentence over and over again. "
    "Start the conversation by greeting the user."
)


def _tool_definition(tool: ToolSpec) -> dict[str, object]:
    try:
        parameters = json.loads(tool.parameters or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool {tool.name!r}: parameters are not JSON ({exc.msg})") from exc
    definition: dict[str, object] = {"name": tool.name}
    if tool.description:
        definition["description"] = tool.description
    definition["parameters"] = parameters
    return definition


def system_prompt(instructions: str, tools: Sequence[ToolSpec]) -> str:
    """The system prompt text: the instructions, then the tool list in the format the model was trained on.

    Raises ``ValueError`` for more than ``MAX_TOOLS`` tools, a tool without a
    name, or parameters that are not JSON.
    """
    instructions = instructions or DEFAULT_INSTRUCTIONS
    if not tools:
        return instructions
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"at most {MAX_TOOLS} tools per session, got {len(tools)}")
    for tool in tools:
        if not tool.name.strip():
            raise ValueError("every tool needs a name")
    listed = json.dumps([_tool_definition(t) for t in tools], ensure_ascii=False, sort_keys=True)
    return (
        f"{instructions}\n\n"
        "You can use the following tools to assist the user if required:"
        f"\n<AVAILABLE_TOOLS>{listed}</AVAILABLE_TOOLS>\n\n"
        "If you decide to call any tool(s), use the following format:\n"
        '<TOOLCALL>[{"name": "tool_name1", "arguments": "tool_args1"}, '
        '{"name": "tool_name2", "arguments": "tool_args2"}]</TOOLCALL>\n\n'
        "The user will execute tool-calls and return responses from tool(s) in this format:\n"
        '<TOOL_RESPONSE>[{"tool_response1"}, {"tool_response2"}]</TOOL_RESPONSE>\n\n'
        "Based on the tool responses, you can call additional tools if needed, correct tool calls if any "
        "errors are found, or just respond to the user."
    )


def tool_response_text(output: str) -> str:
    """A client's tool result as the model reads it: JSON output stays JSON, other text becomes a string."""
    try:
        value: object = json.loads(output)
    except json.JSONDecodeError:
        value = output
    return f"<TOOL_RESPONSE>{json.dumps([value], ensure_ascii=True, separators=(',', ':'))}</TOOL_RESPONSE>"


def parse_tool_calls(text: str) -> list[tuple[str, str]]:
    """``(name, arguments JSON)`` of each call in a closed function-channel span.

    Raises ``ValueError`` when the span is not a call (bad JSON, no name,
    arguments that are not an object).
    """
    body = text.strip()
    if "<TOOLCALL>" in body:
        body = body.split("<TOOLCALL>", 1)[1]
    if "</TOOLCALL>" in body:
        body = body.split("</TOOLCALL>", 1)[0]
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the call is not JSON: {exc.msg}") from exc
    items = [parsed] if isinstance(parsed, dict) else parsed
    if not isinstance(items, list) or not items:
        raise ValueError("the call is neither an object nor a non-empty list")
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
            raise ValueError("every call needs a name")
        arguments = item.get("arguments", {})
        if isinstance(arguments, str):
            try:
                decoded = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"the arguments are not JSON: {exc.msg}") from exc
            if not isinstance(decoded, dict):
                raise ValueError("the arguments are not a JSON object")
            arguments = decoded
        if not isinstance(arguments, dict):
            raise ValueError("the arguments are not a JSON object")
        calls.append((item["name"].strip(), json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))))
    return calls


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass
class ToolCallParser:
    """One slot's function channel: collects a call's tokens between SOTC and EOTC.

    ``push(token)`` returns the calls the token finished (usually none). A span
    that is not a valid call is logged and counted in ``malformed`` (the
    contract has no per-session error channel for what the model writes).
    """

    sotc: int
    eotc: int
    pad: int
    max_tokens: int = 4096
    active: bool = False
    tokens: list[int] = field(default_factory=list)
    malformed: int = 0

    def reset(self) -> None:
        self.active = False
        self.tokens.clear()

    def push(self, token: int, decode: Callable[[list[int]], str]) -> list[ToolCall]:
        if token == self.sotc:
            self.active = True
            self.tokens.clear()
            return []
        if not self.active:
            return []
        if token == self.eotc:
            self.active = False
            text = decode(self.tokens)
            self.tokens.clear()
            try:
                calls = parse_tool_calls(text)
            except ValueError as exc:
                self.malformed += 1
                log.warning("nemotron: the model wrote a malformed tool call (%s): %.200r", exc, text)
                return []
            return [ToolCall(call_id=new_call_id(), name=name, arguments=args) for name, args in calls]
        if token != self.pad:
            if len(self.tokens) >= self.max_tokens:
                self.malformed += 1
                log.warning("nemotron: a tool call ran past %d tokens; dropped", self.max_tokens)
                self.reset()
                return []
            self.tokens.append(token)
        return []
