"""Serving wing: `wedlm-hf serve`, an OpenAI-compatible server with WeDLM decoding and continuous batching.

- `openai_schema`: completions and chat bodies in, validated `ParsedRequest` out; `request_fields`: the field
  checks every route shares, in the route's own names; `api_errors`: OpenAI-style error bodies.
- `engine`: the served model: loading, prompt encoding, context limits, each choice's decoding settings.
- `sampling`: a choice's sampler, the core's processors plus `logit_bias` and OpenAI's penalties.
- `tool_calls`: tools and `tool_choice`, the grammar that holds calls to their schemas, calls split from the text.
- `responses_request`: `POST /v1/responses` bodies read in their own names; `responses_api`: its answers and
  events; `transformers_chat`: `transformers chat`'s extras.
- `limits`: the bounds on what one request may ask for, and its share of the batch.
- `access`: the Host check, the API key and JSON-only bodies (an ASGI middleware).
- `scheduler`: the one decoding loop that owns the model (continuous batching on one `StreamingDecoder`, fair
  admission across requests).
- `incremental_text`: a row's tokens as text, piece by piece, cut at stop strings.
- `prefix_cache`: K/V of earlier prompts and answers in blocks, bounded, shared by later requests.
- `log_probabilities`: the model's AR log-probabilities of tokens, as `logprobs` and `echo` report them.
- `responses`: OpenAI response bodies and stream chunks.
- `app`: the FastAPI routes and the playground page (`playground.html`, `playground.js`); `request_flow`: how a route
  answers (the body read, parsed off the loop, the job, one body or a stream); `choice_tally`: each choice's text,
  calls and finish, and the chat and completions stream chunks.
- `server`: uvicorn with a draining shutdown; `wedlm-hf serve`.

Imports the core, and `default_model_path` and `load_dtype` from the data wing; nothing imports this wing.
"""

import importlib.util

_MISSING = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
if _MISSING:
    raise ImportError(
        f"wedlm-hf serve needs {' and '.join(_MISSING)}: install them with pip install 'wedlm-hf[serve]'."
    )

__all__: list[str] = []
