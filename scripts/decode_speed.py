"""gpu_check.sh parts (d) and (g): time per decoding step and tokens/s of `generate`, AR and WeDLM.

Each row runs `generate` with N and with n new tokens (long then short: a static cache keeps the long run's length,
so both see the same shapes) at forced acceptance (every mask filled each step, no eos); a step costs
(time(N) - time(n)) / (forwards(N) - forwards(n)), so that the prefill and the set-up cancel. Paths: AR and WeDLM,
static + compiled (transformers' compile of decoding: CUDA graphs on CUDA) and eager (DynamicCache), next to the
memory bound (weight bytes / copy bandwidth).
"""

import statistics
import time
import traceback
from functools import partial

import torch

from wedlm_hf import WeDLMForCausalLM
from wedlm_hf.evaluation.lossless_benchmark import generate_compile_config


def _timer(device: str):
    """Seconds a call takes, with CUDA events on CUDA (perf_counter on the CPU), and what it returned."""

    def timed(fn):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3, out
        begin = time.perf_counter()
        out = fn()
        return time.perf_counter() - begin, out

    return timed


def copy_bandwidth(device: str, nbytes: int, repeats: int = 5) -> float:
    """Bytes/s of a device-to-device `copy_` of `nbytes`, counting the read and the write (2 x nbytes a copy)."""
    timed = _timer(device)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    seconds = statistics.median(timed(lambda: dst.copy_(src))[0] for _ in range(repeats))
    return 2 * nbytes / seconds


def compiled_graphs() -> int | None:
    """Graphs dynamo has compiled in this process (None where this torch does not count them)."""
    try:
        return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a private counter: absent in some torch versions
        return None


# (d)'s rows: name, strategy, static + compiled. The compiled rows of batch 1 come first: the targets read them.
SPEED_PATHS = (
    ("AR static+compiled", "ar", True),
    ("WeDLM static+compiled", "wedlm", True),
    ("AR eager", "ar", False),
    ("WeDLM eager", "wedlm", False),
)


def _speed_row(model, prompt, strategy: str, compiled: bool, compile_config, new_tokens, repeats: int):
    """One row of (d): (seconds per decoding step, tokens/s, what was seen); `new_tokens` = (N, n)."""
    timed = _timer(model.device.type)
    prompt_len = prompt.shape[1]
    args = dict(do_sample=False, eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(prompt))
    if strategy == "wedlm":
        # every mask filled each step, on the paper's rule (copies from the context would let rows diverge)
        args.update(strategy="wedlm", wedlm_entropy_threshold=1e9, wedlm_context_drafts=False)
    if compiled:
        args["cache_implementation"] = "static"
        if compile_config is not None:
            args["compile_config"] = compile_config
        torch._dynamo.reset()  # compiled afresh, as in a new process (the compiled call is shared by AR and WeDLM)

    def forwards(tokens: int) -> int:
        """Runs N or n new tokens once (compiling, capturing graphs); its forwards, the prefill's included."""
        out = model.generate(prompt, max_new_tokens=tokens, return_dict_in_generate=strategy == "wedlm", **args)
        if strategy == "ar":
            if out.shape[1] != prompt_len + tokens:
                raise RuntimeError(f"AR generated {out.shape[1] - prompt_len} tokens, not {tokens}")
            return tokens  # the prefill gives the first token, each decoding step one more
        counts = {(s.forwards, s.tokens) for s in out.wedlm_stats}
        if len(counts) != 1 or next(iter(counts))[1] != tokens:
            raise RuntimeError(f"WeDLM rows differ or stopped early, (forwards, tokens): {sorted(counts)}")
        return next(iter(counts))[0]

    start, graphs = time.perf_counter(), compiled_graphs()
    steps = [forwards(tokens) for tokens in new_tokens]  # long first: a static cache keeps its length for the short
    warm, made = time.perf_counter() - start, compiled_graphs()
    if compiled and graphs is not None and made == graphs:
        raise RuntimeError("nothing was compiled: generate ran this static path eagerly")
    times = {tokens: [] for tokens in new_tokens}
    for _ in range(repeats):
        for tokens in new_tokens:
            times[tokens].append(timed(partial(model.generate, prompt, max_new_tokens=tokens, **args))[0])
    long, short = (statistics.median(times[tokens]) for tokens in new_tokens)
    seconds = long - short
    if seconds <= 0 or steps[0] <= steps[1]:
        raise RuntimeError(f"N ran no longer than n: {long * 1e3:.1f} vs {short * 1e3:.1f} ms, forwards {steps}")
    compiled_note = "" if made is None or graphs is None else f", {made - graphs} graph(s) compiled"
    seen = (
        f"warm-up {warm:.1f}s{compiled_note}; forwards {steps[0]} (N) / {steps[1]} (n); "
        f"time {long * 1e3:.1f} / {short * 1e3:.1f} ms"
    )
    batch = prompt.shape[0]
    return seconds / (steps[0] - steps[1]), batch * (new_tokens[0] - new_tokens[1]) / seconds, seen


