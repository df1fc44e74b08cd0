"""`wedlm-hf serve --compile`: decoding steps compiled on fixed batch slots answer what the eager server answers.

The servers compile with torch.compile's "aot_eager" backend (dynamo and AOTAutograd trace the step, including its
in-place writes to the slots, and run the graph without generating code), the scheduler-only test with "eager"
(dynamo alone): that keeps these tests fast; the command line uses inductor (`compile_config_for`).
"""

import threading
import time
import types

import pytest
import torch
from conftest import MASK_ID, build_model
from live_server import MODEL_ID, LiveServer, engine
from transformers import CompileConfig

from wedlm_hf.cli import console
from wedlm_hf.modeling.decoding_state import DecodingSettings
from wedlm_hf.modeling.slot_cache import SlotCache
from wedlm_hf.modeling.window_filling import FillSampler
from wedlm_hf.serving import server as server_module
from wedlm_hf.serving.engine import ServingEngine, compile_config_for
from wedlm_hf.serving.incremental_text import IncrementalText
from wedlm_hf.serving.scheduler import Choice, Delta, Failure, Finish, Job, Scheduler, slot_length

TEST_COMPILE = CompileConfig(backend="aot_eager", mode=None)
FAST_COMPILE = CompileConfig(backend="eager", mode=None)
SLOTS = 3
# (prompt, max_tokens, the request whose first text it waits for): different lengths, joining a batch that is
# mid-decoding at different times; five requests on three slots, so later ones take slots other rows freed.
REQUESTS = [
    ("count from 1 by 1, 40 numbers:", 96, None),
    ("count from 100 by 5, 24 numbers:", 80, None),
    ("sort([5, 3, 9, 1]) =", 16, 0),
    ("count from 200 by 3, 20 numbers:", 64, 0),
    ("copy: apple river stone cloud tiger =>", 24, 2),
]


@pytest.fixture(scope="module")
def servers():
    """An eager and a compiled server on the shipped model, both with SLOTS batch slots; the compiled server's
    compiled call records how many slots are taken whenever it runs."""
    compiled = LiveServer(engine(max_batch_size=SLOTS, compile_config=TEST_COMPILE))
    scheduler = compiled.engine.scheduler
    inner, taken = scheduler.compiled, []

    def counting(**kwargs):
        taken.append(len(scheduler.decoder.kv.slot_of))  # the loop thread, inside a step
        return inner(**kwargs)

    scheduler.compiled = scheduler.decoder.kv.compiled = counting
    with LiveServer(engine(max_batch_size=SLOTS)) as eager, compiled:
        yield eager, compiled, taken


