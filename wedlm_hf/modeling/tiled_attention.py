"""Attention whose result for a query depends only on the keys it attends to (docs/algorithm.md section 7).

sdpa's CPU kernel cuts queries and keys into blocks whose sizes follow the lengths, and sums a query's keys block by
block; in a batch a row's keys sit behind other rows' padding and among its own holes (scratch columns, the window's
padding), so the same keys round differently alone and batched (2e-3 apart in bfloat16). Here, per batch row:

1. the columns any of its queries attends are gathered, in order, to the front (`key_layout`), so a key's place
   depends only on how many attended keys come before it; the row is padded to a multiple of KEY_BLOCK with
   columns that no query attends, which weigh exactly 0;
2. scores, softmax and the weighted sum run in float32 (a bfloat16 or float16 product is exact there, and the output
   is rounded once to the model's dtype); the score product reduces over the head size only, and the softmax's
   maximum is exact in any order;
3. the weighted values and the weights' sum are formed per block of KEY_BLOCK keys, every block a product of one
   shape, and the blocks are added left to right: blocks past a row's last key add exact zeros.

Every product has at least MIN_ROWS rows (a key head's queries of all its query heads together), as every product
under the switch does (`invariant_matmul`); that the two products give a row the same bits at every row count and
key length is probed once per head size (`probe_attention_products`).
"""

import threading

import torch

from .invariant_matmul import MIN_ROWS, PROBE_ROW_COUNTS

KEY_BLOCK = 64
_ROW_COUNTS = [rows for rows in PROBE_ROW_COUNTS if rows >= MIN_ROWS]  # the products here always have as many
_PROBED: set[tuple] = set()
_LAST_LAYOUT = threading.local()  # the layers of one forward share their mask: its layout is worked out once


