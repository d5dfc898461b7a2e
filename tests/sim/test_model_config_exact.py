"""Exact counts of every model read from its config.json (sim/hf_config.py; issue 42's mutation
survivors): for each fixture in tests/data/configs/, the parameter count, the active MLP width per
token, KV bytes per token and state bytes, worked by hand here from the config's numbers, never
read back from the reader. ``test_model_config.py`` checks the totals only against the published
counts, within 0.05 B; here every weight counts.

The reader's weight convention (docs/models.md), written out once more here as the oracle:

* attention: q (twice as wide with Qwen's output gate), k, v and o, no biases:
  ``d*H*hd*(2 if gate else 1) + 2*d*KV*hd + H*hd*d``;
* gated delta: in-projections q, k (``Hk*dk`` each), v, z (``Hv*dv`` each), b and a (``Hv`` each),
  the out-projection ``Hv*dv -> d`` and the depthwise conv over ``2*Hk*dk + Hv*dv`` channels;
* Mamba2: ``in_proj`` ``d -> 2*di + 2*G*N + H``, ``out_proj`` ``di -> d``, the conv over
  ``di + 2*G*N`` channels, A, D and dt_bias (``H`` each) and the gated norm (``di``);
* Mamba1 (Jamba): ``in_proj`` ``d -> 2*di``, ``x_proj`` ``di -> R + 2N``, ``dt_proj`` ``R -> di``,
  ``out_proj``, the conv over ``di`` channels, A (``di*N``) and D (``di``);
* SwiGLU ``3*d*I``; squared ReLU (Nemotron-H) ``2*d*I``; an MoE block: its experts, the shared
  expert and the ``d x E`` router (active: the top-k experts, the shared one and the router);
* two vocabulary tables (embedding and LM head) unless tied; no norm weights outside Mamba2's.

Llama-2-7B checks the convention against the published count: 6,738,149,376 here + 266,240 RMSNorm
weights (32 x 2 x 4096 + 4096) = 6,738,415,616, the count its model card gives.
"""

import json
from pathlib import Path


import pytest

from sim.cost import get_model
from sim.errors import UsageError
from sim.hf_config import read_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _read(name: str):
    """(the reader's fields, the spec built from them) of fixture ``name``."""
    path = str(CONFIGS / name)
    return read_config(path), get_model(path)


def _check(r, s, *, fields: dict, total: int, kv: int, state: int) -> None:
    for k, v in fields.items():
        assert r[k] == v, k
    assert r["total_params"] == total and isinstance(r["total_params"], float)
    assert s.kv_bytes_per_token() == kv
    assert s.state_bytes() == state


# ---- dense attention


def test_llama_2_7b_exact():
    r, s = _read("llama-2-7b.json")
    # d 4096, 32 layers, 32 heads = 32 KV heads, head dim 4096 / 32 = 128 (no head_dim field)
    attn = 4096 * 4096 + 2 * 4096 * 4096 + 4096 * 4096  # q, k+v, o = 67,108,864
    mlp = 3 * 4096 * 11008  # 135,266,304
    emb = 32000 * 4096  # 131,072,000, untied: two tables
    assert (attn, mlp) == (67_108_864, 135_266_304)
    _check(
        r,
        s,
        fields=dict(n_attn=32, attn_heads=32, attn_kv_heads=32, attn_head_dim=128, attn_output_gate=False)
        | dict(n_mlp=32, mlp_active_params=mlp, embedding_params=emb, kv_dtype_bytes=2),
        total=32 * (attn + mlp) + 2 * emb,  # 6,476,005,376 + 262,144,000
        kv=32 * 2 * 32 * 128 * 2,  # layers x (K, V) x KV heads x head dim x fp16 = 524,288
        state=0,
    )
    assert r["total_params"] == 6_738_149_376
    assert "n_mamba" not in r and "n_gdn" not in r
    assert type(r["attn_head_dim"]) is int  # 4096 // 32, a whole number of channels


# ---- gated delta (Qwen3-Next, Qwen3.5)

# per-layer weights of the Qwen gated-delta layer with Hk = 16 key heads, dk = dv = 128, width 4:
#   d*(2*16*128 + 2*Hv*128)  q, k, v, z
# + d*2*Hv                   b, a
# + Hv*128*d                 out
# + (2*16*128 + Hv*128)*4    conv
# and its state: Hv x 128 x 128 fp32 + the conv's (2*16*128 + Hv*128) channels x 3 columns bf16


def test_qwen3_next_80b_a3b_exact():
    r, s = _read("qwen3-next-80b-a3b.json")
    # d 2048, 48 layers, full_attention_interval 4: layers 3, 7, ..., 47 -> 12 attention, 36 GDN
    attn = 2048 * 16 * 256 * 2 + 2 * 2048 * 2 * 256 + 16 * 256 * 2048  # gated q: 27,262,976
    gdn = 2048 * (4096 + 8192) + 2048 * 64 + 4096 * 2048 + 8192 * 4  # Hv 32: 33,718,272
    # every layer MoE: 10 of 512 experts of width 512, a shared expert of 512, a 512-way router
    moe_active = 3 * 2048 * 512 * 10 + 3 * 2048 * 512 + 2048 * 512  # 35,651,584
    moe_total = 3 * 2048 * 512 * 512 + 3 * 2048 * 512 + 2048 * 512  # 1,614,807,040
    emb = 151936 * 2048  # 311,164,928
    assert (attn, gdn, moe_active, moe_total) == (27_262_976, 33_718_272, 35_651_584, 1_614_807_040)
    _check(
        r,
        s,
        fields=dict(n_attn=12, attn_heads=16, attn_kv_heads=2, attn_head_dim=256, attn_output_gate=True)
        | dict(n_gdn=36, gdn_k_heads=16, gdn_v_heads=32, gdn_head_k_dim=128, gdn_head_v_dim=128, gdn_conv_width=4)
        | dict(n_mlp=48, mlp_active_params=moe_active, embedding_params=emb, state_dtype_bytes=4),
        # 327,155,712 + 1,213,857,792 + 77,510,737,920 + 622,329,856 (published: 80 B)
        total=12 * attn + 36 * gdn + 48 * moe_total + 2 * emb,
        kv=12 * 2 * 2 * 256 * 2,  # 24,576
        state=36 * (32 * 128 * 128 * 4 + 8192 * 3 * 2),  # 36 x 2,146,304 = 77,266,944
    )
    assert r["total_params"] == 79_674_081_280


