"""Drafts copied from the context, for lossless decoding (docs/algorithm.md section 6.f).

Where text repeats (code, lists, quotes), the tokens that followed the last occurrence of the current suffix are a
good guess of what comes next: prompt lookup decoding's rule. In lossless mode a draft's source does not change the
output (verification keeps AR's tokens), so such drafts can fill the window's masks beside the model's own. The
index keeps, for each n-gram size looked up, where each n-gram of the committed text last occurs, brought up to
date when a look-up needs it (in C: a dictionary updated from zipped slices): a look-up is a few dictionary reads,
whatever the text's length, where a scan of the text grows with it (on a long context, more than the rest of a
row's step). A joining row indexes its prompt as it is fed, a chunk a step (`index_fed_prompt`), so no step builds
the index of a long prompt prefilled in chunks whole (one fed whole, or served from a prefix cache, is indexed at
once). It costs host memory (`wedlm-hf bench-step` prints how much per token of context; an 8B model's K/V take
about 150 KB per token), dropped when the row finishes. A resting source makes no look-up.

On periodic text (a line repeated, a loop's output) the latest match is one period back, so its continuation ends
after one period. There, and only where the text's last d tokens already repeat the d before them (d: how far back
the match is), the continuation runs on into itself, as an LZ77 copy does: once the text is used up, its token k
is its own token k - d. Otherwise a copy ends where the committed text does, as prompt lookup's does: past it lie
the drafts just placed, which only a periodic text repeats.
"""

from .decoding_state import Fill
from .draft_windows import COPY_TOKENS
from .grammar_commit import valid_prefix

LONG_MATCH = 6  # tokens of agreement (the suffix and those before it) that make a match long


