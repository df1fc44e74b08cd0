"""`logprobs` on both routes, streamed and not: the model's own AR log-probabilities of each token, equal to what
offline `generate(strategy="wedlm", output_logits=True)` reports for the same tokens (mask token excluded)."""

import pytest
import torch
from live_server import MODEL_ID, WEDLM_KEYS, LiveServer, shipped

PROMPT = "count from 7 by 1, 12 numbers:"
MESSAGES = [{"role": "user", "content": "count from 3 by 2, 6 numbers:"}]


@pytest.fixture(scope="module")
def server():
    with LiveServer() as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def offline(prompt_ids: list[int], max_tokens: int, top: int, **body):
    """(token ids, their log-probabilities, the top ids) of offline generate on the same prompt and settings."""
    model, tokenizer = shipped()
    options = {key: body[key] for key in WEDLM_KEYS if key in body}
    out = model.generate(
        torch.tensor([prompt_ids]),
        strategy="wedlm",
        max_new_tokens=max_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        return_dict_in_generate=True,
        output_logits=True,
        **options,
    )
    ids = out.sequences[0, len(prompt_ids) :].tolist()
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id) + 1]
    scores = torch.stack(out.logits)[: len(ids), 0]
    scores[:, model.config.mask_token_id] = float("-inf")
    logprobs = torch.log_softmax(scores, dim=-1)
    return ids, logprobs[torch.arange(len(ids)), ids].tolist(), logprobs.topk(top, dim=-1).indices.tolist()


def piece(token: int) -> str:
    return shipped()[1].decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("body", [{}, {"wedlm_lossless": True}], ids=["default", "lossless"])
def test_completion_logprobs_equal_offline_generate(client, body):
    _, tokenizer = shipped()
    ids, logprobs, tops = offline(tokenizer(PROMPT).input_ids, 14, 3, **body)
    response = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=14, logprobs=3, extra_body=body)
    got = response.choices[0].logprobs
    assert got.tokens == [piece(t) for t in ids] and len(ids) == response.usage.completion_tokens
    assert got.token_logprobs == pytest.approx(logprobs, abs=1e-5)
    for top, expected, token in zip(got.top_logprobs, tops, ids):
        assert set(top) == {piece(t) for t in expected} | {piece(token)}
    assert got.text_offset == [sum(len(p) for p in got.tokens[:i]) for i in range(len(ids))]
    assert all(lp <= 0 for lp in got.token_logprobs)


def test_streamed_logprobs_equal_the_whole_response(client):
    options = dict(model=MODEL_ID, prompt=PROMPT, max_tokens=14, logprobs=2)
    whole = client.completions.create(**options).choices[0].logprobs
    tokens, logprobs, offsets = [], [], []
    for chunk in client.completions.create(stream=True, **options):
        if chunk.choices and chunk.choices[0].logprobs:
            part = chunk.choices[0].logprobs
            tokens += part.tokens
            logprobs += part.token_logprobs
            offsets += part.text_offset
    assert (tokens, offsets) == (whole.tokens, whole.text_offset)
    assert logprobs == pytest.approx(whole.token_logprobs, abs=1e-5)  # another batch history: float rounding only


def test_chat_logprobs_streamed_and_not(client):
    _, tokenizer = shipped()
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids, logprobs, tops = offline(tokenizer(text, add_special_tokens=False).input_ids, 10, 2)
    options = dict(model=MODEL_ID, messages=MESSAGES, max_tokens=10, logprobs=True, top_logprobs=2)
    content = client.chat.completions.create(**options).choices[0].logprobs.content
    assert [c.token for c in content] == [piece(t) for t in ids]
    assert [c.logprob for c in content] == pytest.approx(logprobs, abs=1e-5)
    assert all(c.bytes == list(c.token.encode()) and len(c.top_logprobs) == 2 for c in content)
    assert [[a.token for a in c.top_logprobs] for c in content] == [[piece(t) for t in top] for top in tops]
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **options):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [c.token for c in streamed] == [c.token for c in content]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-5)


def test_no_logprobs_unless_asked(client):
    response = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=4)
    assert response.choices[0].logprobs is None
    chat = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=4, logprobs=False)
    assert chat.choices[0].logprobs is None
