"""`sampler_batch`: samplers of their own (a server's, a generator each) processed and drawn as one batch give each
row what its own sampler gives it alone: transformers' warpers' values, and its own generator's draws."""

import pytest
import torch
from conftest import EOS_ID, MASK_ID, build_model, prompts
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

import wedlm_hf.modeling.sampler_batch as sampler_batch
import wedlm_hf.modeling.window_filling as window_filling
from wedlm_hf.modeling.decoding_state import DecodingSettings
from wedlm_hf.modeling.processor_contexts import Contexts
from wedlm_hf.modeling.sampler_batch import SamplerBatch, batch_form, merged, process
from wedlm_hf.modeling.streaming_decoder import StreamingDecoder
from wedlm_hf.modeling.window_filling import FillSampler


def own(warpers: list, seed: int = 0) -> FillSampler:
    return FillSampler(True, LogitsProcessorList(warpers), generator=torch.Generator().manual_seed(seed))


def warpers_of(kinds: str, g: torch.Generator, vocab: int) -> list:
    """Warpers in transformers' order, with settings drawn from `g` (top-k up to past the vocabulary)."""
    u = lambda low, high: low + (high - low) * float(torch.rand((), generator=g))  # noqa: E731
    keep = int(torch.randint(1, 4, (), generator=g))
    made = {
        "t": lambda: TemperatureLogitsWarper(u(0.05, 2.0)),
        "k": lambda: TopKLogitsWarper(int(torch.randint(1, vocab + 5, (), generator=g)), min_tokens_to_keep=keep),
        "p": lambda: TopPLogitsWarper(u(0.01, 0.99), min_tokens_to_keep=keep),
        "m": lambda: MinPLogitsWarper(u(0.0, 0.6), min_tokens_to_keep=keep),
    }
    return [made[kind]() for kind in kinds]


@pytest.mark.parametrize("kinds", ["t", "k", "p", "m", "tk", "tp", "km", "tkpm"])
@pytest.mark.parametrize("vocab", [7, 600])
def test_a_batch_of_samplers_gives_each_row_its_own_warpers_values(kinds, vocab):
    """Rows of several samplers (their own settings; ties and -inf in the logits) processed as one batch: each
    sampler's rows get exactly what transformers' warpers give them, and a sampler alone gets the same."""
    g = torch.Generator().manual_seed(len(kinds) * vocab)
    for trial in range(6):
        samplers, blocks = [], []
        for s in range(5):
            warpers = warpers_of(kinds, g, vocab)
            if s and trial % 2:  # into the first one's batch: its min_tokens_to_keep, its k within a factor of two
                for mine, first in zip(warpers, samplers[0].warpers):
                    if hasattr(first, "min_tokens_to_keep"):
                        mine.min_tokens_to_keep = first.min_tokens_to_keep
                    if isinstance(first, TopKLogitsWarper):
                        low = 1 << (first.top_k.bit_length() - 1)
                        mine.top_k = int(torch.randint(low, 2 * low, (), generator=g))
            samplers.append(own(warpers, seed=s))
            block = torch.randn(int(torch.randint(1, 4, (), generator=g)), vocab, generator=g) * 4
            if trial % 3 == 0:
                block = block.round()  # ties
            block[:, 0] = float("-inf")  # the mask token, suppressed
            blocks.append(block)
        for sampler, block in zip(samplers, blocks):
            expected = block
            for warper in sampler.warpers:
                expected = warper(None, expected)
            assert torch.equal(sampler.scores(block), expected)  # alone, through the batch form
            assert torch.equal(process(block, [sampler], [len(block)]), expected)
            half = block.to(torch.bfloat16 if trial % 2 else torch.float16)  # a half model's logits, read in float32
            expected = half.float()
            for warper in sampler.warpers:
                expected = warper(None, expected)
            assert torch.equal(sampler.scores(half), expected)
        same = [s for s in samplers if s.batch_form[0] == samplers[0].batch_form[0]]
        assert len(same) == 5 or not trial % 2
        rows = [blocks[samplers.index(s)] for s in same]
        together = process(torch.cat(rows), same, [len(r) for r in rows])
        assert torch.equal(together, torch.cat([s.scores(r) for s, r in zip(same, rows)]))


