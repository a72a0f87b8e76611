"""The reply strategies by name, and the one function that builds one from serve-time options."""

from __future__ import annotations

from duplex.plugins.base import PluginError
from duplex.plugins.default.lm import LocalLMReply
from duplex.plugins.default.reply import EchoReply, OpenAIChatReply, ReplyStrategy, VLLMReply

__all__ = ["STRATEGIES", "make_strategy"]

STRATEGIES = ("lm", "echo", "openai", "vllm")
"""The names ``reply`` accepts; the first is the default."""


def make_strategy(
    reply: str,
    *,
    model_path: str | None = None,
    reply_url: str | None = None,
    reply_model: str | None = None,
    reply_api_key_env: str | None = None,
    reply_timeout_s: float = 30.0,
    reply_max_tokens: int | None = None,
    reply_threads: int = 1,
    max_sessions: int = 4,
    warm_up: bool = True,
) -> ReplyStrategy:
    """Build the strategy named ``reply`` from serve-time options.

    ``lm`` loads the packaged language model, or the GGUF file ``reply_model`` names, with
    ``reply_threads`` CPU threads and one sequence per session (``max_sessions``).
    ``reply_max_tokens``: the longest reply, in tokens; None gives each kind its own default: the
    small local model's replies are short and drift the longer they run, so ``lm`` stops at
    ``LM_MAX_TOKENS`` (96; ``duplex.plugins.default.lm`` says how that was measured), while
    ``openai`` and ``vllm`` serve models that answer well at length and keep 256.
    Raises ``PluginError("invalid_plugin_config")`` for an unknown strategy or a
    missing option (``openai`` needs ``reply_url``; ``vllm`` needs a model
    directory, ``model_path`` or ``reply_model``, and the vllm package).
    """
    # Each kind's own default stands when no limit is given.
    limit: dict[str, int] = {} if reply_max_tokens is None else {"max_tokens": reply_max_tokens}
    if reply == "lm":
        return LocalLMReply(
            reply_model,
            threads=reply_threads,
            max_sessions=max_sessions,
            warm_up=warm_up,
            **limit,
        )
    if reply == "echo":
        return EchoReply()
    if reply == "openai":
        if not reply_url:
            raise PluginError("invalid_plugin_config", "reply='openai' needs reply_url (the chat endpoint)")
        return OpenAIChatReply(
            reply_url,
            model=reply_model,
            api_key_env=reply_api_key_env,
            timeout_s=reply_timeout_s,
            **limit,
        )
    if reply == "vllm":
        model_dir = model_path or reply_model
        if not model_dir:
            raise PluginError(
                "invalid_plugin_config", "reply='vllm' needs a local model directory (model_path)"
            )
        return VLLMReply(model_dir, **limit)
    raise PluginError(
        "invalid_plugin_config", f"unknown reply strategy {reply!r}; choose one of {', '.join(STRATEGIES)}"
    )
