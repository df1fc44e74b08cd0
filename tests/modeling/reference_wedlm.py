"""A slow, literal WeDLM decoder for tests: no KV cache, one sequence at a time, line by line as
docs/algorithm.md sections 3 and 6.f state it.

Every step re-runs the whole sequence (committed tokens, then the window's filled slots, then its masks, each at
its logical position) under a plain causal mask. It shares no code with `wedlm_hf` beyond the model itself.

Two rules: the paper's (`context_drafts=False`: fill masks by the entropy rule, commit the leading filled run), and
the default mode that drafts from the context (section 3.m): AR's own token first in the window, the entropy rule's
fills after it committed as the paper commits them, and copies from the context committed only where AR agrees.
"""

import torch

LONG_MATCH = 6  # agreement that makes a match long (section 6.f)
COPY_TOKENS = 12  # a copy's length at most
PATIENCE, PROBE, LONGEST_WAIT = 4, 2, 64  # the context source's rest (section 6.d)


def reference_decode(
    model,
    prompt: list[int],
    mask_token_id: int,
    window_size: int,
    threshold: float | None,
    penalty: float,
    max_new_tokens: int,
    stop_ids: tuple[int, ...] = (),
    context_drafts: bool = False,
    context_ngram: int = 3,
) -> tuple[list[int], int]:
    """Greedy decoding; returns (generated tokens, decoding forwards)."""
    if context_drafts:
        return _Hybrid(model, prompt, mask_token_id, window_size, threshold, penalty, max_new_tokens, stop_ids,
                       context_ngram).run()  # fmt: skip
    committed = list(prompt)
    end = len(prompt) + max_new_tokens
    window: list[int | None] = []
    forwards = 0
    while True:
        run = 0
        while run < len(window) and window[run] is not None:
            run += 1
        if any(t in stop_ids for t in window[:run]) or len(committed) + run >= end:
            # The run ends the text: the forward that would commit it has nothing else to do, so none is run.
            for t in window[:run]:
                committed.append(t)
                if t in stop_ids or len(committed) == end:
                    return committed[len(prompt) :], forwards
        stop_in_window = any(t is not None and t in stop_ids for t in window)
        while not stop_in_window and len(window) < window_size + run and len(committed) + len(window) < end:
            window.append(None)

        logits, masks = _forward(model, committed, window, mask_token_id)
        forwards += 1

        for t in window[:run]:
            committed.append(t)
            if t in stop_ids or len(committed) == end:
                return committed[len(prompt) :], forwards
        window = window[run:]
        if not masks:
            continue
        chosen, tokens = _entropy_rule(logits[len(logits) - len(masks) :], mask_token_id, threshold, penalty, masks)
        slot_of_mask = [i for i, t in enumerate(window) if t is None]
        for i in chosen:
            window[slot_of_mask[i]] = tokens[i]


def _forward(model, committed: list[int], window: list, mask_token_id: int):
    """Logits of committed + filled slots + masks (each at its logical position); the masks' positions."""
    base = len(committed)
    filled = [(t, base + i) for i, t in enumerate(window) if t is not None]
    masks = [base + i for i, t in enumerate(window) if t is None]
    tokens = committed + [t for t, _ in filled] + [mask_token_id] * len(masks)
    positions = list(range(base)) + [p for _, p in filled] + masks
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([tokens]),
            position_ids=torch.tensor([positions]),
            attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
        ).logits[0]
    return logits, masks


def _entropy_rule(mask_logits, mask_token_id: int, threshold, penalty: float, offsets: list[int], sure=None):
    """Which masks the entropy rule fills (indices into `offsets`, ascending) and every mask's argmax; `sure` (a
    list) gets, for each, whether it was under the threshold rather than the rule's fallback."""
    mask_logits = mask_logits.double().clone()
    mask_logits[:, mask_token_id] = float("-inf")
    probs = torch.softmax(mask_logits, dim=-1)
    entropies = [-(row[row > 0] * row[row > 0].log()).sum().item() for row in probs]
    adjusted = [h + penalty * (m - offsets[0]) for h, m in zip(entropies, offsets)]
    chosen = [i for i, a in enumerate(adjusted) if threshold is not None and a < threshold]
    if sure is not None:
        sure.append(bool(chosen))
    if not chosen:
        chosen = [adjusted.index(min(adjusted))]
    return chosen, [int(row.argmax()) for row in mask_logits]


