"""Dual-stream masking (docs/algorithm.md section 4): token sequences in, WeDLM training batches out.

Each row becomes `[x0 ; xt]`: the clean sequence x0 and a prediction stream xt with the same logical positions.
xt is cut into blocks of `block_size`; each block draws one masking ratio gamma ~ U(0, 1], masks
round(gamma * maskable) of its non-prompt tokens chosen uniformly, and is reordered observed-first / masks-last,
keeping logical positions. Attention: x0 is causal; an xt block sees the x0 tokens of earlier blocks and its own
reordered block causally, nothing else. The batch feeds `WeDLMForCausalLM.forward` (and so `Trainer`) directly.
"""

from dataclasses import dataclass

import torch

MIN_GAMMA = 1e-3  # keeps 1/gamma finite


@dataclass
class DualStreamCollator:
    """Batches token sequences for WeDLM training: each row becomes `[x0 ; xt]`, a clean and a masked stream.

    Features: `{"input_ids": [...], "prompt_mask": [...] (optional, 1 = prompt, never masked)}`; the masking, the
    attention and the loss are docs/algorithm.md section 4.

    Output keys: input_ids, position_ids (B, 2L); attention_mask (B, 1, 2L, 2L) bool, True = may attend;
    labels (B, 2L), already aligned (x0 rows: the next token, xt rows: the original token at masked rows);
    label_weights (B, 2L): 1/gamma of the block at masked rows, 0 elsewhere.

    Randomness: with `seed` set and a `sample_index` in the feature, each sample's masking depends only on
    (seed, epoch, sample_index), so it is the same whatever the batching, process count or resume point.
    Otherwise it comes from `generator`, or torch's global RNG.
    """

    mask_token_id: int
    pad_token_id: int
    block_size: int = 32
    seed: int | None = None
    generator: torch.Generator | None = None
    epoch: int = 0  # advanced by the training loop so each epoch masks differently

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}.")

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if not features:
            raise ValueError("DualStreamCollator got an empty batch.")
        width = max(len(f["input_ids"]) for f in features)
        if width < 2:
            raise ValueError("Dual-stream training needs sequences of at least 2 tokens.")
        rows = [self._row(f, width) for f in features]
        batch = {key: torch.stack([r[key] for r in rows]) for key in rows[0]}
        batch["attention_mask"] = batch["attention_mask"][:, None]
        return batch

    def _generator_for(self, feature: dict) -> torch.Generator | None:
        if self.seed is None or "sample_index" not in feature:
            return self.generator
        mixed = ((self.seed * 1_000_003 + self.epoch) * 1_000_033 + int(feature["sample_index"])) % (2**63 - 1)
        return torch.Generator().manual_seed(mixed)

    def _row(self, feature: dict, width: int) -> dict[str, torch.Tensor]:
        generator = self._generator_for(feature)
        ids = torch.as_tensor(feature["input_ids"], dtype=torch.long)
        n = ids.numel()
        prompt = torch.zeros(width, dtype=torch.bool)
        if feature.get("prompt_mask") is not None:
            prompt[:n] = torch.as_tensor(feature["prompt_mask"], dtype=torch.bool)
        tokens = torch.full((width,), self.pad_token_id, dtype=torch.long)
        tokens[:n] = ids
        real = torch.arange(width) < n

        # Clean stream: next-token targets, never a prompt token (as in SFT, the prompt is given, not learned).
        ar_labels = torch.full((width,), -100, dtype=torch.long)
        ar_labels[: n - 1] = torch.where(prompt[1:n], -100, tokens[1:n])

        # Prediction stream: per block, mask a random share of the maskable tokens, then reorder.
        order, masked, weights = [], [], []
        for start in range(0, width, self.block_size):
            block = torch.arange(start, min(start + self.block_size, width))
            maskable = block[real[block] & ~prompt[block]]
            gamma = max(float(torch.rand((), generator=generator)), MIN_GAMMA)
            count = round(gamma * maskable.numel())
            chosen = maskable[torch.randperm(maskable.numel(), generator=generator)[:count]]
            is_masked = torch.zeros(width, dtype=torch.bool)
            is_masked[chosen] = True
            observed = block[real[block] & ~is_masked[block]]
            masks = block[is_masked[block]]
            padding = block[~real[block]]
            order.append(torch.cat([observed, masks, padding]))
            masked.append(
                torch.cat(
                    [
                        torch.zeros(observed.numel(), dtype=torch.bool),
                        torch.ones(masks.numel(), dtype=torch.bool),
                        torch.zeros(padding.numel(), dtype=torch.bool),
                    ]
                )
            )
            weights.append(torch.full((block.numel(),), 1.0 / gamma))
        order, masked, weights = torch.cat(order), torch.cat(masked), torch.cat(weights)
        xt_tokens = torch.where(masked, self.mask_token_id, tokens[order])
        xt_labels = torch.where(masked, tokens[order], -100)

        positions = torch.arange(width)
        return {
            "input_ids": torch.cat([tokens, xt_tokens]),
            "position_ids": torch.cat([positions, order]),
            "attention_mask": dual_stream_attention(width, self.block_size, real, real[order]),
            "labels": torch.cat([ar_labels, xt_labels]),
            "label_weights": torch.cat([torch.zeros(width), torch.where(masked, weights, 0.0)]),
        }


def dual_stream_attention(width: int, block_size: int, x0_real: torch.Tensor, xt_real: torch.Tensor) -> torch.Tensor:
    """The (2L, 2L) boolean mask of one row; padding keys are hidden and a padding query sees only itself."""
    index = torch.arange(2 * width)
    in_xt = index >= width
    # x0 rows carry their logical position; xt rows their physical place, and both know their block.
    block = torch.where(in_xt, index - width, index) // block_size
    q, k = index[:, None], index[None, :]
    q_xt, k_xt = in_xt[:, None], in_xt[None, :]
    q_block, k_block = block[:, None], block[None, :]
    clean_causal = ~q_xt & ~k_xt & (k <= q)
    earlier_clean = q_xt & ~k_xt & (k_block < q_block)
    own_block = q_xt & k_xt & (k_block == q_block) & (k <= q)
    real = torch.cat([x0_real, xt_real])
    return ((clean_causal | earlier_clean | own_block) & real[None, :]) | (q == k)
