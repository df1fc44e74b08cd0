"""`generate(strategy="wedlm")`'s inputs checked and prepared: the configuration, prompts, prompt caches, mask token,
grammars and the decoding cache, each refused with an error that names the argument and the fix.
"""

import torch
from transformers import DynamicCache, StaticCache
from transformers.generation import MaxTimeCriteria, StopStringCriteria

from .grammar_commit import compile_grammar
from .slot_cache import SlotCache, static_decoding_refusal
from .transformers_versions import CACHE_KWARG


def refuse(condition: bool, argument: str, fix: str) -> None:
    if condition:
        raise ValueError(f"generate(strategy='wedlm') does not accept {argument}: {fix}.")


def row_grammars(grammar, batch: int, tokenizer, model) -> list:
    """One compiled grammar (or None) per prompt row; each distinct spec is compiled once."""
    if grammar is None:
        return [None] * batch
    specs = grammar if isinstance(grammar, list) else [grammar] * batch
    if len(specs) != batch:
        raise ValueError(f"grammar= as a list gives one grammar (or None) per prompt: got {len(specs)} for {batch}.")
    vocab = model.config.get_text_config().vocab_size
    compiled = {}
    for spec in specs:
        if spec is not None and id(spec) not in compiled:
            compiled[id(spec)] = compile_grammar(spec, tokenizer, vocab)
    return [None if spec is None else compiled[id(spec)] for spec in specs]


def slot_cache(model, config, given, rows: int, tokens: int) -> SlotCache:
    """The static decoding cache: one slot per row, room for prompt + new tokens. Decoding steps
    run compiled where transformers would compile AR decoding (`compile_config`, `disable_compile`, the device)."""
    reason = static_decoding_refusal(model)
    refuse(reason is not None, "a static cache with this model", f"{reason}, or drop cache_implementation='static'")
    length = tokens
    if given is not None:
        refuse(
            given.get_seq_length() != 0,
            "a StaticCache that is not empty",
            "pass a new or reset() StaticCache (to reuse a prompt's K/V, pass them in a DynamicCache)",
        )
        capacity = given.get_max_length() if hasattr(given, "get_max_length") else given.get_max_cache_shape()
        refuse(
            capacity < length,
            f"this StaticCache (max_cache_len={capacity})",
            f"this generation needs max_cache_len >= {length} (longest prompt + max_new_tokens)",
        )
        length = capacity
    cache = SlotCache(model, rows, length)
    kwargs = {"past_key_values": cache, "cache": cache}
    if model._valid_auto_compile_criteria(kwargs, config):
        cache.compiled = model.get_compiled_call(config.compile_config)
    return cache


def resolve_mask_token_id(model, config, tokenizer, explicit) -> int:
    candidates = (
        explicit,
        getattr(model.config, "mask_token_id", None),
        getattr(config, "mask_token_id", None),
        getattr(tokenizer, "mask_token_id", None) if tokenizer is not None else None,
    )
    mask_token_id = next((c for c in candidates if c is not None), None)
    if mask_token_id is None:
        raise ValueError(
            "WeDLM decoding needs a mask token id and none was found: pass mask_token_id=..., or set "
            "model.config.mask_token_id (151665 for the released Qwen-based WeDLM models), or pass a tokenizer "
            "that has a mask token."
        )
    vocab = model.config.get_text_config().vocab_size
    if not 0 <= int(mask_token_id) < vocab:
        raise ValueError(f"mask_token_id {mask_token_id} is outside the model's vocabulary (size {vocab}).")
    return int(mask_token_id)


