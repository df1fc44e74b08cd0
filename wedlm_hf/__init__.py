"""wedlm-hf: WeDLM streaming parallel decoding inside Hugging Face transformers.

Importing the package registers `WeDLMConfig` / `WeDLMForCausalLM` with the Auto classes (model_type "wedlm") and
marks them for remote code, so `save_pretrained` writes a checkpoint that loads with `trust_remote_code=True`
where this package is not installed.

The package is a core and wings around it:

- `modeling/`: the core, exactly the files that travel to the Hub as remote code (config, model, decoding).
- `training/`: dual-stream batches, `wedlm-hf train`, AR-to-WeDLM conversion.
- `data/`: the shipped model's corpus, tasks and tokenizer, and `default_model_path()`.
- `hub/`: export, model cards, push, `custom_generate`.
- `evaluation/`: `evaluate`, `bench`, the no-cache baseline, the `generate` demo.
- `cli.py`: the `wedlm-hf` command, parsing and dispatch only.

Wings import the core, never the reverse.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from . import hub  # noqa: F401  (attaches WeDLMForCausalLM.push_to_hub)
from .data import default_model_path
from .modeling import (
    STRATEGIES,
    WEDLM_GENERATION_DEFAULTS,
    WeDLMCausalLMOutput,
    WeDLMConfig,
    WeDLMForCausalLM,
    WeDLMGenerateOutput,
    WeDLMModel,
    WeDLMPreTrainedModel,
    WeDLMStats,
    generate_wedlm,
)
from .training import DualStreamCollator

AutoConfig.register("wedlm", WeDLMConfig, exist_ok=True)
AutoModel.register(WeDLMConfig, WeDLMModel, exist_ok=True)
AutoModelForCausalLM.register(WeDLMConfig, WeDLMForCausalLM, exist_ok=True)
WeDLMConfig.register_for_auto_class()
WeDLMModel.register_for_auto_class("AutoModel")
WeDLMForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__version__ = "0.1.0"

__all__ = [
    "DualStreamCollator",
    "STRATEGIES",
    "WEDLM_GENERATION_DEFAULTS",
    "WeDLMCausalLMOutput",
    "WeDLMConfig",
    "WeDLMForCausalLM",
    "WeDLMGenerateOutput",
    "WeDLMModel",
    "WeDLMPreTrainedModel",
    "WeDLMStats",
    "default_model_path",
    "generate_wedlm",
]
