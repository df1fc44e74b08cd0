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

from .invariant_matmul import MAX_ROWS, MIN_ROWS, PROBE_ROW_COUNTS

KEY_BLOCK = 64
MAX_KEYS = 1024  # the most keys of a score product: more run in blocks of columns
_ROW_COUNTS = [rows for rows in PROBE_ROW_COUNTS if MIN_ROWS <= rows <= MAX_ROWS]  # the row counts of a call here
_KEY_COUNTS = (KEY_BLOCK, 5 * KEY_BLOCK, MAX_KEYS)  # the score products' key counts the probe measures
_PROBED: set[tuple] = set()
_LAST_LAYOUT = threading.local()  # the layers of one forward share their mask: its layout is worked out once


def tiled_attention(module, query, key, value, attention_mask, scaling=None, is_causal=None) -> torch.Tensor:
    """Attention of `query` (batch, heads, q_len, head_dim) over `key` / `value` (batch, key heads, k_len,
    head_dim) under transformers' sdpa conventions (a boolean mask, True = attend; or no mask: causal from the
    top-left corner when `is_causal` and q_len > 1, else every key). Returns (batch, q_len, heads, head_dim)."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    picks, blocked = key_layout(attention_mask, (batch, heads, kv_heads, q_len, k_len), causal, key.device)
    keys, values = (_canonical_keys(states, picks, blocked.shape[-1]) for states in (key, value))
    rows = heads // kv_heads * q_len  # a key head's queries, of all its query heads
    scale = head_dim**-0.5 if scaling is None else scaling
    q = (query.float() * scale).reshape(batch * kv_heads, rows, head_dim)
    if rows <= MAX_ROWS:  # `blocked` has MIN_ROWS rows at least already
        out = _attend(padded_rows(q), keys, values, blocked)[:, :rows]
    else:  # every product has at most MAX_ROWS rows
        parts = [q[:, start : start + MAX_ROWS] for start in range(0, rows, MAX_ROWS)]
        blocks = [blocked[:, start : start + MAX_ROWS] for start in range(0, rows, MAX_ROWS)]
        out = torch.cat(
            [_attend(padded_rows(p), keys, values, padded_rows(b))[:, : p.shape[1]] for p, b in zip(parts, blocks)], 1
        )
    return out.reshape(batch, heads, q_len, head_dim).to(query.dtype).transpose(1, 2)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """softmax(q keys^T, blocked keys left out) values for (n, rows, head_dim) queries, scaled already."""
    scores = [
        torch.bmm(q, keys[:, start : start + MAX_KEYS].transpose(1, 2)) for start in range(0, keys.shape[1], MAX_KEYS)
    ]
    scores = (torch.cat(scores, dim=-1) if len(scores) > 1 else scores[0]).masked_fill(blocked, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    weights = torch.exp(scores - top.masked_fill(top == float("-inf"), 0.0))  # a row with no key: all 0
    return _blockwise_sum(weights, values)


def padded_rows(x: torch.Tensor) -> torch.Tensor:
    """(n, rows, ...) with rows appended (zeros, False) up to MIN_ROWS."""
    if x.shape[1] >= MIN_ROWS:
        return x
    return torch.cat([x, x.new_zeros((x.shape[0], MIN_ROWS - x.shape[1], *x.shape[2:]))], dim=1)


def _blockwise_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """sum_j weights[..., j] * values[j] / sum_j weights[..., j], each block of KEY_BLOCK keys one product of a fixed
    shape (its weights a view, rows KEY_BLOCK apart), the blocks added left to right."""
    total = norm = None
    for start in range(0, weights.shape[-1], KEY_BLOCK):
        block = weights[:, :, start : start + KEY_BLOCK]
        part = torch.bmm(block, values[:, start : start + KEY_BLOCK])
        part_norm = block.sum(-1)  # a reduction over KEY_BLOCK values, whatever the other sizes
        total = part if total is None else total + part
        norm = part_norm if norm is None else norm + part_norm
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


def _canonical_keys(states: torch.Tensor, picks, length: int) -> torch.Tensor:
    """(batch * key heads, length, head_dim) float32: each row's attended keys (or values) at the front, in order
    (`picks`: their rows in `states` seen as (batch * key heads * k_len, head_dim); None: in place already), then
    padding up to `length`."""
    batch, kv_heads, k_len, head_dim = states.shape
    if picks is None:
        flat = states.float().reshape(batch * kv_heads, k_len, head_dim)
        return torch.nn.functional.pad(flat, (0, 0, 0, length - k_len))
    picked = states.reshape(batch * kv_heads * k_len, head_dim).index_select(0, picks)
    return picked.float().view(batch * kv_heads, length, head_dim)


def key_layout(attention_mask, shape: tuple, causal: bool, device):
    """(picks, blocked) for an attention of `shape` (batch, heads, key heads, q_len, k_len): per row, the columns
    any of its queries attends, in order, then repeats of its first one up to a multiple of KEY_BLOCK, as rows of
    the keys seen as (batch * key heads * k_len, head_dim) (None without a mask, whose keys are in place); and which
    (query row, key) pairs are not attended, as `tiled_attention` lays them out ((batch * key heads or 1, its query
    rows, at least MIN_ROWS, length)). Worked out once for the layers of a forward, which pass the same mask."""
    last = getattr(_LAST_LAYOUT, "value", None)
    facts = (None if attention_mask is None else attention_mask._version, shape, causal)
    if last is not None and last[0] is attention_mask and last[1] == facts:
        return last[2]
    batch, heads, kv_heads, q_len, k_len = shape
    allowed = allowed_keys(attention_mask, q_len, k_len, causal, device)
    if attention_mask is None:
        picks, length = None, -(-k_len // KEY_BLOCK) * KEY_BLOCK
        allowed = torch.nn.functional.pad(allowed, (0, length - k_len))
    else:
        attended = allowed.any(dim=-2).any(dim=1).expand(batch, k_len)
        counts = attended.sum(-1)
        longest = int(counts.max())
        length = max(KEY_BLOCK, -(-longest // KEY_BLOCK) * KEY_BLOCK)
        order = torch.sort((~attended).to(torch.int8), dim=-1, stable=True).indices[:, :longest]
        order = torch.cat([order, order[:, :1].expand(batch, length - longest)], dim=1)
        inside = torch.arange(length, device=order.device) < counts[:, None]
        allowed = allowed.expand(batch, -1, -1, k_len)
        allowed = allowed.gather(-1, order[:, None, None, :].expand(*allowed.shape[:3], length))
        allowed = allowed & inside[:, None, None]
        offsets = k_len * torch.arange(batch * kv_heads, device=order.device).view(batch, kv_heads, 1)
        picks = (order[:, None] + offsets).view(-1)
    blocked = ~padded_rows(_per_key_head(allowed, heads, kv_heads, q_len, length))
    _LAST_LAYOUT.value = (attention_mask, facts, (picks, blocked))
    return picks, blocked


def _per_key_head(allowed: torch.Tensor, heads: int, kv_heads: int, q_len: int, length: int) -> torch.Tensor:
    """(batch or 1, heads or 1, q_len or 1, length) -> (batch * key heads or 1, heads / key heads * q_len, length):
    the rows `tiled_attention` gives a key head (its query heads' queries, head by head)."""
    n, mask_heads = allowed.shape[:2]
    if n == 1 and mask_heads == 1:  # one pattern for every row and head (no mask): broadcast, not copied
        return allowed.expand(1, heads // kv_heads, q_len, length).reshape(1, -1, length)
    return allowed.expand(n, heads, q_len, length).reshape(n * kv_heads, heads // kv_heads * q_len, length)


def probe_attention_products(head_dim: int, device) -> None:
    """Checks once per head size (and thread count) that the two products of `tiled_attention`, laid out as it lays
    them out, give a row the same bits at every row count and key length; raises a ValueError naming them otherwise."""
    key = (device.type, head_dim, torch.get_num_threads())
    if key in _PROBED:
        return
    generator = torch.Generator(device=device).manual_seed(0)
    rows, lengths = max(_ROW_COUNTS), _KEY_COUNTS
    queries = torch.randn((1, rows, head_dim), generator=generator, device=device)
    keys = torch.randn((1, max(lengths), head_dim), generator=generator, device=device)
    weights = torch.rand((1, rows, max(lengths)), generator=generator, device=device)
    values = torch.randn((1, KEY_BLOCK, head_dim), generator=generator, device=device)

    def scores(rows: int, length: int) -> torch.Tensor:
        return torch.bmm(queries[:, :rows], keys[:, :length].transpose(1, 2))[:, :MIN_ROWS, :KEY_BLOCK]

    def sums(rows: int, length: int) -> torch.Tensor:  # a block of weights whose rows lie `length` apart
        block = weights[:, :rows, :length].contiguous()[:, :, :KEY_BLOCK]
        return torch.bmm(block, values)[:, :MIN_ROWS]

    agree = all(
        torch.equal(product(n, length), product(MIN_ROWS, KEY_BLOCK))
        for product in (scores, sums)
        for n in _ROW_COUNTS
        for length in lengths
    )
    if not agree:
        raise ValueError(
            f"batch_invariant(): float32 attention products of head size {head_dim} round a row differently with "
            f"the number of rows on this {device.type} (torch {torch.__version__}, {torch.get_num_threads()} "
            "threads), so attention cannot be made batch-invariant here: leave the switch off."
        )
    _PROBED.add(key)
