"""WeDLM model: a Qwen3 decoder that states only what WeDLM checkpoints do differently.

Differences from Qwen3: q/k/v bias and q/k norm are switches (`attention_bias`, `qk_norm`), `o_proj` never has a
bias, a batch from the dual-stream collator returns the WeDLM training loss, and `generate(strategy="wedlm")`
runs streaming parallel decoding. Weight names are the Qwen2/Qwen3 ones, so released checkpoints load as they are.
Loading refuses a checkpoint whose q/k norm weights or q/k/v biases contradict `qk_norm` / `attention_bias`, and
names a damaged or refused weight file and a broken config or generation config (`loading_checks`).
"""

import inspect
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import slice_logits_to_keep
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3MLP,
    Qwen3Model,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)

from .batch_invariant import check_model
from .configuration_wedlm import WeDLMConfig
from .dual_stream_loss import additive_attention_mask, dual_stream_loss
from .generation_wedlm import STRATEGIES, ensure_wedlm_generation_defaults, generate_wedlm, resolve_strategy
from .grammar_commit import with_grammar
from .loading_checks import check_attention_weights, check_checkpoint_files, unreadable_weights
from .transformers_versions import CACHE_KWARG, distributed_argument


def _cache_in_signature(forward):
    """Lists the KV cache argument in `forward`'s signature under the installed transformers' name (`cache` from
    5.24 on, `past_key_values` before), which generate and transformers' tests read. `forward` itself takes it
    through **kwargs and passes it on as named, so Qwen3's forward applies that version's renaming and warning."""
    signature = inspect.signature(forward)
    *named, rest = signature.parameters.values()
    cache = inspect.Parameter(CACHE_KWARG, inspect.Parameter.KEYWORD_ONLY, default=None)
    forward.__signature__ = signature.replace(parameters=[*named, cache, rest])
    return forward


