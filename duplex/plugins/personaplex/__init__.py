"""PersonaPlex (NVIDIA's full-duplex Moshi finetune) as a batched ``frame`` plugin.

Modules: ``config`` (architectures and token ids), ``loading`` (checkpoint
directory, key remap, voices), ``prompt`` (the system-prompt phases),
``sampling`` (per-slot deterministic top-k), ``generation`` (the batched step
on moshi's ``LMModel`` and Mimi), ``plugin`` (the ``Plugin`` contract),
``testing`` (tiny random-weight checkpoints). Importing this package imports
nothing heavy; ``plugin`` needs torch and moshi (the ``personaplex`` extra).
"""
