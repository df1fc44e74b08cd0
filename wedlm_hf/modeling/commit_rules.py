"""The commit rules that move a step's leading run into the committed text.

The paper's default rule commits the whole leading run of filled slots: their K/V were computed against the clean
prefix only (docs/algorithm.md section 3.c). Lossless mode commits a draft only where the model's own AR choice at
its real prefix agrees (`draft_verification`), and the AR token after the last accepted one becomes the next final
token (section 6). The default mode with context drafts (section 3.m) walks its run the same way, but commits the
model's confident fills unjudged, as the paper's rule does: its unsure fills and copies from the context are
checked. Under a grammar, default mode commits the run's valid prefix (`grammar_hook.commit_valid`). After the
fill, a row whose window already runs to its end commits it without another forward (`commit_ending`).
"""

from .decoding_state import OWN_SOURCES, DecodingRow, Fill
from .draft_sources import UNSURE, report_verdicts
from .draft_verification import ArPredictions
from .grammar_commit import valid_prefix
from .grammar_hook import commit_valid


def commit(row: DecodingRow, run: int, ar: ArPredictions | None) -> tuple[int, bool]:
    """Commits what the row's rule keeps of its leading `run` (`ar`: a lossless row's AR predictions); returns how
    many tokens committed and whether a grammar row's guess failed (the step's mask fills saw it and are dropped)."""
    if row.verifies:
        return verify_and_commit(row, run, ar), False
    if row.grammar is not None:
        return commit_valid(row, run)
    return row.commit(run), False


def verify_and_commit(row: DecodingRow, run: int, ar: ArPredictions) -> int:
    """A verifying row's commit (lossless, or default with context drafts). `ar` holds the AR predictions for
    window slots 1..run (for a new row: 0..run). Slot 0 is the final token placed last step; each later draft
    commits only if AR agrees (a default row's confident fills commit unjudged, `DecodingRow.trusts`), and the AR token
    after the last accepted one becomes the next final token (at a rejection, in the draft's place, with every
    later fill discarded)."""
    settings = row.settings
    first = int(row.prefilled)
    if first and (run == 0 or not row.window[0].final):
        raise RuntimeError("Lossless decoding lost its final token: this is a bug in wedlm_hf.")
    accepted, replacement, room = first, None, settings.max_new_tokens - len(row.generated)
    ends = (first == 1 and row.window[0].token in settings.stop_ids) or first >= room
    checked = {"model": 0, "context": 0, "forced": 0, "constrained": 0, UNSURE: 0}
    rejected, rejected_by = False, None
    if not ends:
        trusted, i = row.trusted_slots(first, run), first
        while i < run:
            end = first + _stretch_end(trusted, i - first)  # slots i..end-1 are all trusted, or all judged
            if trusted[i - first]:  # the entropy rule's confident fills (default mode): they commit as the paper's do
                taken, ends = _trusted_stretch(row.window[i:end], settings.stop_ids, room - accepted)
            elif not settings.sampler.do_sample:  # greedy verdicts on the drafts up to the next trusted fill
                taken, replacement, rejected_by, ends = _judge_greedy(row, ar, i, end, first, room - accepted, checked)
            else:
                taken, replacement, rejected_by, ends = _judge_drawn(row, ar, i, first, room - accepted, checked)
                end = i + 1
            accepted += taken
            if ends or replacement is not None:
                rejected = replacement is not None
                break
            i = end
        else:
            replacement = ar.own_token(run - first)
    report_verdicts(row, checked, rejected_by)
    kept = row.commit(accepted)
    if row.done or ends or replacement is None:
        return kept
    if replacement in settings.stop_ids or len(row.generated) + 1 >= settings.max_new_tokens:
        # The row's last token: AR's own choice needs no confirming forward, and like plain `generate` the
        # cache never holds the last token's K/V.
        row.window = [Fill(replacement, final=True)]
        row.commit(1)
        return kept
    if row.window:
        row.window[0] = Fill(replacement, final=True)
        if rejected:  # every later fill was drawn with the rejected draft in view
            row.window[1:] = [None] * (len(row.window) - 1)
    else:
        row.window.append(Fill(replacement, final=True))
    return kept


