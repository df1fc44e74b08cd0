"""`wedlm-hf bench`: plain AR generate, WeDLM streaming decoding and the no-cache block-wise baseline, side by side.

Everything runs in one process on the same model and prompts, so the printed ratios compare like with like.
The default model is a seeded random 16M-parameter WeDLM model; with `--threshold` huge every mask is accepted,
which measures the decoder's mechanics (tokens per forward, cache reuse) independently of model quality.
"""

import json
import statistics
import time

import torch

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


def _timed(fn, repeats: int, device: torch.device):
    """Median wall time of `repeats` runs after one warm-up, and the last result."""
    result = fn()
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        result = fn()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def load_bench_model(path: str | None, device: str = "cpu", dtype: str = "float32") -> WeDLMForCausalLM:
    """The checkpoint at `path`, else the seeded random bench model, on `device` in `dtype` ("float32", ...)."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"--device {device}: not a torch device; use cpu, cuda or cuda:N.") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA device here; leave out --device to run on the CPU.")
    torch_dtype = getattr(torch, dtype)
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
    log=print,
) -> dict:
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
        f"prompts {batch} x {prompt_len}; W={window_size}, tau={threshold}, lambda={penalty}; median of {repeats} "
        f"run{'s' * (repeats != 1)}"
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

    t, _ = _timed(
        lambda: model.generate(
            one, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, eos_token_id=None
        ),
        repeats,
        model.device,
    )
    record(f"AR generate, {new_tokens} tokens", new_tokens, new_tokens, new_tokens, t)
    ar = results[rows[-1]]

    t, out = _timed(lambda: model.generate(one, max_new_tokens=new_tokens, **wedlm_args), repeats, model.device)
    s = out.wedlm_stats[0]
    record(f"WeDLM, {new_tokens} tokens", s.tokens, s.forwards, s.rows_fed, t)
    wedlm = results[rows[-1]]

    t_batch, out = _timed(
        lambda: model.generate(prompts, max_new_tokens=new_tokens, **wedlm_args), repeats, model.device
    )
    stats = out.wedlm_stats
    record(
        f"WeDLM batched x{batch}",
        sum(s.tokens for s in stats),
        max(s.forwards for s in stats),
        sum(s.rows_fed for s in stats),
        t_batch,
    )
    batched = results[rows[-1]]

    def singles():
        return [model.generate(prompts[b : b + 1], max_new_tokens=new_tokens, **wedlm_args) for b in range(batch)]

    t_single, outs = _timed(singles, repeats, model.device)
    record(
        f"WeDLM {batch} single runs",
        sum(o.wedlm_stats[0].tokens for o in outs),
        sum(o.wedlm_stats[0].forwards for o in outs),
        sum(o.wedlm_stats[0].rows_fed for o in outs),
        t_single,
    )
    singles_result = results[rows[-1]]

    ratios = {
        "wedlm_vs_ar": wedlm["tokens_per_s"] / ar["tokens_per_s"],
        "batched_vs_singles": batched["tokens_per_s"] / singles_result["tokens_per_s"],
    }
    if long_tokens:
        t, out = _timed(lambda: model.generate(one, max_new_tokens=long_tokens, **wedlm_args), repeats, model.device)
        s = out.wedlm_stats[0]
        record(f"WeDLM, {long_tokens} tokens", s.tokens, s.forwards, s.rows_fed, t)
        long_wedlm = results[rows[-1]]
        t, (_, forwards, rows_fed) = _timed(
            lambda: blockwise_generate(model, one, mask_id, long_tokens, window_size, threshold, penalty),
            1,
            model.device,
        )
        record(f"block-wise no cache, {long_tokens} tokens", long_tokens, forwards, rows_fed, t)
        baseline = results[rows[-1]]
        ratios["wedlm_vs_blockwise_long"] = long_wedlm["tokens_per_s"] / baseline["tokens_per_s"]
        ratios["blockwise_rows_per_wedlm_row"] = long_wedlm["p_cache"] / baseline["p_cache"]

    log(f"{'run':<38}{'tokens':>8}{'forwards':>10}{'tok/fwd':>9}{'p_cache':>9}{'seconds':>9}{'tok/s':>9}")
    for name in rows:
        r = results[name]
        p_cache = f"{r['p_cache']:.3f}"
        log(
            f"{name:<38}{r['tokens']:>8}{r['forwards']:>10}{r['tokens_per_forward']:>9.2f}{p_cache:>9}"
            f"{r['seconds']:>9.3f}{r['tokens_per_s']:>9.1f}"
        )
    log(f"WeDLM / AR generate tokens/s: {ratios['wedlm_vs_ar']:.2f}x")
    log(f"batched x{batch} / {batch} single runs, tokens/s: {ratios['batched_vs_singles']:.2f}x")
    if "wedlm_vs_blockwise_long" in ratios:
        log(
            f"WeDLM / block-wise no-cache baseline at {long_tokens} tokens: {ratios['wedlm_vs_blockwise_long']:.2f}x "
            f"(the baseline feeds {ratios['blockwise_rows_per_wedlm_row']:.1f}x as many token rows)"
        )
    return {"results": results, "ratios": ratios}


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
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
