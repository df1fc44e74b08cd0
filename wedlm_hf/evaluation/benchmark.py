"""`wedlm-hf bench`: plain AR generate, WeDLM streaming decoding and the no-cache block-wise baseline, side by side.

Everything runs in one process on the same model and prompts, so the printed ratios compare like with like: the
decoders' runs are interleaved (the order rotates each repeat) and each row keeps its best time, so a busy machine
slows all of them alike. Each run is warmed up once, untimed (for the compiled rows, that is the compilation).
The compiled rows decode on the static cache (`cache_implementation="static"`) with `torch.compile(model.forward)`
swapped in for those runs only, as a user compiles AR on the CPU; the eager rows keep the model's own forward.
The default model is a seeded random 16M-parameter WeDLM model; with `--threshold` huge every mask is accepted,
which measures the decoder's mechanics (tokens per forward, cache reuse) independently of model quality.
"""

import torch

from ..data import load_dtype
from ..modeling import WeDLMConfig, WeDLMForCausalLM
from .bench_report import Column, best_of, parameter_count, plural, ratio_line, table_head, table_row, write_json
from .blockwise_baseline import blockwise_generate
from .compiled_forward import compiled_forward, swapped_forward
from .interleaved_runs import interleave, timed

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


def random_model(values: dict, seed: int) -> WeDLMForCausalLM:
    """A WeDLM model of the config `values`, its weights drawn from `seed`: the same model in every run."""
    torch.manual_seed(seed)
    return WeDLMForCausalLM(WeDLMConfig(**values)).eval()


def bench_model(seed: int = 0) -> WeDLMForCausalLM:
    return random_model(BENCH_MODEL, seed)


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


COLUMNS = [
    Column("run", 42, align="<"),
    Column("tokens", 8),
    Column("forwards", 10),
    Column("tok/fwd", 9, ".2f"),
    Column("p_cache", 9, ".3f"),
    Column("seconds", 9, ".3f"),
    Column("tok/s", 9, ".1f"),
]


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
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, model.config.vocab_size - 2, (batch, prompt_len), generator=g).to(model.device)
    wedlm_args = dict(
        strategy="wedlm",
        wedlm_window_size=window_size,
        wedlm_entropy_threshold=threshold,
        wedlm_pos_penalty_factor=penalty,
        wedlm_context_drafts=False,  # the paper's rule, whose mechanics (and block-wise twin) this times
        eos_token_id=None,
        return_dict_in_generate=True,
    )
    where = f"{model.device.type}, {str(model.dtype).removeprefix('torch.')}"
    log(
        f"model: {parameter_count(model) / 1e6:.1f}M parameters, {where}, {plural(torch.get_num_threads(), 'thread')}; "
        f"prompts {batch} x {prompt_len}; W={window_size}, tau={threshold}, lambda={penalty}; {best_of(repeats)}"
    )
    compiled = compiled_forward(model, compile_backend) if compile else None
    runs = _decoder_runs(model, prompts, new_tokens, long_tokens, wedlm_args, compiled)
    timings = interleave(runs, repeats, device=model.device, warm_up=True)
    rows = _rows(timings, new_tokens, batch, long_tokens, compile)
    if long_tokens:
        seconds, (_, forwards, rows_fed) = timed(
            lambda: blockwise_generate(
                model, prompts[:1], model.config.mask_token_id, long_tokens, window_size, threshold, penalty
            ),
            model.device,
        )
        rows["blockwise"] = (
            f"block-wise no cache, {long_tokens} tokens",
            _row(long_tokens, forwards, rows_fed, seconds),
        )
    ratios = _ratios(rows)
    mismatches = _compiled_mismatches(timings, prompt_len) if compile else []
    results = dict(rows.values())
    _log_report(log, results, ratios, mismatches, batch, long_tokens, compile_backend if compile else None)
    return {"results": results, "ratios": ratios, "mismatches": mismatches}


