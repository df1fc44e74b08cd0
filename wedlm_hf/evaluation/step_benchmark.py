"""`wedlm-hf bench-step`: the decoder's own cost per step, AR against WeDLM, eager and static+compiled, by batch size.

On a model so small that its forward costs little (one layer, 64 wide, a 512-token vocabulary), a step's time is
mostly the work `generate` does around the forward: for AR, transformers' loop; for WeDLM, the streaming decoder's
bookkeeping (windows, reordering, commits, cache). A WeDLM forward still feeds W rows per sequence where AR feeds
one, and on a CPU each row costs its share of the matrix products, so each cell also splits its time into the
forward (timed around `model.forward`) and what lies outside it, the decoder's own work, of which WeDLM's readout
(timed around `step_readout.read_step`: the entropy and greedy token of every mask, and the step's one host read) is
tensor work that grows with the masks fed, the rest host work. Each cell times `generate`
with N and with n new tokens at forced acceptance (every mask filled each step, no eos) and divides the difference
by the difference in forwards, so the prefill and the set-up cancel; the four decoders run interleaved, each keeping
its best of `repeats`. The compiled cells decode on the static cache with `torch.compile(model.forward)` swapped in,
as `wedlm-hf bench` does.

Host reads per step count, on the eager runs and on seeded sampled ones (default and lossless mode), the calls
that copy a tensor's data to the host for Python to see (`item`, `tolist`, `bool()` / `int()` / `float()` /
indexing by a tensor, `nonzero`, `unique`, `masked_select`, `.cpu()`): on a GPU each is a synchronisation.
Seeded sampling is timed too, eager, two ways side by side: with one sampler for the batch (as `generate` samples)
and with a sampler and generator a row (as `wedlm-hf serve` samples its requests, their processing batched:
`sampler_batch`).
Targets: WeDLM's step at most 1.3x AR's at batch 1 and 2x at batch 16, eager and compiled, with one host read per
step. Each cell also prints WeDLM's forward alone as a multiple of AR's whole step: where it is over the target, no
work the decoder saves around the forward can meet it on that machine. Last, a context look-up's host cost per row
per step at long contexts, against prompt lookup's (`lookup_benchmark`).
"""

import contextlib
import functools
import time

import torch
from torch.overrides import TorchFunctionMode

from ..modeling import WeDLMForCausalLM, streaming_decoder
from .bench_report import parameter_count, write_json
from .benchmark import random_model
from .compiled_forward import compiled_forward, swapped_forward
from .interleaved_runs import interleave
from .lookup_benchmark import run_lookup_benchmark
from .step_calls import MODES, log_counts, per_step_counts, row_samplers

STEP_MODEL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=4096,
    qk_norm=True,
    attention_bias=False,
    mask_token_id=511,
)
TARGETS = {1: 1.3, 16: 2.0}  # WeDLM step / AR step, by batch size
HOST_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "unique", "cpu"}
HOST_READS |= {"masked_select", "numpy"}


