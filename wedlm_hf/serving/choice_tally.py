"""Per-request bookkeeping of the answers a job's events build, and the chunks a completions or chat stream sends.

`ChoiceTally` gathers each choice's text, log-probabilities and finish reason and the request's usage (splitting a
choice's text from its tool calls); `ChunkFrames` renders OpenAI's stream chunks from the same events (the
Responses API's events are `responses_api.ResponseEvents`). Chunks with log-probabilities (and echoed prompts) are
built in a worker thread.
"""

import asyncio
import functools
import time

from .openai_schema import error_body
from .responses import ResponseIds, chunk, sse, token_logprobs, usage, usage_chunk
from .scheduler import Delta, Failure, Finish
from .tool_calls import ToolCallText


class ChoiceTally:
    """Per-choice text and finish reasons, and the request's usage."""

    def __init__(self, prompts, n: int, texts=None, kind: str = "completion", logprobs=False, echoes=None):
        self.count = len(prompts) * n
        self.texts_of, self.kind, self.logprobs = texts, kind, logprobs  # texts_of(id): a token's text
        # echo: each choice starts with its prompt's text and scored tokens (`echo_chunk` streams them)
        self.echoes = [echoes[i // n] for i in range(self.count)] if echoes else None
        starts = self.echoes or [("", [])] * self.count
        self.texts = [[text] if text else [] for text, _ in starts]
        self.entries = [list(scored) for _, scored in starts]  # (token, log-probability, alternatives) per choice
        self.offsets = [0] * self.count  # streamed completions: text offset of each choice's next token
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.finish: dict[int, str] = {}
        self.completion_tokens = 0
        self.forwards = 0
        self.accepted_drafts: dict | None = None  # {"model", "context"} once a lossless row finished
        self.n = n
        self.cached: dict[int, int] = {}  # per prompt: the prompt tokens every one of its choices found cached
        self.first_token: float | None = None  # when the first completion token arrived (time.monotonic)
        self.tool_text: list | None = None  # with tools: each choice's `ToolCallText` (split_tool_calls)
        self.tool_form = None
        self.calls_only = False

    def split_tool_calls(self, tools, form) -> None:
        """With tools a choice may call (`tool_calls`): each choice's text is split into its text and its calls,
        written in `form` (a `ToolFormat`)."""
        self.tool_form = form
        self.calls_only = tools is not None and tools.calls_only
        active = tools is not None and tools.active
        self.tool_text = [ToolCallText(form, self.calls_only) for _ in range(self.count)] if active else None

    def shown(self, event: Delta) -> str:
        """A streamed delta's text: all of it, or with tools the part before a call (each delta read once)."""
        return event.text if self.tool_text is None else self.tool_text[event.choice].feed(event.text)

    def tool_finish(self, index: int, reason: str) -> tuple[str, list[dict], str]:
        """A streamed choice's end with tools: the text held back, its calls and its finish reason."""
        split = self.tool_text[index]
        calls = split.calls()
        return split.rest(cut=reason == "length"), calls, _tool_reason(calls, reason)

    @property
    def done(self) -> bool:
        return len(self.finish) == self.count

    def add(self, event) -> None:
        if isinstance(event, Delta):
            if self.first_token is None and event.tokens:
                self.first_token = time.monotonic()
            self.texts[event.choice].append(event.text)
            if event.logprobs:
                self.entries[event.choice] += event.logprobs
        elif isinstance(event, Finish):
            self.finish[event.choice] = event.reason
            self.completion_tokens += event.completion_tokens
            self.forwards += event.forwards
            prompt = event.choice // self.n
            self.cached[prompt] = min(self.cached.get(prompt, event.cached_tokens), event.cached_tokens)
            if event.accepted_drafts is not None:
                split = self.accepted_drafts or {"model": 0, "context": 0}
                split["model"] += event.accepted_drafts - event.accepted_context_drafts
                split["context"] += event.accepted_context_drafts
                self.accepted_drafts = split

    def usage(self) -> dict:
        return usage(
            self.prompt_tokens, self.completion_tokens, self.forwards, self.accepted_drafts, sum(self.cached.values())
        )

    def echo_chunk(self, ids: ResponseIds, index: int) -> dict:
        """A stream's first chunk of an echoed choice: the prompt's text and, when asked, its tokens' logprobs."""
        text, entries = self.echoes[index]
        body = token_logprobs(self.kind, entries, self.texts_of) if self.logprobs else None
        if body is not None:
            self.offsets[index] = sum(len(piece) for piece in body["tokens"])
        return chunk(ids, index, text, logprobs=body)

    def delta_logprobs(self, event: Delta) -> dict | None:
        """The `logprobs` of one stream chunk: its tokens', text offsets counted from the choice's earlier tokens."""
        if not self.logprobs:
            return None
        body = token_logprobs(self.kind, event.logprobs or [], self.texts_of, self.offsets[event.choice])
        if self.kind != "chat":
            self.offsets[event.choice] += sum(len(piece) for piece in body["tokens"])
        return body

    def choices(self) -> list[dict]:
        out = [
            {
                "index": i,
                "text": "".join(self.texts[i]),
                "finish_reason": self.finish[i],
                "logprobs": token_logprobs(self.kind, self.entries[i], self.texts_of) if self.logprobs else None,
            }
            for i in range(self.count)
        ]
        for choice in out if self.tool_text is not None else []:
            split = ToolCallText(self.tool_form, self.calls_only)
            split.feed(choice["text"])
            content = split.content(cut=choice["finish_reason"] == "length")
            choice["tool_calls"] = split.calls()
            choice["text"] = content if content.strip() or not choice["tool_calls"] else ""
            choice["finish_reason"] = _tool_reason(choice["tool_calls"], choice["finish_reason"])
        return out


def _tool_reason(calls: list, reason: str) -> str:
    """A choice that made complete calls ends `tool_calls`, also where a later call was cut by its token budget
    (the complete ones are kept, the cut one left out): a call that completed is never reported as cut."""
    return "tool_calls" if calls and reason in ("stop", "length") else reason


class ChunkFrames:
    """What a completions or chat stream sends, for `_stream`: OpenAI's chunks, ending with `data: [DONE]`.
    Chunks with log-probabilities (and echoed prompts) are rendered in a worker thread."""

    def __init__(self, ids: ResponseIds, tally: ChoiceTally, usage_: bool):
        self.ids, self.tally, self.usage_ = ids, tally, usage_
        self.render = off_loop if tally.logprobs else _on_loop

    async def opening(self):
        ids, tally = self.ids, self.tally
        if ids.kind == "chat":
            for index in range(tally.count):
                yield sse(chunk(ids, index, role=True))
        for index in range(tally.count if tally.echoes else 0):
            yield await self.render(functools.partial(echo_event, ids, tally, index))

    async def delta(self, event: Delta) -> list[str]:
        frame = await self.render(functools.partial(_delta_event, self.ids, self.tally, event))
        return [frame] if frame else []

    def finish(self, event: Finish) -> list[str]:
        if self.tally.tool_text is None:
            return [sse(chunk(self.ids, event.choice, finish_reason=event.reason))]
        rest, calls, reason = self.tally.tool_finish(event.choice, event.reason)
        frames = [sse(chunk(self.ids, event.choice, rest))] if rest else []
        if calls:  # each call whole, in one delta (OpenAI's clients join the pieces of a call by its index)
            entries = [{"index": k, **call} for k, call in enumerate(calls)]
            frames.append(sse(chunk(self.ids, event.choice, tool_calls=entries)))
        return frames + [sse(chunk(self.ids, event.choice, finish_reason=reason))]

    def failure(self, event: Failure) -> list[str]:
        kind = "server_error" if event.status >= 500 else "invalid_request_error"
        return [sse(error_body(event.message, kind, event.param, event.code)), sse("[DONE]")]

    def closing(self) -> list[str]:
        return ([sse(usage_chunk(self.ids, self.tally.usage()))] if self.usage_ else []) + [sse("[DONE]")]


def _delta_event(ids: ResponseIds, tally: ChoiceTally, event: Delta) -> str:
    """A delta's chunk; "" where tools hold its whole text back (part of a call, sent at the choice's end) and it
    carries no log-probabilities."""
    forward = {"forward": event.forward, "tokens": event.tokens}
    text, logprobs = tally.shown(event), tally.delta_logprobs(event)
    if not text and tally.tool_text is not None and logprobs is None:
        return ""
    return sse(chunk(ids, event.choice, text, wedlm=forward, logprobs=logprobs))


def echo_event(ids: ResponseIds, tally: ChoiceTally, index: int) -> str:
    return sse(tally.echo_chunk(ids, index))


async def off_loop(make):
    return await asyncio.to_thread(make)


async def _on_loop(make):
    return make()
