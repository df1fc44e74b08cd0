"""WeDLM decoding on a static cache (`cache_implementation="static"`, a `StaticCache`): the eager DynamicCache path's
tokens, stats and returned cache, on a handful of shapes, so that a compiled forward compiles a handful of times."""

import json

import pytest
import torch
from conftest import (
    EOS_ID,
    MASK_ID,
    REMOTE_GENERATE,
    WEDLM_COMMON,
    build_model,
    peaky,
    prompts,
    run_without_wedlm_hf,
    tiny_config,
)
from torch._dynamo.testing import CompileCounter
from transformers import (
    CompileConfig,
    DynamicCache,
    Qwen3Config,
    Qwen3ForCausalLM,
    StaticCache,
    StoppingCriteria,
    StoppingCriteriaList,
    pipeline,
)

from wedlm_hf.hub.custom_generate import export_custom_generate
from wedlm_hf.modeling.transformers_versions import CACHE_KWARG


def eager_and_static(model, ids, mask=None, seed=None, **kwargs):
    outs = []
    for static in (False, True):
        if seed is not None:
            torch.manual_seed(seed)
        extra = {"cache_implementation": "static"} if static else {}
        outs.append(model.generate(ids, attention_mask=mask, **WEDLM_COMMON | kwargs | extra))
    return outs


def assert_same(eager, static, atol=1e-10):
    assert torch.equal(eager.sequences, static.sequences)
    assert [s.to_dict() for s in eager.wedlm_stats] == [s.to_dict() for s in static.wedlm_stats]
    for a, b in zip(eager.cache.layers, static.cache.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=atol)
        torch.testing.assert_close(a.values, b.values, rtol=0, atol=atol)


@pytest.fixture(scope="module")
def model32():
    return build_model(dtype=torch.float32)


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_static_equals_eager(model64, model32, dtype, batch, lossless):
    model = model64 if dtype == "float64" else model32
    ids, mask = prompts(batch)
    options = dict(max_new_tokens=40, wedlm_lossless=lossless, eos_token_id=None)
    eager, static = eager_and_static(model, ids, mask, **options)
    assert_same(eager, static, atol=1e-10 if dtype == "float64" else 1e-5)
    assert sum(s.tokens for s in static.wedlm_stats) > sum(s.forwards for s in static.wedlm_stats)  # parallel


def test_lossless_static_equals_plain_ar(model64):
    ids, mask = prompts(3)
    ar = model64.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=EOS_ID)
    _, static = eager_and_static(model64, ids, mask, max_new_tokens=30, wedlm_lossless=True)
    assert torch.equal(static.sequences, ar)


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_seeded_sampling_equals_eager(model64, lossless):
    ids, mask = prompts(3)
    options = dict(max_new_tokens=30, do_sample=True, top_k=20, temperature=1.3, wedlm_lossless=lossless)
    eager, static = eager_and_static(model64, ids, mask, seed=7, **options)
    assert_same(eager, static)


def test_stops_criteria_stop_strings_and_streamer_as_eager(model64, char_tokenizer):
    class StopAtLength(StoppingCriteria):  # row 1 stops once it holds 9 new tokens
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([b == 1 and input_ids.shape[1] >= ids.shape[1] + 9 for b in range(len(input_ids))])

    ids, mask = prompts(3)
    stops = dict(stopping_criteria=StoppingCriteriaList([StopAtLength()]), stop_strings=["a"], tokenizer=char_tokenizer)
    eager, static = eager_and_static(model64, ids, mask, max_new_tokens=30, **stops)
    assert_same(eager, static)

    class Recorder:
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(value.tolist())

        def end(self):
            self.calls.append("end")

    streamed = []
    for static in (False, True):
        recorder = Recorder()
        extra = {"cache_implementation": "static"} if static else {}
        model64.generate(ids[2:], max_new_tokens=25, streamer=recorder, **WEDLM_COMMON | extra | {"eos_token_id": None})
        streamed.append(recorder.calls)
    assert streamed[0] == streamed[1] and len(streamed[0]) > 3


