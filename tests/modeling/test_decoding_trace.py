"""The worked trace of docs/algorithm.md section 3.g (the paper's rule), replayed with scripted confidences; what each
forward is fed."""

import torch
from conftest import MASK_ID, tiny_config

from wedlm_hf import WeDLMForCausalLM
from wedlm_hf.modeling.transformers_versions import CACHE_KWARG


class ScriptedModel(WeDLMForCausalLM):
    """A real tiny model (so the cache behaves) whose mask logits are replaced by a script.

    script[forward_index][logical_position] = token: that mask is certain (entropy ~0); every other mask is
    uniform (entropy log(vocab - 1)). Records each forward's input ids, positions and logits_to_keep.
    """

    def setup(self, script):
        self.script, self.calls = script, []
        return self

    def forward(self, input_ids=None, position_ids=None, logits_to_keep=0, **kwargs):
        out = super().forward(input_ids=input_ids, position_ids=position_ids, logits_to_keep=logits_to_keep, **kwargs)
        self.calls.append((input_ids.tolist(), position_ids.tolist(), logits_to_keep))
        step = len(self.calls) - 1  # call 0 is step 1, with the prompt prefilled in front of its masks
        logits = torch.zeros_like(out.logits)
        kept_positions = position_ids[:, -logits.shape[1] :]
        for b in range(logits.shape[0]):
            for i, p in enumerate(kept_positions[b].tolist()):
                token = self.script.get(step, {}).get(p)
                if token is not None:
                    logits[b, i, token] = 100.0
        out.logits = logits
        return out


def test_worked_trace_w4():
    torch.manual_seed(0)
    model = ScriptedModel(tiny_config()).eval()
    a, b, c = 11, 12, 13
    model.setup({0: {10: a, 12: c}, 1: {11: b}})
    prompt = torch.arange(20, 30)[None]  # length 10
    out = model.generate(
        prompt,
        max_new_tokens=5,
        strategy="wedlm",
        wedlm_context_drafts=False,  # the paper's rule, as section 3.g traces it
        wedlm_window_size=4,
        wedlm_entropy_threshold=0.5,
        wedlm_pos_penalty_factor=0.0,
        return_dict_in_generate=True,
    )
    step1, step2, step3 = model.calls[:3]
    # Step 1 feeds M10 M11 M12 M13 (after the prompt it prefills) and fills offsets 0 and 2 (a, c).
    assert step1[0] == [list(range(20, 30)) + [MASK_ID] * 4] and step1[1] == [list(range(14))]
    assert step1[2] == 4  # logits for the 4 masks only; the prompt's are never computed
    # Step 2: L=1, window [a M c M M] fed as a@10 c@12 M@11 M@13 M@14; logits only for the 3 masks.
    assert step2[0] == [[a, c, MASK_ID, MASK_ID, MASK_ID]] and step2[1] == [[10, 12, 11, 13, 14]]
    assert step2[2] == 3
    # Step 3 feeds b@11 c@12 M@13..M@16 would follow, but the budget (10 + 5) caps the window at position 14.
    assert step3[0][0][:2] == [b, c] and step3[1][0][:2] == [11, 12]
    assert step3[1] == [[11, 12, 13, 14]]
    assert out.sequences[0, 10:13].tolist() == [a, b, c]
    assert out.sequences.shape[1] == 15


def test_step3_without_budget_limit_feeds_four_new_masks():
    torch.manual_seed(0)
    model = ScriptedModel(tiny_config()).eval()
    a, b, c = 11, 12, 13
    model.setup({0: {10: a, 12: c}, 1: {11: b}})
    model.generate(
        torch.arange(20, 30)[None],
        max_new_tokens=40,
        strategy="wedlm",
        wedlm_context_drafts=False,  # the paper's rule, as section 3.g traces it
        wedlm_window_size=4,
        wedlm_entropy_threshold=0.5,
        wedlm_pos_penalty_factor=0.0,
    )
    step3 = model.calls[2]
    assert step3[0] == [[b, c] + [MASK_ID] * 4]
    assert step3[1] == [[11, 12, 13, 14, 15, 16]]


