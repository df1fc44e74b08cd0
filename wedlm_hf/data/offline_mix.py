"""The offline training mix of the shipped model: stdlib code chunks and windows of low-entropy task items.

Code: each training-split stdlib file is tokenized and cut into `seq_len` chunks. Tasks: whole items
(prompt + answer + eos) are packed into windows that start with an item at position 0, as at inference time;
prompt tokens are flagged (`prompt_mask`) so they are neither masked nor learned. Each answer is followed by
`EOS_TAIL` more eos tokens, learned like the answer: at inference the window reaches past the end of the answer,
and a model that knows "after eos comes eos" fills those slots at once instead of spending forwards on them.
"""

import random

from .stdlib_corpus import stdlib_texts
from .synthetic_tasks import FAMILIES, task_items

TRAIN_TASK_SEED = 0
EVAL_TASK_SEED = 1
EOS_TAIL = 16


def task_windows(tokenizer, seq_len: int, items_per_family: int, seed: int = TRAIN_TASK_SEED) -> list[dict]:
    rng = random.Random(seed)
    items = [item for family in FAMILIES for item in task_items(family, items_per_family, seed)]
    rng.shuffle(items)
    windows, ids, prompt = [], [], []
    for question, answer in items:
        q = tokenizer(question, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] * (1 + EOS_TAIL)
        if len(q) + len(a) > seq_len:
            continue
        if len(ids) + len(q) + len(a) > seq_len:
            windows.append({"input_ids": ids, "prompt_mask": prompt})
            ids, prompt = [], []
        ids = ids + q + a
        prompt = prompt + [1] * len(q) + [0] * len(a)
    if ids:
        windows.append({"input_ids": ids, "prompt_mask": prompt})
    return windows


def code_chunks(tokenizer, seq_len: int, split: str = "train") -> list[dict]:
    chunks = []
    for text in stdlib_texts(split):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        chunks.extend({"input_ids": ids[i : i + seq_len]} for i in range(0, len(ids) - 1, seq_len))
    return [c for c in chunks if len(c["input_ids"]) >= 2]


def offline_mix(tokenizer, seq_len: int, items_per_family: int, seed: int = TRAIN_TASK_SEED) -> list[dict]:
    """Code chunks plus task windows, shuffled with `seed`."""
    samples = code_chunks(tokenizer, seq_len) + task_windows(tokenizer, seq_len, items_per_family, seed)
    random.Random(seed).shuffle(samples)
    return samples


def tokenizer_corpus(items_per_family: int = 2000) -> list[str]:
    """The texts the shipped tokenizer is trained on: the training code plus rendered task items."""
    tasks = [q + a for family in FAMILIES for q, a in task_items(family, items_per_family, TRAIN_TASK_SEED)]
    return stdlib_texts("train") + tasks
