"""The server on quantized weights: `--quantization torchao-int8` quantizes the shipped model as it loads, and a
checkpoint saved quantized serves as saved; in both, lossless answers equal that quantized model's own AR
`generate`, and /health reports the quantization."""

import subprocess
import sys

import httpx
import pytest
import torch
from live_server import LiveServer

from wedlm_hf.serving.engine import ServingEngine

PROMPTS = ["def fib(n):", "count from 7 by 1, 12 numbers:", "import os\nimport"]


def assert_lossless_equals_own_ar(server: LiveServer) -> None:
    model, tokenizer = server.engine.model, server.engine.tokenizer
    for prompt in PROMPTS:
        body = {"prompt": prompt, "max_tokens": 24, "wedlm_lossless": True, "temperature": 0}
        response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        ids = tokenizer([prompt], return_tensors="pt")
        own = model.generate(**ids, max_new_tokens=24, do_sample=False)  # the quantized model's AR decoding
        assert response.json()["choices"][0]["text"] == tokenizer.decode(own[0, ids.input_ids.shape[1] :])


@pytest.fixture(scope="module")
def quantized_engine():
    return ServingEngine.load(quantization="torchao-int8", device="cpu", prefix_cache_tokens=0)


def test_quantization_at_load_serves_lossless_as_its_own_ar(quantized_engine):
    weight = quantized_engine.model.model.layers[0].mlp.up_proj.weight
    assert type(weight).__name__ == "Int8Tensor"  # really quantized
    with LiveServer(quantized_engine) as server:
        health = server.health()
        assert health["quantization"] == "torchao" and health["dtype"] == "float32"
        assert_lossless_equals_own_ar(server)


def test_a_checkpoint_saved_quantized_serves_as_saved(quantized_engine, tmp_path):
    quantized_engine.model.save_pretrained(tmp_path)
    quantized_engine.tokenizer.save_pretrained(tmp_path)
    saved = ServingEngine.load(str(tmp_path), device="cpu", prefix_cache_tokens=0)
    assert type(saved.model.model.layers[0].mlp.up_proj.weight).__name__ == "Int8Tensor"
    reference = quantized_engine.model.model.layers[0].mlp.up_proj.weight
    assert torch.equal(saved.model.model.layers[0].mlp.up_proj.weight.dequantize(), reference.dequantize())
    with LiveServer(saved) as server:
        assert server.health()["quantization"] == "torchao"
        assert_lossless_equals_own_ar(server)
    with pytest.raises(ValueError, match="already quantized"):
        ServingEngine.load(str(tmp_path), device="cpu", quantization="torchao-int8")


def test_serve_refuses_what_cannot_run_here_in_one_line():
    command = [sys.executable, "-m", "wedlm_hf.cli", "serve", "--quantization", "torchao-int4", "--device", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "wedlm-hf serve: error: --quantization torchao-int4 runs on CUDA GPUs, not on cpu" in done.stderr
