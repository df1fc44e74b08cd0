"""Python calls and torch operators per decoding step, by batch size: the host work a step costs, counted.

On a GPU a step's tensor work is nearly free and every Python call is host time the device waits for, so the
number that decides how a step scales with the batch is how many calls (and torch operators, each a launch) each
added row costs. Counting, not timing: any machine gives the same numbers. Each decoder generates N and n tokens at
forced acceptance (every mask filled each step, no eos) under `cProfile` (Python calls) and a `TorchFunctionMode`
(torch operators); the difference divided by the difference in forwards is one step's, without the prefill and the
set-up. AR is transformers' `generate`; WeDLM runs each mode bench-step reads host reads for (default, lossless,
seeded sampling), with the draws made after the read, as on a CPU, and sampling as `wedlm-hf serve` samples: each
row (request) with a sampler and generator of its own, through the decoder (`generate` shares one sampler), also
with a repetition penalty each (a processor that reads the context, as a checkpoint's default penalty makes every
request's sampler).
"""

import cProfile

import torch
from torch.overrides import TorchFunctionMode
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from ..modeling.decoding_state import DecodingSettings
from ..modeling.streaming_decoder import StreamingDecoder
from ..modeling.window_filling import FillSampler

TARGET_CALLS, TARGET_OPS = 10, 1  # per added row per step, in every mode (issue 57)
MODES = {
    "AR generate": dict(do_sample=False),
    "WeDLM default": dict(strategy="wedlm"),
    "WeDLM lossless": dict(strategy="wedlm", wedlm_lossless=True),
    "WeDLM sampled": dict(strategy="wedlm", do_sample=True, temperature=0.9, top_k=50),
    "WeDLM sampled, a sampler a row": 1.0,  # as a server samples its requests (`row_samplers`), no penalty
    # ... with a repetition penalty each (a checkpoint's default one applies to every request)
    "WeDLM sampled, a sampler and a penalty a row": 1.1,
}


class TorchOps(TorchFunctionMode):
    """Counts every torch function and tensor method called while it is active."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _counted(run) -> tuple[int, int, int]:
    """(Python calls, torch operators, forwards) of `run()`, which returns its forwards. Calls are summed over the
    profiler's entries, one per function: `pstats` keys them by file, line and name, under which every dataclass's
    generated `__init__` is one ("<string>", 2), so it would keep one of them (which one depends on what was imported
    first) and drop the others' calls."""
    profile, ops = cProfile.Profile(), TorchOps()
    with ops:
        profile.enable()
        try:
            forwards = run()
        finally:
            profile.disable()
    return sum(entry.callcount for entry in profile.getstats()), ops.count, forwards


def per_step_counts(model, prompts: torch.Tensor, window: int, lengths: dict[str, tuple[int, int]]) -> dict:
    """mode -> (Python calls, torch operators) per decoding step on `prompts`; `lengths[mode]`: its (N, n) tokens."""
    common = dict(eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(prompts))
    wedlm = dict(wedlm_window_size=window, wedlm_entropy_threshold=1e9, return_dict_in_generate=True)
    out = {}
    for mode in lengths:
        settings = MODES[mode]

        def run(tokens: int, mode=mode, settings=settings) -> int:
            torch.manual_seed(0)
            if isinstance(settings, float):  # a sampler a row, with this repetition penalty
                return row_samplers(model, prompts, window, tokens, settings)
            if mode.startswith("AR"):
                model.generate(prompts, max_new_tokens=tokens, min_new_tokens=tokens, **common, **settings)
                return tokens
            result = model.generate(prompts, max_new_tokens=tokens, **common, **wedlm, **settings)
            return max(s.forwards for s in result.wedlm_stats)

        run(lengths[mode][1])  # warm-up: first-call work (imports, caches) is no step's
        (calls_n, ops_n, fwd_n), (calls_m, ops_m, fwd_m) = (_counted(lambda t=t: run(t)) for t in lengths[mode])
        out[mode] = ((calls_n - calls_m) / (fwd_n - fwd_m), (ops_n - ops_m) / (fwd_n - fwd_m))
    return out


def row_samplers(model, prompts: torch.Tensor, window: int, tokens: int, penalty: float = 1.0) -> int:
    """`tokens` new tokens for each prompt at forced acceptance, sampled (temperature 0.9, top-k 50, a repetition
    `penalty` where not 1) with a sampler and a seeded generator of each row's own, as `wedlm-hf serve` samples
    each request; returns the forwards."""
    decoder = StreamingDecoder(model, model.config.mask_token_id)
    rows = []
    for b, prompt in enumerate(prompts.tolist()):
        warpers = LogitsProcessorList([TemperatureLogitsWarper(0.9), TopKLogitsWarper(50)])
        if penalty != 1.0:
            warpers.insert(0, RepetitionPenaltyLogitsProcessor(penalty))
        sampler = FillSampler(True, warpers, generator=torch.Generator(prompts.device).manual_seed(b))
        settings = DecodingSettings(tokens, window_size=window, entropy_threshold=1e9, sampler=sampler)
        rows.append(decoder.add(prompt, settings))
    while decoder.busy:
        decoder.step()
    return max(row.stats.forwards for row in rows)


def log_counts(log, counts: dict[int, dict]) -> dict:
    """Prints calls and operators per step at each batch and per added row (smallest to largest batch), against
    the targets; returns mode -> (calls, ops) per added row."""
    batches = sorted(counts)
    first, last = batches[0], batches[-1]
    log(
        "host work per decoding step (counted: Python calls / torch operators), forced acceptance; per added row from "
        f"batch {first} to {last} (target: at most {TARGET_CALLS} calls and {TARGET_OPS} operator for WeDLM)"
    )
    width = max(map(len, MODES)) + 2
    log(f"{'mode':<{width}}" + "".join(f"{'batch ' + str(b):>18}" for b in batches) + f"{'per added row':>24}")
    added = {}
    for mode in MODES:
        cells = "".join(f"{counts[b][mode][0]:>10.0f} / {counts[b][mode][1]:<5.0f}" for b in batches)
        rows = max(last - first, 1)
        calls, ops = ((counts[last][mode][i] - counts[first][mode][i]) / rows for i in (0, 1))
        added[mode] = (calls, ops)
        verdict = ""
        if not mode.startswith("AR"):
            verdict = " PASS" if calls <= TARGET_CALLS and ops <= TARGET_OPS else " FAIL"
        log(f"{mode:<{width}}{cells}{calls:>12.1f} / {ops:<5.1f}{verdict}")
    return added