def test_a_static_cache_passed_in(model64):
    ids, mask = prompts(2)
    eager, _ = eager_and_static(model64, ids, mask, max_new_tokens=20)
    cache = StaticCache(config=model64.config, max_cache_len=ids.shape[1] + 20)  # what AR would take
    out = model64.generate(ids, attention_mask=mask, max_new_tokens=20, **WEDLM_COMMON, **{CACHE_KWARG: cache})
    assert torch.equal(out.sequences, eager.sequences)
    assert out.cache is cache  # refilled with the committed K/V, laid out as `sequences`
    keys = cache.layers[0].keys[:, :, : out.sequences.shape[1]]
    torch.testing.assert_close(keys, eager.cache.layers[0].keys, rtol=0, atol=1e-10)

    small = StaticCache(config=model64.config, max_cache_len=24)
    with pytest.raises(ValueError, match=r"max_cache_len=24.*needs max_cache_len >= \d+"):
        model64.generate(ids, attention_mask=mask, max_new_tokens=20, **WEDLM_COMMON, **{CACHE_KWARG: small})


def test_static_refusals(model64):
    ids, _ = prompts(1)
    with pytest.raises(ValueError, match="a DynamicCache with cache_implementation='static'"):
        model64.generate(
            ids, max_new_tokens=4, cache_implementation="static", **WEDLM_COMMON, **{CACHE_KWARG: DynamicCache()}
        )
    with pytest.raises(ValueError, match="cache_implementation='offloaded'.*static"):
        model64.generate(ids, max_new_tokens=4, cache_implementation="offloaded", **WEDLM_COMMON)


@pytest.mark.heavy  # dynamo traces each case's graphs afresh: what is counted
@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
@pytest.mark.parametrize("batch", [1, 3])
def test_compiled_forward_does_not_recompile_per_step(batch, lossless):
    """The user's way (`model.forward = torch.compile(model.forward)` with a static cache): a 512-token
    generation compiles a few graphs, not one per step, and decodes what the eager path decodes."""
    model = build_model(dtype=torch.float32, max_position_embeddings=1024)
    ids, mask = prompts(batch)
    options = dict(max_new_tokens=512, wedlm_window_size=16, wedlm_lossless=lossless, eos_token_id=None)
    eager = model.generate(ids, attention_mask=mask, **WEDLM_COMMON | options)
    torch._dynamo.reset()
    counter = CompileCounter()
    model.forward = torch.compile(model.forward, backend=counter)
    static = model.generate(ids, attention_mask=mask, cache_implementation="static", **WEDLM_COMMON | options)
    del model.forward
    assert torch.equal(static.sequences, eager.sequences)
    forwards = max(s.forwards for s in static.wedlm_stats)
    assert forwards > 40 and counter.frame_count <= 6, (forwards, counter.frame_count)


def test_compile_config_and_disable_compile_are_honoured(model64, monkeypatch):
    """transformers' rule: a static cache compiles the decoding forward with `compile_config` on the devices it
    compiles for (CUDA; any device for a config marked as transformers' own tests mark it); `disable_compile=True`
    keeps it eager. Prefill forwards stay uncompiled."""
    configs = []
    calls = {"compiled": 0, "eager": 0}

    def fake_compiled_call(compile_config):
        configs.append(compile_config)

        def compiled(**kwargs):
            calls["compiled"] += 1
            return model64(**kwargs)

        return compiled

    original_call = type(model64).__call__

    def counted_call(self, *args, **kwargs):
        calls["eager"] += 1
        return original_call(self, *args, **kwargs)

    monkeypatch.setattr(model64, "get_compiled_call", fake_compiled_call)
    ids, _ = prompts(1)
    config = CompileConfig(backend="eager", fullgraph=False)
    config._compile_all_devices = True  # this CPU counts as a device transformers compiles for
    for disable in (False, True):
        calls.update(compiled=0, eager=0)
        monkeypatch.setattr(type(model64), "__call__", counted_call)
        out = model64.generate(
            ids,
            max_new_tokens=20,
            cache_implementation="static",
            compile_config=config,
            disable_compile=disable,
            **WEDLM_COMMON,
        )
        monkeypatch.setattr(type(model64), "__call__", original_call)
        forwards = out.wedlm_stats[0].forwards
        if disable:
            assert calls == {"compiled": 0, "eager": forwards}
        else:
            assert calls["compiled"] == forwards - 1 and calls["eager"] == forwards  # prefill + each compiled call
    assert len(configs) == 1 and configs[0].backend == "eager"


