"""The served model: loading, prompt encoding against the context limit, and each choice's decoding settings.

Defaults come from the checkpoint: the WeDLM options and sampling settings of its generation config (the shipped
model decodes greedily unless a request sets `temperature` > 0; each choice's sampler: `sampling`), its eos token(s)
as stop ids, and `max_position_embeddings` as the context.

Encoding runs in a worker thread, never on the event loop, and a text prompt that cannot fit the context is refused
after tokenising only a prefix of it: no token covers more than `longest token` characters, so a prompt of more
characters than that times the context is checked on its first (context + 2) tokens' worth of text.
"""

import contextlib
import functools
import logging
import os
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, CompileConfig

from ..data import default_model_path, load_dtype, quantization_config, quantization_name
from ..modeling import WeDLMDecodingConfig
from ..modeling.batch_invariant import batch_invariant as batch_invariance
from ..modeling.batch_invariant import refusal
from ..modeling.decoding_state import DecodingSettings
from ..structured import compile_grammar
from .incremental_text import IncrementalText
from .limits import ServingLimits
from .log_probabilities import TokenTexts, token_log_probabilities
from .openai_schema import APIError, ParsedRequest, invalid, wedlm_options
from .sampling import choice_sampler
from .scheduler import DEFAULT_PREFIX_CACHE_TOKENS, Choice, Scheduler, serving_limits
from .tensor_parallel import mirrored_prompt_logits
from .tool_calls import TOOL_FORMATS, template_tool_format, tool_at_fault, tool_grammar

DEFAULT_MODEL_ID = "wedlm-hf-default"
LOGGER = logging.getLogger("uvicorn.error")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the rest of the context