def _decoder_runs(model, prompts, new_tokens: int, long_tokens: int, wedlm_args: dict, compiled) -> dict:
    """name -> a run of one decoder: AR, WeDLM on one prompt, batched and one prompt at a time, and (`compiled`)
    AR and WeDLM on the static cache with the compiled forward swapped in, and WeDLM over `long_tokens`."""
    one = prompts[:1]

    def ar(**kwargs):
        return model.generate(
            one, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, **kwargs
        )

    def wedlm_one(**kwargs):
        return model.generate(one, max_new_tokens=new_tokens, **wedlm_args, **kwargs)

    def singles():
        return [
            model.generate(prompts[b : b + 1], max_new_tokens=new_tokens, **wedlm_args) for b in range(len(prompts))
        ]

    at_one = wedlm_args | dict(wedlm_window_size=1, wedlm_entropy_threshold=None, wedlm_context_drafts=True)
    ar_work = at_one | dict(wedlm_lossless=True, wedlm_context_drafts=False)
    runs = {
        "ar": ar,
        "wedlm": wedlm_one,
        # W = 1: AR's own token each forward and nothing else (copies from the context aside): AR's work, so its
        # gap to AR is the decoder's machinery
        "wedlm_w1": lambda: model.generate(one, max_new_tokens=new_tokens, **at_one),
        # Lossless without copies: AR's token alone each forward, exactly AR's work, so its forward against AR's step
        # is the machinery alone (the default rule at W = 1 feeds its fill and a mask)
        "wedlm_w1_alone": lambda: model.generate(one, max_new_tokens=new_tokens, **ar_work),
        "batched": lambda: model.generate(prompts, max_new_tokens=new_tokens, **wedlm_args),
        "singles": singles,
    }
    if compiled is not None:

        def with_compiled(fn):
            def run():  # disable_compile: transformers' own auto-compile (CUDA) would compile a second time
                with swapped_forward(model, compiled):
                    return fn(cache_implementation="static", disable_compile=True)

            return run

        runs["ar_compiled"] = with_compiled(ar)
        runs["wedlm_compiled"] = with_compiled(wedlm_one)
    if long_tokens:
        runs["wedlm_long"] = lambda: model.generate(one, max_new_tokens=long_tokens, **wedlm_args)
    return runs


def _row(tokens: int, forwards: int, rows_fed: int, seconds: float) -> dict:
    return dict(
        tokens=tokens,
        forwards=forwards,
        tokens_per_forward=tokens / forwards,
        p_cache=tokens / rows_fed,
        seconds=seconds,
        tokens_per_s=tokens / seconds,
    )


def _rows(timings, new_tokens: int, batch: int, long_tokens: int, compile: bool) -> dict:
    """run -> (the table's name for it, its measurements), in the table's order."""

    def wedlm(run: str) -> dict:
        stats = timings.result(run).wedlm_stats
        forwards = max(s.forwards for s in stats)
        return _row(sum(s.tokens for s in stats), forwards, sum(s.rows_fed for s in stats), timings.best(run))

    def ar(run: str) -> dict:  # one token per forward, the whole budget (no eos)
        return _row(new_tokens, new_tokens, new_tokens, timings.best(run))

    singles = [out.wedlm_stats[0] for out in timings.result("singles")]
    tokens, forwards = sum(s.tokens for s in singles), sum(s.forwards for s in singles)
    rows_fed = sum(s.rows_fed for s in singles)
    rows = {
        "ar": (f"AR generate, {new_tokens} tokens", ar("ar")),
        "wedlm": (f"WeDLM, {new_tokens} tokens", wedlm("wedlm")),
        "wedlm_w1": (f"WeDLM W=1 (AR's work), {new_tokens} tokens", wedlm("wedlm_w1")),
        "wedlm_w1_alone": (f"WeDLM W=1 lossless, no copies, {new_tokens} tokens", wedlm("wedlm_w1_alone")),
        "batched": (f"WeDLM batched x{batch}", wedlm("batched")),
        "singles": (f"WeDLM {batch} single runs", _row(tokens, forwards, rows_fed, timings.best("singles"))),
    }
    if compile:
        rows["ar_compiled"] = (f"AR static+compiled, {new_tokens} tokens", ar("ar_compiled"))
        rows["wedlm_compiled"] = (f"WeDLM static+compiled, {new_tokens} tokens", wedlm("wedlm_compiled"))
    if long_tokens:
        rows["wedlm_long"] = (f"WeDLM, {long_tokens} tokens", wedlm("wedlm_long"))
    return rows