def tiled_attention(module, query, key, value, attention_mask, scaling=None, is_causal=None) -> torch.Tensor:
    """Attention of `query` (batch, heads, q_len, head_dim) over `key` / `value` (batch, key heads, k_len,
    head_dim) under transformers' sdpa conventions (a boolean mask, True = attend; or no mask: causal from the
    top-left corner when `is_causal` and q_len > 1, else every key). Returns (batch, q_len, heads, head_dim)."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    keys, values, allowed = _canonical_keys(key, value, attention_mask, q_len, causal)
    length = keys.shape[2]
    rows = group * q_len
    q = padded_rows(query.float().reshape(batch * kv_heads, rows, head_dim))
    scores = torch.bmm(q, keys.view(batch * kv_heads, length, head_dim).transpose(1, 2))
    scores = scores * (head_dim**-0.5 if scaling is None else scaling)
    allowed = allowed.expand(batch, -1, q_len, length)
    if allowed.shape[1] == 1:
        allowed = allowed.expand(batch, heads, q_len, length)
    allowed = padded_rows(allowed.reshape(batch * kv_heads, rows, length))
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    weights = torch.exp(scores - top.masked_fill(top == float("-inf"), 0.0))  # a row with no key: all 0
    out = _blockwise_sum(weights, values.view(batch * kv_heads, length, head_dim))
    out = out[:, :rows].reshape(batch, heads, q_len, head_dim)
    return out.to(query.dtype).transpose(1, 2)


def padded_rows(x: torch.Tensor) -> torch.Tensor:
    """(n, rows, ...) with rows appended (zeros, False) up to MIN_ROWS."""
    if x.shape[1] >= MIN_ROWS:
        return x
    return torch.cat([x, x.new_zeros((x.shape[0], MIN_ROWS - x.shape[1], *x.shape[2:]))], dim=1)


def _blockwise_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """sum_j weights[..., j] * values[j] / sum_j weights[..., j], each block of KEY_BLOCK keys one product of a fixed
    shape, the blocks added left to right."""
    n, rows, length = weights.shape
    blocks = length // KEY_BLOCK
    tiles = weights.view(n, rows, blocks, KEY_BLOCK)
    sums = tiles.sum(-1)  # (n, rows, blocks): a reduction over KEY_BLOCK values, whatever n and rows are
    parts = torch.bmm(
        tiles.transpose(1, 2).reshape(n * blocks, rows, KEY_BLOCK),
        values.view(n * blocks, KEY_BLOCK, values.shape[-1]),
    ).view(n, blocks, rows, values.shape[-1])
    total, norm = parts[:, 0], sums[..., 0]
    for block in range(1, blocks):
        total = total + parts[:, block]
        norm = norm + sums[..., block]
    return total / norm.masked_fill(norm == 0, 1.0).unsqueeze(-1)


def allowed_keys(attention_mask, q_len: int, k_len: int, causal: bool, device) -> torch.Tensor:
    """(batch or 1, heads or 1, q_len or 1, k_len) bool: which keys each query attends."""
    if attention_mask is None:
        if causal and q_len > 1:  # sdpa's is_causal: query i attends keys 0..i
            return torch.ones((q_len, k_len), dtype=torch.bool, device=device).tril_()[None, None]
        return torch.ones((1, 1, 1, k_len), dtype=torch.bool, device=device)
    mask = attention_mask[..., :k_len]
    if mask.dtype == torch.bool:
        return mask
    blocked = mask <= torch.finfo(mask.dtype).min / 2
    if not bool((blocked | (mask == 0)).all()):
        raise ValueError(
            "batch_invariant(): this attention mask adds biases to the scores (values other than 0 and the "
            "dtype's minimum); only masks that allow or block a key are covered: leave the switch off."
        )
    return ~blocked


def _canonical_keys(key, value, attention_mask, q_len: int, causal: bool):
    """Each row's attended keys and values gathered to the front in float32, padded with zeros to a multiple of
    KEY_BLOCK; and the mask over them. Without a mask the keys are in place already."""
    batch, kv_heads, k_len, head_dim = key.shape
    if attention_mask is None:
        allowed = allowed_keys(None, q_len, k_len, causal, key.device)
        extra = -k_len % KEY_BLOCK
        if not extra:
            return key.float().contiguous(), value.float().contiguous(), allowed
        pad = (0, 0, 0, extra)
        allowed = torch.nn.functional.pad(allowed, (0, extra))
        return torch.nn.functional.pad(key.float(), pad), torch.nn.functional.pad(value.float(), pad), allowed
    order, allowed = key_layout(attention_mask, batch, q_len, k_len, causal)
    length = order.shape[1]
    flat = order[:, None, :] + k_len * torch.arange(batch * kv_heads, device=key.device).view(batch, kv_heads, 1)
    flat = flat.reshape(-1)

    def gathered(states):
        return states.reshape(batch * kv_heads * k_len, head_dim).index_select(0, flat).float()

    shape = (batch, kv_heads, length, head_dim)
    return gathered(key).view(shape), gathered(value).view(shape), allowed


def key_layout(attention_mask, batch: int, q_len: int, k_len: int, causal: bool):
    """(order, allowed): per row, the columns any of its queries attends, in order, then repeats of its first one up
    to a multiple of KEY_BLOCK (batch, length); and the mask over those columns (batch, heads or 1, q_len, length).
    Worked out once for the layers of a forward, which pass the same mask."""
    last = getattr(_LAST_LAYOUT, "value", None)
    facts = (attention_mask._version, batch, q_len, k_len, causal)
    if last is not None and last[0] is attention_mask and last[1] == facts:
        return last[2]
    allowed = allowed_keys(attention_mask, q_len, k_len, causal, attention_mask.device)
    attended = allowed.any(dim=-2).any(dim=1).expand(batch, k_len)
    counts = attended.sum(-1)
    longest = int(counts.max())
    length = max(KEY_BLOCK, -(-longest // KEY_BLOCK) * KEY_BLOCK)
    order = torch.sort((~attended).to(torch.int8), dim=-1, stable=True).indices[:, :longest]
    order = torch.cat([order, order[:, :1].expand(batch, length - longest)], dim=1)
    inside = torch.arange(length, device=order.device) < counts[:, None]
    allowed = allowed.expand(batch, -1, -1, k_len)
    allowed = allowed.gather(-1, order[:, None, None, :].expand(*allowed.shape[:3], length)) & inside[:, None, None]
    _LAST_LAYOUT.value = (attention_mask, facts, (order, allowed))
    return order, allowed


def probe_attention_products(head_dim: int, device) -> None:
    """Checks once per head size (and thread count) that the two products of `tiled_attention` give a row the same
    bits at every row count (and, for the scores, every key length); raises a ValueError naming them otherwise."""
    key = (device.type, head_dim, torch.get_num_threads())
    if key in _PROBED:
        return
    generator = torch.Generator(device=device).manual_seed(0)
    most = max(PROBE_ROW_COUNTS)
    queries = torch.randn((1, most, head_dim), generator=generator, device=device)
    keys = torch.randn((1, head_dim, 16 * KEY_BLOCK), generator=generator, device=device)
    weights = torch.rand((1, most, KEY_BLOCK), generator=generator, device=device)
    values = torch.randn((1, KEY_BLOCK, head_dim), generator=generator, device=device)
    reference = torch.bmm(queries[:, :MIN_ROWS], keys[:, :, :KEY_BLOCK])
    scores_agree = all(
        torch.equal(torch.bmm(queries[:, :rows], keys[:, :, :length])[:, :MIN_ROWS, :KEY_BLOCK], reference)
        for rows in _ROW_COUNTS
        for length in (KEY_BLOCK, 2 * KEY_BLOCK, 5 * KEY_BLOCK, 16 * KEY_BLOCK)
    )
    reference = torch.bmm(weights[:, :MIN_ROWS], values)
    sums_agree = all(torch.equal(torch.bmm(weights[:, :rows], values)[:, :MIN_ROWS], reference) for rows in _ROW_COUNTS)
    if not (scores_agree and sums_agree):
        raise ValueError(
            f"batch_invariant(): float32 attention products of head size {head_dim} round a row differently with "
            f"the number of rows on this {device.type} (torch {torch.__version__}, {torch.get_num_threads()} "
            "threads), so attention cannot be made batch-invariant here: leave the switch off."
        )
    _PROBED.add(key)
