"""Lossless WeDLM decoding: the output is plain AR `generate`'s, with several tokens committed per forward."""

import pytest
import torch
from conftest import EOS_ID, MASK_ID, build_model, count_unfed_ends, prompts, tiny_config
from transformers import DynamicCache, StoppingCriteria, StoppingCriteriaList, TextStreamer

from wedlm_hf import WeDLMForCausalLM
from wedlm_hf.modeling.transformers_versions import CACHE_KWARG

FLAVOURS = {"qwen3": dict(qk_norm=True, attention_bias=False), "qwen2.5": dict(qk_norm=False, attention_bias=True)}


@pytest.fixture(scope="module", params=list(FLAVOURS))
def flavour_model(request):
    return build_model(seed=3, **FLAVOURS[request.param])


def lossless(model, ids, **kwargs):
    return model.generate(ids, strategy="wedlm", wedlm_lossless=True, **kwargs)


@pytest.mark.parametrize("context", [True, False], ids=["context-drafts", "model-drafts-only"])
@pytest.mark.parametrize("window", [1, 4, 16])
@pytest.mark.parametrize("threshold", [None, 0.4, 1e9])
def test_greedy_output_equals_plain_generate_single_and_batched(flavour_model, window, threshold, context):
    settings = dict(max_new_tokens=24, eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    for batch in (1, 3):
        ids, mask = prompts(batch, lengths=(7, 11, 5))
        ar = flavour_model.generate(ids, attention_mask=mask, do_sample=False, **settings)
        out = lossless(
            flavour_model,
            ids,
            attention_mask=mask,
            wedlm_window_size=window,
            wedlm_entropy_threshold=threshold,
            wedlm_context_drafts=context,
            return_dict_in_generate=True,
            **settings,
        )
        assert torch.equal(out.sequences, ar)
        for stats in out.wedlm_stats:
            assert stats.tokens_per_forward >= 1.0 or stats.tokens < stats.forwards <= stats.tokens + 1
            all_drafts = stats.accepted_drafts + stats.rejected_drafts
            context_drafts = stats.accepted_context_drafts + stats.rejected_context_drafts
            if window == 1:  # no slot after the final token: the model drafts nothing
                assert all_drafts == context_drafts
            if not context:
                assert context_drafts == 0


def test_parallel_commits_happen_and_are_counted():
    """A model whose masks predict what AR would say: drafts are accepted, several tokens per forward."""
    model = build_model(seed=3, **FLAVOURS["qwen2.5"])
    ids, _ = prompts(1)
    out = lossless(model, ids, max_new_tokens=30, eos_token_id=None, wedlm_window_size=8, return_dict_in_generate=True)
    stats = out.wedlm_stats[0]
    assert stats.accepted_drafts > 0 and stats.rejected_drafts > 0
    assert stats.acceptance_rate == pytest.approx(
        stats.accepted_drafts / (stats.accepted_drafts + stats.rejected_drafts)
    )
    assert stats.tokens == 30 and stats.forwards < 30  # fewer forwards than plain generate's 30
    assert stats.to_dict()["acceptance_rate"] == stats.acceptance_rate


def test_stops_budget_and_stop_strings_match_generate(model64, char_tokenizer):
    ids, mask = prompts(2, lengths=(6, 9))
    free = model64.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, eos_token_id=None)
    stop_token = int(free[0, ids.shape[1] + 4])  # a token the first row emits early: a stop there
    stop_text = char_tokenizer.decode(free[1, ids.shape[1] + 6 : ids.shape[1] + 8])
    for kwargs in (
        dict(max_new_tokens=13, eos_token_id=None),
        dict(max_new_tokens=20, eos_token_id=stop_token, pad_token_id=EOS_ID),
        # (with an eos_token_id, plain generate pads rows a criterion finished; without one it lets them run on)
        dict(max_new_tokens=20, eos_token_id=EOS_ID, pad_token_id=EOS_ID, stop_strings=[stop_text]),
    ):
        extra = {"tokenizer": char_tokenizer} if "stop_strings" in kwargs else {}
        ar = model64.generate(ids, attention_mask=mask, do_sample=False, **kwargs, **extra)
        out = lossless(model64, ids, attention_mask=mask, wedlm_window_size=6, **kwargs, **extra)
        assert torch.equal(out, ar), kwargs


def test_streamer_receives_the_same_text(model64, char_tokenizer, capsys):
    ids, _ = prompts(1)
    ar = model64.generate(ids, do_sample=False, max_new_tokens=16, eos_token_id=None)
    lossless(
        model64, ids, max_new_tokens=16, eos_token_id=None, streamer=TextStreamer(char_tokenizer, skip_prompt=True)
    )
    assert capsys.readouterr().out == char_tokenizer.decode(ar[0, ids.shape[1] :]) + "\n"


