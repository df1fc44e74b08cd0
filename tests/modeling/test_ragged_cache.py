"""`RaggedCache`, the dynamic decoding cache: its holes stay bounded, its step mask is transformers' own, and a row
leaving takes its K/V with it."""

import inspect

import torch
from conftest import prompts
from transformers.masking_utils import create_causal_mask

from wedlm_hf.modeling import ragged_cache

# create_causal_mask's name for the cache (renamed in transformers 5.24, as generate's was)
MASK_CACHE_KWARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def test_dead_slots_stay_bounded(model64, monkeypatch):
    """Rows committing different counts leave holes; compaction keeps them under the bound at every step."""
    seen = []
    original = ragged_cache.RaggedCache.compact_if_needed

    def watch(self):
        assert self.counts == self.valid.sum(1).tolist()  # the host's count of valid columns is the cache's
        result = original(self)
        seen.append((self.dead_columns(), self.max_dead, result))
        return result

    monkeypatch.setattr(ragged_cache.RaggedCache, "compact_if_needed", watch)
    ids, mask = prompts(4, lengths=(3, 17, 9, 12))
    model64.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=80,
        strategy="wedlm",
        wedlm_window_size=4,
        wedlm_entropy_threshold=1.2,
        eos_token_id=None,
    )
    assert seen and all(dead <= bound for dead, bound, _ in seen)
    assert any(compacted for _, _, compacted in seen), "the scenario should force at least one compaction"


def test_step_mask_is_the_mask_transformers_builds(model64):
    """Under sdpa a step on top of the cache passes its own 4D mask; it equals the one transformers builds from the
    2D validity mask, holes and left padding included (so the logits cannot differ)."""
    assert model64.config._attn_implementation == "sdpa"
    ids, mask = prompts(3)
    kv = ragged_cache.RaggedCache(model64, 3, max_dead=16)
    width = ids.shape[1]
    kv.forward(ids, (mask.cumsum(1) - 1).clamp_min(0), mask.bool(), [width - 1])
    kv.keep_leading(width, [width] * 3)
    kv.valid[1, 2] = False  # a hole, as a rejected draft leaves
    new_valid = torch.tensor([[True] * 5, [True, True, False, True, True], [True, False, False, False, False]])
    valid = torch.cat([kv.valid, new_valid], dim=1)
    ours = kv._attention_mask(valid, 5)
    theirs = create_causal_mask(
        config=model64.config,
        inputs_embeds=torch.zeros(3, 5, model64.config.hidden_size, dtype=model64.dtype),
        attention_mask=valid.long(),
        **{MASK_CACHE_KWARG: kv.cache},
        position_ids=torch.arange(width, width + 5).expand(3, -1),
    )
    assert ours.shape == (3, 1, 5, width + 5) and ours.dtype == torch.bool
    assert torch.equal(ours, theirs.expand_as(ours))
    assert not ours[0, 0, 0, width + 1] and ours[0, 0, 1, width + 1]  # a fed token sees the fed ones before it
    # One fed token a row (an AR step, or a lossless row at rest): it sees every valid column, holes excluded.
    valid = torch.cat([kv.valid, torch.ones(3, 1, dtype=torch.bool)], dim=1)
    ours = kv._attention_mask(valid, 1)
    theirs = create_causal_mask(
        config=model64.config,
        inputs_embeds=torch.zeros(3, 1, model64.config.hidden_size, dtype=model64.dtype),
        attention_mask=valid.long(),
        **{MASK_CACHE_KWARG: kv.cache},
        position_ids=torch.full((3, 1), width),
    )
    assert ours.shape == (3, 1, 1, width + 1) and ours.dtype == torch.bool
    assert torch.equal(ours, theirs.expand_as(ours)) and not ours[1, 0, 0, 2]


@torch.no_grad()
def test_one_token_a_row_on_a_cache_without_holes_takes_no_mask(model64, monkeypatch):
    """AR's step: one real token a row on top of columns all valid attends to every key, so it is run without a
    mask (sdpa's faster kernel), with the logits the mask gives; a hole, or a row that feeds padding, brings the
    mask back."""
    seen = []
    forward = model64.forward

    def watch(*args, **kwargs):
        seen.append(kwargs["attention_mask"])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model64, "forward", watch)
    ids, mask = prompts(2, lengths=(6, 6))
    caches = [ragged_cache.RaggedCache(model64, 2, max_dead=16) for _ in range(2)]
    for kv in caches:
        kv.forward(ids, torch.arange(6).expand(2, -1), mask.bool(), [5], counts=[6, 6])
        kv.keep_leading(6, [6, 6])
    step = (torch.tensor([[7], [8]]), torch.full((2, 1), 6), torch.ones(2, 1, dtype=torch.bool), [0])
    dense = caches[0].forward(*step, counts=[1, 1])
    assert seen[-1] is None
    masked = caches[1].forward(*step)  # no counts: the mask
    assert seen[-1] is not None and torch.allclose(dense, masked, atol=1e-6)
    kv = caches[0]
    kv.keep_leading(1, [1, 1])
    kv.forward(*step, counts=[1, 0])  # a row that feeds only padding
    assert seen[-1] is not None
    kv.keep_leading(1, [1, 0])  # its column is a hole now
    kv.forward(*step, counts=[1, 1])
    assert seen[-1] is not None


def test_remote_code_models_keep_the_2d_mask():
    """A model class from outside transformers (remote code) may build its masks from the 2D mask itself: it gets
    that; a stock class gets the 4D mask under sdpa."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    class RemoteCausalLM(Qwen3ForCausalLM):
        pass

    config = Qwen3Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        attn_implementation="sdpa",
    )
    valid = torch.ones(1, 6, dtype=torch.bool)
    for cls, dims in ((Qwen3ForCausalLM, 4), (RemoteCausalLM, 2)):
        kv = ragged_cache.RaggedCache(cls(config).eval(), 1, max_dead=16)
        kv.valid = torch.ones(1, 4, dtype=torch.bool)  # as after a prefill of 4 tokens
        assert kv._attention_mask(valid, 2).dim() == dims, cls


def test_leaving_rows_of_a_batch_take_copies(model64):
    """A row leaving a batch takes a copy of its K/V, not a view that would keep the whole batch's cache alive after
    the others move on; a lone row (its cache is its own) takes views."""
    for batch in (1, 2):
        ids, mask = prompts(batch, lengths=(6, 6))
        kv = ragged_cache.RaggedCache(model64, batch, max_dead=16)
        kv.forward(ids, (mask.cumsum(1) - 1).clamp_min(0), mask.bool(), [ids.shape[1] - 1])
        shared = [
            k.untyped_storage().data_ptr() == layer.keys.untyped_storage().data_ptr()
            for (k, _), layer in zip(kv.row_kv(0), kv.cache.layers)
        ]
        assert all(shared) if batch == 1 else not any(shared), batch
