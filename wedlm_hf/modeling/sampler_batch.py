"""Rows that sample with samplers of their own, processed as one batch.

A server samples each request with a sampler and a generator of its own (a seed per request), so a step that
processed each sampler's logits apart would cost every row its own operators (about forty a row a step: the
temperature, top-k's `topk`, top-p's sort, softmax and scatter, the draw). Where a sampler's processors are the
common warpers (temperature, top-k, top-p, min-p), which read only the scores, their settings become per-row
tensors and the rows of every such sampler with the same warpers in the same order are processed by one set of
operators; each row then draws its noise from its own generator into its part of one tensor, an operator a
sampler. The values are transformers' own (each warper's arithmetic, on each row, with its own settings, as
PyTorch computes it on that device: on CUDA a division by a Python number is a product with its reciprocal), and a
sampler that can be batched is always processed this way, alone too, so that its row draws the same tokens alone
and in any batch. A sampler without warpers (temperature 1, no truncation) is batched too: its rows are only drawn.

Greedy samplers with processors (`generate`'s repetition penalty, a server's greedy request with a logit bias) are
batched as well: they draw nothing, so any of them process together. A repetition penalty, which reads the context,
is batched too: the positions' contexts are padded a group of similar lengths at a time (`processor_contexts`),
and each row's penalty is a tensor. A processor class of elsewhere (a server's logit bias or OpenAI penalties)
joins by defining `process_rows(scores, processors, owners, contexts)`: the scores of rows whose processors are
`processors[owners[r]]` (a list), processed at once (`contexts`: each row's `Contexts`, where it reads them).

Samplers without a generator of their own draw from the global stream in the order they are met, so they are
never merged; neither are samplers with a processor that this module has no batch form of (a bad-words ban, a
minimum length, typical-p): those process as before, each on its own. Merging keeps each sampler's draws in order,
not the order between samplers: samplers that share one generator object draw in the batches' order (nothing here
makes such samplers: a server gives each choice a generator of its own).
"""

import torch
from transformers.generation import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .processor_contexts import Contexts

# Each warper's per-row setting, read once when its sampler is made.
SETTINGS = {
    TemperatureLogitsWarper: "temperature",
    TopKLogitsWarper: "top_k",
    TopPLogitsWarper: "top_p",
    MinPLogitsWarper: "min_p",
    RepetitionPenaltyLogitsProcessor: "penalty",
}


def batch_form(sampler) -> tuple[tuple, tuple] | None:
    """(the key samplers share to be processed together, the sampler's own settings in its warpers' order), or None
    where the sampler processes on its own: drawing from the global stream, the plain argmax (nothing to process),
    or with a processor that has no batch form here or that removes tokens to something other than -inf. The key
    holds each processor's kind and what keeps batches apart (`_apart`), and the stream the sampler draws from
    ("greedy": none, so greedy samplers batch with each other whatever their generators); the settings, its
    temperature, top-k, top-p, min-p or penalty (a processor with `process_rows`: itself)."""
    if (sampler.do_sample and sampler.generator is None) or not sampler.own_choice:
        return None
    kinds, settings = [], []
    for warper in sampler.warpers:
        kind = type(warper)
        if hasattr(kind, "process_rows"):  # a batch form of its own: its instance is its setting
            kinds.append((kind, None))
            settings.append(warper)
            continue
        if kind not in SETTINGS or getattr(warper, "filter_value", -float("inf")) != -float("inf"):
            return None
        setting = getattr(warper, SETTINGS[kind])
        if kind is RepetitionPenaltyLogitsProcessor:  # with the context's first ids it leaves out (padding)
            ignored = warper.prompt_ignore_length
            if isinstance(ignored, torch.Tensor) and ignored.numel() == 1 and not ignored.is_floating_point():
                ignored = int(ignored)  # a padded prompt's, in `generate`
            if not (ignored is None or type(ignored) is int):  # state shaped for a batch of several, or a value
                return None  # transformers does not read as a count
            setting = (setting, ignored or 0)
        kinds.append((kind, _apart(warper)))
        settings.append(setting)
    stream = str(sampler.generator.device) if sampler.do_sample else "greedy"  # greedy ones draw nothing
    return (tuple(kinds), stream), tuple(settings)


