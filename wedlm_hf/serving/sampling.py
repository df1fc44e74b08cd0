"""A choice's sampler: the request's sampling fields over the checkpoint's defaults, as logits processors.

The processors are the ones `generate` builds (the core's `sampling_processors`: `repetition_penalty`, temperature,
`top_k`, `top_p`, `min_p`), after two that only an OpenAI-style request asks for and transformers has no processor
for: `logit_bias` (added to the logits) and `presence_penalty` / `frequency_penalty` (subtracted once for a token
that occurs in the completion so far, and once per occurrence). They come first, as in vLLM, so temperature scales
them too. Every choice gets its own generator (seeded from the request's `seed` and the choice index), so a sampled
row draws the same tokens whatever else shares the batch; greedy rows without processors share one sampler, which
lets the decoder take their argmax in one call.
"""

import secrets

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from ..modeling.window_filling import FillSampler, sampling_processors

GREEDY = FillSampler(False)
GREEDY_BELOW = 1e-5  # a temperature below it decodes greedily, as vLLM's does


class LogitBias(LogitsProcessor):
    """OpenAI's `logit_bias`: a fixed value added to given tokens' logits (-100 bans a token, 100 all but forces
    it). It reads the scores only."""

    reads_input_ids = False

    def __init__(self, bias: dict[int, float], vocab_size: int, device):
        self.vector = torch.zeros(vocab_size, device=device)
        self.vector[list(bias)] = torch.tensor(list(bias.values()), device=device)

    def __call__(self, input_ids, scores):
        return scores + self.vector[: scores.shape[-1]].to(scores.dtype)

    @staticmethod
    def process_rows(scores, processors: list["LogitBias"], owners: list[int], contexts=None):
        """The rows of several requests' biases at once (row r: `processors[owners[r]]`'s), as each adds its own."""
        vectors = torch.stack([processor.vector[: scores.shape[-1]] for processor in processors])
        return scores + vectors.to(scores.dtype)[torch.tensor(owners).to(scores.device, non_blocking=True)]


class CompletionPenalties(LogitsProcessor):
    """OpenAI's `presence_penalty` and `frequency_penalty`: for each token of the vocabulary, counted over the
    completion so far (the tokens after `prompt_length`; the prompt is not counted, as OpenAI defines them),
    logit -= frequency_penalty * count + presence_penalty * (count > 0). Ids past the vocabulary are not counted:
    the decoder pads the contexts of a window's positions with them to process the positions as one block."""

    ignores_ids_past_vocabulary = True

    def __init__(self, prompt_length: int, presence: float, frequency: float):
        self.prompt_length, self.presence, self.frequency = prompt_length, presence, frequency

    def __call__(self, input_ids, scores):
        completion = input_ids[:, self.prompt_length :].clamp(max=scores.shape[-1])  # padding: the column dropped
        counts = scores.new_zeros(scores.shape[0], scores.shape[-1] + 1)
        counts = counts.scatter_add_(1, completion, torch.ones_like(completion, dtype=scores.dtype))[:, :-1]
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)

    @staticmethod
    def process_rows(scores, processors: list["CompletionPenalties"], owners: list[int], contexts):
        """The rows of several requests' penalties at once (row r: `processors[owners[r]]`'s, its context
        `contexts[r]`), as each computes its own."""
        prompts = [processors[owner].prompt_length for owner in owners]
        counts = contexts.counts(scores.shape[-1], scores.dtype, prompts)
        settings = torch.tensor([[p.frequency, p.presence] for p in processors], dtype=torch.float64)
        frequency, presence = settings.to(scores.device, non_blocking=True).to(scores.dtype).unbind(1)
        at = torch.tensor(owners).to(scores.device, non_blocking=True)
        return scores - frequency[at][:, None] * counts - presence[at][:, None] * (counts > 0).to(scores.dtype)


def choice_sampler(model, request, defaults: GenerationConfig, index: int, prompt: list[int]) -> FillSampler:
    """The sampler of choice `index` (prompt `prompt`) of a parsed request; `defaults`: the checkpoint's
    generation config, whose sampling settings (and `repetition_penalty` / `min_p`, which then apply to every
    request that does not set them) a request's fields override. Temperature 0 (below GREEDY_BELOW) means greedy;
    without a temperature, `top_p` < 1, `top_k` or `min_p` mean sampling."""
    do_sample, temperature = bool(defaults.do_sample), defaults.temperature
    if request.temperature is not None:  # (below GREEDY_BELOW, dividing by it overflows the logits)
        do_sample, temperature = request.temperature >= GREEDY_BELOW, request.temperature
    elif _truncates(request):  # a truncation asked for means sampling, as where the default temperature is 1
        do_sample = True
    config = GenerationConfig(
        do_sample=do_sample,
        temperature=temperature if do_sample else None,
        top_p=_given(request.top_p, defaults.top_p) if do_sample else None,
        top_k=_given(request.top_k, defaults.top_k) if do_sample else None,
        min_p=_given(request.min_p, defaults.min_p) if do_sample else None,
        repetition_penalty=_given(request.repetition_penalty, defaults.repetition_penalty),
    )
    own = LogitsProcessorList()
    if request.logit_bias:
        own.append(LogitBias(request.logit_bias, model.config.get_text_config().vocab_size, model.device))
    if request.presence_penalty or request.frequency_penalty:
        own.append(CompletionPenalties(len(prompt), request.presence_penalty or 0.0, request.frequency_penalty or 0.0))
    ids = torch.tensor([prompt], device=model.device)
    processors = LogitsProcessorList([*own, *sampling_processors(model, config, ids)])
    if not do_sample:
        return FillSampler(False, processors) if processors else GREEDY
    seed = secrets.randbits(62) if request.seed is None else (request.seed * 1_000_003 + index) % 2**62
    generator = torch.Generator(device=model.device).manual_seed(seed)
    return FillSampler(True, processors, generator=generator)


def _truncates(request) -> bool:
    """Whether the request asks to sample from part of the distribution (top_p < 1, top_k, min_p)."""
    return (request.top_p is not None and request.top_p < 1) or bool(request.top_k) or bool(request.min_p)


def _given(value, default):
    return default if value is None else value
