"""A no-cache, block-wise WeDLM decoder in the style of the authors' transformers class: the speed baseline.

It appends a block of `block_size` masks, then re-runs the whole sequence (prefix + reordered block) every
iteration, filling masks by the same entropy rule as the streaming decoder until the block is full, and only
then starts the next block. Like the authors' class, it has no KV cache and projects every row through the LM
head, so every iteration recomputes the prefix: this is what the streaming decoder's reused cache saves.
"""

import torch

from ..modeling.window_filling import FillSampler, choose_fills, entropy, suppress_token


@torch.no_grad()
def blockwise_generate(
    model,
    input_ids: torch.Tensor,
    mask_token_id: int,
    max_new_tokens: int,
    block_size: int = 16,
    entropy_threshold: float | None = 0.4,
    pos_penalty_factor: float = 0.02,
    sampler: FillSampler | None = None,
) -> tuple[torch.Tensor, int, int]:
    """Greedy by default, one prompt (1, T) at a time, no stop tokens.

    Returns (sequence, forwards, rows fed): every forward feeds the whole sequence, which is what p_cache counts.
    """
    if input_ids.shape[0] != 1:
        raise ValueError("blockwise_generate decodes one prompt at a time: pass input_ids of shape (1, T).")
    sampler = sampler or FillSampler(do_sample=False)
    sequence = input_ids[0].tolist()
    forwards = rows_fed = 0
    while len(sequence) - input_ids.shape[1] < max_new_tokens:
        start = len(sequence)
        block: list[int | None] = [None] * min(block_size, input_ids.shape[1] + max_new_tokens - start)
        while None in block:
            filled = [(t, start + i) for i, t in enumerate(block) if t is not None]
            masks = [start + i for i, t in enumerate(block) if t is None]
            ids = sequence + [t for t, _ in filled] + [mask_token_id] * len(masks)
            pos = list(range(start)) + [p for _, p in filled] + masks
            logits = model(
                input_ids=torch.tensor([ids], device=model.device),
                position_ids=torch.tensor([pos], device=model.device),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
            ).logits[0, len(ids) - len(masks) :]
            forwards += 1
            rows_fed += len(ids)
            scores = suppress_token(logits, mask_token_id)
            tokens = sampler(scores).tolist()
            slots = [i for i, t in enumerate(block) if t is None]
            for i in choose_fills(entropy(scores).tolist(), masks, entropy_threshold, pos_penalty_factor):
                block[slots[i]] = tokens[i]
        sequence.extend(block)
    return torch.tensor([sequence], device=input_ids.device), forwards, rows_fed
