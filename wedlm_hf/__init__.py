"""wedlm-hf: WeDLM streaming parallel decoding inside Hugging Face transformers.

Importing the package registers `WeDLMConfig` / `WeDLMForCausalLM` with the Auto classes (model_type "wedlm") and
marks them for remote code, so `save_pretrained` writes a checkpoint that loads with `trust_remote_code=True`
where this package is not installed.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_wedlm import WeDLMConfig
from .default_model import default_model_path
from .dual_stream_collator import DualStreamCollator
from .generation_wedlm import STRATEGIES, WEDLM_GENERATION_DEFAULTS, WeDLMGenerateOutput, generate_wedlm
from .modeling_wedlm import WeDLMCausalLMOutput, WeDLMForCausalLM, WeDLMModel, WeDLMPreTrainedModel
from .streaming_decoder import WeDLMStats

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