def test_qwen3_5_9b_exact():
    r, s = _read("qwen3.5-9b.json")
    # d 4096, 32 layers (layer_types: every 4th full) -> 8 attention, 24 GDN; dense SwiGLU
    attn = 4096 * 16 * 256 * 2 + 2 * 4096 * 4 * 256 + 16 * 256 * 4096  # 58,720,256
    gdn = 4096 * (4096 + 8192) + 4096 * 64 + 4096 * 4096 + 8192 * 4  # Hv 32: 67,403,776
    mlp = 3 * 4096 * 12288  # 150,994,944
    emb = 248320 * 4096  # 1,017,118,720; no tie_word_embeddings: two tables
    assert (attn, gdn) == (58_720_256, 67_403_776)
    _check(
        r,
        s,
        fields=dict(n_attn=8, attn_kv_heads=4, n_gdn=24, gdn_v_heads=32, n_mlp=32, mlp_active_params=mlp)
        | dict(embedding_params=emb, state_dtype_bytes=4, kv_dtype_bytes=2, conv_dtype_bytes=2),
        total=8 * attn + 24 * gdn + 32 * mlp + 2 * emb,  # 469,762,048 + 1,617,690,624 + 4,831,838,208 + 2,034,237,440
        kv=8 * 2 * 4 * 256 * 2,  # 32,768
        state=24 * (32 * 128 * 128 * 4 + 8192 * 3 * 2),  # 24 x 2,146,304 = 51,511,296
    )
    assert r["total_params"] == 8_953_528_320


def test_qwen3_5_27b_exact():
    r, s = _read("qwen3.5-27b.json")
    # d 5120, 64 layers -> 16 attention (24 heads, 4 KV), 48 GDN (Hv 48); dense SwiGLU 17408
    attn = 5120 * 24 * 256 * 2 + 2 * 5120 * 4 * 256 + 24 * 256 * 5120  # 104,857,600
    gdn = 5120 * (4096 + 12288) + 5120 * 96 + 6144 * 5120 + (4096 + 6144) * 4  # 115,875,840
    mlp = 3 * 5120 * 17408  # 267,386,880
    emb = 248320 * 5120  # 1,271,398,400
    assert (attn, gdn, mlp) == (104_857_600, 115_875_840, 267_386_880)
    _check(
        r,
        s,
        fields=dict(n_attn=16, attn_heads=24, n_gdn=48, gdn_v_heads=48, n_mlp=64, mlp_active_params=mlp)
        | dict(embedding_params=emb),
        total=16 * attn
        + 48 * gdn
        + 64 * mlp
        + 2 * emb,  # 1,677,721,600 + 5,562,040,320 + 17,112,760,320 + 2,542,796,800
        kv=16 * 2 * 4 * 256 * 2,  # 65,536
        state=48 * (48 * 128 * 128 * 4 + 10240 * 3 * 2),  # 48 x 3,207,168 = 153,944,064
    )
    assert r["total_params"] == 26_895_319_040


def test_qwen3_5_35b_a3b_exact():
    r, s = _read("qwen3.5-35b-a3b.json")
    # d 2048, 40 layers -> 10 attention, 30 GDN (the shapes of Qwen3-Next's); MoE 8 of 256
    attn = 2048 * 16 * 256 * 2 + 2 * 2048 * 2 * 256 + 16 * 256 * 2048  # 27,262,976
    gdn = 2048 * (4096 + 8192) + 2048 * 64 + 4096 * 2048 + 8192 * 4  # 33,718,272
    moe_active = 3 * 2048 * 512 * 8 + 3 * 2048 * 512 + 2048 * 256  # 28,835,840
    moe_total = 3 * 2048 * 512 * 256 + 3 * 2048 * 512 + 2048 * 256  # 808,976,384
    emb = 248320 * 2048  # 508,559,360
    assert (moe_active, moe_total) == (28_835_840, 808_976_384)
    _check(
        r,
        s,
        fields=dict(n_attn=10, n_gdn=30, n_mlp=40, mlp_active_params=moe_active, embedding_params=emb),
        total=10 * attn
        + 30 * gdn
        + 40 * moe_total
        + 2 * emb,  # 272,629,760 + 1,011,548,160 + 32,359,055,360 + 1,017,118,720
        kv=10 * 2 * 2 * 256 * 2,  # 20,480
        state=30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2),  # 30 x 2,146,304 = 64,389,120
    )
    assert r["total_params"] == 34_660_352_000