class _Hybrid:
    """The default mode that drafts from the context (docs/algorithm.md section 3.m), step by step. Window slots
    are (token, kind) with kind "final" (AR's own token), "sure" or "fill" (the entropy rule's, under its threshold
    or its fallback, which AR judges as it judges a copy) or "copy", or None (a mask)."""

    def __init__(self, model, prompt, mask_token_id, window_size, threshold, penalty, max_new_tokens, stop_ids, ngram):
        self.model, self.mask, self.w = model, mask_token_id, window_size
        self.threshold, self.penalty, self.stops, self.ngram = threshold, penalty, set(stop_ids), ngram
        self.prompt, self.committed, self.end = list(prompt), list(prompt), len(prompt) + max_new_tokens
        self.window: list = []
        self.forwards = 0
        self.rest = {"size": None, "wait": 1, "quiet": 0, "failures": 0}  # the context source (None: no limit)
        self.masks = None  # the slots the last fill earned (None: no fill yet: W; 0: resting)
        self.fill_rest = {"wait": 1, "quiet": 0}  # the unsure fills' rest (section 3.m)
        self.fill_held = None  # whether AR kept the last unsure fill it judged (None: none judged yet)
        self.done = False

    def run(self) -> tuple[list[int], int]:
        first = True
        while not self.done:
            self.refill(first)
            self.step(first)
            first = False
        return self.committed[len(self.prompt) :], self.forwards

    def lead(self) -> int:
        """The leading run: filled slots before the first mask."""
        return next((i for i, slot in enumerate(self.window) if slot is None), len(self.window))

    def room(self) -> int:
        return self.end - len(self.committed)

    def refill(self, first: bool) -> None:
        stop = next((i for i, s in enumerate(self.window) if s is not None and s[0] in self.stops), None)
        if stop is not None:  # nothing after a filled stop token: no copy, no masks
            del self.window[stop + 1 :]
            return
        masks = self.w if first or self.masks is None else min(self.w, self.masks)
        masks = masks if masks >= 2 else 0  # the first mask after the run is AR's next token's: one alone is not
        if not first and self.masks is not None:  # masks past what the last fill earned are not fed again
            while len(self.window) > self.lead() + masks and self.window[-1] is None:
                self.window.pop()
        if not first and self.copy():
            masks = 0
            if any(s[0] in self.stops for s in self.window[: self.lead()]):
                return
        wanted = masks + self.lead() - len(self.window)
        self.window += [None] * max(0, min(wanted, self.room() - len(self.window)))

    def copy(self) -> bool:
        """Places the context's continuation after the leading run (section 6.f), or in place of its first unsure
        fill and all after it; whether it did."""
        lead = self.lead()
        run = (
            lead
            if self.fill_held is not False
            else next((i for i in range(1, lead) if self.window[i][1] == "fill"), lead)
        )
        pending = [s[0] for s in self.window[:run]]
        if not run or any(t in self.stops for t in pending):
            return False
        limit = min(self.w, COPY_TOKENS, self.room() - run)
        sure = any(s[1] == "sure" for s in self.window[1:lead])  # the model is sure there: copy a long match only
        drafts, length = _lookup(self.committed + pending, len(self.committed), self.ngram, limit)
        if length < (LONG_MATCH if sure else 1):
            return False
        size = self.rest["size"]
        drafts = drafts[: len(drafts) if size is None else size]
        stop = next((i for i, t in enumerate(drafts) if t in self.stops), None)
        drafts = drafts if stop is None else drafts[: stop + 1]
        if drafts and run < lead:  # the unsure fill and everything after it make way
            del self.window[run:]
        there = [(self.window[run + i], t) for i, t in enumerate(drafts) if run + i < len(self.window)]
        if not drafts or any(s is not None and s[0] != t for s, t in there):
            return False
        for i, t in enumerate(drafts):
            if run + i == len(self.window):
                self.window.append((t, "copy"))
            elif self.window[run + i] is None:
                self.window[run + i] = (t, "copy")
        return True

    def step(self, first: bool) -> None:
        run = self.lead()
        window = self.window
        unfed = (not first and len(window) >= 2 and run == len(window)
                 and (window[-1][0] in self.stops or len(window) == self.room()))  # fmt: skip
        fed = window[: len(window) - unfed]
        logits, masks = _forward(self.model, self.committed, [None if s is None else s[0] for s in fed], self.mask)
        self.forwards += 1
        base = len(self.committed)

        def ar(slot: int) -> int:  # AR's token at window slot `slot`, from the row before it, without the mask
            row = logits[base + slot - 1].double().clone()
            row[self.mask] = float("-inf")
            return int(row.argmax())

        accepted, replacement, checked, rejected, copy_failed = (0 if first else 1), None, 0, False, False
        judged, fill_failed = 0, False  # unsure fills AR judged, and whether one failed
        ends = not first and (window[0][0] in self.stops or self.room() <= 1)
        if not ends:
            for i in range(accepted, run):
                token, kind = window[i]
                if kind in ("copy", "fill"):  # a copy, or an unsure fill: AR judges them
                    checked += kind == "copy"
                    if kind == "fill":
                        self.fill_held = ar(i) == token
                        judged += 1
                    if ar(i) != token:
                        replacement, rejected, copy_failed = ar(i), True, kind == "copy"
                        fill_failed = kind == "fill"
                        break
                accepted += 1
                if token in self.stops or accepted >= self.room():
                    ends = True
                    break
            else:
                replacement = ar(run)
        self.rested(checked, copy_failed)
        self.fills_rested(judged, fill_failed)
        self.commit([s[0] for s in window[:accepted]])
        del window[:accepted]
        if not self.done and not ends and replacement is not None:
            if replacement in self.stops or self.room() == 1:
                self.commit([replacement])
                return
            if window:
                window[0] = (replacement, "final")
                if rejected:
                    window[1:] = [None] * (len(window) - 1)
            else:
                window.append((replacement, "final"))
        if self.done:
            return
        self.fill(logits[len(logits) - len(masks) :], masks)
        self.commit_ending()

    def fill(self, mask_logits, masks: list[int]) -> None:
        base = len(self.committed)
        still = [(j, m - base) for j, m in enumerate(masks) if 0 <= m - base < len(self.window)]
        still = [(j, slot) for j, slot in still if self.window[slot] is None]
        if not still:
            return
        sure: list[bool] = []
        chosen, tokens = _entropy_rule(mask_logits[[j for j, _ in still]], self.mask, self.threshold, self.penalty,
                                       [slot for _, slot in still], sure)  # fmt: skip
        for i in chosen:
            self.window[still[i][1]] = (tokens[i], "sure" if sure[0] else "fill")
        if chosen[0] != 0:  # the leftmost open mask too, a draft for AR to judge: the next one a check reaches
            self.window[still[0][1]] = (tokens[0], "fill")
        if sure[0]:  # four slots per sure fill, two at least
            self.masks = min(self.w, max(2, 4 * len(chosen)))
        elif self.masks != 0:  # two where it was sure of nothing; a rest goes on
            self.masks = 2

    def commit_ending(self) -> None:
        """A run of the final token and fills that reaches a stop token or the budget commits without a forward."""
        run = self.lead()
        run = next((i for i in range(run) if self.window[i][1] in ("copy", "fill")), run)
        tokens = [s[0] for s in self.window[:run]]
        stop = next((i + 1 for i, t in enumerate(tokens) if t in self.stops), None)
        end = stop if stop is not None else (self.room() if run >= self.room() else 0)
        if end:
            self.commit(tokens[:end])
            del self.window[:end]

    def commit(self, tokens: list[int]) -> None:
        for t in tokens:
            self.committed.append(t)
            if t in self.stops or len(self.committed) == self.end:
                self.done = True
                return

    def fills_rested(self, judged: int, failed: bool) -> None:
        """The model's fills rest where it was sure of nothing and AR rejected one (two masks or fewer): no masks
        until `wait` quiet steps (no fill judged) pass while copies are not being tried; each rest doubles the
        wait, a kept fill resets it."""
        rest, copying = self.fill_rest, self.rest["size"] not in (None, 0)
        if judged and failed and self.masks is not None and self.masks <= 2:
            self.masks, rest["quiet"], rest["wait"] = 0, 0, min(LONGEST_WAIT, rest["wait"] * 2)
        elif judged and not failed:
            rest["wait"] = 1
        elif not judged and self.masks == 0 and not copying:
            rest["quiet"] += 1
            if rest["quiet"] >= rest["wait"]:
                self.masks = 2

    def rested(self, checked: int, rejected: bool) -> None:
        """The context source's rest: after PATIENCE tries in a row whose first copy failed it rests, tries PROBE
        copies after `wait` quiet steps, each failed try doubling the wait."""
        rest = self.rest
        if checked:
            rest["failures"] = rest["failures"] + 1 if rejected and checked == 1 else 0
            if rest["failures"] == 0:
                rest["wait"] = 1
            if rest["failures"] >= PATIENCE:
                rest.update(size=0, failures=PATIENCE - 1, quiet=0, wait=min(LONGEST_WAIT, rest["wait"] * 2))
            else:
                rest["size"] = self.w
        elif rest["size"] == 0:
            rest["quiet"] += 1
            if rest["quiet"] >= rest["wait"]:
                rest["size"] = PROBE


