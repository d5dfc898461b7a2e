"""A model from its Hugging Face ``config.json``: the fields of a ``sim.cost.ModelSpec``.

``read_config(path)`` reads a ``config.json`` (or a folder holding one) of the hybrid families in
use today and returns the keyword arguments of ``ModelSpec`` (``sim.cost.get_model`` builds the
spec; this module sits below ``sim.cost`` and imports nothing of it):

* ``qwen3_next``, ``qwen3_5`` / ``qwen3_5_moe`` (a ``text_config`` inside): gated-delta linear
  attention and output-gated full attention (``layer_types`` or ``full_attention_interval``),
  dense SwiGLU or MoE (routed top-k + shared expert + router) per ``decoder_sparse_step`` /
  ``mlp_only_layers``;
* ``nemotron_h``: ``hybrid_override_pattern``, one block a character: ``M`` Mamba2, ``*``
  attention, ``-`` MLP (squared ReLU: up and down only), ``E`` MoE (or transformers' list of
  them, ``layers_block_type``);
* ``jamba``: attention every ``attn_layer_period`` from ``attn_layer_offset``, Mamba (v1) elsewhere;
  MoE every ``expert_layer_period`` from ``expert_layer_offset``, a dense SwiGLU elsewhere;
* ``falcon_h1``: attention and Mamba2 side by side in every layer, then a SwiGLU MLP;
* ``granitemoehybrid`` (Granite 4.0): ``layer_types`` of ``mamba`` / ``attention``, each layer
  with an MoE block (experts + shared expert) or a dense one when there are no experts;
* ``mamba2`` (Codestral Mamba): Mamba2 layers only, no MLP;
* ``llama`` and its plain relatives (``mistral``, ``qwen2``, ``qwen3``): attention + SwiGLU;
* ``qwen3_moe`` and ``mixtral``: attention + MoE of SwiGLU experts (no shared expert), no
  recurrent layer: priced as the dense models are, for comparison.

Conventions (docs/models.md): a field left out takes its family's transformers default
(``_FAMILY_DEFAULTS``); the KV cache takes the dtype the engines serve the config's in (bf16 /
fp16: 2 bytes; an fp32 checkpoint is served in bf16, vLLM's and SGLang's ``--dtype auto``); a
Mamba conv window takes it too; the recurrent state is fp32 for gated delta (what the Qwen presets
keep) and Nemotron-H (``NEMOTRON_H_STATE_NOTE``), the served dtype for the other Mamba families
(vLLM's ``--mamba-ssm-cache-dtype auto``), unless the config names one (``mamba_ssm_dtype``,
``mamba_ssm_cache_dtype``). MoE blocks of different widths in one model (Jamba: MoE every other
layer) are averaged over the MLP blocks, which keeps every per-token FLOP and byte exact. A
missing field or an unknown family is one ``UsageError`` line naming it; so is a width, count or
period of 0 (0 Mamba heads priced a model doing no work), heads that do not split into their
groups, and a Jamba offset past its period (no such layer at all).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from sim.errors import UsageError

_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}
_FP8 = ("float8", "fp8")
#: what `marconi models` says of a Nemotron-H whose config names no state dtype: the engines keep its
#: Mamba state in fp32 (vLLM: NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE, "only float32
#: is known to have no accuracy issues", for --mamba-ssm-cache-dtype auto; SGLang: --mamba-ssm-dtype
#: float32), not in the model dtype as for the other Mamba families
NEMOTRON_H_STATE_NOTE = (
    "Mamba state in fp32: no mamba_ssm_cache_dtype in the config, and vLLM (its Nemotron-H default for "
    "--mamba-ssm-cache-dtype auto) and SGLang (--mamba-ssm-dtype float32) keep it so"
)
#: a 16-bit dtype's short name (what a timing file and the outputs call it)
_DTYPE_NAMES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16"}
#: the largest config.json read (published ones are a few kB; a layer list of 1,000 layers ~20 kB)
MAX_CONFIG_BYTES = 16 * 2**20
#: the largest width or count a config field may hold (int32's: no model comes near it)
MAX_FIELD = 2**31 - 1
FAMILIES = (
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "nemotron_h",
    "jamba",
    "falcon_h1",
    "granitemoehybrid",
    "mamba2",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
)


def config_file(path, presets=()) -> Path:
    """``path`` itself, or the ``config.json`` inside it when it is a folder. A Hugging Face repo
    id (``Qwen/Qwen3.5-27B``) that is no file or folder here is one line saying it is not fetched,
    naming the preset of that model where ``presets`` has one."""
    _refuse_hub_id(str(path), presets)
    p = Path(path)
    if p.is_dir() and p.name == "config.json":  # a folder named config.json holds no settings
        raise UsageError(f"model config {path}: a folder, not a file (give the config.json file itself)")
    if p.is_dir():
        if not (p / "config.json").exists():
            raise UsageError(f"model config {path}: the folder holds no config.json (give its config.json)")
        p = p / "config.json"
    if p.is_dir():
        raise UsageError(f"model config {p}: a folder, not a file (give the config.json file itself)")
    if not p.is_file():
        raise UsageError(f"model config {path}: no such file (give a config.json or a folder holding one)")
    return p


def _refuse_hub_id(name: str, presets) -> None:
    repo, what = name.strip(), "a Hugging Face repo id"
    if "://" in name and not Path(name).exists():  # a URL: the Hub's page of a config.json, hf://...
        hub = re.fullmatch(r"\s*(?:https?://(?:www\.)?huggingface\.co|hf:/)/([\w.-]+)/([\w.-]+)(?:/.*)?", name)
        if hub is None or hub[1] in ("datasets", "spaces"):
            raise UsageError(
                f"model {name!r} is a URL, and nothing is fetched: download the config.json and give its path"
            )
        repo, what = f"{hub[1]}/{hub[2]}", "a Hugging Face URL"
    m = re.fullmatch(r"([A-Za-z0-9][\w.-]*)/([A-Za-z0-9][\w.-]*)", repo)
    if m is None or (
        what != "a Hugging Face URL" and (name.endswith(".json") or Path(m[1]).is_dir() or Path(name).exists())
    ):
        return  # a path (in a folder here, or a file): its own error, if any
    # the preset of that model: the longest preset name in the repo's ("...-Instruct", "AI21-...")
    preset = max((k for k in presets if k in m[2].lower()), key=len, default=None)
    use = f"use the preset {preset!r}, or " if preset else ""
    raise UsageError(
        f"model {name!r} is no file or folder here, and {what} is not fetched: {use}download "
        f"its config.json (huggingface-cli download {repo} config.json) and give that path"
    )


def looks_like_path(name: str) -> bool:
    """A --model value that names a file or folder rather than a preset."""
    s = str(name)
    return s.endswith(".json") or "/" in s or "\\" in s or Path(s).is_dir()


class _Fields:
    """The config's fields; a missing one is one line naming it."""

    def __init__(self, d: dict, where: str, family: str):
        self.d, self.where, self.family = d, where, family

    def need(self, *names):
        for n in names:
            if n in self.d and self.d[n] is not None:
                return self.d[n]
        raise UsageError(f"model config {self.where}: {self.family} needs field {names[0]!r}")

    def get(self, name, default=None):
        v = self.d.get(name)
        return default if v is None else v

    def flag(self, name: str, default: bool, d: dict | None = None) -> bool:
        """A true / false field (``d``: the dict to read, the fields' own by default): a string such
        as "false" is refused, not read as true."""
        v = (self.d if d is None else d).get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise UsageError(f"model config {self.where}: field {name!r} must be true or false, not {v!r}")
        return v

    def types(self, types, layers: int, known: tuple, field: str = "layer_types") -> list:
        """A ``layer_types`` list (or another ``field``): ``layers`` entries, each one of the
        ``known`` names."""
        if not isinstance(types, list) or len(types) != layers:
            what = f"{layers} layers" if layers >= 0 else "a layer type a layer"
            raise UsageError(f"model config {self.where}: field {field!r} must list {what}")
        bad = [t for t in types if not isinstance(t, str) or t not in known]
        if bad:
            raise UsageError(
                f"model config {self.where}: field {field!r} has unknown type {bad[0]!r} (known: {', '.join(known)})"
            )
        return types

    def int(self, *names, default=None, low: int = 0) -> int:
        """A whole number in ``low``..``MAX_FIELD`` (the message states ``low``: a field that must
        be >= 1 says so for -5 too)."""
        v = self.need(*names) if default is None else self.get(names[0], default)
        bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        if bad or int(v) != v or v < 0:  # NaN / Infinity (json reads them) have no int()
            raise UsageError(
                f"model config {self.where}: field {names[0]!r} must be a whole number >= {low}, not {v!r}"
            )
        if v > MAX_FIELD:  # a vocabulary of 1e30 describes no model (it ran, on 64 GPUs)
            raise UsageError(
                f"model config {self.where}: field {names[0]!r} is {v:,.0f}: more than any model has "
                f"(at most {MAX_FIELD:,})"
            )
        return int(v)

    def pos(self, *names, default=None) -> int:
        """A width, count or period: a whole number >= 1 (0 heads or a 0-wide state priced a
        model with no such layer, or one that does no work)."""
        v = self.int(*names, default=default, low=1)
        if v < 1:
            raise UsageError(f"model config {self.where}: field {names[0]!r} must be >= 1, not {v}")
        return v

    def divides(self, small: str, a: int, big: str, b: int) -> None:
        """Field ``small`` (value ``a``) must divide field ``big`` (value ``b``): each of ``a`` groups
        holds a whole share of the ``b`` heads."""
        if b % a:
            raise UsageError(f"model config {self.where}: field {small!r} ({a}) must divide {big!r} ({b})")