def test_qwen3_5_397b_a17b_exact():
    r, s = _read("qwen3.5-397b-a17b.json")
    # d 4096, 60 layers -> 15 attention (32 heads, 2 KV), 45 GDN (Hv 64); MoE 10 of 512, width 1024
    attn = 4096 * 32 * 256 * 2 + 2 * 4096 * 2 * 256 + 32 * 256 * 4096  # 104,857,600
    gdn = 4096 * (4096 + 16384) + 4096 * 128 + 8192 * 4096 + (4096 + 8192) * 4  # 118,013,952
    moe_active = 3 * 4096 * 1024 * 10 + 3 * 4096 * 1024 + 4096 * 512  # 140,509,184
    moe_total = 3 * 4096 * 1024 * 512 + 3 * 4096 * 1024 + 4096 * 512  # 6,457,131,008
    emb = 248320 * 4096  # 1,017,118,720
    assert (attn, gdn, moe_active, moe_total) == (104_857_600, 118_013_952, 140_509_184, 6_457_131_008)
    _check(
        r,
        s,
        fields=dict(n_attn=15, attn_heads=32, attn_kv_heads=2, n_gdn=45, gdn_v_heads=64, n_mlp=60)
        | dict(mlp_active_params=moe_active, embedding_params=emb),
        # 1,572,864,000 + 5,310,627,840 + 387,427,860,480 + 2,034,237,440
        total=15 * attn + 45 * gdn + 60 * moe_total + 2 * emb,
        kv=15 * 2 * 2 * 256 * 2,  # 30,720
        state=45 * (64 * 128 * 128 * 4 + 12288 * 3 * 2),  # 45 x 4,268,032 = 192,061,440
    )
    assert r["total_params"] == 396_345_589_760


# ---- Mamba2 hybrids and pure Mamba2

# a Mamba2 layer of H heads of dim P (di = H*P), state N, G groups, conv width 4:
#   d*(2*di + 2*G*N + H) + di*d + (di + 2*G*N)*4 + 3*H + di
# and its state: H*P*N in the config's dtype + (di + 2*G*N) conv channels x 3 columns


def test_mamba_codestral_7b_exact():
    r, s = _read("mamba-codestral-7b.json")
    # d 4096, 64 Mamba2 layers: H 128, P 64 -> di 8192, N 128, G 8; no MLP
    mamba = 4096 * (16384 + 2048 + 128) + 8192 * 4096 + (8192 + 2048) * 4 + 3 * 128 + 8192
    assert mamba == 76_021_760 + 33_554_432 + 40_960 + 384 + 8192 == 109_625_728
    emb = 32768 * 4096  # 134,217,728
    _check(
        r,
        s,
        fields=dict(n_mamba=64, mamba_version=2, mamba_heads=128, mamba_d_inner=8192, mamba_d_state=128)
        | dict(mamba_n_groups=8, mamba_conv_width=4, state_dtype_bytes=2, n_mlp=0, mlp_active_params=0)
        | dict(embedding_params=emb),
        total=64 * mamba + 2 * emb,  # 7,016,046,592 + 268,435,456
        kv=0,
        state=64 * (128 * 64 * 128 * 2 + (8192 + 2048) * 3 * 2),  # 64 x 2,158,592 = 138,149,888
    )
    assert r["total_params"] == 7_284_482_048
    assert "n_attn" not in r


def test_nemotron_h_8b_exact():
    r, s = _read("nemotron-h-8b.json")
    # pattern of 52 blocks: 24 M, 4 *, 24 -; d 4096
    attn = 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 32 * 128 * 4096  # 41,943,040
    mamba = 4096 * (16384 + 2048 + 128) + 8192 * 4096 + (8192 + 2048) * 4 + 3 * 128 + 8192  # 109,625,728
    mlp = 2 * 4096 * 21504  # squared ReLU, up and down: 176,160,768
    emb = 131072 * 4096  # 536,870,912
    assert (attn, mamba, mlp) == (41_943_040, 109_625_728, 176_160_768)
    _check(
        r,
        s,
        fields=dict(n_attn=4, attn_kv_heads=8, n_mamba=24, mamba_heads=128, mamba_n_groups=8, n_mlp=24)
        | dict(mlp_active_params=mlp, embedding_params=emb),
        total=4 * attn + 24 * mamba + 24 * mlp + 2 * emb,  # 167,772,160 + 2,631,017,472 + 4,227,858,432 + 1,073,741,824
        kv=4 * 2 * 8 * 128 * 2,  # 16,384
        # fp32 state (no mamba_ssm_cache_dtype: the engines' Nemotron-H default), bf16 conv
        state=24 * (128 * 64 * 128 * 4 + (8192 + 2048) * 3 * 2),  # 24 x 4,255,744 = 102,137,856
    )
    assert r["total_params"] == 8_100_389_888


def test_nemotron_h_56b_exact():
    r, s = _read("nemotron-h-56b.json")
    # pattern of 118 blocks: 54 M, 10 *, 54 -; d 8192; Mamba2 H 256, P 64 -> di 16384, N 256, G 8
    attn = 8192 * 64 * 128 + 2 * 8192 * 8 * 128 + 64 * 128 * 8192  # 150,994,944
    mamba = 8192 * (32768 + 4096 + 256) + 16384 * 8192 + (16384 + 4096) * 4 + 3 * 256 + 16384
    mlp = 2 * 8192 * 32768  # 536,870,912
    emb = 131072 * 8192  # 1,073,741,824
    assert (attn, mamba) == (150_994_944, 304_087_040 + 134_217_728 + 81_920 + 768 + 16_384)
    _check(
        r,
        s,
        fields=dict(n_attn=10, n_mamba=54, mamba_d_inner=16384, mamba_d_state=256, n_mlp=54, mlp_active_params=mlp)
        | dict(embedding_params=emb),
        # 1,509,949,440 + 23,673,807,360 + 28,991,029,248 + 2,147,483,648
        total=10 * attn + 54 * mamba + 54 * mlp + 2 * emb,
        kv=10 * 2 * 8 * 128 * 2,  # 40,960
        state=54 * (256 * 64 * 256 * 4 + (16384 + 4096) * 3 * 2),  # 54 x 16,900,096 = 912,605,184
    )
    assert r["total_params"] == 56_322_269_696


