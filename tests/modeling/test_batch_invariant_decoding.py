"""Decoding under `batch_invariant()` on the shipped model, in bfloat16, float16, float32 and float64: each prompt's
tokens and logits are the same alone and batched with prompts of other lengths (default greedy and lossless),
lossless equals plain AR `generate()` bit for bit, and a prompt's K/V are the same bits whether prefilled whole, in
chunks, on top of a cached prefix or beside another row."""

import pytest
import torch
from transformers import AutoTokenizer, DynamicCache

from wedlm_hf import WeDLMForCausalLM, batch_invariant, default_model_path
from wedlm_hf.modeling.transformers_versions import CACHE_KWARG

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
PROMPTS = ["count from 3 by 1, 12 numbers:", "copy: apple river stone cloud tiger lamp =>", "def f(x):\n    return"]
NEW_TOKENS = 12
MODES = {"default": {}, "lossless": {"wedlm_lossless": True}}


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="module", params=DTYPES, ids=str)
def model(request):
    return WeDLMForCausalLM.from_pretrained(default_model_path(), dtype=request.param).eval()


def decode(model, tokenizer, prompts: list[str], **kwargs) -> list[tuple[list[int], torch.Tensor]]:
    """Per prompt: its new tokens (up to its stop) and the logits of each (output_logits)."""
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=NEW_TOKENS, output_logits=True, return_dict_in_generate=True, **kwargs)
    logits = torch.stack(out.logits, dim=1)
    rows = []
    for b, sequence in enumerate(out.sequences[:, batch.input_ids.shape[1] :].tolist()):
        n = next((i + 1 for i, token in enumerate(sequence) if token == model.generation_config.eos_token_id), None)
        n = len(sequence) if n is None else n
        rows.append((sequence[:n], logits[b, :n]))
    return rows


def assert_same(rows, others, what):
    for prompt, (tokens, logits), (other_tokens, other_logits) in zip(PROMPTS, rows, others):
        assert tokens == other_tokens, (what, prompt)
        assert torch.equal(logits, other_logits), (what, prompt)  # bit for bit


@pytest.mark.parametrize("mode", MODES)
def test_each_prompt_decodes_alone_as_it_does_batched(model, tokenizer, mode):
    with batch_invariant():
        alone = [decode(model, tokenizer, [prompt], strategy="wedlm", **MODES[mode])[0] for prompt in PROMPTS]
        batched = decode(model, tokenizer, PROMPTS, strategy="wedlm", **MODES[mode])
    assert_same(alone, batched, mode)


def test_lossless_equals_ar_generate_bit_for_bit(model, tokenizer):
    with batch_invariant():
        lossless = decode(model, tokenizer, PROMPTS, strategy="wedlm", wedlm_lossless=True)
        ar = [decode(model, tokenizer, [prompt], do_sample=False)[0] for prompt in PROMPTS]
    assert_same(lossless, ar, "lossless vs AR")


def test_without_the_switch_batching_moves_the_logits(model, tokenizer):
    """What the switch is for: the same comparison fails without it."""
    if model.dtype == torch.float64:
        pytest.skip("float64's kernels give these rows the same bits alone and batched, switch or not")
    alone = [decode(model, tokenizer, [prompt], strategy="wedlm", wedlm_lossless=True)[0] for prompt in PROMPTS]
    batched = decode(model, tokenizer, PROMPTS, strategy="wedlm", wedlm_lossless=True)
    assert not all(torch.equal(a[1], b[1][: len(a[1])]) for a, b in zip(alone, batched))


def test_a_prompt_has_the_same_kv_bits_however_it_is_prefilled(model, tokenizer):
    ids = tokenizer(PROMPTS[1] + " " + PROMPTS[0], return_tensors="pt").input_ids
    n = ids.shape[1]

    def prefilled(*chunks) -> DynamicCache:
        cache = DynamicCache(config=model.config)
        for start, end in chunks:
            model(ids[:, start:end], position_ids=torch.arange(start, end)[None], **{CACHE_KWARG: cache})
        return cache

    other = tokenizer(PROMPTS[2], return_tensors="pt").input_ids  # a shorter row beside it, left-padded
    batch = torch.cat([ids, torch.cat([torch.zeros((1, n - other.shape[1]), dtype=torch.long), other], 1)])
    mask = torch.cat(
        [torch.ones((1, n)), torch.cat([torch.zeros((1, n - other.shape[1])), torch.ones(other.shape)], 1)]
    )
    with batch_invariant():
        whole = prefilled((0, n))
        caches = {"chunks": prefilled((0, 5), (5, 11), (11, n)), "cached prefix": prefilled((0, 16), (16, n))}
        beside = DynamicCache(config=model.config)
        model(
            batch,
            attention_mask=mask.long(),
            position_ids=(mask.cumsum(-1) - 1).clamp_min(0).long(),
            **{CACHE_KWARG: beside},
        )
    for name, cache in caches.items():
        for layer, other_layer in zip(whole.layers, cache.layers):
            assert torch.equal(layer.keys, other_layer.keys) and torch.equal(layer.values, other_layer.values), name
    for layer, other_layer in zip(whole.layers, beside.layers):
        assert torch.equal(layer.keys[0], other_layer.keys[0]) and torch.equal(layer.values[0], other_layer.values[0])


def test_a_static_cache_decodes_as_the_dynamic_one(model, tokenizer):
    with batch_invariant():
        dynamic = decode(model, tokenizer, PROMPTS, strategy="wedlm")
        static = decode(model, tokenizer, PROMPTS, strategy="wedlm", cache_implementation="static")
    assert_same(dynamic, static, "static slots")