EXTRAS = ({}, {"cache_implementation": "static"})


def test_remote_code_custom_generate_and_pipeline_decode_static(tmp_path, model64, char_tokenizer):
    ids, mask = prompts(2)
    settings = dict(max_new_tokens=16, eos_token_id=EOS_ID, pad_token_id=EOS_ID, wedlm_window_size=6)
    eager = model64.generate(ids, attention_mask=mask, strategy="wedlm", **settings)

    model64.save_pretrained(tmp_path / "ckpt")
    request = {"ids": ids.tolist(), "mask": mask.tolist(), "settings": {**settings, "cache_implementation": "static"}}
    remote = run_without_wedlm_hf(REMOTE_GENERATE, [str(tmp_path / "ckpt"), json.dumps(request)], tmp_path)
    assert remote == eager.tolist()

    folder = export_custom_generate(tmp_path / "wedlm-decoding")
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    config = {k: v for k, v in tiny_config().to_dict().items() if k in keys + ("vocab_size", "head_dim")}
    torch.manual_seed(0)
    stock = peaky(Qwen3ForCausalLM(Qwen3Config(**config))).to(torch.float64).eval()
    custom = dict(custom_generate=str(folder), trust_remote_code=True, mask_token_id=MASK_ID, **settings)
    outs = [
        stock.generate(ids, attention_mask=mask, **custom, **extra)
        for extra in ({}, {"cache_implementation": "static"})
    ]
    assert torch.equal(outs[0], outs[1])

    model = build_model(dtype=torch.float32)
    model.save_pretrained(tmp_path / "pipe", tokenizer=char_tokenizer)
    pipe = pipeline("text-generation", model=str(tmp_path / "pipe"), trust_remote_code=True)
    options = dict(max_new_tokens=12, eos_token_id=None, strategy="wedlm", return_full_text=False)
    texts = []
    for extra in EXTRAS:  # the pipeline samples (its generation defaults): the same draws on either cache
        torch.manual_seed(0)
        texts.append(pipe("hello", **options, **extra)[0]["generated_text"])
    assert texts[0] == texts[1] and texts[0]


def test_compile_config_on_a_dynamic_cache_is_checked_as_transformers_checks_it(model64, monkeypatch):
    """On a DynamicCache, transformers' compile criteria (which warn that a `compile_config` cannot be met) are
    consulted where a `compile_config` is given, and only there."""
    seen = []
    criteria = type(model64)._valid_auto_compile_criteria

    def recorded(self, model_kwargs, generation_config):
        seen.append(generation_config.compile_config)
        return criteria(self, model_kwargs, generation_config)

    monkeypatch.setattr(type(model64), "_valid_auto_compile_criteria", recorded)
    ids, _ = prompts(1)
    plain = model64.generate(ids, max_new_tokens=8, **WEDLM_COMMON)
    assert seen == []
    config = CompileConfig(backend="eager")
    checked = model64.generate(ids, max_new_tokens=8, compile_config=config, **WEDLM_COMMON)
    assert len(seen) == 1 and seen[0].backend == "eager"
    assert torch.equal(checked.sequences, plain.sequences)
