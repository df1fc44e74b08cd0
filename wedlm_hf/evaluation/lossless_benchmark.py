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
"""

import contextlib
import json
import random
import time

import torch
from transformers import AutoTokenizer, CompileConfig

from ..data import FAMILIES, default_model_path
from .benchmark import compiled_forward, load_bench_model, swapped_forward
from .evaluate import code_snippets, held_out_items

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
    log=print,
) -> dict:
    """`compiled`: also the COMPILED_DECODERS, with torch.compile's `compile_backend` ("eager": the plumbing only).
    `compile_in_generate`: compile them as `generate` does on a GPU (default: on a CUDA `device`), not by swapping
    in a compiled forward."""
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = load_bench_model(model_path, device, "float32")
    families = prompt_families(tokenizer, prompts_per_family, train_items_per_family)
    decoders = {**DECODERS, **(COMPILED_DECODERS if compiled else {})}
    names = list(decoders)
    exact = EXACT + (EXACT_COMPILED if compiled else ())
    if compile_in_generate is None:
        compile_in_generate = model.device.type == "cuda"
    compiled_call = compiled_forward(model, compile_backend) if compiled and not compile_in_generate else None
    if compile_in_generate:
        compiled_args = dict(compile_config=generate_compile_config(compile_backend, model.device.type))
    else:
        compiled_args = dict(disable_compile=True)

    def decode(name: str, ids: list[int], checked: bool = True):
        """The generated tokens and WeDLM stats; timed runs (`checked=False`) make the plain call, which returns
        the token ids alone (a dict output also builds the returned cache, which AR keeps anyway). The ids come
        back to the CPU, which waits for a GPU's work: the timing covers it."""
        x = torch.tensor([ids], device=model.device)
        swap = compiled_call is not None and name in COMPILED_DECODERS
        forward = swapped_forward(model, compiled_call) if swap else contextlib.nullcontext()
        with forward:
            extra = compiled_args if name in COMPILED_DECODERS else {}
            out = model.generate(
                x, max_new_tokens=new_tokens, return_dict_in_generate=checked, **decoders[name], **extra
            )
        if not checked:
            return out[0, len(ids) :].tolist(), None
        stats = getattr(out, "wedlm_stats", None)
        return out.sequences[0, len(ids) :].tolist(), stats[0] if stats else None

    # Checked once, untimed (it also warms every decoder up): outputs that must be AR's, and the WeDLM stats.
    outputs, mismatches = {}, []
    for family, prompts in families.items():
        for p, ids in enumerate(prompts):
            for name in names:
                outputs[family, p, name] = decode(name, ids)
            ar = outputs[family, p, "AR"][0]
            for name in exact:
                got = outputs[family, p, name][0]
                if got != ar:
                    first = next((i for i, (a, b) in enumerate(zip(ar, got)) if a != b), min(len(ar), len(got)))
                    mismatches.append(dict(family=family, prompt=tokenizer.decode(ids), decoder=name, token=first))
                    log(
                        f"!!! MISMATCH: {name} differs from AR generate on {family} prompt {p} "
                        f"({tokenizer.decode(ids)!r}) from generated token {first}"
                    )

    times = {}  # (family, prompt, decoder) -> seconds of each timed run, in run order
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for family, prompts in families.items():
            for p, ids in enumerate(prompts):
                for name in order:
                    start = time.perf_counter()
                    decode(name, ids, checked=False)
                    times.setdefault((family, p, name), []).append(time.perf_counter() - start)
    best = {key: min(seconds) for key, seconds in times.items()}

    rows = {}
    groups = {f: [(f, p) for p in range(len(prompts))] for f, prompts in families.items()}
    groups["all"] = [key for keys in groups.values() for key in keys]
    for family, keys in groups.items():
        row = dict(prompts=len(keys), identical_to_ar={})
        for name in names:
            tokens = sum(len(outputs[f, p, name][0]) for f, p in keys)
            seconds = sum(best[f, p, name] for f, p in keys)
            row[name] = dict(tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds)
            stats = [outputs[f, p, name][1] for f, p in keys]
            if stats[0] is not None:
                forwards = sum(s.forwards for s in stats)
                row[name].update(
                    forwards=forwards,
                    tokens_per_forward=tokens / forwards,
                    accepted_context_drafts=sum(s.accepted_context_drafts for s in stats),
                    rejected_context_drafts=sum(s.rejected_context_drafts for s in stats),
                    accepted_model_drafts=sum(s.accepted_drafts - s.accepted_context_drafts for s in stats),
                    rejected_model_drafts=sum(s.rejected_drafts - s.rejected_context_drafts for s in stats),
                )
        for name in exact:
            wrong = [m for m in mismatches if m["decoder"] == name and family in (m["family"], "all")]
            row["identical_to_ar"][name] = not wrong
        lossless = row["lossless"]["tokens_per_s"]
        row["lossless_vs_ar"] = lossless / row["AR"]["tokens_per_s"]
        row["lossless_vs_prompt_lookup"] = lossless / row["prompt lookup"]["tokens_per_s"]
        # The same ratio within each timed run alone (its prompts' single timings): how far the machine's noise
        # moves it, beside the best-of ratio.
        row["lossless_vs_prompt_lookup_per_run"] = [
            sum(times[f, p, "prompt lookup"][r] for f, p in keys) / sum(times[f, p, "lossless"][r] for f, p in keys)
            for r in range(repeats)
        ]
        if compiled:
            lossless_compiled = row["lossless compiled"]["tokens_per_s"]
            row["lossless_compiled_vs_ar_compiled"] = lossless_compiled / row["AR compiled"]["tokens_per_s"]
            row["lossless_compiled_vs_prompt_lookup"] = lossless_compiled / row["prompt lookup"]["tokens_per_s"]
            row["lossless_compiled_vs_lossless"] = lossless_compiled / lossless
            row["wedlm_compiled_vs_wedlm"] = row["WeDLM compiled"]["tokens_per_s"] / row["WeDLM"]["tokens_per_s"]
            row["ar_compiled_vs_ar"] = row["AR compiled"]["tokens_per_s"] / row["AR"]["tokens_per_s"]
        rows[family] = row

    threads_used = torch.get_num_threads()
    log(
        f"model: {portable_name(model_path)}, {sum(q.numel() for q in model.parameters()) / 1e6:.1f}M parameters, "
        f"{model.device} float32, {threads_used} CPU thread{'s' * (threads_used != 1)}; {prompts_per_family} prompt"
        f"{'s' * (prompts_per_family != 1)} per family, at most {new_tokens} new tokens (stops at eos), best of "
        f"{repeats} interleaved run{'s' * (repeats != 1)}"
    )
    log(
        "tokens/s: AR = generate(do_sample=False), PLD = prompt_lookup_num_tokens=10, WeDLM = strategy='wedlm', "
        "LL = lossless, LL-ctx = lossless without context drafts; tok = AR's tokens; acc model/ctx = LL's accepted "
        "drafts by source; LL/PLD runs = lowest and highest LL/PLD of the single timed runs"
    )
    log(format_table(rows))
    if compiled:
        how = (
            f"generate's own compile ({compiled_args['compile_config']})"
            if compile_in_generate
            else f"torch.compile(model.forward) (backend {compile_backend!r})"
        )
        log(
            f"compiled: cache_implementation='static' with {how}: ARc = AR, WeDLMc = WeDLM, LLc = lossless, "
            "compiled; x/y = ratios of tokens/s; LLc/PLD: compiled lossless against eager prompt lookup"
        )
        log(format_compiled_table(rows))
    failed = sorted({(m["decoder"], m["family"]) for m in mismatches})
    if failed:
        log("!!! NOT identical to AR generate: " + ", ".join(f"{d} on {f}" for d, f in failed))
    else:
        log(f"identical to AR generate on every prompt: {', '.join(exact)}")
    return dict(
        settings=dict(
            prompts_per_family=prompts_per_family,
            new_tokens=new_tokens,
            repeats=repeats,
            threads=threads_used,
            device=str(model.device),
            compiled=compile_backend if compiled else None,
            compiled_in_generate=compiled and compile_in_generate,
        ),
        families=rows,
        mismatches=mismatches,
    )