def test_cache_after_decoding_equals_ar_prefill_of_the_output(model64):
    """Every committed token's K/V is an AR prefill's; like plain generate, the last token's is never computed."""
    ids, mask = prompts(3)
    out = lossless(
        model64,
        ids,
        attention_mask=mask,
        max_new_tokens=18,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        wedlm_window_size=5,
        wedlm_entropy_threshold=0.9,
        return_dict_in_generate=True,
    )
    seq, width = out.sequences, ids.shape[1]
    full = torch.zeros_like(seq)
    for b in range(3):
        full[b, : width + out.wedlm_stats[b].tokens] = torch.cat(
            [mask[b], torch.ones(out.wedlm_stats[b].tokens, dtype=torch.long)]
        )
    prefill = DynamicCache(config=model64.config)
    with torch.no_grad():
        model64(seq, attention_mask=full, position_ids=(full.cumsum(-1) - 1).clamp_min(0), **{CACHE_KWARG: prefill})
    for layer_out, layer_ref in zip(out.cache.layers, prefill.layers):
        for b in range(3):
            cols = full[b].bool().nonzero().squeeze(1)
            cached, last = cols[:-1], cols[-1]
            torch.testing.assert_close(layer_out.keys[b][:, cached], layer_ref.keys[b][:, cached], rtol=0, atol=1e-10)
            torch.testing.assert_close(
                layer_out.values[b][:, cached], layer_ref.values[b][:, cached], rtol=0, atol=1e-10
            )
            assert (layer_out.keys[b][:, last] == 0).all()


