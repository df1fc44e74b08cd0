"""`output_logits` / `output_scores` under strategy="wedlm": the model's exact AR logits at every generated position
(given the committed text), as AR `generate` returns them, computed only when asked."""

import pytest
import torch
from conftest import EOS_ID, build_model, prompts

from wedlm_hf import WeDLMForCausalLM

OUT = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
WEDLM = dict(strategy="wedlm", wedlm_window_size=6, wedlm_entropy_threshold=0.8)
STATIC = [{}, {"cache_implementation": "static"}]


def full_forward_logits(model, ids, mask, sequences):
    """Logits of one uncached forward over the whole output: column T - 1 + i predicts generated token i."""
    full = torch.cat([mask, torch.ones(len(ids), sequences.shape[1] - ids.shape[1], dtype=torch.long)], 1)
    with torch.no_grad():
        logits = model(sequences, attention_mask=full, position_ids=(full.cumsum(-1) - 1).clamp_min(0)).logits
    return logits[:, ids.shape[1] - 1 : -1].float()


@pytest.mark.parametrize("extra", STATIC, ids=["dynamic", "static"])
def test_lossless_greedy_scores_equal_plain_ar(model64, extra):
    ids, mask = prompts(3)
    options = dict(attention_mask=mask, max_new_tokens=25, eos_token_id=None, pad_token_id=EOS_ID, **OUT)
    ar = model64.generate(ids, do_sample=False, **options)
    ours = model64.generate(ids, wedlm_lossless=True, **WEDLM, **options, **extra)
    assert torch.equal(ours.sequences, ar.sequences) and len(ours.logits) == len(ar.logits) == 25
    for name in ("logits", "scores"):
        for a, b in zip(getattr(ours, name), getattr(ar, name)):
            assert a.shape == b.shape and a.dtype == b.dtype == torch.float32
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    transition = model64.compute_transition_scores(ours.sequences, ours.scores, normalize_logits=True)
    reference = model64.compute_transition_scores(ar.sequences, ar.scores, normalize_logits=True)
    torch.testing.assert_close(transition, reference, rtol=0, atol=1e-6)


@pytest.mark.parametrize("extra", STATIC, ids=["dynamic", "static"])
def test_default_mode_logits_are_the_ar_logits_of_each_position(model64, extra):
    """Default mode commits fills AR would not have chosen; each position's logits are still the model's AR logits
    given the committed text before it. Rows that stop early hold zeros past their end, as padded outputs do."""
    ids, mask = prompts(3)
    out = model64.generate(
        ids, attention_mask=mask, max_new_tokens=30, eos_token_id=EOS_ID, pad_token_id=EOS_ID, **WEDLM, **OUT, **extra
    )
    reference = full_forward_logits(model64, ids, mask, out.sequences)
    lengths = [s.tokens for s in out.wedlm_stats]
    assert max(s.tokens / s.forwards for s in out.wedlm_stats) > 1  # several tokens per forward
    for i, step in enumerate(out.logits):
        for b, n in enumerate(lengths):
            if i < n:
                torch.testing.assert_close(step[b], reference[b, i], rtol=0, atol=1e-6)
            else:
                assert not step[b].any()
    assert torch.equal(torch.stack(out.logits), torch.stack(out.scores))  # greedy: nothing processes them


def sampled(model, ids, mask, **extra):
    torch.manual_seed(0)
    options = dict(max_new_tokens=12, do_sample=True, temperature=0.7, top_k=5, eos_token_id=None)
    return model.generate(ids, attention_mask=mask, **options, **WEDLM, **OUT, **extra)


def test_lossless_sampling_scores_are_the_warped_logits(model64):
    """Lossless sampling draws every token from AR's warped distribution at its position: the scores are those."""
    ids, mask = prompts(2)
    out = sampled(model64, ids, mask, wedlm_lossless=True)
    for raw, processed in zip(out.logits, out.scores):
        kept = torch.isfinite(processed)
        assert (kept.sum(-1) == 5).all()
        torch.testing.assert_close(processed[kept], (raw / 0.7)[kept])
        assert (raw.topk(5, dim=-1).values.min(-1).values[:, None] <= raw.masked_fill(~kept, float("inf"))).all()


def test_default_sampling_scores_are_the_distributions_each_token_was_drawn_from(model64, shipped_model):
    """A default-mode token is drawn at its masked slot, from that slot's warped distribution, which can leave out
    AR's top-k at its position: its score is the log of the distribution it was drawn from, so every emitted token
    has a finite score (AR's processed logits gave -inf to such tokens). The logits stay AR's."""
    ids, mask = prompts(2)
    out = sampled(model64, ids, mask)
    reference = full_forward_logits(model64, ids, mask, out.sequences)
    drawn_at_a_slot = 0
    for i, (raw, processed) in enumerate(zip(out.logits, out.scores)):
        torch.testing.assert_close(raw, reference[:, i], rtol=0, atol=1e-6)
        assert (torch.isfinite(processed).sum(-1) == 5).all()  # a top 5: AR's, or the slot's own
        for b in range(2):
            kept = torch.isfinite(processed[b])
            if torch.allclose(processed[b][kept], (raw[b] / 0.7)[kept]):
                continue  # AR's own token (the final token, or a copy AR kept): AR's warped logits
            torch.testing.assert_close(processed[b].exp().sum(), torch.tensor(1.0))  # a distribution drawn from
            drawn_at_a_slot += 1
    assert drawn_at_a_slot  # the test saw fills drawn at their slots
    transition = model64.compute_transition_scores(out.sequences, out.scores)
    assert torch.isfinite(transition).all()
    model, tokenizer = shipped_model  # where AR's top-k often leaves out the emitted token
    inputs = tokenizer(["def parse(text):", "count from 3 by 4:"], return_tensors="pt", padding=True)
    for seed in range(6):
        torch.manual_seed(seed)
        out = model.generate(
            **inputs, strategy="wedlm", max_new_tokens=24, do_sample=True, top_k=8, eos_token_id=None, **OUT
        )
        assert torch.isfinite(model.compute_transition_scores(out.sequences, out.scores)).all()


class CountingModel(WeDLMForCausalLM):
    """Counts the logits rows each forward asks for."""

    def forward(self, *args, logits_to_keep=0, **kwargs):
        self.kept += len(logits_to_keep) if isinstance(logits_to_keep, torch.Tensor) else logits_to_keep
        return super().forward(*args, logits_to_keep=logits_to_keep, **kwargs)


def test_run_rows_are_computed_only_when_asked():
    source = build_model()
    model = CountingModel(source.config).to(torch.float64).eval()
    model.load_state_dict(source.state_dict())
    ids, mask = prompts(2)
    kept = []
    for asked in (False, True):
        model.kept = 0
        options = dict(return_dict_in_generate=True, output_logits=True) if asked else {}
        model.generate(  # (the paper's rule: drafting from the context, AR's token needs the run's rows anyway)
            ids,
            attention_mask=mask,
            max_new_tokens=20,
            eos_token_id=None,
            wedlm_context_drafts=False,
            **WEDLM,
            **options,
        )
        kept.append(model.kept)
    assert kept[0] < kept[1]
