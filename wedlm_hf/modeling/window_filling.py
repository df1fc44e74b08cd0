"""Which masks of the window get filled in a step, and with which tokens.

docs/algorithm.md section 3.d: entropy of the raw logits (mask token suppressed), plus a distance penalty from the
leftmost remaining mask; every mask under the threshold is filled, or else the single lowest one (ties: leftmost). The
tokens come from the sampler, which applies the sampling warpers to the same suppressed logits.
"""

import inspect

import torch
from transformers import LogitsProcessorList
from transformers.generation import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from .processor_contexts import Contexts
from .sampler_batch import batch_form, process


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The index of the largest value over the last dimension: `argmax`'s (the first of equal maxima, as documented
    for both), taken through `max`, which a CPU computes in a third of argmax's time over a vocabulary."""
    return logits.max(dim=-1).indices


def suppress_token(logits: torch.Tensor, token_id: int) -> torch.Tensor:
    """Float logits (at least float32) with `token_id` at -inf, so the mask token is never predicted."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits.clone()
    logits.select(-1, token_id).fill_(float("-inf"))  # what `logits[..., token_id] = ...` does, in fewer calls
    return logits


def entropy(logits: torch.Tensor, maxima: torch.Tensor | None = None) -> torch.Tensor:
    """Shannon entropy in nats of softmax(logits) over the last dimension; -inf logits contribute 0. `maxima`: the
    logits' maxima over that dimension where the caller has them (the greedy tokens' `max` gives them).

    H = log(s) - sum(e * z) / s with z = logits - max, e = exp(z), s = sum(e): one exponential per logit, where
    log_softmax followed by exp takes two (on a CPU the step's largest cost outside the forward)."""
    if maxima is None:
        maxima = logits.max(dim=-1).values
    shifted = (logits - maxima[..., None]).clamp_min_(torch.finfo(logits.dtype).min)
    weights = shifted.exp()
    total = weights.sum(-1)
    return total.log() - (weights * shifted).sum(-1) / total


def choose_fills(entropies: list[float], offsets: list[int], threshold: float | None, pos_penalty: float) -> list[int]:
    """Indices (into the ascending list of remaining masks) to fill this step.

    adjusted = entropy + pos_penalty * (offset - leftmost offset); all with adjusted < threshold, else the argmin.
    `threshold=None` fills exactly one mask per step.
    """
    leftmost = offsets[0]
    adjusted = [h + pos_penalty * (o - leftmost) for h, o in zip(entropies, offsets)]
    if threshold is not None:
        confident = [i for i, a in enumerate(adjusted) if a < threshold]
        if confident:
            return confident
    return [min(range(len(adjusted)), key=adjusted.__getitem__)]


# Warpers that read only the scores, so they mean the same at any slot, whatever its context.
SCORE_ONLY_PROCESSORS = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
)


def reads_context(processor) -> bool:
    """Whether a logits processor reads `input_ids` (a repetition penalty, a minimum length, a bad-words ban): one
    that does is applied slot by slot with that slot's own context. A processor class may declare
    `reads_input_ids = False` to be treated as score-only."""
    return not isinstance(processor, SCORE_ONLY_PROCESSORS) and getattr(processor, "reads_input_ids", True)


def ignores_padding(processor) -> bool:
    """Whether a context-reading processor gives each row what it gives that row alone when its `input_ids` are
    right-padded with the vocabulary size: transformers' repetition penalty, which maps ids past the vocabulary to a
    column it drops (not with a per-row `prompt_ignore_length`, state shaped for one batch), or a processor that
    declares `ignores_ids_past_vocabulary = True`. The positions of a window, each with a context one token longer
    than the last, are then processed as one block, not one length at a time."""
    if type(processor) is RepetitionPenaltyLogitsProcessor:  # not a subclass, which may read ids otherwise
        return not isinstance(processor.prompt_ignore_length, torch.Tensor)
    return getattr(processor, "ignores_ids_past_vocabulary", False)


def sampling_processors(model, config, input_ids, attention_mask=None, logits_processor=None) -> LogitsProcessorList:
    """The logits processors AR `generate` builds for a generation `config` on these prompts, the caller's own
    `logits_processor` merged in as generate merges them: what `generate(strategy="wedlm")` and the server sample
    with."""
    return model._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=input_ids.shape[1],
        encoder_input_ids=input_ids,
        logits_processor=logits_processor,
        device=input_ids.device,
        model_kwargs={"attention_mask": attention_mask},
    )


