"""wedlm-hf: WeDLM streaming parallel decoding inside Hugging Face transformers.

Importing the package registers `WeDLMConfig` / `WeDLMForCausalLM` with the Auto classes (model_type "wedlm") and
marks them for remote code, so `save_pretrained` writes a checkpoint that loads with `trust_remote_code=True`
where this package is not installed. The import itself is light: the names below load on first use, and the
registration happens once transformers is imported too (`auto_registration`), so `wedlm-hf --help` needs neither
torch nor transformers.

The package is a core and wings around it:

- `modeling/`: the core, exactly the files that travel to the Hub as remote code (config, model, decoding).
- `training/`: dual-stream batches, `wedlm-hf train`, AR-to-WeDLM conversion.
- `data/`: the shipped model's corpus, tasks and tokenizer, and `default_model_path()`.
- `hub/`: export, model cards, push, `custom_generate`.
- `evaluation/`: `evaluate`, the benchmarks (`bench`, `bench-step`, `bench-lossless`, `bench-structured`,
  `bench-serve`), the no-cache baseline, the `generate` demo.
- `structured/`: grammars for structured output (llguidance), found by the core through an entry point.
- `cli.py`: the `wedlm-hf` command, parsing and dispatch only; `commands/`: each command's flags.

Wings import the core, never the reverse.
"""

import importlib

from .auto_registration import register_when_transformers_is_imported

__version__ = "0.1.0"

# Public name -> the subpackage that defines it; imported on first access (PEP 562).
_EXPORTS = {
    "DualStreamCollator": "training",
    "STRATEGIES": "modeling",
    "WEDLM_GENERATION_DEFAULTS": "modeling",
    "WeDLMCausalLMOutput": "modeling",
    "WeDLMConfig": "modeling",
    "WeDLMDecodingConfig": "modeling",
    "WeDLMForCausalLM": "modeling",
    "WeDLMGenerateOutput": "modeling",
    "WeDLMModel": "modeling",
    "WeDLMPreTrainedModel": "modeling",
    "WeDLMStats": "modeling",
    "batch_invariant": "modeling.batch_invariant",
    "default_model_path": "data",
    "generate_wedlm": "modeling",
}
_SUBPACKAGES = ("modeling", "training", "data", "hub", "evaluation", "structured")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))


register_when_transformers_is_imported()
