"""A row's grammar state that cannot fail the batch: its failure ends its own request, with a 400.

A `response_format` can compile, pass the first-advance check, and still fail while decoding: llguidance stops at a
resource limit only once the model's own choices lead there (a property whose schema contains itself, reached after
a free value). The decoder calls a row's grammar inside the step that every row of the batch shares, so an
exception there would fail every request in the batch. Wrapped in `ContainedGrammar`, the state records its first
failure and from then on constrains nothing (every token allowed, nothing forced, always complete), so the step
runs to its end for everyone; the scheduler then ends the failed row's request with a 400 naming the error.
"""

import torch


class ContainedGrammar:
    """`state` (the core's grammar protocol: `wedlm_hf.modeling.grammar_commit`) with its failures held in
    `error` (None until one happens) instead of raised."""

    def __init__(self, state, vocab_size: int):
        self._state = state
        self._vocab_size = vocab_size
        self.error: str | None = None

    def _call(self, name: str, *args, fallback):
        if self.error is None:
            try:
                return getattr(self._state, name)(*args)
            except Exception as exc:  # noqa: BLE001 - any failure of this row's grammar is this row's alone
                self.error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return fallback() if callable(fallback) else fallback

    def accepted(self, tokens: list[int]) -> int:
        return self._call("accepted", tokens, fallback=len(tokens))

    def advance(self, tokens: list[int]) -> None:
        self._call("advance", tokens, fallback=None)

    def rollback(self, count: int) -> None:
        self._call("rollback", count, fallback=None)

    def forced(self) -> list[int]:
        return self._call("forced", fallback=list)

    def allowed(self) -> torch.Tensor:
        return self._call("allowed", fallback=lambda: torch.ones(self._vocab_size, dtype=torch.bool))

    def accepting(self) -> bool:
        return self._call("accepting", fallback=True)
