"""The step as a whole: in default and lossless greedy mode a step reads the device once (the step's fills and AR
choices), whatever the batch, on the dynamic and the static cache; rows that join mid-way and rows that finish do
not add reads; a row that finishes is fed no more. (The first forward, on an empty dynamic cache, passes
transformers the 2D mask, and transformers' mask function reads it to choose sdpa's causal kernel, as in AR's
prefill.)"""

import pytest
import torch
from conftest import EOS_ID, MASK_ID, prompts
from transformers import LogitsProcessorList
from transformers.generation import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper

from wedlm_hf.evaluation.step_benchmark import HostReads
from wedlm_hf.modeling.decoding_state import DecodingSettings
from wedlm_hf.modeling.slot_cache import SlotCache
from wedlm_hf.modeling.streaming_decoder import StreamingDecoder, _without_the_mask
from wedlm_hf.modeling.window_filling import FillSampler


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_step_reads_the_device_once(model64, static, lossless):
    cache = SlotCache(model64, slots=4, max_length=96) if static else None
    decoder = StreamingDecoder(model64, MASK_ID, cache=cache)
    settings = DecodingSettings(
        max_new_tokens=30, window_size=6, entropy_threshold=1.0, stop_ids=frozenset({EOS_ID}), lossless=lossless
    )
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, EOS_ID, (n,), generator=g).tolist() for n in (5, 9, 7, 12)]
    for prompt in prompts[:3]:
        decoder.add(prompt, settings)
    reads, steps = [], 0
    while decoder.busy:
        if steps == 3:
            joining = DecodingSettings(max_new_tokens=8, window_size=4, lossless=not lossless)  # the other mode
            decoder.add(prompts[3], joining)  # joins a running batch
        with HostReads() as counted:
            decoder.step()
        reads.append(counted.count)
        steps += 1
    assert steps > 4 and max(reads[1:]) == 1 and reads[0] <= 3, reads


@pytest.mark.parametrize("mode", ["paper", "context-drafts", "lossless"])
def test_a_sampled_step_reads_the_device_once(model64, mode):
    """Rows that sample, each with its own generator, draw their fills and have their drafts judged on the device
    before the step's read (as on an accelerator): the step still reads it once. A repetition penalty (which reads
    each slot's context) is drawn early by the paper's default rule; a row that verifies (lossless, or drafting from
    the context) under one fills after its commit (it sees the final token), so it is left out there."""
    lossless, context = mode == "lossless", mode != "paper"
    decoder = StreamingDecoder(model64, MASK_ID)
    assert not decoder.draws_before_read  # on a CPU, where a read is no synchronisation, draws follow it
    decoder.draws_before_read = True  # as on an accelerator
    g = torch.Generator().manual_seed(0)
    for n, seed in zip((5, 9, 7), (1, 2, 3)):
        processors = [TemperatureLogitsWarper(0.9), TopKLogitsWarper(20)]
        if not context:
            processors.append(RepetitionPenaltyLogitsProcessor(1.3))
        sampler = FillSampler(True, LogitsProcessorList(processors), generator=torch.Generator().manual_seed(seed))
        settings = DecodingSettings(
            max_new_tokens=30, window_size=6, entropy_threshold=1.0, stop_ids=frozenset({EOS_ID}), lossless=lossless,
            context_drafts=context,
        )  # fmt: skip
        settings.sampler = sampler
        decoder.add(torch.randint(0, EOS_ID, (n,), generator=g).tolist(), settings)
    reads, rows = [], list(decoder._joining)
    while decoder.busy:
        with HostReads() as counted:
            decoder.step()
        reads.append(counted.count)
    assert len(reads) > 4 and max(reads[1:]) == 1, reads
    if lossless:  # drafts were judged, some kept and some not
        assert sum(row.stats.accepted_drafts for row in rows) and sum(row.stats.rejected_drafts for row in rows)


def test_finished_rows_stop_adding_work(model64):
    """A row that stops early is fed no more rows: its forwards stop while the others continue."""
    ids, mask = prompts(2)
    free = model64.generate(ids[1:], attention_mask=mask[1:], max_new_tokens=24, strategy="wedlm", eos_token_id=None)
    stop_token = int(free[0, ids.shape[1] + 2])  # a token row 1 emits early becomes the stop token
    out = model64.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=24,
        strategy="wedlm",
        eos_token_id=stop_token,
        pad_token_id=EOS_ID,
        return_dict_in_generate=True,
    )
    short, long_ = sorted(out.wedlm_stats, key=lambda s: s.forwards)
    assert short.tokens < 24 and short.forwards < long_.forwards
    assert short.rows_fed < long_.rows_fed


def test_a_finished_row_drops_its_context_index(model64):
    """A row's context index (for its copies from the context) lives while it decodes; once it finishes, a caller
    that keeps the row (a server's request, `keep_cache`) does not keep the index with it."""
    decoder = StreamingDecoder(model64, MASK_ID, keep_cache=True)
    text = [5, 6, 7, 8] * 6  # text that repeats: the row copies from it
    row = decoder.add(text, DecodingSettings(max_new_tokens=12, window_size=4))
    indexed = False
    while decoder.busy:
        decoder.step()
        indexed |= row.context is not None and row.context.length >= len(text)
    assert indexed and row.done and row.context is None and row.kv is not None


@pytest.mark.parametrize("beside", [None, "lossless", "paper", "sampled"])
def test_a_default_row_chooses_its_ar_tokens_without_the_mask_token(model64, beside):
    """A default-mode row that drafts from the context never takes the mask token as AR's choice (its fills never
    do); a lossless row beside it keeps it, as plain `generate` does, and so does every column of a row under the
    paper's rule (which reads its mask columns through the fill's own suppression). The decoder notes whether every
    row is such a default row (the mask token then leaves every column at once) as rows join and leave."""
    decoder = StreamingDecoder(model64, MASK_ID)
    other = {
        "lossless": dict(lossless=True),
        "paper": dict(context_drafts=False),
        "sampled": dict(sampler=FillSampler(True, generator=torch.Generator().manual_seed(0))),
    }
    rows = [decoder.add([1, 2], DecodingSettings(max_new_tokens=30))]
    if beside:
        rows.append(decoder.add([3], DecodingSettings(max_new_tokens=30, **other[beside])))
    decoder.step()  # they join
    assert decoder._default_only == (beside in (None, "sampled")) and decoder._greedy_only == (beside != "sampled")
    logits = torch.zeros(len(rows), 3, MASK_ID + 1)
    logits[..., MASK_ID] = 100.0  # the mask token would win every argmax
    _without_the_mask(rows, logits, {b: [0, 1] for b in range(len(rows))}, MASK_ID, decoder._default_only)
    assert logits[0, :2].argmax(-1).tolist() == [0, 0] and (logits[0, :2, MASK_ID] == float("-inf")).all()
    if beside in ("lossless", "paper"):
        assert (logits[1, :, MASK_ID] == 100.0).all()
    if beside:
        decoder.finish(rows[1])  # it leaves: every row left is a greedy default row
        assert decoder._default_only and decoder._greedy_only
    decoder.add([4, 5], DecodingSettings(max_new_tokens=2, lossless=True))  # joins later, finishes in a step or two
    decoder.step()
    assert not decoder._default_only
    while len(decoder.active) > 1:
        decoder.step()
    assert decoder.active == rows[:1] and decoder._default_only and decoder._greedy_only