def staggered(live: LiveServer, body: dict) -> list[tuple[str, str, int]]:
    """Streams REQUESTS concurrently, each one starting once the request it waits for has streamed text; returns
    each request's (text, finish_reason, completion tokens)."""
    client = live.client(timeout=300)
    started = [threading.Event() for _ in REQUESTS]
    answers: list = [None] * len(REQUESTS)

    def run(i: int) -> None:
        try:
            prompt, max_tokens, after = REQUESTS[i]
            if after is not None:
                assert started[after].wait(300), "the request it waits for never streamed"
            stream = client.completions.create(
                model=MODEL_ID,
                prompt=prompt,
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=body,
            )
            pieces, reason, tokens = [], None, None
            for chunk in stream:
                for choice in chunk.choices:
                    pieces.append(choice.text or "")
                    reason = choice.finish_reason or reason
                    if choice.text:
                        started[i].set()
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            answers[i] = ("".join(pieces), reason, tokens)
        finally:
            started[i].set()  # never leave a request waiting

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(REQUESTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert all(answer is not None for answer in answers), answers
    return answers


@pytest.mark.heavy  # the compile of the servers' step
@pytest.mark.parametrize("body", [{}, {"wedlm_lossless": True}], ids=["default", "lossless"])
def test_compiled_server_answers_what_the_eager_server_answers(servers, body):
    eager, compiled, taken = servers
    assert eager.health()["compiled"] is False and compiled.health()["compiled"] is True
    assert isinstance(compiled.engine.scheduler.decoder.kv, SlotCache)
    expected = staggered(eager, body)
    del taken[:]
    assert staggered(compiled, body) == expected
    assert all(tokens and text for text, _, tokens in expected)
    # Decoding steps ran compiled, with rows of several requests sharing them, never more rows than slots.
    assert taken and 2 <= max(taken) <= SLOTS
    assert compiled.health()["live_rows"] == 0


def scheduler_job(tokenizer, prompt: list[int], max_new_tokens: int, on_event=None) -> tuple[Job, list]:
    """A greedy one-row job whose events land in the returned list (`on_event` sees each one first)."""
    settings = DecodingSettings(max_new_tokens=max_new_tokens, window_size=4, sampler=FillSampler(False))
    events: list = []

    def emit(event) -> None:
        if on_event is not None:
            on_event(event, events)
        events.append(event)

    return Job([Choice(0, prompt, settings, IncrementalText(tokenizer))], emit=emit), events


def wait_end(events: list, timeout: float = 300) -> list:
    deadline = time.monotonic() + timeout
    while not any(isinstance(e, (Finish, Failure)) for e in events):
        assert time.monotonic() < deadline, events
        time.sleep(0.01)
    return events


def test_a_long_prompt_joins_beside_a_row_deep_in_its_context(char_tokenizer):
    """A prompt prefilled in one step is fed beside every other row, past its committed tokens: the slots hold the
    context plus such a feed, not just a decoding step's 2W (a row near the end of the context would overflow)."""
    model = build_model(seed=3)  # 512 positions
    answers = []
    for compile_config in (None, FAST_COMPILE):
        scheduler = Scheduler(model, MASK_ID, max_batch_size=2, max_queue=8, compile_config=compile_config)
        late, late_events = scheduler_job(char_tokenizer, [9 + i % 70 for i in range(300)], 8)

        def join_late(event, events, late=late, scheduler=scheduler):  # the loop thread: joins at the next step
            before = sum(e.tokens for e in events)
            if isinstance(event, Delta) and before <= 40 < before + event.tokens:  # 40 of the deep row's 80 tokens
                scheduler.submit(late)

        deep, deep_events = scheduler_job(char_tokenizer, [5 + i % 80 for i in range(420)], 80, join_late)
        scheduler.submit(deep)
        scheduler.start()
        for events in (deep_events, late_events):
            wait_end(events)
        scheduler.stop()
        answers.append([[e for e in ev if isinstance(e, (Finish, Failure))] for ev in (deep_events, late_events)])
    eager, compiled = answers
    assert compiled == eager
    assert [finish.completion_tokens for [finish] in compiled] == [80, 8]


def test_a_failed_compiled_step_rebuilds_the_decoder_on_fresh_slots(char_tokenizer):
    """After a step failure the loop decodes on a new SlotCache (the failed rows' slots are gone) through the same
    compiled call, and a later request gets the eager answer."""
    model = build_model(seed=3)
    eager = Scheduler(model, MASK_ID, max_batch_size=2)
    expected, expected_events = scheduler_job(char_tokenizer, [8, 8, 2, 40], 24)
    eager.submit(expected)
    eager.start()
    wait_end(expected_events)
    eager.stop()

    scheduler = Scheduler(model, MASK_ID, max_batch_size=2, compile_config=FAST_COMPILE)
    inner, calls = scheduler.compiled, []

    def flaky(**kwargs):
        calls.append(len(calls))
        if len(calls) == 2:
            raise RuntimeError("out of memory (simulated)")
        return inner(**kwargs)

    scheduler.compiled = scheduler.decoder.kv.compiled = flaky
    first_cache = scheduler.decoder.kv
    failed, failed_events = scheduler_job(char_tokenizer, [5, 17, 3, 40], 40)
    scheduler.submit(failed)
    scheduler.start()
    failure = wait_end(failed_events)[-1]
    assert isinstance(failure, Failure) and "out of memory" in failure.message
    later, later_events = scheduler_job(char_tokenizer, [8, 8, 2, 40], 24)
    scheduler.submit(later)
    wait_end(later_events)
    scheduler.stop()
    assert scheduler.decoder.kv is not first_cache and scheduler.decoder.kv.compiled is flaky and len(calls) > 2
    assert later_events == expected_events


def test_slot_length_refuses_models_the_static_step_cannot_decode():
    model = build_model(seed=0)
    assert slot_length(model) == 512  # the context: padding goes to the sink column
    unbounded = types.SimpleNamespace(config=types.SimpleNamespace(get_text_config=types.SimpleNamespace))
    with pytest.raises(ValueError, match="max_position_embeddings.*without --compile"):
        slot_length(unbounded)  # a config without a context length
    sliding = build_model(seed=0, layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    with pytest.raises(ValueError, match="sliding-window layers.*use_sliding_window=False"):
        Scheduler(sliding, MASK_ID, compile_config=FAST_COMPILE)


def test_serve_compile_reaches_the_engine_and_the_startup_line(capsys, monkeypatch):
    status = None
    try:
        console(["serve", "--help"])
    except SystemExit as exit_:
        status = exit_.code
    assert status == 0 and "--compile" in capsys.readouterr().out

    loaded = []

    def load(*args, **kwargs):
        loaded.append(kwargs)
        compiled = object() if kwargs["compile_config"] is not None else None
        dtype = "float32" if kwargs["dtype"] == "auto" else kwargs["dtype"]  # (the CLI's choice reaches the load)
        scheduler = types.SimpleNamespace(compiled=compiled, batch_invariant=False)
        return types.SimpleNamespace(model_id="m", dtype=dtype, quantization=None, scheduler=scheduler)

    class Server:
        def __init__(self, engine, *args, announce, **kwargs):
            self.announce = announce

        def run(self):
            self.announce("http://127.0.0.1:1")

    monkeypatch.setattr(ServingEngine, "load", load)
    monkeypatch.setattr(server_module, "ServingServer", Server)
    console(["serve", "--device", "cpu", "--compile"])
    console(["serve", "--device", "cpu", "--dtype", "bfloat16"])
    compiled, eager = loaded
    assert compiled["compile_config"] == compile_config_for(torch.device("cpu")) and eager["compile_config"] is None
    assert compiled["compile_config"].mode == "default"  # inductor's; CUDA graphs only on a GPU
    assert compile_config_for(torch.device("cuda")).mode == "reduce-overhead"
    lines = capsys.readouterr().out.splitlines()
    assert "compiled decoding" in lines[0] and "compiled" not in lines[1]
    assert "; float32;" in lines[0] and "; bfloat16;" in lines[1]  # the start-up line says the dtype
