"""Stops, streamers, statistics and sampling of generate(strategy="wedlm")."""

import threading

import pytest
import torch
from conftest import EOS_ID, MASK_ID, prompts
from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer, TextStreamer


def wedlm(model, ids, **kwargs):
    kwargs.setdefault("max_new_tokens", 24)
    kwargs.setdefault("wedlm_entropy_threshold", 0.8)
    return model.generate(ids, strategy="wedlm", **kwargs)


def free_run(model, ids, n=24):
    return wedlm(model, ids, max_new_tokens=n, eos_token_id=None)[0, ids.shape[1] :].tolist()


def test_max_new_tokens_is_exact(model64):
    ids, _ = prompts(1)
    for n in (1, 5, 17, 33):
        out = wedlm(model64, ids, max_new_tokens=n, eos_token_id=None, return_dict_in_generate=True)
        assert out.sequences.shape[1] == ids.shape[1] + n and out.wedlm_stats[0].tokens == n


def test_max_length_bounds_like_generate(model64):
    ids, _ = prompts(1)
    out = model64.generate(ids, strategy="wedlm", max_length=ids.shape[1] + 6, eos_token_id=None)
    assert out.shape[1] == ids.shape[1] + 6


@pytest.mark.parametrize("as_list", [False, True])
def test_eos_stops_and_is_kept(model64, as_list):
    ids, _ = prompts(1)
    free = free_run(model64, ids)
    stop = free[6]
    first = free.index(stop)
    unused = next(t for t in range(EOS_ID) if t not in free[: first + 1])  # a second stop id the text never reaches
    eos = [unused, stop] if as_list else stop
    out = wedlm(model64, ids, eos_token_id=eos)
    assert out[0, ids.shape[1] :].tolist() == free[: first + 1]


def test_rows_after_a_stop_are_padded(model64):
    ids, mask = prompts(2)
    free = wedlm(model64, ids, attention_mask=mask, eos_token_id=None)[:, ids.shape[1] :].tolist()
    stop = next(t for t in free[0][2:] if t not in free[1])  # ends row 0 early, never row 1
    out = wedlm(model64, ids, attention_mask=mask, eos_token_id=stop, pad_token_id=EOS_ID, return_dict_in_generate=True)
    n = out.wedlm_stats[0].tokens
    row = out.sequences[0, ids.shape[1] :].tolist()
    assert n < 24 and row[:n] == free[0][:n] and row[n - 1] == stop
    assert row[n:] == [EOS_ID] * (24 - n)
    assert out.sequences[1, ids.shape[1] :].tolist() == free[1]