def _dtype_bytes(name, where: str, field: str) -> int:
    s = str(name).lower().replace("torch.", "")
    if s.startswith(_FP8):
        return 1
    if s not in _DTYPE_BYTES:
        raise UsageError(
            f"model config {where}: field {field!r} names dtype {name!r}, not one of float32, bfloat16, float16"
        )
    return _DTYPE_BYTES[s]


def _quantized(q) -> tuple[str, int] | None:
    """A ``quantization_config``'s weights: (what to call them, bits a weight), or None where it
    names none this reader knows (the weights are then priced as bf16, and said to be)."""
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method") or "").lower()

    def bits(v) -> int | None:
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v in (2, 3, 4, 8) else None

    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", 8
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "hqq") and bits(q.get("bits")):
        return f"int{bits(q['bits'])}", bits(q["bits"])
    if method == "bitsandbytes":
        return ("4-bit", 4) if q.get("load_in_4bit") else ("int8", 8) if q.get("load_in_8bit") else None
    if method == "mxfp4":
        return "mxfp4", 4
    if method == "modelopt":
        algo = str(q.get("quant_algo") or "").upper()
        return (
            ("fp8", 8) if algo == "FP8" else ("nvfp4", 4) if algo == "NVFP4" else ("int4", 4) if "W4A" in algo else None
        )
    if method == "compressed-tensors":
        groups = q.get("config_groups")
        for group in groups.values() if isinstance(groups, dict) else ():
            w = group.get("weights") if isinstance(group, dict) else None
            if isinstance(w, dict) and bits(w.get("num_bits")):
                n = bits(w["num_bits"])
                return f"{'fp' if w.get('type') == 'float' else 'int'}{n}", n
    return None


