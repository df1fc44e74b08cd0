"""`wedlm-hf bench`: plain AR generate, WeDLM streaming decoding and the no-cache block-wise baseline, side by side.

Everything runs in one process on the same model and prompts, so the printed ratios compare like with like: the
decoders' runs are interleaved (the order rotates each repeat) and each row keeps its best time, so a busy machine
slows all of them alike. Each run is warmed up once, untimed (for the compiled rows, that is the compilation).
The compiled rows decode on the static cache (`cache_implementation="static"`) with `torch.compile(model.forward)`
swapped in for those runs only, as a user compiles AR on the CPU; the eager rows keep the model's own forward.
The default model is a seeded random 16M-parameter WeDLM model; with `--threshold` huge every mask is accepted,
which measures the decoder's mechanics (tokens per forward, cache reuse) independently of model quality.
"""

import contextlib
import json
import time

import torch

from ..data import load_dtype
from ..modeling import WeDLMConfig, WeDLMForCausalLM
from .blockwise_baseline import blockwise_generate

BENCH_MODEL = dict(
    hidden_size=384,
    intermediate_size=1024,
    num_hidden_layers=6,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=8192,
    max_position_embeddings=4096,
    qk_norm=True,
    attention_bias=False,
    mask_token_id=8191,
)


def bench_model(seed: int = 0) -> WeDLMForCausalLM:
    torch.manual_seed(seed)
    return WeDLMForCausalLM(WeDLMConfig(**BENCH_MODEL)).eval()


