"""Sampling and penalty fields on the server: OpenAI's `presence_penalty`, `frequency_penalty`, `logit_bias` and
vLLM's `top_k`, `min_p`, `repetition_penalty`, through the official client against a real server.

Lossless requests are compared with plain AR `generate()` of the shipped model under the same processors (the
penalties written out here from OpenAI's definition), so each field is checked for what it means, not for running.
"""

import concurrent.futures

import openai
import pytest
from live_server import MODEL_ID, LiveServer, shipped
from transformers import LogitsProcessor, LogitsProcessorList

PROMPT = "def fibonacci(n):\n    "
MAX_TOKENS = 24


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's definition: mu[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty, with c[j] the count
    of token j in the completion so far (the prompt excluded)."""

    def __init__(self, prompt_length, presence, frequency):
        self.prompt_length, self.presence, self.frequency = prompt_length, presence, frequency

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for row, ids in enumerate(input_ids[:, self.prompt_length :].tolist()):
            for token in set(ids):
                scores[row, token] -= ids.count(token) * self.frequency + self.presence
        return scores


@pytest.fixture(scope="module")
def client():
    with LiveServer() as live:
        yield live.client()


def ar_ids(**generate_kwargs) -> list[int]:
    """Plain AR greedy `generate()` on PROMPT (stopping at eos)."""
    model, tokenizer = shipped()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    out = model.generate(
        ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=tokenizer.eos_token_id, **generate_kwargs
    )
    return out[0, ids.shape[1] :].tolist()


def text_of(ids: list[int]) -> str:
    _, tokenizer = shipped()
    return tokenizer.decode(ids, skip_special_tokens=True)


def complete(client, **fields) -> str:
    extra = {k: fields.pop(k) for k in ("top_k", "min_p", "repetition_penalty", "wedlm_lossless") if k in fields}
    answer = client.completions.create(
        model=MODEL_ID, prompt=PROMPT, max_tokens=MAX_TOKENS, extra_body=extra or None, **fields
    )
    return answer.choices[0].text


def test_repetition_penalty_is_ar_generates(client):
    plain, penalised = ar_ids(), ar_ids(repetition_penalty=1.3)
    assert penalised != plain
    assert complete(client, temperature=0, repetition_penalty=1.3, wedlm_lossless=True) == text_of(penalised)


def test_presence_and_frequency_penalties_count_the_completion_only(client):
    _, tokenizer = shipped()
    length = len(tokenizer(PROMPT).input_ids)
    for presence, frequency in ((1.5, 0.0), (0.0, 0.8), (-0.5, 1.0)):
        processors = LogitsProcessorList([OpenAIPenalties(length, presence, frequency)])
        expected = ar_ids(logits_processor=processors)
        got = complete(
            client, temperature=0, presence_penalty=presence, frequency_penalty=frequency, wedlm_lossless=True
        )
        assert got == text_of(expected), (presence, frequency)
    assert ar_ids(logits_processor=LogitsProcessorList([OpenAIPenalties(length, 1.5, 0.0)])) != ar_ids()
    # Counting the prompt too would be a different rule, and gives a different text here.
    assert ar_ids(logits_processor=LogitsProcessorList([OpenAIPenalties(0, 1.5, 0.0)])) != ar_ids(
        logits_processor=LogitsProcessorList([OpenAIPenalties(length, 1.5, 0.0)])
    )


def test_logit_bias_bans_and_favours_tokens(client):
    plain = ar_ids()
    token = plain[2]
    banned = ar_ids(sequence_bias={(token,): -100.0})
    assert token not in banned
    for lossless in (True, False):
        text = complete(client, temperature=0, logit_bias={str(token): -100}, wedlm_lossless=lossless)
        _, tokenizer = shipped()
        assert token not in tokenizer(text, add_special_tokens=False).input_ids
    assert complete(client, temperature=0, logit_bias={str(token): -100}, wedlm_lossless=True) == text_of(banned)
    favoured = complete(client, temperature=0, logit_bias={str(token): 100}, wedlm_lossless=True)
    assert favoured == text_of([token] * MAX_TOKENS)


def test_top_k_and_min_p_keep_the_likeliest_tokens(client):
    greedy = complete(client, temperature=0)
    assert complete(client, temperature=1e-30, seed=1) == greedy  # a vanishing temperature is greedy, not inf
    assert complete(client, seed=1, top_k=-1) == greedy  # no truncation asked: the model's default (greedy)
    assert complete(client, seed=1, top_k=50) != greedy  # a truncation asked for samples, as in vLLM
    assert complete(client, temperature=1.5, seed=1, top_k=1) == greedy
    assert complete(client, temperature=1.5, seed=1, min_p=1.0) == greedy
    assert complete(client, temperature=1.5, seed=1, top_k=-1) != greedy  # -1: every token, as vLLM reads it


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),  # outside the vocabulary
        ({"logit_bias": {"1": 5}}, "logit_bias"),  # the shipped model's mask token
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"extra_body": {"top_k": -2}}, "top_k"),
        ({"extra_body": {"top_k": 1.5}}, "top_k"),
        ({"extra_body": {"min_p": 1.5}}, "min_p"),
        ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
        ({"extra_body": {"repetition_penalty": 1e-300}}, "repetition_penalty"),  # would overflow the logits
        ({"extra_body": {"repetition_penalty": 2.5}}, "repetition_penalty"),
    ],
)
def test_bad_values_are_refused_by_name(client, fields, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=2, **fields)
    assert error.value.body["param"] == param
    assert param in error.value.body["message"]


def test_penalties_leave_other_rows_alone(client):
    """A penalised request and a plain one decode side by side in one batch; the plain one is unchanged."""
    plain = complete(client, temperature=0)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(complete, client, temperature=0, presence_penalty=2.0) for _ in range(3)]
        futures.append(pool.submit(complete, client, temperature=0))
        answers = [f.result() for f in futures]
    assert answers[-1] == plain
    assert answers[0] == answers[1] == answers[2] != plain


def test_requests_biases_and_penalties_process_as_one_batch():
    """Rows of several requests with their own `logit_bias` and OpenAI penalties (and temperature) are processed
    together (`sampler_batch`), each position getting what its own processors give it alone with its own context,
    and the penalties what OpenAI's definition gives."""
    import torch
    from transformers import TemperatureLogitsWarper

    from wedlm_hf.modeling.processor_contexts import Contexts
    from wedlm_hf.modeling.sampler_batch import process
    from wedlm_hf.modeling.window_filling import FillSampler
    from wedlm_hf.serving.sampling import CompletionPenalties, LogitBias

    g, vocab = torch.Generator().manual_seed(5), 30
    samplers, blocks, parts = [], [], []
    for s in range(4):
        prompt_length = int(torch.randint(1, 5, (), generator=g))
        processors = [
            LogitBias({s: -100.0, 7 + s: 2.5}, vocab, "cpu"),
            CompletionPenalties(prompt_length, 0.3 * s, 0.5 + 0.1 * s),
            TemperatureLogitsWarper(0.8),
        ]
        samplers.append(FillSampler(True, LogitsProcessorList(processors), generator=torch.Generator()))
        ids = torch.randint(0, vocab, (prompt_length + 6,), generator=g)
        slots = [prompt_length, prompt_length + 2, prompt_length + 6]
        parts.append(Contexts([ids], [0, 0, 0], slots))
        blocks.append(torch.randn(3, vocab, generator=g))
    assert len({sampler.batch_form[0] for sampler in samplers}) == 1
    together = process(torch.cat(blocks), samplers, [3] * 4, Contexts.joined(parts))
    expected = []
    for sampler, block, contexts in zip(samplers, blocks, parts):
        for n in range(3):
            row = block[n : n + 1]
            for processor in sampler.warpers:
                row = processor(contexts[n][None], row)
            bias, penalties, temperature = sampler.warpers
            by_definition = OpenAIPenalties(penalties.prompt_length, penalties.presence, penalties.frequency)
            defined = temperature(None, by_definition(contexts[n][None], bias(None, block[n : n + 1])))
            torch.testing.assert_close(row, defined)
            expected.append(row)
    assert torch.equal(together, torch.cat(expected))
