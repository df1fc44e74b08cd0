"""`generate_wedlm`: transformers-style arguments in, streaming parallel decoding out.

This is the user-facing front of the decoder: it reads the same arguments as `model.generate` (generation
config, kwargs, logits processors, stopping criteria, streamer), refuses every option the strategy cannot honour
with an error that says what to change, runs `StreamingDecoder`, and returns `generate`-shaped output. It works for
any causal LM that takes `position_ids` and a `DynamicCache` (WeDLM, Qwen2, Qwen3, Llama, ...); its signature is
the one transformers uses for Hub `custom_generate` methods.
"""

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from transformers import DynamicCache, LogitsProcessorList, StaticCache, StoppingCriteriaList
from transformers.generation import (
    GenerateDecoderOnlyOutput,
)

from .batch_stopping import BatchStoppingCriteria
from .decoding_config import WeDLMDecodingConfig
from .decoding_state import DecodingSettings, WeDLMStats
from .execution_device import execution_device
from .generation_inputs import (
    build_stopping_criteria,
    is_prompt_cache,
    prompt_prefixes,
    refuse,
    resolve_mask_token_id,
    resolve_max_new_tokens,
    row_grammars,
    slot_cache,
    validate_config,
    validate_input_ids,
    validate_padding,
)
from .grammar_commit import allowed_tokens
from .rank_random_state import share_random_state
from .streaming_decoder import StreamingDecoder
from .transformers_versions import OUTPUT_CACHE_FIELD, cache_argument
from .window_filling import FillSampler, sampling_processors

STRATEGIES = ("ar", "wedlm")
# What a WeDLM generation config holds by default: the strategy, and every option of `WeDLMDecodingConfig`.
WEDLM_GENERATION_DEFAULTS = {"strategy": "ar", **WeDLMDecodingConfig().as_kwargs()}
# Options that change nothing unless another unsupported option (beam search, assisted decoding) is also on.
_INERT_OPTIONS = {"early_stopping", "length_penalty"}


@dataclass
class WeDLMGenerateOutput(GenerateDecoderOnlyOutput):
    """`generate` output plus `wedlm_stats`: one `WeDLMStats` per returned sequence.

    `cache` (the field's name from transformers 5.24 on; `past_key_values` before, and readable under both names)
    holds every committed token's K/V, laid out column for column like `sequences` (padding columns are zeros).
    """

    wedlm_stats: list[WeDLMStats] | None = None

    if OUTPUT_CACHE_FIELD == "past_key_values":

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
        wedlm_context_drafts (bool, True): also draft the tokens that followed the latest earlier occurrence of the
            text's suffix (prompt lookup's rule), kept where AR agrees; in the default mode also AR's own next token
            and checks of its unsure fills (docs/algorithm.md section 3.m); off: the paper's rule, and in lossless
            mode the model's own drafts only.
        wedlm_context_ngram (int, 3): the longest suffix matched for context drafts (1 to 16), tried down to one token.
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
    refuse(assistant_model is not None, "assistant_model", "assisted decoding is not part of WeDLM decoding; drop it")
    refuse(prefix_allowed_tokens_fn is not None, "prefix_allowed_tokens_fn", "constrained decoding is unsupported")
    guided = negative_prompt_ids is not None or negative_prompt_attention_mask is not None
    refuse(guided, "negative_prompt_ids", "classifier-free guidance is unsupported")
    refuse(bool(synced_gpus), "synced_gpus", "ranks would run different numbers of forwards; pass synced_gpus=False")
    explicit = _prepare_wedlm_options(kwargs)
    input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    config, attention_mask, given_cache = _prepare_config(model, generation_config, input_ids, kwargs)
    options = WeDLMDecodingConfig.from_values(config, **explicit)  # the arguments over the generation config
    mask_token_id = resolve_mask_token_id(model, config, tokenizer, mask_token_id)
    validate_config(config, given_cache)
    share_random_state(model)  # a model split over ranks: they must draw the same tokens

    input_ids, attention_mask, prefixes, max_new = _prepare_inputs(
        model, config, input_ids, attention_mask, given_cache
    )
    processors = sampling_processors(model, config, input_ids, attention_mask, logits_processor)
    criteria = build_stopping_criteria(config, stopping_criteria, tokenizer)
    grammars = row_grammars(grammar, len(input_ids), tokenizer, model)
    settings, pad_token_id = _prepare_settings(config, options, processors, criteria, max_new, len(input_ids))
    copies = max(config.num_return_sequences or 1, 1)  # each prompt's rows side by side, as generate returns them
    settings = _row_settings(model, config, settings, input_ids, attention_mask, logits_processor, copies)
    grammars, prefixes = [g for g in grammars for _ in range(copies)], [p for p in prefixes for _ in range(copies)]
    input_ids, attention_mask = input_ids.repeat_interleave(copies, 0), attention_mask.repeat_interleave(copies, 0)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError("`streamer` takes one sequence: generate with batch size 1 (and num_return_sequences=1).")

    decoder = _prepare_decoder(model, config, given_cache, mask_token_id, len(input_ids), attention_mask, max_new)
    rows = _prepare_rows(decoder, input_ids, attention_mask, settings, grammars, prefixes)
    _decode(decoder, rows, BatchStoppingCriteria(criteria, input_ids, pad_token_id), streamer, input_ids)
    return _output(config, rows, input_ids, attention_mask, pad_token_id, processors, grammars, given_cache)


