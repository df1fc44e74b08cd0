"""The measurements of scripts/gpu_check.sh (run that script, which prepares the environment first).

(a) flash-attention-2 vs sdpa: the tokens of generate(strategy="wedlm") on the shipped model, batch 1 and 4;
(b) `wedlm-hf bench` on the device in the chosen dtype;
(c) on an 8B-shaped random model (Qwen3-8B sizes), one decoding forward of 2W rows on top of a cached prompt,
    divided by one AR step (1 row): what a WeDLM forward costs in AR steps where the model is large;
(d) on the same model, batch 1 and 16: time per decoding step and tokens/s of `generate` for AR and WeDLM (at forced
    acceptance: every mask filled each step, no eos), each static + compiled (transformers' compile of decoding:
    CUDA graphs on CUDA) and eager (DynamicCache), next to the memory bound (weight bytes / copy bandwidth), with
    the targets PASS/FAIL;
(e) `wedlm-hf bench-lossless --device cuda`, eager and then with the compiled decoders (generate's own compile:
    CUDA graphs), on the shipped model in float32 (lossless output must be AR's, token for token).
(f) a sampled WeDLM step's synchronisations (torch's sync debug mode), default and lossless mode, rows with their
    own generators, draws before the read (`scripts/step_syncs.py`): the target is one.
(g) the step at serving scale, on the 8B-shaped model at batch 64: AR and WeDLM static + compiled as in (d), then a
    torch.profiler summary of WeDLM's eager decoding (`scripts/step_profile.py`): wall time against the device's
    busy time per step, and the operators that take the most device and host time.
`--parts` picks parts (default abcdf; e takes about as long as the others together; g only when asked).

`--cpu` is the dry run: tiny sizes, CPU, float32, eager attention standing in for flash-attention-2, and dynamo's
"eager" backend standing in for inductor + CUDA graphs.
A part that raises prints `PART (x) FAILED: <error>` (traceback on stderr) and the next part runs.
Exits 1 when the two attention implementations give different tokens or a part failed.
"""

import argparse
import importlib.util
import statistics
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import torch
from step_profile import step_profile
from step_syncs import sampled_step_syncs

import wedlm_hf
from wedlm_hf import WeDLMConfig, WeDLMForCausalLM, default_model_path
from wedlm_hf.cli import main as wedlm_hf_cli
from wedlm_hf.evaluation.lossless_benchmark import generate_compile_config

PROMPTS = [
    "count from 100 by 5, 24 numbers:",
    "copy: river piano candle =>",
    "reverse([4, 8, 15, 16]) =",
    "def fibonacci(n):",
]
QWEN3_8B = dict(
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def attention_equality(device: str, dtype: torch.dtype, other: str, new_tokens: int) -> bool:
    """(a) Tokens of `other` attention vs sdpa, batch 1 (each prompt alone) and batch 4; True when all equal."""
    from transformers import AutoTokenizer

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    outputs = {}
    for attn in ("sdpa", other):
        model = WeDLMForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn).to(device).eval()
        args = dict(strategy="wedlm", max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        singles = [model.generate(**tokenizer(p, return_tensors="pt").to(device), **args)[0].tolist() for p in PROMPTS]
        batch = tokenizer(PROMPTS, return_tensors="pt", padding=True).to(device)
        outputs[attn] = (singles, model.generate(**batch, **args).tolist())
    equal = True
    for name, index in (("batch 1", 0), ("batch 4", 1)):
        ours, theirs = outputs["sdpa"][index], outputs[other][index]
        same = [a == b for a, b in zip(ours, theirs)]
        print(f"{other} vs sdpa, {name}: {sum(same)}/{len(same)} prompts give identical tokens")
        for prompt, a, b, ok in zip(PROMPTS, ours, theirs, same):
            if not ok:
                first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
                print(f"  differs on {prompt!r} from column {first}: sdpa {a[first:][:8]} vs {b[first:][:8]}")
        equal &= all(same)
    return equal


def bench(device: str, dtype: str, small: bool) -> None:
    """(b) the real `wedlm-hf bench` command, in this process."""
    argv = ["bench", "--device", device, "--dtype", dtype]
    if small:
        argv += ["--new-tokens", "8", "--long-tokens", "16", "--batch", "2", "--repeats", "1", "--threads", "1"]
        argv += ["--no-compile"]  # a CPU dry run: compiling would take minutes
    print("wedlm-hf " + " ".join(argv), flush=True)
    wedlm_hf_cli(argv)


def bench_lossless(device: str, small: bool, compiled: bool, json_dir: str | None) -> None:
    """(e) the real `wedlm-hf bench-lossless` command, in this process."""
    argv = ["bench-lossless", "--device", device, "--threads", "2"]
    argv += ["--prompts-per-family", "1", "--new-tokens", "8", "--repeats", "1"] if small else ["--repeats", "3"]
    if compiled:
        argv += ["--compiled"]
    if json_dir:
        argv += ["--json", str(Path(json_dir) / f"bench_lossless{'_compiled' * compiled}.json")]
    print("wedlm-hf " + " ".join(argv), flush=True)
    graphs = _compiled_graphs()
    try:
        wedlm_hf_cli(argv)
    finally:
        if compiled and graphs is not None:
            print(f"graphs dynamo compiled in this run: {_compiled_graphs() - graphs}", flush=True)


def random_model(device: str, dtype: torch.dtype, sizes: dict) -> WeDLMForCausalLM:
    """The random model of (c) and (d), built once (8B sizes: 16 GB in bf16), sdpa attention."""
    config = WeDLMConfig(
        **sizes,
        attention_bias=False,
        qk_norm=True,
        max_position_embeddings=4096,
        mask_token_id=sizes["vocab_size"] - 1,
        tie_word_embeddings=False,
    )
    start = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = WeDLMForCausalLM._from_config(config, dtype=dtype, attn_implementation="sdpa").eval()
    params = sum(p.numel() for p in model.parameters())
    size = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.2f}M"
    print(f"random model: {size} parameters, {dtype_name(dtype)}, built in {time.perf_counter() - start:.1f}s")
    return model


