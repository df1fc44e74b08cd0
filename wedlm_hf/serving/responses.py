"""OpenAI response bodies and stream chunks, plus the WeDLM extras OpenAI clients ignore.

Each stream chunk carries one decoder commit of one choice; its choice has an extra `wedlm` object with `forward`
(which of the row's forwards committed these tokens; the playground colours by it) and `tokens` (how many). `usage`
adds `forwards` (decoding forwards summed over the request's rows) and `tokens_per_forward`
(= completion_tokens / forwards) and, when rows decoded losslessly, `accepted_drafts`: `{"model", "context"}`, the
drafts verification accepted summed over those rows, by where they came from (the model's fills, or the context).

`logprobs` are the model's own AR log-probabilities: the log-softmax of its logits at each position given the text
before it, over the vocabulary without the mask token (the distribution before temperature or top-p, as vLLM reports
by default); `generate(output_logits=True)` returns the same logits.
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


def usage(
    prompt_tokens: int, completion_tokens: int, forwards: int, accepted_drafts: dict | None = None, cached: int = 0
) -> dict:
    """`accepted_drafts`: {"model": n, "context": m} when some row was lossless, else None (the key is left out);
    `cached`: prompt tokens whose K/V came from the prefix cache (OpenAI's `prompt_tokens_details.cached_tokens`)."""
    body = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
        "forwards": forwards,
        "tokens_per_forward": completion_tokens / forwards if forwards else 0.0,
    }
    if accepted_drafts is not None:
        body["accepted_drafts"] = accepted_drafts
    return body


def token_logprobs(kind: str, entries: list, text, offset: int = 0) -> dict:
    """A choice's `logprobs` object for (token, log-probability, alternatives) entries (see the module docstring);
    `text(id)`: a token's text decoded alone (`log_probabilities.TokenTexts`). Completions: OpenAI's `tokens`,
    `token_logprobs`, `top_logprobs` (the alternatives plus the chosen token) and `text_offset` (from `offset`, each
    token's text counted as it decodes alone); chat: `content` entries with `bytes` and exactly the k alternatives."""
    if kind == "chat":  # (echo, whose first token has no log-probability, is completions-only)

        def entry(token, logprob):
            piece = text(token)
            return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}

        content = [entry(t, lp) | {"top_logprobs": [entry(a, v) for a, v in alts]} for t, lp, alts in entries]
        return {"content": content}
    tokens, offsets, tops = [], [], []
    for token, logprob, alternatives in entries:
        piece = text(token)
        tokens.append(piece)
        offsets.append(offset)
        offset += len(piece)
        if logprob is None:  # an echoed prompt's first token: nothing predicts it
            tops.append(None)
            continue
        top = {text(a): v for a, v in alternatives}
        top.setdefault(piece, logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [e[1] for e in entries], "top_logprobs": tops, "text_offset": offsets}


def full_body(ids: ResponseIds, choices: list[dict], usage_: dict) -> dict:
    """`choices`: [{"index", "text", "finish_reason", "logprobs"}] in index order."""
    if ids.kind == "chat":
        out = [
            {
                "index": c["index"],
                "message": _message(c),
                "finish_reason": c["finish_reason"],
                "logprobs": c.get("logprobs"),
            }
            for c in choices
        ]
        return {**ids.head("chat.completion"), "choices": out, "usage": usage_}
    out = [
        {"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"], "logprobs": c.get("logprobs")}
        for c in choices
    ]
    return {**ids.head("text_completion"), "choices": out, "usage": usage_}


def _message(choice: dict) -> dict:
    """A chat choice's message: its text, and its `tool_calls` where it called tools (then `content` is null when
    no text came before the calls, as OpenAI answers)."""
    calls = choice.get("tool_calls")
    if not calls:
        return {"role": "assistant", "content": choice["text"]}
    return {"role": "assistant", "content": choice["text"] or None, "tool_calls": calls}


def full_body_json(ids: ResponseIds, choices: list[dict], usage_: dict) -> bytes:
    """`full_body` as UTF-8 JSON, each choice encoded by its own call: the C encoder holds the GIL for a whole call,
    so a large answer encoded at once would stall every other thread (the event loop's included) until it ends."""
    body = full_body(ids, choices, usage_)
    dumps = dict(ensure_ascii=False, allow_nan=False, separators=(",", ":"))  # as Starlette's JSONResponse
    encoded = [json.dumps(choice, **dumps) for choice in body.pop("choices")]
    head = json.dumps(body, **dumps)
    return f'{head[:-1]},"choices":[{",".join(encoded)}]}}'.encode()


def chunk(
    ids: ResponseIds,
    index: int,
    text: str | None = None,
    finish_reason: str | None = None,
    wedlm: dict | None = None,
    role: bool = False,
    logprobs: dict | None = None,
    tool_calls: list | None = None,
) -> dict:
    """One choice's piece of a stream: new text (with its tokens' `logprobs` when asked), a chat choice's
    `tool_calls`, or (with `finish_reason`) its end; `role` opens a chat choice."""
    if ids.kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
        if tool_calls:
            delta = {"tool_calls": tool_calls}
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": logprobs}
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
