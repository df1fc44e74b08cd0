"""Runs `generate` on a model in every mode the suite checks under tensor parallelism; imported by
test_tensor_parallel_generate.py for the single process, and run by it under `torchrun` as every rank would be:
`python tp_generate.py OUT.json FOLDER DTYPE [FOLDER DTYPE ...]` (the models one after the other, in one process
group: the ranks start once for all of them)."""

import json
import sys
import warnings

import torch

PROMPTS = ["def fib(n):", "import os\nimport", "The quick brown fox"]
MODES = {
    "ar": {},
    "wedlm": {"strategy": "wedlm"},
    "lossless": {"strategy": "wedlm", "wedlm_lossless": True},
    "sampled": {"strategy": "wedlm", "do_sample": True, "temperature": 1.0, "top_p": 0.9},
    "lossless_sampled": {"strategy": "wedlm", "wedlm_lossless": True, "do_sample": True, "temperature": 1.0},
}


def run_cases(model, tokenizer) -> dict:
    """Each mode's tokens for the batch of PROMPTS (left padded) and for the first prompt alone."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    one = tokenizer(PROMPTS[:1], return_tensors="pt")
    out = {}
    for name, settings in MODES.items():
        for label, inputs in (("batch", batch), ("one", one)):
            torch.manual_seed(0)
            settings = {"do_sample": False, **settings}
            tokens = model.generate(**inputs, max_new_tokens=20, **settings)
            out[f"{name}/{label}"] = tokens.tolist()
    return out


def run_ranked(folder: str, dtype: str) -> dict:
    """One model loaded with `tp_plan="auto"` on this rank: its cases, the warnings our code raised, and what ranks
    seeded apart sample (gathered from every rank)."""
    import torch.distributed as dist
    from transformers import AutoTokenizer
    from transformers.distributed import DistributedConfig

    from wedlm_hf import WeDLMForCausalLM

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = WeDLMForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype), distributed_config=DistributedConfig(tp_plan="auto")
        ).eval()
        results = run_cases(model, AutoTokenizer.from_pretrained(folder))
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "wedlm_hf" in w.filename]
    # ranks seeded apart still draw the same tokens (else they would run different numbers of forwards and hang)
    torch.manual_seed(1000 + dist.get_rank())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    drawn = model.generate(**tokenizer(PROMPTS[:1], return_tensors="pt"), max_new_tokens=20, **MODES["sampled"])
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, drawn.tolist())
    sharded = model.model.layers[0].self_attn.q_proj.weight
    return {
        "results": results,
        "warnings": ours,
        "world": dist.get_world_size(),
        "sharded": type(sharded).__name__,
        "apart": every,
    }


def main(destination: str, *models: str) -> None:
    """Each (FOLDER, DTYPE) pair in turn; rank 0 writes {FOLDER: what `run_ranked` found} to `destination`."""
    import torch.distributed as dist

    found = {folder: run_ranked(folder, dtype) for folder, dtype in zip(models[::2], models[1::2])}
    if dist.get_rank() == 0:
        with open(destination, "w") as f:
            json.dump(found, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
