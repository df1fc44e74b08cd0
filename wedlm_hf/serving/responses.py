"""OpenAI response bodies and stream chunks, plus the WeDLM extras OpenAI clients ignore.

Each stream chunk carries one decoder commit of one choice; its choice has an extra `wedlm` object with `forward`
(which of the row's forwards committed these tokens; the playground colours by it) and `tokens` (how many). `usage`
adds `forwards` (decoding forwards summed over the request's rows) and `tokens_per_forward`
(= completion_tokens / forwards) and, when rows decoded losslessly, `accepted_drafts`: `{"model", "context"}`, the
drafts verification accepted summed over those rows, by where they came from (the model's fills, or the context).
"""

import json
import time
import uuid


class ResponseIds:
    """The id, creation time and model name every body and chunk of one response repeats."""

    def __init__(self, kind: str, model: str):
        self.kind = kind
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def usage(prompt_tokens: int, completion_tokens: int, forwards: int, accepted_drafts: dict | None = None) -> dict:
    """`accepted_drafts`: {"model": n, "context": m} when some row was lossless, else None (the key is left out)."""
    body = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "forwards": forwards,
        "tokens_per_forward": completion_tokens / forwards if forwards else 0.0,
    }
    if accepted_drafts is not None:
        body["accepted_drafts"] = accepted_drafts
    return body


def full_body(ids: ResponseIds, choices: list[dict], usage_: dict) -> dict:
    """`choices`: [{"index", "text", "finish_reason"}] in index order."""
    if ids.kind == "chat":
        out = [
            {
                "index": c["index"],
                "message": {"role": "assistant", "content": c["text"]},
                "finish_reason": c["finish_reason"],
                "logprobs": None,
            }
            for c in choices
        ]
        return {**ids.head("chat.completion"), "choices": out, "usage": usage_}
    out = [
        {"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"], "logprobs": None} for c in choices
    ]
    return {**ids.head("text_completion"), "choices": out, "usage": usage_}


def chunk(
    ids: ResponseIds,
    index: int,
    text: str | None = None,
    finish_reason: str | None = None,
    wedlm: dict | None = None,
    role: bool = False,
) -> dict:
    """One choice's piece of a stream: new text, or (with `finish_reason`) its end; `role` opens a chat choice."""
    if ids.kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
        obj = "text_completion"
    if wedlm is not None:
        choice["wedlm"] = wedlm
    return {**ids.head(obj), "choices": [choice]}


def usage_chunk(ids: ResponseIds, usage_: dict) -> dict:
    """The last chunk when `stream_options.include_usage` is set: no choices, the request's usage."""
    obj = "chat.completion.chunk" if ids.kind == "chat" else "text_completion"
    return {**ids.head(obj), "choices": [], "usage": usage_}


def sse(data) -> str:
    """One server-sent event: a JSON object, or the literal `[DONE]`."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"