def _moe(d: int, inter: int, top_k: int, shared_inter: int, n_experts: int) -> int:
    """Active parameters of one MoE block per token: top-k SwiGLU experts, a shared SwiGLU expert
    and the linear router (as ``sim.cost._moe``)."""
    return 3 * d * inter * top_k + 3 * d * shared_inter + d * n_experts


def _moe_total(d: int, inter: int, shared_inter: int, n_experts: int) -> int:
    return 3 * d * inter * n_experts + 3 * d * shared_inter + d * n_experts


def _mlp_fields(blocks: list[tuple[int, int]]) -> dict:
    """``blocks``: (active, total) parameters of each MLP / MoE block; the spec takes their mean
    active width (a whole number where they are equal), and ``mlp_moe`` where any block has more
    weights than it runs a token through (its experts)."""
    if not blocks:
        return {"n_mlp": 0, "mlp_active_params": 0}, 0
    act = sum(a for a, _ in blocks)
    n = len(blocks)
    mean = act // n if act % n == 0 else act / n
    # a block whose weights are more than it runs a token through is a mixture of experts
    moe = any(t > a for a, t in blocks)
    return {"n_mlp": n, "mlp_active_params": mean, "mlp_moe": moe}, sum(t for _, t in blocks)


def _attn_params(d, heads, kv, hd, gate=False) -> int:
    return d * heads * hd * (2 if gate else 1) + 2 * d * kv * hd + heads * hd * d


#: each family's config.json names of its Mamba2 mixer's heads, head dim, state, groups and conv
#: width (the first name present is read; groups default to 1 or the family's
#: ``_FAMILY_DEFAULTS``, the conv width to 4)
_MAMBA2_FIELDS = {
    "nemotron_h": (
        ("mamba_num_heads",),
        ("mamba_head_dim",),
        ("ssm_state_size", "mamba_state_dim"),
        ("n_groups", "mamba_n_groups"),
        ("conv_kernel", "mamba_d_conv"),
    ),
    "falcon_h1": (("mamba_n_heads",), ("mamba_d_head",), ("mamba_d_state",), ("mamba_n_groups",), ("mamba_d_conv",)),
    "mamba2": (("num_heads",), ("head_dim",), ("state_size",), ("n_groups",), ("conv_kernel",)),
}
_MAMBA2_FIELDS["granitemoehybrid"] = _MAMBA2_FIELDS["falcon_h1"]

