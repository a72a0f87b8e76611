"""plan_handshake: what a /v1/realtime request asks for, from its query and headers alone."""

from __future__ import annotations

import pytest

from duplex.protocol import MSGPACK_SUBPROTOCOL, Dialect, Mode
from duplex.server.handshake import HandshakePlan, HandshakeRefusal, OpenHow, plan_handshake


def plan(query=None, headers=None, subprotocols=()):
    return plan_handshake(query or {}, headers or {}, subprotocols)


def test_bare_endpoint_is_a_duplex_session_waiting_for_the_first_message():
    p = plan()
    assert isinstance(p, HandshakePlan)
    assert (p.how, p.mode, p.subprotocol) == (OpenHow.FIRST_MESSAGE, Mode.GA, None)


@pytest.mark.parametrize("value", ["1", "true", "on"])
def test_model_in_query_opens_at_once(value):
    p = plan({"model": "m", "duplex": value})
    assert (p.how, p.model) == (OpenHow.AUTOSTART, "m")


def test_autostart_without_a_model_opens_the_default_model_at_once():
    p = plan({"autostart": "1"})
    assert (p.how, p.model, p.dialect) == (OpenHow.AUTOSTART, None, Dialect.GA)


@pytest.mark.parametrize("query", [{"model": "m", "autostart": "0"}, {"model": "m", "resume": "1"}])
def test_autostart_off_or_resume_flag_waits_for_the_first_message(query):
    assert plan(query).how is OpenHow.FIRST_MESSAGE


def test_resume_parameters_in_query_resume_at_once():
    p = plan({"model": "m", "session_id": "sess_1", "resume_token": "tok", "last_event_seq": "41"})
    assert (p.how, p.session_id, p.resume_token, p.last_event_seq) == (
        OpenHow.RESUME_QUERY,
        "sess_1",
        "tok",
        41,
    )


def test_resume_seq_aliases_are_accepted():
    p = plan({"session_id": "s", "resume_token": "t", "last_received_server_event_seq": "7"})
    assert p.last_event_seq == 7


@pytest.mark.parametrize(
    "query",
    [
        {"session_id": "s"},
        {"resume_token": "t"},
        {"session_id": "s", "resume_token": "t", "last_event_seq": "-1"},
        {"session_id": "s", "resume_token": "t", "last_event_seq": "x"},
    ],
)
def test_incomplete_resume_query_is_refused(query):
    p = plan(query)
    assert isinstance(p, HandshakeRefusal) and p.code == "invalid_session_resume"


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_duplex_0_is_answered_with_a_clear_error(value):
    p = plan({"duplex": value})
    assert isinstance(p, HandshakeRefusal)
    assert p.code == "duplex_required" and "duplex=0" in p.message and p.status is None


def test_msgpack_subprotocol_wins_over_beta_header():
    p = plan(headers={"openai-beta": "realtime=v1"}, subprotocols=["x", MSGPACK_SUBPROTOCOL])
    assert (p.mode, p.subprotocol) == (Mode.MSGPACK, MSGPACK_SUBPROTOCOL)


def test_beta_header_selects_beta_names():
    assert plan(headers={"openai-beta": "assistants=v2, realtime=v1"}).mode is Mode.BETA


def test_pipecat_double_question_mark_is_repaired():
    # Pipecat builds f"{base_url}?model=..." even when base_url already has ?duplex=1
    p = plan({"duplex": "1?model=local-duplex"})
    assert (p.how, p.model) == (OpenHow.AUTOSTART, "local-duplex")


@pytest.mark.parametrize(
    ("query", "dialect"),
    [
        ({"duplex": "1", "model": "m", "autostart": "0"}, Dialect.SEEDS),  # the seeds' clients
        ({"duplex": "true", "resume": "1"}, Dialect.SEEDS),  # their reconnect (the session keeps its own)
        ({"duplex": "on"}, Dialect.SEEDS),
        ({"duplex": "1", "model": "m"}, Dialect.GA),  # autostarted: an OpenAI client (Pipecat's URL)
        ({"duplex": "1?model=m"}, Dialect.GA),
        ({"model": "m", "autostart": "0"}, Dialect.GA),  # no duplex=1
        ({}, Dialect.GA),
    ],
)
def test_a_seeds_client_asks_for_duplex_and_opens_with_its_first_message(query, dialect):
    assert plan(query).dialect is dialect
