"""`wedlm-hf generate`: stream a WeDLM completion as it commits, then time plain AR decoding of the same prompt."""

import time

from transformers import AutoTokenizer, TextStreamer
from transformers.utils import logging

from ..data import default_model_path, load_dtype
from ..modeling import WeDLMForCausalLM


def check_prompt(prompt_tokens: int, max_new_tokens: int, context: int) -> None:
    """Refuses, before any decoding, what the user can fix: an empty prompt, or more tokens than the context."""
    if prompt_tokens == 0:
        raise ValueError('The prompt is empty: give the text to continue, e.g. wedlm-hf generate "def fibonacci(n):".')
    if prompt_tokens >= context:
        raise ValueError(
            f"The prompt is {prompt_tokens} tokens and the model has {context} positions: shorten the prompt to leave "
            "room for new tokens."
        )
    if prompt_tokens + max_new_tokens > context:
        raise ValueError(
            f"The prompt is {prompt_tokens} tokens and --max-new-tokens is {max_new_tokens}: together more than the "
            f"model's {context} positions; shorten the prompt or lower --max-new-tokens "
            f"(to {context - prompt_tokens} at most)."
        )


def run_demo(
    prompt: str,
    model_path: str | None = None,
    max_new_tokens: int = 128,
    window_size: int = 16,
    threshold: float | None = 0.4,
    penalty: float = 0.02,
    lossless: bool = False,
    context_drafts: bool | None = None,
    context_ngram: int | None = None,
    compare: bool = True,
    print_fn=print,
    dtype: str = "auto",
) -> dict:
    logging.disable_progress_bar()
    path = model_path or default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = WeDLMForCausalLM.from_pretrained(path, dtype=load_dtype(dtype, "cpu", path)).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    check_prompt(ids.shape[1], max_new_tokens, model.config.max_position_embeddings)
    options = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    wedlm = dict(
        wedlm_window_size=window_size,
        wedlm_entropy_threshold=threshold,
        wedlm_pos_penalty_factor=penalty,
        wedlm_lossless=lossless,
    )
    # None: the model's generation config decides (then the built-in defaults), as for generate() itself.
    for key, value in (("wedlm_context_drafts", context_drafts), ("wedlm_context_ngram", context_ngram)):
        if value is not None:
            wedlm[key] = value

    # One short untimed run of each method first, so neither timing includes one-time start-up costs.
    model.generate(ids, do_sample=False, max_new_tokens=2, pad_token_id=tokenizer.pad_token_id)
    model.generate(ids, strategy="wedlm", max_new_tokens=2, pad_token_id=tokenizer.pad_token_id)

    print_fn(prompt, end="", flush=True)
    out, seconds = _streamed(model, tokenizer, ids, print_fn, **wedlm, **options)
    mode = "WeDLM lossless" if lossless else "WeDLM"
    settings = f"{mode} (W={window_size}, tau={threshold}, lambda={penalty})"
    report = {"wedlm": _wedlm_summary(out.wedlm_stats[0], seconds, settings, print_fn)}
    if compare:
        start = time.perf_counter()
        ar = model.generate(ids, do_sample=False, **options)
        ar_seconds = time.perf_counter() - start
        ar_tokens = ar.shape[1] - ids.shape[1]
        report["ar"] = {"tokens": ar_tokens, "seconds": ar_seconds, "tokens_per_s": ar_tokens / ar_seconds}
        print_fn(
            f"plain AR generate: {ar_tokens} tokens = 1.00 tokens/forward, {report['ar']['tokens_per_s']:.1f} tokens/s"
        )
        print_fn(f"{mode} / AR tokens/s: {report['wedlm']['tokens_per_s'] / report['ar']['tokens_per_s']:.2f}x")
        report["identical_to_ar"] = ar[0].tolist() == out.sequences[0].tolist()
        if lossless:
            print_fn(f"output identical to plain AR generate: {'yes' if report['identical_to_ar'] else 'NO'}")
    return report


def _streamed(model, tokenizer, ids, print_fn, **options):
    """WeDLM's decoding, its text streamed as it commits; the output and its wall time."""
    start = time.perf_counter()
    try:
        out = model.generate(
            ids,
            strategy="wedlm",
            streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True),
            return_dict_in_generate=True,
            **options,
        )
    except BaseException:  # Ctrl-C or an error: end the streamed line, so the message starts on its own line
        print_fn(flush=True)
        raise
    return out, time.perf_counter() - start


def _wedlm_summary(stats, seconds: float, settings: str, print_fn) -> dict:
    """The streamed run's counts and speed (with its drafts by source, in lossless mode), printed under it."""
    summary = {**stats.to_dict(), "seconds": seconds, "tokens_per_s": stats.tokens / seconds}
    accepted = ""
    if stats.acceptance_rate is not None:
        model_drafts = stats.accepted_drafts - stats.accepted_context_drafts
        summary["accepted_drafts_by_source"] = {"model": model_drafts, "context": stats.accepted_context_drafts}
        accepted = (
            f", {stats.acceptance_rate:.0%} of drafts accepted (model {model_drafts}, "
            f"context {stats.accepted_context_drafts})"
        )
    print_fn(
        f"\n--\n{settings}: {stats.tokens} tokens in "
        f"{stats.forwards} forwards = {stats.tokens_per_forward:.2f} tokens/forward, p_cache {stats.p_cache:.2f}, "
        f"{summary['tokens_per_s']:.1f} tokens/s{accepted}"
    )
    return summary


def generate_command(args) -> None:
    """`wedlm-hf generate PROMPT`."""
    run_demo(
        prompt=args.prompt,
        model_path=args.model,
        max_new_tokens=args.max_new_tokens,
        window_size=args.window_size,
        threshold=args.threshold,
        penalty=args.penalty,
        lossless=args.lossless,
        context_drafts=False if args.no_context_drafts else None,
        context_ngram=args.context_ngram,
        compare=not args.no_compare,
        dtype=args.dtype,
    )
