"""A context look-up's host cost per row per step, by context length: WeDLM's index against prompt lookup's scan.

Each step a row that drafts from the context indexes the token it committed and looks its suffix up
(`context_drafts.ContextIndex`); transformers' prompt lookup (`PromptLookupCandidateGenerator.get_candidates`, the
fastest drafting a transformers user has) scans the whole text for the same suffix. Both look up the longest suffix
of three tokens or fewer in random text over a 150,000-token vocabulary, where that suffix seldom occurred before:
the look-up that finds nothing, which a scan pays in full. They look up the committed text alone: a decoding row's
final token after it adds a few direct comparisons (`ContextIndex.lookup`). Interleaved, best of `repeats` runs of
`steps` steps. A row's index is built for its prompt as the prompt is fed, a chunk a step (CHUNK tokens, the
server's default step budget, `--max-step-tokens`): the whole build and its slowest chunk are printed beside, and last
the host memory the index takes per token of context.
"""

import gc
import random
import time
import tracemalloc

import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from ..modeling import WeDLMDecodingConfig
from ..modeling.context_drafts import ContextIndex
from .interleaved_runs import rotated

VOCABULARY = 150_000
NGRAM = WeDLMDecodingConfig.context_ngram  # the default
SERVER_NGRAM = 8  # the most `wedlm-hf serve` accepts (`serving.request_fields.MAX_CONTEXT_NGRAM`; no wing imports it)
CHUNK = 2048  # prompt tokens indexed a step (`wedlm-hf serve`'s default `--max-step-tokens`)


def _decoders(text: list[int], context: int, chunks: list) -> dict:
    """Per decoder, a set-up returning its steps: one committed token and one look-up each, returning at how many
    steps a continuation was found. The index's set-up indexes the prompt a chunk at a time, as a joining row does
    (`context_drafts.index_fed_prompt`), and adds the seconds of its slowest chunk to `chunks`."""
    ids = torch.tensor([text])

    def index():
        index, seconds = ContextIndex(), [0.0]
        for start in range(0, context, CHUNK):
            began = time.perf_counter()
            index.extend(text[start : min(start + CHUNK, context)])
            index.index_sizes(NGRAM)
            seconds.append(time.perf_counter() - began)
        chunks.append(max(seconds))

        def steps():
            found = 0
            for end in range(context, len(text)):
                index.extend(text[end : end + 1])
                found += bool(index.lookup([], NGRAM, 10)[0])
            return found

        return steps

    def prompt_lookup():
        generator = PromptLookupCandidateGenerator(max_matching_ngram_size=NGRAM, max_length=1 << 30)

        def steps():
            found = 0
            for end in range(context + 1, len(text) + 1):
                found += generator.get_candidates(ids[:, :end])[0].shape[1] > end
            return found

        return steps

    return {"WeDLM index": index, "prompt lookup": prompt_lookup}


def run_lookup_benchmark(contexts=(1024, 8192, 32768), steps: int = 200, repeats: int = 3, log=print) -> dict:
    """Microseconds per step of each look-up at each context length, the ratio prompt lookup / index and the
    index's one-off build; both find a continuation at the same steps (checked)."""
    report = {}
    log(
        f"context look-up per row per step (one committed token, then the suffix of {NGRAM} tokens or fewer looked "
        f"up; random text, {VOCABULARY:,}-token vocabulary); best of {repeats}, interleaved"
    )
    rng = random.Random(0)
    for context in contexts:
        chunks = []
        decoders = _decoders([rng.randrange(VOCABULARY) for _ in range(context + steps)], context, chunks)
        best, found, build = {}, {}, float("inf")
        for repeat in range(repeats):
            for name in rotated(list(decoders), repeat):
                gc.collect()
                start = time.perf_counter()
                run = decoders[name]()
                if name == "WeDLM index":
                    build = min(build, time.perf_counter() - start)
                start = time.perf_counter()
                found[name] = run()
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
        if len(set(found.values())) != 1:
            raise RuntimeError(f"The look-ups disagree on how many steps find a continuation: {found}.")
        us = {name: seconds / steps * 1e6 for name, seconds in best.items()}
        report[context] = us | {"ratio": us["prompt lookup"] / us["WeDLM index"], "index_build_ms": build * 1e3}
        report[context]["index_chunk_ms"] = min(chunks) * 1e3
        log(
            f"context {context:>6} tokens: WeDLM index {us['WeDLM index']:7.1f} us, prompt lookup "
            f"{us['prompt lookup']:7.1f} us per step: {report[context]['ratio']:.1f}x (the index, built with the "
            f"prompt's chunks of {CHUNK}: {build * 1e3:.1f} ms, its slowest chunk {min(chunks) * 1e3:.1f} ms)"
        )
    text = [rng.randrange(VOCABULARY) for _ in range(max(contexts))]
    report["index_bytes_per_token"] = {n: _index_bytes(text, n) / len(text) for n in (NGRAM, SERVER_NGRAM)}
    log(
        f"the index's host memory per token of a {len(text)}-token context: "
        + ", ".join(f"{b / 1e3:.2f} KB at {n} n-gram sizes" for n, b in report["index_bytes_per_token"].items())
    )
    return report


def _index_bytes(text: list[int], largest: int) -> int:
    """Bytes an index of `text` allocates for n-gram sizes up to `largest` (the tokens themselves not counted)."""
    gc.collect()
    tracemalloc.start()
    try:
        index = ContextIndex()
        index.extend(text)
        before = tracemalloc.get_traced_memory()[0]
        index.lookup([-1], largest, 1)  # a suffix with a token no text holds: every size is looked up, so indexed
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
