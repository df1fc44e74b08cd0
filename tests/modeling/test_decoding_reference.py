"""WeDLM decoding equals the slow no-cache reference token for token (greedy, float64), single and batched."""

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


def run(model, ids, mask, window, threshold, penalty, max_new, eos=EOS_ID):
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
    )


@pytest.mark.parametrize("window,threshold,penalty", SETTINGS)
def test_batched_rows_equal_reference(model64, window, threshold, penalty):
    ids, mask = prompts(4)
    out = run(model64, ids, mask, window, threshold, penalty, max_new=20)
    width = ids.shape[1]
    for b in range(4):
        prompt = ids[b][mask[b].bool()].tolist()
        expected, forwards = reference_decode(model64, prompt, MASK_ID, window, threshold, penalty, 20, (EOS_ID,))
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