#: Nemotron-H's blocks as its pattern's characters, by the names transformers' NemotronHConfig lists
#: them in ``layers_block_type`` (``mamba`` / ``attention``: the names before its rename)
_NEMOTRON_BLOCKS = {
    "mamba": "M",
    "linear_attention": "M",
    "attention": "*",
    "full_attention": "*",
    "mlp": "-",
    "moe": "E",
}

#: what a family's transformers config class takes for a field the config.json leaves out, where
#: that differs from the generic rule (KV heads: the heads; head dim: hidden / heads; Mamba
#: groups: 1; an MoE block's shared expert, ``shared``: none). Nemotron-H's head dim is
#: ``head_dim`` or (NVIDIA's own config class) ``attention_head_dim``, 128 when neither is given:
#: hidden / heads is 96 for Nemotron-H 4B.
_FAMILY_DEFAULTS = {
    "qwen3_next": {"head_dim": 256, "num_key_value_heads": 2, "shared": 512},
    "qwen3_5": {"head_dim": 256, "num_key_value_heads": 4},
    "qwen3_5_moe": {"head_dim": 256, "num_key_value_heads": 2, "shared": 512},
    "nemotron_h": {"head_dim": 128, "num_key_value_heads": 8, "n_groups": 8, "shared": 7688},
    # GraniteMoeHybridConfig: 8 experts, top-2 (0 given: a dense model, the shared MLP alone)
    "granitemoehybrid": {"shared": 1024, "experts": 8, "top_k": 2},
    "jamba": {"num_key_value_heads": 8},
    "falcon_h1": {"num_key_value_heads": 8},
    "mamba2": {"n_groups": 8},
    # attention-only MoE: Qwen3MoeConfig (4 KV heads; 128 experts, top-8, every layer sparse) and
    # MixtralConfig (8 KV heads; 8 experts, top-2)
    "qwen3_moe": {"num_key_value_heads": 4, "experts": 128, "top_k": 8},
    "mixtral": {"num_key_value_heads": 8, "experts": 8, "top_k": 2},
}


def _mamba2(f: _Fields, family: str, d: int, n: int, d_inner=None) -> tuple[dict, int]:
    """``n`` Mamba2 layers of a ``family`` config: their ``ModelSpec`` fields (``n_mamba`` and the
    mixer's shape; ``d_inner``: heads x head dim unless given) and their weights."""
    heads, head_dim, state, groups, conv = _MAMBA2_FIELDS[family]
    n_heads = f.pos(*heads)
    if d_inner and all(f.d.get(h) in (None, "auto") for h in head_dim):
        # head dim left out or "auto" (Falcon-H1's and Granite's config classes): the family's
        # intermediate width over the heads
        if d_inner % n_heads:
            raise UsageError(
                f"model config {f.where}: field {head_dim[0]!r} is "
                f"{'auto' if f.d.get(head_dim[0]) == 'auto' else 'left out'}, and {heads[0]!r} ({n_heads}) does not "
                f"divide the Mamba width ({d_inner}): give it"
            )
        hdim = d_inner // n_heads
    else:
        hdim = f.pos(*head_dim)
    di = int(d_inner) if d_inner else n_heads * hdim
    given = next((g for g in groups if g in f.d), None)
    n_groups = f.pos(*groups) if given else _FAMILY_DEFAULTS.get(family, {}).get("n_groups", 1)
    if given is None and n_heads % n_groups:
        raise UsageError(
            f"model config {f.where}: field {groups[0]!r} is left out, and {family}'s default of {n_groups} groups "
            f"does not divide {heads[0]!r} ({n_heads}): give it"
        )
    f.divides(given or groups[0], n_groups, heads[0], n_heads)
    m = dict(
        mamba_version=2,
        mamba_heads=n_heads,
        mamba_d_inner=di,
        mamba_d_state=f.pos(*state),
        mamba_n_groups=n_groups,
        mamba_conv_width=f.pos(*conv) if any(c in f.d for c in conv) else 4,
    )
    return dict(n_mamba=n, **m), n * _mamba2_params(d, m)


def _mamba2_params(d: int, m: dict) -> int:
    di, N, G, H, W = (
        m[k] for k in ("mamba_d_inner", "mamba_d_state", "mamba_n_groups", "mamba_heads", "mamba_conv_width")
    )
    return d * (2 * di + 2 * G * N + H) + di * d + (di + 2 * G * N) * W + 3 * H + di