def validate_config(config, past_key_values) -> None:
    refuse((config.num_beams or 1) > 1, f"num_beams={config.num_beams}", "beam search is unsupported; set num_beams=1")
    refuse((config.num_beam_groups or 1) > 1, "num_beam_groups", "beam search is unsupported; set num_beam_groups=1")
    refuse(config.use_cache is False, "use_cache=False", "WeDLM decoding is built on the KV cache; drop it")
    refuse(
        config.cache_implementation not in (None, "dynamic", "static"),
        f"cache_implementation={config.cache_implementation!r}",
        "WeDLM decoding runs on a DynamicCache (default) or a static one (cache_implementation='static')",
    )
    refuse(
        past_key_values is not None and not isinstance(past_key_values, (DynamicCache, StaticCache)),
        f"this cache ({type(past_key_values).__name__})",
        "pass a DynamicCache (empty, or holding a prompt's K/V to reuse), an empty StaticCache, or none",
    )
    refuse(
        isinstance(past_key_values, DynamicCache)
        and config.cache_implementation == "static"
        and not is_prompt_cache(past_key_values),
        "a DynamicCache with cache_implementation='static'",
        "pass a StaticCache, or no cache (a DynamicCache goes with it only as a prompt cache to reuse, and this one "
        "is empty)",
    )
    for option in ("output_attentions", "output_hidden_states", "token_healing"):
        refuse(bool(getattr(config, option, None)), f"{option}=True", "it is not produced by WeDLM decoding; drop it")
    for option in ("penalty_alpha", "dola_layers", "prompt_lookup_num_tokens", "constraints", "force_words_ids"):
        refuse(getattr(config, option, None) is not None, option, "that decoding mode is unsupported; drop it")


def validate_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} must have the shape of input_ids {tuple(input_ids.shape)}."
        )
    mask = attention_mask.bool()
    if not mask.any(1).all():
        raise ValueError("Every prompt needs at least one token (a row of attention_mask is all zeros).")
    if (mask.long().diff(dim=1) < 0).any():
        raise ValueError(
            "Batched prompts must be left-padded (attention_mask 0...0 1...1 per row); set "
            "tokenizer.padding_side = 'left'."
        )


def validate_input_ids(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """Ids the embedding cannot look up would end in torch's IndexError or dtype error, without the argument's name.
    Only the ids under `attention_mask` are checked (padding is never fed), with one min/max reduction."""
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(
            f"generate(strategy='wedlm'): input_ids must be an integer tensor of token ids, got {input_ids.dtype}: "
            "pass the tokenizer's ids (or input_ids.long())."
        )
    fed = input_ids[attention_mask.bool()]
    if fed.numel() == 0:  # an empty prompt: refused later, with its own message
        return
    vocab = model.config.get_text_config().vocab_size
    low, high = torch.aminmax(fed)
    if low < 0 or high >= vocab:
        bad = fed[(fed < 0) | (fed >= vocab)].unique()[:5].tolist()
        raise ValueError(
            f"generate(strategy='wedlm'): input_ids holds token ids {', '.join(map(str, bad))} outside 0..{vocab - 1} "
            "(the model's vocabulary): encode the prompt with this model's tokenizer (after adding tokens to it, "
            "call model.resize_token_embeddings)."
        )


def resolve_max_new_tokens(config, prompt_width: int) -> int:
    for name in ("max_new_tokens", "max_length"):
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} must be a whole number of tokens, got {value!r}: pass e.g. {name}=64.")
    if config.max_new_tokens is not None:
        max_new = config.max_new_tokens
    else:
        max_new = config.max_length - prompt_width
    if max_new < 1:
        raise ValueError(
            f"No room to generate: max_new_tokens resolves to {max_new}; pass max_new_tokens >= 1 (or a max_length "
            f"above the prompt width {prompt_width})."
        )
    return max_new


def build_stopping_criteria(config, stopping_criteria, tokenizer) -> list:
    criteria = list(stopping_criteria or [])
    if config.stop_strings is not None:
        if tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer: pass tokenizer=... to generate.")
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=config.stop_strings))
    if config.max_time is not None:
        criteria.append(MaxTimeCriteria(max_time=config.max_time))
    return criteria


def is_prompt_cache(cache) -> bool:
    return isinstance(cache, DynamicCache) and cache.get_seq_length() > 0


