"""WeDLM decoding equals the slow no-cache reference token for token (greedy, float64), single and batched: the
paper's rule (`wedlm_context_drafts=False`) and the default mode that drafts from the context (section 3.m)."""

import pytest
import torch
from conftest import EOS_ID, MASK_ID, build_model, prompts
from reference_wedlm import reference_decode

SETTINGS = [
    # (window, threshold, penalty)
    (4, 0.5, 0.0),
    (16, 0.4, 0.02),
    (6, None, 0.1),
    (3, 1.0, 0.1),
    (8, 100.0, 0.0),
    (1, 0.4, 0.02),
]


def run(model, ids, mask, window, threshold, penalty, max_new, eos=EOS_ID, context=False):
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max_new,
        strategy="wedlm",
        wedlm_window_size=window,
        wedlm_entropy_threshold=threshold,
        wedlm_pos_penalty_factor=penalty,
        eos_token_id=eos,
        pad_token_id=EOS_ID,
        return_dict_in_generate=True,
        wedlm_context_drafts=context,
    )


@pytest.mark.parametrize("context", [False, True], ids=["paper", "context-drafts"])
@pytest.mark.parametrize("window,threshold,penalty", SETTINGS)
def test_batched_rows_equal_reference(model64, window, threshold, penalty, context):
    ids, mask = prompts(4)
    out = run(model64, ids, mask, window, threshold, penalty, max_new=20, context=context)
    width = ids.shape[1]
    for b in range(4):
        prompt = ids[b][mask[b].bool()].tolist()
        expected, forwards = reference_decode(
            model64, prompt, MASK_ID, window, threshold, penalty, 20, (EOS_ID,), context_drafts=context
        )
        row = out.sequences[b, width:].tolist()
        assert row[: len(expected)] == expected
        assert row[len(expected) :] == [EOS_ID] * (len(row) - len(expected))
        assert out.wedlm_stats[b].forwards == forwards
        assert out.wedlm_stats[b].tokens == len(expected)


def test_several_fills_per_forward_happen(model64):
    """The settings above must exercise parallel filling, or the comparison would only test AR-like decoding."""
    ids, mask = prompts(4)
    out = run(model64, ids, mask, 16, 1.0, 0.0, max_new=20, eos=None)
    assert max(s.tokens_per_forward for s in out.wedlm_stats) > 1.5


def test_qwen2_flavour_equals_reference():
    model = build_model(seed=3, qk_norm=False, attention_bias=True)
    ids, mask = prompts(2)
    out = run(model, ids, mask, 5, 0.8, 0.05, max_new=16)
    for b in range(2):
        prompt = ids[b][mask[b].bool()].tolist()
        expected, _ = reference_decode(model, prompt, MASK_ID, 5, 0.8, 0.05, 16, (EOS_ID,))
        assert out.sequences[b, ids.shape[1] :].tolist()[: len(expected)] == expected


def test_eager_attention_equals_reference():
    """Single rows in float64 (eager softmax runs in float32, so left-padded float64 rows would read -inf)."""
    eager = build_model(seed=4)
    eager.set_attn_implementation("eager")
    assert eager.config._attn_implementation == "eager"
    ids, mask = prompts(3)
    for b in range(3):
        prompt = ids[b][mask[b].bool()]
        out = run(eager, prompt[None], None, 6, 0.8, 0.02, max_new=18)
        expected, _ = reference_decode(eager, prompt.tolist(), MASK_ID, 6, 0.8, 0.02, 18, (EOS_ID,))
        assert out.sequences[0, len(prompt) :].tolist() == expected


def test_eager_equals_sdpa_batched_float32():
    sdpa = build_model(seed=4, dtype=torch.float32)
    eager = build_model(seed=4, dtype=torch.float32)
    eager.set_attn_implementation("eager")
    ids, mask = prompts(3)
    a = run(sdpa, ids, mask, 6, 0.8, 0.02, max_new=18).sequences
    b = run(eager, ids, mask, 6, 0.8, 0.02, max_new=18).sequences
    assert torch.equal(a, b)


def test_each_row_equals_running_it_alone(model64):
    ids, mask = prompts(4)
    batched = run(model64, ids, mask, 8, 0.8, 0.02, max_new=20)
    for b in range(4):
        single_ids = ids[b : b + 1, mask[b].argmax() :]
        alone = run(model64, single_ids, None, 8, 0.8, 0.02, max_new=20)
        n = alone.sequences.shape[1] - single_ids.shape[1]
        assert (
            batched.sequences[b, ids.shape[1] : ids.shape[1] + n].tolist()
            == alone.sequences[0, single_ids.shape[1] :].tolist()
        )
        assert batched.wedlm_stats[b] == alone.wedlm_stats[0]


def test_context_drafts_are_checked_and_kept_in_the_comparisons(model64):
    """The random model's copies are both kept and rejected under the settings above, so the comparison with the
    reference covers the copy rule, not only AR's token and the fills."""
    ids, mask = prompts(4)
    accepted = rejected = 0
    for window, threshold, penalty in SETTINGS:
        for stats in run(model64, ids, mask, window, threshold, penalty, max_new=20, context=True).wedlm_stats:
            accepted += stats.accepted_context_drafts
            rejected += stats.rejected_context_drafts
    assert accepted > 5 and rejected > 5


@pytest.fixture(scope="module")
def shipped64():
    from transformers import AutoTokenizer

    from wedlm_hf import WeDLMForCausalLM, default_model_path

    path = default_model_path()
    model = WeDLMForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    return model, AutoTokenizer.from_pretrained(path)


def test_the_shipped_model_on_each_family_and_code_equals_reference(shipped64):
    """Real text: the task families (whose answers the model's fills write) and code, where copies from the
    context hold."""
    from wedlm_hf.data import EVAL_TASK_SEED, FAMILIES, task_items
    from wedlm_hf.evaluation.evaluate import code_snippets

    model, tokenizer = shipped64
    prompts_ = [tokenizer(task_items(family, 1, EVAL_TASK_SEED)[0][0]).input_ids for family in FAMILIES]
    prompts_ += code_snippets(tokenizer, 3, 96, seed=0)
    eos, copied = tokenizer.eos_token_id, 0
    for prompt in prompts_:
        out = model.generate(
            torch.tensor([prompt]), strategy="wedlm", max_new_tokens=48, eos_token_id=eos, pad_token_id=eos,
            return_dict_in_generate=True,
        )  # fmt: skip
        expected, forwards = reference_decode(
            model, prompt, model.config.mask_token_id, 16, 0.4, 0.02, 48, (eos,), True
        )
        assert out.sequences[0, len(prompt) :].tolist()[: len(expected)] == expected, tokenizer.decode(prompt)
        assert out.wedlm_stats[0].forwards == forwards
        copied += out.wedlm_stats[0].accepted_context_drafts
    assert copied > 5