@dataclass
class WeDLMCausalLMOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus the two halves of the dual-stream loss, reported for logging."""

    ar_loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None


class WeDLMAttention(Qwen3Attention):
    """Qwen3 attention with q/k norm optional (off for Qwen2.5-based checkpoints) and no `o_proj` bias."""

    def __init__(self, config: WeDLMConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        if config.attention_bias:  # Qwen3Attention would also bias o_proj; Qwen2.5 biases q/k/v only
            self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False)
        if not config.qk_norm:
            self.q_norm = nn.Identity()
            self.k_norm = nn.Identity()


class WeDLMDecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: WeDLMConfig, layer_idx: int):
        GradientCheckpointingLayer.__init__(self)
        self.hidden_size = config.hidden_size
        self.self_attn = WeDLMAttention(config=config, layer_idx=layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class WeDLMPreTrainedModel(Qwen3PreTrainedModel):
    config: WeDLMConfig
    config_class = WeDLMConfig
    _no_split_modules = ["WeDLMDecoderLayer"]
    _can_record_outputs = {"hidden_states": WeDLMDecoderLayer, "attentions": WeDLMAttention}

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path=None, *args, output_loading_info: bool = False, **kwargs):
        """`PreTrainedModel.from_pretrained`, refusing weights that contradict the config's attention switches (they
        would build a different model, with the extra tensors dropped), naming a damaged or refused weight file, a
        config.json without the model's sizes, and a generation_config.json it would otherwise replace by the
        defaults (`loading_checks`)."""
        check_checkpoint_files(pretrained_model_name_or_path, kwargs, cls.can_generate())
        kwargs = distributed_argument(kwargs, stacklevel=2)
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
            )
        except Exception as error:
            unreadable = unreadable_weights(error, pretrained_model_name_or_path, kwargs)
            if unreadable is None:
                raise
            raise unreadable from error
        check_attention_weights(model.config, info, pretrained_model_name_or_path)
        ensure_wedlm_generation_defaults(getattr(model, "generation_config", None))  # the base model has none
        return (model, info) if output_loading_info else model


class WeDLMModel(WeDLMPreTrainedModel, Qwen3Model):
    def __init__(self, config: WeDLMConfig):
        WeDLMPreTrainedModel.__init__(self, config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([WeDLMDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.has_sliding_layers = "sliding_attention" in config.layer_types
        self.post_init()


class WeDLMForCausalLM(WeDLMPreTrainedModel, Qwen3ForCausalLM, GenerationMixin):
    """A WeDLM language model: `generate(strategy="wedlm")` decodes several tokens per forward, plain `generate()` AR.

    Weight names are Qwen2/Qwen3's, so released WeDLM checkpoints load as they are; `from_pretrained` also checks
    the weights against `qk_norm` / `attention_bias` and refuses a broken `generation_config.json`. Given a
    `DualStreamCollator` batch, `forward` returns the dual-stream training loss (`loss`, `ar_loss`, `mlm_loss`).
    The WeDLM arguments of `generate`: `help(wedlm_hf.generate_wedlm)` and docs/usage.md.
    """

    # The dual-stream loss is a normalised mean per batch; let Trainer scale it for gradient accumulation.
    accepts_loss_kwargs = False

    def __init__(self, config: WeDLMConfig):
        WeDLMPreTrainedModel.__init__(self, config)
        self.model = WeDLMModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
        ensure_wedlm_generation_defaults(self.generation_config)

    def save_pretrained(self, save_directory, *args, tokenizer=None, **kwargs):
        """`PreTrainedModel.save_pretrained` (weights, config with `auto_map`, remote code, generation config), plus
        the tokenizer when one is given, so the folder is complete."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if tokenizer is not None:
            tokenizer.save_pretrained(save_directory)

    @_cache_in_signature
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        label_weights: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        r"""
        cache (`Cache`, *optional*; `past_key_values` before transformers 5.24):
            The KV cache, under the installed transformers' name; it reaches Qwen3's forward as given.
        label_weights (`torch.Tensor` of shape `(batch, 2 * L)`, *optional*):
            Marks a dual-stream training batch (see `wedlm_hf.DualStreamCollator`): `labels` are then already aligned
            to the row that predicts them, and the loss is (next-token loss on the clean stream + 1/gamma-weighted
            masked loss on the prediction stream) / 2. The output then also carries `ar_loss` and `mlm_loss`.
        """
        check_model(self)  # inside `batch_invariant()`: refuses what it does not cover (eager attention, ...)
        if label_weights is None:
            return super().forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
                labels=labels,
                use_cache=use_cache,
                logits_to_keep=logits_to_keep,
                **kwargs,
            )
        if labels is None:
            raise ValueError("`label_weights` marks a dual-stream batch and needs `labels` beside it.")
        if attention_mask is None or attention_mask.dim() != 4:
            raise ValueError("A dual-stream batch needs its 4D `attention_mask` (batch, 1, 2L, 2L) from the collator.")
        if "flash" in (self.config._attn_implementation or ""):
            raise ValueError(
                "Dual-stream training needs an arbitrary attention mask, which flash attention cannot take: load the "
                "model with attn_implementation='sdpa' (default) or 'eager'."
            )
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=additive_attention_mask(attention_mask, self.dtype),
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        logits = self.lm_head(slice_logits_to_keep(hidden_states, logits_to_keep))
        if logits.shape[1] != labels.shape[1]:
            raise ValueError("A dual-stream batch needs logits for every row: leave `logits_to_keep` at 0.")
        loss, ar_loss, mlm_loss = dual_stream_loss(logits, labels, label_weights)
        return WeDLMCausalLMOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            ar_loss=ar_loss.detach(),
            mlm_loss=mlm_loss.detach(),
        )

    def generate(self, *args, strategy: str | None = None, **kwargs):
        """`strategy="wedlm"` runs streaming parallel decoding; otherwise (`"ar"`, the default) ordinary `generate`.

        The default strategy comes from `generation_config.strategy` when not given here. With `custom_generate`,
        transformers loads that generate function and hands it every argument (WeDLM's included).
        """
        if kwargs.get("custom_generate") is not None:
            return super().generate(*args, **kwargs, **({} if strategy is None else {"strategy": strategy}))
        kwargs = _cache_under_current_name(kwargs)
        strategy = resolve_strategy(strategy, kwargs.get("generation_config"), self.generation_config)
        if strategy == "wedlm":
            return generate_wedlm(self, *args, **kwargs)
        if kwargs.get("grammar") is not None:  # AR decoding under the grammar: its logits processor
            kwargs = with_grammar(self, kwargs.pop("grammar"), kwargs)
        kwargs.pop("grammar", None)
        wedlm_kwargs = sorted(k for k in kwargs if k.startswith("wedlm_"))
        if wedlm_kwargs:
            raise ValueError(
                f"{wedlm_kwargs} only apply to WeDLM decoding, but strategy is {strategy!r}: pass strategy='wedlm' "
                f"(strategies: {', '.join(STRATEGIES)})."
            )
        return super().generate(*args, **kwargs)


def _cache_under_current_name(kwargs: dict) -> dict:
    """`generate`'s cache argument under the installed transformers' name. The other name works too: `cache` on
    older versions, `past_key_values` (with transformers' FutureWarning, at the caller's line) from 5.24 on."""
    other = "past_key_values" if CACHE_KWARG == "cache" else "cache"
    if other not in kwargs:
        return kwargs
    kwargs = dict(kwargs)
    given, current = kwargs.pop(other), kwargs.get(CACHE_KWARG)
    if given is not None and current is not None and given is not current:
        raise ValueError("Pass the cache once: as `cache` (or `past_key_values`, its older name), not both.")
    if CACHE_KWARG == "cache":
        warnings.warn(
            "`past_key_values` is deprecated in transformers >= 5.24: pass the cache to generate as `cache=`.",
            FutureWarning,
            stacklevel=3,
        )
    kwargs[CACHE_KWARG] = given if current is None else current
    return kwargs


__all__ = ["WeDLMCausalLMOutput", "WeDLMForCausalLM", "WeDLMModel", "WeDLMPreTrainedModel"]