def test_user_stopping_criteria_see_committed_tokens_one_by_one(model64):
    ids, _ = prompts(1)
    free = free_run(model64, ids)
    seen = []

    class StopAtLength(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            seen.append(input_ids.shape[1])
            return torch.tensor([input_ids.shape[1] >= ids.shape[1] + 9])

    out = wedlm(model64, ids, eos_token_id=None, stopping_criteria=StoppingCriteriaList([StopAtLength()]))
    assert out[0, ids.shape[1] :].tolist() == free[:9]
    assert seen == list(range(ids.shape[1] + 1, ids.shape[1] + 10))


def test_stop_strings_need_and_use_the_tokenizer(model64, char_tokenizer):
    ids, _ = prompts(1)
    free = free_run(model64, ids)
    text = char_tokenizer.decode(free)
    stop = text[5:7]
    with pytest.raises(ValueError, match="tokenizer"):
        wedlm(model64, ids, stop_strings=[stop])
    out = wedlm(model64, ids, stop_strings=[stop], tokenizer=char_tokenizer, eos_token_id=None, pad_token_id=EOS_ID)
    new = char_tokenizer.decode(out[0, ids.shape[1] :])
    assert new.endswith(stop) and new == text[: text.index(stop) + len(stop)]


def test_text_streamer_prints_the_committed_text(model64, char_tokenizer, capsys):
    ids, _ = prompts(1)
    streamer = TextStreamer(char_tokenizer, skip_prompt=True)
    out = wedlm(model64, ids, eos_token_id=None, streamer=streamer)
    printed = capsys.readouterr().out
    assert printed.rstrip("\n") == char_tokenizer.decode(out[0, ids.shape[1] :])


def test_streamer_gets_prompt_then_chunks_then_end(model64):
    ids, _ = prompts(1)
    events = []

    class Recorder:
        def put(self, value):
            events.append(("put", value.clone()))

        def end(self):
            events.append(("end", None))

    out = wedlm(model64, ids, eos_token_id=None, streamer=Recorder(), return_dict_in_generate=True)
    assert torch.equal(events[0][1], ids)
    chunks = [v for kind, v in events[1:-1]]
    assert events[-1] == ("end", None)
    assert torch.cat(chunks).tolist() == out.sequences[0, ids.shape[1] :].tolist()
    assert len(chunks) <= out.wedlm_stats[0].forwards and max(len(c) for c in chunks) > 1


def test_text_iterator_streamer(model64, char_tokenizer):
    ids, _ = prompts(1)
    streamer = TextIteratorStreamer(char_tokenizer, skip_prompt=True, timeout=60)  # never wait forever
    result = {}

    def generate():
        try:
            result["out"] = wedlm(model64, ids, eos_token_id=None, streamer=streamer)
        except BaseException as error:  # re-raised below; ending the stream stops the reader waiting
            result["error"] = error
            streamer.end()

    thread = threading.Thread(target=generate)
    thread.start()
    text = "".join(streamer)
    thread.join()
    if "error" in result:
        raise result["error"]
    assert text == char_tokenizer.decode(result["out"][0, ids.shape[1] :])


def test_stats_count_forwards_tokens_and_rows(model64):
    ids, _ = prompts(1)
    out = wedlm(model64, ids, max_new_tokens=20, eos_token_id=None, wedlm_window_size=8, return_dict_in_generate=True)
    stats = out.wedlm_stats[0]
    assert stats.tokens == 20
    # Every forward feeds at most W + L <= 2W window rows and at least one; the prompt rows are not counted.
    assert stats.forwards <= stats.rows_fed <= 16 * stats.forwards
    assert stats.tokens_per_forward == pytest.approx(20 / stats.forwards)
    assert stats.p_cache == pytest.approx(20 / stats.rows_fed)
    assert set(stats.to_dict()) == {
        "forwards",
        "tokens",
        "rows_fed",
        "tokens_per_forward",
        "p_cache",
        "accepted_drafts",
        "rejected_drafts",
        "accepted_context_drafts",
        "rejected_context_drafts",
        "forced_tokens",
        "constrained_tokens",
        "acceptance_rate",
    }
    # The default mode judges its unsure fills and copies: they count as drafts; the paper's rule judges nothing.
    judged = stats.accepted_drafts + stats.rejected_drafts
    assert judged > 0 and stats.acceptance_rate == pytest.approx(stats.accepted_drafts / judged)
    paper = wedlm(
        model64,
        ids,
        max_new_tokens=20,
        eos_token_id=None,
        wedlm_window_size=8,
        wedlm_context_drafts=False,
        return_dict_in_generate=True,
    ).wedlm_stats[0]
    assert paper.accepted_drafts == paper.rejected_drafts == 0 and paper.acceptance_rate is None


def test_accept_all_threshold_fills_whole_window(model64):
    ids, _ = prompts(1)
    out = wedlm(
        model64,
        ids,
        max_new_tokens=32,
        eos_token_id=None,
        wedlm_window_size=16,
        wedlm_entropy_threshold=1e9,
        return_dict_in_generate=True,
    )
    stats = out.wedlm_stats[0]
    # Step 1 fills 16; step 2 commits them and fills the 16 more that reach the budget, which commit at once (a
    # forward would only confirm them): 2 forwards, 16 + 32 rows.
    assert (stats.forwards, stats.rows_fed) == (2, 48)


def test_sampling_is_seeded_and_top_k_1_is_greedy(model64):
    ids, _ = prompts(1)
    greedy = wedlm(model64, ids, eos_token_id=None)
    torch.manual_seed(7)
    a = wedlm(model64, ids, eos_token_id=None, do_sample=True, temperature=1.5)
    torch.manual_seed(7)
    b = wedlm(model64, ids, eos_token_id=None, do_sample=True, temperature=1.5)
    assert torch.equal(a, b) and not torch.equal(a, greedy)
    top1 = wedlm(model64, ids, eos_token_id=None, do_sample=True, top_k=1, temperature=3.0)
    assert torch.equal(top1, greedy)
    nucleus = wedlm(model64, ids, eos_token_id=None, do_sample=True, top_p=1e-6)
    assert torch.equal(nucleus, greedy)


def test_entropy_uses_raw_logits_not_temperature(model64):
    """Temperature changes sampled tokens, not which masks are filled: with top_k=1 the output is greedy's."""
    ids, _ = prompts(1)
    greedy = wedlm(model64, ids, eos_token_id=None, return_dict_in_generate=True)
    hot = wedlm(
        model64, ids, eos_token_id=None, do_sample=True, top_k=1, temperature=50.0, return_dict_in_generate=True
    )
    assert torch.equal(hot.sequences, greedy.sequences) and hot.wedlm_stats == greedy.wedlm_stats


def test_mask_token_is_never_emitted(model64):
    ids, _ = prompts(1)
    with torch.no_grad():
        model64.lm_head.weight[MASK_ID] += 1000.0  # the mask logit would win everywhere
    try:
        out = wedlm(model64, ids, eos_token_id=None, do_sample=True)
        assert MASK_ID not in out[0, ids.shape[1] :].tolist()
        out = wedlm(model64, ids, eos_token_id=None)
        assert MASK_ID not in out[0, ids.shape[1] :].tolist()
    finally:
        with torch.no_grad():
            model64.lm_head.weight[MASK_ID] -= 1000.0


def test_num_return_sequences_repeats_rows(model64):
    ids, _ = prompts(1)
    torch.manual_seed(0)
    out = wedlm(model64, ids, eos_token_id=None, do_sample=True, num_return_sequences=3, return_dict_in_generate=True)
    assert out.sequences.shape[0] == 3 and len(out.wedlm_stats) == 3
    assert all(torch.equal(out.sequences[i, : ids.shape[1]], ids[0]) for i in range(3))


def test_1d_input_is_one_prompt(model64):
    ids, _ = prompts(1)
    assert torch.equal(wedlm(model64, ids[0], eos_token_id=None), wedlm(model64, ids, eos_token_id=None))
