"""Triton kernels (chunked gated delta rule with chunk-boundary states), reference oracles and
GPU replay. Needs the ``kernels`` extra (torch, triton); the simulator never imports this."""
