"""The served model: loading, prompt encoding against the context limit, and each choice's decoding settings.

Defaults come from the checkpoint: the WeDLM options and sampling settings of its generation config (the shipped
model decodes greedily unless a request sets `temperature` > 0), its eos token(s) as stop ids, and
`max_position_embeddings` as the context. Every choice gets its own sampler generator (seeded from the request's
`seed` and the choice index), so a sampled row draws the same tokens whatever else shares the batch; greedy rows
share one sampler, which lets the decoder take their argmax in one call.
"""

import os
import secrets

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..data import default_model_path
from ..modeling import WEDLM_GENERATION_DEFAULTS
from ..modeling.streaming_decoder import DecodingSettings
from ..modeling.window_filling import FillSampler
from .incremental_text import IncrementalText
from .openai_schema import WEDLM_FIELDS, APIError, ParsedRequest, WeDLMOptions, invalid, wedlm_options
from .scheduler import Choice, Scheduler

DEFAULT_MODEL_ID = "wedlm-hf-default"
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the rest of the context
_GREEDY = FillSampler(False)


class ServingEngine:
    def __init__(self, model, tokenizer, model_id: str, max_batch_size: int = 16, max_queue: int = 64):
        mask_token_id = getattr(model.config, "mask_token_id", None)
        if mask_token_id is None:
            raise ValueError(
                f"{model_id} has no mask_token_id in its config, so it cannot be served with WeDLM decoding: set "
                '"mask_token_id" in its config.json (151665 for the released Qwen-based WeDLM models).'
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.context = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        self.vocab_size = model.config.get_text_config().vocab_size
        generation = model.generation_config
        self.stop_ids = frozenset(_ids(generation.eos_token_id) or _ids(model.config.eos_token_id))
        if not self.stop_ids and tokenizer.eos_token_id is not None:
            self.stop_ids = frozenset({tokenizer.eos_token_id})
        given = {key: getattr(generation, key) for key in WEDLM_FIELDS if hasattr(generation, key)}
        try:  # the generation config's options, checked like a request's
            self.defaults = wedlm_options(given, WeDLMOptions(*(WEDLM_GENERATION_DEFAULTS[k] for k in WEDLM_FIELDS)))
        except APIError as exc:
            raise ValueError(f"generation_config.json of {model_id}: {exc.message}") from exc
        self._sampling_defaults = (
            bool(generation.do_sample),
            generation.temperature,
            generation.top_p,
            generation.top_k,
        )
        self.scheduler = Scheduler(model, int(mask_token_id), max_batch_size, max_queue)

    @classmethod
    def load(cls, model: str | None = None, device: str | None = None, **kwargs) -> "ServingEngine":
        """Loads a WeDLM checkpoint (folder or Hub id; the shipped model by default) in float32."""
        path = model or default_model_path()
        looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1  # a Hub id is NAME or ORG/NAME
        if looks_local and not os.path.isdir(os.path.expanduser(path)):
            raise FileNotFoundError(f"--model {path}: no such folder (give a checkpoint folder or a Hub id ORG/NAME)")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer = AutoTokenizer.from_pretrained(path)
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
        return cls(loaded, tokenizer, model or DEFAULT_MODEL_ID, **kwargs)

    # ---- prompts ------------------------------------------------------------------------------------------

    def encode(self, request: ParsedRequest) -> list[list[int]]:
        """Token ids of each prompt (completions) or of the rendered conversation (chat)."""
        if request.kind == "chat":
            return [self._chat_ids(request.messages)]
        encoded = []
        for i, prompt in enumerate(request.prompts):
            param = "prompt" if len(request.prompts) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                ids = self.tokenizer(prompt).input_ids
            else:
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

    def _chat_ids(self, messages: list[dict]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise invalid(
                "messages",
                f"The tokenizer of {self.model_id} has no chat template, so /v1/chat/completions cannot build a "
                'prompt: use /v1/completions, or add a "chat_template" to the checkpoint\'s tokenizer_config.json.',
                code="no_chat_template",
            )
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # the template refused the conversation (e.g. raise_exception in the template)
            raise invalid("messages", f"The chat template refused these messages: {exc}") from exc
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if not ids:
            raise invalid("messages", "The chat template rendered these messages as an empty prompt.")
        return ids

    def max_tokens(self, request: ParsedRequest, prompts: list[list[int]]) -> int:
        """The request's max_tokens, checked against the context (prompt + max_tokens <= max_position_embeddings)."""
        longest = max(len(p) for p in prompts)
        room = None if self.context is None else self.context - longest
        if room is not None and room < 1:
            raise invalid(
                "messages" if request.kind == "chat" else "prompt",
                f"This model's maximum context length is {self.context} tokens and the prompt has {longest}: "
                "shorten the prompt.",
                code="context_length_exceeded",
            )
        if request.max_tokens is None:
            if room is None:
                return COMPLETION_DEFAULT_MAX_TOKENS
            return min(COMPLETION_DEFAULT_MAX_TOKENS, room) if request.kind == "completion" else room
        if room is not None and request.max_tokens > room:
            raise invalid(
                "max_tokens",
                f"This model's maximum context length is {self.context} tokens; the prompt has {longest} and "
                f"max_tokens asks for {request.max_tokens} more: lower max_tokens to {room} or shorten the prompt.",
                code="context_length_exceeded",
            )
        return request.max_tokens

    # ---- settings ------------------------------------------------------------------------------------------

    def choices(self, request: ParsedRequest, prompts: list[list[int]]) -> list[Choice]:
        """One choice per (prompt, n) in OpenAI's order: index = prompt_index * n + j."""
        max_tokens = self.max_tokens(request, prompts)
        choices = []
        for p, prompt in enumerate(prompts):
            for j in range(request.n):
                index = p * request.n + j
                settings = DecodingSettings(
                    max_new_tokens=max_tokens,
                    window_size=request.wedlm.window_size,
                    entropy_threshold=request.wedlm.entropy_threshold,
                    pos_penalty_factor=request.wedlm.pos_penalty_factor,
                    lossless=request.wedlm.lossless,
                    sampler=self._sampler(request, index),
                    stop_ids=self.stop_ids,
                )
                choices.append(Choice(index, prompt, settings, IncrementalText(self.tokenizer, request.stop)))
        return choices

    def _sampler(self, request: ParsedRequest, index: int) -> FillSampler:
        do_sample, temperature, top_p, top_k = self._sampling_defaults
        if request.temperature is not None:
            do_sample, temperature = request.temperature > 0, request.temperature
        elif request.top_p is not None and request.top_p < 1:
            do_sample = True
        if not do_sample:
            return _GREEDY
        top_p = request.top_p if request.top_p is not None else top_p
        warpers = LogitsProcessorList()  # the order generate uses: temperature, top-k, top-p
        if temperature is not None and temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if top_k:
            warpers.append(TopKLogitsWarper(top_k))
        if top_p is not None and top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
        seed = secrets.randbits(62) if request.seed is None else (request.seed * 1_000_003 + index) % 2**62
        generator = torch.Generator(device=self.model.device).manual_seed(seed)
        return FillSampler(True, warpers, generator=generator)


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
