"""A grammar as a hook of the step: what a row under a grammar does at each phase (docs/algorithm.md section 3.l).

Either commit rule calls it; it is not a mode of its own. Before the commit, lossless mode restricts the row's AR
logits to what the grammar allows (`restrict_to_grammar`), and default mode reads only the AR rows its commit can use
(`logit_slots`) and commits the run's valid prefix, checking guesses (`commit_valid`). After the fill, the window is
walked from the committed text on while the grammar's state is known (`constrain_window`): forced tokens placed,
rejected fills replaced, open slots filled with the model's choice among the allowed tokens.
"""

import torch

from .decoding_state import DecodingRow, Fill
from .draft_verification import ArPredictions
from .grammar_commit import allowed_along, allowed_tokens, restrict, valid_prefix
from .window_filling import entropy

MAX_FORCED = 64  # forced tokens placed per step and row, beyond the window (a grammar's fixed string)
GUESS_PROBABILITY = 0.3  # a guess's least probability under its mask (restricted); at 0 failed guesses cost more


def restrict_to_grammar(row: DecodingRow, logits: torch.Tensor, columns: list[int], run: int, joining: bool) -> None:
    """Lossless mode: the row's AR rows (`columns` of its (columns, vocab) `logits`) restricted in place to what its
    grammar allows after the window slots before each, so AR's own choices are AR + grammar's. Only rows after
    valid slots are used: a slot the grammar rejects is one AR (restricted) never chooses, so verification rejects
    it there."""
    grammar, stop_ids = row.grammar, row.settings.stop_ids
    tokens = [slot.token for slot in row.window[:run]]
    tokens = tokens[: valid_prefix(grammar, tokens, stop_ids)]
    tokens = tokens[: next((i for i, t in enumerate(tokens) if t in stop_ids), len(tokens))]
    allowed = allowed_along(grammar, tokens, stop_ids)
    if joining:  # its first AR row, the prompt's last token, predicts slot 0
        allowed = [allowed_tokens(grammar, stop_ids), *allowed]
    for column, mask in zip(columns, allowed):
        if mask.any():  # where nothing is allowed (complete, no stop token) the row ends before this choice counts
            logits[column] = restrict(logits[column], mask)


def commit_valid(row: DecodingRow, run: int) -> tuple[int, bool]:
    """Default mode: commits the run's leading tokens that the grammar accepts, up to a guess that AR's restricted
    choice there (from the row before it, fed this step) does not confirm; the first fill it rejects and every fill
    after it become masks again. Returns how many committed, and whether a guess failed (every mask of the step saw
    it, so none of their fills is kept).

    A guess stands where default mode would put AR's restricted choice one forward later: greedy, the argmax; in a
    sampled row, a draw from the warped restricted distribution p. A sampled row keeps the guess g with probability
    p(g) and otherwise draws from p without g, and that draw takes the guess's slot for the next forward (`final`,
    kept by `constrain_window`): the slot's token is then distributed as p, as if no guess had been made."""
    tokens = [slot.token for slot in row.window[:run]]
    stop_ids, sampler = row.settings.stop_ids, row.settings.sampler
    valid = valid_prefix(row.grammar, tokens, stop_ids)
    failed, carried = False, None
    for i in [i for i in range(1, valid) if row.window[i].guess]:
        row.grammar.advance(tokens[:i])  # only the guess's own slot needs the grammar's allowed tokens
        allowed = allowed_tokens(row.grammar, stop_ids)
        row.grammar.rollback(i)
        scores = restrict(row.step_logits[i - 1].float(), allowed)[None]
        contexts = row.contexts([i], scores.device) if sampler.reads_context else None
        if sampler.do_sample:  # a guess is a point-mass draft: kept with probability p(g), else p without g
            p = sampler.probabilities(scores, contexts)
            ar = ArPredictions(sampler, [], p, [sampler.uniform(p.device)])
        else:
            ar = ArPredictions(sampler, sampler(scores, contexts).tolist())
        replacement = ar.judge(0, row.window[i])
        if replacement is None:
            continue
        valid, failed = i, True
        carried = replacement if sampler.do_sample else None
        break
    if valid < run:
        row.window[valid:] = [None] * (len(row.window) - valid)
    count = row.commit(valid)
    if carried is not None and count == valid and not row.done:
        row.window[0] = Fill(carried, final=True, source="constrained")
    return count, failed


def logit_slots(row: DecodingRow, run: int) -> list[int]:
    """Default mode under a grammar: the run slots whose rows' AR logits the commit can use (row j predicts slot
    j + 1). Those before each guess, which check it, and that of the last token the grammar accepts, which
    predicts the slot after the commit. A commit ends at a failed guess or there (`commit_valid`), so no other row
    is read; with a vocabulary of 10^5 tokens, each skipped row is a sizeable product saved."""
    tokens = [slot.token for slot in row.window[:run]]
    valid = valid_prefix(row.grammar, tokens, row.settings.stop_ids)
    slots = {i - 1 for i in range(1, valid) if row.window[i].guess}
    return sorted(slots | ({valid - 1} if valid else set()))


