"""The Python API on the shipped checkpoint: WeDLM decoding next to plain AR generate, batched, with stats.

Run: .venv/bin/python examples/quickstart.py
"""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer

import wedlm_hf  # registers model_type "wedlm" with the Auto classes

path = wedlm_hf.default_model_path()
tokenizer = AutoTokenizer.from_pretrained(path)  # left padding for batches
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

# One prompt, streamed as tokens commit.
inputs = tokenizer("count from 3 by 1, 12 numbers:", return_tensors="pt")
out = model.generate(
    **inputs,
    strategy="wedlm",
    max_new_tokens=48,
    streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True),
    return_dict_in_generate=True,
)
print(out.wedlm_stats[0])

# A batch of left-padded prompts; each row advances at its own pace and stops at end-of-text.
prompts = ["copy: river piano candle =>", "reverse([4, 8, 15, 16]) =", "def fibonacci(n):"]
batch = tokenizer(prompts, return_tensors="pt", padding=True)
out = model.generate(
    **batch,
    strategy="wedlm",
    max_new_tokens=40,
    wedlm_window_size=16,
    wedlm_entropy_threshold=0.4,
    wedlm_pos_penalty_factor=0.02,
    return_dict_in_generate=True,
)
for prompt, seq, stats in zip(prompts, out.sequences, out.wedlm_stats):
    text = tokenizer.decode(seq[batch.input_ids.shape[1] :], skip_special_tokens=True)
    print(f"{prompt!r} -> {text!r}  ({stats.tokens_per_forward:.2f} tokens/forward)")

# Plain generate() is ordinary autoregressive decoding.
print(tokenizer.decode(model.generate(**inputs, max_new_tokens=24, do_sample=False)[0], skip_special_tokens=True))
