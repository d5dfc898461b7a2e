"""GPU replay: execute the simulator's restore claims with the project's Triton kernels.

The simulator says which prefix each request restores; replay runs a stack of gated-delta-net
blocks along the same trace with a real checkpoint store, checks every restore (prefix hash and
numerics) and times the prefills. See ``docs/replay.md``.

Only the modules that need no torch (``tokens``, ``flops``) may be imported from here without the
``kernels`` extra; the torch modules (``model``, ``store``, ``runner``, ``checks``) are imported
lazily by the CLI so that the simulator itself never needs torch.
"""
