"""SmolLM2's GGUF → a Hugging Face safetensors directory vLLM can serve (vLLM 0.32 has no
GGUF loader). Run by populace.replicas.vllm_cpu with the vLLM environment's Python (which has
transformers, torch, gguf and accelerate), as a script: it imports nothing from populace.

    python vllm_convert.py GGUF_FILE OUT_DIR

transformers de-quantizes the GGUF into bf16 weights (about 40 s for SmolLM2-135M: 269 MB),
and writes the tokenizer and its chat template beside them. Nothing is downloaded."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def convert(gguf: str, out: str) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"  # never fetch anything: every file comes from the GGUF
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(Path(gguf).parent), Path(gguf).name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    # The weights are de-quantized now; without this, save_pretrained refuses (or records a
    # GGUF quantization vLLM would then try to apply).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if not (Path(out) / "model.safetensors").exists() or not (Path(out) / "tokenizer.json").exists():
        raise SystemExit(f"conversion wrote no model.safetensors/tokenizer.json in {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python vllm_convert.py GGUF_FILE OUT_DIR")
    convert(sys.argv[1], sys.argv[2])
