"""ServerConfig / YAML loading and the admission checks (API key, origin)."""

from __future__ import annotations

import pytest

from duplex.server.auth import api_key_ok, origin_ok, presented_api_key
from duplex.server.config import ConfigError, ServeConfig, ServerConfig, load_serve_config


def test_yaml_file_sets_server_engine_and_plugin(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(
        "plugin: echo\nmodel_name: my-model\nserver:\n  port: 9001\n  api_keys: [k1]\n"
        "engine:\n  max_sessions: 7\n  disconnect_grace_s: 2.5\n"
    )
    cfg = load_serve_config(path)
    assert cfg.plugin == "echo"
    assert cfg.model_name == "my-model"
    assert cfg.server.port == 9001
    assert cfg.server.api_keys == ("k1",)
    assert cfg.engine == {"max_sessions": 7, "disconnect_grace_s": 2.5}


def test_no_file_gives_defaults():
    assert load_serve_config(None) == ServeConfig()


def test_misspelled_key_is_refused_with_its_name(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("server:\n  max_mesage_bytes: 10\n")
    with pytest.raises(ConfigError, match="max_mesage_bytes"):
        load_serve_config(path)


def test_message_limit_above_frame_limit_is_refused():
    with pytest.raises(ValueError, match="max_message_bytes"):
        ServerConfig(max_message_bytes=2, max_frame_bytes=1)


def test_bearer_header_wins_over_query_key():
    assert presented_api_key({"authorization": "Bearer abc"}, {"api_key": "q"}) == "abc"
    assert presented_api_key({}, {"api_key": "q"}) == "q"
    assert presented_api_key({"authorization": "Basic zzz"}, {}) is None


def test_api_keys_compare_exactly():
    assert api_key_ok(None, ())
    assert api_key_ok("k2", ("k1", "k2"))
    assert not api_key_ok("k", ("k1",))
    assert not api_key_ok(None, ("k1",))


def test_origin_allow_list():
    assert origin_ok("https://a.example", ())
    assert origin_ok(None, ("https://a.example",))
    assert origin_ok("https://a.example/", ("https://a.example",))
    assert not origin_ok("https://evil.example", ("https://a.example",))
    assert origin_ok("https://evil.example", ("*",))
