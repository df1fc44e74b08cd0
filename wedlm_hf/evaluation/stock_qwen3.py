"""The same weights as a stock Qwen3 checkpoint, for baselines that cannot load WeDLM (`transformers serve`).

A Qwen3-family WeDLM model is Qwen3 with WeDLM's decoding; its weight names are Qwen3's, so the checkpoint loads
into `Qwen3ForCausalLM` unchanged and plain `generate` gives the same AR answers.
"""

from dataclasses import fields
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from ..modeling import WeDLMForCausalLM


def save_stock_qwen3(source: str, destination: str | Path) -> Path:
    """Writes `destination` (config, safetensors, generation config, tokenizer) as model_type "qwen3"."""
    model = WeDLMForCausalLM.from_pretrained(source, dtype=torch.float32)
    config = model.config
    if not config.qk_norm or config.attention_bias:
        raise ValueError(
            f"{source} is not a Qwen3-family WeDLM model (qk_norm={config.qk_norm}, "
            f"attention_bias={config.attention_bias}); only those have a stock Qwen3 twin."
        )
    values = {f.name: getattr(config, f.name) for f in fields(Qwen3Config) if hasattr(config, f.name)}
    values.pop("model_type", None)
    values.update(architectures=["Qwen3ForCausalLM"], use_cache=True, dtype="float32")
    stock = Qwen3ForCausalLM(Qwen3Config(**values))
    missing, unexpected = stock.load_state_dict(model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"Weights do not line up: missing {sorted(missing)}, unexpected {sorted(unexpected)}.")
    stock.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)
    out = Path(destination)
    stock.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out
