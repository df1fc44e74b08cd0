"""Hub wing: Hub-ready folders, model cards, uploads and the `custom_generate` repository.

- `export`: `wedlm-hf export`, `wedlm-hf card`; which files are remote code (the core folder).
- `push`: `wedlm-hf push` and `WeDLMForCausalLM.push_to_hub` (attached here, not in the model file).
- `model_card`: cards rendered from `model_cards/template.md` and the training / evaluation records.
- `custom_generate`: `wedlm-hf custom-generate`, the decoding strategy as a Hub `custom_generate` method.
- `safetensors_check`: a weight file is complete before anything copies or resumes from it.
- `checkpoint_destination`: a checkpoint folder appears whole, and replaces a non-empty one only when asked.

Public to other wings: `AUTO_MAP` and `hub_config` (the data wing's shipped folder is Hub-style too),
`check_safetensors` (ship-default, resuming training) and `staged_checkpoint` (`wedlm-hf convert`); the CLI calls
the commands. Imports only the core.
"""

from .checkpoint_destination import staged_checkpoint
from .export import AUTO_MAP, hub_config
from .push import attach_push_to_hub
from .safetensors_check import check_safetensors

attach_push_to_hub()

__all__ = ["AUTO_MAP", "check_safetensors", "hub_config", "staged_checkpoint"]