def _apart(warper) -> int | None:
    """What keeps a warper's samplers out of each other's batches: top-p's and min-p's `min_tokens_to_keep` (one
    for the batch), and top-k's k to within a factor of two: a batch takes its largest k's top scores for every row,
    so a request asking for a large k (the whole vocabulary) does not make every other row's top-k cost as much."""
    if isinstance(warper, TopKLogitsWarper):
        return warper.top_k.bit_length()
    return warper.min_tokens_to_keep if isinstance(warper, (TopPLogitsWarper, MinPLogitsWarper)) else None


def process(scores: torch.Tensor, samplers: list, counts: list[int], contexts: Contexts | None = None) -> torch.Tensor:
    """The warpers of `samplers` (all of one `batch_form` key) applied to float `scores`, whose first `counts[0]`
    rows are the first sampler's, the next `counts[1]` the second's, and so on: what each sampler's own warpers give
    its rows (transformers' arithmetic, with each row's own setting as a tensor in place of a Python number);
    `contexts`, each row's, where a warper reads them. The settings travel to the device without waiting for its
    queued work (`_on_device`), as the step's draws do."""
    kinds, vocab = samplers[0].batch_form[0][0], scores.shape[-1]
    for j, (kind, keep) in enumerate(kinds):
        settings = [sampler.batch_form[1][j] for sampler in samplers]
        if hasattr(kind, "process_rows"):
            owners = [i for i, n in enumerate(counts) for _ in range(n)]
            scores = kind.process_rows(scores, settings, owners, contexts)
            continue
        if kind is TopKLogitsWarper:
            settings = [min(k, vocab) for k in settings]
        values = [value for setting, n in zip(settings, counts) for value in [setting] * n]  # each row's: its sampler's
        if kind is RepetitionPenaltyLogitsProcessor:
            scores = _repetition_penalty(scores, values, contexts)
        elif kind is TemperatureLogitsWarper:
            scores = _divided(scores, values)  # over each row's temperature
        elif kind is TopKLogitsWarper:
            scores = _top_k(scores, values, max(settings))
        elif kind is TopPLogitsWarper:
            scores = _top_p(scores, values, keep)
        else:
            scores = _min_p(scores, values, keep)
    return scores


