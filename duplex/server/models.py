"""The models one server serves: each a name clients ask for, an engine, and its worker processes.

A server serves one model or several side by side (a duplex model and batch models, say): each has
its own ``Engine`` (its own driver, model thread, admission limits and sessions), and the routes pick
one by the name a client asks for (``ServedModels.pick``). The first model is the default: a client
that names a model this server does not serve (stock clients always send one, e.g. ``gpt-realtime``)
gets it, and the session reports the served name in ``session.model``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from duplex.engine.worker import Supervisor

__all__ = ["ServedModel", "ServedModels"]


@dataclass(frozen=True)
class ServedModel:
    """One served model: the ``name`` clients ask for, its ``engine``, its worker processes."""

    name: str
    engine: Any  # ``duplex.engine.Engine`` (or a stand-in with its public API, in benchmarks)
    workers: tuple[Supervisor, ...] = field(default=())


class ServedModels:
    """The models of one server, in order; the first is the default (see the module docstring)."""

    def __init__(self, models: Sequence[ServedModel]) -> None:
        if not models:
            raise ValueError("a server serves at least one model")
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique: {names}")
        self._models = tuple(models)
        self._by_name = {m.name: m for m in self._models}

    @property
    def default(self) -> ServedModel:
        return self._models[0]

    def get(self, name: str | None) -> ServedModel | None:
        """The model served under ``name`` exactly, or None."""
        return self._by_name.get(name) if name is not None else None

    def pick(self, name: str | None) -> ServedModel:
        """The model a client asking for ``name`` gets: that one, or the default."""
        return self._by_name.get(name, self._models[0]) if name is not None else self._models[0]

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
