"""`POST /v1/responses` answers: one `Response` object, or its stream of typed events.

The request is read by `responses_request` and decoded as chat; this module renders what the chat path produced in
the Responses API's terms: the answer's text as a `message` output item (left out when the answer only called
functions), each call as a `function_call` item, chat's usage in this API's names.
"""

import json
import time
import uuid

from .responses_request import ResponsesRequest


class ResponseRender:
    """One Response's ids and the request fields it repeats: renders the whole object, and its stream's events."""

    def __init__(self, request: ResponsesRequest, model: str):
        self.id = "resp_" + uuid.uuid4().hex
        self.item_id = "msg_" + uuid.uuid4().hex
        self.created_at = int(time.time())
        self.model = model
        self.echoed = request.echoed

    def message(self, text: str | None, status: str) -> dict:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant", "content": content}

    def response(self, status: str, output: list, usage: dict | None = None, error: dict | None = None) -> dict:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model,
            "output": output,
            **self.echoed,
            "store": False,
            "previous_response_id": None,
            "background": False,
            "reasoning": None,
            "service_tier": "default",
            "truncation": "disabled",
            "usage": None if usage is None else _usage(usage),
        }

    def body(self, text: str, reason: str, usage: dict, calls: list | None = None) -> dict:
        """The whole Response of a finished request: its text as a message (left out when it only called
        functions), then its calls as `function_call` items; cut by length (`max_output_tokens`, or the context),
        it is `incomplete`."""
        status = "completed" if reason in ("stop", "tool_calls") else "incomplete"
        output = [self.message(text, status)] if text or not calls else []
        return self.response(status, output + [self.function_call(call) for call in calls or []], usage)

    @staticmethod
    def function_call(call: dict, status: str = "completed") -> dict:
        """A chat `tool_calls` entry as a Responses `function_call` output item."""
        function = call["function"]
        return {
            "type": "function_call",
            "id": "fc_" + call["id"].removeprefix("call_"),
            "call_id": call["id"],
            "name": function["name"],
            "arguments": function["arguments"],
            "status": status,
        }

    def stream(self, tally) -> "ResponseEvents":
        return ResponseEvents(self, tally)


def _usage(usage: dict) -> dict:
    """The chat `usage` in the Responses API's names; WeDLM's extras (`forwards`, ...) kept beside them."""
    extras = {k: v for k, v in usage.items() if not k.startswith(("prompt_tokens", "completion_tokens", "total"))}
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
        **extras,
    }


class ResponseEvents:
    """The server-sent events of a streamed Response, numbered by `sequence_number`, for app.py's `_stream`:
    created and in_progress; the message item and its text part added with the first text (and only then: an
    answer that only calls functions has no message item), one `output_text.delta` per commit that adds text
    (with WeDLM's `wedlm: {forward, tokens}`), then the text, part and message done, each call's events, and
    `response.completed` (or `response.incomplete` when cut by length, as the API ends such a stream). The items
    streamed are the non-streamed answer's. A failure is an `error` event, then `response.failed`. `usage()`: the
    request's chat usage once it has finished."""

    def __init__(self, render: ResponseRender, tally):
        self.render, self.tally, self.usage = render, tally, tally.usage
        self.sequence = 0
        self.pieces: list[str] = []
        self.reason = "length"
        self.calls: list[dict] = []
        self.opened = False  # the message item was announced

    def _event(self, kind: str, **body) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **body}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _where(self) -> dict:
        return {"item_id": self.render.item_id, "output_index": 0, "content_index": 0}

    async def opening(self):
        started = self.render.response("in_progress", [])
        yield self._event("response.created", response=started)
        yield self._event("response.in_progress", response=started)

    def _open(self) -> list[str]:
        """The message item and its text part, announced once, before its first text."""
        if self.opened:
            return []
        self.opened = True
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event("response.output_item.added", output_index=0, item=self.render.message(None, "in_progress")),
            self._event("response.content_part.added", **self._where(), part=part),
        ]

    def _text(self, text: str, **extra) -> list[str]:
        self.pieces.append(text)
        return self._open() + [
            self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[], **extra)
        ]

    async def delta(self, event) -> list[str]:
        text = self.tally.shown(event)  # (with tools, the text before a call)
        if not text:
            return []
        return self._text(text, wedlm={"forward": event.forward, "tokens": event.tokens})

    def finish(self, event) -> list[str]:
        self.reason = event.reason
        if self.tally.tool_text is None:
            return []
        rest, self.calls, self.reason = self.tally.tool_finish(event.choice, event.reason)
        return self._text(rest) if rest else []

    def failure(self, event) -> list[str]:
        code = event.code or ("server_error" if event.status >= 500 else "invalid_request_error")
        output = [self.render.message("".join(self.pieces), "incomplete")] if self.pieces else []
        failed = self.render.response("failed", output, error={"code": code, "message": event.message})
        return [
            self._event("error", code=code, message=event.message, param=event.param),
            self._event("response.failed", response=failed),
        ]

    def closing(self) -> list[str]:
        text = "".join(self.pieces)
        whole = self.render.body(text, self.reason, self.usage(), self.calls)
        events, calls = [], whole["output"]
        if calls[0]["type"] == "message":  # the answer's text (an answer with no text and no calls: an empty one)
            message, calls = calls[0], calls[1:]
            events += self._open() + [
                self._event("response.output_text.done", **self._where(), text=text, logprobs=[]),
                self._event("response.content_part.done", **self._where(), part=message["content"][0]),
                self._event("response.output_item.done", output_index=0, item=message),
            ]
        first = len(whole["output"]) - len(calls)
        for index, item in enumerate(calls, start=first):  # each call whole, as its events announce it
            where = {"item_id": item["id"], "output_index": index}
            events += [
                self._event(
                    "response.output_item.added",
                    output_index=index,
                    item=item | {"arguments": "", "status": "in_progress"},
                ),
                self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        return events + [self._event(f"response.{whole['status']}", response=whole)]
