"""MiniCPM-o 4.5 (listens, watches a camera, decides once a second to speak) as a batched ``unit`` plugin."""

from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin

__all__ = ["MiniCPMOPlugin"]