def _ratios(rows: dict) -> dict:
    """The ratios of tokens/s the report names (and the baseline's token rows per WeDLM row)."""

    def faster(a: str, b: str, measure: str = "tokens_per_s") -> float:
        return rows[a][1][measure] / rows[b][1][measure]

    ratios = {"wedlm_vs_ar": faster("wedlm", "ar"), "batched_vs_singles": faster("batched", "singles")}
    ratios["wedlm_w1_vs_ar"] = faster("wedlm_w1", "ar")
    w1, ar = rows["wedlm_w1"][1], rows["ar"][1]  # a W=1 forward's time against an AR step's: the machinery
    ratios["w1_forward_vs_ar_step"] = (w1["seconds"] / w1["forwards"]) / (ar["seconds"] / ar["forwards"])
    alone = rows["wedlm_w1_alone"][1]
    ratios["w1_alone_forward_vs_ar_step"] = (alone["seconds"] / alone["forwards"]) / (ar["seconds"] / ar["forwards"])
    if "wedlm_compiled" in rows:
        ratios["wedlm_compiled_vs_ar_compiled"] = faster("wedlm_compiled", "ar_compiled")
        ratios["wedlm_compiled_vs_wedlm"] = faster("wedlm_compiled", "wedlm")
        ratios["ar_compiled_vs_ar"] = faster("ar_compiled", "ar")
    if "blockwise" in rows:
        ratios["wedlm_vs_blockwise_long"] = faster("wedlm_long", "blockwise")
        ratios["blockwise_rows_per_wedlm_row"] = faster("wedlm_long", "blockwise", "p_cache")
    return ratios


def _compiled_mismatches(timings, prompt_len: int) -> list[dict]:
    """Where a static+compiled run's tokens differ from its eager run's: the first generated token that does."""
    mismatches = []
    pairs = (("WeDLM", timings.result("wedlm").sequences, timings.result("wedlm_compiled").sequences),)
    pairs += (("AR generate", timings.result("ar"), timings.result("ar_compiled")),)
    for name, eager, static in pairs:
        if not torch.equal(eager, static):
            differ = (eager != static).nonzero()
            mismatches.append(dict(decoder=name, token=int(differ[0, 1]) - prompt_len))
    return mismatches


def _log_report(log, results: dict, ratios: dict, mismatches: list, batch: int, long_tokens: int, backend) -> None:
    """The table, then the ratios; `backend`: torch.compile's, where the compiled rows ran."""
    log(table_head(COLUMNS))
    for name, r in results.items():
        values = (r["tokens"], r["forwards"], r["tokens_per_forward"], r["p_cache"], r["seconds"], r["tokens_per_s"])
        log(table_row(COLUMNS, [name, *values]))
    log(ratio_line("WeDLM / AR generate tokens/s", ratios["wedlm_vs_ar"]))
    w1 = results[next(name for name in results if name.startswith("WeDLM W=1"))]
    copies = f" (AR's token each forward, and copies: {w1['tokens_per_forward']:.2f} tokens per forward)"
    log(ratio_line("WeDLM W=1 / AR generate tokens/s", ratios["wedlm_w1_vs_ar"], copies))
    log(ratio_line("WeDLM W=1 seconds per forward / AR seconds per step", ratios["w1_forward_vs_ar_step"]))
    log(
        ratio_line(
            "WeDLM W=1 lossless, no copies, seconds per forward / AR seconds per step",
            ratios["w1_alone_forward_vs_ar_step"],
            " (exactly AR's work: the machinery's cost)",
        )
    )
    log(ratio_line(f"batched x{batch} / {batch} single runs, tokens/s", ratios["batched_vs_singles"]))
    if backend is not None:
        log(
            ratio_line(
                "WeDLM static+compiled / AR static+compiled tokens/s",
                ratios["wedlm_compiled_vs_ar_compiled"],
                f" (torch.compile backend {backend!r})",
            )
        )
        log(ratio_line("WeDLM static+compiled / WeDLM eager tokens/s", ratios["wedlm_compiled_vs_wedlm"]))
        log(ratio_line("AR static+compiled / AR eager tokens/s", ratios["ar_compiled_vs_ar"]))
        for m in mismatches:
            log(
                f"!!! MISMATCH: {m['decoder']} static+compiled differs from its eager run from generated token "
                f"{m['token']}"
            )
        if not mismatches:
            log("static+compiled runs produce the eager runs' tokens: AR generate, WeDLM")
    if "wedlm_vs_blockwise_long" in ratios:
        log(
            ratio_line(
                f"WeDLM / block-wise no-cache baseline at {long_tokens} tokens",
                ratios["wedlm_vs_blockwise_long"],
                f" (the baseline feeds {ratios['blockwise_rows_per_wedlm_row']:.1f}x as many token rows; timed once)",
            )
        )


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
    write_json(args.json, report)