def test_fallback_fills_single_leftmost_mask_on_ties():
    """No mask under the threshold: exactly one is filled, the leftmost among equal entropies."""
    torch.manual_seed(0)
    model = ScriptedModel(tiny_config()).eval().setup({})
    model.generate(
        torch.arange(20, 26)[None],
        max_new_tokens=3,
        strategy="wedlm",
        wedlm_context_drafts=False,  # the paper's rule, as section 3.g traces it
        wedlm_window_size=3,
        wedlm_entropy_threshold=0.4,
        wedlm_pos_penalty_factor=0.0,
    )
    # Uniform logits everywhere: each step fills one mask, the leftmost; one token commits per forward after the first.
    fed_positions = [call[1][0] for call in model.calls]
    assert fed_positions[0] == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert fed_positions[1] == [6, 7, 8]  # slot 6 filled, fed first; 7 and 8 still masks
    assert fed_positions[2] == [7, 8]  # 6 committed; the budget (6 + 3) allows no new slot


def test_distance_penalty_prefers_near_masks():
    """Equal raw entropies: the penalty makes only the leftmost mask pass a threshold between the two values."""
    torch.manual_seed(0)
    model = ScriptedModel(tiny_config()).eval()
    certain = {p: 7 for p in range(6, 10)}
    model.setup({0: certain})
    model.generate(
        torch.arange(20, 26)[None],
        max_new_tokens=4,
        strategy="wedlm",
        wedlm_context_drafts=False,  # the paper's rule, as section 3.g traces it
        wedlm_window_size=4,
        wedlm_entropy_threshold=0.05,
        wedlm_pos_penalty_factor=0.1,
    )
    # All four masks are certain (entropy 0), adjusted 0, 0.1, 0.2, 0.3: only the first passes 0.05.
    # The budget (6 + 4) allows no new slot, so step 2 feeds the filled slot and the three other masks.
    step2 = model.calls[1]
    assert step2[0] == [[7] + [MASK_ID] * 3] and step2[1] == [[6, 7, 8, 9]]


class Recorder(WeDLMForCausalLM):
    """A real model that records what each forward is fed and how many logits rows it computes."""

    def forward(self, input_ids=None, logits_to_keep=0, **kwargs):
        self.calls.append((input_ids[0].tolist(), logits_to_keep, kwargs[CACHE_KWARG].get_seq_length()))
        return super().forward(input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs)


def test_prompt_is_encoded_once_and_each_forward_feeds_only_the_window():
    torch.manual_seed(0)
    model = Recorder(tiny_config()).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(50)
    model.calls = []
    prompt = torch.arange(20, 32)[None]
    out = model.generate(
        prompt,
        max_new_tokens=40,
        strategy="wedlm",
        wedlm_context_drafts=False,  # the paper's rule, as section 3.g traces it
        wedlm_window_size=6,
        wedlm_entropy_threshold=1.0,
        return_dict_in_generate=True,
    )
    (first, first_keep, cached_before), *steps = model.calls
    # The prompt is fed once, in the first forward, followed by its 6 masks; nothing is cached before it.
    assert first == prompt[0].tolist() + [MASK_ID] * 6 and first_keep == 6 and cached_before == 0
    cached = [c for _, _, c in steps]
    assert cached[0] == 12 and cached == sorted(cached)
    # The returned cache has the K/V of every token but those that ended the text without a forward (at most a
    # window's): after the last forward the cache holds what the zero columns leave out.
    computed = int((out.cache.layers[0].keys[0] != 0).any(-1).any(0).sum())
    assert 52 - 6 <= computed < 52
    for (fed, keep, before), after in zip(steps, cached[1:] + [computed]):
        masks = fed.count(MASK_ID)
        assert len(fed) <= 2 * 6  # the window only (W + L rows at most), on top of the cache
        assert keep == max(masks, 1) and fed[len(fed) - masks :] == [MASK_ID] * masks  # logits for mask rows only
        assert after - before <= len(fed) - masks  # the cache grows only by committed (filled) tokens
    assert len(model.calls) == out.wedlm_stats[0].forwards and out.sequences.shape[1] == 52
