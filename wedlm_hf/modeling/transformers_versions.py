"""What differs between the transformers versions wedlm-hf supports (5.23 up to 6), in one place.

From 5.24 transformers names the KV cache `cache` where it said `past_key_values`: in `forward`, in `generate`'s
keyword arguments and in `generate`'s output. The core reads the installed version's names here; a model's own
`forward` (remote code written for either version) is read from its signature.
"""

import inspect
import weakref

from transformers import GenerationMixin
from transformers.generation import GenerateDecoderOnlyOutput

# transformers' name for the KV cache argument: `cache` from 5.24 on, `past_key_values` before.
CACHE_KWARG = (
    "cache"
    if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    else "past_key_values"
)
# The output field holding the KV cache, named the same way.
OUTPUT_CACHE_FIELD = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"

_FORWARD_ARGUMENTS = weakref.WeakKeyDictionary()


def forward_arguments(model) -> tuple[str, bool]:
    """The name `model.forward` takes its KV cache under, and whether it takes `logits_to_keep`. Stock models follow
    the installed transformers, remote code may still say `past_key_values`; a forward that takes the cache only
    through **kwargs gets the current name. Read from the signature once per forward function, not at every
    `generate` call (each read costs tens of microseconds)."""
    forward = getattr(model.forward, "__func__", model.forward)
    try:
        return _FORWARD_ARGUMENTS[forward]
    except (KeyError, TypeError):  # TypeError: a callable that takes no weak reference is read every time
        pass
    parameters = inspect.signature(model.forward).parameters
    found = next((name for name in ("cache", "past_key_values") if name in parameters), CACHE_KWARG)
    facts = (found, "logits_to_keep" in parameters)
    try:
        _FORWARD_ARGUMENTS[forward] = facts
    except TypeError:
        pass
    return facts


def cache_argument(model_kwargs: dict):
    """Pops the cache given to `generate` as `past_key_values` (transformers <= 5.23) or `cache` (from 5.24)."""
    past_key_values = model_kwargs.pop("past_key_values", None)
    cache = model_kwargs.pop("cache", None)
    if past_key_values is not None and cache is not None and past_key_values is not cache:
        raise ValueError("Pass the cache once: as `cache` (or `past_key_values`, its older name), not both.")
    return cache if cache is not None else past_key_values
