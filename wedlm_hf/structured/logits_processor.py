"""A grammar for AR `generate()`: the logits processor that lossless WeDLM decoding under the same grammar equals."""

import torch
from transformers import LogitsProcessor

from ..modeling.grammar_commit import allowed_tokens
from .grammars import compile_grammar


class GrammarLogitsProcessor(LogitsProcessor):
    """Restricts each row's next token to what its grammar allows (stop tokens only where it is complete).

    `grammar`: one spec or compiled `Grammar` for every row, or a list with one per row (None: free text), as
    `generate(strategy="wedlm", grammar=...)` takes them. `eos_token_id`: the stop tokens (the tokenizer's by
    default). A processor holds its rows' states: make one per `generate` call.
    """

    def __init__(self, grammar, tokenizer=None, eos_token_id: int | list[int] | None = None, vocab_size=None):
        specs = grammar if isinstance(grammar, list) else [grammar]
        self._grammars = [None if s is None else compile_grammar(s, tokenizer, vocab_size) for s in specs]
        self._per_row = isinstance(grammar, list)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
        if eos_token_id is None:
            raise ValueError("GrammarLogitsProcessor needs the stop tokens: pass eos_token_id= or tokenizer=.")
        self.stop_ids = frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        self._states = None
        self._ended: list[bool] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._states is None:
            grammars = self._grammars if self._per_row else self._grammars * len(input_ids)
            if len(grammars) != len(input_ids):
                raise ValueError(f"GrammarLogitsProcessor has {len(grammars)} grammars for {len(input_ids)} rows.")
            self._states = [None if g is None else g.matcher() for g in grammars]
            self._ended = [False] * len(input_ids)
        else:
            for b, state in enumerate(self._states):
                token = int(input_ids[b, -1])
                if state is None or self._ended[b]:
                    continue
                if token in self.stop_ids:
                    self._ended[b] = True
                else:
                    state.advance([token])
        allowed = torch.ones(scores.shape, dtype=torch.bool)
        for b, state in enumerate(self._states):
            if state is not None and not self._ended[b]:
                own = allowed_tokens(state, self.stop_ids)[: scores.shape[-1]]
                allowed[b] = False
                allowed[b, : len(own)] = own
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))  # a new tensor, as processors return