@pytest.mark.parametrize("ignore", [None, 0, 3, "rows"], ids=["whole-context", "ignore-0", "ignore-3", "per-row"])
def test_a_batch_of_repetition_penalties_gives_each_position_its_own_contexts_values(ignore):
    """Positions of several rows (each context a prefix of its row's ids: the committed text and the window before
    the slot), each row with its own penalty and warpers after it, processed as one padded block: each position
    gets what transformers' processors give it alone with its own context (ids past the logits' vocabulary
    included, which transformers leaves out), and a sampler alone gets the same."""
    g, vocab = torch.Generator().manual_seed(7), 40
    for trial in range(8):
        samplers, blocks, parts = [], [], []
        for s in range(4):
            penalty = 0.5 + 1.5 * float(torch.rand((), generator=g))
            left_out = torch.tensor([s + trial % 3]) if ignore == "rows" else ignore  # a padded prompt's, in generate
            warpers = [RepetitionPenaltyLogitsProcessor(penalty, left_out), *warpers_of("tk", g, vocab)]
            if trial % 2:  # one batch: top-k within a factor of two of the first's
                warpers[2].top_k = 8 + s
            samplers.append(own(warpers, seed=s))
            ids = torch.randint(0, vocab + 3, (int(torch.randint(1, 12, (), generator=g)),), generator=g)
            slots = sorted(torch.randint(0, len(ids), (int(torch.randint(1, 5, (), generator=g)),), generator=g))
            parts.append(Contexts([ids], [0] * len(slots), [int(k) + 1 for k in slots]))
            block = torch.randn(len(slots), vocab, generator=g) * 3
            block[:, 0] = float("-inf")
            blocks.append(block)
        expected = []
        for sampler, block, contexts in zip(samplers, blocks, parts):
            rows = []
            for n in range(len(block)):
                row = block[n : n + 1]
                for warper in sampler.warpers:
                    row = warper(contexts[n][None], row)
                rows.append(row)
            expected.append(torch.cat(rows))
            assert torch.equal(sampler.scores(block, contexts), expected[-1])  # alone, through the batch form
        same = [i for i, s in enumerate(samplers) if s.batch_form[0] == samplers[0].batch_form[0]]
        assert len(same) == 4 or not trial % 2
        together = process(
            torch.cat([blocks[i] for i in same]),
            [samplers[i] for i in same],
            [len(blocks[i]) for i in same],
            Contexts.joined([parts[i] for i in same]),
        )
        assert torch.equal(together, torch.cat([expected[i] for i in same]))


def test_a_batch_draws_each_rows_tokens_from_its_own_generator():
    """The draw, the uniforms and a subset's draw of a `SamplerBatch` are each sampler's own, in its own stream."""
    vocab = 50
    probabilities = torch.softmax(torch.randn(9, vocab, generator=torch.Generator().manual_seed(1)), dim=-1)
    counts = [3, 2, 4]
    batch = SamplerBatch([own([TemperatureLogitsWarper(0.7)], seed=s) for s in range(3)], counts)
    alone = [own([TemperatureLogitsWarper(0.7)], seed=s) for s in range(3)]
    parts = probabilities.split(counts)
    assert torch.equal(batch.draw(probabilities), torch.cat([s.draw(p) for s, p in zip(alone, parts)]))
    assert torch.equal(batch.uniforms(9, "cpu"), torch.cat([s.uniforms(n, "cpu") for s, n in zip(alone, counts)]))
    some = [1, 3, 4, 8]  # the first sampler's second row, the second's two, the third's last
    subset = batch.rows(some)
    assert [id(s) for s in subset.samplers] == [id(s) for s in batch.samplers] and subset.counts == [1, 2, 1]
    expected = [
        alone[0].draw(probabilities[[1]]),
        alone[1].draw(probabilities[[3, 4]]),
        alone[2].draw(probabilities[[8]]),
    ]
    assert torch.equal(subset.draw(probabilities[some]), torch.cat(expected))


