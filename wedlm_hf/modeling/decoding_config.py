"""The WeDLM decoding options, defined once: `WeDLMDecodingConfig`, their defaults and their checks.

Every door derives from it: `generate`'s `wedlm_*` arguments and the generation config they fall back to, the
check of `generation_config.json` at load, Hub export's defaults, the server's request fields and the command line.
A bad value gets one error text (`WeDLMOptionError`, naming the `wedlm_*` key), whichever door it came through;
the server adds only its own limits (the largest window it serves, the longest context n-gram it matches).
"""

import math
from dataclasses import asdict, dataclass, fields

PREFIX = "wedlm_"
# Context n-grams matched at most: a row indexes every size up to it, in memory that grows with its square.
MAX_CONTEXT_NGRAM = 16


class WeDLMOptionError(ValueError):
    """A `wedlm_*` value decoding cannot use; `key` is the option's `wedlm_*` name."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class WeDLMDecodingConfig:
    """How WeDLM decodes a row (docs/algorithm.md): the options `generate` takes as `wedlm_<name>`."""

    window_size: int = 16  # W: uncommitted slots in the window
    entropy_threshold: float | None = 0.4  # tau, in nats: fill masks below it (None: one token per forward)
    pos_penalty_factor: float = 0.02  # lambda: entropy penalty per slot of distance from the committed text
    lossless: bool = False  # verify every draft against AR: plain generate()'s output, several tokens per forward
    context_drafts: bool = True  # draft tokens copied from the context, kept where AR agrees (section 3.m, 6.f)
    context_ngram: int = 3  # the longest suffix matched there, tried down to one token

    def __post_init__(self):
        def refuse(name: str, expected: str) -> None:
            value, default = getattr(self, name), getattr(WeDLMDecodingConfig, name)
            raise WeDLMOptionError(
                PREFIX + name, f"{PREFIX}{name} must be {expected} (default: {default}), got {value!r}."
            )

        if not _is_int(self.window_size) or self.window_size < 1:
            refuse("window_size", "an integer >= 1")
        for name in ("entropy_threshold", "pos_penalty_factor"):  # JSON's integers, stored as the floats they mean
            value = getattr(self, name)
            if _is_number(value):
                try:
                    object.__setattr__(self, name, float(value))
                except OverflowError:  # an integer beyond any float
                    refuse(name, "a number a float can hold")
        threshold = self.entropy_threshold  # NaN compares false with everything: it would disable the threshold
        if threshold is not None and (not _is_number(threshold) or math.isnan(threshold) or threshold < 0):
            refuse(
                "entropy_threshold",
                "a number >= 0 in nats (inf fills every mask) or None (JSON: null) for one token per forward",
            )
        penalty = self.pos_penalty_factor
        if not _is_number(penalty) or not math.isfinite(penalty) or penalty < 0:
            refuse("pos_penalty_factor", "a finite number >= 0")
        for name in ("lossless", "context_drafts"):
            if not isinstance(getattr(self, name), bool):
                refuse(name, "a boolean: true or false (True or False in Python)")
        if not _is_int(self.context_ngram) or not 1 <= self.context_ngram <= MAX_CONTEXT_NGRAM:
            refuse("context_ngram", f"an integer from 1 to {MAX_CONTEXT_NGRAM}")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The options' `wedlm_*` names, as `generate`, generation configs and request bodies spell them."""
        return tuple(PREFIX + f.name for f in fields(cls))

    @classmethod
    def from_values(cls, *sources, **overrides) -> "WeDLMDecodingConfig":
        """The options found in `sources` (generation configs or dicts, by `wedlm_*` key; later ones win), then
        `overrides` (by `wedlm_*` key), over the defaults."""
        given = {}
        for source in sources:
            found = source if isinstance(source, dict) else vars(source) if source is not None else {}
            given |= {key: found[key] for key in cls.keys() if key in found}
        given |= overrides
        unknown = sorted(set(given) - set(cls.keys()))
        if unknown:
            raise WeDLMOptionError(unknown[0], f"Unknown WeDLM option {unknown[0]!r}; known: {', '.join(cls.keys())}.")
        return cls(**{key[len(PREFIX) :]: value for key, value in given.items()})

    def as_kwargs(self) -> dict:
        """`{"wedlm_window_size": 16, ...}`: the options as `generate` and generation configs take them."""
        return {PREFIX + name: value for name, value in asdict(self).items()}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
