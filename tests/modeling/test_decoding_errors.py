"""Every input generate(strategy="wedlm") cannot honour fails with an error naming the argument and the fix."""

import pytest
import torch
from conftest import build_model, prompts
from transformers import (
    DynamicCache,
    GenerationConfig,
    LogitsProcessorList,
    TextStreamer,
    TopKLogitsWarper,
)

from wedlm_hf.modeling.transformers_versions import CACHE_KWARG


def wedlm(model, ids, **kwargs):
    kwargs.setdefault("max_new_tokens", 8)
    return model.generate(ids, strategy="wedlm", **kwargs)


@pytest.fixture(scope="module")
def ids():
    return prompts(1)[0]


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"wedlm_window_size": 0}, "wedlm_window_size must be an integer >= 1"),
        ({"wedlm_window_size": 2.5}, "wedlm_window_size must be an integer >= 1"),
        ({"wedlm_window_size": True}, "wedlm_window_size must be an integer >= 1"),
        ({"wedlm_entropy_threshold": -0.1}, r"wedlm_entropy_threshold must be a number >= 0 .* or None"),
        ({"wedlm_pos_penalty_factor": -1.0}, "wedlm_pos_penalty_factor must be a finite number >= 0"),
        ({"wedlm_entropy_threshold": float("nan")}, r"wedlm_entropy_threshold must be a number >= 0 .* got nan"),
        ({"wedlm_pos_penalty_factor": float("nan")}, "wedlm_pos_penalty_factor must be a finite number >= 0"),
        ({"wedlm_pos_penalty_factor": float("inf")}, "wedlm_pos_penalty_factor must be a finite number >= 0"),
        ({"wedlm_lossless": "yes"}, "wedlm_lossless must be a boolean"),
        ({"max_new_tokens": 2.5}, r"max_new_tokens must be a whole number of tokens, got 2.5"),
        ({"max_length": 20.0}, r"max_length must be a whole number of tokens, got 20.0"),
        ({"cache": DynamicCache(), "past_key_values": DynamicCache()}, "Pass the cache once"),
        ({"wedlm_windowsize": 4}, "wedlm_windowsize: unknown WeDLM option; known: wedlm_window_size"),
        ({"num_beams": 2}, "num_beams=2: beam search is unsupported; set num_beams=1"),
        ({"use_cache": False}, "use_cache=False: WeDLM decoding is built on the KV cache"),
        ({"cache_implementation": "offloaded"}, "cache_implementation='offloaded'"),
        ({"output_attentions": True}, "does not accept output_attentions"),
        ({"max_new_tokens": 600}, r"exceeds the model's max_position_embeddings \(512\): lower max_new_tokens"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"foo": 1}, "does not accept foo: not supported by strategy='wedlm'"),
        ({"synced_gpus": True}, "synced_gpus"),
        ({"prefix_allowed_tokens_fn": lambda b, s: [1]}, "prefix_allowed_tokens_fn"),
    ],
)
def test_bad_arguments(model64, ids, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        wedlm(model64, ids, **kwargs)


def test_assistant_model_is_refused(model64, ids):
    with pytest.raises(ValueError, match="assistant_model: assisted decoding"):
        wedlm(model64, ids, assistant_model=model64)


def test_a_score_only_processor_is_honoured(model64, ids):
    """Top-1 sampling is greedy decoding (processors that read the context: test_context_processors.py)."""
    greedy = wedlm(model64, ids, eos_token_id=None)
    out = wedlm(
        model64, ids, eos_token_id=None, do_sample=True, logits_processor=LogitsProcessorList([TopKLogitsWarper(1)])
    )
    assert torch.equal(out, greedy)


def test_missing_mask_token_says_how_to_set_it(ids):
    model = build_model(mask_token_id=None)
    with pytest.raises(ValueError, match=r"mask_token_id=.*model.config.mask_token_id .*151665.*tokenizer"):
        wedlm(model, ids)
    out = wedlm(model, ids, mask_token_id=95, eos_token_id=None)  # explicit argument resolves it
    assert out.shape[1] == ids.shape[1] + 8


def test_mask_token_outside_vocab(model64, ids):
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        wedlm(model64, ids, mask_token_id=10_000)


def test_right_padding_is_refused(model64):
    ids, mask = prompts(2)
    right_ids, right_mask = ids.flip(1), mask.flip(1)
    with pytest.raises(ValueError, match="left-padded.*padding_side = 'left'"):
        wedlm(model64, right_ids, attention_mask=right_mask)
    empty = mask.clone()
    empty[0] = 0
    with pytest.raises(ValueError, match="at least one token"):
        wedlm(model64, ids, attention_mask=empty)


def test_unknown_strategy(model64, ids):
    with pytest.raises(ValueError, match=r"Unknown strategy 'diffusion': use strategy='ar' .* or strategy='wedlm'"):
        model64.generate(ids, strategy="diffusion", max_new_tokens=4)
    config = GenerationConfig(max_new_tokens=4)
    config.strategy = "fast"
    with pytest.raises(ValueError, match='generation_config.json, set its "strategy" entry'):
        model64.generate(ids, generation_config=config)


def test_wedlm_options_without_the_strategy(model64, ids):
    with pytest.raises(ValueError, match=r"\['wedlm_window_size'\] only apply to WeDLM decoding.*strategy='wedlm'"):
        model64.generate(ids, wedlm_window_size=4, max_new_tokens=4)


def test_streamer_needs_batch_one(model64, char_tokenizer):
    ids, mask = prompts(2)
    with pytest.raises(ValueError, match="streamer.*batch size 1"):
        wedlm(model64, ids, attention_mask=mask, streamer=TextStreamer(char_tokenizer))


def test_inputs_embeds_and_missing_prompt(model64):
    with pytest.raises(ValueError, match="inputs_embeds"):
        model64.generate(strategy="wedlm", inputs_embeds=torch.zeros(1, 3, 64))
    with pytest.raises(ValueError, match="needs a prompt: pass input_ids"):
        model64.generate(strategy="wedlm", max_new_tokens=3)


def test_sliding_window_models_are_refused(ids):
    model = build_model(use_sliding_window=True, sliding_window=8, max_window_layers=0)
    with pytest.raises(ValueError, match="sliding-window.*use_sliding_window=False"):
        wedlm(model, ids)


def prefill(model, ids, n):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :n], **{CACHE_KWARG: cache})
    return cache


