"""populace.replicas.vllm_convert's pure parts, without the vLLM environment: GGUF names and
metadata → a Hugging Face Llama's, and the q/k rows back in Hugging Face's order. (The whole
conversion runs in the vllm tier, whose replica serves what it wrote.)"""

from __future__ import annotations

import numpy as np
import pytest

from populace.replicas import vllm_convert

SMOLLM2 = {"general.architecture": "llama", "general.name": "Smollm2 135M", "llama.block_count": 30,
           "llama.context_length": 8192, "llama.embedding_length": 576, "llama.feed_forward_length": 1536,
           "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3, "llama.rope.freq_base": 100000.0,
           "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.dimension_count": 64,
           "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 2,
           "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.tokens": ["t"] * 49152}


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj/k_proj (LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("heads", [9, 3])
def test_q_and_k_rows_come_back_in_hugging_face_order(heads):
    hf = np.arange(heads * 64 * 5, dtype=np.float32).reshape(heads * 64, 5)
    assert np.array_equal(vllm_convert.unpermute(llama_cpp_permute(hf, heads), heads), hf)
    assert not np.array_equal(llama_cpp_permute(hf, heads), hf)


def test_gguf_tensor_names_become_llama_names():
    assert vllm_convert.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert vllm_convert.hf_name("blk.29.attn_output.weight") == "model.layers.29.self_attn.o_proj.weight"
    assert vllm_convert.hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(SystemExit, match="blk.0.ssm_a"):
        vllm_convert.hf_name("blk.0.ssm_a.weight")


def test_the_config_comes_from_the_gguf_metadata():
    cfg = vllm_convert.config(SMOLLM2, tied=True)
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (30, 576, 1536)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["rope_parameters"] == {"rope_theta": 100000.0, "rope_type": "default"} and cfg["rope_theta"] == 100000.0
    assert (cfg["vocab_size"], cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (49152, 1, 2, 2)
    assert cfg["tie_word_embeddings"] is True and cfg["dtype"] == "bfloat16"
    with pytest.raises(SystemExit, match="'qwen2'"):
        vllm_convert.config({**SMOLLM2, "general.architecture": "qwen2"}, tied=True)


def test_a_tokenizer_other_than_byte_level_bpe_is_refused():
    with pytest.raises(SystemExit, match="'llama'"):
        vllm_convert.tokenizer({**SMOLLM2, "tokenizer.ggml.model": "llama"})
