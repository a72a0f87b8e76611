"""NVIDIA Nemotron VoiceChat (NemotronLabs VoiceChat) as a batched ``frame`` plugin with tools.

Modules: ``config`` (the checkpoint's NeMo ``config.json`` parsed into the
architecture), ``presets`` (tiny and full-size architectures), ``tokens`` (the
text tokenizer, its special ids, incremental detokenizing), ``tools`` (tool
prompt, tool-call parsing, tool results for the function channel), ``noise``
(per-slot counter-based random numbers), ``caches`` (per-slot fixed-shape K/V
and conv caches), ``perception`` (streaming mel + FastConformer encoder +
adapter), ``thinker`` (NemotronH backbone, fusion, text and function heads),
``talker`` (EAR-TTS on a Gemma3 backbone with its MoG head; ``talker_modules``:
the parts transformers lacks), ``codec`` (the RVQ-VAE audio codec), ``model``
(the module tree in the checkpoint's key layout), ``loading`` (checkpoint
folder, strict loading), ``generation`` (the batched per-frame step),
``plugin`` (the ``Plugin`` contract), ``testing`` (tiny random-weight
checkpoints). Importing this package imports nothing heavy; ``plugin`` needs
torch and transformers (the ``models`` extra).
"""