def forward_cost(model: WeDLMForCausalLM, prompt_len: int, window: int, repeats: int) -> None:
    """(c) median time of a 2W-row decoding forward over the median time of a 1-row AR step, same cached prompt."""
    from transformers import DynamicCache

    config, device = model.config, model.device.type
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, config.vocab_size - 1, (1, prompt_len), generator=g).to(device)
    cache = DynamicCache(config=config)
    with torch.inference_mode():
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)

    def sync() -> None:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    def step(rows: int, logits: int) -> float:
        """One forward of `rows` new rows on top of the prompt's cache, which is cropped back afterwards."""
        ids = torch.randint(0, config.vocab_size - 1, (1, rows), generator=g).to(device)
        positions = torch.arange(prompt_len, prompt_len + rows, device=device)[None]
        sync()
        begin = time.perf_counter()
        model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=logits)
        sync()
        elapsed = time.perf_counter() - begin
        cache.crop(-rows)  # back to the prompt alone
        return elapsed

    with torch.inference_mode():
        for _ in range(3):  # warm-up: kernels chosen, allocator settled
            step(1, 1)
            step(2 * window, window)
        ar = statistics.median(step(1, 1) for _ in range(repeats))
        wedlm = statistics.median(step(2 * window, window) for _ in range(repeats))
    print(
        f"cached prompt {prompt_len} tokens, W={window}, median of {repeats}: AR step (1 row) {ar * 1e3:.2f} ms, "
        f"decoding forward (2W = {2 * window} rows, logits for W) {wedlm * 1e3:.2f} ms"
    )
    print(f"decoding forward / AR step: {wedlm / ar:.2f}x")


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


def _compiled_graphs() -> int | None:
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

    start, graphs = time.perf_counter(), _compiled_graphs()
    steps = [forwards(tokens) for tokens in new_tokens]  # long first: a static cache keeps its length for the short
    warm, made = time.perf_counter() - start, _compiled_graphs()
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
                print(f"{label}: FAILED: {_one_line(error)}", flush=True)
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


def _speed_settings(cpu: bool, device: str, start: float, deadline: float | None) -> dict:
    """(d)'s and (g)'s settings for `decode_speed`: the dry run's (dynamo only, no inductor: cheap; transformers
    compiles off CUDA only when told to), or transformers' default compile of a static cache on CUDA; rows start
    until `deadline` seconds after `start` (by default 390, from when a started compiled 8B row, about a minute,
    still ends by 8 minutes; the dry run's 300)."""
    if cpu:
        speed = dict(prompt_len=32, compile_config=generate_compile_config("eager", device), repeats=1)
        return speed | dict(copy_bytes=64 * 2**20, deadline=start + (300 if deadline is None else deadline))
    speed = dict(prompt_len=256, compile_config=None, repeats=3, copy_bytes=4 * 2**30)
    return speed | dict(deadline=start + (390 if deadline is None else deadline))


def _has_model(model, part: str, failures: list[str]) -> bool:
    """Whether (c)'s model was built; where not, `part` fails with a line saying so."""
    if model is None:
        print(f"PART {part} FAILED: no model (see (c))")
        failures.append(part)
    return model is not None


def _one_line(error: BaseException) -> str:
    """The traceback's last line (the error and its message) on one line."""
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    return " | ".join(line.strip() for line in text.splitlines())[:600]


