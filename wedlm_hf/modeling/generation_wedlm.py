"""`generate_wedlm`: transformers-style arguments in, streaming parallel decoding out.

This is the user-facing front of the decoder: it reads the same arguments as `model.generate` (generation
config, kwargs, logits processors, stopping criteria, streamer), refuses every option the strategy cannot honour
with an error that says what to change, runs `StreamingDecoder`, and returns `generate`-shaped output. It works for
any causal LM that takes `position_ids` and a `DynamicCache` (WeDLM, Qwen2, Qwen3, Llama, ...); its signature is
the one transformers uses for Hub `custom_generate` methods.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache, LogitsProcessorList, StaticCache, StoppingCriteriaList
from transformers.generation import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    GenerateDecoderOnlyOutput,
    MaxTimeCriteria,
    MinPLogitsWarper,
    StopStringCriteria,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from .batch_stopping import BatchStoppingCriteria
from .decoding_config import WeDLMDecodingConfig
from .grammar_commit import allowed_tokens, compile_grammar
from .ragged_cache import CACHE_KWARG
from .slot_cache import SlotCache
from .streaming_decoder import DecodingSettings, StreamingDecoder, WeDLMStats
from .window_filling import FillSampler

STRATEGIES = ("ar", "wedlm")
# What a WeDLM generation config holds by default: the strategy, and every option of `WeDLMDecodingConfig`.
WEDLM_GENERATION_DEFAULTS = {"strategy": "ar", **WeDLMDecodingConfig().as_kwargs()}
# Warpers that read only the scores, so they mean the same for a masked slot as for a next token.
_SCORE_ONLY_WARPERS = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
)
# Options that change nothing unless another unsupported option (beam search, assisted decoding) is also on.
_INERT_OPTIONS = {"early_stopping", "length_penalty"}
# The output field holding the KV cache: `cache` from transformers 5.24 on, `past_key_values` before.
_OUTPUT_CACHE_FIELD = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


@dataclass
class WeDLMGenerateOutput(GenerateDecoderOnlyOutput):
    """`generate` output plus `wedlm_stats`: one `WeDLMStats` per returned sequence.

    `cache` (the field's name from transformers 5.24 on; `past_key_values` before, and readable under both names)
    holds every committed token's K/V, laid out column for column like `sequences` (padding columns are zeros).
    """

    wedlm_stats: list[WeDLMStats] | None = None

    if _OUTPUT_CACHE_FIELD == "past_key_values":

        @property
        def cache(self):
            """The field's name from transformers 5.24 on, so that code written for either version reads it."""
            return self.past_key_values


def ensure_wedlm_generation_defaults(generation_config) -> None:
    """Adds the missing `strategy` / `wedlm_*` defaults and marks the config as the model's own, so that
    save/reload keeps them (a config derived from the model config drops unknown keys on reload)."""
    if generation_config is None:
        return
    for key, value in WEDLM_GENERATION_DEFAULTS.items():
        if not hasattr(generation_config, key):
            setattr(generation_config, key, value)
    generation_config._from_model_config = False


def resolve_strategy(strategy, given_config, model_config) -> str:
    """Explicit argument, then the given generation config, then the model's; `"ar"` when none says."""
    if strategy is None:
        for config in (given_config, model_config):
            strategy = getattr(config, "strategy", None) if config is not None else None
            if strategy is not None:
                break
    strategy = "ar" if strategy is None else strategy
    if strategy not in STRATEGIES:
        raise ValueError(
            f"Unknown strategy {strategy!r}: use strategy='ar' (ordinary generate) or strategy='wedlm' (streaming "
            'parallel decoding). If it comes from generation_config.json, set its "strategy" entry to one of these.'
        )
    return strategy


@torch.no_grad()
def generate_wedlm(
    model,
    inputs: torch.Tensor | None = None,
    generation_config=None,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    prefix_allowed_tokens_fn=None,
    synced_gpus: bool | None = None,
    assistant_model=None,
    streamer=None,
    negative_prompt_ids: torch.Tensor | None = None,
    negative_prompt_attention_mask: torch.Tensor | None = None,
    mask_token_id: int | None = None,
    tokenizer=None,
    grammar=None,
    **kwargs,
):
    """WeDLM streaming parallel decoding of any causal LM, with `generate`'s arguments: `generate(strategy="wedlm")`.

    WeDLM arguments (each defaults to the generation config's value, then to the built-in default):
        wedlm_window_size (int, 16): uncommitted slots kept in the window.
        wedlm_entropy_threshold (float or None, 0.4): fill every mask whose adjusted entropy (nats) is below it;
            None fills one mask per forward.
        wedlm_pos_penalty_factor (float, 0.02): entropy penalty per slot of distance from the leftmost mask.
        wedlm_lossless (bool, False): commit a drafted token only where the model's own AR decoding agrees, so the
            output equals plain `generate` (greedy: token for token; sampling: in distribution).
        wedlm_context_drafts (bool, True): in lossless mode, also draft the tokens that followed the latest earlier
            occurrence of the text's suffix (prompt lookup's rule); off: the model's own fills only.
        wedlm_context_ngram (int, 3): the longest suffix matched for context drafts, tried down to one token.
        mask_token_id (int): argument, then `config.mask_token_id`, then the generation config, then the
            tokenizer's mask token.
        grammar: structured output (docs/structured-output.md): the generated text of every row matches it and a row
            stops only where it is complete. A JSON schema (dict, or its JSON text), `("regex", pattern)`,
            `("lark", grammar)`, `("ebnf", grammar)`, a compiled `wedlm_hf.structured.Grammar` or an
            `llguidance.LLMatcher`; a list gives one per row (None: free text). Needs `tokenizer` and the
            `grammar` extra, except for compiled grammars.
        cache (`past_key_values` before transformers 5.24): an empty DynamicCache, or one holding a prompt's K/V to
            reuse (transformers' prompt reuse): its n columns are those of input_ids[:, :n], which are then not fed
            again (one cache row serves every prompt row). A passed cache ends up holding the returned `cache`
            (deepcopy a prompt cache you mean to reuse).
    Returns a LongTensor (batch, T + new) or, with `return_dict_in_generate=True`, a `WeDLMGenerateOutput`. With
    `output_logits` / `output_scores` it holds, per generated position, the model's AR logits there given the
    committed text (the rows WeDLM decoding computes anyway in lossless mode; only the committed run's rows, only
    when asked) and those logits processed by the sampling warpers, shaped as AR `generate` shapes them (rows that
    finished early hold zeros), so `model.compute_transition_scores` works unchanged.
    """
    _refuse(assistant_model is not None, "assistant_model", "assisted decoding is not part of WeDLM decoding; drop it")
    _refuse(prefix_allowed_tokens_fn is not None, "prefix_allowed_tokens_fn", "constrained decoding is unsupported")
    _refuse(
        negative_prompt_ids is not None or negative_prompt_attention_mask is not None,
        "negative_prompt_ids",
        "classifier-free guidance is unsupported",
    )
    _refuse(bool(synced_gpus), "synced_gpus", "ranks would run different numbers of forwards; pass synced_gpus=False")
    strategy = kwargs.pop("strategy", "wedlm")
    _refuse(strategy != "wedlm", "strategy", f"generate_wedlm runs strategy='wedlm', got {strategy!r}")
    explicit = {key: kwargs.pop(key) for key in WeDLMDecodingConfig.keys() if key in kwargs}
    unknown = sorted(k for k in kwargs if k.startswith("wedlm_"))
    _refuse(bool(unknown), ", ".join(unknown), f"unknown WeDLM option; known: {', '.join(WeDLMDecodingConfig.keys())}")
    _refuse("inputs_embeds" in kwargs, "inputs_embeds", "WeDLM decoding needs token ids: pass input_ids")

    input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    if input_ids is None:
        raise ValueError("generate(strategy='wedlm') needs a prompt: pass input_ids (batch, length).")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    config, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    attention_mask = model_kwargs.pop("attention_mask", None)
    past_key_values = _cache_argument(model_kwargs)
    model_kwargs.pop("use_cache", None)
    _refuse(bool(model_kwargs), ", ".join(sorted(model_kwargs)), "not supported by strategy='wedlm'; remove it")

    options = WeDLMDecodingConfig.from_values(config, **explicit)  # the arguments over the generation config
    mask_token_id = _resolve_mask_token_id(model, config, tokenizer, mask_token_id)
    _validate_config(config, past_key_values)

    device = model.device
    input_ids = input_ids.to(device)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    else:
        attention_mask = attention_mask.to(device)
        _validate_padding(input_ids, attention_mask)
    _validate_input_ids(model, input_ids, attention_mask)
    prefixes = _prompt_prefixes(model, past_key_values, input_ids, attention_mask)
    model._prepare_special_tokens(config, True, device=device)
    max_new_tokens = _max_new_tokens(config, input_ids.shape[1])
    longest = int(attention_mask.sum(1).max())
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"max_position_embeddings ({limit}): lower max_new_tokens or shorten the prompt."
        )

    processors = model._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=input_ids.shape[1],
        encoder_input_ids=input_ids,
        logits_processor=logits_processor,
        device=device,
        model_kwargs={"attention_mask": attention_mask},
    )
    unsupported = [type(p).__name__ for p in processors if not isinstance(p, _SCORE_ONLY_WARPERS)]
    _refuse(
        bool(unsupported),
        "logits processors " + ", ".join(unsupported),
        "strategy='wedlm' honours only score-only sampling warpers (temperature, top_k, top_p, min_p, typical_p, "
        "epsilon_cutoff, eta_cutoff); unset the options or processors that add the others "
        "(e.g. repetition_penalty=1.0)",
    )
    criteria = _stopping_criteria(config, stopping_criteria, tokenizer)

    grammars = _row_grammars(grammar, len(input_ids), tokenizer, model)
    if config.num_return_sequences and config.num_return_sequences > 1:
        grammars = [g for g in grammars for _ in range(config.num_return_sequences)]
        prefixes = [p for p in prefixes for _ in range(config.num_return_sequences)]
        input_ids = input_ids.repeat_interleave(config.num_return_sequences, dim=0)
        attention_mask = attention_mask.repeat_interleave(config.num_return_sequences, dim=0)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError("`streamer` takes one sequence: generate with batch size 1 (and num_return_sequences=1).")
    stop_ids = set() if config._eos_token_tensor is None else set(config._eos_token_tensor.flatten().tolist())
    pad_token_id = None if config._pad_token_tensor is None else int(config._pad_token_tensor)
    can_stop_early = bool(stop_ids or criteria)
    if pad_token_id is None and can_stop_early and input_ids.shape[0] > 1:
        raise ValueError("Rows that stop early are padded with pad_token_id: set pad_token_id (or eos_token_id).")

    settings = DecodingSettings.of(
        options,
        max_new_tokens=max_new_tokens,
        sampler=FillSampler(bool(config.do_sample), processors),
        stop_ids=frozenset(stop_ids),
        keep_logits=bool(config.return_dict_in_generate and (config.output_scores or config.output_logits)),
    )
    decode_cache = None if _is_prompt_cache(past_key_values) else past_key_values  # read now, refilled at the end
    if config.cache_implementation == "static" or isinstance(past_key_values, StaticCache):
        tokens = longest + max_new_tokens
        decode_cache = _slot_cache(model, config, decode_cache, len(input_ids), tokens)
    elif config.compile_config is not None:  # transformers' warning that compile_config cannot be met
        model._valid_auto_compile_criteria({"past_key_values": decode_cache, "cache": decode_cache}, config)
    decoder = StreamingDecoder(
        model, mask_token_id, keep_cache=bool(config.return_dict_in_generate), cache=decode_cache
    )
    rows = [
        decoder.add(input_ids[b][attention_mask[b].bool()].tolist(), settings, prefix=p, grammar=g and g.matcher())
        for b, (g, p) in enumerate(zip(grammars, prefixes))
    ]
    stopping = BatchStoppingCriteria(criteria, input_ids, pad_token_id)
    if streamer is not None:
        streamer.put(input_ids.cpu())
    streamed = 0
    while decoder.busy:
        decoder.step()
        for index, keep in stopping.consult(rows).items():
            decoder.finish(rows[index], keep=keep, reason="stop")
        if streamer is not None and len(rows[0].generated) > streamed:
            streamer.put(torch.tensor(rows[0].generated[streamed:]))
            streamed = len(rows[0].generated)
    if streamer is not None:
        streamer.end()

    new = max(len(row.generated) for row in rows)
    generated = torch.full((len(rows), new), pad_token_id if pad_token_id is not None else 0, dtype=torch.long)
    for row in rows:
        generated[row.index, : len(row.generated)] = torch.tensor(row.generated, dtype=torch.long)
    sequences = torch.cat([input_ids, generated.to(device)], dim=1)
    if not config.return_dict_in_generate:
        return sequences
    raw = _ar_logits(rows, new, device) if settings.keep_logits else None
    scores = None
    if raw is not None and config.output_scores:
        width = input_ids.shape[1]
        scores = tuple(processors(sequences[:, : width + i], step.clone()) for i, step in enumerate(raw))
        _restrict_scores(scores, rows, grammars)
    return WeDLMGenerateOutput(
        sequences=sequences,
        scores=scores,
        logits=raw if config.output_logits else None,
        wedlm_stats=[row.stats for row in rows],
        **{_OUTPUT_CACHE_FIELD: _aligned_cache(rows, attention_mask, sequences.shape[1], past_key_values)},
    )


