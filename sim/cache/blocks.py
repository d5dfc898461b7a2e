"""Re-gridding token sequences into block symbols.

A block-granular engine (vLLM+: 32-token blocks) matches whole blocks only: two requests that
diverge inside a block share nothing of it. Hashing each block of tokens into one symbol and
running the same radix tree over those symbols gives exactly that behaviour. A trailing partial
block hashes to its own symbol (its length is mixed in), so it matches only an identical
partial block: "kept, but matches only in full".
"""

from __future__ import annotations

import numpy as np

from policies.engine_common import MAX_BLOCK_TOKENS

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
_rng = np.random.default_rng(0x5EED)  # fixed: the same tokens always hash to the same symbol
_COEFFS = _rng.integers(1, 2**63, size=MAX_BLOCK_TOKENS, dtype=np.uint64) | np.uint64(1)


def block_symbols(tokens: np.ndarray, block: int) -> np.ndarray:
    """Symbols of ``tokens`` cut into ``block``-token blocks (last one possibly partial).

    A random odd-coefficient linear hash over uint64 (wrap-around arithmetic): vectorised, and
    two different blocks of small token ids collide with negligible probability.
    """
    n = len(tokens)
    if block == 1 or n == 0:
        return tokens
    if block > len(_COEFFS):
        raise ValueError(f"block of {block} tokens is larger than supported ({len(_COEFFS)})")
    full, rest = divmod(n, block)
    coeffs = _COEFFS[:block]
    t = tokens.astype(np.uint64, copy=False)
    out = np.empty(full + (1 if rest else 0), dtype=np.uint64)
    with np.errstate(over="ignore"):
        if full:
            out[:full] = (t[: full * block].reshape(full, block) * coeffs).sum(axis=1, dtype=np.uint64)
        if rest:
            out[full] = (t[full * block :] * coeffs[:rest]).sum(dtype=np.uint64) + np.uint64(rest) * coeffs[-1]
    return out.view(np.int64)