def run_part(name: str, failures: list[str], fn, *args, **kwargs):
    """Runs one part; an error prints `PART (x) FAILED: ...` (traceback on stderr) instead of stopping the script."""
    start = time.perf_counter()
    result = None
    try:
        result = fn(*args, **kwargs)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the other parts still run
        traceback.print_exc()
        print(f"PART {name} FAILED: {_one_line(error)}", flush=True)
        failures.append(name)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"(part {name}: {time.perf_counter() - start:.1f}s)", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="dry run: tiny sizes, CPU, float32")
    parser.add_argument("--parts", default="abcdf", help="the parts to run, e.g. abcdf, e or g (default: abcdf)")
    parser.add_argument("--json-dir", default=None, help="(e) writes its measurements here as JSON (default: none)")
    parser.add_argument("--deadline", type=float, help="seconds after which (d) starts no row (default 390, dry 300)")
    args = parser.parse_args()
    cpu, parts = args.cpu, set(args.parts)
    if not parts or not parts <= set("abcdefg"):
        parser.error(f"--parts {args.parts}: give letters among a to g, e.g. --parts abcdf")
    device, dtype = ("cpu", torch.float32) if cpu else ("cuda", torch.bfloat16)
    if not cpu and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device; run with --cpu for the dry run.", file=sys.stderr)
        return 2
    import transformers

    where = "CPU dry run" if cpu else torch.cuda.get_device_name()
    print(
        f"gpu_check on {where}: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"wedlm_hf from {Path(wedlm_hf.__file__).parent}"
    )

    began = time.perf_counter()
    failures: list[str] = []
    equal, compared = True, "a" in parts
    if "a" in parts:
        section("(a) flash-attention-2 vs sdpa, generate(strategy='wedlm'), shipped model")
        if cpu:
            print("dry run: eager attention stands in for flash-attention-2")
            equal = run_part("(a)", failures, attention_equality, device, dtype, "eager", new_tokens=8)
        elif importlib.util.find_spec("flash_attn") is None:
            print("SKIPPED: the flash_attn package is not installed here, so flash-attention-2 cannot be compared.")
            compared = False
        else:
            equal = run_part("(a)", failures, attention_equality, device, dtype, "flash_attention_2", new_tokens=48)

    if "b" in parts:
        section(f"(b) wedlm-hf bench on {device}, {dtype_name(dtype)}")
        run_part("(b)", failures, bench, device, dtype_name(dtype), small=cpu)

    shape = "tiny model" if cpu else "Qwen3-8B sizes"
    model = None
    if "c" in parts:
        section(f"(c) one decoding forward of 2W rows vs one AR step, {shape}")
    if parts & {"c", "d", "g"}:
        model = run_part("(c) model", failures, random_model, device, dtype, TINY if cpu else QWEN3_8B)
    if "c" in parts:
        if model is None:
            print("PART (c) FAILED: no model (see above)")
        elif cpu:
            run_part("(c)", failures, forward_cost, model, prompt_len=32, window=4, repeats=3)
        else:
            run_part("(c)", failures, forward_cost, model, prompt_len=1024, window=16, repeats=20)

    if "d" in parts:
        section(f"(d) decoding steps and tokens/s of generate, AR and WeDLM, static+compiled and eager, {shape}")
        if _has_model(model, "(d)", failures):
            speed = _speed_settings(cpu, device, began, args.deadline)
            run_part("(d)", failures, decode_speed, model, (1, 16), **SPEED_TOKENS, **speed)

    if "g" in parts:
        section(f"(g) the step at batch 64: compiled AR and WeDLM, then a profile of WeDLM's eager step, {shape}")
        if _has_model(model, "(g)", failures):
            compiled_paths = tuple(path for path in SPEED_PATHS if path[2])
            speed = _speed_settings(cpu, device, time.perf_counter(), args.deadline)
            run_part("(g) speed", failures, decode_speed, model, (64,), **SPEED_TOKENS, **speed, paths=compiled_paths)
            run_part("(g) profile", failures, step_profile, model, 64, speed["prompt_len"])
    del model

    if "f" in parts:
        section(f"(f) synchronisations of a sampled WeDLM step, draws before the read, {device}")
        run_part("(f)", failures, sampled_step_syncs, device, dtype)

    if "e" in parts:
        section(f"(e) wedlm-hf bench-lossless on {device}, float32, the shipped model: eager, then compiled")
        run_part("(e) eager", failures, bench_lossless, device, cpu, compiled=False, json_dir=args.json_dir)
        if cpu:
            print("dry run: the compiled decoders are left out (inductor would take minutes here)")
        else:
            run_part("(e) compiled", failures, bench_lossless, device, cpu, compiled=True, json_dir=args.json_dir)

    if "(a)" in failures:
        result = "attention implementations NOT COMPARED: (a) failed"
    elif "a" not in parts:
        result = "parts " + ", ".join(sorted(parts)) + " measured (above)"
    elif not compared:
        result = "flash-attention-2 not compared (flash_attn absent); bench, forward cost and decoding speed above"
    else:
        result = "tokens equal" if equal else "TOKENS DIFFER between attention implementations (see (a))"
    if failures:
        result += f"; PARTS FAILED: {', '.join(failures)} (see the PART lines above)"
    print(f"\n(gpu_check: {time.perf_counter() - began:.1f}s in all)")
    print("RESULT: " + result)
    return 0 if equal and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
