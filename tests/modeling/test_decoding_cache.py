"""The KV cache after WeDLM decoding is an AR prefill of the output, and it never carries many dead slots."""

import inspect

import pytest
import torch
from conftest import EOS_ID, prompts
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask

from wedlm_hf.modeling import ragged_cache, transformers_versions
from wedlm_hf.modeling.transformers_versions import CACHE_KWARG

# create_causal_mask's name for the cache (renamed in transformers 5.24, as generate's was)
MASK_CACHE_KWARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


@pytest.mark.parametrize("batch", [1, 3])  # one padding-free row takes its own path
def test_final_cache_equals_ar_prefill_of_output(model64, batch):
    ids, mask = prompts(batch)
    out = model64.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=20,
        strategy="wedlm",
        wedlm_window_size=6,
        wedlm_entropy_threshold=0.8,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        return_dict_in_generate=True,
    )
    seq = out.sequences
    width = ids.shape[1]
    full_mask = torch.zeros_like(seq)
    for b in range(batch):
        n_new = out.wedlm_stats[b].tokens
        full_mask[b, : width + n_new] = torch.cat([mask[b], torch.ones(n_new, dtype=torch.long)])
    prefill = DynamicCache(config=model64.config)
    positions = (full_mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        model64(seq, attention_mask=full_mask, position_ids=positions, **{CACHE_KWARG: prefill})
    assert out.cache.get_seq_length() == seq.shape[1]
    for b in range(batch):
        # The tokens that end a row commit without a forward (its last run, at most a window) and have no K/V.
        computed = (out.cache.layers[0].keys[b] != 0).any(-1).any(0)
        real = full_mask[b].bool()
        held = computed[real].tolist()
        n = held.count(True)
        assert held == [True] * n + [False] * (len(held) - n) and 1 <= len(held) - n <= 6
        cols = real & computed
        for layer_out, layer_ref in zip(out.cache.layers, prefill.layers):
            torch.testing.assert_close(layer_out.keys[b][:, cols], layer_ref.keys[b][:, cols], rtol=0, atol=1e-10)
            torch.testing.assert_close(layer_out.values[b][:, cols], layer_ref.values[b][:, cols], rtol=0, atol=1e-10)
            assert (layer_out.keys[b][:, ~cols] == 0).all()


def test_user_cache_is_filled_and_returned(model64):
    ids, _ = prompts(1)
    cache = DynamicCache(config=model64.config)
    out = model64.generate(ids, max_new_tokens=8, strategy="wedlm", cache=cache, return_dict_in_generate=True)
    assert out.cache is cache and cache.get_seq_length() == out.sequences.shape[1]


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


def test_forward_arguments_follow_the_forward_in_use(model64, monkeypatch):
    """The cache argument's name and `logits_to_keep` are read from the forward the model runs now (a compiled or
    wrapped forward swapped onto the instance is read anew), once per forward function."""
    assert transformers_versions.forward_arguments(model64) == (CACHE_KWARG, True)
    reads = []
    signature = inspect.signature
    monkeypatch.setattr(transformers_versions.inspect, "signature", lambda f: reads.append(f) or signature(f))

    def wrapped(input_ids=None, past_key_values=None, **kwargs):
        return type(model64).forward(model64, input_ids=input_ids, **{CACHE_KWARG: past_key_values}, **kwargs)

    monkeypatch.setattr(model64, "forward", wrapped)
    assert transformers_versions.forward_arguments(model64) == ("past_key_values", False)
    assert transformers_versions.forward_arguments(model64) == ("past_key_values", False)
    assert len(reads) == 1
    monkeypatch.undo()
    assert transformers_versions.forward_arguments(model64) == (CACHE_KWARG, True)