def read_config(path) -> dict:
    """The ``ModelSpec`` keyword arguments of the model whose config.json is at ``path`` (name:
    ``path`` as given; ``total_params``: every weight, all experts, both vocabulary tables unless
    tied, for the weight bytes ``advise`` and the tensor-parallel default read)."""
    p = config_file(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise UsageError(f"cannot read model config {p}: {exc.strerror or exc}") from None
    if size == 0:  # it said "is not JSON: Expecting value: line 1 column 1 (char 0)"
        raise UsageError(f"model config {p} is empty (a download that did not finish?)")
    if size > MAX_CONFIG_BYTES:  # a weights shard given by mistake was read whole (GBs of memory)
        raise UsageError(
            f"model config {p} is {size / 1e6:,.0f} MB: no config.json is that large (a weights file?); "
            "give the config.json beside it, or its folder"
        )
    try:
        raw = json.loads(p.read_text(encoding="utf-8-sig"))  # a byte-order mark skipped
    except OSError as exc:
        raise UsageError(f"cannot read model config {p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"model config {p} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"model config {p}: not a JSON object")
    where = str(path)
    cfg = raw
    if raw.get("text_config") is not None and not isinstance(raw["text_config"], dict):
        raise UsageError(f"model config {where}: field 'text_config' must be a JSON object, not {raw['text_config']!r}")
    if isinstance(raw.get("text_config"), dict):  # Qwen3.5 (and other multimodal wrappers)
        cfg = {**raw["text_config"]}
        cfg.setdefault("model_type", raw.get("model_type"))
    family = str(cfg.get("model_type") or raw.get("model_type") or "")
    family = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}.get(family, family)
    if not family:  # `{}`, or a file that is some other JSON (a tokenizer config, an index)
        raise UsageError(
            f"model config {where}: no 'model_type' field: not a Hugging Face model config.json (the reader "
            f"knows {', '.join(FAMILIES)})"
        )
    if family not in FAMILIES:
        raise UsageError(
            f"model config {where}: model_type {family or None!r} is not one this reader knows ({', '.join(FAMILIES)})"
        )
    f = _Fields(cfg, where, family)
    d = f.pos("hidden_size", "d_model")
    block_list = next((k for k in ("layers_block_type", "layer_types") if cfg.get(k) is not None), None)
    if family == "nemotron_h" and block_list:
        # transformers' own NemotronHConfig writes the pattern as a list (its length the layer
        # count, num_hidden_layers deprecated; the list wins over a hybrid_override_pattern beside
        # it, as transformers reads them): one character a block, as the pattern spells it
        blocks = f.types(
            cfg[block_list],
            len(cfg[block_list]) if isinstance(cfg[block_list], list) else -1,
            tuple(_NEMOTRON_BLOCKS),
            field=block_list,
        )
        cfg = {**cfg, "hybrid_override_pattern": "".join(_NEMOTRON_BLOCKS[b] for b in blocks)}
        cfg["num_hidden_layers"] = len(blocks)
        f = _Fields(cfg, where, family)
    layers = f.pos("num_hidden_layers", "n_layer", "n_layers")
    # ``dtype`` (transformers >= 4.56) wins over the older ``torch_dtype`` where a config has both,
    # as transformers reads it; the text model's own before its wrapper's
    dtype_field = next(
        ((k, src[k]) for src in (cfg, raw) for k in ("dtype", "torch_dtype") if src.get(k) is not None),
        ("torch_dtype", "bfloat16"),
    )
    dtype = dtype_field[1]
    act_bytes = _dtype_bytes(dtype, where, dtype_field[0])
    # an fp32 checkpoint is served in 16 bits (vLLM's and SGLang's --dtype auto: bf16): its KV,
    # conv windows and a Mamba state that follows the model dtype at 2 bytes, as its weights
    fp32 = act_bytes == 4
    served = "bf16" if fp32 else _DTYPE_NAMES.get(str(dtype).lower().replace("torch.", ""), "fp8")
    act_bytes = 2 if fp32 else act_bytes
    vocab = f.pos("vocab_size")
    tied = f.flag("tie_word_embeddings", f.flag("tie_word_embeddings", False, raw))
    out: dict = dict(name=str(path), d_model=d, kv_dtype_bytes=act_bytes, conv_dtype_bytes=act_bytes, dtype=served)
    if fp32:
        out["dtype_note"] = "fp32 checkpoint served in bf16"
    # the field that names the recurrent state's dtype, where one does (its name goes in an error)
    ssm_field = next((k for k in ("mamba_ssm_dtype", "mamba_ssm_cache_dtype") if cfg.get(k)), "mamba_ssm_dtype")
    ssm_dtype = cfg.get(ssm_field)
    mlp_blocks: list[tuple[int, int]] = []
    other = 0  # weights outside the MLP blocks (attention, linear layers)

    def attention(n: int, *, gate=False) -> None:
        nonlocal other
        heads = f.int("num_attention_heads")
        default = _FAMILY_DEFAULTS.get(family, {})
        # a KV head count of null is the heads (transformers' backward compatibility); one left out
        # is the family's default, where its config class has one
        if cfg.get("num_key_value_heads") is not None:
            kv = f.int("num_key_value_heads")
        else:
            kv = heads if "num_key_value_heads" in cfg else default.get("num_key_value_heads", heads)
        hd_field = next((k for k in ("head_dim", "attention_head_dim") if cfg.get(k) is not None), None)
        hd = f.pos(hd_field) if hd_field else default.get("head_dim", d // heads if heads else 0)
        if heads == 0 or hd == 0:
            raise UsageError(f"model config {where}: {family} needs field 'num_attention_heads' > 0")
        if kv == 0 or heads % kv:  # each KV head serves a whole group of query heads
            given = "num_key_value_heads" in cfg
            raise UsageError(
                f"model config {where}: field 'num_key_value_heads' ({kv}) must divide 'num_attention_heads' ({heads})"
                if given
                else f"model config {where}: field 'num_key_value_heads' is left out, and {family}'s default of {kv} "
                f"does not divide 'num_attention_heads' ({heads}): give it"
            )
        out.update(
            n_attn=n, attn_heads=heads, attn_kv_heads=kv, attn_head_dim=hd, attn_causal=True, attn_output_gate=gate
        )
        other += n * _attn_params(d, heads, kv, hd, gate)

    def swiglu(inter: int) -> tuple[int, int]:  # ``inter``: read with f.pos
        return (3 * d * inter, 3 * d * inter)

    if family in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        types = cfg.get("layer_types")
        if types is not None:
            is_attn = [t == "full_attention" for t in f.types(types, layers, ("full_attention", "linear_attention"))]
        else:
            k = f.int("full_attention_interval", default=4)  # the Qwen config classes' default
            if k < 1:
                raise UsageError(f"model config {where}: field 'full_attention_interval' must be >= 1, not {k}")
            is_attn = [(i + 1) % k == 0 for i in range(layers)]
        n_attn = sum(is_attn)
        attention(n_attn, gate=f.flag("attn_output_gate", True))
        hk, hv = f.pos("linear_num_key_heads"), f.pos("linear_num_value_heads")
        f.divides("linear_num_key_heads", hk, "linear_num_value_heads", hv)  # value heads share key heads
        dk, dv = f.pos("linear_key_head_dim"), f.pos("linear_value_head_dim")
        w = f.pos("linear_conv_kernel_dim", default=4)
        out.update(
            n_gdn=layers - n_attn,
            gdn_k_heads=hk,
            gdn_v_heads=hv,
            gdn_head_k_dim=dk,
            gdn_head_v_dim=dv,
            gdn_conv_width=w,
            state_dtype_bytes=_dtype_bytes(ssm_dtype or "float32", where, ssm_field),
        )
        conv_dim = 2 * hk * dk + hv * dv
        other += (layers - n_attn) * (d * (2 * hk * dk + 2 * hv * dv) + d * 2 * hv + hv * dv * d + conv_dim * w)
        experts = f.int("num_experts", default=0)
        sparse_step = f.pos("decoder_sparse_step", default=1) if experts > 0 else 1  # layer i MoE: (i+1) % step
        dense_only = cfg.get("mlp_only_layers") or []
        if not isinstance(dense_only, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in dense_only
        ):
            raise UsageError(f"model config {where}: field 'mlp_only_layers' must be a list of layer numbers")
        dense_only = set(dense_only)
        for i in range(layers):
            if experts > 0 and sparse_step > 0 and (i + 1) % sparse_step == 0 and i not in dense_only:
                inter, top = f.pos("moe_intermediate_size"), f.pos("num_experts_per_tok")
                # left out: the family's config class's shared expert (Qwen3-Next, Qwen3.5-MoE: 512)
                shared = f.int("shared_expert_intermediate_size", default=_FAMILY_DEFAULTS[family].get("shared", 0))
                mlp_blocks.append((_moe(d, inter, top, shared, experts), _moe_total(d, inter, shared, experts)))
            else:
                mlp_blocks.append(swiglu(f.pos("intermediate_size")))
    elif family == "nemotron_h":
        pattern = f.need("hybrid_override_pattern")
        if not isinstance(pattern, str):
            raise UsageError(
                f"model config {where}: field 'hybrid_override_pattern' must be a string of {layers} characters "
                f"(a block a layer), not {pattern!r}"
            )
        if len(pattern) != layers:
            raise UsageError(f"model config {where}: field 'hybrid_override_pattern' must have {layers} characters")
        bad = sorted(set(pattern) - set("M*-E"))
        if bad:
            raise UsageError(f"model config {where}: field 'hybrid_override_pattern' has unknown block {bad[0]!r}")
        if not set(pattern) & set("M*"):  # MLPs alone: no KV, no state, nothing to cache (marconi divided by 0)
            raise UsageError(
                f"model config {where}: field 'hybrid_override_pattern' has no attention ('*') or Mamba ('M') "
                "block: nothing to cache"
            )
        attention(pattern.count("*"))
        n_m = pattern.count("M")
        m, params = _mamba2(f, family, d, n_m)
        out.update(m)
        other += params
        for c in pattern:
            if c == "-":  # squared-ReLU MLP: up and down projections only
                inter = f.pos("intermediate_size")
                mlp_blocks.append((2 * d * inter, 2 * d * inter))
            elif c == "E":  # MoE of squared-ReLU experts (Nemotron 3): routed + shared, a router
                inter, top, n_e = (
                    f.pos("moe_intermediate_size"),
                    f.pos("num_experts_per_tok"),
                    f.pos("n_routed_experts"),
                )
                shared = f.int("moe_shared_expert_intermediate_size", default=_FAMILY_DEFAULTS[family]["shared"])
                mlp_blocks.append(
                    (2 * d * inter * top + 2 * d * shared + d * n_e, 2 * d * inter * n_e + 2 * d * shared + d * n_e)
                )
    elif family == "jamba":
        period, offset = f.int("attn_layer_period"), f.int("attn_layer_offset")
        e_period, e_offset = f.int("expert_layer_period"), f.int("expert_layer_offset")
        if period < 1 or e_period < 1:
            raise UsageError(f"model config {where}: fields 'attn_layer_period' and 'expert_layer_period' must be >= 1")
        for name, at, every in (("attn", offset, period), ("expert", e_offset, e_period)):
            if at >= every:  # layer i is one when i % period == offset: never, past the period
                raise UsageError(
                    f"model config {where}: field '{name}_layer_offset' ({at}) must be below "
                    f"'{name}_layer_period' ({every})"
                )
        n_attn = sum(1 for i in range(layers) if i % period == offset)
        attention(n_attn)
        di = f.pos("mamba_expand") * d
        N, W = f.pos("mamba_d_state"), f.pos("mamba_d_conv")
        r = cfg.get("mamba_dt_rank", "auto")
        R = -(-d // 16) if r in (None, "auto") else f.pos("mamba_dt_rank")
        out.update(
            n_mamba=layers - n_attn,
            mamba_version=1,
            mamba_d_inner=di,
            mamba_d_state=N,
            mamba_conv_width=W,
            mamba_dt_rank=R,
        )
        other += (layers - n_attn) * (d * 2 * di + di * (R + 2 * N) + R * di + di * d + di * W + di * N + di)
        experts, top, inter = f.pos("num_experts"), f.pos("num_experts_per_tok"), f.pos("intermediate_size")
        for i in range(layers):
            if experts > 1 and i % e_period == e_offset:
                mlp_blocks.append((3 * d * inter * top + d * experts, 3 * d * inter * experts + d * experts))
            else:
                mlp_blocks.append(swiglu(inter))
    elif family == "falcon_h1":
        attention(layers)
        d_ssm = f.int("mamba_d_ssm", default=0) or None  # 0: as null
        if d_ssm is None and cfg.get("mamba_d_head") in (None, "auto"):
            # FalconH1Config: 1024 left out, mamba_expand x hidden when null; with a head dim
            # given, the heads x their dim
            d_ssm = f.pos("mamba_expand", default=2) * d if "mamba_d_ssm" in cfg else 1024
        m, params = _mamba2(f, family, d, layers, d_inner=d_ssm)
        out.update(m)
        other += params
        mlp_blocks += [swiglu(f.pos("intermediate_size"))] * layers
    elif family == "granitemoehybrid":
        names = ("mamba", "attention", "linear_attention", "full_attention")  # the last two: transformers' new names
        field = "layer_types" if cfg.get("layer_types") is not None else "layers_block_type"
        types = f.types(f.need("layer_types", "layers_block_type"), layers, names, field=field)
        n_attn = sum(t in ("attention", "full_attention") for t in types)
        attention(n_attn)
        n_m = layers - n_attn
        if n_m:
            expand = f.pos("mamba_expand", default=2)
            auto = cfg.get("mamba_d_head") in (None, "auto")  # GraniteMoeHybridConfig: expand x hidden / heads
            m, params = _mamba2(f, family, d, n_m, d_inner=expand * d if auto else None)
            out.update(m)
            other += params
        # left out: GraniteMoeHybridConfig's 8 experts, top-2 (it was read as 0, a dense model);
        # 0 given is a dense one (Granite 4.0 H 1B / 350M), as transformers builds it
        experts = f.int("num_local_experts", default=_FAMILY_DEFAULTS[family]["experts"])
        if experts > 0:
            inter = f.pos("intermediate_size")
            top = f.pos("num_experts_per_tok", default=_FAMILY_DEFAULTS[family]["top_k"])
            if cfg.get("num_local_experts") is None and top > experts:
                raise UsageError(
                    f"model config {where}: field 'num_local_experts' is left out, and {family}'s default of "
                    f"{experts} experts is fewer than 'num_experts_per_tok' ({top}): give it"
                )
            shared = f.int("shared_intermediate_size", default=_FAMILY_DEFAULTS[family]["shared"])
            block = (_moe(d, inter, top, shared, experts), _moe_total(d, inter, shared, experts))
        else:
            block = swiglu(f.pos("shared_intermediate_size", "intermediate_size"))
        mlp_blocks += [block] * layers
    elif family == "mamba2":
        m, params = _mamba2(f, family, d, layers)
        out.update(m)
        other += params
    elif family in ("qwen3_moe", "mixtral"):
        # attention-only MoE: Qwen3-MoE's layer i is sparse where (i + 1) % decoder_sparse_step == 0
        # and i is not in mlp_only_layers (else a SwiGLU of intermediate_size); every Mixtral layer
        # is sparse, its experts intermediate_size wide
        attention(layers)
        default = _FAMILY_DEFAULTS[family]
        qwen = family == "qwen3_moe"
        experts = f.int("num_experts" if qwen else "num_local_experts", default=default["experts"])
        step = f.pos("decoder_sparse_step", default=1) if qwen else 1
        dense_only = (cfg.get("mlp_only_layers") or []) if qwen else []
        if not isinstance(dense_only, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in dense_only
        ):
            raise UsageError(f"model config {where}: field 'mlp_only_layers' must be a list of layer numbers")
        for i in range(layers):
            if experts > 0 and (i + 1) % step == 0 and i not in dense_only:
                inter = f.pos("moe_intermediate_size" if qwen else "intermediate_size")
                top = f.pos("num_experts_per_tok", default=default["top_k"])
                if top > experts:
                    raise UsageError(
                        f"model config {where}: field 'num_experts_per_tok' ({top}) is more than the {experts} experts"
                    )
                mlp_blocks.append((_moe(d, inter, top, 0, experts), _moe_total(d, inter, 0, experts)))
            else:
                mlp_blocks.append(swiglu(f.pos("intermediate_size")))
    else:  # llama and plain relatives
        attention(layers)
        mlp_blocks += [swiglu(f.pos("intermediate_size"))] * layers

    top = cfg.get("num_experts_per_tok")
    n_experts = next((cfg[k] for k in ("num_experts", "n_routed_experts", "num_local_experts") if cfg.get(k)), 0)
    if mlp_blocks and isinstance(top, int) and isinstance(n_experts, int) and 1 < n_experts < top:
        raise UsageError(
            f"model config {where}: field 'num_experts_per_tok' ({top}) is more than the {n_experts} experts"
        )
    if out.get("n_mamba"):
        out["state_dtype_bytes"] = _dtype_bytes(ssm_dtype, where, ssm_field) if ssm_dtype else act_bytes
        if family == "nemotron_h" and not ssm_dtype:  # the engines' fp32 (NEMOTRON_H_STATE_NOTE)
            out["state_dtype_bytes"], out["state_note"] = 4, NEMOTRON_H_STATE_NOTE
    mlp, mlp_total = _mlp_fields(mlp_blocks)
    out.update(mlp)
    out["embedding_params"] = vocab * d
    tables = vocab * d * (1 if tied else 2)
    out["total_params"] = float(other + mlp_total + tables)
    quant = _quantized(cfg.get("quantization_config") or raw.get("quantization_config"))
    if quant is not None:  # a quantized checkpoint: its layers' weights at their bits, the vocabulary
        # tables (which these checkpoints leave unquantized) at 2 bytes
        out["weight_dtype"] = quant[0]
        out["weight_bytes"] = float((other + mlp_total) * quant[1] / 8 + tables * 2)
    out["source"] = f"{p} ({family})"
    return out