class ContextIndex:
    """A row's committed text (prompt + generated) and, for each n-gram size looked up, where each of its n-grams last
    occurs followed by a committed token: indexed when a look-up first needs that size after tokens commit."""

    def __init__(self):
        self.tokens: list[int] = []
        self.latest: dict[tuple, int] = {}  # n tokens -> the latest start of theirs that a token follows (any n)
        self.indexed: list[int] = [0]  # [n]: the tokens up to which the n-grams before them are in `latest`

    @property
    def length(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        self.tokens += tokens

    def sync(self, prompt: list[int], generated: list[int]) -> None:
        """Takes in what `prompt` + `generated` added since the last call (without joining the two lists)."""
        taken = len(self.tokens) - len(prompt)  # generated tokens already in (below 0: prompt tokens still out)
        if taken < 0:
            self.tokens += prompt[taken:]
            taken = 0
        self.tokens += generated[taken:]

    def index_sizes(self, largest: int) -> None:
        """Indexes the n-grams of every size up to `largest` that the text has so far, ahead of the look-ups that
        would otherwise index them all at once (a joining prompt's, chunk by chunk as it is fed)."""
        text, indexed = self.tokens, self.indexed
        while len(indexed) <= largest:
            indexed.append(0)
        for n in range(1, largest + 1):
            if indexed[n] < len(text):
                _index(self.latest, text, n, indexed[n])
                indexed[n] = len(text)

    def continuation(self, pending: list[int], largest: int, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the longest suffix of `largest`
        tokens or fewer (down to one) of the indexed text followed by `pending` (the drafts after it); the copy
        reads no draft unless the text is periodic there."""
        return self.lookup(pending, largest, limit)[0]

    def lookup(self, pending: list[int], largest: int, limit: int, shortest: int = 1) -> tuple[list[int], int]:
        """`continuation`, and how long the match is: the suffix plus the tokens before it that agree with those
        before the occurrence, counted up to LONG_MATCH (0 when nothing matched). Only a match of at least
        `shortest` tokens is looked for: where the suffix of n tokens never occurred, a shorter one's match is
        shorter than n (were it as long, the n tokens would occur there), so the look-up ends there."""
        if limit < 1:
            return [], 0
        text, latest, indexed = self.tokens, self.latest, self.indexed
        committed, drafts = len(text), len(pending)
        end = committed + drafts
        largest = largest if largest < end else end - 1  # a suffix leaves a token before it
        while len(indexed) <= largest:
            indexed.append(0)
        near = committed - LONG_MATCH - largest if committed > LONG_MATCH + largest else 0
        tail = text[near:] + pending  # the suffixes and what agrees before them lie in it
        for n in range(largest, 0, -1):
            suffix = tail[-n:]
            # An occurrence starts in the committed text and ends before the suffix does (something follows it): those
            # that end before the text's last token are indexed, the few later ones are compared here.
            for start in range(
                end - n - 1 if drafts <= n else committed - 1, committed - n - 1 if committed > n else -1, -1
            ):
                if tail[start - near : start - near + n] == suffix:
                    break
            else:
                if indexed[n] < committed:
                    _index(latest, text, n, indexed[n])
                    indexed[n] = committed
                start = latest.get(tuple(suffix))
                if start is None:
                    if shortest >= n:
                        return [], 0
                    continue
            length = n  # the tokens before an occurrence lie in the text, those before the suffix in the tail
            while length < LONG_MATCH and start + n - length > 0:
                if text[start + n - length - 1] != tail[end - length - 1 - near]:
                    break
                length += 1
            return _copy(text, pending, start + n, limit), length
        return [], 0


def _index(latest: dict, tokens: list[int], n: int, old: int) -> None:
    """Adds to `latest` the n-grams of `tokens` that the tokens from index `old` on follow (later starts win)."""
    first, stop = old - n if old > n else 0, len(tokens) - n
    if first < stop:
        latest.update(zip(zip(*[tokens[first + i : stop + i] for i in range(n)]), range(first, stop)))


def _span(text: list[int], pending: list[int], i: int, j: int) -> list[int]:
    """Tokens i..j-1 of the text followed by `pending`."""
    committed = len(text)
    return text[i:j] + pending[max(i - committed, 0) : max(j - committed, 0)]


def _copy(text: list[int], pending: list[int], source: int, count: int) -> list[int]:
    """Up to `count` tokens from token `source` on of the text followed by `pending`: overlapping the copy itself
    where that sequence is periodic, otherwise from the committed text only."""
    committed = len(text)
    if source + count <= committed:
        return text[source : source + count]
    offset = committed + len(pending) - source  # the period, if the sequence is periodic from there
    rest = _span(text, pending, source, source + offset)
    if offset > source or _span(text, pending, source - offset, source) != rest:
        return text[source:committed]
    copied = _span(text, pending, source, source + count)
    while len(copied) < count:
        copied.append(copied[len(copied) - offset])
    return copied


def index_fed_prompt(row) -> None:
    """Indexes the prompt tokens a joining row has fed so far (or has from a prefix cache), at every n-gram size its
    look-ups take: a long prompt fed in chunks over several steps is indexed with them, a chunk a step, so that no
    step indexes it whole (the step after its prefill would, at its first look-up, beside every row of the batch)."""
    if row.context is None:
        row.context = ContextIndex()
    index = row.context
    index.extend(row.prompt[index.length : row.prompt_fed])
    index.index_sizes(row.settings.context_ngram)


def copy_from_context(row, shortest: int = 1, replace_model_drafts: bool = False, run: int | None = None) -> bool:
    """Fills the masks right after the leading run with the tokens that followed the latest earlier occurrence
    of the text's suffix (at most COPY_TOKENS and W of them, within the token budget, up to a stop token, and
    under a grammar up to the first token it rejects); they are verified with the run in the next forward;
    nothing while the context source rests, nor for a match shorter than `shortest` tokens (LONG_MATCH: long).
    A continuation that contradicts one of the model's own fills on its way is dropped whole: the model is
    confident there, and a rejected context draft would discard its fills. With `replace_model_drafts` the copy
    continues the run before the model's first draft that AR judges (the final token, tokens a grammar forces and
    a default row's confident fills) and, if there is one, takes the place of everything after it. Returns whether
    a copy was placed. `run`: the row's leading run, where the caller has it."""
    run = row.leading_run() if run is None else run
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
    drafts, length = row.context.lookup(pending, row.settings.context_ngram, limit, shortest)
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
    end = len(window)  # drafts take the masks in the window, then go on past its end
    for slot, token in enumerate(drafts[: end - run], run):
        if window[slot] is None:
            window[slot] = Fill(token, source="context")
    window += [Fill(token, source="context") for token in drafts[end - run :]]
    return True
