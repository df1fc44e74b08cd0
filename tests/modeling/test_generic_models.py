"""The strategy as a function works on stock transformers causal LMs (Qwen2, Qwen3, Llama) with an explicit mask id."""

import pytest
import torch
from conftest import EOS_ID, MASK_ID, peaky, prompts
from reference_wedlm import reference_decode
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from wedlm_hf import generate_wedlm

SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=96,
    max_position_embeddings=512,
)


@pytest.mark.parametrize(
    "config",
    [Qwen2Config(**SHAPE), Qwen3Config(**SHAPE, head_dim=16), LlamaConfig(**SHAPE)],
    ids=["qwen2", "qwen3", "llama"],
)
def test_stock_models_decode_like_the_reference(config):
    torch.manual_seed(0)
    model = peaky(type_of(config)(config)).double().eval()
    ids, mask = prompts(2)
    out = generate_wedlm(
        model,
        ids,
        attention_mask=mask,
        mask_token_id=MASK_ID,
        max_new_tokens=16,
        wedlm_window_size=6,
        wedlm_entropy_threshold=0.8,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        return_dict_in_generate=True,
    )
    for b in range(2):
        prompt = ids[b][mask[b].bool()].tolist()
        expected, forwards = reference_decode(model, prompt, MASK_ID, 6, 0.8, 0.02, 16, (EOS_ID,), context_drafts=True)
        assert out.sequences[b, ids.shape[1] :].tolist()[: len(expected)] == expected
        assert out.wedlm_stats[b].forwards == forwards
    with pytest.raises(ValueError, match="mask token id"):
        generate_wedlm(model, ids[:1], max_new_tokens=4)


def type_of(config):
    return {"qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM, "llama": LlamaForCausalLM}[config.model_type]