def decode_speed(
    model: WeDLMForCausalLM,
    batches: tuple[int, ...],
    prompt_len: int,
    ar_tokens: tuple[int, int],
    wedlm_tokens: tuple[int, int],
    compile_config,
    repeats: int,
    copy_bytes: int,
    deadline: float,
    paths: tuple = SPEED_PATHS,
) -> None:
    """(d) ms per decoding step and tokens/s of `generate`, AR and WeDLM at forced acceptance, static + compiled and
    eager, batch by batch; the memory bound; the targets. Each row runs `generate` with N and with n new tokens (long
    then short: the static cache keeps the long run's length, so both see the same shapes); a step costs
    (time(N) - time(n)) / (forwards(N) - forwards(n)), so that the prefill and the setup cancel. A row starts only
    before `deadline` (a perf_counter time): the ones after it are skipped, with a line saying so. `paths`: which of
    SPEED_PATHS; the targets are printed where batch 1 is measured."""
    device = model.device.type
    begin = time.perf_counter()

    bandwidth = copy_bandwidth(device, copy_bytes)
    embedding, output = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    read = [p for p in model.parameters() if p is not embedding or p is output]
    weight_bytes = sum(p.numel() * p.element_size() for p in read)
    bound = weight_bytes / bandwidth
    memory_line = (
        f"memory bound: {weight_bytes / 1e9:.3g} GB of weights read per step (all parameters but the input "
        f"embedding) / {bandwidth / 1e12:.3g} TB/s copy bandwidth ({copy_bytes / 2**30:.3g} GiB copy_, read + write "
        f"counted) = {bound * 1e3:.3g} ms/step"
    )
    print(memory_line)

    try:  # a generation compiles a few shapes; the limit must not send one back to eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    except AttributeError:  # older torch
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if compile_config is None:
        compiling = "transformers' default CompileConfig (inductor, mode 'reduce-overhead': CUDA graphs)"
    else:
        compiling = f"CompileConfig(backend={compile_config.backend!r}, mode={compile_config.mode!r})"
    window = getattr(model.generation_config, "wedlm_window_size", 16)
    clock = "CUDA events" if device == "cuda" else "perf_counter"
    print(
        f"prompt {prompt_len} random tokens per row, no eos; AR N={ar_tokens[0]}, n={ar_tokens[1]} new tokens; WeDLM "
        f"W={window}, wedlm_entropy_threshold=1e9 (forced acceptance), N={wedlm_tokens[0]}, n={wedlm_tokens[1]}; "
        f"compiled rows: cache_implementation='static', {compiling}, compiled afresh per row (torch._dynamo.reset) "
        f"and warmed up (compile, graph capture) by one N and one n run; eager rows: DynamicCache, no compile"
    )
    print(
        f"ms/step = (time(N) - time(n)) / (forwards(N) - forwards(n)), {clock}, median of {repeats}: prefill and "
        "setup cancel; tokens/s = batch x (N - n) / (time(N) - time(n))",
        flush=True,
    )

    results, failed = {}, []
    g = torch.Generator().manual_seed(0)
    for batch in batches:
        prompt = torch.randint(0, model.config.vocab_size - 1, (batch, prompt_len), generator=g).to(device)
        for name, strategy, compiled in paths:
            label = f"{name}, batch {batch}"
            if time.perf_counter() > deadline:
                print(f"{label}: SKIPPED, no time left (gpu_check's --deadline)", flush=True)
                continue
            start = time.perf_counter()
            new_tokens = wedlm_tokens if strategy == "wedlm" else ar_tokens
            try:
                step, rate, seen = _speed_row(model, prompt, strategy, compiled, compile_config, new_tokens, repeats)
                results[name, batch] = (step, rate)
                print(f"{label}: {seen}; row done in {time.perf_counter() - start:.1f}s", flush=True)
            except Exception as error:  # noqa: BLE001 - one failing path must not hide the others
                traceback.print_exc()
                print(f"{label}: FAILED: {traceback.format_exception_only(error)[-1].strip()}", flush=True)
                failed.append(label)
            if device == "cuda":
                torch.cuda.empty_cache()

    print(f"\n{'path':<24}{'batch':>6}{'ms/step':>10}{'tok/step':>10}{'tok/s':>11}{'step/ARc':>10}{'tok/s/ARc':>11}")
    for batch in batches:
        base = results.get(("AR static+compiled", batch))
        for name, _, _ in paths:
            if (name, batch) not in results:
                print(f"{name:<24}{batch:>6}{'(no result)':>20}")
                continue
            step, rate = results[name, batch]
            ratios = f"{step / base[0]:>10.2f}{rate / base[1]:>11.2f}" if base else f"{'-':>10}{'-':>11}"
            print(f"{name:<24}{batch:>6}{step * 1e3:>10.2f}{rate * step / batch:>10.1f}{rate:>11.1f}{ratios}")
    print(memory_line)
    print("(ARc: AR static+compiled of the same batch)")

    if 1 in batches:
        _print_targets(results, bound)
    if device != "cuda":
        print("(dry run: a tiny model on the CPU; the targets are about the 8B shape on the GPU)")
    print(f"measured in {time.perf_counter() - begin:.1f}s")
    if failed:
        raise RuntimeError(f"{len(failed)} row(s) failed: {'; '.join(failed)}")