def _row_grammars(grammar, batch: int, tokenizer, model) -> list:
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


def _restrict_scores(scores: tuple, rows, grammars: list) -> None:
    """`output_scores` under a grammar hold what AR + the grammar's processor would: -inf where it forbids."""
    for row, grammar in zip(rows, grammars):
        if grammar is None:
            continue
        state = grammar.matcher()
        for i, token in enumerate(row.generated):
            allowed = allowed_tokens(state, row.settings.stop_ids).to(scores[i].device)
            scores[i][row.index].masked_fill_(~allowed, float("-inf"))
            if token not in row.settings.stop_ids:
                state.advance([token])


def _ar_logits(rows, new: int, device) -> tuple[torch.Tensor, ...]:
    """One (batch, vocab) float32 tensor per generated position, as AR `generate` returns its logits: each row's AR
    logits at that position given its committed text (zeros past a row's end)."""
    vocab = rows[0].logits[0].shape[-1]
    out = []
    for i in range(new):
        step = torch.zeros((len(rows), vocab), dtype=torch.float32, device=device)
        for row in rows:
            if i < len(row.logits):
                step[row.index] = row.logits[i]
        out.append(step)
    return tuple(out)


def _slot_cache(model, config, given, rows: int, tokens: int) -> SlotCache:
    """The static decoding cache: one slot per row, room for prompt + new tokens. Decoding steps
    run compiled where transformers would compile AR decoding (`compile_config`, `disable_compile`, the device)."""
    text = model.config.get_text_config()
    _refuse(
        "flash" in (getattr(model.config, "_attn_implementation", None) or ""),
        "a static cache with flash attention",
        "the static step attends under a 4D mask that flash attention cannot take; load the model with "
        "attn_implementation='sdpa' (default) or drop cache_implementation='static'",
    )
    _refuse(
        any(kind != "full_attention" for kind in getattr(text, "layer_types", None) or ()),
        "a static cache with sliding-window layers",
        "load the model with use_sliding_window=False",
    )
    length = tokens
    if given is not None:
        _refuse(
            given.get_seq_length() != 0,
            "a StaticCache that is not empty",
            "pass a new or reset() StaticCache (to reuse a prompt's K/V, pass them in a DynamicCache)",
        )
        capacity = given.get_max_length() if hasattr(given, "get_max_length") else given.get_max_cache_shape()
        _refuse(
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


def _refuse(condition: bool, argument: str, fix: str) -> None:
    if condition:
        raise ValueError(f"generate(strategy='wedlm') does not accept {argument}: {fix}.")


def _cache_argument(model_kwargs: dict):
    """The cache given as `past_key_values` (transformers <= 5.23) or `cache` (its name from 5.24 on)."""
    past_key_values = model_kwargs.pop("past_key_values", None)
    cache = model_kwargs.pop("cache", None)
    if past_key_values is not None and cache is not None and past_key_values is not cache:
        raise ValueError("Pass the cache once: as `cache` (or `past_key_values`, its older name), not both.")
    return cache if cache is not None else past_key_values


def _resolve_mask_token_id(model, config, tokenizer, explicit) -> int:
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


def _validate_config(config, past_key_values) -> None:
    _refuse((config.num_beams or 1) > 1, f"num_beams={config.num_beams}", "beam search is unsupported; set num_beams=1")
    _refuse((config.num_beam_groups or 1) > 1, "num_beam_groups", "beam search is unsupported; set num_beam_groups=1")
    _refuse(config.use_cache is False, "use_cache=False", "WeDLM decoding is built on the KV cache; drop it")
    _refuse(
        config.cache_implementation not in (None, "dynamic", "static"),
        f"cache_implementation={config.cache_implementation!r}",
        "WeDLM decoding runs on a DynamicCache (default) or a static one (cache_implementation='static')",
    )
    _refuse(
        past_key_values is not None and not isinstance(past_key_values, (DynamicCache, StaticCache)),
        f"this cache ({type(past_key_values).__name__})",
        "pass a DynamicCache (empty, or holding a prompt's K/V to reuse), an empty StaticCache, or none",
    )
    _refuse(
        isinstance(past_key_values, DynamicCache)
        and config.cache_implementation == "static"
        and not _is_prompt_cache(past_key_values),
        "a DynamicCache with cache_implementation='static'",
        "pass a StaticCache, or no cache (a DynamicCache goes with it only as a prompt cache to reuse, and this one "
        "is empty)",
    )
    for option in ("output_attentions", "output_hidden_states", "token_healing"):
        _refuse(bool(getattr(config, option, None)), f"{option}=True", "it is not produced by WeDLM decoding; drop it")
    for option in ("penalty_alpha", "dola_layers", "prompt_lookup_num_tokens", "constraints", "force_words_ids"):
        _refuse(getattr(config, option, None) is not None, option, "that decoding mode is unsupported; drop it")


def _validate_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
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


def _validate_input_ids(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
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


def _max_new_tokens(config, prompt_width: int) -> int:
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


def _stopping_criteria(config, stopping_criteria, tokenizer) -> list:
    criteria = list(stopping_criteria or [])
    if config.stop_strings is not None:
        if tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer: pass tokenizer=... to generate.")
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=config.stop_strings))
    if config.max_time is not None:
        criteria.append(MaxTimeCriteria(max_time=config.max_time))
    return criteria