def _lookup(sequence: list[int], committed: int, largest: int, limit: int) -> tuple[list[int], int]:
    """Prompt lookup over the committed text (section 6.f): the tokens after the latest earlier occurrence of the
    sequence's longest suffix of `largest` tokens or fewer, and the match's length (counted up to LONG_MATCH)."""
    if limit < 1:
        return [], 0
    end = len(sequence)
    for n in range(min(largest, end - 1), 0, -1):
        suffix = sequence[end - n :]
        for start in range(committed - 1, -1, -1):
            if sequence[start] != suffix[0] or start + n >= end:
                continue
            if sequence[start : start + n] == suffix:
                length = n
                while length < LONG_MATCH and start + n - length > 0:
                    if sequence[start + n - length - 1] != sequence[end - length - 1]:
                        break
                    length += 1
                return _continuation(sequence, start + n, limit, committed), length
    return [], 0


def _continuation(sequence: list[int], source: int, count: int, committed: int) -> list[int]:
    """`count` tokens from `source` on: from the committed text, or, where the text repeats itself with period
    len(sequence) - source, running on into the copy itself."""
    if source + count <= committed:
        return sequence[source : source + count]
    period = len(sequence) - source
    if period > source or sequence[source - period : source] != sequence[source:]:
        return sequence[source:committed]
    copied = sequence[source : source + count]
    while len(copied) < count:
        copied.append(copied[len(copied) - period])
    return copied
