"""The core: exactly the files that travel to the Hub as remote code.

Every module here imports only torch, transformers and its neighbours (flat `from .x import Y`), because
`save_pretrained` / `wedlm-hf export` copy this folder (all modules but this `__init__`) beside the weights, where
transformers loads them without wedlm-hf. Wings import the core; the core imports no wing.

- `configuration_wedlm`, `modeling_wedlm`: config and model (Qwen3 parts, WeDLM's differences stated).
- `decoding_config`: `WeDLMDecodingConfig`, the WeDLM options with their defaults and checks, defined once.
- `generation_wedlm`: `generate(strategy="wedlm")`'s arguments, checks and output.
- `generation_inputs`, `transformers_versions`: generate's inputs checked and prepared; the version shims.
- `streaming_decoder`: the step in phases, over `decoding_state` (a row), `window_refill`, `step_feed`,
  `step_readout` (the step's one host read), `commit_rules`, `batch_fill`, `grammar_hook` and the cache interface
  `decoding_cache` (`ragged_cache`, `slot_cache`); `window_filling`: the fill rule, the sampler and its processors
  (`sampler_batch`: samplers of their own processed and drawn as one).
- `dual_stream_loss`: the training loss the model returns on a dual-stream batch.
- `loading_checks`: what `from_pretrained` refuses beyond transformers, naming the file and the fix.
"""

from .configuration_wedlm import WeDLMConfig
from .decoding_config import WeDLMDecodingConfig, WeDLMOptionError
from .decoding_state import WeDLMStats
from .generation_wedlm import STRATEGIES, WEDLM_GENERATION_DEFAULTS, WeDLMGenerateOutput, generate_wedlm
from .modeling_wedlm import WeDLMCausalLMOutput, WeDLMForCausalLM, WeDLMModel, WeDLMPreTrainedModel

__all__ = [
    "STRATEGIES",
    "WEDLM_GENERATION_DEFAULTS",
    "WeDLMCausalLMOutput",
    "WeDLMConfig",
    "WeDLMDecodingConfig",
    "WeDLMForCausalLM",
    "WeDLMGenerateOutput",
    "WeDLMModel",
    "WeDLMOptionError",
    "WeDLMPreTrainedModel",
    "WeDLMStats",
    "generate_wedlm",
]