class HostReads(TorchFunctionMode):
    """Counts the calls in `HOST_READS` made while it is active."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in HOST_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _timed(clock, inner):
    """`inner`, adding the wall time of each call to `clock.seconds`; it keeps `inner`'s signature visible
    (`__wrapped__`), which the decoder reads from the forward."""

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            clock.seconds += time.perf_counter() - start

    return timed


class ForwardClock:
    """Adds up the wall time spent in the model's forward (whatever forward it has now: its own, or a compiled one
    swapped in) while active, so that a step's time splits into the forward and the decoder's own work."""

    def __init__(self, model):
        self.model = model
        self.seconds = 0.0

    def __enter__(self):
        self._had = "forward" in vars(self.model)
        self._original = vars(self.model).get("forward")
        self.model.forward = _timed(self, self.model.forward)
        return self

    def __exit__(self, *exc):
        if self._had:
            self.model.forward = self._original
        else:
            del self.model.forward


class ReadoutClock:
    """Adds up the wall time the streaming decoder spends in its step's readout (`step_readout.read_step`: the
    entropy and greedy token of every mask column and the step's one host read) while active: tensor work that
    grows with the masks fed, not Python per row."""

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        self._original = streaming_decoder.read_step
        streaming_decoder.read_step = _timed(self, self._original)
        return self

    def __exit__(self, *exc):
        streaming_decoder.read_step = self._original


def step_model(seed: int = 0) -> WeDLMForCausalLM:
    return random_model(STEP_MODEL, seed)


def _decoders(model, prompts: torch.Tensor, window: int, compiled) -> dict:
    """name -> run(new_tokens) -> (forwards, seconds in the forward, seconds in WeDLM's readout), for AR and WeDLM,
    eager and (with `compiled`) static+compiled."""
    common = dict(do_sample=False, eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(prompts))
    wedlm = dict(strategy="wedlm", wedlm_window_size=window, wedlm_entropy_threshold=1e9, return_dict_in_generate=True)
    wedlm["wedlm_context_drafts"] = False  # forced acceptance on the paper's rule: every row fills W masks a step

    def ar(tokens: int, **kwargs) -> tuple[int, float, float]:
        with ForwardClock(model) as clock:
            out = model.generate(prompts, max_new_tokens=tokens, min_new_tokens=tokens, **common, **kwargs)
        assert out.shape[1] == prompts.shape[1] + tokens
        return tokens, clock.seconds, 0.0  # the prefill gives the first token, each decoding step one more

    def wedlm_run(tokens: int, **kwargs) -> tuple[int, float, float]:
        with ForwardClock(model) as clock, ReadoutClock() as readout:
            out = model.generate(prompts, max_new_tokens=tokens, **common, **wedlm, **kwargs)
        assert all(s.tokens == tokens for s in out.wedlm_stats), "a row stopped early"
        return max(s.forwards for s in out.wedlm_stats), clock.seconds, readout.seconds

    runs = {"AR eager": ar, "WeDLM eager": wedlm_run}
    if compiled is not None:

        def static(fn):
            def run(tokens: int) -> tuple[int, float]:
                with swapped_forward(model, compiled):  # disable_compile: transformers' own compile (CUDA) stays off
                    return fn(tokens, cache_implementation="static", disable_compile=True)

            return run

        runs |= {"AR static+compiled": static(ar), "WeDLM static+compiled": static(wedlm_run)}
    return runs


def _per_step(runs: dict, lengths: dict, repeats: int) -> tuple[dict, dict, dict]:
    """name -> seconds per decoding step: (best time(N) - best time(n)) / (forwards(N) - forwards(n)), the runs
    interleaved (`interleave`: warmed up once untimed, best of `repeats`); and name -> the parts of it spent in the
    model's forward and in WeDLM's readout (measured in the same best runs)."""

    def at_length(name: str):
        return lambda i: runs[name](lengths[name][i])

    timings = interleave({name: at_length(name) for name in runs}, repeats, cases=(0, 1), warm_up=True)
    seconds, forward, readout = {}, {}, {}
    for name in runs:
        (forwards_1, forward_1, readout_1), (forwards_2, forward_2, readout_2) = (
            timings.result((i, name)) for i in (0, 1)
        )
        steps = forwards_1 - forwards_2
        seconds[name] = (timings.best((0, name)) - timings.best((1, name))) / steps
        forward[name], readout[name] = (forward_1 - forward_2) / steps, (readout_1 - readout_2) / steps
    return seconds, forward, readout


def _host_reads(runs: dict, lengths: dict) -> dict:
    """name -> host reads per decoding step, counted on the eager runs."""
    out = {}
    for name, run in runs.items():
        if "eager" not in name:
            continue
        counts, forwards = [], []
        for tokens in lengths[name]:
            with HostReads() as reads:
                forwards.append(run(tokens)[0])
            counts.append(reads.count)
        out[name] = (counts[0] - counts[1]) / (forwards[0] - forwards[1])
    return out


@contextlib.contextmanager
def _draws_before_read():
    """Decoders made meanwhile draw before the step's read, whatever the device."""
    original = streaming_decoder.draws_before_read
    streaming_decoder.draws_before_read = lambda device: True
    try:
        yield
    finally:
        streaming_decoder.draws_before_read = original


SAMPLED = {  # host reads only: seeded sampling with a temperature and top-k, default and lossless mode
    "WeDLM sampled": dict(do_sample=True, temperature=0.9, top_k=50),
    "lossless sampled": dict(do_sample=True, temperature=0.9, top_k=50, wedlm_lossless=True),
}


def _sampled_per_step(model, prompts: torch.Tensor, window: int, lengths: tuple[int, int], repeats: int) -> dict:
    """name -> seconds per decoding step of seeded sampling (temperature 0.9, top-k 50), eager, the draws after the
    read (a CPU's way): with one sampler for the batch, as `generate` samples, and with a sampler and generator a
    row, as `wedlm-hf serve` samples its requests (`step_calls.row_samplers`), interleaved, best of `repeats`."""
    common = dict(eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(prompts), **MODES["WeDLM sampled"])
    common |= dict(wedlm_window_size=window, wedlm_entropy_threshold=1e9, return_dict_in_generate=True)

    def one_sampler(tokens: int) -> int:
        torch.manual_seed(0)
        return max(s.forwards for s in model.generate(prompts, max_new_tokens=tokens, **common).wedlm_stats)

    runs = {"one sampler": one_sampler, "a sampler a row": functools.partial(row_samplers, model, prompts, window)}
    timings = interleave(
        {name: (lambda i, run=run: run(lengths[i])) for name, run in runs.items()}, repeats, cases=(0, 1), warm_up=True
    )
    steps = {name: timings.result((0, name)) - timings.result((1, name)) for name in runs}
    return {name: (timings.best((0, name)) - timings.best((1, name))) / steps[name] for name in runs}


def _sampled_host_reads(model, prompts: torch.Tensor, window: int, lengths: tuple[int, int]) -> dict:
    """name -> host reads per decoding step of sampled WeDLM decoding (`SAMPLED`), eager, with the draws made
    before the step's read as on an accelerator (`step_draws.draws_before_read`; a CPU draws after it)."""
    common = dict(eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(prompts), strategy="wedlm")
    common |= dict(wedlm_window_size=window, wedlm_entropy_threshold=1e9, return_dict_in_generate=True)
    common["wedlm_context_drafts"] = False  # the paper's rule (forced acceptance: no copy to check)
    out = {}
    for name, sampling in SAMPLED.items():
        counts, forwards = [], []
        for tokens in lengths:
            torch.manual_seed(0)
            with HostReads() as reads, _draws_before_read():
                result = model.generate(prompts, max_new_tokens=tokens, **common, **sampling)
            counts.append(reads.count)
            forwards.append(max(s.forwards for s in result.wedlm_stats))
        out[name] = (counts[0] - counts[1]) / (forwards[0] - forwards[1])
    return out


def run_step_benchmark(
    model=None,
    batches: tuple[int, ...] = (1, 16, 64),
    window: int = 16,
    ar_tokens: tuple[int, int] = (96, 32),
    wedlm_windows: tuple[int, int] = (12, 4),
    prompt_len: int = 16,
    repeats: int = 5,
    threads: int = 1,
    compile: bool = True,
    compile_backend: str = "inductor",
    lookup_contexts: tuple[int, ...] = (1024, 8192, 32768),
    log=print,
) -> dict:
    """Per-step times and host reads of AR and WeDLM at each batch size (see the module docstring); WeDLM decodes
    `wedlm_windows` windows' worth of tokens (N, n), AR `ar_tokens`. Then a context look-up's cost per row per step
    at `lookup_contexts` tokens of context, against prompt lookup's (`lookup_benchmark`)."""
    torch.set_num_threads(threads)
    model = model if model is not None else step_model()
    compiled = compiled_forward(model, compile_backend) if compile else None
    log(
        f"model: {parameter_count(model) / 1e3:.0f}K parameters ({model.config.num_hidden_layers} layer, hidden "
        f"{model.config.hidden_size}, vocabulary {model.config.vocab_size}), {torch.get_num_threads()} thread(s); "
        f"prompts of {prompt_len} tokens; AR N={ar_tokens[0]}, n={ar_tokens[1]}; WeDLM W={window} at forced "
        f"acceptance, N={wedlm_windows[0] * window}, n={wedlm_windows[1] * window}; best of {repeats}, interleaved"
        + (f"; compiled: torch.compile backend {compile_backend!r}, static cache" if compile else "")
    )
    g = torch.Generator().manual_seed(0)
    report, counts = {}, {}
    wedlm_lengths = tuple(k * window for k in wedlm_windows)
    for batch in batches:
        prompts = torch.randint(0, model.config.vocab_size - 1, (batch, prompt_len), generator=g).to(model.device)
        runs = _decoders(model, prompts, window, compiled)
        lengths = {name: ar_tokens if name.startswith("AR") else wedlm_lengths for name in runs}
        seconds, forward, readout = _per_step(runs, lengths, repeats)
        reads = _host_reads(runs, lengths) | _sampled_host_reads(model, prompts, window, wedlm_lengths)
        sampled = _sampled_per_step(model, prompts, window, wedlm_lengths, repeats)
        report[batch] = {
            "seconds_per_step": seconds,
            "forward_seconds_per_step": forward,
            "readout_seconds_per_step": readout,
            "host_reads_per_step": reads,
            "sampled_seconds_per_step": sampled,
        }
        for mode in ("eager", "static+compiled") if compile else ("eager",):
            ar, wedlm = seconds[f"AR {mode}"], seconds[f"WeDLM {mode}"]
            own_ar, own_wedlm = ar - forward[f"AR {mode}"], wedlm - forward[f"WeDLM {mode}"]
            forward_ratio = forward[f"WeDLM {mode}"] / ar  # WeDLM's forward alone, against AR's whole step
            target = TARGETS.get(batch)
            verdict = "" if target is None else f" (target <= {target}x: {'PASS' if wedlm / ar <= target else 'FAIL'})"
            log(
                f"batch {batch:>3}, {mode:<16} AR {ar * 1e3:7.3f} ms/step, WeDLM {wedlm * 1e3:7.3f} ms/step: "
                f"{wedlm / ar:5.2f}x{verdict}; outside the forward: AR {own_ar * 1e3:6.3f}, WeDLM "
                f"{own_wedlm * 1e3:6.3f} ms/step (readout {readout[f'WeDLM {mode}'] * 1e3:5.3f}); WeDLM's forward "
                f"alone: {forward_ratio:4.2f}x AR's step"
            )
        log(
            f"batch {batch:>3}, host reads per step (eager): AR {reads['AR eager']:.1f}, WeDLM "
            f"{reads['WeDLM eager']:.1f}, WeDLM sampled {reads['WeDLM sampled']:.1f}, lossless sampled "
            f"{reads['lossless sampled']:.1f} (target 1)"
        )
        one, own = sampled["one sampler"], sampled["a sampler a row"]
        log(
            f"batch {batch:>3}, sampled (eager, temperature 0.9, top-k 50): one sampler for the batch "
            f"{one * 1e3:7.3f} ms/step, a sampler and generator a row {own * 1e3:7.3f} ms/step: {own / one:5.2f}x"
        )
        counted = {mode: ar_tokens if mode.startswith("AR") else wedlm_lengths for mode in ("AR", "WeDLM")}
        lengths_of = {mode: counted["AR" if mode.startswith("AR") else "WeDLM"] for mode in MODES}
        counts[batch] = per_step_counts(model, prompts, window, lengths_of)
        report[batch]["calls_and_ops_per_step"] = counts[batch]
    if len(counts) > 1:
        report["per_added_row"] = log_counts(log, counts)
    if lookup_contexts:
        report["context_lookup"] = run_lookup_benchmark(lookup_contexts, repeats=repeats, log=log)
    return report


def bench_step_command(args) -> None:
    """`wedlm-hf bench-step`."""
    report = run_step_benchmark(
        batches=tuple(args.batches), repeats=args.repeats, threads=args.threads, compile=not args.no_compile
    )
    write_json(args.json, report)
