"""The measurements of scripts/gpu_check.sh (run that script, which prepares the environment first).

(a) flash-attention-2 vs sdpa: the tokens of generate(strategy="wedlm") on the shipped model, batch 1 and 4;
(b) `wedlm-hf bench` on the device in the chosen dtype;
(c) on an 8B-shaped random model (Qwen3-8B sizes), one decoding forward of 2W rows on top of a cached prompt,
    divided by one AR step (1 row): what a WeDLM forward costs in AR steps where the model is large.

`--cpu` is the dry run: tiny sizes, CPU, float32, and eager attention standing in for flash-attention-2.
Exits 1 when the two attention implementations give different tokens.
"""

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

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


def forward_cost(device: str, dtype: torch.dtype, sizes: dict, prompt_len: int, window: int, repeats: int) -> None:
    """(c) median time of a 2W-row decoding forward over the median time of a 1-row AR step, same cached prompt."""
    from transformers import DynamicCache

    config = WeDLMConfig(
        **sizes,
        attention_bias=False,
        qk_norm=True,
        max_position_embeddings=prompt_len + 4 * window,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="dry run: tiny sizes, CPU, float32")
    cpu = parser.parse_args().cpu
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

    section("(a) flash-attention-2 vs sdpa, generate(strategy='wedlm'), shipped model")
    equal, compared = True, True
    if cpu:
        print("dry run: eager attention stands in for flash-attention-2")
        equal = attention_equality(device, dtype, "eager", new_tokens=8)
    elif importlib.util.find_spec("flash_attn") is None:
        print("SKIPPED: the flash_attn package is not installed here, so flash-attention-2 cannot be compared.")
        compared = False
    else:
        equal = attention_equality(device, dtype, "flash_attention_2", new_tokens=48)

    section(f"(b) wedlm-hf bench on {device}, {dtype_name(dtype)}")
    bench(device, dtype_name(dtype), small=cpu)

    section("(c) one decoding forward of 2W rows vs one AR step, " + ("tiny model" if cpu else "Qwen3-8B sizes"))
    if cpu:
        forward_cost(device, dtype, TINY, prompt_len=32, window=4, repeats=3)
    else:
        forward_cost(device, dtype, QWEN3_8B, prompt_len=1024, window=16, repeats=20)

    if not compared:
        result = "flash-attention-2 not compared (flash_attn absent); bench and forward cost above"
    else:
        result = "tokens equal" if equal else "TOKENS DIFFER between attention implementations (see (a))"
    print("\nRESULT: " + result)
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
