"""duplex: real-time full-duplex model serving over an OpenAI-Realtime-compatible WebSocket."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

__all__ = ["version"]


def version() -> str:
    """The installed ``duplex-runtime`` distribution's version ("unknown" in a source tree that was
    never installed)."""
    try:
        return _distribution_version("duplex-runtime")
    except PackageNotFoundError:
        return "unknown"