def _synchronize(device: torch.device) -> None:
    """Waits for queued GPU work, so a wall-clock interval covers the kernels it launched."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_once(fn, device: torch.device):
    _synchronize(device)
    start = time.perf_counter()
    result = fn()
    _synchronize(device)
    return time.perf_counter() - start, result


def _interleaved(runs: dict, repeats: int, device: torch.device) -> tuple[dict, dict]:
    """Best wall time of `repeats` runs of each function, interleaved: every function runs once untimed (the
    warm-up: compilation, allocator), then each repeat runs all of them, in an order that rotates each repeat.
    Returns the best times and the last results, by name."""
    names = list(runs)
    results = {name: runs[name]() for name in names}
    best = dict.fromkeys(names, float("inf"))
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            seconds, results[name] = _time_once(runs[name], device)
            best[name] = min(best[name], seconds)
    return best, results


# The graphs a benchmark's compiled forward may take: AR and WeDLM at several batch sizes and widths share it, past
# dynamo's default limit (8), where a "compiled" run would go on eagerly with only a warning to say so.
COMPILED_GRAPHS = 64


@contextlib.contextmanager
def swapped_forward(model, forward):
    """`model.forward` is `forward` inside the block (e.g. `torch.compile(model.forward)`), with room for
    COMPILED_GRAPHS graphs; afterwards the model has its own forward again (an instance attribute it had is put
    back, else the class's method shows through)."""
    had = "forward" in vars(model)
    original = vars(model).get("forward")
    model.forward = forward
    room = max(torch._dynamo.config.recompile_limit, COMPILED_GRAPHS)
    try:
        with torch._dynamo.config.patch(recompile_limit=room):
            yield model
    finally:
        if had:
            model.forward = original
        else:
            del model.forward


def compiled_forward(model, backend: str = "inductor"):
    """`torch.compile` of the model's own forward, as a user compiles a model for static-cache AR decoding."""
    return torch.compile(model.forward, backend=backend)


def load_bench_model(path: str | None, device: str = "cpu", dtype: str = "auto") -> WeDLMForCausalLM:
    """The checkpoint at `path`, else the seeded random bench model, on `device` in `dtype` (`--dtype`'s choices:
    auto, bfloat16, float16, float32)."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"--device {device}: not a torch device; use cpu, cuda or cuda:N.") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA device here; leave out --device to run on the CPU.")
    torch_dtype = load_dtype(dtype, device, path)
    model = WeDLMForCausalLM.from_pretrained(path, dtype=torch_dtype) if path else bench_model()
    return model.to(device=device, dtype=torch_dtype).eval()


def run_benchmark(
    model=None,
    new_tokens: int = 256,
    long_tokens: int = 1024,
    window_size: int = 16,
    threshold: float | None = 1e9,
    penalty: float = 0.02,
    batch: int = 4,
    prompt_len: int = 32,
    repeats: int = 3,
    threads: int = 2,
    seed: int = 0,
    compile: bool = True,
    compile_backend: str = "inductor",
    log=print,
) -> dict:
    """`compile`: also time AR and WeDLM single-sequence decoding on the static cache with a compiled forward
    (`compile_backend`: torch.compile's backend; "eager" checks the plumbing without compiling anything)."""
    torch.set_num_threads(threads)
    model = model if model is not None else bench_model(seed)
    mask_id = model.config.mask_token_id
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, model.config.vocab_size - 2, (batch, prompt_len), generator=g).to(model.device)
    one = prompts[:1]
    params = sum(p.numel() for p in model.parameters())
    wedlm_args = dict(
        strategy="wedlm",
        wedlm_window_size=window_size,
        wedlm_entropy_threshold=threshold,
        wedlm_pos_penalty_factor=penalty,
        eos_token_id=None,
        return_dict_in_generate=True,
    )
    threads_used = torch.get_num_threads()
    where = f"{model.device.type}, {str(model.dtype).removeprefix('torch.')}"
    log(
        f"model: {params / 1e6:.1f}M parameters, {where}, {threads_used} thread{'s' * (threads_used != 1)}; "
        f"prompts {batch} x {prompt_len}; W={window_size}, tau={threshold}, lambda={penalty}; best of {repeats} "
        f"interleaved run{'s' * (repeats != 1)}"
    )
    rows, results = [], {}

    def record(name, tokens, forwards, rows_fed, seconds):
        results[name] = dict(
            tokens=tokens,
            forwards=forwards,
            tokens_per_forward=tokens / forwards,
            p_cache=tokens / rows_fed,
            seconds=seconds,
            tokens_per_s=tokens / seconds,
        )
        rows.append(name)

    def ar(**kwargs):
        return model.generate(
            one, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, **kwargs
        )

    def wedlm_one(**kwargs):
        return model.generate(one, max_new_tokens=new_tokens, **wedlm_args, **kwargs)

    def singles():
        return [model.generate(prompts[b : b + 1], max_new_tokens=new_tokens, **wedlm_args) for b in range(batch)]

    runs = {
        "ar": ar,
        "wedlm": wedlm_one,
        "batched": lambda: model.generate(prompts, max_new_tokens=new_tokens, **wedlm_args),
        "singles": singles,
    }
    if compile:
        compiled = compiled_forward(model, compile_backend)

        def with_compiled(fn):
            def run():  # disable_compile: transformers' own auto-compile (CUDA) would compile a second time
                with swapped_forward(model, compiled):
                    return fn(cache_implementation="static", disable_compile=True)

            return run

        runs["ar_compiled"] = with_compiled(ar)
        runs["wedlm_compiled"] = with_compiled(wedlm_one)
    if long_tokens:
        runs["wedlm_long"] = lambda: model.generate(one, max_new_tokens=long_tokens, **wedlm_args)
    best, outputs = _interleaved(runs, repeats, model.device)

    def record_wedlm(name, key):
        stats = outputs[key].wedlm_stats
        record(
            name,
            sum(s.tokens for s in stats),
            max(s.forwards for s in stats),
            sum(s.rows_fed for s in stats),
            best[key],
        )
        return results[name]

    record(f"AR generate, {new_tokens} tokens", new_tokens, new_tokens, new_tokens, best["ar"])
    ar_row = results[rows[-1]]
    wedlm = record_wedlm(f"WeDLM, {new_tokens} tokens", "wedlm")
    batched = record_wedlm(f"WeDLM batched x{batch}", "batched")
    outs = outputs["singles"]
    record(
        f"WeDLM {batch} single runs",
        sum(o.wedlm_stats[0].tokens for o in outs),
        sum(o.wedlm_stats[0].forwards for o in outs),
        sum(o.wedlm_stats[0].rows_fed for o in outs),
        best["singles"],
    )
    singles_result = results[rows[-1]]

    ratios = {
        "wedlm_vs_ar": wedlm["tokens_per_s"] / ar_row["tokens_per_s"],
        "batched_vs_singles": batched["tokens_per_s"] / singles_result["tokens_per_s"],
    }
    mismatches = []
    if compile:
        record(f"AR static+compiled, {new_tokens} tokens", new_tokens, new_tokens, new_tokens, best["ar_compiled"])
        ar_compiled = results[rows[-1]]
        wedlm_compiled = record_wedlm(f"WeDLM static+compiled, {new_tokens} tokens", "wedlm_compiled")
        ratios["wedlm_compiled_vs_ar_compiled"] = wedlm_compiled["tokens_per_s"] / ar_compiled["tokens_per_s"]
        ratios["wedlm_compiled_vs_wedlm"] = wedlm_compiled["tokens_per_s"] / wedlm["tokens_per_s"]
        ratios["ar_compiled_vs_ar"] = ar_compiled["tokens_per_s"] / ar_row["tokens_per_s"]
        pairs = (("WeDLM", outputs["wedlm"].sequences, outputs["wedlm_compiled"].sequences),)
        pairs += (("AR generate", outputs["ar"], outputs["ar_compiled"]),)
        for name, eager, static in pairs:
            if not torch.equal(eager, static):
                differ = (eager != static).nonzero()
                mismatches.append(dict(decoder=name, token=int(differ[0, 1]) - prompt_len))
    if long_tokens:
        long_wedlm = record_wedlm(f"WeDLM, {long_tokens} tokens", "wedlm_long")
        seconds, (_, forwards, rows_fed) = _time_once(
            lambda: blockwise_generate(model, one, mask_id, long_tokens, window_size, threshold, penalty),
            model.device,
        )
        record(f"block-wise no cache, {long_tokens} tokens", long_tokens, forwards, rows_fed, seconds)
        baseline = results[rows[-1]]
        ratios["wedlm_vs_blockwise_long"] = long_wedlm["tokens_per_s"] / baseline["tokens_per_s"]
        ratios["blockwise_rows_per_wedlm_row"] = long_wedlm["p_cache"] / baseline["p_cache"]

    log(f"{'run':<42}{'tokens':>8}{'forwards':>10}{'tok/fwd':>9}{'p_cache':>9}{'seconds':>9}{'tok/s':>9}")
    for name in rows:
        r = results[name]
        p_cache = f"{r['p_cache']:.3f}"
        log(
            f"{name:<42}{r['tokens']:>8}{r['forwards']:>10}{r['tokens_per_forward']:>9.2f}{p_cache:>9}"
            f"{r['seconds']:>9.3f}{r['tokens_per_s']:>9.1f}"
        )
    log(f"WeDLM / AR generate tokens/s: {ratios['wedlm_vs_ar']:.2f}x")
    log(f"batched x{batch} / {batch} single runs, tokens/s: {ratios['batched_vs_singles']:.2f}x")
    if compile:
        log(
            f"WeDLM static+compiled / AR static+compiled tokens/s: {ratios['wedlm_compiled_vs_ar_compiled']:.2f}x "
            f"(torch.compile backend {compile_backend!r})"
        )
        log(f"WeDLM static+compiled / WeDLM eager tokens/s: {ratios['wedlm_compiled_vs_wedlm']:.2f}x")
        log(f"AR static+compiled / AR eager tokens/s: {ratios['ar_compiled_vs_ar']:.2f}x")
        for m in mismatches:
            log(
                f"!!! MISMATCH: {m['decoder']} static+compiled differs from its eager run from generated token "
                f"{m['token']}"
            )
        if not mismatches:
            log("static+compiled runs produce the eager runs' tokens: AR generate, WeDLM")
    if "wedlm_vs_blockwise_long" in ratios:
        log(
            f"WeDLM / block-wise no-cache baseline at {long_tokens} tokens: {ratios['wedlm_vs_blockwise_long']:.2f}x "
            f"(the baseline feeds {ratios['blockwise_rows_per_wedlm_row']:.1f}x as many token rows; timed once)"
        )
    return {"results": results, "ratios": ratios, "mismatches": mismatches}


def bench_command(args) -> None:
    """`wedlm-hf bench`."""
    report = run_benchmark(
        model=load_bench_model(args.model, args.device, args.dtype),
        new_tokens=args.new_tokens,
        long_tokens=args.long_tokens,
        window_size=args.window_size,
        threshold=args.threshold,
        penalty=args.penalty,
        batch=args.batch,
        repeats=args.repeats,
        threads=args.threads,
        compile=not args.no_compile,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
