"""`wedlm-hf serve --batch-invariant` in bfloat16, float16 and float32: each request answers, token for token and
log-probability for log-probability, what it answers alone, among concurrent streams of other lengths (greedy,
lossless, seeded sampling), with its prompt prefilled whole or in chunks, and with and without prefix-cache hits."""

import threading

import httpx
import pytest
import torch
from live_server import MODEL_ID, LiveServer, shipped

from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.cli import console
from wedlm_hf.serving.engine import ServingEngine

WORDS = "apple river stone cloud tiger lamp orange seven piano forest candle mirror silver rocket garden window".split()
PROMPTS = [
    "count from 3 by 1, 12 numbers:",
    "copy: apple river stone cloud tiger lamp =>",
    "copy: " + " ".join(WORDS * 3) + " =>",  # longer than a step's prompt budget beside others: prefilled in chunks
]
MODES = {
    "greedy": {},
    "lossless": {"wedlm_lossless": True},
    "seeded sampling": {"temperature": 1.0, "seed": 11},
}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture(scope="module", params=DTYPES, ids=str)
def server(request, tmp_path_factory):
    model = WeDLMForCausalLM.from_pretrained(default_model_path(), dtype=request.param).eval()
    tokenizer = shipped()[1]
    # a step feeds at most 128 token rows: the long prompt takes two steps alone and four beside the others
    engine = ServingEngine(model, tokenizer, MODEL_ID, batch_invariant=True, max_window_size=16, max_step_tokens=128)
    with LiveServer(engine) as live:
        yield live


def complete(server, prompt: str, body: dict, salt: str, stream: bool = False) -> dict:
    """The answer's text, token log-probabilities and cached prompt tokens."""
    request = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 12, "logprobs": 1, "cache_salt": salt, **body}
    if not stream:
        answer = httpx.post(f"{server.url}/v1/completions", json=request, timeout=120).json()
        choice = answer["choices"][0]
        cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        return {"text": choice["text"], "logprobs": choice["logprobs"]["token_logprobs"], "cached": cached}
    text, logprobs, cached = "", [], None
    options = {"stream_options": {"include_usage": True}, "extra_body": {"cache_salt": salt, **_extra(body)}}
    fields = {key: body[key] for key in ("temperature", "seed") if key in body}
    chunks = server.client().completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=12, logprobs=1, stream=True, **fields, **options
    )
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].text
            logprobs += chunk.choices[0].logprobs.token_logprobs if chunk.choices[0].logprobs else []
        if chunk.usage is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    return {"text": text, "logprobs": logprobs, "cached": cached}


def _extra(body: dict) -> dict:
    return {key: value for key, value in body.items() if key not in ("temperature", "seed")}


def concurrently(server, body: dict, salt) -> list[dict]:
    """Every prompt at once, each as a stream."""
    answers = [None] * len(PROMPTS)

    def send(i):
        answers[i] = complete(server, PROMPTS[i], body, salt(i), stream=True)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def same(answer: dict, other: dict) -> bool:
    return answer["text"] == other["text"] and answer["logprobs"] == other["logprobs"]  # floats, exactly


@pytest.mark.parametrize("mode", MODES)
def test_each_request_answers_alone_and_among_others_the_same(server, mode):
    body = MODES[mode]
    alone = [complete(server, prompt, body, salt=f"{mode} alone {i}") for i, prompt in enumerate(PROMPTS)]
    assert all(answer["cached"] == 0 for answer in alone)
    together = concurrently(server, body, salt=lambda i: f"{mode} together {i}")  # no prefix-cache hit
    hits = concurrently(server, body, salt=lambda i: f"{mode} alone {i}")  # each prompt's blocks are cached now
    blocks = [(len(server.engine.tokenizer(prompt).input_ids) - 1) // 16 * 16 for prompt in PROMPTS]
    assert [answer["cached"] for answer in hits] == blocks and all(a["cached"] == 0 for a in together)
    alone_hit = complete(server, PROMPTS[2], body, salt=f"{mode} together 2")
    assert alone_hit["cached"] == blocks[2] > 0
    for i, prompt in enumerate(PROMPTS):
        assert same(together[i], alone[i]) and same(hits[i], alone[i]), (mode, prompt)
    assert same(alone_hit, alone[2])


def test_health_says_so(server):
    assert server.health()["batch_invariant"] is True


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--compile"], "--batch-invariant does not cover --compile"),
        (["--quantization", "torchao-int8"], "--batch-invariant does not cover --quantization"),
        (["--tensor-parallel-size", "2"], "--batch-invariant does not cover --tensor-parallel-size"),
        (["--device", "meta"], "--batch-invariant covers the CPU only (no invariant kernels for meta here)"),
    ],
)
def test_what_the_switch_does_not_cover_is_refused_before_the_model_loads(capsys, extra, named):
    """The command's own exit status and one line (`console`, what the installed script runs), in this process."""
    assert console(["serve", "--batch-invariant", *extra]) == 1
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"wedlm-hf serve: error: {named}") and stderr.count("\n") == 1, stderr


def test_a_model_the_switch_does_not_cover_is_refused_by_the_engine():
    model = WeDLMForCausalLM.from_pretrained(default_model_path(), attn_implementation="eager")
    with pytest.raises(ValueError, match=r"^--batch-invariant: batch_invariant\(\): attention 'eager' is not covered"):
        ServingEngine(model, shipped()[1], MODEL_ID, batch_invariant=True)
