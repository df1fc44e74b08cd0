"""`wedlm-hf bench-lossless`: lossless WeDLM decoding against plain AR and transformers' prompt lookup decoding.

Lossless decoding promises AR greedy output, faster; prompt lookup (`prompt_lookup_num_tokens`) makes the same
promise by drafting from the context, so it is the baseline to beat. Each family's prompts go through every decoder
in one process, interleaved (the order rotates each repeat) and timed best of `repeats`, so a busy machine slows all
decoders alike; lossless against prompt lookup is also given for each timed run alone (its lowest and highest), to
show how far the machine's noise moves that ratio. Before any timing, each output that should equal AR's is checked
against it, prompt by prompt.

With `compiled`, three more decoders run on the static cache (`cache_implementation="static"`), compiled as a user
compiles AR decoding on that device: AR, WeDLM and lossless, compiled. On the CPU, where `generate` does not compile,
`torch.compile(model.forward)` is swapped in for their runs only; on a GPU, `generate` compiles the decoding step
itself (transformers' `CompileConfig`: inductor with CUDA graphs), as it does for any static-cache call there.
The lossless promise holds there too: "lossless compiled" (and "AR compiled") must be AR's output. The untimed
check pass is also their warm-up, so compilation is never timed. Compiled lossless is also set against eager
prompt lookup: transformers before 5.24 refuses a static cache for prompt lookup, and 5.25 overruns
one when drafts reach the token budget (docs/benchmarks.md), so eager is the prompt lookup that runs every prompt.

`dtype` (`--dtype`) is the model's; `batch_invariant` (`--batch-invariant`) runs every decoder, checks and timed runs
alike, inside `wedlm_hf.batch_invariant()`, where lossless (and prompt lookup) equal AR bit for bit in every dtype.
"""

import contextlib
import random

import torch
from transformers import AutoTokenizer, CompileConfig

from ..data import FAMILIES, default_model_path
from ..modeling.batch_invariant import batch_invariant as batch_invariance
from .bench_report import (
    Column,
    best_of,
    parameter_count,
    plural,
    ratio_column,
    shipped_or_path,
    table_head,
    table_row,
    write_json,
)
from .benchmark import load_bench_model
from .compiled_forward import compiled_forward, swapped_in
from .evaluate import code_snippets, held_out_items
from .interleaved_runs import interleave

# name -> generate() arguments; the WeDLM ones take W, tau and lambda from the model's generation config.
DECODERS = {
    "AR": dict(do_sample=False),
    "prompt lookup": dict(do_sample=False, prompt_lookup_num_tokens=10),
    "WeDLM": dict(strategy="wedlm"),
    "lossless": dict(strategy="wedlm", wedlm_lossless=True),
    "lossless, no context drafts": dict(strategy="wedlm", wedlm_lossless=True, wedlm_context_drafts=False),
}
# Decoders whose output must be AR's, token for token.
EXACT = ("prompt lookup", "lossless", "lossless, no context drafts")
# With `compiled`: these run on the static cache under a compiled forward.
COMPILED_DECODERS = {
    "AR compiled": dict(do_sample=False, cache_implementation="static"),
    "WeDLM compiled": dict(strategy="wedlm", cache_implementation="static"),
    "lossless compiled": dict(strategy="wedlm", wedlm_lossless=True, cache_implementation="static"),
}
# (With a swapped-in compiled forward, disable_compile=True for them: that forward is the one compile.)
EXACT_COMPILED = ("AR compiled", "lossless compiled")
_WORDS = "apple river stone cloud tiger lamp orange piano forest candle mirror silver rocket garden window".split()