COLUMNS = ("family", "tok", "AR", "PLD", "WeDLM", "LL", "LL-ctx", "LL/AR", "LL/PLD")
DRAFT_COLUMNS = ("tok/fwd LL", "LL-ctx", "acc model/ctx", "LL/PLD runs")


def format_table(rows: dict) -> str:
    head = f"{COLUMNS[0]:<11}{COLUMNS[1]:>5}" + "".join(f"{c:>8}" for c in COLUMNS[2:])
    lines = [head + "{:>11}{:>7}{:>15}{:>13}".format(*DRAFT_COLUMNS)]
    for family, r in rows.items():
        ll = r["lossless"]
        speeds = "".join(f"{r[n]['tokens_per_s']:>8.0f}" for n in DECODERS)
        ratios = f"{r['lossless_vs_ar']:>7.2f}x{r['lossless_vs_prompt_lookup']:>7.2f}x"
        no_ctx = r["lossless, no context drafts"]["tokens_per_forward"]
        drafts = f"{ll['accepted_model_drafts']:>9}/{ll['accepted_context_drafts']:<5}"
        per_forward = f"{ll['tokens_per_forward']:>11.2f}{no_ctx:>7.2f}"
        runs = r["lossless_vs_prompt_lookup_per_run"]
        spread = f"{min(runs):.2f}-{max(runs):.2f}"
        lines.append(f"{family:<11}{r['AR']['tokens']:>5}{speeds}{ratios}{per_forward}{drafts}{spread:>13}")
    return "\n".join(lines)