def _judge_greedy(row: DecodingRow, ar: ArPredictions, i: int, end: int, first: int, room: int, checked: dict):
    """Greedy verdicts on the judged drafts in slots i..end-1 at once (AR's argmax against each draft): how many
    commit (up to and including a stop token, at most `room`), AR's token in place of the first rejected one
    (None: none), the kind of that draft's verdict (`report_verdicts`), and whether the row ends. Counts the
    verdicts in `checked` and the row's statistics, as `_judge_drawn` does draft by draft."""
    slots = row.window[i:end]
    tokens = [slot.token for slot in slots]
    held = ar.held(i - first, tokens)
    taken, ends, stop_ids = held, False, row.settings.stop_ids
    if not stop_ids.isdisjoint(tokens[:held]):
        taken, ends = next(k for k, token in enumerate(tokens) if token in stop_ids) + 1, True
    if taken >= room:
        taken, ends = room, True
    rejects = not ends and held < len(tokens)
    judged = slots[: taken + rejects]
    sourced = [row.settings.lossless or slot.source not in OWN_SOURCES for slot in judged]
    for slot, own_source in zip(judged, sourced):
        checked[slot.source if own_source else UNSURE] += 1
    if False in sourced:  # a default row's unsure fills: the last one's verdict
        row.unsure_fill_held = not (rejects and not sourced[-1])
    contexts = [slot.source == "context" for slot in judged]
    row.stats.accepted_drafts += taken
    row.stats.accepted_context_drafts += contexts[:taken].count(True)
    if not rejects:
        return taken, None, None, ends
    row.stats.rejected_drafts += 1
    row.stats.rejected_context_drafts += contexts[-1]
    return taken, ar.own_token(i - first + held), judged[-1].source if sourced[-1] else UNSURE, False


def _judge_drawn(row: DecodingRow, ar: ArPredictions, i: int, first: int, room: int, checked: dict):
    """The verdict on the judged draft in slot i of a sampled row (`ArPredictions.judge`), as `_judge_greedy`'s."""
    settings, slot = row.settings, row.window[i]
    replacement = ar.judge(i - first, slot)
    context = slot.source == "context"
    sourced = settings.lossless or not row.judged_own(slot)  # not the default mode's unsure fill
    # A default row's unsure fill is judged unless sampled unverifiably: then a fresh draw replaces it
    judged = not sourced and (slot.verifiable and slot.q is not None)
    if judged:
        row.unsure_fill_held = replacement is None
        checked[UNSURE] += 1
    checked[slot.source] += sourced
    if replacement is not None:
        row.stats.rejected_drafts += 1
        row.stats.rejected_context_drafts += context
        return 0, replacement, slot.source if sourced else UNSURE if judged else None, False
    row.stats.accepted_drafts += 1
    row.stats.accepted_context_drafts += context
    return 1, None, None, slot.token in settings.stop_ids or room <= 1


def _stretch_end(flags: list[bool], k: int) -> int:
    """The end of the stretch of equal flags that starts at index k."""
    rest = flags[k:]
    return k + rest.index(not rest[0]) if (not rest[0]) in rest else len(flags)


def _trusted_stretch(slots: list[Fill], stop_ids: frozenset, room: int) -> tuple[int, bool]:
    """How many of a stretch of trusted fills commit, and whether the row ends with them: all of them, up to and
    including a stop token, at most `room` (the budget left)."""
    tokens = [slot.token for slot in slots]
    taken = len(tokens)
    if not stop_ids.isdisjoint(tokens):
        taken = next(k for k, token in enumerate(tokens) if token in stop_ids) + 1
    if taken >= room:
        return room, True
    return taken, taken < len(tokens) or tokens[-1] in stop_ids


def commit_ending(row: DecodingRow) -> int:
    """Commits the window through the row's end now, where the next forward would commit just those tokens and
    need nothing after them: the run reaches a stop token or the budget, and no forward can change a token of it.
    In default mode that is any run without a guess (under a grammar, every token of it valid); in lossless mode,
    the final token and tokens a grammar forces after it (AR under the grammar has no other choice there). That
    forward would only write K/V nobody reads, so these tokens have none in the cache, as a lossless row's last
    token has none. Not with keep_logits, whose logits come from that forward. Returns how many committed."""
    settings = row.settings
    if settings.keep_logits or not row.prefilled:
        return 0
    run, room = row.leading_run(), settings.max_new_tokens - len(row.generated)
    if run < room and settings.stop_ids.isdisjoint([slot.token for slot in row.window[:run]]):
        return 0  # the run does not reach the row's end, nor does any part of it
    if settings.lossless:  # the final token, then what the grammar forces
        if not run or not row.window[0].final:
            return 0
        run = next((i for i in range(1, run) if row.window[i].source != "forced"), run)
    elif row.verifies:  # the final token and the fills the entropy rule chose, up to the first draft judged by AR
        run = row.first_untrusted(1 if run and row.window[0].final else 0, run)
    tokens = [slot.token for slot in row.window[:run]]
    if run < room and settings.stop_ids.isdisjoint(tokens):  # the run does not reach the row's end
        return 0
    stop = next((i + 1 for i, token in enumerate(tokens) if token in settings.stop_ids), None)
    end = stop if stop is not None else room if run >= room else 0
    if not end or any(slot.guess for slot in row.window[:end]):
        return 0
    if row.grammar is not None and valid_prefix(row.grammar, tokens[:end], settings.stop_ids) < end:
        return 0
    return row.commit(end)
