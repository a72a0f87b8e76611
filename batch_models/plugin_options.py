"""Serve-time options of the batch plugins: ``duplex.plugins.options.parse_options``, the one rule
every plugin parses its options by (strings from the command line typed, unknown keys refused)."""

from __future__ import annotations

from duplex.plugins.options import parse_options

__all__ = ["parse_options"]
