"""`wedlm-hf serve --dtype bfloat16`: the model is served in bfloat16, says so, and answers as offline bfloat16
`generate(strategy="wedlm")` does."""

import httpx
import pytest
import torch
from live_server import MODEL_ID, LiveServer

from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.serving.engine import ServingEngine

PROMPT = "count from 100 by 5, 24 numbers:"


@pytest.fixture(scope="module")
def server():
    engine = ServingEngine.load(None, device="cpu", served_model_name=MODEL_ID, dtype="bfloat16")
    with LiveServer(engine) as live:
        yield live


def test_bfloat16_is_served_and_reported(server):
    assert server.engine.model.dtype == torch.bfloat16
    assert httpx.get(f"{server.url}/health", timeout=10).json()["dtype"] == "bfloat16"
    assert httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["dtype"] == "bfloat16"
    answer = server.client().completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=16, temperature=0)
    tokenizer = server.engine.tokenizer
    model = WeDLMForCausalLM.from_pretrained(default_model_path(), dtype=torch.bfloat16).eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    out = model.generate(ids, strategy="wedlm", max_new_tokens=16, eos_token_id=tokenizer.eos_token_id)
    assert answer.choices[0].text == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_auto_serves_float32_on_a_cpu():
    engine = ServingEngine.load(None, device="cpu", served_model_name=MODEL_ID)  # (its loop starts with a server)
    assert engine.dtype == "float32" and engine.model.dtype == torch.float32
