"""The measurements of scripts/gpu_check.sh (run that script, which prepares the environment first).

(a) flash-attention-2 vs sdpa: the tokens of generate(strategy="wedlm") on the shipped model, batch 1 and 4;
(b) `wedlm-hf bench` on the device in the chosen dtype;
(c) on an 8B-shaped random model (Qwen3-8B sizes), one decoding forward of 2W rows on top of a cached prompt,
    divided by one AR step (1 row): what a WeDLM forward costs in AR steps where the model is large;
(d) on the same model, batch 1 and 16: time per decoding step and tokens/s of `generate` for AR and WeDLM (at forced
    acceptance: every mask filled each step, no eos), each static + compiled (transformers' compile of decoding:
    CUDA graphs on CUDA) and eager (DynamicCache), next to the memory bound (weight bytes / copy bandwidth), with
    the targets PASS/FAIL (`scripts/decode_speed.py`);
(e) `wedlm-hf bench-lossless --device cuda`, eager and then with the compiled decoders (generate's own compile:
    CUDA graphs), on the shipped model in float32 (lossless output must be AR's, token for token).
(f) a sampled WeDLM step's synchronisations (torch's sync debug mode), default and lossless mode, rows with their
    own generators, draws before the read (`scripts/step_syncs.py`): the target is one; and whether samplers processed
    as one batch give each row its own warpers' scores on the device.
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
from pathlib import Path

import torch
from decode_speed import SPEED_PATHS, SPEED_TOKENS, compiled_graphs, decode_speed, speed_settings
from step_profile import step_profile
from step_syncs import sampled_step_syncs

import wedlm_hf
from wedlm_hf import WeDLMConfig, WeDLMForCausalLM, default_model_path
from wedlm_hf.cli import main as wedlm_hf_cli

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
    graphs = compiled_graphs()
    try:
        wedlm_hf_cli(argv)
    finally:
        if compiled and graphs is not None:
            print(f"graphs dynamo compiled in this run: {compiled_graphs() - graphs}", flush=True)


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
    parser.add_argument(
        "--deadline",
        type=float,
        help="seconds after which (d) starts no row, counted from the script's start, and (g), from its own (default "
        "390, dry 300)",
    )
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
            speed = speed_settings(cpu, device, began, args.deadline)
            run_part("(d)", failures, decode_speed, model, (1, 16), **SPEED_TOKENS, **speed)

    if "g" in parts:
        section(f"(g) the step at batch 64: compiled AR and WeDLM, then a profile of WeDLM's eager step, {shape}")
        if _has_model(model, "(g)", failures):
            compiled_paths = tuple(path for path in SPEED_PATHS if path[2])
            speed = speed_settings(cpu, device, time.perf_counter(), args.deadline)
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
