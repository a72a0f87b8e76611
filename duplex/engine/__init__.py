"""The session layer: sans-IO sessions, their runners, the manager and the frame scheduler.

Public API (``docs/internals.md``, "engine"): ``Engine``, ``EngineConfig``,
``Attachment`` (and ``SessionHandle``, what a transport needs of one), ``SessionError``,
``Detached``; ``Admission`` and ``QueueStatus`` (the
waiting room); ``EngineMetrics`` for exporters.
"""

from duplex.engine.admission import Admission, QueueStatus
from duplex.engine.attachment import Attachment, SessionHandle
from duplex.engine.config import EngineConfig
from duplex.engine.engine import Engine
from duplex.engine.errors import Detached, SessionError
from duplex.engine.metrics import EngineMetrics

__all__ = [
    "Admission",
    "Attachment",
    "Detached",
    "Engine",
    "EngineConfig",
    "EngineMetrics",
    "QueueStatus",
    "SessionError",
    "SessionHandle",
]
