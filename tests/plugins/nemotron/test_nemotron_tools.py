"""Tool prompts, tool-call parsing, tool results, detokenizing, per-slot noise and caches (no model)."""

from __future__ import annotations

import json

import pytest
import torch

from duplex.plugins.base import ToolSpec
from duplex.plugins.nemotron import noise
from duplex.plugins.nemotron.caches import RingKVCache
from duplex.plugins.nemotron.testing import train_tokenizer
from duplex.plugins.nemotron.tokens import Detokenizer, TextTokenizer
from duplex.plugins.nemotron.tools import (
    DEFAULT_INSTRUCTIONS,
    ToolCallParser,
    parse_tool_calls,
    system_prompt,
    tool_response_text,
)

WEATHER = ToolSpec(name="get_weather", description="the weather", parameters='{"type": "object"}')


def test_the_system_prompt_lists_the_tools_in_the_models_format():
    text = system_prompt("Be brief.", [WEATHER])
    assert text.startswith("Be brief.\n\nYou can use the following tools")
    listed = text.split("<AVAILABLE_TOOLS>")[1].split("</AVAILABLE_TOOLS>")[0]
    assert json.loads(listed) == [
        {"name": "get_weather", "description": "the weather", "parameters": {"type": "object"}}
    ]
    assert "<TOOLCALL>[" in text and "<TOOL_RESPONSE>[" in text
    assert system_prompt("", []) == DEFAULT_INSTRUCTIONS
    assert system_prompt("Hi.", []) == "Hi."


def test_more_than_five_tools_or_a_bad_schema_is_refused():
    with pytest.raises(ValueError, match="at most 5"):
        system_prompt("x", [ToolSpec(name=f"t{i}") for i in range(6)])
    with pytest.raises(ValueError, match="not JSON"):
        system_prompt("x", [ToolSpec(name="t", parameters="{")])


@pytest.mark.parametrize(
    ("span", "calls"),
    [
        ('<TOOLCALL>[{"name": "a", "arguments": {"x": 1}}]</TOOLCALL>', [("a", '{"x":1}')]),
        ('{"name": "a", "arguments": "{\\"x\\": 2}"}', [("a", '{"x":2}')]),
        ('[{"name": "a"}, {"name": " b ", "arguments": {}}]', [("a", "{}"), ("b", "{}")]),
    ],
)
def test_calls_are_parsed_from_the_function_channel(span, calls):
    assert parse_tool_calls(span) == calls


@pytest.mark.parametrize(
    "span",
    [
        "not json",
        "[]",
        '[{"arguments": {}}]',
        '{"name": "a", "arguments": [1]}',
        '{"name": "a", "arguments": "x"}',
    ],
)
def test_a_span_that_is_not_a_call_is_refused(span):
    with pytest.raises(ValueError):
        parse_tool_calls(span)


def test_tool_results_keep_json_and_quote_text():
    assert tool_response_text('{"t": 21}') == '<TOOL_RESPONSE>[{"t":21}]</TOOL_RESPONSE>'
    assert tool_response_text("sunny") == '<TOOL_RESPONSE>["sunny"]</TOOL_RESPONSE>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return TextTokenizer(
        train_tokenizer(tmp_path_factory.mktemp("tok") / "t.json"), "<s>", "</s>", "<SPECIAL_12>"
    )


def test_the_parser_follows_one_slots_function_channel(tokenizer):
    sp = tokenizer.special
    parser = ToolCallParser(sotc=sp.sotc, eotc=sp.eotc, pad=sp.pad)
    body = tokenizer.encode('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    tokens = [sp.pad, sp.sotc, *body[:3], sp.pad, *body[3:], sp.eotc, sp.pad]
    calls = [c for t in tokens for c in parser.push(t, tokenizer.decode)]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city":"Paris"}')]
    broken = [sp.sotc, *tokenizer.encode("hello"), sp.eotc]
    assert [c for t in broken for c in parser.push(t, tokenizer.decode)] == []
    assert parser.malformed == 1


def test_the_detokenizer_emits_each_tokens_text_once(tokenizer):
    text = "hello there, café ☕ friend"
    ids = tokenizer.encode(text)
    detok = Detokenizer(tokenizer)
    deltas = [detok.push(i) for i in ids]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


def test_noise_is_a_function_of_seed_and_counter_not_of_the_row():
    seed, counter = torch.tensor([3, 9, 3]), torch.tensor([5, 5, 5])
    u = noise.uniform(seed, counter, 2, 16)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert torch.equal(noise.uniform(seed[2:], counter[2:], 2, 16)[0], u[0])
    assert ((u > 0) & (u < 1)).all()
    n = noise.normal(torch.arange(64), torch.zeros(64, dtype=torch.long), 0, 512)
    assert abs(float(n.mean())) < 0.05 and abs(float(n.std()) - 1) < 0.05


def test_a_ring_cache_keeps_the_last_positions_and_leaves_frozen_rows_alone():
    cache = RingKVCache(
        [7], rows=2, kv_heads=1, length=3, head_dim=1, dtype=torch.float32, device=torch.device("cpu")
    )
    lengths = torch.zeros(2, dtype=torch.long)
    for step in range(5):
        run = torch.tensor([True, step % 2 == 0])
        cache.bind(2, run, lengths)
        value = torch.full((2, 1, 1, 1), float(step + 1))
        keys, _ = cache.update(value, value, 7)
        mask = cache.mask(lengths)
        lengths = lengths + run.long()
    # Row 0 wrote 5 positions into 3 entries: it holds the last 3 (3, 4, 5), all visible.
    assert sorted(keys[0, 0, :, 0].tolist()) == [3.0, 4.0, 5.0] and mask[0].all()
    # Row 1 ran on steps 0, 2, 4 only.
    assert sorted(keys[1, 0, :, 0].tolist()) == [1.0, 3.0, 5.0]
    assert cache.mask(torch.tensor([1, 1]))[0, 0, 0].tolist() == [True, True, False]
    # Position 4 is entry 1, position 3 entry 0; a window of 2 leaves out position 2 (entry 2).
    assert cache.mask(torch.tensor([4, 4]), window=2)[0, 0, 0].tolist() == [True, True, False]
    assert cache.mask(torch.tensor([5, 5]), window=2)[0, 0, 0].tolist() == [False, True, True]
