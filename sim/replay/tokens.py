"""Token ids for replay (numpy only, no torch).

Tokenized traces carry token ids (``block_tokens == 1``) and are used as they are. Hash-block
traces (Mooncake, Bailian) carry one hash id per block of ``block_tokens`` tokens and no tokens:
each block's tokens are drawn from its hash id with a seed (a SplitMix64 stream keyed by
``(seed, hash id, index in block)``), so equal hashes give equal tokens and a partial last block
is a prefix of the full block. A hash-block trace spelled out (``--hash-block-tokens``: block size 1,
``meta["hash_block_tokens"]`` the hash block) gets the same draws: each spelled token is decoded to its
symbol and index in the block, so both spellings of a trace replay the same token ids. Also the prefix
hash the checkpoint store keeps per checkpoint.
"""

from __future__ import annotations

import hashlib

import numpy as np

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser, elementwise on uint64 (wrapping arithmetic is intended)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _draw(symbols: np.ndarray, index: np.ndarray, seed: int, vocab: int) -> np.ndarray:
    """The token id in ``[0, vocab)`` at ``index`` of each symbol's block (broadcast)."""
    sym = np.asarray(symbols, dtype=np.int64).view(np.uint64)
    key = _splitmix64(sym ^ _splitmix64(np.full(sym.shape, seed, dtype=np.uint64)))
    with np.errstate(over="ignore"):
        mixed = _splitmix64(key * np.uint64(0x100000001B3) + index)
    return (mixed % np.uint64(vocab)).astype(np.int64)


def block_tokens_for(symbols: np.ndarray, block_tokens: int, seed: int, vocab: int) -> np.ndarray:
    """``len(symbols) * block_tokens`` token ids in ``[0, vocab)``: block i's tokens depend only
    on ``(seed, symbols[i])``."""
    sym = np.asarray(symbols, dtype=np.int64)
    j = np.arange(block_tokens, dtype=np.uint64)
    return _draw(sym[:, None], j[None, :], seed, vocab).reshape(-1)


def spelled_tokens_for(tokens: np.ndarray, hash_block: int, seed: int, vocab: int) -> np.ndarray:
    """``block_tokens_for``'s draws for a hash-block trace spelled out (``--hash-block-tokens``):
    token ``(s + 2**40) * hash_block + j`` draws what index j of symbol s's block draws."""
    from traces.hashblock import unspell  # noqa: PLC0415

    sym, j = unspell(tokens, hash_block)
    return _draw(sym, j.astype(np.uint64), seed, vocab)


def request_tokens(
    input_symbols,
    output_symbols,
    *,
    block_tokens: int,
    input_len: int,
    output_len: int,
    seed: int = 0,
    vocab: int = 1 << 17,
    hash_block: int = 0,
) -> np.ndarray:
    """The token ids of prompt + response for one request (prompt first, ``input_len`` tokens).
    ``hash_block``: the trace is a hash-block trace spelled out at that block (``block_tokens`` 1):
    its tokens are drawn as the block spelling's."""
    if block_tokens == 1 and hash_block > 1:
        seq = np.concatenate([np.asarray(input_symbols, dtype=np.int64), np.asarray(output_symbols, dtype=np.int64)])
        return spelled_tokens_for(seq, hash_block, seed, vocab)
    if block_tokens == 1:
        return np.concatenate([np.asarray(input_symbols, dtype=np.int64), np.asarray(output_symbols, dtype=np.int64)])
    inp = block_tokens_for(input_symbols, block_tokens, seed, vocab)[:input_len]
    out = block_tokens_for(output_symbols, block_tokens, seed, vocab)[:output_len]
    return np.concatenate([inp, out])


def prefix_hash(tokens: np.ndarray, p: int) -> bytes:
    """16-byte digest of the first ``p`` token ids (what a checkpoint at position p summarises)."""
    return hashlib.blake2b(np.ascontiguousarray(tokens[:p], dtype=np.int64).tobytes(), digest_size=16).digest()


def page_keys(tokens: np.ndarray, p: int, page_tokens: int) -> list[bytes]:
    """Keys of the KV pages that hold the first ``p`` tokens: page k covers
    ``[k * page_tokens, min(p, (k + 1) * page_tokens))`` and its key is a chained digest of every
    token up to its end, so equal keys mean equal prefixes (a partial last page keys its length)."""
    keys, h = [], b""
    t = np.ascontiguousarray(tokens[:p], dtype=np.int64)
    for s in range(0, p, page_tokens):
        e = min(p, s + page_tokens)
        h = hashlib.blake2b(h + t[s:e].tobytes() + (e - s).to_bytes(4, "little"), digest_size=16).digest()
        keys.append(h)
    return keys
