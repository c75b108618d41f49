"""SmolLM2's GGUF → a Hugging Face safetensors directory vLLM can serve (vLLM 0.32 has no
GGUF loader). Run by populace.replicas.vllm_cpu with the vLLM environment's Python (which has
gguf, numpy, torch, safetensors and tokenizers), as a script: it imports nothing from populace.

    python vllm_convert.py GGUF_FILE OUT_DIR

The `gguf` package reads the file and de-quantizes each tensor with numpy; torch only casts
them to bf16 (round to nearest even, as transformers' GGUF loader did) for safetensors; the
tokenizer is rebuilt with `tokenizers` from the GGUF's vocabulary and merges. transformers'
own GGUF loader wrote the same files (same tensor bytes, same tokenizer.json) in about 22
CPU-seconds (28 s), most of it building the model; this takes 8 (11 s). Nothing is downloaded.

Only what SmolLM2 is: a Llama-architecture model with a GPT-2 (byte-level BPE) tokenizer.
Anything else is refused, naming what differs, rather than converted wrongly."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# GGUF tensor names (llama.cpp's) → Hugging Face Llama's
_BLOCK = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}
_CONTROL = 3  # llama.cpp's token type of a special (control) token


def hf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
    if m is None or m.group(2) not in _BLOCK:
        raise SystemExit(f"unexpected tensor {name!r} in the GGUF (only Llama's are converted)")
    return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}.weight"


def unpermute(w, heads: int):
    """llama.cpp's converter interleaves the rotary halves of each head's q/k rows; undo it."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _fields(reader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def config(meta: dict, tied: bool) -> dict:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise SystemExit(f"the GGUF's architecture is {arch!r}; only 'llama' is converted")
    g = lambda key, default=None: meta.get(f"llama.{key}", default)  # noqa: E731
    heads = g("attention.head_count")
    rope_theta = float(g("rope.freq_base", 10000.0))
    return {
        "_model_name_or_path": meta.get("general.name", ""),
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "hidden_act": "silu",
        "bos_token_id": meta["tokenizer.ggml.bos_token_id"], "eos_token_id": meta["tokenizer.ggml.eos_token_id"],
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "unk_token_id": meta.get("tokenizer.ggml.unknown_token_id"),
        "hidden_size": g("embedding_length"), "intermediate_size": g("feed_forward_length"),
        "num_hidden_layers": g("block_count"), "num_attention_heads": heads,
        "num_key_value_heads": g("attention.head_count_kv", heads),
        "head_dim": g("rope.dimension_count", g("embedding_length") // heads),
        "max_position_embeddings": g("context_length"), "rms_norm_eps": g("attention.layer_norm_rms_epsilon"),
        "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True, "tie_word_embeddings": tied,
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        # both spellings: transformers 5 reads rope_parameters, 4 reads rope_theta
        "rope_parameters": {"rope_theta": rope_theta, "rope_type": "default"}, "rope_theta": rope_theta,
    }


def tensors(reader, cfg: dict) -> dict:
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            w = np.asarray(t.data, dtype=np.float32)
        else:
            w = dequantize(t.data, t.tensor_type)
        if name.endswith("q_proj.weight"):
            w = unpermute(w, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, cfg["num_key_value_heads"])
        # writable (torch warns of read-only arrays, as the GGUF's own float32 tensors are): copied only then
        out[name] = torch.from_numpy(np.require(w, np.float32, ["C", "W"])).to(torch.bfloat16)
    return out


def tokenizer(meta: dict):
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise SystemExit(f"the GGUF's tokenizer is {kind!r}; only 'gpt2' (byte-level BPE) is converted")
    if meta.get("tokenizer.ggml.add_bos_token") or meta.get("tokenizer.ggml.add_space_prefix"):
        raise SystemExit("the GGUF's tokenizer adds a BOS token or a space prefix; this converter does neither")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    types = meta.get("tokenizer.ggml.token_type") or []
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, kind in enumerate(types) if kind == _CONTROL])
    return tok


def convert(gguf_file: str, out: str) -> None:
    from gguf import GGUFReader
    from safetensors.torch import save_file

    reader = GGUFReader(gguf_file)
    meta = _fields(reader)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    cfg = config(meta, tied)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors(reader, cfg), str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokens = meta["tokenizer.ggml.tokens"]
    name = lambda key: tokens[meta[key]] if meta.get(key) is not None else None  # noqa: E731
    tokenizer(meta).save(str(folder / "tokenizer.json"))
    special = {f"{role}_token": name(f"tokenizer.ggml.{key}_token_id")
               for role, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown"))}
    # PreTrainedTokenizerFast: the class transformers 4 and 5 both load from a tokenizer.json
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", **{k: v for k, v in special.items() if v is not None}},
        indent=2) + "\n")
    if meta.get("tokenizer.chat_template"):
        (folder / "chat_template.jinja").write_text(meta["tokenizer.chat_template"])
    # what transformers wrote from the model's config (vLLM takes its stop tokens from eos_token_id)
    generation = {"_from_model_config": True, "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                  "output_attentions": False, "output_hidden_states": False, "pad_token_id": cfg["pad_token_id"],
                  "use_cache": True}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python vllm_convert.py GGUF_FILE OUT_DIR")
    convert(sys.argv[1], sys.argv[2])
