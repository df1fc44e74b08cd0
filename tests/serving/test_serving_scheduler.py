"""The decoding loop on its own (no HTTP): batching limits, joins, and failures that stay local.

A tiny random float64 model and the character tokenizer keep these fast; the API tests use the shipped model.
"""

import threading

import pytest
import torch
from conftest import EOS_ID, MASK_ID, build_model

from wedlm_hf.modeling.decoding_state import DecodingSettings
from wedlm_hf.modeling.window_filling import FillSampler
from wedlm_hf.serving.incremental_text import IncrementalText
from wedlm_hf.serving.scheduler import Choice, Delta, Failure, Finish, Job, QueueFull, Scheduler, ShuttingDown

PROMPTS = [[5, 17, 3, 40], [8, 8, 2], [60, 61, 62, 63, 64, 65], [1, 2], [30, 31, 32, 33, 34], [9]]


class Events:
    """Collects one job's events from the loop thread."""

    def __init__(self, fail_on: int | None = None):
        self.items: list = []
        self.cond = threading.Condition()
        self.fail_on = fail_on

    def emit(self, event) -> None:
        if self.fail_on is not None and len(self.items) == self.fail_on:
            raise RuntimeError("this client's sink broke")
        with self.cond:
            self.items.append(event)
            self.cond.notify_all()

    def wait_end(self, count: int = 1, timeout: float = 60.0) -> list:
        def ended():
            return any(isinstance(e, Failure) for e in self.items) or (
                sum(isinstance(e, Finish) for e in self.items) == count
            )

        with self.cond:
            assert self.cond.wait_for(ended, timeout), self.items
        return self.items


def make_job(tokenizer, prompt: list[int], max_new_tokens: int = 12, window_size: int = 4, fail_on=None):
    settings = DecodingSettings(
        max_new_tokens=max_new_tokens,
        window_size=window_size,
        entropy_threshold=0.5,
        sampler=FillSampler(False),
        stop_ids=frozenset({EOS_ID}),
    )
    events = Events(fail_on)
    return Job([Choice(0, prompt, settings, IncrementalText(tokenizer))], emit=events.emit), events


def offline(model, prompt: list[int], max_new_tokens: int = 12, window_size: int = 4) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        strategy="wedlm",
        max_new_tokens=max_new_tokens,
        wedlm_window_size=window_size,
        wedlm_entropy_threshold=0.5,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
    )
    ids = out[0, len(prompt) :].tolist()
    return ids[: ids.index(EOS_ID) + 1] if EOS_ID in ids else ids


def committed_text(events: list, tokenizer) -> str:
    return "".join(e.text for e in events if isinstance(e, Delta))


@pytest.fixture
def model():
    return build_model(seed=3)


@pytest.fixture
def scheduler(model):
    s = Scheduler(model, MASK_ID, max_batch_size=2, max_queue=8)
    s.start()
    yield s
    s.stop()
    assert not s.alive


def test_rows_join_and_leave_within_the_batch_limit_and_match_generate(model, scheduler, char_tokenizer):
    widths = []
    jobs = []
    for i, prompt in enumerate(PROMPTS):
        job, events = make_job(char_tokenizer, prompt, max_new_tokens=8 + i)
        inner = job.emit

        def emit(event, inner=inner):
            widths.append(len(scheduler.decoder.active))  # called by the loop thread right after a step
            inner(event)

        job.emit = emit
        scheduler.submit(job)
        jobs.append(events)
    for i, events in enumerate(jobs):
        items = events.wait_end()
        finish = items[-1]
        expected = offline(model, PROMPTS[i], max_new_tokens=8 + i)
        assert committed_text(items, char_tokenizer) == char_tokenizer.decode(expected, skip_special_tokens=True)
        assert finish.completion_tokens == len(expected) == sum(e.tokens for e in items if isinstance(e, Delta))
        assert finish.reason == ("stop" if expected[-1] == EOS_ID else "length")
    assert max(widths) == 2  # rows shared steps, never more than max_batch_size of them
    assert scheduler.snapshot()["completed"] == len(PROMPTS)


def test_a_failing_forward_fails_its_batch_and_the_loop_carries_on(model, char_tokenizer, monkeypatch):
    calls = {"n": 0}
    forward = model.forward

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("out of memory (simulated)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", flaky)
    first, first_events = make_job(char_tokenizer, PROMPTS[0], max_new_tokens=40, window_size=1)
    second, second_events = make_job(char_tokenizer, PROMPTS[1], max_new_tokens=40, window_size=1)
    scheduler = Scheduler(model, MASK_ID, max_batch_size=2, max_queue=8)
    scheduler.submit(first)
    scheduler.submit(second)
    scheduler.start()  # both rows are in the batch whose second forward fails
    for events in (first_events, second_events):
        failure = events.wait_end()[-1]
        assert isinstance(failure, Failure) and failure.status == 500 and "out of memory" in failure.message
    later, later_events = make_job(char_tokenizer, PROMPTS[2])
    scheduler.submit(later)
    items = later_events.wait_end()
    assert committed_text(items, char_tokenizer) == char_tokenizer.decode(
        offline(model, PROMPTS[2]), skip_special_tokens=True
    )
    assert scheduler.snapshot()["step_failures"] == 1 and scheduler.alive
    scheduler.stop()


