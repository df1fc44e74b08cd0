"""WeDLM configuration: a Qwen3 config plus the switches the released WeDLM checkpoints use.

Released WeDLM configs (`model_type: "wedlm"`) describe either a Qwen2.5 decoder (`attention_bias=True`,
`qk_norm=False`) or a Qwen3 decoder (`attention_bias=False`, `qk_norm=True`). The defaults follow the authors'
own configuration class, so a released `config.json` that omits a field reads the same here as there; except the
model's sizes: a checkpoint's config.json without one would build a model of Qwen3's default size (4096 wide, 32
layers), which its weights do not fit, so loading refuses it by name.
"""

from pathlib import Path

from transformers.configuration_utils import strict  # huggingface_hub's validator, as transformers uses it
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

# The fields that fix the shapes of the weights.
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",  # defaults to 32, not to num_attention_heads
)


def check_sizes(values: dict, config_file) -> None:
    """A ValueError naming `config_file` and the size fields its `values` lack."""
    missing = [field for field in SIZE_FIELDS if field not in values]
    if missing:
        them = "them" if len(missing) > 1 else "it"
        raise ValueError(
            f"{config_file} lacks the model size{'s' if len(missing) > 1 else ''} {', '.join(missing)}: add {them} "
            f"(as the weights were saved); without {them} the model would be built with a default size that the "
            "weights do not fit."
        )


@strict  # rebuilds the field validators: `head_dim` may be None here, unlike in Qwen3Config
class WeDLMConfig(Qwen3Config):
    r"""
    Configuration of a WeDLM model: a Qwen3 config plus the attention switches and mask token of WeDLM checkpoints.

    Loads the released Qwen2.5- and Qwen3-based WeDLM configs as they are. Every Qwen3 field is accepted; these
    differ or are new:

    attention_bias (`bool`, defaults to `True`):
        Bias on the q/k/v projections (Qwen2.5 style). `o_proj` never has a bias in WeDLM checkpoints.
    qk_norm (`bool`, defaults to `False`):
        Per-head RMS norm on queries and keys (Qwen3 style).
    head_dim (`int`, *optional*):
        Defaults to `hidden_size // num_attention_heads`, as in the released configs.
    mask_token_id (`int`, *optional*):
        The token id that stands for a masked slot during WeDLM decoding and training.
    """

    model_type = "wedlm"

    head_dim: int | None = None
    attention_bias: bool = True
    qk_norm: bool = False
    mask_token_id: int | None = None

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """AutoConfig reads a checkpoint's config.json into this, passing the checkpoint as `name_or_path`: that file
        must state the model's sizes (the model classes check it when they read the file themselves)."""
        source = kwargs.get("name_or_path")
        if source:
            config_file = Path(source, "config.json")
            check_sizes(config_dict, config_file if config_file.is_file() else f"the config.json of {source}")
        return super().from_dict(config_dict, **kwargs)

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)


__all__ = ["SIZE_FIELDS", "WeDLMConfig", "check_sizes"]
