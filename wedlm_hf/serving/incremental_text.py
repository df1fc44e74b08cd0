"""A row's committed tokens as text, released piece by piece, cut at the first stop string.

Decoding token by token breaks byte-level BPE: a multi-byte character spread over several tokens decodes to U+FFFD
until its last byte arrives, and some tokenizers change a token's text by what precedes it. So each new token is
decoded together with the tokens since the last released piece (`prefix_offset`), and its text is released only
once it no longer ends in U+FFFD. Text that might be the beginning of a stop string is held back until it is known
not to be one, and a stop string found in the text cuts the row at the token that completes it; neither the stop
string nor anything after it is returned (as OpenAI does). At the end, `flush` releases what is left, so the
concatenated pieces equal `tokenizer.decode(tokens, skip_special_tokens=True)` whenever no stop string matched.
"""

from transformers import PreTrainedTokenizerFast

_INCOMPLETE = "\ufffd"


class IncrementalText:
    def __init__(self, tokenizer, stop: list[str] | tuple = ()):
        self.tokenizer = tokenizer
        self._backend_decode = _backend_decode(tokenizer)
        self.stop = [s for s in stop if s]
        self.tokens: list[int] = []
        self.text = ""  # decoded text of the tokens up to `read_offset`
        self.released = 0  # characters of `text` handed out
        self.stop_tokens: int | None = None  # when a stop string matched: tokens up to the one that completes it
        self._prefix_offset = 0
        self._read_offset = 0
        self._longest_stop = max((len(s) for s in self.stop), default=0)

    @property
    def stopped(self) -> bool:
        return self.stop_tokens is not None

    def add(self, token_ids: list[int]) -> str:
        """Takes newly committed tokens; returns the text that can be released now (possibly ""). A step's tokens
        are decoded together (two tokenizer calls a step, not two a token: a decoding step commits several); only
        where their text holds U+FFFD (a character not yet whole, or invalid bytes) or a stop string are they taken
        again one by one, which finds the token that completes it. Each step releases what it would token by token,
        but for how many U+FFFD stand for invalid bytes under a byte-fallback tokenizer (Llama 2's), which depends
        on where a decode starts."""
        if self.stopped or (len(token_ids) > 1 and self._add_at_once(token_ids)):
            return self._release(final=False)
        for token in token_ids:
            if self.stopped:
                break
            self.tokens.append(token)
            before = len(self.text)
            self.text += self._decode_new(final=False)
            self._check_stop(before)
        return self._release(final=False)

    def _add_at_once(self, token_ids: list[int]) -> bool:
        """Adds the tokens with one decode where their text is whole, with no U+FFFD in it (a byte-fallback
        tokenizer turns a whole run of bytes into U+FFFD where one of them is invalid, which one by one would have
        released the valid characters before it), and holds no stop string; else leaves the state as it was and
        returns False."""
        state = (len(self.tokens), self.text, self._prefix_offset, self._read_offset)
        self.tokens += token_ids
        before = len(self.text)
        self.text += self._decode_new(final=False)
        self._check_stop(before)
        if self._read_offset == len(self.tokens) and not self.stopped and _INCOMPLETE not in self.text[before:]:
            return True
        count, self.text, self._prefix_offset, self._read_offset = state
        del self.tokens[count:]
        self.stop_tokens = None
        return False

    def flush(self) -> str:
        """The row ended: the rest of the text, including a trailing incomplete character as U+FFFD."""
        if not self.stopped:
            before = len(self.text)
            self.text += self._decode_new(final=True)
            self._check_stop(before)
        return self._release(final=True)

    def _decode_new(self, final: bool) -> str:
        if self._read_offset == len(self.tokens):
            return ""
        prefix = self._decode(self.tokens[self._prefix_offset : self._read_offset])
        full = self._decode(self.tokens[self._prefix_offset :])
        if len(full) > len(prefix) and (final or not full.endswith(_INCOMPLETE)):
            self._prefix_offset, self._read_offset = self._read_offset, len(self.tokens)
            return full[len(prefix) :]
        if final:
            self._prefix_offset = self._read_offset = len(self.tokens)
        return ""

    def _decode(self, tokens: list[int]) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(tokens, skip_special_tokens=True)
        return self.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _check_stop(self, before: int) -> None:
        """Searches the text added since `before` (plus a stop string's length back) for the first stop string."""
        if not self.stop or len(self.text) == before:
            return
        start = max(0, before - self._longest_stop + 1)
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) != -1]
        if hits:
            index, _ = min(hits)
            self.text = self.text[:index]
            self.stop_tokens = len(self.tokens)

    def _release(self, final: bool) -> str:
        end = len(self.text)
        if not final and not self.stopped:
            end -= self._held_back()
        piece = self.text[self.released : max(end, self.released)]
        self.released += len(piece)
        return piece

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        for size in range(min(self._longest_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-size:]
            if any(s.startswith(tail) for s in self.stop):
                return size
        return 0


def _backend_decode(tokenizer):
    """The tokenizers library's own `decode` where transformers' would only call it (a fast tokenizer whose class
    keeps transformers' `decode` and `_decode`; without clean-up, which `_decode` does after it): transformers'
    wrapper first walks every id (`to_py_obj`), which costs a row about what the decode itself does, twice a step.
    None for any other tokenizer, which is called as it is."""
    kind = type(tokenizer)
    fast = isinstance(tokenizer, PreTrainedTokenizerFast)
    if fast and kind.decode is PreTrainedTokenizerFast.decode and kind._decode is PreTrainedTokenizerFast._decode:
        return tokenizer.backend_tokenizer.decode
    return None