def test_a_broken_client_fails_alone(model, scheduler, char_tokenizer):
    broken, broken_events = make_job(char_tokenizer, PROMPTS[0], max_new_tokens=30, window_size=1, fail_on=1)
    fine, fine_events = make_job(char_tokenizer, PROMPTS[1], max_new_tokens=30, window_size=1)
    scheduler.submit(broken)
    scheduler.submit(fine)
    items = fine_events.wait_end()
    assert committed_text(items, char_tokenizer) == char_tokenizer.decode(
        offline(model, PROMPTS[1], 30, 1), skip_special_tokens=True
    )
    scheduler_state = scheduler.snapshot()
    assert broken.ended and scheduler_state["failed"] == 1 and scheduler_state["completed"] == 1
    assert not any(isinstance(e, Finish) for e in broken_events.items)


def test_cancel_drops_the_row_before_the_next_step(model, scheduler, char_tokenizer):
    job, events = make_job(char_tokenizer, PROMPTS[0], max_new_tokens=400, window_size=1)
    scheduler.submit(job)
    with events.cond:
        events.cond.wait_for(lambda: events.items, 60)
    scheduler.cancel(job)
    deadline = threading.Event()
    for _ in range(600):
        if scheduler.snapshot()["live_rows"] == 0:
            break
        deadline.wait(0.05)
    state = scheduler.snapshot()
    assert state["live_rows"] == 0 and state["cancelled"] == 1 and not scheduler.decoder.busy
    assert not any(isinstance(e, Finish) for e in events.items)


def test_queue_limit_and_shutdown(model, char_tokenizer):
    scheduler = Scheduler(model, MASK_ID, max_batch_size=1, max_queue=1)
    running, running_events = make_job(char_tokenizer, PROMPTS[0], max_new_tokens=400, window_size=1)
    waiting, waiting_events = make_job(char_tokenizer, PROMPTS[1])
    scheduler.submit(running)
    with pytest.raises(QueueFull):  # the loop has not started: `running` still waits
        scheduler.submit(make_job(char_tokenizer, PROMPTS[2])[0])
    scheduler.start()
    with running_events.cond:
        running_events.cond.wait_for(lambda: running_events.items, 60)
    scheduler.submit(waiting)  # queued behind the one batch slot
    scheduler.begin_shutdown(0.0)
    with pytest.raises(ShuttingDown):
        scheduler.submit(make_job(char_tokenizer, PROMPTS[2])[0])
    for events in (running_events, waiting_events):
        failure = events.wait_end()[-1]
        assert isinstance(failure, Failure) and failure.status == 503
    scheduler.stop()
    assert not scheduler.alive


@pytest.mark.parametrize("mode", ["lossless", "every mask filled", "logprobs"])
def test_settled_tokens_stream_one_step_before_they_commit(model, scheduler, char_tokenizer, mode):
    """The joining forward already settles tokens (lossless mode's final token: AR's own; with every mask filled,
    the whole window), which the next forward commits whatever happens: they are streamed then. Log-probabilities
    come from the committing forward, so a request that asks for them gets its tokens one forward later."""
    prompt = PROMPTS[0]
    job, events = make_job(char_tokenizer, prompt, max_new_tokens=10)
    choice = job.choices[0]
    if mode == "lossless":
        choice.settings.lossless = True
    else:
        choice.settings.entropy_threshold = 1e9
    if mode == "logprobs":
        choice.logprobs, choice.settings.keep_logits = 0, True
    scheduler.submit(job)
    items = events.wait_end()
    deltas = [e for e in items if isinstance(e, Delta) and e.tokens]
    expected_first = 2 if mode == "logprobs" else 1
    assert deltas[0].forward == expected_first, deltas
    if mode == "every mask filled":
        assert deltas[0].tokens == min(4, 10)  # the whole window of 4
    settings = dict(max_new_tokens=10, eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    if mode == "lossless":
        ids = model.generate(torch.tensor([prompt]), do_sample=False, **settings)[0, len(prompt) :].tolist()
    else:
        ids = model.generate(
            torch.tensor([prompt]),
            strategy="wedlm",
            wedlm_window_size=4,
            wedlm_entropy_threshold=1e9,
            **settings,
        )[0, len(prompt) :].tolist()
    expected = ids[: ids.index(EOS_ID) + 1] if EOS_ID in ids else ids
    assert committed_text(items, char_tokenizer) == char_tokenizer.decode(expected, skip_special_tokens=True)
    assert items[-1].completion_tokens == len(expected) == sum(e.tokens for e in deltas)


def test_a_stop_string_among_settled_tokens_ends_the_choice_where_it_completes(model, scheduler, char_tokenizer):
    """The whole window settles in the joining forward and holds a stop string: the text is cut before it at once,
    and the choice ends (once those tokens commit) with the token that completes it, counted once."""
    prompt = PROMPTS[2]
    settings = dict(max_new_tokens=10, eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    ids = model.generate(
        torch.tensor([prompt]), strategy="wedlm", wedlm_window_size=4, wedlm_entropy_threshold=1e9, **settings
    )[0, len(prompt) :].tolist()
    text = char_tokenizer.decode(ids[:4], skip_special_tokens=True)
    assert len(text) == 4 and EOS_ID not in ids[:4]  # one character a token: the first window is 4 characters
    stop = text[1:3]
    job, events = make_job(char_tokenizer, prompt, max_new_tokens=10)
    choice = job.choices[0]
    choice.settings.entropy_threshold = 1e9
    choice.text = IncrementalText(char_tokenizer, [stop])
    scheduler.submit(job)
    items = events.wait_end()
    deltas = [e for e in items if isinstance(e, Delta) and e.tokens]
    cut = text.index(stop)
    assert committed_text(items, char_tokenizer) == text[:cut]
    assert deltas[0].forward == 1
    assert items[-1].reason == "stop" and items[-1].completion_tokens == cut + len(stop)
    assert sum(e.tokens for e in deltas) == cut + len(stop)
