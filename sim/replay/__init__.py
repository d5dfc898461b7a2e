"""GPU replay: execute the simulator's restore claims with the whole model.

The simulator says which prefix each request restores; replay runs every layer type of the preset
(attention with a paged KV store, gated-delta layers on the project's Triton kernels or their
plain-torch twin, see ``sim.replay.backends``, MLP) along the same trace with a real checkpoint
store, checks every restore (prefix hash / KV page keys, then numerics against a from-scratch
prefill) and times the prefills per layer type; its measurements fit the hardware cost model
(``sim.cost.HardwareTiming``). See ``docs/replay.md`` and ``docs/replay-cost-model.md``.

Only the modules that need no torch (``tokens``, ``flops``, ``measure``, ``records``, ``output``,
``backends``) may be imported from here without the ``kernels`` extra; the torch modules
(``model``, ``store``, ``runner``, ``checks``) are imported lazily by the CLI so that the simulator
itself never needs torch.
"""
