"""A step's cost in token rows, its attention counted, so that a long prompt joining decoding rows is prefilled in
chunks that cost them no more than the token budget, however long the prompt's context grows.

A forward's projections and MLP cost the same per fed token row whatever the context; attention costs each fed row
in proportion to the keys it reads, and every row of a batch reads as many keys as the widest row has (the cache is
one tensor, padded). Counting multiply-adds per layer, one token row's linear layers cost as much as attending to
`keys_per_row(config)` keys (about six times the hidden size for a dense model). A step that feeds R rows of width w
over K keys then costs R * w * (1 + K / keys_per_row) token rows: a short context adds little, a context of many
times keys_per_row multiplies the cost of every row fed.
"""


def keys_per_row(config) -> int | None:
    """Keys whose attention costs as much as one token row's projections and MLP (multiply-adds per layer); None
    for a config without a dense decoder's sizes (the budget then counts token rows alone)."""
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if not hidden or not heads or not getattr(config, "intermediate_size", None):
        return None
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    projections = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q and o, k and v
    mlp = 3 * hidden * config.intermediate_size  # gate, up, down
    return max(1, (projections + mlp) // (2 * heads * head_dim))  # per key: q.k and the value's weighted sum


def step_cost(rows: int, width: int, keys: int, keys_per_row: int) -> float:
    """Token rows' worth of work of a forward feeding `rows` rows `width` wide over `keys` keys."""
    return rows * width * (1 + keys / keys_per_row)


def prompt_cap(
    budget: int, rows: int, decoding_width: int, context: int, fed: int, remaining: int, keys_per_row: int
) -> int:
    """The prompt tokens a joining row may feed this step: the most whose step stays within `budget` token rows,
    where `rows` rows are fed, the decoding ones `decoding_width` wide over `context` keys, and the joining prompt
    has `fed` tokens in the cache and `remaining` to feed. Never fewer than the decoding width (the budget is soft
    by a window per row: every decoding row feeds its window each step) nor than one token."""
    floor = max(decoding_width, 1)

    def fits(chunk: int) -> bool:
        width = max(chunk, decoding_width)
        return step_cost(rows, width, max(context, fed + chunk), keys_per_row) <= budget

    low, high = floor, max(floor, remaining)
    if fits(high):
        return high
    while high - low > 1:  # fits(low) or low == floor; not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
