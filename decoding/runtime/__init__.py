"""The model runtime: load a model and run a forward.

``models`` (presets, loading, the memory-bounded cache), ``session`` (one generation's side of a model:
its KV cache, forward count and timings), ``kvcache`` (cropping and compacting caches), ``attention``
(custom 4D masks, the tree forward and the probe that a model honours them), ``kernels`` and
``kernel_choice`` (CPU linear kernels and the per-machine choice between them), ``fastpath`` (static
caches and CUDA graphs), ``head`` (the prophet draft head, a small network on the target's hidden
states) and ``pair`` (the target, its assistant and its head, as a strategy gets them).
"""
