"""``helios``: autoregressive video generation (Helios, diffusers layout), made chunk by chunk.

``plugin``    ``HeliosVideoPlugin``: requests, interactions, the batched step loop (options: its docstring)
``sampler``   the step loop's model calls, each batched across requests (the Helios pipelines' math)
``state``     a request's state between steps, and the prompt transition of its interactions
``loading``   the diffusers directory layout, strict loading of each component
``testing``   tiny and full-size random-weight checkpoints in the diffusers layout
"""

from batch_models.video.plugin import HeliosVideoPlugin

__all__ = ["HeliosVideoPlugin"]
