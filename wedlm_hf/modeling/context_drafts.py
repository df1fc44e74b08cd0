"""Drafts copied from the context, for lossless decoding (docs/algorithm.md section 6.f).

Where text repeats (code, lists, quotes), the tokens that followed the last occurrence of the current suffix are a
good guess of what comes next: prompt lookup decoding's rule. In lossless mode a draft's source does not change the
output (verification keeps AR's tokens), so such drafts can fill the window's masks beside the model's own. The
index keeps a row's committed text as fixed-width bytes, grown as tokens commit, so a look-up is a substring search
backwards (`bytes.rfind`, in C): its host cost is a few calls per n-gram size, whatever the text's length and
however often the suffix's first token occurs. A look-up that finds nothing scans the whole text, so a resting
source makes none.

On periodic text (a line repeated, a loop's output) the latest match is one period back, so its continuation ends
after one period. There, and only where the text's last d tokens already repeat the d before them (d: how far back
the match is), the continuation runs on into itself, as an LZ77 copy does: once the text is used up, its token k
is its own token k - d. Otherwise a copy ends where the committed text does, as prompt lookup's does: past it lie
the drafts just placed, which only a periodic text repeats.
"""

from array import array

from .decoding_state import Fill
from .draft_windows import COPY_TOKENS
from .grammar_commit import valid_prefix

LONG_MATCH = 6  # tokens of agreement (the suffix and those before it) that make a match long
TOKEN = "i"  # a token id as 4 bytes (`array` typecode): the width the search aligns its matches to


class ContextIndex:
    """A row's committed text (prompt + generated) as 4-byte tokens, grown as tokens commit."""

    def __init__(self):
        self.tokens = array(TOKEN)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)

    def sync(self, prompt: list[int], generated: list[int]) -> None:
        """Indexes what `prompt` + `generated` added since the last call (without joining the two lists)."""
        fed = len(self.tokens)
        if fed < len(prompt):
            self.tokens.extend(prompt[fed:])
            fed = len(prompt)
        self.tokens.extend(generated[fed - len(prompt) :])

    def continuation(self, pending: list[int], largest: int, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the longest suffix of `largest`
        tokens or fewer (down to one) of the indexed text followed by `pending` (the drafts after it); the copy
        reads no draft unless the text is periodic there."""
        return self.lookup(pending, largest, limit)[0]

    def lookup(self, pending: list[int], largest: int, limit: int) -> tuple[list[int], int]:
        """`continuation`, and how long the match is: the suffix plus the tokens before it that agree with those
        before the occurrence, counted up to LONG_MATCH (0 when nothing matched)."""
        if limit < 1:
            return [], 0
        sequence = self.tokens + array(TOKEN, pending)
        data, end, width = sequence.tobytes(), len(sequence), sequence.itemsize
        for n in range(min(largest, end - 1), 0, -1):
            # An occurrence starts in the committed text and ends before the suffix does (something follows it).
            start = _latest(data, data[(end - n) * width :], min(end - n - 1, self.length - 1) * width, width)
            if start is None:
                continue
            length = n
            while length < LONG_MATCH and start + n - length > 0:
                if sequence[start + n - length - 1] != sequence[end - length - 1]:
                    break
                length += 1
            return _copy(sequence, start + n, limit, self.length).tolist(), length
        return [], 0


def _latest(data: bytes, suffix: bytes, last: int, width: int) -> int | None:
    """The token index of the latest occurrence of `suffix` in `data` that starts at byte `last` or before, on a
    token boundary; None if there is none."""
    end = last + len(suffix)
    while end >= len(suffix):
        at = data.rfind(suffix, 0, end)
        if at < 0:
            return None
        if at % width == 0:
            return at // width
        end = at + len(suffix) - 1  # a match across token boundaries: look before it
    return None


def _copy(sequence: array, source: int, count: int, committed: int) -> array:
    """Up to `count` tokens copied from `sequence[source:]`: overlapping the copy itself where the text is
    periodic, otherwise from its first `committed` tokens only."""
    if source + count <= committed:
        return sequence[source : source + count]
    offset = len(sequence) - source
    if offset > source or sequence[source - offset : source] != sequence[source:]:
        return sequence[source:committed]
    copied = sequence[source : source + count]
    while len(copied) < count:
        copied.append(copied[len(copied) - offset])
    return copied


def copy_from_context(row, shortest: int = 1, replace_model_drafts: bool = False) -> bool:
    """Fills the masks right after the leading run with the tokens that followed the latest earlier occurrence
    of the text's suffix (at most COPY_TOKENS and W of them, within the token budget, up to a stop token, and
    under a grammar up to the first token it rejects); they are verified with the run in the next forward;
    nothing while the context source rests, nor for a match shorter than `shortest` tokens (LONG_MATCH: long).
    A continuation that contradicts one of the model's own fills on its way is dropped whole: the model is
    confident there, and a rejected context draft would discard its fills. With `replace_model_drafts` the copy
    continues the run before the model's first draft that AR judges (the final token, tokens a grammar forces and
    a default row's confident fills) and, if there is one, takes the place of everything after it. Returns whether
    a copy was placed."""
    run = row.leading_run()
    if replace_model_drafts:  # the run up to the model's first draft AR judges (a grammar's forced tokens stay)
        run = row.first_judged_own(1, run)
    pending = [slot.token for slot in row.window[:run]]
    stop_ids = row.settings.stop_ids
    if not run or not stop_ids.isdisjoint(pending) or row.context_window.size == 0:
        return False  # nothing to continue, or the source rests: no look-up (the index catches up when used)
    if row.context is None:
        row.context = ContextIndex()
    row.context.sync(row.prompt, row.generated)
    room = row.settings.max_new_tokens - len(row.generated) - run
    limit = min(row.settings.window_size, COPY_TOKENS, room)
    drafts, length = row.context.lookup(pending, row.settings.context_ngram, limit)
    if length < shortest:
        return False
    del drafts[row.context_window.size :]
    for i, token in enumerate(drafts):
        if token in stop_ids:
            del drafts[i + 1 :]
            break
    if row.grammar is not None:  # a draft the grammar rejects is one AR under it never chooses
        del drafts[max(0, valid_prefix(row.grammar, pending + drafts, stop_ids) - run) :]
    if not drafts:
        return False
    window = row.window
    if replace_model_drafts:
        del window[run:]
    if any([fill is not None and fill.token != token for fill, token in zip(window[run:], drafts)]):
        return False
    for i, token in enumerate(drafts):
        slot = run + i
        if slot == len(window):
            window.append(Fill(token, source="context"))
        elif window[slot] is None:
            window[slot] = Fill(token, source="context")
    return True