def test_shipped_model_cache_holds_every_token_but_the_last(shipped_model, monkeypatch):
    """On text whose end the model drafts (a stop token, or the budget's last token, in a run that commits whole),
    that last draft is verified by the row before it and never fed: the returned cache holds an AR prefill's K/V of
    every token but the last, whichever way the last one committed."""
    from wedlm_hf.data import EVAL_TASK_SEED, FAMILIES, task_items

    model, tokenizer = shipped_model
    questions = [q for family in FAMILIES for q, _ in task_items(family, 4, EVAL_TASK_SEED)]
    budgets = [40] * len(questions) + [5, 9]  # two counting prompts cut by the budget
    questions += questions[:2]
    unfed = count_unfed_ends(monkeypatch)
    for question, budget in zip(questions, budgets):
        ids = tokenizer(question, return_tensors="pt").input_ids
        out = lossless(model, ids, max_new_tokens=budget, return_dict_in_generate=True)
        assert torch.equal(out.sequences, model.generate(ids, max_new_tokens=budget, do_sample=False)), question
        prefill = DynamicCache(config=model.config)
        with torch.no_grad():
            model(out.sequences[:, :-1], **{CACHE_KWARG: prefill})
        for layer_out, layer_ref in zip(out.cache.layers, prefill.layers):
            assert layer_out.keys.shape[2] == out.sequences.shape[1]
            torch.testing.assert_close(layer_out.keys[:, :, :-1], layer_ref.keys, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(layer_out.values[:, :, :-1], layer_ref.values, rtol=1e-4, atol=1e-4)
            assert (layer_out.keys[:, :, -1] == 0).all(), question
    assert sum(unfed) > len(questions) // 2


class RecordingModel(WeDLMForCausalLM):
    """Records what each forward feeds and which logits it asks for."""

    def forward(self, input_ids=None, position_ids=None, logits_to_keep=0, **kwargs):
        self.calls.append((input_ids.clone(), position_ids.clone(), logits_to_keep))
        return super().forward(input_ids=input_ids, position_ids=position_ids, logits_to_keep=logits_to_keep, **kwargs)


def test_logits_only_for_the_verified_run_and_the_masks():
    torch.manual_seed(5)  # a model whose decoding feeds filled slots after a gap at some step (asserted at the end)
    model = RecordingModel(tiny_config(qk_norm=False, attention_bias=True)).to(torch.float64).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
    model.calls = []
    prompt = torch.arange(10, 19)[None]
    # No position penalty: masks further right get filled too, so some steps feed filled slots after a gap.
    settings = dict(wedlm_window_size=16, wedlm_entropy_threshold=0.6, wedlm_pos_penalty_factor=0.0)
    lossless(model, prompt, max_new_tokens=60, eos_token_id=None, **settings)

    def kept(keep, width):  # logits_to_keep: an int keeps the last rows, a tensor names the rows
        return keep.tolist() if isinstance(keep, torch.Tensor) else list(range(width - keep, width))

    ids, _, keep = model.calls[0]
    # First forward: the prompt, then masks; logits for the prompt's last row (AR's first token) and the masks only.
    masks = int((ids[0] == MASK_ID).sum())
    assert kept(keep, ids.shape[1]) == [prompt.shape[1] - 1] + list(range(prompt.shape[1], prompt.shape[1] + masks))
    checked_a_gap = False
    for ids, positions, keep in model.calls[1:]:
        row, pos = ids[0].tolist(), positions[0].tolist()
        n_masks = row.count(MASK_ID)
        filled = len(row) - n_masks
        run = 0  # the leading run: filled slots at consecutive positions right after the committed prefix
        while run < filled and pos[run] == pos[0] + run:
            run += 1
        wanted = list(range(run)) + list(range(len(row) - n_masks, len(row)))
        assert kept(keep, len(row)) == wanted
        checked_a_gap |= run < filled  # filled slots after the run were fed but got no logits
    assert checked_a_gap


@pytest.mark.parametrize("batched", [False, True])
def test_shipped_model_every_family_equals_generate(shipped_model, batched):
    from wedlm_hf.data import EVAL_TASK_SEED, FAMILIES, task_items

    model, tokenizer = shipped_model
    questions = [q for family in FAMILIES for q, _ in task_items(family, 3, EVAL_TASK_SEED)]
    questions.append("def parse_header(line):\n    ")
    tokenizer.padding_side = "left"
    settings = dict(max_new_tokens=40, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    groups = [questions] if batched else [[q] for q in questions]
    for group in groups:
        batch = tokenizer(group, return_tensors="pt", padding=True)
        ar = model.generate(**batch, do_sample=False, **settings)
        out = model.generate(**batch, strategy="wedlm", wedlm_lossless=True, **settings)
        assert torch.equal(out, ar), group


class LastTokenIs(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_user_criteria_stop_like_generate(model64):
    ids, mask = prompts(3)
    free = model64.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, eos_token_id=None)
    token = int(free[1, ids.shape[1] + 5])
    criteria = StoppingCriteriaList([LastTokenIs(token)])
    settings = dict(max_new_tokens=20, eos_token_id=EOS_ID, pad_token_id=EOS_ID, stopping_criteria=criteria)
    ar = model64.generate(ids, attention_mask=mask, do_sample=False, **settings)
    assert torch.equal(lossless(model64, ids, attention_mask=mask, wedlm_window_size=8, **settings), ar)


def test_a_row_whose_drafts_all_fail_feeds_one_row_per_forward(model64, monkeypatch):
    """Every draft (the model's and the context's) is judged wrong: the row rests at an AR step's cost, trying a
    draft again only now and then (each failed try doubles the wait), and still commits AR's tokens."""
    from wedlm_hf.modeling.draft_verification import ArPredictions

    monkeypatch.setattr(ArPredictions, "judge", lambda self, i, draft: self.choices[i])  # greedy: AR's own token
    monkeypatch.setattr(ArPredictions, "held", lambda self, i, tokens: 0)  # the same, for a run of drafts at once
    ids, _ = prompts(1)
    ar = model64.generate(ids, do_sample=False, max_new_tokens=400, eos_token_id=None)
    widths = []
    hook = model64.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        out = lossless(
            model64, ids, max_new_tokens=400, eos_token_id=None, wedlm_window_size=16, return_dict_in_generate=True
        )
    finally:
        hook.remove()
    stats = out.wedlm_stats[0]
    assert torch.equal(out.sequences, ar) and stats.accepted_drafts == 0 and stats.rejected_drafts > 0
    assert stats.forwards <= stats.tokens + 1  # one token a forward, as plain generate
    # Once the window has shrunk (a few forwards), forwards feed one row, the final token, save the rare tries.
    steady = widths[40:]
    assert sum(w == 1 for w in steady) >= 0.9 * len(steady) and sum(steady) <= 1.2 * len(steady), widths


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_context_drafts_commit_repeated_text_in_fewer_forwards(shipped_model, batched):
    """On code that repeats itself, drafts copied from the context are accepted: fewer forwards, the same text."""
    model, tokenizer = shipped_model
    text = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
    texts = [text, "items = [3, 1, 4, 1, 5, 9, 2, 6]\ncopy = [3, 1, 4,"] if batched else [text]
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    settings = dict(max_new_tokens=40, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    ar = model.generate(**batch, do_sample=False, **settings)
    runs = {}
    for context in (True, False):
        out = lossless(
            model,
            batch.input_ids,
            attention_mask=batch.attention_mask,
            wedlm_context_drafts=context,
            return_dict_in_generate=True,
            **settings,
        )
        assert torch.equal(out.sequences, ar)
        runs[context] = out.wedlm_stats
    assert all(s.accepted_context_drafts > 0 for s in runs[True])
    assert all(s.accepted_context_drafts == s.rejected_context_drafts == 0 for s in runs[False])
    assert sum(s.forwards for s in runs[True]) < sum(s.forwards for s in runs[False])