def _print_targets(results: dict, bound: float) -> None:
    """(d)'s targets, at batch 1, PASS or FAIL."""
    ar, wedlm = results.get(("AR static+compiled", 1)), results.get(("WeDLM static+compiled", 1))
    both = ar is not None and wedlm is not None
    targets = (
        ("WeDLM compiled step / AR compiled step <= 1.3 (batch 1)", wedlm[0] / ar[0] if both else None, 1.3, 1),
        ("AR compiled step / memory bound <= 2 (batch 1)", ar[0] / bound if ar else None, 2, 1),
        (
            "WeDLM compiled tok/s / AR compiled tok/s >= 8, forced acceptance (batch 1)",
            wedlm[1] / ar[1] if both else None,
            8,
            -1,
        ),
    )
    for text, value, limit, sign in targets:
        verdict = "NOT MEASURED: FAIL" if value is None else ("PASS" if sign * value <= sign * limit else "FAIL")
        print(f"target: {text}: {'' if value is None else f'{value:.2f}x '}{verdict}")


SPEED_TOKENS = dict(ar_tokens=(64, 16), wedlm_tokens=(128, 32))  # (d) and (g): (N, n) new tokens


def speed_settings(cpu: bool, device: str, start: float, deadline: float | None) -> dict:
    """(d)'s and (g)'s settings for `decode_speed`: the dry run's (dynamo only, no inductor: cheap; transformers
    compiles off CUDA only when told to), or transformers' default compile of a static cache on CUDA; rows start
    until `deadline` seconds after `start` (by default 390, from when a started compiled 8B row, about a minute,
    still ends by 8 minutes; the dry run's 300)."""
    if cpu:
        speed = dict(prompt_len=32, compile_config=generate_compile_config("eager", device), repeats=1)
        return speed | dict(copy_bytes=64 * 2**20, deadline=start + (300 if deadline is None else deadline))
    speed = dict(prompt_len=256, compile_config=None, repeats=3, copy_bytes=4 * 2**30)
    return speed | dict(deadline=start + (390 if deadline is None else deadline))