def test_toy_mamba2_hybrid_exact():
    r, s = _read("toy-mamba2-hybrid.json")
    # "M-M*-M": 3 M, 1 *, 2 -; d 64; Mamba2 H 4, P 32 -> di 128, N 16, G 2
    attn = 64 * 4 * 16 + 2 * 64 * 2 * 16 + 4 * 16 * 64  # 12,288
    mamba = 64 * (256 + 64 + 4) + 128 * 64 + (128 + 64) * 4 + 3 * 4 + 128  # 20,736 + 8,192 + 768 + 12 + 128
    mlp = 2 * 64 * 128  # 16,384
    assert (attn, mamba) == (12_288, 29_836)
    _check(
        r,
        s,
        fields=dict(n_attn=1, attn_heads=4, attn_kv_heads=2, attn_head_dim=16, n_mamba=3, mamba_n_groups=2)
        | dict(n_mlp=2, mlp_active_params=mlp, embedding_params=512 * 64),
        total=attn + 3 * mamba + 2 * mlp + 2 * 512 * 64,  # 12,288 + 89,508 + 32,768 + 65,536
        kv=2 * 2 * 16 * 2,  # 128
        state=3 * (4 * 32 * 16 * 4 + (128 + 64) * 3 * 2),  # fp32 state, bf16 conv: 3 x 9,344 = 28,032
    )
    assert r["total_params"] == 200_100


def test_falcon_h1_7b_exact():
    r, s = _read("falcon-h1-7b.json")
    # d 3072, 44 layers each with attention (12 heads of 128, 2 KV), Mamba2 (mamba_d_ssm 3072, H 24,
    # N 256, G 1) and a SwiGLU of 12288
    attn = 3072 * 12 * 128 + 2 * 3072 * 2 * 128 + 12 * 128 * 3072  # 11,010,048
    mamba = 3072 * (6144 + 512 + 24) + 3072 * 3072 + (3072 + 512) * 4 + 3 * 24 + 3072  # 29,975,624
    mlp = 3 * 3072 * 12288  # 113,246,208
    emb = 130049 * 3072  # 399,510,528
    assert (attn, mamba) == (11_010_048, 20_520_960 + 9_437_184 + 14_336 + 72 + 3_072)
    _check(
        r,
        s,
        fields=dict(n_attn=44, attn_heads=12, attn_head_dim=128, n_mamba=44, mamba_heads=24, mamba_d_inner=3072)
        | dict(mamba_d_state=256, mamba_n_groups=1, n_mlp=44, mlp_active_params=mlp, embedding_params=emb),
        total=44 * (attn + mamba + mlp) + 2 * emb,  # 44 x 154,231,880 + 799,021,056
        kv=44 * 2 * 2 * 128 * 2,  # 45,056
        state=44 * (24 * 128 * 256 * 2 + (3072 + 512) * 3 * 2),  # 44 x 1,594,368 = 70,152,192
    )
    assert r["total_params"] == 7_585_223_776


def test_granite_4_0_h_small_exact():
    r, s = _read("granite-4.0-h-small.json")
    # d 4096, 40 layers: 4 attention (32 heads, 8 KV; head dim 4096 / 32), 36 Mamba2 (H 128, P 64,
    # N 128, G 1); an MoE in every layer: 10 of 72 experts of 768, a shared expert of 1536
    attn = 4096 * 4096 + 2 * 4096 * 8 * 128 + 4096 * 4096  # 41,943,040
    mamba = 4096 * (16384 + 256 + 128) + 8192 * 4096 + (8192 + 256) * 4 + 3 * 128 + 8192  # 102,278,528
    moe_active = 3 * 4096 * 768 * 10 + 3 * 4096 * 1536 + 4096 * 72  # 94,371,840 + 18,874,368 + 294,912
    moe_total = 3 * 4096 * 768 * 72 + 3 * 4096 * 1536 + 4096 * 72  # 698,646,528
    emb = 100352 * 4096  # 411,041,792, tied: one table
    assert (mamba, moe_active, moe_total) == (102_278_528, 113_541_120, 698_646_528)
    _check(
        r,
        s,
        fields=dict(n_attn=4, attn_head_dim=128, n_mamba=36, mamba_d_inner=8192, mamba_n_groups=1, n_mlp=40)
        | dict(mlp_active_params=moe_active, embedding_params=emb),
        total=4 * attn
        + 36 * mamba
        + 40 * moe_total
        + emb,  # 167,772,160 + 3,682,027,008 + 27,945,861,120 + 411,041,792
        kv=4 * 2 * 8 * 128 * 2,  # 16,384
        state=36 * (128 * 64 * 128 * 2 + (8192 + 256) * 3 * 2),  # 36 x 2,147,840 = 77,322,240
    )
    assert r["total_params"] == 32_206_702_080


# ---- Mamba1 hybrid


