"""WeDLM configuration: a Qwen3 config plus the switches the released WeDLM checkpoints use.

Released WeDLM configs (`model_type: "wedlm"`) describe either a Qwen2.5 decoder (`attention_bias=True`,
`qk_norm=False`) or a Qwen3 decoder (`attention_bias=False`, `qk_norm=True`). The defaults follow the authors'
own configuration class, so a released `config.json` that omits a field reads the same here as there.
"""

from transformers.configuration_utils import strict  # huggingface_hub's validator, as transformers uses it
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config


@strict  # rebuilds the field validators: `head_dim` may be None here, unlike in Qwen3Config
class WeDLMConfig(Qwen3Config):
    r"""
    Configuration of a WeDLM model. Every Qwen3 field is accepted; these differ or are new:

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

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)


__all__ = ["WeDLMConfig"]