def _is_prompt_cache(cache) -> bool:
    return isinstance(cache, DynamicCache) and cache.get_seq_length() > 0


def _prompt_prefixes(model, cache, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list:
    """Per prompt row, the K/V a passed prompt cache holds for the row's first tokens (per layer (heads, n, head_dim),
    for `StreamingDecoder.add(prefix=)`), or None.

    transformers' prompt reuse: a cache of n columns holds the K/V of input_ids[:, :n], so under left padding row b
    (real tokens from column s_b on) takes columns s_b..n-1. Trailing all-zero columns are left out, to be fed again:
    they are where the cache `generate(strategy="wedlm")` returns has no K/V (the tokens that ended a row without a
    forward, docs/algorithm.md section 3.c).
    """
    batch, width = input_ids.shape
    if not _is_prompt_cache(cache):
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


def _aligned_cache(rows, attention_mask: torch.Tensor, width: int, cache: DynamicCache | None) -> DynamicCache:
    """Every row's committed K/V placed at the columns its tokens occupy in `sequences` (zeros elsewhere).

    A cache passed in by the caller (the decoder's scratch, or a prompt cache it read) is refilled with this layout
    and returned, as transformers' generate extends the cache it is given.
    """
    out = cache if cache is not None else DynamicCache()
    out.reset()
    prompt_start = (attention_mask.shape[1] - attention_mask.sum(1)).tolist()
    ordered = sorted(rows, key=lambda row: row.index)
    for layer_idx in range(len(ordered[0].kv)):
        keys, values = [], []
        for row in ordered:  # each row padded with zeros around its tokens: one copy per tensor
            k, v = row.kv[layer_idx]
            start = prompt_start[row.index]
            around = (0, 0, start, width - start - k.shape[1])
            keys.append(F.pad(k, around))
            values.append(F.pad(v, around))
        out.update(_stacked(keys), _stacked(values), layer_idx)
    return out


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The rows' tensors as one batch (a lone row's without another copy)."""
    return tensors[0][None] if len(tensors) == 1 else torch.stack(tensors)
