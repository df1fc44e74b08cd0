"""The KV cache argument and output field follow the installed transformers, without deprecation noise.

transformers 5.24 renamed `past_key_values` to `cache` (forward and generate arguments, output fields) and warns
about the old name: a FutureWarning for arguments, a logger warning for output fields. The suite runs on the oldest
allowed version (5.23, old name) and the newest (5.24+, new name); these tests hold on both.
"""

import inspect
import logging
import warnings

import pytest
import torch
from conftest import MASK_ID, build_model, prompts, tiny_config
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM
from transformers import logging as hf_logging

from wedlm_hf import WeDLMForCausalLM, generate_wedlm
from wedlm_hf.modeling import transformers_versions
from wedlm_hf.modeling.transformers_versions import CACHE_KWARG

OLD = "cache" if CACHE_KWARG == "past_key_values" else "past_key_values"
SHAPE = {
    k: getattr(tiny_config(), k)
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
}


def stock_qwen3() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**SHAPE, vocab_size=96, head_dim=16, max_position_embeddings=512)).eval()


class DeprecationRecorder(logging.Handler):
    """Collects transformers' logger records (its logger does not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def deprecations():
    """A function listing the Python warnings and transformers log records so far that say "deprecated"."""
    logging.Logger.warning_once.cache_clear()  # transformers logs some deprecations once per process
    recorder = DeprecationRecorder()
    logger = hf_logging.get_logger("transformers")
    logger.addHandler(recorder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield lambda: [m for m in [str(w.message) for w in caught] + recorder.messages if "deprecated" in m.lower()]
    logger.removeHandler(recorder)


def test_forward_names_the_cache_as_the_installed_transformers_does():
    stock = set(inspect.signature(Qwen3ForCausalLM.forward).parameters)
    ours = set(inspect.signature(WeDLMForCausalLM.forward).parameters)
    assert CACHE_KWARG in stock and CACHE_KWARG in ours
    assert OLD not in stock and OLD not in ours


def test_our_calls_raise_no_deprecation(deprecations):
    model = build_model()
    ids, mask = prompts(2)
    with torch.no_grad():
        model(ids, attention_mask=mask, use_cache=True)
        model(ids, attention_mask=mask, **{CACHE_KWARG: DynamicCache(config=model.config)})
    model.generate(ids, attention_mask=mask, max_new_tokens=3, return_dict_in_generate=True)
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=5, strategy="wedlm", return_dict_in_generate=True, eos_token_id=None
    )
    assert out.cache.get_seq_length() == out.sequences.shape[1]
    generate_wedlm(stock_qwen3(), ids, attention_mask=mask, mask_token_id=MASK_ID, max_new_tokens=5)
    assert deprecations() == []


@pytest.mark.parametrize("strategy", ["ar", "wedlm"])
def test_generate_takes_the_cache_under_either_name(strategy):
    model = build_model()
    ids, _ = prompts(1)
    kwargs = dict(max_new_tokens=4, strategy=strategy, eos_token_id=None, return_dict_in_generate=True)
    expected = model.generate(ids, **kwargs).sequences
    current = DynamicCache(config=model.config)
    out = model.generate(ids, **kwargs, **{CACHE_KWARG: current})
    assert torch.equal(out.sequences, expected) and out[CACHE_KWARG] is current and current.get_seq_length() > 0

    older = DynamicCache(config=model.config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.generate(ids, **kwargs, **{OLD: older})
    assert torch.equal(out.sequences, expected) and out[CACHE_KWARG] is older and older.get_seq_length() > 0
    deprecated = [w for w in caught if "deprecated" in str(w.message)]
    if CACHE_KWARG == "cache":  # 5.24+: the old name warns, at the caller's line
        assert [(w.category, w.filename) for w in deprecated] == [(FutureWarning, __file__)]
    else:  # 5.23: `cache` is the newer name, accepted as is
        assert deprecated == []


def test_wedlm_output_field_is_the_installed_name_and_cache_reads_it():
    model = build_model()
    ids, _ = prompts(1)
    out = model.generate(ids, max_new_tokens=4, strategy="wedlm", return_dict_in_generate=True)
    assert list(out.keys()) == ["sequences", CACHE_KWARG, "wedlm_stats"]
    assert out.cache is out[CACHE_KWARG]


def test_models_whose_forward_still_says_past_key_values_decode():
    """Remote code written before 5.24 names the cache `past_key_values`; WeDLM decoding passes it that way."""

    class LegacyForCausalLM(Qwen3ForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
            assert past_key_values is not None and "cache" not in kwargs  # the cache arrives under this name only
            return super().forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **{CACHE_KWARG: past_key_values},
                **kwargs,
            )

    stock = stock_qwen3()
    legacy = LegacyForCausalLM(stock.config).eval()
    legacy.load_state_dict(stock.state_dict())
    ids, mask = prompts(2)
    kwargs = dict(attention_mask=mask, mask_token_id=MASK_ID, max_new_tokens=8, eos_token_id=None)
    assert torch.equal(generate_wedlm(legacy, ids, **kwargs), generate_wedlm(stock, ids, **kwargs))


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