def common_key(warpers: list):
    return batch_form(own(warpers))[0]


def test_only_samplers_of_their_own_with_the_common_warpers_are_batched():
    common = [TemperatureLogitsWarper(0.8), TopKLogitsWarper(5)]
    assert batch_form(own(common)) is not None
    assert batch_form(own(common))[0] == batch_form(own([TemperatureLogitsWarper(1.3), TopKLogitsWarper(7)]))[0]
    assert batch_form(own(common))[0] != batch_form(own(common[::-1]))[0]  # another order, another batch
    assert batch_form(FillSampler(True, LogitsProcessorList(common))) is None  # the global stream
    greedy = batch_form(FillSampler(False, LogitsProcessorList(common), generator=torch.Generator()))
    assert greedy[0] == batch_form(FillSampler(False, LogitsProcessorList(common)))[0] != common_key(common)
    assert batch_form(FillSampler(False)) is None  # the plain argmax: nothing to process
    penalised = batch_form(own([RepetitionPenaltyLogitsProcessor(1.2), *common]))
    assert penalised[0] == batch_form(own([RepetitionPenaltyLogitsProcessor(1.5), *common]))[0] != common_key(common)
    left_out = batch_form(own([RepetitionPenaltyLogitsProcessor(1.2, torch.tensor([3])), *common]))  # one row's
    assert left_out[0] == penalised[0] and left_out[1][0] == (1.2, 3) and penalised[1][0] == (1.2, 0)
    per_row = RepetitionPenaltyLogitsProcessor(1.2, torch.tensor([2, 0]))  # state shaped for a batch of two
    assert batch_form(own([per_row])) is None
    assert batch_form(own([RepetitionPenaltyLogitsProcessor(1.2, 2.0)])) is None  # transformers leaves out none
    assert batch_form(own([RepetitionPenaltyLogitsProcessor(1.2, torch.tensor([2.5]))])) is None  # leaves out 3
    assert batch_form(own([NoRepeatNGramLogitsProcessor(2)])) is None  # reads the context, no batch form here
    assert batch_form(own([TypicalLogitsWarper(0.9)])) is None  # no batch form here
    assert batch_form(own([TopKLogitsWarper(5, filter_value=-1e4)])) is None
    assert batch_form(own([]))[0] == batch_form(own([]))[0]  # temperature 1, no truncation: only drawn
    # top-k's k already counts min_tokens_to_keep (and batches within a factor of two of it); top-p's and min-p's
    # keep it apart
    assert batch_form(own([TopKLogitsWarper(5, min_tokens_to_keep=3)]))[0] == batch_form(own([TopKLogitsWarper(7)]))[0]
    assert batch_form(own([TopKLogitsWarper(40)]))[0] == batch_form(own([TopKLogitsWarper(50)]))[0]
    assert batch_form(own([TopKLogitsWarper(40)]))[0] != batch_form(own([TopKLogitsWarper(150_000)]))[0]
    assert (
        batch_form(own([TopPLogitsWarper(0.5, min_tokens_to_keep=3)]))[0] != batch_form(own([TopPLogitsWarper(0.5)]))[0]
    )