class ServingEngine:
    """The model, its tokenizer and the loop that decodes for it; `limits` (or keyword limits) bound requests, a
    `compile_config` (see `compile_config_for`) makes the loop decode compiled on fixed slots, and `batch_invariant`
    makes every forward batch-invariant (`wedlm-hf serve --batch-invariant`: each answer its solo answer)."""

    def __init__(
        self,
        model,
        tokenizer,
        model_id: str,
        limits: ServingLimits | None = None,
        compile_config=None,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
        tool_call_parser: str = "hermes",
        ranks=None,
        batch_invariant: bool = False,
        **kwargs,
    ):
        self.limits = serving_limits(limits, **kwargs)
        reason = refusal(model) if batch_invariant else None
        if reason is not None:
            raise ValueError(f"--batch-invariant: {reason}")
        if batch_invariant:  # the switch probes each product's route at first use: here, not in the first request
            with batch_invariance(), torch.no_grad():
                model(torch.zeros((1, 1), dtype=torch.long, device=model.device))
        self.ranks = ranks  # a `tensor_parallel.RankChannel` when the model is split over several ranks
        if tool_call_parser not in TOOL_FORMATS:
            raise ValueError(f"--tool-call-parser {tool_call_parser!r}: give one of {', '.join(TOOL_FORMATS)}.")
        self.tool_format = check_tool_format(tokenizer, tool_call_parser, model_id)
        mask_token_id = getattr(model.config, "mask_token_id", None)
        if mask_token_id is None:
            raise ValueError(
                f"{model_id} has no mask_token_id in its config, so it cannot be served with WeDLM decoding: set "
                '"mask_token_id" in its config.json (151665 for the released Qwen-based WeDLM models).'
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.token_texts = TokenTexts(tokenizer)  # a token's text in log-probabilities, decoded once per id
        self.model_id = model_id
        self.context = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        self.vocab_size = model.config.get_text_config().vocab_size
        self.dtype = str(model.dtype).removeprefix("torch.")  # reported by /health and /v1/models
        self.quantization = quantization_name(model.config)  # how its weights are quantized (None: not at all)
        generation = model.generation_config
        self.stop_ids = frozenset(_ids(generation.eos_token_id) or _ids(model.config.eos_token_id))
        if not self.stop_ids and tokenizer.eos_token_id is not None:
            self.stop_ids = frozenset({tokenizer.eos_token_id})
        try:  # the generation config's options, checked like a request's
            self.defaults = wedlm_options({}, WeDLMDecodingConfig.from_values(generation))
        except (APIError, ValueError) as exc:
            raise ValueError(f"generation_config.json of {model_id}: {getattr(exc, 'message', exc)}") from exc
        if self.defaults.window_size > self.limits.max_window_size:
            raise ValueError(
                f"generation_config.json of {model_id} sets wedlm_window_size {self.defaults.window_size}, above "
                f"--max-window-size {self.limits.max_window_size}: raise --max-window-size."
            )
        self._longest_token = max(map(len, tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))), default=1)
        self._sampling_defaults = generation  # its sampling settings, which a request's fields override
        self.grammar_observers: list = []  # called with each response_format's compile time (s), e.g. by /metrics
        self.scheduler = Scheduler(
            model,
            int(mask_token_id),
            self.limits,
            compile_config=compile_config,
            prefix_cache_tokens=prefix_cache_tokens,
            ranks=ranks,
            batch_invariant=batch_invariant,
        )

    @classmethod
    def load(
        cls,
        model: str | None = None,
        device: str | None = None,
        served_model_name: str | None = None,
        dtype: str = "auto",
        quantization: str | None = None,
        **kwargs,
    ) -> "ServingEngine":
        """Loads a WeDLM checkpoint (folder or Hub id; the shipped model by default) in `dtype` (`--dtype`: auto is
        the checkpoint's half precision on a GPU, float32 on a CPU). Clients name it `served_model_name`; by default
        the folder's own name (never its path), the Hub id, or wedlm-hf-default."""
        path = check_model_folder(model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        loaded = load_model(path, device, dtype, split=kwargs.get("ranks") is not None, quantization=quantization)
        return cls(loaded, tokenizer, served_model_name or default_model_name(model), **kwargs)

    # ---- prompts ------------------------------------------------------------------------------------------

    def encode(self, request: ParsedRequest) -> list[list[int]]:
        """Token ids of each prompt (completions) or of the rendered conversation (chat). Slow for long text: call
        it off the event loop."""
        rows = len(request.prompts if request.kind == "completion" else [None]) * request.n
        if rows > self.limits.max_request_rows:
            raise invalid(
                "n" if request.n > 1 else "prompt",
                f"This request asks for {rows} completions (prompts x n); this server takes at most "
                f"{self.limits.max_request_rows} per request (--max-request-rows): split it into several requests.",
                code="too_many_rows",
            )
        if request.kind == "chat":
            return [self._chat_ids(request.messages, request.tools, request.param("messages"))]
        encoded = []
        for i, prompt in enumerate(request.prompts):
            param = "prompt" if len(request.prompts) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                ids = self._text_ids(prompt, param)
            else:
                self._check_length(len(prompt), param)
                bad = [t for t in prompt if not 0 <= t < self.vocab_size]
                if bad:
                    raise invalid(
                        param, f"{param} has token ids outside the vocabulary (0..{self.vocab_size - 1}): {bad[:5]}."
                    )
                ids = list(prompt)
            if not ids:
                raise invalid(param, f"{param} is empty: give at least one token of text.")
            encoded.append(ids)
        return encoded

    def _chat_ids(self, messages: list[dict], tools=None, param: str = "messages") -> list[int]:
        """The conversation rendered by the chat template (with its tools), as token ids; errors name `param`,
        what the route calls its conversation."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise invalid(
                param,
                f"The tokenizer of {self.model_id} has no chat template, so /v1/chat/completions cannot build a "
                'prompt: use /v1/completions, or add a "chat_template" to the checkpoint\'s tokenizer_config.json.',
                code="no_chat_template",
            )
        listed = tools.template_tools() if tools is not None and tools.active else None
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=listed, add_generation_prompt=True, tokenize=False
            )
            if listed and text == self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            ):
                raise invalid(
                    "tools",
                    f"The chat template of {self.model_id} does not show the model any tools: it cannot call them.",
                    code="unsupported_parameter",
                )
        except APIError:
            raise
        except Exception as exc:  # the template refused the conversation (e.g. raise_exception in the template)
            raise invalid(param, f"The chat template refused these messages: {exc}") from exc
        try:  # tools and call arguments reach the prompt unchecked by the message checks
            text.encode("utf-8")
        except UnicodeEncodeError:
            where = "tools" if listed else param
            raise invalid(where, f"{where} hold text that is not valid Unicode (a lone surrogate).") from None
        ids = self._text_ids(text, param, add_special_tokens=False)
        if not ids:
            raise invalid(param, "The chat template rendered these messages as an empty prompt.")
        return ids

    def _text_ids(self, text: str, param: str, **kwargs) -> list[int]:
        """Token ids of `text`; a text too long for the context is refused on a prefix, without encoding it all."""
        if self.context is not None and len(text) > self._longest_token * (self.context + 2):
            head = self.tokenizer(text[: self._longest_token * (self.context + 2)], **kwargs).input_ids
            if len(head) > self.context + 1:  # one token more than the context, even if the cut split a token
                self._check_length(len(head), param, at_least=True)
        ids = self.tokenizer(text, **kwargs).input_ids
        self._check_length(len(ids), param)
        return ids

    def _check_length(self, tokens: int, param: str, at_least: bool = False) -> None:
        """A prompt must leave room for one new token."""
        if self.context is not None and tokens >= self.context:
            count = f"at least {tokens}" if at_least else str(tokens)
            raise invalid(
                param,
                f"This model's maximum context length is {self.context} tokens and the prompt has {count}: "
                "shorten the prompt.",
                code="context_length_exceeded",
            )

    @torch.no_grad()
    def score_prompt(self, prompt: list[int], top: int, rows_per_chunk: int = 256) -> list:
        """(token, log-probability, top alternatives) of each prompt token given the tokens before it (the first
        has none: None, None), from one uncached forward; the vocabulary-wide logits exist for `rows_per_chunk`
        positions at a time. Log-probabilities as `log_probabilities` reports them."""
        entries = [(prompt[0], None, None)]

        def take(start: int, logits) -> None:
            tokens = prompt[start + 1 : start + 1 + len(logits)]
            entries.extend(token_log_probabilities(logits, tokens, self.scheduler.mask_token_id, top))

        invariance = batch_invariance() if self.scheduler.batch_invariant else contextlib.nullcontext()
        with invariance:  # as the decoding loop's forwards are
            mirrored_prompt_logits(self.model, self.ranks, prompt, rows_per_chunk, take)
        return entries

    def max_tokens(self, request: ParsedRequest, prompts: list[list[int]]) -> int:
        """The request's max_tokens, checked against the context (prompt + max_tokens <= max_position_embeddings)."""
        longest = max(len(p) for p in prompts)
        room = None if self.context is None else self.context - longest
        if room is not None and room < 1:
            raise invalid(
                request.param("messages") if request.kind == "chat" else "prompt",
                f"This model's maximum context length is {self.context} tokens and the prompt has {longest}: "
                "shorten the prompt.",
                code="context_length_exceeded",
            )
        if request.max_tokens == 0:  # echo: score the prompt only
            return 0
        if request.max_tokens is None:
            if room is None:
                return COMPLETION_DEFAULT_MAX_TOKENS
            return min(COMPLETION_DEFAULT_MAX_TOKENS, room) if request.kind == "completion" else room
        if room is not None and request.max_tokens > room:
            name = request.param("max_tokens")
            raise invalid(
                name,
                f"This model's maximum context length is {self.context} tokens; the prompt has {longest} and "
                f"{name} asks for {request.max_tokens} more: lower {name} to {room} or shorten the prompt.",
                code="context_length_exceeded",
            )
        return request.max_tokens

    # ---- settings ------------------------------------------------------------------------------------------

    def choices(self, request: ParsedRequest, prompts: list[list[int]], tenant=None) -> list[Choice]:
        """One choice per (prompt, n) in OpenAI's order: index = prompt_index * n + j. `tenant` (with
        --prefix-cache-per-key, which API key sent it) and the request's `cache_salt` salt its prefix-cache blocks."""
        max_tokens = self._check_answer_size(request, prompts, self.max_tokens(request, prompts))
        grammar = self.grammar(request)  # checked even where nothing decodes (echo with max_tokens 0)
        self._check_logit_bias(request)
        self._check_eos(request)
        if max_tokens == 0:
            return []  # nothing to decode: the response is the scored prompt
        salt = None if tenant is None and request.cache_salt is None else (tenant, request.cache_salt)
        choices = []
        for p, prompt in enumerate(prompts):
            for j in range(request.n):
                index = p * request.n + j
                settings = DecodingSettings.of(
                    request.wedlm,
                    max_new_tokens=max_tokens,
                    sampler=choice_sampler(self.model, request, self._sampling_defaults, index, prompt),
                    stop_ids=self.stop_ids,
                    keep_logits=request.logprobs is not None,
                )
                text = IncrementalText(self.tokenizer, request.stop)
                choices.append(
                    Choice(
                        index,
                        prompt,
                        settings,
                        text,
                        logprobs=request.logprobs,
                        grammar=grammar,
                        grammar_param=self.grammar_param(request),
                        cache_salt=salt,
                    )
                )
        return choices

    def _check_eos(self, request: ParsedRequest) -> None:
        """A generation config's eos_token_id (from `transformers chat`) is accepted where it is the model's own."""
        if request.eos_token_ids is not None and set(request.eos_token_ids) != self.stop_ids:
            raise invalid(
                "generation_config.eos_token_id",
                f"This server stops at the model's own stop tokens {sorted(self.stop_ids)}; to end elsewhere, "
                "use stop strings (stop).",
            )

    def _check_logit_bias(self, request: ParsedRequest) -> None:
        """logit_bias names tokens of this vocabulary, and never the mask token, which this model never emits."""
        bad = [t for t in request.logit_bias or () if t >= self.vocab_size]
        if bad:
            raise invalid(
                "logit_bias", f"logit_bias has token ids outside the vocabulary (0..{self.vocab_size - 1}): {bad[:5]}."
            )
        if self.scheduler.mask_token_id in (request.logit_bias or ()):
            raise invalid(
                "logit_bias",
                f"logit_bias names token {self.scheduler.mask_token_id}, the mask token, which WeDLM decoding never "
                "emits.",
            )

    def _check_answer_size(self, request: ParsedRequest, prompts: list[list[int]], max_tokens: int) -> int:
        """`max_tokens`, unless the answer would hold more log-probability entries than --max-logprob-entries (per
        choice, each echoed prompt token and, with logprobs, each completion token, times 1 + top alternatives):
        then a max_tokens the request left out (chat's default: the rest of the context) is lowered to fit, and a
        request that set it is refused."""
        top = request.logprobs
        per_token = 1 if top is None else 1 + top
        echoed = sum(len(p) for p in prompts) if request.echo else 0
        limit = self.limits.max_logprob_entries
        if top is not None and request.max_tokens is None:
            fits = (limit // (request.n * per_token) - echoed) // len(prompts)
            max_tokens = min(max_tokens, max(fits, 1))
        completion = 0 if top is None else max_tokens
        entries = request.n * (echoed + completion * len(prompts)) * per_token
        if entries > limit:
            param = "logprobs" if top is not None else "echo"
            raise invalid(
                param,
                f"This request's answer would hold {entries} entries ((echoed prompt tokens + max_tokens with "
                f"logprobs) x choices x (1 + top log-probabilities)); this server returns at most {limit} per request "
                "(--max-logprob-entries): ask for fewer top log-probabilities, fewer choices or fewer tokens.",
                code="answer_too_large",
            )
        return max_tokens

    def grammar(self, request: ParsedRequest):
        """The request's response schema, or the grammar of its tool calls (with the response schema beside them
        when both are given), compiled (once per spec: the compiler caches it), or None."""
        tools = request.tools is not None and request.tools.active
        if request.json_schema is None and not tools:
            return None
        spec = ("lark", tool_grammar(request.tools, self.tool_format, request.json_schema)) if tools else None
        param = self.grammar_param(request)
        started = time.perf_counter()
        try:
            grammar = compile_grammar(spec or request.json_schema, self.tokenizer, self.vocab_size)
        except ImportError:
            raise APIError(
                400,
                f"{param} needs structured output, which this server was installed without: "
                "pip install 'wedlm-hf[serve]'.",
                param=param,
                code="unsupported_parameter",
            ) from None
        except ValueError as error:
            param, words = self._grammar_fault(request, param, error) if tools else (param, None)
            raise invalid(param, words or f"{param}: the schema cannot be used: {error}") from None
        seconds = time.perf_counter() - started
        for observe in self.grammar_observers:
            observe(seconds)
        return grammar

    @staticmethod
    def grammar_param(request: ParsedRequest) -> str:
        """What a request's grammar is named after in errors: its tools when it calls them, else its schema."""
        tools = request.tools is not None and request.tools.active
        return request.param("tools" if tools else "response_format")

    def _grammar_fault(self, request: ParsedRequest, param: str, error: ValueError) -> tuple[str, str | None]:
        """Where the calls' grammar cannot be compiled: the tool whose parameters break it, else the response
        schema beside them (each compiled alone, past the grammar cache); (param, None) where neither alone fails."""
        check = functools.partial(compile_grammar, tokenizer=self.tokenizer, vocab_size=self.vocab_size, keep=False)
        fault = tool_at_fault(request.tools, check)
        if fault is not None:
            return fault
        if request.json_schema is not None:
            name = request.param("response_format")
            try:
                check(request.json_schema)
            except ValueError as alone:
                return name, f"{name}: the schema cannot be used: {alone}"
        return param, None


def check_tool_format(tokenizer, parser: str, model_id: str):
    """The `ToolFormat` of `--tool-call-parser`, checked against the chat template: a template that writes its
    calls in another known format is refused (the model would call tools in a way this server does not read);
    one that writes no known tag cannot be checked, which is logged once."""
    form = TOOL_FORMATS[parser]
    if form.tag in getattr(tokenizer, "all_special_tokens", ()):
        raise ValueError(
            f"--tool-call-parser {parser}: {form.tag} is a special token of this tokenizer, which decoded text never "
            "holds; this server reads calls from the text."
        )
    taught = template_tool_format(tokenizer)
    if taught is not None and taught is not form:
        raise ValueError(
            f"--tool-call-parser {parser}: the chat template of {model_id} writes tool calls with {taught.tag} (the "
            f"{taught.name} format), not {form.tag}: serve it with --tool-call-parser {taught.name}."
        )
    if taught is None and getattr(tokenizer, "chat_template", None):
        LOGGER.info(
            "--tool-call-parser %s cannot be checked against the chat template of %s: it renders no call in a known "
            "format (%s).",
            parser,
            model_id,
            ", ".join(TOOL_FORMATS),
        )
    return form


def check_model_folder(model: str | None) -> str:
    """The checkpoint `--model` names (the shipped model when None); a path that is no folder is refused."""
    path = model or default_model_path()
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1  # a Hub id is NAME or ORG/NAME
    if looks_local and not os.path.isdir(os.path.expanduser(path)):
        raise FileNotFoundError(f"--model {path}: no such folder (give a checkpoint folder or a Hub id ORG/NAME)")
    return path


def load_model(
    path: str, device: str | None, dtype: str = "auto", split: bool = False, quantization: str | None = None
):
    """The checkpoint at `path` on `device` in `dtype` (`--dtype`), its weights quantized as `quantization` says
    (`--quantization`; a checkpoint saved quantized loads as saved); `split`: this process is one rank of several
    (`tensor_parallel`), which loads its slice of every layer with transformers' `tp_plan="auto"`, on its device."""
    device = serving_device(device)
    dtype = load_dtype(dtype, device, path)
    if split:
        from transformers.distributed import DistributedConfig

        if quantization is not None or quantization_name(AutoConfig.from_pretrained(path)) is not None:
            raise ValueError(
                "--tensor-parallel-size: quantized weights (--quantization, or a checkpoint saved quantized) are not "
                "available under tensor parallelism yet; serve this checkpoint on one device."
            )
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, distributed_config=DistributedConfig(tp_plan="auto")
        )
    quantize = quantization_config(quantization, device, path, dtype)
    if quantize is None and quantization_name(AutoConfig.from_pretrained(path)) is None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    # quantized weights are placed as they load (bitsandbytes' cannot be moved afterwards)
    given = {} if quantize is None else {"quantization_config": quantize}  # None would drop the saved one
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map={"": device}, **given)


def serving_device(device: str | None) -> torch.device:
    """The device to serve on, checked before the model loads: CUDA when available unless told otherwise."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"--device {device!r} is not a torch device ({exc}): give cpu, cuda or cuda:N.") from None
    try:
        torch.empty(1, device=resolved)
    except (RuntimeError, AssertionError) as exc:  # AssertionError: torch was built without that backend
        found = "a CUDA GPU was found" if torch.cuda.is_available() else "no CUDA GPU is usable here"
        raise ValueError(f"--device {device!r} cannot be used ({' '.join(str(exc).split())}); {found}.") from None
    return resolved


def compile_config_for(device: torch.device) -> CompileConfig:
    """How `--compile` compiles the decoding step: CUDA graphs on a GPU (transformers' own default for compiled
    decoding), inductor's default mode elsewhere (CUDA graphs need CUDA)."""
    return CompileConfig(mode="reduce-overhead" if device.type == "cuda" else "default")


def default_model_name(model: str | None) -> str:
    """What clients call the model when --served-model-name is not given: never a local path."""
    if model is None:
        return DEFAULT_MODEL_ID
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        return os.path.basename(os.path.normpath(os.path.abspath(path)))
    return model


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