# What the prompt cache's model differs in (the device: K/V moved there), and what the error then says.
CACHE_MISMATCHES = {
    "kv-heads": ({"num_key_value_heads": 4}, r"4, head_dim 16, torch.float64 on cpu, .* 2, head_dim 16,"),
    "head-dim": ({"head_dim": 32}, r"2, head_dim 32, torch.float64 on cpu, .* 2, head_dim 16,"),
    "dtype": ({"dtype": torch.float32}, r"2, head_dim 16, torch.float32 on cpu, .*torch.float64 on cpu"),
    "device": ({"device": "meta"}, r"2, head_dim 16, torch.float64 on meta, .*torch.float64 on cpu"),
}


@pytest.mark.parametrize("mismatch", list(CACHE_MISMATCHES))
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_prompt_cache_of_another_model(model64, ids, mismatch, static):
    """A cache prefilled by a model of other sizes, dtype or device would fail inside attention (or, in a lower
    precision, silently change the output): refused up front with what the cache holds and what the model needs."""
    overrides, pattern = CACHE_MISMATCHES[mismatch]
    overrides = dict(overrides)
    device = overrides.pop("device", None)
    cache = prefill(build_model(**overrides), ids, 4)
    if device is not None:
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.to(device), layer.values.to(device)
    settings = {"cache_implementation": "static"} if static else {}
    expected = rf"`{CACHE_KWARG}`\) holds K/V of num_key_value_heads {pattern}.*prefill the cache with this model"
    with pytest.raises(ValueError, match=expected):
        wedlm(model64, ids, **settings, **{CACHE_KWARG: cache})


def test_input_ids_outside_the_vocabulary(model64, ids):
    cases = [
        (ids.float(), r"input_ids must be an integer tensor of token ids, got torch.float32: .*\.long\(\)"),
        (ids.bool(), "input_ids must be an integer tensor of token ids, got torch.bool"),
        (torch.cat([ids, torch.tensor([[500, 96, 96]])], 1), r"input_ids holds token ids 96, 500 outside 0\.\.95"),
        (torch.cat([torch.tensor([[-3]]), ids], 1), r"input_ids holds token ids -3 outside 0\.\.95 .*tokenizer"),
    ]
    for bad, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            wedlm(model64, bad)
    # Padding columns are not fed: only the ids under attention_mask are checked.
    padded, mask = prompts(2)
    padded[mask == 0] = -1
    assert wedlm(model64, padded, attention_mask=mask, pad_token_id=94).shape == (2, padded.shape[1] + 8)