def test_merged_groups_keep_each_samplers_rows_together_in_order():
    a, b = own([TemperatureLogitsWarper(0.5)], 1), own([TemperatureLogitsWarper(0.9)], 2)
    c, shared = own([TopPLogitsWarper(0.9)], 3), FillSampler(True)
    groups = merged([(a, ["a1", "a2"]), (shared, ["s1"]), (c, ["c1"]), (b, ["b1", "b2", "b3"])])
    assert [type(sampler) for sampler, _ in groups] == [SamplerBatch, FillSampler, SamplerBatch]
    batch, keys = groups[0]
    assert batch.samplers == [a, b] and batch.counts == [2, 3] and keys == ["a1", "a2", "b1", "b2", "b3"]
    assert groups[1] == (shared, ["s1"]) and groups[2][0].samplers == [c] and groups[2][1] == ["c1"]
    sized = merged([(a, [0, 1]), (b, [2])], size=lambda rows: 4 * len(rows))
    assert sized[0][0].counts == [8, 4]


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
@pytest.mark.parametrize("before_read", [False, True], ids=["draws-after-read", "draws-before-read"])
def test_the_decoder_processes_rows_with_samplers_of_their_own_as_one_batch(monkeypatch, lossless, before_read):
    """Beside rows that share one sampler and a seeded row without warpers (batched apart: its rows are only drawn),
    rows sampling with their own (as a server's requests do) are processed together, and each draws what it draws
    alone, whether the draws come after the step's read (a CPU's way) or before it (an accelerator's)."""
    model = build_model(seed=3)
    sizes = []
    real = sampler_batch.process
    monkeypatch.setattr(sampler_batch, "process", lambda s, ss, cs, c=None: sizes.append(len(ss)) or real(s, ss, cs, c))

    def settings(sampler):
        return DecodingSettings(24, window_size=6, lossless=lossless, sampler=sampler, stop_ids=frozenset({EOS_ID}))

    def decode(seeds):
        decoder = StreamingDecoder(model, MASK_ID)
        decoder.draws_before_read = before_read
        warpers = {s: [TemperatureLogitsWarper(1.1), TopPLogitsWarper(0.5 + s / 10)] for s in seeds if s < 4}
        # rows 5 to 7 with a repetition penalty each (it reads the context), batched apart from the others
        penalised = {s: [RepetitionPenaltyLogitsProcessor(1.2 + s / 10), TemperatureLogitsWarper(0.9)] for s in seeds}
        warpers |= {s: penalised[s] for s in seeds if s > 4}
        rows = [decoder.add([5 + s, 9, 3 + s], settings(own(warpers.get(s, []), s))) for s in seeds]
        decoder.add([7, 7, 2], settings(FillSampler(True)))
        while decoder.busy:
            decoder.step()
        return [row.generated for row in rows]

    together = decode(range(8))
    assert max(sizes) == 4 and 3 in sizes  # rows 0 to 3 together, the penalised ones together
    assert together == [decode([s])[0] for s in range(8)]


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_greedy_rows_with_penalties_of_their_own_are_processed_as_one_batch(monkeypatch, lossless):
    """`generate` with a repetition penalty gives each padded prompt a greedy sampler of its own: they process as
    one batch, each row's text what it is where each sampler processes alone (and, lossless, AR's)."""
    model = build_model(seed=3)
    ids, mask = prompts(3, lengths=(7, 11, 5))
    kwargs = dict(attention_mask=mask, max_new_tokens=20, eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    kwargs |= dict(strategy="wedlm", wedlm_lossless=lossless, repetition_penalty=1.6)
    sizes = []
    real = sampler_batch.process
    monkeypatch.setattr(sampler_batch, "process", lambda s, ss, cs, c=None: sizes.append(len(ss)) or real(s, ss, cs, c))
    together = model.generate(ids, **kwargs)
    assert max(sizes) == 3
    monkeypatch.setattr(window_filling, "batch_form", lambda sampler: None)  # each sampler on its own
    assert torch.equal(model.generate(ids, **kwargs), together)
    if lossless:
        plain = {k: v for k, v in kwargs.items() if k not in ("strategy", "wedlm_lossless")}
        ar = model.generate(ids, do_sample=False, **plain)
        assert torch.equal(together, ar)