def constrain_window(row: DecodingRow, mask_logits: dict[int, torch.Tensor]) -> None:
    """After a step's commit and fills, walks the window from the committed text on while the grammar's state is
    known: tokens it forces are filled without the model (a whole fixed string when it allows only one); a fill it
    rejects is replaced; an open slot is filled with the model's choice among the tokens it allows, where that
    choice is confident (restricted entropy under the threshold) and always at the slot right after the committed
    text (default mode: its AR logits), so the next forward commits at least one token. One unconfident choice a
    step may stand as a guess (`worth_a_guess`), which commits only as AR's own choice there would
    (`commit_valid`). Lossless mode starts after slot 0, AR's own token (chosen restricted already); there every
    fill is a draft the next forward verifies, and a sampled row's open slots are left to the model (their drafts
    need the distribution they were drawn from)."""
    window = row.window
    if row.settings.lossless:
        if not _past_final_token(row):
            return
        start = 1
    else:
        start = 0
        if window and window[0] is not None and not window[0].final:  # a fill from this step's masks: AR's
            window[0] = None  # restricted choice is better (a `final` one is AR's, drawn where a sampled guess failed)
    row.grammar.rollback(start + _walk(row, mask_logits, start))  # lossless: slot 0's advance too


def _past_final_token(row: DecodingRow) -> bool:
    """Lossless mode: advances the grammar past slot 0, AR's own token, and says whether the walk goes on after it
    (not where the row ends there)."""
    grammar, window, stop_ids = row.grammar, row.window, row.settings.stop_ids
    if not window or not window[0].final or window[0].token in stop_ids:
        return False
    if not allowed_tokens(grammar, stop_ids).any():  # complete, no stop token: AR's token there is no choice
        row.window.clear()
        row.done, row.finish_reason = True, "stop"
        return False
    grammar.advance([window[0].token])
    if not allowed_tokens(grammar, stop_ids).any():  # AR's token completes it and no stop token is set
        grammar.rollback(1)
        row.commit(1)
        row.done, row.finish_reason = True, row.finish_reason or "stop"
        return False
    return True


def _walk(row: DecodingRow, mask_logits: dict[int, torch.Tensor], slot: int) -> int:
    """`constrain_window`'s walk from window slot `slot` on (the grammar at that slot); returns how many tokens it
    advanced the grammar by (the caller rolls them back)."""
    settings, grammar, window, stop_ids = row.settings, row.grammar, row.window, row.settings.stop_ids
    consumed = 0
    room = settings.max_new_tokens - len(row.generated)
    limit = min(room, settings.window_size + slot)  # fills beyond W are never made; forced tokens cost no guess
    guessed = False
    while slot < limit:
        forced = grammar.forced()[: min(room, slot + MAX_FORCED) - slot]
        limit = min(room, max(limit, slot + len(forced)))
        for token in forced:
            if slot == len(window):
                window.append(None)
            if window[slot] is None or window[slot].token != token:
                window[slot] = Fill(token, source="forced")
            grammar.advance([token])
            slot, consumed = slot + 1, consumed + 1
        if forced:
            continue
        fill = window[slot] if slot < len(window) else None
        if fill is not None:
            if fill.token in stop_ids:
                if grammar.accepting():
                    break
            elif grammar.accepted([fill.token]) == 1:
                grammar.advance([fill.token])
                slot, consumed = slot + 1, consumed + 1
                continue
            window[slot] = None
        first = slot == 0
        allowed = allowed_tokens(grammar, stop_ids)
        if not allowed.any():  # complete, and no stop token is set: the text ends here (a fill before it commits)
            if first:
                row.done, row.finish_reason = True, "stop"
            break
        only = allowed.nonzero()[:2, 0].tolist()
        if len(only) == 1:  # one token allowed (a stop where the text is complete): no guess needed
            if slot == len(window):
                window.append(None)
            window[slot] = Fill(only[0], source="forced")
            if only[0] in stop_ids:
                break
            grammar.advance(only)
            slot, consumed = slot + 1, consumed + 1
            continue
        scores = row.next_logits if first else mask_logits.get(slot)
        if first and scores is None and not settings.lossless:
            raise RuntimeError("The slot after the committed text has no AR logits: this is a bug in wedlm_hf.")
        if scores is None or (settings.lossless and settings.sampler.do_sample):
            break
        restricted = restrict(scores.float()[None], allowed)
        threshold = settings.entropy_threshold
        guess = not first and (threshold is None or float(entropy(restricted)[0]) >= threshold)
        if guess:
            probabilities = torch.softmax(restricted[0], dim=-1)
            token = int(probabilities.argmax())
            if guessed or not worth_a_guess(row, grammar, token, float(probabilities[token])):
                break
            guessed = True
        else:
            sampler = settings.sampler
            contexts = row.contexts([slot], restricted.device) if sampler.reads_context else None
            token = int(sampler(restricted, contexts)[0])
        if slot == len(window):
            window.append(None)
        window[slot] = Fill(token, source="constrained", guess=guess)
        if token in stop_ids:
            break
        grammar.advance([token])
        slot, consumed = slot + 1, consumed + 1
    return consumed


def worth_a_guess(row: DecodingRow, grammar, token: int, probability: float) -> bool:
    """Whether an unconfident choice (`token`, the restricted argmax of its mask, with that `probability`) is placed
    as a guess. Only where the grammar forces a fixed string after it (a separator and the next key, or a closing
    brace): the forward that checks the guess against AR's own choice then also feeds
    that string and the masks after it, which reach the next value. A guess that fails costs its rows and that
    step's mask fills, so a long shot (under GUESS_PROBABILITY) is not placed. (In lossless mode a guess is a
    draft like any other; default mode checks guesses in `commit_valid`.)"""
    if token in row.settings.stop_ids or probability < GUESS_PROBABILITY:
        return False
    grammar.advance([token])
    forces = bool(grammar.forced())
    grammar.rollback(1)
    return forces
