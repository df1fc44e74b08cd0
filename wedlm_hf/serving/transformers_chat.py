"""What `transformers chat` sends beyond OpenAI's API: `POST /load_model` and a `generation_config` field.

`transformers chat MODEL URL` first asks `POST /load_model` (at the server's root, without an API key) to load the
model, reading server-sent events until one says `"status": "ready"` (or `"error"`, which it shows); this server
has its one model loaded, so it answers ready at once for that model's id, or an error (which names no model: the
route needs no API key). Each turn then
posts `/v1/chat/completions` with `generation_config`: a `GenerationConfig` as a JSON string (the values that
differ from transformers' defaults, plus whatever `--generation-config` file the user gave). Its keys map onto this
server's request fields, which keep precedence when both are given; a key with no meaning here is refused by name.
"""

import json

from .api_errors import invalid

LOAD_MODEL_BYTES = 4096  # a load_model body names a model; nothing longer is read
MAX_CONFIG_CHARS = 65_536  # a generation_config as JSON text (a model's own file is a few hundred characters)
# generation_config key -> the request field it sets (when the request does not set that field itself).
_FIELDS = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "stop_strings": "stop",
}
# Keys that describe the config file or restate how this server decodes anyway.
_INERT = {"transformers_version": None, "_from_model_config": None, "use_cache": (True,)}
_INERT |= {"output_attentions": (False,), "output_hidden_states": (False,), "return_dict_in_generate": (False,)}
_INERT |= {"pad_token_id": None}  # a response is one row per choice: nothing is padded
_INERT |= {"bos_token_id": None, "decoder_start_token_id": None}  # the chat template places them


def merge_generation_config(body: dict) -> tuple[dict, list[int] | None, dict[str, str]]:
    """`body` with its `generation_config` (a JSON string or an object) turned into request fields; the stop token
    ids it names (`eos_token_id`; the engine accepts them only where they are the model's own); and, for each field
    it set, the key it came from (`generation_config.<key>`, which errors about that field then name)."""
    if "generation_config" not in body:
        return body, None, {}
    body = dict(body)
    config = body.pop("generation_config")
    if isinstance(config, str):
        if len(config) > MAX_CONFIG_CHARS:
            raise invalid("generation_config", f"generation_config is longer than {MAX_CONFIG_CHARS} characters.")
        try:
            config = json.loads(config, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise invalid("generation_config", f"generation_config is not a JSON object ({exc}).") from None
    if config is None:
        return body, None, {}
    if not isinstance(config, dict):
        raise invalid("generation_config", "generation_config must be a GenerationConfig as a JSON object or string.")
    fields, eos, do_sample = {}, None, None
    for key, value in config.items():
        if key in _FIELDS:
            fields[_FIELDS[key]] = value
        elif key.startswith("wedlm_"):
            fields[key] = value
        elif key == "do_sample":
            if not isinstance(value, bool):
                raise invalid("generation_config.do_sample", f"do_sample must be true or false, got {value!r}.")
            do_sample = value
        elif key == "strategy":
            if value not in ("ar", "wedlm"):
                raise invalid("generation_config.strategy", f"strategy must be 'ar' or 'wedlm', got {value!r}.")
            if value == "ar":  # AR's text is lossless mode's: the server decodes with WeDLM either way
                fields["wedlm_lossless"] = True
        elif key == "eos_token_id":
            eos = [value] if isinstance(value, int) and not isinstance(value, bool) else value
            if not isinstance(eos, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in eos):
                raise invalid("generation_config.eos_token_id", "eos_token_id must be a token id or a list of them.")
        elif key in _INERT:
            allowed = _INERT[key]
            if allowed is not None and value not in allowed:
                raise invalid(f"generation_config.{key}", f"generation_config.{key}={value!r} is not supported here.")
        else:
            raise invalid(
                f"generation_config.{key}",
                f"generation_config.{key} has no counterpart on this server; leave it out of the generation config.",
                "unsupported_parameter",
            )
    if do_sample is False:  # greedy, whatever temperature the config holds (transformers ignores it then)
        fields["temperature"] = 0.0
    elif do_sample and "temperature" not in fields:  # sampling at transformers' default temperature
        fields["temperature"] = 1.0
    origins = {}
    for name, value in fields.items():
        if name in body or (name == "max_tokens" and "max_completion_tokens" in body):
            continue
        body[name] = value
        origins[name] = "generation_config." + next((k for k, f in _FIELDS.items() if f == name), name)
    return body, eos, origins


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def load_model_answer(body, model_id: str) -> tuple[int, str]:
    """(status, server-sent events) for `POST /load_model` with `body`: ready for the served model."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return 400, _event({"status": "error", "message": 'load_model takes {"model": "<model id>"}.'})
    model = body["model"]
    if model != model_id:
        message = f"The model {model!r} is not served here: GET /v1/models names the one that is."
        return 200, _event({"status": "error", "model": model, "message": message})
    return 200, _event({"status": "ready", "model": model, "cached": True})


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