class FillSampler:
    """Greedy argmax, or sampling, after `generate`'s logits processors (temperature, top-k, top-p, penalties, ...).

    The same sampler draws the fills of masked slots and, in lossless decoding, the model's own AR tokens; the
    optional `generator` makes one row's draws independent of the others' (a server's per-request `seed`). Where a
    processor reads the context (`reads_context`), each logits row is processed with its own token ids before it,
    as AR `generate` would process that position (`contexts`: one 1-D LongTensor per row): every row at once, the
    contexts right-padded, where each processor that reads them ignores padding (`ignores_padding`: a repetition
    penalty); otherwise rows of one length together unless the processors hold per-row state (`row_state`: built
    for a batch of one, as transformers builds a repetition penalty for a padded row). Score-only processors take
    the whole block at once. A sampler with a generator of its own and only the common warpers processes as a batch
    of rows does (`sampler_batch`), alone or with others. What it does is fixed when it is built (`own_choice`,
    `reads_context`, its batch form): build a new sampler for other processors.
    """

    def __init__(
        self,
        do_sample: bool = False,
        warpers: LogitsProcessorList | None = None,
        generator=None,
        row_state: bool = False,
    ):
        self.do_sample = do_sample
        self.warpers = warpers or LogitsProcessorList()
        self.own_choice = do_sample or bool(self.warpers)  # more than the plain argmax: a draw, or processors
        for processor in self.warpers:  # what `LogitsProcessorList` checks at every call, checked once
            parameters = list(inspect.signature(processor.__call__).parameters)
            if len(parameters) > 2:
                raise ValueError(
                    f"The logits processor {type(processor).__name__} takes more than (input_ids, scores) "
                    f"({', '.join(parameters)}): WeDLM decoding calls processors with those two only, as `generate` "
                    "does without extra keyword arguments. Pass processors whose __call__ takes (input_ids, scores)."
                )
        self.generator = generator
        readers = [p for p in self.warpers if reads_context(p)]
        self.reads_context = bool(readers)
        self.padded_contexts = self.reads_context and all(map(ignores_padding, readers))
        self.row_state = row_state
        self.batch_form = batch_form(self)  # (what samplers it processes with, its settings): `sampler_batch`

    def scores(self, logits: torch.Tensor, contexts=None) -> torch.Tensor:
        """The processed float logits (N, vocab): `contexts` (one per row: `Contexts`, or a list of tensors) are
        needed where `reads_context`."""
        logits = logits.float()
        if self.reads_context and (contexts is None or len(contexts) != logits.shape[0]):
            raise RuntimeError("A context-reading logits processor got no context: this is a bug in wedlm_hf.")
        if self.batch_form is not None:  # as it processes with others (`sampler_batch`), alone too
            return process(logits, [self], [logits.shape[0]], Contexts.of(contexts) if self.reads_context else None)
        if not self.reads_context:
            no_context = torch.empty((logits.shape[0], 0), dtype=torch.long, device=logits.device)
            return self._process(no_context, logits)
        if self.padded_contexts:  # one block: each row's context, then ids past the vocabulary, which they ignore
            ids = Contexts.of(contexts).padded(logits.shape[-1])
            return self._process(ids, logits.clone())  # a copy: the processors may write in place
        if self.row_state:
            return torch.cat([self._process(c[None], logits[n : n + 1].clone()) for n, c in enumerate(contexts)])
        by_length: dict[int, list[int]] = {}
        for n, context in enumerate(contexts):
            by_length.setdefault(len(context), []).append(n)
        out = torch.empty_like(logits)
        for members in by_length.values():
            ids = torch.stack([contexts[n] for n in members])
            out[members] = self._process(ids, logits[members])  # indexing copies: the processors may write in place
        return out

    def _process(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The processors in turn, as `LogitsProcessorList.__call__` applies them, without the `inspect.signature`
        of every processor it takes at every call (about 20 us each; a server samples each request with its own
        sampler, so that was per row, per processor, several times a step): checked once, when the sampler is made."""
        for processor in self.warpers:
            scores = processor(input_ids, scores)
        return scores

    def probabilities(self, logits: torch.Tensor, contexts: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The distribution (N, vocab) a sample is drawn from: softmax of the processed float logits."""
        return torch.softmax(self.scores(logits, contexts), dim=-1)

    def draw(self, probabilities: torch.Tensor) -> torch.Tensor:
        """One token id per row of a (N, vocab) distribution: the argmax of p / E with E ~ Exp(1), which is what
        `torch.multinomial` draws one sample with (the same tokens from the same generator), without its checks of
        the values, each a read of the device."""
        noise = torch.empty_like(probabilities).exponential_(1, generator=self.generator)
        return (probabilities / noise).argmax(dim=-1)

    def uniforms(self, count: int, device) -> torch.Tensor:
        """`count` U(0, 1) draws from the same stream (as `SamplerBatch.uniforms` draws them for its samplers)."""
        return torch.rand(count, generator=self.generator, device=device)

    def rows(self, indices: list[int]) -> "FillSampler":
        """The sampler of some of the rows it samples (`SamplerBatch.rows`): itself."""
        return self

    def uniform(self, device) -> float:
        """A U(0, 1) draw from the same stream, for accepting or rejecting a draft."""
        return float(torch.rand((), generator=self.generator, device=device))

    def __call__(self, logits: torch.Tensor, contexts: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Token ids (N,) for logits (N, vocab) (for fills, the mask token is already suppressed)."""
        if not self.do_sample:
            return greedy(self.scores(logits, contexts) if self.warpers else logits)
        return self.draw(self.probabilities(logits, contexts))
