"""Drafts copied from the context: prompt lookup's rule, and copies that run on into themselves on periodic text."""

import random

import pytest
import torch
from reference_wedlm import _lookup

from wedlm_hf.modeling.context_drafts import LONG_MATCH, ContextIndex


def continuation(text: list[int], pending: list[int] = (), largest: int = 3, limit: int = 8) -> list[int]:
    index = ContextIndex()
    index.extend(text)
    return index.continuation(list(pending), largest, limit)


def test_the_latest_occurrence_of_the_longest_suffix_wins():
    # "1 2" occurs twice; its latest occurrence is followed by 7, the earlier by 3.
    assert continuation([1, 2, 3, 4, 1, 2, 7, 8, 9, 1, 2]) == [7, 8, 9, 1, 2]
    # The 3-gram "9 1 2" is longer than "1 2" and wins over its later occurrence.
    assert continuation([9, 1, 2, 5, 6, 1, 2, 7, 9, 1, 2], limit=2) == [5, 6]
    assert continuation([1, 2, 3], limit=8) == []  # nothing occurs twice
    assert continuation([1, 2, 1], limit=0) == []


def test_pending_tokens_extend_the_suffix():
    """The leading run's drafts (not yet committed) are part of the suffix that is looked up."""
    assert continuation([5, 6, 7, 8, 5], pending=[6], limit=2) == [7, 8]


def test_a_copy_stops_at_the_end_of_text_that_is_not_periodic():
    # "copy: a b c => a": the match is in the prompt; the text after it has not repeated, so nothing is invented.
    text = [10, 1, 2, 3, 11, 1]
    assert continuation(text, limit=8) == [2, 3, 11, 1]


def test_a_copy_reads_no_pending_draft_unless_the_text_is_periodic():
    # The match's continuation reaches the committed text's end: past it lie this step's own drafts, which only
    # periodic text repeats (prompt lookup, too, copies from the committed text only).
    assert continuation([10, 1, 2, 3, 11], pending=[1, 2]) == [3, 11]
    # Periodic through the drafts: the copy runs on.
    assert continuation([1, 2, 20, 21, 20, 21, 20], pending=[21], limit=5) == [20, 21, 20, 21, 20]


@pytest.mark.parametrize("period", [1, 2, 3, 5])
def test_a_copy_runs_on_into_itself_on_periodic_text(period):
    cycle = list(range(20, 20 + period))
    text = [1, 2] + cycle * 3
    got = continuation(text, limit=12)
    assert got == (cycle * 12)[:12]  # the cycle, continued past the end of the text


def test_periodic_text_commits_in_fewer_forwards_and_stays_ar(shipped_model):
    """The shipped model repeats a two-token word here: lossless mode's context drafts cover the window each
    forward, not the two-token period that the latest match leaves before the end of the text."""
    model, tokenizer = shipped_model
    ids = torch.tensor([tokenizer("ab ab ab ab ab ab ab ab ab ab ab").input_ids])
    ar = model.generate(ids, max_new_tokens=48, do_sample=False)
    assert len(set(ar[0, -40:].tolist())) == 2  # the text this test is about: a two-token word, over and over
    out = model.generate(ids, strategy="wedlm", wedlm_lossless=True, max_new_tokens=48, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ar)
    stats = out.wedlm_stats[0]
    assert stats.accepted_context_drafts >= 32 and stats.forwards <= 12, stats  # one-period copies: 21 forwards


def test_a_lookup_says_how_long_the_match_is():
    index = ContextIndex()
    text = [9, 8, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]  # "1 2 3" again, after 7 where it first came after 8
    index.extend(text)
    assert index.lookup([], 3, 5) == ([4, 5, 6, 7, 1], 3)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7]  # seven tokens agree: counted up to LONG_MATCH
    index = ContextIndex()
    index.extend(text)
    assert index.lookup([], 3, 4) == ([8, 1, 2, 3], LONG_MATCH)
    index = ContextIndex()
    index.extend([1, 2, 3])
    assert index.lookup([], 3, 4) == ([], 0)


def test_a_match_is_found_however_far_back_and_only_on_token_boundaries():
    # The suffix's first token occurs hundreds of times after the one full match: every occurrence is searched.
    text = [7, 8, 9, 40] + [7, 1] * 300 + [7, 8]
    index = ContextIndex()
    index.extend(text)
    assert index.lookup([9], 3, 2) == ([40, 7], 3)
    # The bytes of [1] (01 00 00 00) also appear across the boundary of 0x01000000 and 0 (00 00 00 01 | 00 00 00
    # 00), later than its one occurrence as a token: only the token counts.
    index = ContextIndex()
    index.extend([1, 0x01000000, 0, 5, 1])
    assert index.lookup([], 3, 2) == ([0x01000000, 0], 1)


def test_the_index_grows_with_prompt_and_generated_text():
    index = ContextIndex()
    index.sync([1, 2, 3], [])
    index.sync([1, 2, 3], [4, 5])
    index.sync([1, 2, 3], [4, 5, 1, 2])
    assert index.tokens == [1, 2, 3, 4, 5, 1, 2]
    assert index.lookup([], 3, 4) == ([3, 4, 5, 1], 2)


def test_the_index_finds_what_a_scan_of_the_text_finds():
    """The index grows as tokens commit and looks up only what it indexed and the suffix's neighbourhood; the reference
    decoder's look-up scans the whole text each time. On random text over a few tokens (every suffix occurs often,
    many overlap the drafts), grown in random steps, at times indexed ahead at some sizes, with random drafts, n-gram
    sizes and limits, both agree; asked for a match of at least some length, the index finds the same where the scan's
    match is that long, and otherwise none that long."""
    rng = random.Random(0)
    for _ in range(300):
        vocabulary, index, text = rng.randint(1, 5), ContextIndex(), []
        for _ in range(rng.randint(1, 6)):
            new = [rng.randint(0, vocabulary) for _ in range(rng.randint(0, 12))]
            text += new
            index.sync(text[:4], text[4:]) if len(text) >= 4 else index.extend(new)
            if rng.random() < 0.3:  # indexed ahead of the look-ups (a prompt fed in chunks)
                index.index_sizes(rng.randint(1, 8))
            for _ in range(3):
                pending = [rng.randint(0, vocabulary) for _ in range(rng.randint(0, 8))]
                largest, limit = rng.randint(1, 8), rng.randint(0, 14)
                expected = _lookup(text + pending, len(text), largest, limit)
                shortest = rng.choice([1, 1, rng.randint(1, 7)])
                got = index.lookup(pending, largest, limit, shortest)
                if expected[1] >= shortest:
                    assert got == expected, (text, pending, largest, limit, shortest)
                else:
                    assert got[1] < shortest, (text, pending, largest, limit, shortest)
