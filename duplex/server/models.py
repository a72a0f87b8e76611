"""The models one server serves: each a name clients ask for, an engine, and its worker processes.

A server serves one model or several side by side (a duplex model and batch models, say): each has
its own ``Engine`` (its own driver, model thread, admission limits and sessions), and the routes pick
one by the name a client asks for (``ServedModels.pick``), by what the route serves (``Wants``):

* a served name gets that model: on the realtime routes whatever it is (a batch model answers a
  realtime session's ``response.create`` too); on the HTTP routes only a model that makes the
  route's output from a text, otherwise ``invalid_model``;
* so does one of a served model's aliases (``ServedModel.aliases``: the public names its plugin
  declares, ``PluginInfo.model_aliases``, its vendor's repository ids such as
  ``openbmb/MiniCPM-o-4_5``): the name the vendor's clients and our presets send means that model
  whatever name the server serves it under, so it is neither stood in for nor refused. A served
  name wins over another model's alias, and an alias two served models declare (one checkpoint
  served twice) names neither of them: it is then any other name;
* no name, or one of OpenAI's names for what the route serves (``OPENAI_MODELS``: stock clients
  always send one, e.g. ``gpt-realtime``, ``tts-1``, ``dall-e-3``), gets the route's first
  candidate (``ServedModels.candidates``): on the realtime routes the first served model that
  listens (``Capabilities.audio_input``; every served model when none does), on the HTTP routes the
  first that makes the output;
* any other name gets the route's one candidate when there is one, in the model's stead, and is told
  so (``ModelPick.asked``: the realtime route sends a ``session.warning`` ``model_substituted``
  after ``session.created``, the HTTP routes name the model in ``X-Duplex-Model``); with several
  candidates nobody can tell which was meant: ``model_not_found``, naming them.

Every session reports the served name in ``session.model``, and every HTTP answer in
``X-Duplex-Model``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from duplex.engine.worker import Supervisor
from duplex.plugins.base import Capabilities, PluginKind
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.events import SessionWarning
from duplex.protocol.ids import new_event_id

__all__ = ["MODEL_HEADER", "OPENAI_MODELS", "ModelPick", "ServedModel", "ServedModels", "Wants", "makes"]

#: The HTTP response header that names the served model that answered.
MODEL_HEADER: Final = "X-Duplex-Model"


class Wants(enum.Enum):
    """What a route serves: a conversation (the realtime routes), or an output made from a text
    (the HTTP routes: its value is the output modality)."""

    CONVERSATION = "conversation"
    SPEECH = "audio"
    IMAGE = "image"

    @property
    def what(self) -> str:
        """How messages name the route's models."""
        return _WHAT[self]


_WHAT: Final = {
    Wants.CONVERSATION: "realtime",
    Wants.SPEECH: "text-to-speech",
    Wants.IMAGE: "image generation",
}

#: OpenAI's model names for what each route serves: a name that is one of these, or one of these
#: followed by ``-`` and a version (``gpt-realtime-2025-08-28``, ``gpt-4o-mini-tts-2025-03-20``).
OPENAI_MODELS: Final[dict[Wants, tuple[str, ...]]] = {
    Wants.CONVERSATION: ("gpt-realtime", "gpt-4o-realtime-preview", "gpt-4o-mini-realtime"),
    Wants.SPEECH: ("tts-1", "tts-1-hd", "gpt-4o-mini-tts"),
    Wants.IMAGE: ("dall-e-2", "dall-e-3", "gpt-image-1"),
}


def makes(caps: Capabilities, output: str) -> bool:
    """Whether a model with ``caps`` makes ``output`` (``"audio"``, ``"image"``) from a text alone."""
    return caps.kind is PluginKind.BATCH and caps.supports_text_input and output in caps.output_modalities


def _openai_name(name: str, wants: Wants) -> bool:
    return any(name == n or name.startswith(n + "-") for n in OPENAI_MODELS[wants])


