"""``sd_turbo``: Stable Diffusion family text-to-image (SD 1.x/2.x, SD-Turbo, SDXL, SDXL-Turbo).

``plugin``    ``StableDiffusionPlugin``: requests and the batched step loop (options in its docstring)
``loading``   the diffusers directory layout, strict loading of each component
``batching``  the batch buckets every model call is padded to
``testing``   tiny and full-size random-weight checkpoints in the diffusers layout
"""

from batch_models.diffusion.plugin import StableDiffusionPlugin

__all__ = ["StableDiffusionPlugin"]
