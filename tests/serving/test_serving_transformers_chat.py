"""`transformers chat` against `wedlm-hf serve`: its `POST /load_model` and the `generation_config` it sends."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from live_server import MODEL_ID, LiveServer, offline_chat

from wedlm_hf.serving.openai_schema import APIError, parse_chat
from wedlm_hf.serving.transformers_chat import merge_generation_config

MESSAGES = [{"role": "user", "content": "count from 1 to 9:"}]


@pytest.fixture(scope="module")
def server():
    with LiveServer() as live:
        yield live


def test_generation_config_becomes_request_fields():
    config = json.dumps({"do_sample": False, "max_new_tokens": 8, "top_k": 5, "transformers_version": "5.0"})
    body, eos, origins = merge_generation_config({"messages": MESSAGES, "generation_config": config})
    assert body == {"messages": MESSAGES, "temperature": 0.0, "max_tokens": 8, "top_k": 5} and eos is None
    assert origins["max_tokens"] == "generation_config.max_new_tokens"
    # The request's own fields win; an object works as well as a string; the model's file's keys are understood.
    body, eos, _ = merge_generation_config(
        {
            "temperature": 0.7,
            "generation_config": {"temperature": 0.1, "strategy": "ar", "eos_token_id": 0, "wedlm_window_size": 8},
        }
    )
    assert body == {"temperature": 0.7, "wedlm_lossless": True, "wedlm_window_size": 8} and eos == [0]
    request = parse_chat({"messages": MESSAGES, "generation_config": config}, MODEL_ID, parse_defaults())
    assert (request.temperature, request.max_tokens, request.top_k) == (0.0, 8, 5)


def test_do_sample_decides_between_greedy_and_sampling():
    def fields(config):
        return merge_generation_config({"generation_config": json.dumps(config, sort_keys=True)})[0]

    assert fields({"do_sample": False, "temperature": 0.6}) == {"temperature": 0.0}  # transformers ignores it then
    assert fields({"do_sample": True}) == {"temperature": 1.0}  # transformers' default temperature
    assert fields({"do_sample": True, "temperature": 0.6}) == {"temperature": 0.6}
    model_file = {"bos_token_id": 5, "decoder_start_token_id": 5, "pad_token_id": 0, "use_cache": True}
    assert fields(model_file) == {}  # a model's own generation_config.json passes


def test_errors_name_the_generation_config_key():
    for config, param in (({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": 5}, "temperature")):
        with pytest.raises(APIError) as error:
            parse_chat({"messages": MESSAGES, "generation_config": config}, MODEL_ID, parse_defaults())
        assert error.value.param == f"generation_config.{param}" and error.value.message.startswith(error.value.param)


@pytest.mark.parametrize(
    "config, param",
    [
        ("[" * 50_000, "generation_config"),  # nesting: a 400, not a RecursionError
        ('{"temperature": NaN}', "generation_config"),
        ("{}" + " " * 70_000, "generation_config"),
        ({"num_beams": 4}, "generation_config.num_beams"),
        ({"do_sample": "no"}, "generation_config.do_sample"),
        ({"use_cache": False}, "generation_config.use_cache"),
        ({"strategy": "beam"}, "generation_config.strategy"),
        ("{not json", "generation_config"),
        ([1], "generation_config"),
    ],
)
def test_generation_config_keys_without_a_meaning_here_are_refused(config, param):
    with pytest.raises(APIError) as error:
        parse_chat({"messages": MESSAGES, "generation_config": config}, MODEL_ID, parse_defaults())
    assert error.value.param == param


def test_load_model_answers_ready_for_the_served_model(server):
    answer = httpx.post(f"{server.url}/load_model", json={"model": MODEL_ID}, timeout=10)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    assert json.loads(answer.text.removeprefix("data: "))["status"] == "ready"
    other = httpx.post(f"{server.url}/load_model", json={"model": "gpt2"}, timeout=10)
    event = json.loads(other.text.removeprefix("data: "))
    assert event["status"] == "error" and "gpt2" in event["message"] and MODEL_ID not in event["message"]
    assert httpx.post(f"{server.url}/load_model", json={}, timeout=10).status_code == 400


def test_a_model_s_own_eos_is_accepted_and_another_refused(server):
    client = server.client()
    config = json.dumps({"eos_token_id": 0, "do_sample": False, "max_new_tokens": 4})
    answer = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, extra_body={"generation_config": config})
    assert answer.choices[0].message.content == offline_chat(MESSAGES, 4)[0]
    answer = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": MODEL_ID, "messages": MESSAGES, "generation_config": {"eos_token_id": 7}},
        timeout=30,
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "generation_config.eos_token_id"


def test_transformers_chat_holds_a_conversation(server, tmp_path):
    """The real CLI, its input piped: a turn, the y/N question a length-cut answer asks, then !exit."""
    cli = Path(sys.executable).parent / "transformers"
    before = _answered(server)
    # The hub's offline mode blocks even 127.0.0.1 for the chat's client; the chat reaches nothing but the server.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "TRANSFORMERS_OFFLINE"}
    env |= {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "COLUMNS": "200", "NO_COLOR": "1"}
    done = subprocess.run(
        [str(cli), "chat", MODEL_ID, server.url, "do_sample=False", "max_new_tokens=8"],
        input=f"{MESSAGES[0]['content']}\nn\n!exit\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "token limit" in done.stdout  # it read the streamed answer to its finish_reason ("length": 8 tokens)
    after = _answered(server)
    assert after["/load_model"] == before["/load_model"] + 1
    assert after["/v1/chat/completions"] == before["/v1/chat/completions"] + 1


def _answered(server) -> dict:
    """Requests answered 200, by route, from the server's /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    counts = {"/load_model": 0.0, "/v1/chat/completions": 0.0}
    for line in text.splitlines():
        for route in counts:
            if line.startswith("wedlm_requests_total{") and f'route="{route}"' in line and 'status="200"' in line:
                counts[route] = float(line.rsplit(" ", 1)[1])
    return counts


def parse_defaults():
    from wedlm_hf import WeDLMDecodingConfig

    return WeDLMDecodingConfig()
