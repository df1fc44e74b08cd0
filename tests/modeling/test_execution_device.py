"""Models placed by accelerate or quantized at load decode as transformers users load them: `device_map="auto"` with
the weights offloaded to disk (whose `model.device` says meta) gives the in-memory model's tokens, and lossless mode
equals each model's own AR `generate`, offloaded or torchao-int8 quantized."""

import types

import pytest
import torch
from transformers import AutoTokenizer

from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.data import quantization_config
from wedlm_hf.modeling.execution_device import execution_device

PROMPTS = ["def fib(n):", "count from 7 by 1, 12 numbers:"]


@pytest.fixture(scope="module")
def batch():
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    tokenizer.padding_side = "left"
    return tokenizer(PROMPTS, return_tensors="pt", padding=True)


def decode(model, batch, **settings) -> torch.Tensor:
    return model.generate(**batch, max_new_tokens=20, do_sample=False, **settings)


def test_a_model_offloaded_to_disk_decodes_as_in_memory(batch, tmp_path):
    path = default_model_path()
    whole = WeDLMForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    offloaded = WeDLMForCausalLM.from_pretrained(
        path, dtype=torch.float32, device_map="auto", max_memory={"cpu": "2MB"}, offload_folder=str(tmp_path)
    ).eval()
    assert offloaded.device.type == "meta" and "disk" in offloaded.hf_device_map.values()
    assert execution_device(offloaded) == torch.device("cpu")
    assert torch.equal(decode(offloaded, batch, strategy="wedlm"), decode(whole, batch, strategy="wedlm"))
    lossless = decode(offloaded, batch, strategy="wedlm", wedlm_lossless=True)
    assert torch.equal(lossless, decode(offloaded, batch)) and torch.equal(lossless, decode(whole, batch))


def test_a_torchao_int8_model_decodes_lossless_as_its_own_ar(batch):
    path = default_model_path()
    quantized = WeDLMForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=quantization_config("torchao-int8", "cpu", path)
    ).eval()
    assert type(quantized.model.layers[0].mlp.up_proj.weight).__name__ == "Int8Tensor"
    own_ar = decode(quantized, batch)
    assert torch.equal(decode(quantized, batch, strategy="wedlm", wedlm_lossless=True), own_ar)
    assert decode(quantized, batch, strategy="wedlm").shape == own_ar.shape


def test_execution_device_follows_accelerates_main_device():
    def placed(device_map):
        return types.SimpleNamespace(device=torch.device("meta"), hf_device_map=device_map)

    assert execution_device(placed({"model": "disk"})) == torch.device("cpu")
    assert execution_device(placed({"embed": "disk", "layers": 1, "head": "cpu"})) == torch.device("cuda", 1)
    assert execution_device(types.SimpleNamespace(device=torch.device("cpu"))) == torch.device("cpu")