@dataclass(frozen=True)
class ServedModel:
    """One served model: the ``name`` clients ask for, its ``engine``, its worker processes, and the
    other names that ask for it exactly (``aliases``: its plugin's ``PluginInfo.model_aliases``)."""

    name: str
    engine: Any  # ``duplex.engine.Engine`` (or a stand-in with its public API, in benchmarks)
    workers: tuple[Supervisor, ...] = field(default=())
    aliases: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class ModelPick:
    """The model a request gets; ``asked``: the name it asked for when this server serves no model
    of that name and ``model`` answers in its stead (the client is told: see the module docstring)."""

    model: ServedModel
    asked: str | None = None

    def notices(self) -> tuple[SessionWarning, ...]:
        """The ``session.warning`` a realtime session opened by this pick sends after
        ``session.created``: ``model_substituted``, or none."""
        if self.asked is None:
            return ()
        message = f"this server serves no model {self.asked!r}: the session is served by {self.model.name!r}"
        return (
            SessionWarning(event_id=new_event_id(), code="model_substituted", message=message, param="model"),
        )


class ServedModels:
    """The models of one server, in order; the first is the default (see the module docstring)."""

    def __init__(self, models: Sequence[ServedModel]) -> None:
        if not models:
            raise ValueError("a server serves at least one model")
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique: {names}")
        self._models = tuple(models)
        claimed: dict[str, list[ServedModel]] = {}
        for m in self._models:
            for alias in dict.fromkeys(m.aliases):
                claimed.setdefault(alias, []).append(m)
        # An alias names its model only when no served name is spelt so and no other model claims it.
        by_alias = {a: ms[0] for a, ms in claimed.items() if len(ms) == 1 and a not in names}
        self._by_name = {**by_alias, **{m.name: m for m in self._models}}

    @property
    def default(self) -> ServedModel:
        return self._models[0]

    def get(self, name: str | None) -> ServedModel | None:
        """The model ``name`` names exactly: the one served under it, or the one whose alias it is
        (see the module docstring); None for any other name."""
        return self._by_name.get(name) if name is not None else None

    def candidates(self, wants: Wants) -> list[ServedModel]:
        """The models that answer a route serving ``wants`` when a client names none of them, in
        order (see the module docstring)."""
        if wants is Wants.CONVERSATION:
            listening = [m for m in self._models if m.engine.capabilities.audio_input]
            return listening or list(self._models)
        return [m for m in self._models if makes(m.engine.capabilities, wants.value)]

    def pick(self, name: str | None, wants: Wants) -> ModelPick:
        """The model a client asking for ``name`` on a route serving ``wants`` gets (see the module
        docstring). Raises ``ProtocolError`` (param ``model``): ``invalid_model`` for a served model
        that does not make an HTTP route's output, or a server that serves no model for the route;
        ``model_not_found`` for an unknown name that more than one model could answer."""
        named = self.get(name)
        if named is not None:
            if wants is not Wants.CONVERSATION and not makes(named.engine.capabilities, wants.value):
                raise ProtocolError(
                    "invalid_model", f"the model '{name}' is not a {wants.what} model", param="model"
                )
            return ModelPick(named)
        candidates = self.candidates(wants)
        if not candidates:
            raise ProtocolError("invalid_model", f"this server serves no {wants.what} model", param="model")
        if name is None or _openai_name(name, wants):
            return ModelPick(candidates[0])
        if len(candidates) == 1:
            return ModelPick(candidates[0], asked=name)
        served = ", ".join(m.name for m in candidates)
        message = f"The model '{name}' does not exist; this server's {wants.what} models: {served}"
        raise ProtocolError("model_not_found", message, param="model")

    def holding(self, session_id: str) -> ServedModel:
        """The model whose engine holds ``session_id`` (the default when none does: resuming there
        fails as for any unknown session)."""
        for model in self._models:
            if model.engine.has_session(session_id):
                return model
        return self._models[0]

    @property
    def workers(self) -> tuple[Supervisor, ...]:
        return tuple(w for m in self._models for w in m.workers)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)