def _prepare_rows(decoder, input_ids, attention_mask, settings: list, grammars: list, prefixes: list) -> list:
    """The decoder's rows, one per sequence: its prompt, and the padding before it that context-reading processors
    see."""
    rows = []
    for b, (g, p) in enumerate(zip(grammars, prefixes)):
        real = attention_mask[b].bool()
        padding = input_ids[b][~real].tolist()
        rows.append(
            decoder.add(input_ids[b][real].tolist(), settings[b], prefix=p, grammar=g and g.matcher(), padding=padding)
        )
    return rows


def _prepare_wedlm_options(kwargs: dict) -> dict:
    """Pops the strategy and the `wedlm_*` options from generate's keyword arguments; unknown ones are refused."""
    strategy = kwargs.pop("strategy", "wedlm")
    refuse(strategy != "wedlm", "strategy", f"generate_wedlm runs strategy='wedlm', got {strategy!r}")
    explicit = {key: kwargs.pop(key) for key in WeDLMDecodingConfig.keys() if key in kwargs}
    unknown = sorted(k for k in kwargs if k.startswith("wedlm_"))
    refuse(bool(unknown), ", ".join(unknown), f"unknown WeDLM option; known: {', '.join(WeDLMDecodingConfig.keys())}")
    refuse("inputs_embeds" in kwargs, "inputs_embeds", "WeDLM decoding needs token ids: pass input_ids")
    return explicit


def _prepare_config(model, generation_config, input_ids, kwargs: dict):
    """generate's own preparation of the generation config from the model's and the keyword arguments; the
    attention mask and cache are taken from what remains, and anything else is refused."""
    if input_ids is None:
        raise ValueError("generate(strategy='wedlm') needs a prompt: pass input_ids (batch, length).")
    config, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    attention_mask = model_kwargs.pop("attention_mask", None)
    given_cache = cache_argument(model_kwargs)
    model_kwargs.pop("use_cache", None)
    refuse(bool(model_kwargs), ", ".join(sorted(model_kwargs)), "not supported by strategy='wedlm'; remove it")
    return config, attention_mask, given_cache


def _prepare_inputs(model, config, input_ids, attention_mask, given_cache):
    """The prompts on the model's device with their mask, checked; the prompt cache's prefix per row; the budget."""
    device = execution_device(model)
    input_ids = (input_ids[None] if input_ids.dim() == 1 else input_ids).to(device)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    else:
        attention_mask = attention_mask.to(device)
        validate_padding(input_ids, attention_mask)
    validate_input_ids(model, input_ids, attention_mask)
    prefixes = prompt_prefixes(model, given_cache, input_ids, attention_mask)
    model._prepare_special_tokens(config, True, device=device)
    max_new = resolve_max_new_tokens(config, input_ids.shape[1])
    longest = int(attention_mask.sum(1).max())
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and longest + max_new > limit:
        raise ValueError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new}) exceeds the model's "
            f"max_position_embeddings ({limit}): lower max_new_tokens or shorten the prompt."
        )
    return input_ids, attention_mask, prefixes, max_new


def _row_settings(model, config, settings, input_ids, attention_mask, logits_processor, copies: int) -> list:
    """Each row's settings: the batch's, or, where a processor reads the context, one sampler per prompt with
    processors built for that prompt alone (transformers' processors may hold per-row state, such as a repetition
    penalty's padding lengths, shaped for the batch they were built for)."""
    if not settings.sampler.reads_context:
        return [settings] * (len(input_ids) * copies)
    own, by_mask = [], {}  # a processor's per-row state comes from the row's attention mask only
    for b in range(len(input_ids)):
        key = tuple(attention_mask[b].tolist())
        if key not in by_mask:
            padded = not all(key)  # without padding, the mask changes nothing and the processors hold no row state
            mask = attention_mask[b : b + 1] if padded else None
            processors = sampling_processors(model, config, input_ids[b : b + 1], mask, logits_processor)
            sampler = FillSampler(settings.sampler.do_sample, processors, row_state=padded)
            by_mask[key] = replace(settings, sampler=sampler)
        own += [by_mask[key]] * copies
    return own


