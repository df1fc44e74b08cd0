"""`wedlm-hf convert`: a local AR checkpoint (Qwen2, Qwen3 or Llama family) as a WeDLM checkpoint to train on.

The weights move over unchanged (WeDLM uses the same names); the config becomes a `WeDLMConfig` with the
family's attention switches; the tokenizer gains a mask token when it has none, and the embeddings grow to match.
Like `wedlm-hf export`, the checkpoint appears whole or not at all, and a destination that already holds files is
refused (it may be someone's checkpoint) unless `overwrite=True` (`--overwrite`), which removes its earlier weights.
"""

from dataclasses import fields
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from ..hub import staged_checkpoint
from ..modeling import WeDLMConfig, WeDLMForCausalLM

_FAMILIES = ("qwen2", "qwen3", "llama")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def wedlm_config_from(config, mask_token_id: int | None = None) -> WeDLMConfig:
    """The WeDLM config of a Qwen2 / Qwen3 / Llama config; refuses what WeDLM layers cannot reproduce."""
    family = config.model_type
    if family not in _FAMILIES:
        raise ValueError(f"Cannot convert model_type {family!r}: supported families are {', '.join(_FAMILIES)}.")
    values = {f.name: getattr(config, f.name) for f in fields(WeDLMConfig) if hasattr(config, f.name)}
    if family == "qwen2":
        values.update(attention_bias=True, qk_norm=False)
    elif family == "qwen3":
        values.update(qk_norm=True)
        if config.attention_bias:
            raise ValueError("A Qwen3 checkpoint with attention_bias=True biases o_proj, which WeDLM layers do not.")
    else:
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            raise ValueError("Llama checkpoints with attention_bias or mlp_bias have biases WeDLM layers do not.")
        values.update(attention_bias=False, qk_norm=False)
    values["head_dim"] = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    values["mask_token_id"] = mask_token_id
    return WeDLMConfig(**values)


def check_source(source: Path) -> None:
    """A local checkpoint folder with its config and tokenizer; otherwise transformers would answer with a message
    about Hub model ids."""
    if not source.exists():
        raise FileNotFoundError(
            f"{source}: no such folder; `wedlm-hf convert` takes a local checkpoint folder (download Hub models first, "
            "e.g. with `hf download ORG/NAME --local-dir DIR`)."
        )
    if not source.is_dir():
        raise NotADirectoryError(f"{source} is a file: give `wedlm-hf convert` the checkpoint folder that holds it.")
    if not (source / "config.json").is_file():
        raise FileNotFoundError(
            f"{source} has no config.json: give `wedlm-hf convert` a transformers checkpoint folder (config.json, "
            "weights, tokenizer), e.g. one written by save_pretrained."
        )
    if not any((source / name).is_file() for name in _TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{source} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}): save the tokenizer into the folder "
            "too (tokenizer.save_pretrained(folder))."
        )


def convert_ar_checkpoint(source: str, destination: str, mask_token: str = "<|mask|>", overwrite: bool = False) -> Path:
    """Writes config, weights (safetensors), generation config and tokenizer of the WeDLM version of `source`."""
    check_source(Path(source))
    with staged_checkpoint(source, destination, "convert", overwrite=overwrite) as staging:
        model, tokenizer = _convert(source, mask_token)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    return Path(destination)


def _convert(source: str, mask_token: str):
    """The WeDLM model and the tokenizer (with its mask token) of the AR checkpoint `source`."""
    config = AutoConfig.from_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    ar_model = AutoModelForCausalLM.from_pretrained(source, dtype=config.dtype or torch.float32)
    if tokenizer.mask_token_id is None:
        tokenizer.add_special_tokens({"mask_token": mask_token})
    if len(tokenizer) > ar_model.get_input_embeddings().num_embeddings:
        ar_model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    wedlm_config = wedlm_config_from(ar_model.config, mask_token_id=tokenizer.mask_token_id)
    model = WeDLMForCausalLM(wedlm_config).to(ar_model.dtype)
    missing, unexpected = model.load_state_dict(ar_model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if wedlm_config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"Weights do not line up: missing {sorted(missing)}, unexpected {sorted(unexpected)}.")
    if ar_model.generation_config is not None:
        for key, value in ar_model.generation_config.to_diff_dict().items():
            if not key.startswith("_") and key != "transformers_version":
                setattr(model.generation_config, key, value)
    return model, tokenizer


def convert_command(args) -> None:
    """`wedlm-hf convert SOURCE DESTINATION`."""
    out = convert_ar_checkpoint(args.source, args.destination, mask_token=args.mask_token, overwrite=args.overwrite)
    print(f"WeDLM checkpoint written to {out}")