def repeat_prompts(count: int, seed: int = 0) -> list[str]:
    """Prompts whose continuation repeats what they contain: long word and number lists to copy, and code blocks
    that continue a pattern. Here drafting from the context should pay most."""
    rng = random.Random(f"repeat-{seed}")
    prompts = []
    for i in range(count):
        kind = i % 3
        if kind == 0:
            prompts.append("copy: " + " ".join(rng.choice(_WORDS) for _ in range(16)) + " =>")
        elif kind == 1:
            prompts.append("copy: " + " ".join(str(rng.randint(0, 99)) for _ in range(20)) + " =>")
        else:
            name = rng.choice(("values", "row", "data", "args"))
            lines = [f"    x{j} = {name}[{j}]\n" for j in range(6)]
            prompts.append(f"def unpack({name}):\n" + "".join(lines))
    return prompts


def prompt_families(tokenizer, per_family: int, train_items_per_family: int = 20000) -> dict[str, list[list[int]]]:
    """Token ids of the prompts: `wedlm-hf evaluate`'s held-out families and code, then the repeat prompts."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    families = {f: [encode(q) for q, _ in held_out_items(f, per_family, train_items_per_family)] for f in FAMILIES}
    families["code"] = code_snippets(tokenizer, per_family, prompt_tokens=48)
    families["repeat"] = [encode(p) for p in repeat_prompts(per_family)]
    return families


class _Decoders:
    """The decoders of one run on one model: `decode(name, ids)` runs one on a prompt, a compiled one under its
    compile (a swapped-in compiled forward, or `generate`'s own compile)."""

    def __init__(self, model, new_tokens: int, compiled: bool, backend: str, compile_in_generate: bool):
        self.model, self.new_tokens = model, new_tokens
        self.decoders = {**DECODERS, **(COMPILED_DECODERS if compiled else {})}
        self.names = list(self.decoders)
        self.exact = EXACT + (EXACT_COMPILED if compiled else ())
        self.compiled_call = compiled_forward(model, backend) if compiled and not compile_in_generate else None
        if compile_in_generate:
            config = generate_compile_config(backend, model.device.type)
            self.compiled_args = dict(compile_config=config)
            self.compile = f"generate's own compile ({config})"
        else:
            self.compiled_args = dict(disable_compile=True)
            self.compile = f"torch.compile(model.forward) (backend {backend!r})"

    def decode(self, name: str, ids: list[int], checked: bool = True):
        """The generated tokens and WeDLM stats; timed runs (`checked=False`) make the plain call, which returns
        the token ids alone (a dict output also builds the returned cache, which AR keeps anyway). The ids come
        back to the CPU, which waits for a GPU's work: the timing covers it."""
        x = torch.tensor([ids], device=self.model.device)
        compiled = name in COMPILED_DECODERS
        with swapped_in(self.model, self.compiled_call, compiled and self.compiled_call is not None):
            extra = self.compiled_args if compiled else {}
            out = self.model.generate(
                x, max_new_tokens=self.new_tokens, return_dict_in_generate=checked, **self.decoders[name], **extra
            )
        if not checked:
            return out[0, len(ids) :].tolist(), None
        stats = getattr(out, "wedlm_stats", None)
        return out.sequences[0, len(ids) :].tolist(), stats[0] if stats else None


def run_lossless_benchmark(
    model_path: str,
    prompts_per_family: int = 10,
    new_tokens: int = 64,
    repeats: int = 3,
    threads: int = 1,
    train_items_per_family: int = 20000,
    compiled: bool = False,
    compile_backend: str = "inductor",
    device: str = "cpu",
    compile_in_generate: bool | None = None,
    dtype: str = "float32",
    batch_invariant: bool = False,
    log=print,
) -> dict:
    """`compiled`: also the COMPILED_DECODERS, with torch.compile's `compile_backend` ("eager": the plumbing only).
    `compile_in_generate`: compile them as `generate` does on a GPU (default: on a CUDA `device`), not by swapping
    in a compiled forward. `batch_invariant`: every run inside `batch_invariant()` (not with `compiled`)."""
    if batch_invariant and compiled:
        raise ValueError("--batch-invariant does not cover compiled forwards: leave out --compiled.")
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = load_bench_model(model_path, device, dtype)
    families = prompt_families(tokenizer, prompts_per_family, train_items_per_family)
    if compile_in_generate is None:
        compile_in_generate = model.device.type == "cuda"
    decoders = _Decoders(model, new_tokens, compiled, compile_backend, compile_in_generate)
    prompts = {(family, p): ids for family, family_prompts in families.items() for p, ids in enumerate(family_prompts)}

    def timed_run(name: str):
        return lambda case: decoders.decode(name, prompts[case], checked=False)

    with batch_invariance() if batch_invariant else contextlib.nullcontext():
        outputs, mismatches = _check_against_ar(decoders, prompts, tokenizer, log)
        timings = interleave({name: timed_run(name) for name in decoders.names}, repeats, cases=list(prompts))
    groups = {f: [(f, p) for p in range(len(family_prompts))] for f, family_prompts in families.items()}
    groups["all"] = list(prompts)
    rows = {
        family: _family_row(family, cases, decoders, outputs, timings, mismatches, repeats)
        for family, cases in groups.items()
    }
    dtype_name = str(model.dtype).removeprefix("torch.") + (", batch-invariant" if batch_invariant else "")
    log(
        f"model: {shipped_or_path(model_path)}, {parameter_count(model) / 1e6:.1f}M parameters, {model.device} "
        f"{dtype_name}, {plural(torch.get_num_threads(), 'CPU thread')}; {plural(prompts_per_family, 'prompt')} per "
        f"family, at most {new_tokens} new tokens (stops at eos), {best_of(repeats)}"
    )
    _log_tables(log, rows, decoders.compile if compiled else None)
    failed = sorted({(m["decoder"], m["family"]) for m in mismatches})
    if failed:
        log("!!! NOT identical to AR generate: " + ", ".join(f"{d} on {f}" for d, f in failed))
    else:
        log(f"identical to AR generate on every prompt: {', '.join(decoders.exact)}")
    settings = dict(prompts_per_family=prompts_per_family, new_tokens=new_tokens, repeats=repeats)
    settings |= dict(
        threads=torch.get_num_threads(), device=str(model.device), dtype=str(model.dtype).removeprefix("torch.")
    )
    settings |= dict(batch_invariant=batch_invariant)
    settings |= dict(
        compiled=compile_backend if compiled else None, compiled_in_generate=compiled and compile_in_generate
    )
    return dict(settings=settings, families=rows, mismatches=mismatches)


def _check_against_ar(decoders: _Decoders, prompts: dict, tokenizer, log) -> tuple[dict, list[dict]]:
    """Every decoder on every prompt once, untimed (which warms each up): (case, decoder) -> (tokens, WeDLM stats),
    and where an output that must be AR's is not."""
    outputs, mismatches = {}, []
    for (family, p), ids in prompts.items():
        for name in decoders.names:
            outputs[(family, p), name] = decoders.decode(name, ids)
        ar = outputs[(family, p), "AR"][0]
        for name in decoders.exact:
            got = outputs[(family, p), name][0]
            if got != ar:
                first = next((i for i, (a, b) in enumerate(zip(ar, got)) if a != b), min(len(ar), len(got)))
                mismatches.append(dict(family=family, prompt=tokenizer.decode(ids), decoder=name, token=first))
                log(
                    f"!!! MISMATCH: {name} differs from AR generate on {family} prompt {p} "
                    f"({tokenizer.decode(ids)!r}) from generated token {first}"
                )
    return outputs, mismatches


def _family_row(family: str, cases: list, decoders: _Decoders, outputs, timings, mismatches, repeats: int) -> dict:
    """One row of the tables: each decoder's tokens, best seconds and tokens/s over `cases` (with its drafts, for
    WeDLM decoders), whether it stayed AR's, and the ratios the tables print."""
    row = dict(prompts=len(cases), identical_to_ar={})
    for name in decoders.names:
        tokens = sum(len(outputs[case, name][0]) for case in cases)
        seconds = sum(timings.best((case, name)) for case in cases)
        row[name] = dict(tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds)
        stats = [outputs[case, name][1] for case in cases]
        if stats[0] is not None:
            row[name].update(_drafts(stats, tokens))
    for name in decoders.exact:
        wrong = [m for m in mismatches if m["decoder"] == name and family in (m["family"], "all")]
        row["identical_to_ar"][name] = not wrong

    def faster(a: str, b: str) -> float:
        return row[a]["tokens_per_s"] / row[b]["tokens_per_s"]

    row["lossless_vs_ar"] = faster("lossless", "AR")
    row["wedlm_vs_ar"], row["wedlm_vs_lossless"] = faster("WeDLM", "AR"), faster("WeDLM", "lossless")
    row["lossless_vs_prompt_lookup"] = faster("lossless", "prompt lookup")
    # The same ratio within each timed run alone (its prompts' single timings): how far the machine's noise moves
    # it, beside the best-of ratio.
    row["lossless_vs_prompt_lookup_per_run"] = [
        sum(timings.seconds[case, "prompt lookup"][r] for case in cases)
        / sum(timings.seconds[case, "lossless"][r] for case in cases)
        for r in range(repeats)
    ]
    if "lossless compiled" in row:
        row["lossless_compiled_vs_ar_compiled"] = faster("lossless compiled", "AR compiled")
        row["lossless_compiled_vs_prompt_lookup"] = faster("lossless compiled", "prompt lookup")
        row["lossless_compiled_vs_lossless"] = faster("lossless compiled", "lossless")
        row["wedlm_compiled_vs_wedlm"] = faster("WeDLM compiled", "WeDLM")
        row["wedlm_compiled_vs_ar_compiled"] = faster("WeDLM compiled", "AR compiled")
        row["wedlm_compiled_vs_lossless_compiled"] = faster("WeDLM compiled", "lossless compiled")
        row["ar_compiled_vs_ar"] = faster("AR compiled", "AR")
    return row


def _drafts(stats: list, tokens: int) -> dict:
    """A WeDLM decoder's forwards and drafts over some prompts, the accepted and rejected ones by source."""
    forwards = sum(s.forwards for s in stats)
    return dict(
        forwards=forwards,
        tokens_per_forward=tokens / forwards,
        accepted_context_drafts=sum(s.accepted_context_drafts for s in stats),
        rejected_context_drafts=sum(s.rejected_context_drafts for s in stats),
        accepted_model_drafts=sum(s.accepted_drafts - s.accepted_context_drafts for s in stats),
        rejected_model_drafts=sum(s.rejected_drafts - s.rejected_context_drafts for s in stats),
    )


def _log_tables(log, rows: dict, compile: str | None) -> None:
    """The legend and the table; `compile`: how the compiled decoders compiled, where they ran (their table)."""
    log(
        "tokens/s: AR = generate(do_sample=False), PLD = prompt_lookup_num_tokens=10, WeDLM = strategy='wedlm', "
        "LL = lossless, LL-ctx = lossless without context drafts; tok = AR's tokens; tok/fwd = tokens per forward; "
        "acc model/ctx = LL's accepted drafts by source; LL/PLD runs = lowest and highest LL/PLD of the single timed "
        "runs"
    )
    log(format_table(rows))
    if compile is not None:
        log(
            f"compiled: cache_implementation='static' with {compile}: ARc = AR, WeDLMc = WeDLM, LLc = lossless, "
            "compiled; x/y = ratios of tokens/s; LLc/PLD: compiled lossless against eager prompt lookup"
        )
        log(format_compiled_table(rows))


TABLE = (
    Column("family", 11, align="<"),
    Column("tok", 5),
    *(Column(title, 8, ".0f") for title in ("AR", "PLD", "WeDLM", "LL", "LL-ctx")),  # DECODERS' tokens/s
    ratio_column("WeDLM/AR", 9),
    ratio_column("WeDLM/LL", 9),
    ratio_column("LL/AR", 8),
    ratio_column("LL/PLD", 8),
    Column("tok/fwd WeDLM", 14, ".2f"),
    Column("LL", 6, ".2f"),
    Column("LL-ctx", 7, ".2f"),
    Column("acc model/ctx", 15),
    Column("LL/PLD runs", 13),
)
COLUMNS = tuple(column.title for column in TABLE[:9])  # the header's first words, one word each


def format_table(rows: dict) -> str:
    lines = [table_head(TABLE)]
    for family, r in rows.items():
        ll, runs = r["lossless"], r["lossless_vs_prompt_lookup_per_run"]
        values = [family, r["AR"]["tokens"], *(r[name]["tokens_per_s"] for name in DECODERS)]
        values += [r["wedlm_vs_ar"], r["wedlm_vs_lossless"], r["lossless_vs_ar"], r["lossless_vs_prompt_lookup"]]
        values += [r["WeDLM"]["tokens_per_forward"], ll["tokens_per_forward"]]
        values += [r["lossless, no context drafts"]["tokens_per_forward"]]
        values += [f"{ll['accepted_model_drafts']:>9}/{ll['accepted_context_drafts']:<5}"]
        values += [f"{min(runs):.2f}-{max(runs):.2f}"]
        lines.append(table_row(TABLE, values))
    return "\n".join(lines)


COMPILED_TABLE = (
    Column("family", 11, align="<"),
    Column("tok", 5),
    *(Column(title, 8, ".0f") for title in ("ARc", "WeDLMc", "LLc")),  # COMPILED_DECODERS' tokens/s
    *(ratio_column(title, 13) for title in ("WeDLMc/ARc", "WeDLMc/LLc", "LLc/ARc", "LLc/PLD", "ARc/AR")),
    *(ratio_column(title, 13) for title in ("WeDLMc/WeDLM", "LLc/LL")),
    Column("tok/fwd LLc", 13, ".2f"),
)
COMPILED_COLUMNS = tuple(column.title for column in COMPILED_TABLE[:10])
COMPILED_RATIOS = (
    "wedlm_compiled_vs_ar_compiled",
    "wedlm_compiled_vs_lossless_compiled",
    "lossless_compiled_vs_ar_compiled",
    "lossless_compiled_vs_prompt_lookup",
    "ar_compiled_vs_ar",
    "wedlm_compiled_vs_wedlm",
    "lossless_compiled_vs_lossless",
)


def format_compiled_table(rows: dict) -> str:
    lines = [table_head(COMPILED_TABLE)]
    for family, r in rows.items():
        values = [family, r["AR compiled"]["tokens"], *(r[name]["tokens_per_s"] for name in COMPILED_DECODERS)]
        values += [*(r[key] for key in COMPILED_RATIOS), r["lossless compiled"]["tokens_per_forward"]]
        lines.append(table_row(COMPILED_TABLE, values))
    return "\n".join(lines)


def generate_compile_config(backend: str, device_type: str) -> CompileConfig:
    """The compile `generate` makes of a static-cache decoding step: transformers' default (inductor, CUDA graphs)
    for inductor; another backend takes no mode. Off CUDA, transformers compiles only when its config says so."""
    config = CompileConfig() if backend == "inductor" else CompileConfig(backend=backend, mode=None)
    if device_type != "cuda":
        config._compile_all_devices = True  # the switch transformers' own CPU tests use
    return config


def bench_lossless_command(args) -> None:
    """`wedlm-hf bench-lossless`."""
    report = run_lossless_benchmark(
        args.model or default_model_path(),
        prompts_per_family=args.prompts_per_family,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        threads=args.threads,
        compiled=args.compiled,
        device=args.device,
        dtype=args.dtype,
        batch_invariant=args.batch_invariant,
    )
    write_json(args.json, report)
    if report["mismatches"]:
        raise SystemExit(f"{len(report['mismatches'])} output(s) differed from plain AR generate (see the table)")