def prompt_prefixes(model, cache, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list:
    """Per prompt row, the K/V a passed prompt cache holds for the row's first tokens (per layer (heads, n, head_dim),
    for `StreamingDecoder.add(prefix=)`), or None.

    transformers' prompt reuse: a cache of n columns holds the K/V of input_ids[:, :n], so under left padding row b
    (real tokens from column s_b on) takes columns s_b..n-1. Trailing all-zero columns are left out, to be fed again:
    they are where the cache `generate(strategy="wedlm")` returns has no K/V (the tokens that ended a row without a
    forward, docs/algorithm.md section 3.c).
    """
    batch, width = input_ids.shape
    if not is_prompt_cache(cache):
        return [None] * batch
    n = cache.get_seq_length()
    name = f"the cache (`{CACHE_KWARG}`)"
    if n >= width:
        raise ValueError(
            f"generate(strategy='wedlm'): {name} holds {n} tokens and input_ids has {width} columns, so "
            + (
                "the cache covers the whole prompt; append the new tokens to input_ids (a prompt cache holds the "
                f"K/V of input_ids[:, :n]), or crop it to leave at least one: cache.crop({width - 1})."
                if n == width
                else "it is longer than the prompt: pass the full prompt (the cached tokens, then the new ones) as "
                "input_ids, or a cache of this prompt's first tokens."
            )
        )
    layers = _prompt_cache_layers(model, cache, n, name)
    rows = layers[0][0].shape[0]
    if rows not in (1, batch):
        raise ValueError(
            f"generate(strategy='wedlm'): {name} holds {rows} rows for {batch} prompts: prefill it with one row "
            "(shared by every prompt) or one row per prompt (input_ids' rows, before num_return_sequences)."
        )
    start = (width - attention_mask.sum(1)).tolist()
    cached = [b for b in range(batch) if start[b] < n]
    head = input_ids[:, :n] * attention_mask[:, :n]
    if rows == 1 and any(start[b] != start[cached[0]] or not torch.equal(head[b], head[cached[0]]) for b in cached):
        raise ValueError(
            f"generate(strategy='wedlm'): {name} has one row, the K/V of one token sequence, but the prompts differ "
            f"in their first {n} columns (tokens or left padding): give prompts that agree there, or a cache with "
            "one row per prompt."
        )
    prefixes = []
    for b in range(batch):
        r, s = (0 if rows == 1 else b), start[b]
        computed = (layers[0][0][r, :, s:n] != 0).any(-1).any(0).nonzero()
        end = s + int(computed[-1]) + 1 if len(computed) else s
        prefixes.append([(k[r, :, s:end], v[r, :, s:end]) for k, v in layers] if end > s else None)
    return prefixes


def _prompt_cache_layers(model, cache: DynamicCache, n: int, name: str) -> list:
    """The cache's per-layer (keys, values), refused unless they are what this model computes: a cache made by a model
    of other sizes, or in another dtype or on another device, would fail inside attention with torch's error (or, in a
    lower precision, silently change the output)."""
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    text = model.config.get_text_config()
    if len(layers) != text.num_hidden_layers or any(k is None or v is None or k.shape[2] != n for k, v in layers):
        raise ValueError(
            f"generate(strategy='wedlm'): {name} does not hold {n} columns for each of this model's "
            f"{text.num_hidden_layers} layers: prefill it with this model (model(prefix_ids, {CACHE_KWARG}=cache))."
        )
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads  # as SlotCache sizes its layers
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    # A model spread over devices keeps each layer's K/V on its own; one dispatched by accelerate (offloading
    # included) computes them on its execution devices, which its parameters do not show: not checked there.
    devices = None if getattr(model, "hf_device_map", None) else {p.device for p in model.parameters()}
    needed = (heads, head_dim, model.dtype)

    def wrong(t: torch.Tensor) -> bool:
        return (t.shape[1], t.shape[3], t.dtype) != needed or (devices is not None and t.device not in devices)

    tensor = next((t for kv in layers for t in kv if wrong(t)), None)
    if tensor is not None:
        raise ValueError(
            f"generate(strategy='wedlm'): {name} holds K/V of num_key_value_heads {tensor.shape[1]}, head_dim "
            f"{tensor.shape[3]}, {tensor.dtype} on {tensor.device}, but this model computes num_key_value_heads "
            f"{heads}, head_dim {head_dim}, {model.dtype} on {model.device}: prefill the cache with this model as "
            f"loaded (model(prefix_ids, {CACHE_KWARG}=cache))."
        )
    return layers