def _on_device(values: list, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """`values` as a (rows, 1) tensor on `like`'s device, copied without waiting for the work queued there (a
    tensor made on the device from a list waits for it: a synchronisation before the step's one read)."""
    return torch.tensor(values, dtype=dtype)[:, None].to(like.device, non_blocking=True)


def _divided(scores: torch.Tensor, divisors: list[float]) -> torch.Tensor:
    """Each row's scores over its own divisor, as `scores / divisor` with a Python number gives them: on CUDA,
    PyTorch divides by a Python number as a product with its reciprocal in float32 (one bit may differ from the
    quotient), and so is it done here there (a temperature; a repetition penalty's division)."""
    values = torch.tensor(divisors, dtype=torch.float32)[:, None]
    if scores.device.type == "cuda":
        return scores * (1.0 / values).to(scores.device, non_blocking=True)
    return scores / values.to(scores.device, non_blocking=True)


def _repetition_penalty(scores: torch.Tensor, settings: list[tuple[float, int]], contexts: Contexts) -> torch.Tensor:
    """Each row's scores at the tokens of its context (past the first ids it leaves out) multiplied by its penalty
    where negative, else divided by it, as transformers gathers, penalises and scatters them back, ids past the
    vocabulary into a column dropped after (`settings`: each row's penalty and how many ids it leaves out; the
    contexts padded a group of similar lengths at a time; the division as `_divided` makes it)."""
    vocab = scores.shape[-1]
    penalties, left_out = zip(*settings)
    padded = torch.nn.functional.pad(scores, (0, 1))
    flat = padded.view(-1)
    for group in contexts.similar_lengths():
        ids = contexts.padded(vocab, group, left_out).clamp(max=vocab)
        rows = _on_device(group, torch.long, scores)
        at = rows * (vocab + 1) + ids
        score = flat[at]
        row_penalties = [penalties[n] for n in group]
        penalty = _on_device(row_penalties, torch.float32, scores)
        flat[at] = torch.where(score < 0, score * penalty, _divided(score, row_penalties))
    return padded[..., :vocab]


def _top_k(scores: torch.Tensor, ks: list[int], largest_k: int) -> torch.Tensor:
    """Each row keeps the scores at least its k-th largest (`ks`: each row's k, at most the vocabulary; the
    `largest_k` largest scores taken once for every row)."""
    largest = torch.topk(scores, largest_k).values
    kth = largest.gather(-1, _on_device([k - 1 for k in ks], torch.long, scores))
    return scores.masked_fill(scores < kth, -float("inf"))


def _top_p(scores: torch.Tensor, top_p: list[float], keep: int) -> torch.Tensor:
    """Each row removes the least likely tokens whose probabilities sum to at most 1 - its top-p."""
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    removed = cumulative <= _on_device([1 - p for p in top_p], cumulative.dtype, scores)
    removed[..., -keep:] = False
    return scores.masked_fill(removed.scatter(1, order, removed), -float("inf"))


def _min_p(scores: torch.Tensor, min_p: list[float], keep: int) -> torch.Tensor:
    """Each row removes the tokens less likely than its min-p times its most likely token's probability."""
    probabilities = torch.softmax(scores, dim=-1)
    factors = _on_device(min_p, probabilities.dtype, scores)
    removed = probabilities < factors * probabilities.amax(dim=-1, keepdim=True)
    removed.scatter_(-1, torch.topk(probabilities, min(keep, probabilities.shape[-1]), dim=-1).indices, False)
    return scores.masked_fill(removed, -float("inf"))


class SamplerBatch:
    """The samplers of several rows, processed and drawn as one (see the module docstring): `samplers[i]` owns
    `counts[i]` consecutive rows of the logits it is given. It draws as `FillSampler` draws, each sampler's rows
    from its own generator, in the order and shapes that sampler alone would draw them."""

    own_choice = True

    def __init__(self, samplers: list, counts: list[int]):
        self.samplers, self.counts = samplers, counts

    @property
    def do_sample(self) -> bool:
        return self.samplers[0].do_sample

    @property
    def reads_context(self) -> bool:
        return self.samplers[0].reads_context

    def __call__(self, logits: torch.Tensor, contexts=None) -> torch.Tensor:
        """Greedy samplers: each row's argmax after its processors (taken as `window_filling.greedy` takes it)."""
        contexts = Contexts.of(contexts) if self.reads_context else None
        return process(logits.float(), self.samplers, self.counts, contexts).max(dim=-1).indices

    def probabilities(self, logits: torch.Tensor, contexts=None) -> torch.Tensor:
        contexts = Contexts.of(contexts) if self.reads_context else None
        return torch.softmax(process(logits.float(), self.samplers, self.counts, contexts), dim=-1)

    def draw(self, probabilities: torch.Tensor) -> torch.Tensor:
        noise = torch.empty_like(probabilities)
        for part, sampler in zip(noise.split(self.counts), self.samplers):
            part.exponential_(1, generator=sampler.generator)
        return (probabilities / noise).argmax(dim=-1)

    def uniforms(self, count: int, device) -> torch.Tensor:
        if count != sum(self.counts):
            raise RuntimeError("A batch of samplers drew uniforms for other rows: this is a bug in wedlm_hf.")
        return torch.cat(
            [torch.rand(n, generator=s.generator, device=device) for s, n in zip(self.samplers, self.counts)]
        )

    def rows(self, indices: list[int]) -> "SamplerBatch":
        """The batch of the rows at `indices` (ascending) alone, for draws at only some of them."""
        owner = [i for i, n in enumerate(self.counts) for _ in range(n)]
        samplers, counts = [], []
        for i in indices:
            if samplers and samplers[-1] is self.samplers[owner[i]]:
                counts[-1] += 1
            else:
                samplers.append(self.samplers[owner[i]])
                counts.append(1)
        return SamplerBatch(samplers, counts)


def merged(groups: list[tuple], size=len) -> list[tuple]:
    """`groups`: (sampler, its keys) in the order the step draws them, `size(keys)` the logits rows they stand for.
    Groups whose samplers share a batch form become one (a `SamplerBatch`, their keys one after the other, at the
    first one's place); the others stay as they are. Each sampler's rows stay together and in order, so each
    generator draws as it would alone."""
    out, batches = [], {}  # out: (sampler, keys), or (the key of a batch in `batches`, None)
    for sampler, keys in groups:
        form = sampler.batch_form
        if form is None:
            out.append((sampler, keys))
            continue
        if form[0] not in batches:
            batches[form[0]] = (SamplerBatch([], []), [])
            out.append((form[0], None))
        batch, batch_keys = batches[form[0]]
        batch.samplers.append(sampler)
        batch.counts.append(size(keys))
        batch_keys += keys
    return [batches[first] if keys is None else (first, keys) for first, keys in out]
