"""Hub wing: Hub-ready folders, model cards, uploads and the `custom_generate` repository.

- `export`: `wedlm-hf export`, `wedlm-hf card`; which files are remote code (the core folder).
- `push`: `wedlm-hf push` and `WeDLMForCausalLM.push_to_hub` (attached here, not in the model file).
- `model_card`: cards rendered from `model_cards/template.md` and the training / evaluation records.
- `custom_generate`: `wedlm-hf custom-generate`, the decoding strategy as a Hub `custom_generate` method.

Public to other wings: nothing; the CLI calls the commands. Imports only the core.
"""

from .push import attach_push_to_hub

attach_push_to_hub()
