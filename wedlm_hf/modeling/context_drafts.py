"""Drafts copied from the context, for lossless decoding (docs/algorithm.md section 6.f).

Where text repeats (code, lists, quotes), the tokens that followed the last occurrence of the current suffix are a
good guess of what comes next: prompt lookup decoding's rule. In lossless mode a draft's source does not change the
output (verification keeps AR's tokens), so such drafts can fill the window's masks beside the model's own. The
index keeps every position of each token of a row's committed text, so a lookup scans only the occurrences of the
suffix's first token, most recent first, and at most `MAX_CANDIDATES` of them.

On periodic text (a line repeated, a loop's output) the latest match is one period back, so its continuation ends
after one period. There, and only where the text's last d tokens already repeat the d before them (d: how far back
the match is), the continuation runs on into itself, as an LZ77 copy does: once the text is used up, its token k
is its own token k - d. Otherwise a copy ends where the committed text does, as prompt lookup's does: past it lie
the drafts just placed, which only a periodic text repeats.
"""

MAX_CANDIDATES = 64  # occurrences of the suffix's first token checked per n-gram size
LONG_MATCH = 6  # tokens of agreement (the suffix and those before it) that make a match long


class ContextIndex:
    """Positions of every token in a row's committed text (prompt + generated), grown as tokens commit."""

    def __init__(self):
        self.positions: dict[int, list[int]] = {}
        self.length = 0

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.positions.setdefault(token, []).append(self.length)
            self.length += 1

    def continuation(self, sequence: list[int], largest: int, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of `sequence`'s longest suffix of
        `largest` tokens or fewer (down to one). `sequence` is the indexed (committed) text plus any drafts after
        it; the copy reads no draft unless the text is periodic there."""
        return self.lookup(sequence, largest, limit)[0]

    def lookup(self, sequence: list[int], largest: int, limit: int) -> tuple[list[int], int]:
        """`continuation`, and how long the match is: the suffix plus the tokens before it that agree with those
        before the occurrence, counted up to LONG_MATCH (0 when nothing matched)."""
        if limit < 1:
            return [], 0
        end = len(sequence)
        for n in range(min(largest, end - 1), 0, -1):
            suffix = sequence[end - n :]
            checked = 0
            for start in reversed(self.positions.get(suffix[0], ())):
                if start + n >= end:  # the suffix itself: nothing follows it yet
                    continue
                if sequence[start : start + n] == suffix:
                    length = n
                    while length < LONG_MATCH and start + n - length > 0:
                        if sequence[start + n - length - 1] != sequence[end - length - 1]:
                            break
                        length += 1
                    return _copy(sequence, start + n, limit, self.length), length
                checked += 1
                if checked == MAX_CANDIDATES:
                    break
        return [], 0


def _copy(sequence: list[int], source: int, count: int, committed: int) -> list[int]:
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