def _prepare_settings(config, options, processors, criteria, max_new: int, batch: int):
    """The rows' decoding settings, and the id that pads rows that end early."""
    stop_ids = set() if config._eos_token_tensor is None else set(config._eos_token_tensor.flatten().tolist())
    pad_token_id = None if config._pad_token_tensor is None else int(config._pad_token_tensor)
    if pad_token_id is None and (stop_ids or criteria) and batch > 1:
        raise ValueError("Rows that stop early are padded with pad_token_id: set pad_token_id (or eos_token_id).")
    settings = DecodingSettings.of(
        options,
        max_new_tokens=max_new,
        sampler=FillSampler(bool(config.do_sample), processors),
        stop_ids=frozenset(stop_ids),
        keep_logits=bool(config.return_dict_in_generate and (config.output_scores or config.output_logits)),
    )
    return settings, pad_token_id


def _prepare_decoder(model, config, given_cache, mask_token_id: int, rows: int, attention_mask, max_new: int):
    """The decoder on the cache generate asked for: the given DynamicCache (a prompt cache is read, then refilled at
    the end), a new one, or a static slot cache (`cache_implementation="static"` or a StaticCache given)."""
    decode_cache = None if is_prompt_cache(given_cache) else given_cache
    if config.cache_implementation == "static" or isinstance(given_cache, StaticCache):
        tokens = int(attention_mask.sum(1).max()) + max_new
        decode_cache = slot_cache(model, config, decode_cache, rows, tokens)
    elif config.compile_config is not None:  # transformers' warning that compile_config cannot be met
        model._valid_auto_compile_criteria({"past_key_values": decode_cache, "cache": decode_cache}, config)
    return StreamingDecoder(model, mask_token_id, keep_cache=bool(config.return_dict_in_generate), cache=decode_cache)


def _decode(decoder: StreamingDecoder, rows: list, stopping: BatchStoppingCriteria, streamer, input_ids) -> None:
    """The loop: a step, the stopping criteria, the streamer's new text (and, for a streamer with `put_draft`, the
    window's drafts), until every row is done."""
    if streamer is not None:
        streamer.put(input_ids.cpu())
    drafts = streamer is not None and hasattr(streamer, "put_draft")
    streamed = 0
    while decoder.busy:
        decoder.step()
        for index, keep in stopping.consult(rows).items():
            decoder.finish(rows[index], keep=keep, reason="stop")
        if streamer is not None and len(rows[0].generated) > streamed:
            streamer.put(torch.tensor(rows[0].generated[streamed:]))
            streamed = len(rows[0].generated)
        if drafts and not rows[0].done and any(slot is not None for slot in rows[0].window):
            streamer.put_draft(value=window_draft(rows[0], decoder.mask_token_id))
    if streamer is not None:
        streamer.end()


def window_draft(row, mask_token_id: int) -> torch.Tensor:
    """The row's window as a (1, slots) tensor of token ids, open masks as `mask_token_id`: the tokens placed after
    the committed text that the next forwards may commit, as transformers' diffusion streamers take a draft
    (`TextDiffusionStreamer.put_draft(value=...)`)."""
    return torch.tensor([[mask_token_id if slot is None else slot.token for slot in row.window]])


def _output(config, rows, input_ids, attention_mask, pad_token_id, processors, grammars, given_cache):
    """`sequences` (rows that ended early padded), or with `return_dict_in_generate` a `WeDLMGenerateOutput`."""
    device = input_ids.device
    new = max(len(row.generated) for row in rows)
    generated = torch.full((len(rows), new), pad_token_id if pad_token_id is not None else 0, dtype=torch.long)
    for row in rows:
        generated[row.index, : len(row.generated)] = torch.tensor(row.generated, dtype=torch.long)
    sequences = torch.cat([input_ids, generated.to(device)], dim=1)
    if not config.return_dict_in_generate:
        return sequences
    raw = _ar_logits(rows, new, device) if rows[0].settings.keep_logits else None
    scores = None
    if raw is not None and config.output_scores:
        width = input_ids.shape[1]
        scores = tuple(processors(sequences[:, : width + i], step.clone()) for i, step in enumerate(raw))
        _drawn_scores(scores, rows)
        _restrict_scores(scores, rows, grammars)
    return WeDLMGenerateOutput(
        sequences=sequences,
        scores=scores,
        logits=raw if config.output_logits else None,
        wedlm_stats=[row.stats for row in rows],
        **{OUTPUT_CACHE_FIELD: _aligned_cache(rows, attention_mask, sequences.shape[1], given_cache)},
    )


def _drawn_scores(scores: tuple, rows) -> None:
    """A default-mode token drawn at its masked slot was drawn from that slot's distribution, not from AR's at its
    position: its score is the log of the distribution it was drawn from, as AR sampling's scores are the
    processed logits its token was drawn from (so every emitted token's score is finite)."""
    for row in rows:
        for i, q in enumerate(row.draws):
            if q is not None:
                scores[i][row.index] = q.float().log().to(scores[i].device)


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