def test_jamba_1_5_mini_exact():
    r, s = _read("jamba-1.5-mini.json")
    # d 4096, 32 layers; attention at i % 8 == 4 (4, 12, 20, 28), Mamba1 elsewhere (28): di 2 x 4096,
    # N 16, conv 4, dt rank 256; MoE at i % 2 == 1 (16 blocks: 2 of 16 experts), SwiGLU elsewhere
    attn = 4096 * 4096 + 2 * 4096 * 8 * 128 + 4096 * 4096  # 41,943,040
    # in_proj 67,108,864 + x_proj 8192 x 288 + dt_proj 256 x 8192 + out 33,554,432 + conv + A + D
    mamba = 4096 * 16384 + 8192 * (256 + 32) + 256 * 8192 + 8192 * 4096 + 8192 * 4 + 8192 * 16 + 8192
    dense = 3 * 4096 * 14336  # 176,160,768
    moe_active = 2 * dense + 4096 * 16  # 352,387,072
    moe_total = 16 * dense + 4096 * 16  # 2,818,637,824
    emb = 65536 * 4096  # 268,435,456
    assert mamba == 67_108_864 + 2_359_296 + 2_097_152 + 33_554_432 + 32_768 + 131_072 + 8192 == 105_291_776
    _check(
        r,
        s,
        fields=dict(n_attn=4, n_mamba=28, mamba_version=1, mamba_d_inner=8192, mamba_d_state=16, mamba_dt_rank=256)
        | dict(mamba_conv_width=4, n_mlp=32, embedding_params=emb, state_dtype_bytes=2)
        | dict(mlp_active_params=(16 * dense + 16 * moe_active) // 32),  # 264,273,920, a whole number
        # 167,772,160 + 2,948,169,728 + 2,818,572,288 + 45,098,205,184 + 536,870,912
        total=4 * attn + 28 * mamba + 16 * dense + 16 * moe_total + 2 * emb,
        kv=4 * 2 * 8 * 128 * 2,  # 16,384
        state=28 * (8192 * 16 * 2 + 8192 * 3 * 2),  # 28 x 311,296 = 8,716,288
    )
    assert r["total_params"] == 51_569_590_272 and r["mlp_active_params"] == 264_273_920


def test_every_fixture_has_an_exact_test():
    tested = {
        "llama-2-7b",
        "qwen3-next-80b-a3b",
        "qwen3.5-9b",
        "qwen3.5-27b",
        "qwen3.5-35b-a3b",
        "qwen3.5-397b-a17b",
        "mamba-codestral-7b",
        "nemotron-h-8b",
        "nemotron-h-56b",
        "toy-mamba2-hybrid",
        "falcon-h1-7b",
        "granite-4.0-h-small",
        "jamba-1.5-mini",
    }
    assert {p.stem for p in CONFIGS.glob("*.json")} == tested


# ---- the rules no published fixture exercises, on toy configs worked by hand


def _write(tmp_path, cfg: dict, name: str = "config.json") -> str:
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return str(p)


def _edit(name: str, **edits) -> dict:
    """Fixture ``name`` with ``edits`` (None drops a field; into ``text_config`` where there is one)."""
    cfg = json.loads((CONFIGS / name).read_text())
    inner = cfg.get("text_config", cfg)
    for k, v in edits.items():
        if v is None:
            inner.pop(k, None)
        else:
            inner[k] = v
    return cfg


def _toy_qwen(**edits) -> dict:
    """A toy Qwen3-Next: d 6, 4 layers, attention every 2nd (layers 1 and 3: 2 heads of 4, 1 KV
    head, output gate), gated delta elsewhere (1 key head of 2, 2 value heads of 3, conv 3); MoE
    every 2nd layer but layer 3 (4 experts of 5, top 2, a shared expert of 6), SwiGLU 7 elsewhere."""
    cfg = dict(
        model_type="qwen3_next",
        torch_dtype="bfloat16",
        hidden_size=6,
        num_hidden_layers=4,
        full_attention_interval=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=2,
        linear_value_head_dim=3,
        linear_conv_kernel_dim=3,
        intermediate_size=7,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=5,
        shared_expert_intermediate_size=6,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
        vocab_size=10,
    )
    cfg.update(edits)
    return {k: v for k, v in cfg.items() if v is not None}


# toy Qwen's pieces: attention 6*2*4*2 + 2*6*1*4 + 2*4*6 = 96 + 48 + 48 = 192; gated delta
# 6*(2*1*2 + 2*2*3) + 6*2*2 + 2*3*6 + (2*1*2 + 2*3)*3 = 96 + 24 + 36 + 30 = 186; SwiGLU 3*6*7 = 126;
# MoE active 3*6*5*2 + 3*6*6 + 6*4 = 180 + 108 + 24 = 312, total 3*6*5*4 + 108 + 24 = 492;
# MLP blocks: layer 0 dense ((0+1) % 2 != 0), 1 MoE, 2 dense, 3 dense (mlp_only_layers)
_Q_ATTN, _Q_GDN, _Q_DENSE, _Q_MOE_ACT, _Q_MOE_TOT, _Q_EMB = 192, 186, 126, 312, 492, 60


def test_toy_qwen_sparse_step_and_mlp_only_layers(tmp_path):
    path = _write(tmp_path, _toy_qwen())
    r, s = read_config(path), get_model(path)
    assert (r["n_attn"], r["n_gdn"], r["n_mlp"]) == (2, 2, 4)
    # the mean active width (3 x 126 + 312) / 4 = 690 / 4 = 172.5 is no whole number: kept exact
    assert r["mlp_active_params"] == 172.5
    # 2 x 192 + 2 x 186 + 3 x 126 + 492 + 2 x 60 = 384 + 372 + 378 + 492 + 120
    assert r["total_params"] == 2 * _Q_ATTN + 2 * _Q_GDN + 3 * _Q_DENSE + _Q_MOE_TOT + 2 * _Q_EMB == 1746
    assert s.kv_bytes_per_token() == 2 * 2 * 1 * 4 * 2 == 32
    # per GDN layer: 2 x 2 x 3 fp32 state + (4 + 6) conv channels x 2 columns bf16 = 48 + 40
    assert s.state_bytes() == 2 * (2 * 2 * 3 * 4 + 10 * 2 * 2) == 176


def test_toy_qwen_layer_types_and_every_layer_moe(tmp_path):
    """``layer_types`` in place of the interval reads the same layers; with the sparse step 1 and
    no dense-only layer every block is an MoE (a whole-number mean: an int)."""
    kinds = ["linear_attention", "full_attention"] * 2
    r = read_config(_write(tmp_path, _toy_qwen(layer_types=kinds, full_attention_interval=None)))
    assert (r["n_attn"], r["n_gdn"], r["total_params"]) == (2, 2, 1746)
    r = read_config(_write(tmp_path, _toy_qwen(decoder_sparse_step=1, mlp_only_layers=None)))
    assert r["mlp_active_params"] == _Q_MOE_ACT and type(r["mlp_active_params"]) is int
    assert r["total_params"] == 2 * _Q_ATTN + 2 * _Q_GDN + 4 * _Q_MOE_TOT + 2 * _Q_EMB  # 2724
    # attention on layers 0 and 2 instead: the same counts, so the same numbers
    r = read_config(_write(tmp_path, _toy_qwen(layer_types=kinds[::-1], full_attention_interval=None)))
    assert (r["n_attn"], r["total_params"]) == (2, 1746)


def test_toy_qwen_dense_gate_kv_heads_and_conv_defaults(tmp_path):
    # no experts: four SwiGLU blocks of 126 (an int), 384 + 372 + 504 + 120
    r = read_config(_write(tmp_path, _toy_qwen(num_experts=None)))
    assert r["mlp_active_params"] == _Q_DENSE and type(r["mlp_active_params"]) is int
    assert r["total_params"] == 1380
    # no output gate: q is 6*2*4 = 48 wide, not 96 -> 2 x 48 fewer weights
    r = read_config(_write(tmp_path, _toy_qwen(attn_output_gate=False)))
    assert (r["attn_output_gate"], r["total_params"]) == (False, 1746 - 2 * 48)
    # no num_key_value_heads: as many KV heads as heads (2): k, v 2*6*2*4 = 96, not 48
    path = _write(tmp_path, _toy_qwen(num_key_value_heads=None))
    assert read_config(path)["total_params"] == 1746 + 2 * 48
    assert get_model(path).kv_bytes_per_token() == 2 * 2 * 2 * 4 * 2 == 64
    # no conv width: 4 (one more column of 10 channels per GDN layer, in the weights and the state)
    path = _write(tmp_path, _toy_qwen(linear_conv_kernel_dim=None))
    assert read_config(path)["gdn_conv_width"] == 4 and read_config(path)["total_params"] == 1746 + 2 * 10
    assert get_model(path).state_bytes() == 2 * (48 + 10 * 3 * 2) == 216


def test_toy_qwen_dtypes(tmp_path):
    # a bf16 recurrent state: 2 x (2*2*3*2 + 40) = 128
    path = _write(tmp_path, _toy_qwen(mamba_ssm_dtype="bfloat16"))
    assert read_config(path)["state_dtype_bytes"] == 2 and get_model(path).state_bytes() == 128
    # an fp8 checkpoint: KV and conv in one byte, the state still fp32: 2 x (48 + 10*2*1) = 136
    path = _write(tmp_path, _toy_qwen(torch_dtype="float8_e4m3fn"))
    r, s = read_config(path), get_model(path)
    assert (r["kv_dtype_bytes"], r["conv_dtype_bytes"], r["state_dtype_bytes"]) == (1, 1, 4)
    assert (s.kv_bytes_per_token(), s.state_bytes()) == (16, 136)
    # an fp32 checkpoint ("torch.float32" as some exports spell it) is served in bf16 (vLLM's and
    # SGLang's --dtype auto): KV and conv at 2 bytes as the bf16 toy's (it priced 4, 64 B a token),
    # the gated-delta state still fp32: 2 x (48 + 10*2*2) = 176, and the spec says so
    bf16 = get_model(_write(tmp_path, _toy_qwen(), name="bf16.json"))
    path = _write(tmp_path, _toy_qwen(torch_dtype="torch.float32"))
    r, s = read_config(path), get_model(path)
    assert (r["kv_dtype_bytes"], r["conv_dtype_bytes"], r["state_dtype_bytes"]) == (2, 2, 4)
    assert (s.kv_bytes_per_token(), s.state_bytes()) == (bf16.kv_bytes_per_token(), bf16.state_bytes()) == (32, 176)
    assert (s.dtype, s.dtype_note, bf16.dtype, bf16.dtype_note) == (
        "bf16",
        "fp32 checkpoint served in bf16",
        "bf16",
        "",
    )
    assert get_model(_write(tmp_path, _toy_qwen(torch_dtype="float16"))).dtype == "fp16"


def test_qwen3_5_wrapper_fields_outside_text_config(tmp_path):
    """A dtype and ``tie_word_embeddings`` given beside ``text_config`` (not inside) are read."""
    cfg = _edit("qwen3.5-9b.json", dtype=None)
    cfg["torch_dtype"], cfg["tie_word_embeddings"] = "float32", True
    r = read_config(_write(tmp_path, cfg))
    # read from beside text_config: an fp32 checkpoint, served in bf16 (KV 2 bytes; the gated-delta
    # state fp32 as always)
    assert (r["kv_dtype_bytes"], r["state_dtype_bytes"], r["dtype_note"]) == (2, 4, "fp32 checkpoint served in bf16")
    # one vocabulary table fewer than test_qwen3_5_9b_exact: 8,953,528,320 - 1,017,118,720
    assert r["total_params"] == 8_953_528_320 - 248320 * 4096 == 7_936_409_600


def _toy_nemotron(**edits) -> dict:
    """A toy Nemotron-H with MoE blocks (Nemotron 3's ``E``): d 4, "ME*E-"; attention 2 heads of
    2, 1 KV head; Mamba2 2 heads of 4 (di 8), N 3, 2 groups, conv 3; squared-ReLU MLP 5; MoE of
    4 experts of 3, top 2, a shared expert of 6; 7 tokens, tied."""
    cfg = dict(
        model_type="nemotron_h",
        torch_dtype="bfloat16",
        hidden_size=4,
        num_hidden_layers=5,
        hybrid_override_pattern="ME*E-",
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=2,
        mamba_num_heads=2,
        mamba_head_dim=4,
        ssm_state_size=3,
        n_groups=2,
        conv_kernel=3,
        intermediate_size=5,
        moe_intermediate_size=3,
        num_experts_per_tok=2,
        n_routed_experts=4,
        moe_shared_expert_intermediate_size=6,
        vocab_size=7,
        tie_word_embeddings=True,
    )
    cfg.update(edits)
    return {k: v for k, v in cfg.items() if v is not None}


def test_toy_nemotron_moe_blocks(tmp_path):
    path = _write(tmp_path, _toy_nemotron())
    r, s = read_config(path), get_model(path)
    assert (r["n_attn"], r["n_mamba"], r["n_mlp"]) == (1, 1, 3)
    attn = 4 * 2 * 2 + 2 * 4 * 1 * 2 + 2 * 2 * 4  # 16 + 16 + 16 = 48
    mamba = 4 * (16 + 12 + 2) + 8 * 4 + (8 + 12) * 3 + 3 * 2 + 8  # 120 + 32 + 60 + 6 + 8 = 226
    mlp = 2 * 4 * 5  # 40
    moe_act = 2 * 4 * 3 * 2 + 2 * 4 * 6 + 4 * 4  # 48 + 48 + 16 = 112
    moe_tot = 2 * 4 * 3 * 4 + 2 * 4 * 6 + 4 * 4  # 96 + 48 + 16 = 160
    assert r["mlp_active_params"] == (mlp + 2 * moe_act) // 3 == 88  # 264 / 3
    assert r["total_params"] == attn + mamba + mlp + 2 * moe_tot + 7 * 4 == 662  # one table (tied)
    assert (r["mamba_d_inner"], r["mamba_n_groups"], r["mamba_conv_width"]) == (8, 2, 3)
    assert s.kv_bytes_per_token() == 2 * 1 * 2 * 2 == 8
    assert s.state_bytes() == 2 * 4 * 3 * 4 + (8 + 12) * 2 * 2 == 176  # fp32 state 96 + bf16 conv 80


def test_toy_nemotron_defaults_and_state_dtype(tmp_path):
    # no shared expert (0): MoE 48 + 16 = 64 active, 96 + 16 = 112 in all; (40 + 128) / 3 = 56
    r = read_config(_write(tmp_path, _toy_nemotron(moe_shared_expert_intermediate_size=0)))
    assert r["mlp_active_params"] == 56 and r["total_params"] == 662 - 2 * 48
    # left out: NemotronHConfig's 7688 (it read none): 2*4*7688 = 61,504 a block in place of 48
    r = read_config(_write(tmp_path, _toy_nemotron(moe_shared_expert_intermediate_size=None)))
    assert r["mlp_active_params"] == (40 + 2 * (64 + 61_504)) / 3
    assert r["total_params"] == 662 - 2 * 48 + 2 * 61_504
    # no conv width: 4 -> Mamba 4*(16 + 12 + 2) + 32 + (8 + 12)*4 + 6 + 8 = 246
    path = _write(tmp_path, _toy_nemotron(conv_kernel=None))
    r = read_config(path)
    assert (r["mamba_n_groups"], r["mamba_conv_width"], r["total_params"]) == (2, 4, 662 - 226 + 246)
    assert get_model(path).state_bytes() == 96 + (8 + 12) * 3 * 2 == 216
    # no groups: NemotronHConfig's default, 8, which the 2 heads cannot split (refused, said so);
    # with 8 heads of 1 (di 8 as before) -> Mamba 4*(16 + 48 + 8) + 32 + (8 + 48)*3 + 24 + 8 = 520
    with pytest.raises(UsageError, match="'n_groups' is left out, and nemotron_h's default of 8 groups"):
        read_config(_write(tmp_path, _toy_nemotron(n_groups=None)))
    r = read_config(_write(tmp_path, _toy_nemotron(n_groups=None, mamba_num_heads=8, mamba_head_dim=1)))
    assert (r["mamba_n_groups"], r["total_params"]) == (8, 662 - 226 + 520)
    # the state's dtype named by the config (either spelling): bf16, 2*4*3*2 = 48 + conv 80
    for field in ("mamba_ssm_dtype", "mamba_ssm_cache_dtype"):
        path = _write(tmp_path, _toy_nemotron(**{field: "bfloat16"}))
        assert read_config(path)["state_dtype_bytes"] == 2 and get_model(path).state_bytes() == 128
        assert get_model(path).state_note == ""
    # none named: fp32 (vLLM's Nemotron-H default for --mamba-ssm-cache-dtype auto, SGLang's
    # --mamba-ssm-dtype), whatever the checkpoint's dtype: an fp32 checkpoint served in bf16 keeps
    # 96 + conv 80, an fp8 one 96 + conv 40 (KV and conv in one byte)
    path = _write(tmp_path, _toy_nemotron(torch_dtype="float32"))
    assert (get_model(path).kv_bytes_per_token(), get_model(path).state_bytes()) == (8, 176)
    path = _write(tmp_path, _toy_nemotron(torch_dtype="float32", mamba_ssm_dtype="float32"))
    assert (get_model(path).kv_bytes_per_token(), get_model(path).state_bytes()) == (8, 176)
    path = _write(tmp_path, _toy_nemotron(torch_dtype="fp8"))
    assert (get_model(path).kv_bytes_per_token(), get_model(path).state_bytes()) == (4, 96 + 40)


def test_jamba_without_experts_and_bad_periods(tmp_path):
    # one expert is no MoE: 32 SwiGLU blocks (test_jamba_1_5_mini_exact's pieces)
    r = read_config(_write(tmp_path, _edit("jamba-1.5-mini.json", num_experts=1)))
    dense = 3 * 4096 * 14336
    assert r["mlp_active_params"] == dense
    assert r["total_params"] == 4 * 41_943_040 + 28 * 105_291_776 + 32 * dense + 2 * 65536 * 4096
    # attention every 4th layer from 1: 1, 5, ..., 29 -> 8 attention, 24 Mamba
    r = read_config(_write(tmp_path, _edit("jamba-1.5-mini.json", attn_layer_period=4, attn_layer_offset=1)))
    assert (r["n_attn"], r["n_mamba"]) == (8, 24)
    for field in ("attn_layer_period", "expert_layer_period"):
        with pytest.raises(UsageError, match="must be >= 1"):
            read_config(_write(tmp_path, _edit("jamba-1.5-mini.json", **{field: 0})))


def test_falcon_h1_d_inner_from_heads_without_mamba_d_ssm(tmp_path):
    # heads of 64: mamba_d_ssm 3072 is kept where given, 24 x 64 = 1536 without it
    r = read_config(_write(tmp_path, _edit("falcon-h1-7b.json", mamba_d_head=64)))
    assert r["mamba_d_inner"] == 3072
    path = _write(tmp_path, _edit("falcon-h1-7b.json", mamba_d_head=64, mamba_d_ssm=None))
    assert read_config(path)["mamba_d_inner"] == 1536
    assert get_model(path).state_bytes() == 44 * (1536 * 256 * 2 + (1536 + 512) * 3 * 2)  # 44 x 798,720


def test_granite_dense_all_attention_and_other_spellings(tmp_path):
    # no experts (0: Granite 4.0 H 1B's): a dense SwiGLU of shared_intermediate_size (1536), else
    # intermediate_size (768)
    r = read_config(_write(tmp_path, _edit("granite-4.0-h-small.json", num_local_experts=0)))
    assert r["mlp_active_params"] == 3 * 4096 * 1536
    cfg = _edit("granite-4.0-h-small.json", num_local_experts=0, shared_intermediate_size=None)
    assert read_config(_write(tmp_path, cfg))["mlp_active_params"] == 3 * 4096 * 768
    # the older spelling layers_block_type reads the same
    cfg = _edit("granite-4.0-h-small.json")
    cfg["layers_block_type"] = cfg.pop("layer_types")
    assert read_config(_write(tmp_path, cfg))["total_params"] == 32_206_702_080
    # every layer attention: no Mamba fields, no state
    path = _write(tmp_path, _edit("granite-4.0-h-small.json", layer_types=["attention"] * 40))
    r = read_config(path)
    assert r["n_attn"] == 40 and "n_mamba" not in r and get_model(path).state_bytes() == 0
    assert r["total_params"] == 40 * 41_943_040 + 40 * 698_646_528 + 100352 * 4096


def test_mamba2_groups_default_to_the_config_class(tmp_path):
    # Mamba2Config's n_groups is 8 when left out (1 priced 2 of Codestral's 8 x 128 x 2 B/C channels)
    path = _write(tmp_path, _edit("mamba-codestral-7b.json", n_groups=None))
    r = read_config(path)
    # G 8: in_proj 4096*(16384 + 2048 + 128), conv (8192 + 2048)*4
    mamba = 4096 * (16384 + 2048 + 128) + 8192 * 4096 + (8192 + 2048) * 4 + 3 * 128 + 8192
    assert r["mamba_n_groups"] == 8 and r["total_params"] == 64 * mamba + 2 * 32768 * 4096
    assert get_model(path).state_bytes() == 64 * (128 * 64 * 128 * 2 + (8192 + 2048) * 3 * 2) == 138_149_888
    # Falcon-H1's and Granite's config classes take 1
    r = read_config(_write(tmp_path, _edit("falcon-h1-7b.json", mamba_n_groups=None)))
    assert r["mamba_n_groups"] == 1


@pytest.mark.parametrize(
    "cfg, message",
    [
        (_toy_qwen(layer_types=["full_attention"] * 3), "must list 4 layers"),
        (_toy_qwen(layer_types=["full_attention"] * 3 + ["sliding_attention"]), "unknown type 'sliding_attention'"),
        (_toy_qwen(num_attention_heads=0), "'num_attention_heads' > 0"),
        (_toy_qwen(hidden_size=True), "'hidden_size' must be a whole number"),
        (_toy_qwen(hidden_size=6.5), "'hidden_size' must be a whole number"),
        (_toy_qwen(num_experts=-1), "'num_experts' must be a whole number"),
        (_toy_qwen(full_attention_interval=0), "'full_attention_interval' must be >= 1"),
        (_toy_nemotron(hybrid_override_pattern="ME*E"), "must have 5 characters"),
    ],
)
def test_bad_toy_configs(tmp_path, cfg, message):
    with pytest.raises(UsageError, match=message):
        read_config(_write(tmp_path, cfg))


def test_granite_bad_layer_types(tmp_path):
    for types, message in ((["mamba"] * 39, "must list 40 layers"), (["mamba"] * 39 + ["mamba3"], "'mamba3'")):
        with pytest.raises(UsageError, match=message):
            read_config(_write(tmp_path, _edit("granite-4.0-h-small.json", layer_types=types)))


def test_whole_float_fields_are_read_as_ints(tmp_path):
    r = read_config(_write(tmp_path, _toy_qwen(hidden_size=6.0, vocab_size=10.0)))
    assert (r["d_model"], r["embedding_params"], r["total_params"]) == (6, 60, 1746)
    assert type(r["d_model"]) is int


def test_older_field_names_and_which_one_wins(tmp_path):
    """``d_model`` / ``n_layer`` (the names of mamba_ssm's configs) where the Hugging Face names are
    absent; where both are present the Hugging Face name wins."""
    cfg = _edit("mamba-codestral-7b.json", hidden_size=None, num_hidden_layers=None)
    cfg.update(d_model=4096, n_layer=64)
    assert read_config(_write(tmp_path, cfg))["total_params"] == 7_284_482_048
    # both: 64 layers as num_hidden_layers says (n_layer 2 is ignored), hidden_size 4096 over d_model 8
    cfg = _edit("mamba-codestral-7b.json", n_layer=2, n_layers=3, d_model=8)
    r = read_config(_write(tmp_path, cfg))
    assert (r["n_mamba"], r["d_model"], r["total_params"]) == (64, 4096, 7_284_482_048)
    cfg = _edit("mamba-codestral-7b.json", num_hidden_layers=None, n_layers=2, n_layer=None)
    assert read_config(_write(tmp_path, cfg))["n_mamba"] == 2
