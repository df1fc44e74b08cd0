"""What differs between the transformers versions wedlm-hf supports (5.23 up to 6), in one place.

From 5.24 transformers names the KV cache `cache` where it said `past_key_values`: in `forward`, in `generate`'s
keyword arguments and in `generate`'s output. The core reads the installed version's names here; a model's own
`forward` (remote code written for either version) is read from its signature. `tp_plan` passed to `from_pretrained`
is deprecated in every supported version for a `DistributedConfig`, which `distributed_argument` builds.
"""

import inspect
import warnings
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


def distributed_argument(kwargs: dict, stacklevel: int) -> dict:
    """`from_pretrained` keyword arguments with `tp_plan` / `tp_size` moved into a `DistributedConfig`, which is
    where transformers reads them since 5.x (passed directly they are deprecated). The deprecation is reported at the
    caller's line `stacklevel` frames up, not at this package's `from_pretrained`, which only passes them on."""
    standalone = {name: kwargs[name] for name in ("tp_plan", "tp_size") if kwargs.get(name) is not None}
    if not standalone:
        return kwargs
    if kwargs.get("distributed_config") is not None:
        raise ValueError(
            "Pass either `distributed_config` or the standalone `tp_plan`/`tp_size` arguments, not both: set them "
            "on `DistributedConfig`."
        )
    from transformers.distributed import DistributedConfig

    if "tp_plan" in standalone:
        warnings.warn(
            "Passing `tp_plan` directly to `from_pretrained` is deprecated in transformers: pass "
            "`distributed_config=DistributedConfig(tp_plan=...)` (from transformers.distributed).",
            FutureWarning,
            stacklevel=stacklevel + 1,
        )
    kwargs = {name: value for name, value in kwargs.items() if name not in ("tp_plan", "tp_size")}
    kwargs["distributed_config"] = DistributedConfig(**standalone)
    return kwargs