COMPILED_COLUMNS = ("family", "tok", "ARc", "WeDLMc", "LLc", "LLc/ARc", "LLc/PLD", "ARc/AR", "WeDLMc/WeDLM", "LLc/LL")


def format_compiled_table(rows: dict) -> str:
    head = f"{COMPILED_COLUMNS[0]:<11}{COMPILED_COLUMNS[1]:>5}" + "".join(f"{c:>8}" for c in COMPILED_COLUMNS[2:5])
    head += "".join(f"{c:>13}" for c in COMPILED_COLUMNS[5:])
    lines = [head + f"{'tok/fwd LLc':>13}"]
    for family, r in rows.items():
        speeds = "".join(f"{r[n]['tokens_per_s']:>8.0f}" for n in COMPILED_DECODERS)
        keys = (
            "lossless_compiled_vs_ar_compiled",
            "lossless_compiled_vs_prompt_lookup",
            "ar_compiled_vs_ar",
            "wedlm_compiled_vs_wedlm",
            "lossless_compiled_vs_lossless",
        )
        ratios = "".join(f"{r[k]:>12.2f}x" for k in keys)
        per_forward = f"{r['lossless compiled']['tokens_per_forward']:>13.2f}"
        lines.append(f"{family:<11}{r['AR compiled']['tokens']:>5}{speeds}{ratios}{per_forward}")
    return "\n".join(lines)


def generate_compile_config(backend: str, device_type: str) -> CompileConfig:
    """The compile `generate` makes of a static-cache decoding step: transformers' default (inductor, CUDA graphs)
    for inductor; another backend takes no mode. Off CUDA, transformers compiles only when its config says so."""
    config = CompileConfig() if backend == "inductor" else CompileConfig(backend=backend, mode=None)
    if device_type != "cuda":
        config._compile_all_devices = True  # the switch transformers' own CPU tests use
    return config


def portable_name(path: str) -> str:
    return "the shipped model" if path == default_model_path() else path


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
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if report["mismatches"]:
        raise SystemExit(f"{len(report['mismatches'])} output(s) differed from plain AR generate (see the table)")
