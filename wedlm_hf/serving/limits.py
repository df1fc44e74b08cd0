"""The bounds that keep one request from costing the others more than a bounded share of the server.

Every size a client controls is bounded here or by the context length: the body's bytes, rows per request
(prompts x n), the window W a row feeds each step, the rows waiting to join, the token rows one forward feeds
(a long prompt is prefilled over several steps instead of widening everyone's forward), and the log-probability
entries of one answer (an echo of a long prompt with `n` and `logprobs` would otherwise be tens of megabytes). A
request also never holds more than `request_share` of the batch slots, so a small request that arrives while a
large one runs is admitted within a step or two; waiting rows are admitted request by request, fewest live rows
first.
"""

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ServingLimits:
    max_batch_size: int = 16  # rows decoded together
    max_queue: int = 256  # rows (of all requests) waiting to join the batch; beyond: 429
    max_request_rows: int = 64  # rows of one request: prompts x n
    max_window_size: int = 64  # largest wedlm_window_size a request may ask for
    max_step_tokens: int = 2048  # token rows one forward feeds (batch x width); prompts beyond are chunked
    max_request_bytes: int = 1 << 20  # request body; beyond: 413
    # log-probability entries in one answer: (echoed prompt tokens + max_tokens with logprobs) x choices x (1 + top)
    max_logprob_entries: int = 1 << 18

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"--{f.name.replace('_', '-')} must be a whole number >= 1, got {value!r}.")
        if self.max_request_rows > self.max_queue:
            raise ValueError(
                f"--max-request-rows ({self.max_request_rows}) cannot exceed --max-queue ({self.max_queue}): such a "
                "request could never be queued; raise --max-queue or lower --max-request-rows."
            )
        if self.max_step_tokens < 2 * self.max_window_size:
            raise ValueError(
                f"--max-step-tokens ({self.max_step_tokens}) must be at least twice --max-window-size "
                f"({self.max_window_size}): one row's step feeds up to 2W tokens."
            )

    @property
    def request_share(self) -> int:
        """Batch slots one request may hold at once: all but a quarter, which stays free for other requests."""
        return max(1, self.max_batch_size - self.max_batch_size // 4)

    def step_cost(self, rows: int, widest_window: int) -> int:
        """Token rows of a decoding step (every row padded to the widest feed, at most 2W)."""
        return rows * 2 * widest_window

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
