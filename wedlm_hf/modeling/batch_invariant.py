"""The batch-invariance switch: `with batch_invariant(): model.generate(...)` (docs/algorithm.md section 7).

Under it a row's logits depend only on the row (its tokens, positions and cached K/V), never on how many rows share
the forward, their lengths, its place in the batch, the padding or how its prompt was chunked. Two operations are
replaced, in the thread that entered the switch:

- `aten::mm` and `aten::addmm` on the CPU (every linear layer) take `invariant_matmul`'s products, through
  `torch.library` overrides registered while any thread is inside and removed when the last one leaves (other
  threads keep torch's kernels meanwhile);
- transformers' "sdpa" attention takes `tiled_attention`, through `AttentionInterface`, so that plain AR `generate`
  and WeDLM decoding alike run on it and can be compared bit for bit.

The rest of a decoder layer (embedding, RMSNorm, rotary embedding, SiLU, residual adds) is elementwise or reduces
within one row, and gives a row the same bits at any batch size as it is (`tests/modeling/test_batch_invariant.py`).

What the switch cannot make invariant it refuses with one line naming it (`refusal`): a device other than the CPU,
attention other than sdpa, attention dropout or score biases, quantized weights, and compiled forwards.
"""

import contextlib
import functools
import threading
import warnings

import torch
from transformers import AttentionInterface

from .invariant_matmul import invariant_addmm, invariant_mm, original_mm
from .tiled_attention import probe_attention_products, tiled_attention

COVERED_ATTENTION = "sdpa"
QUANTIZED_REFUSAL = (
    "batch_invariant(): quantized weights run their own matrix kernels, which the switch does not cover: load the "
    "model unquantized or leave the switch off."
)
_STATE = threading.local()  # this thread's depth of `with batch_invariant()`
_LOCK = threading.Lock()
_installed: dict = {"users": 0, "library": None, "attention": {}}


def is_active() -> bool:
    """Whether this thread is inside `batch_invariant()`."""
    return getattr(_STATE, "depth", 0) > 0


@contextlib.contextmanager
def batch_invariant():
    """Makes every forward this thread runs inside it batch-invariant: a row's logits depend only on the row. It
    nests, and works as a decorator too. Refused cases raise a ValueError naming them (`refusal`)."""
    with _LOCK:
        if _installed["users"] == 0:
            _install()
        _installed["users"] += 1
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1
        with _LOCK:
            _installed["users"] -= 1
            if _installed["users"] == 0:
                _uninstall()


def refusal(model) -> str | None:
    """Why `model`'s forwards cannot run batch-invariant, in one line; None when they can."""
    config = model.config
    device = next(model.parameters()).device
    if device.type != "cpu":
        return _device_refusal(device)
    attention = getattr(config, "_attn_implementation", None) or COVERED_ATTENTION
    if attention != COVERED_ATTENTION:
        return _attention_refusal(attention)
    if getattr(config, "quantization_config", None) is not None:
        return QUANTIZED_REFUSAL
    return None


def check_model(model) -> None:
    """Raises `refusal(model)` when this thread is inside the switch and the model is not covered."""
    if is_active():
        reason = refusal(model)
        if reason is not None:
            raise ValueError(reason)


def _device_refusal(device) -> str:
    return (
        f"batch_invariant() covers CPU forwards only: on {device.type} the matrix and attention kernels are chosen "
        "by the batch's shape and wedlm-hf has no invariant ones there; run on the CPU or leave the switch off."
    )


def _attention_refusal(name: str) -> str:
    return (
        f"batch_invariant(): attention {name!r} is not covered (its kernels sum a row's keys in blocks that follow "
        "the batch's lengths): load the model with attn_implementation='sdpa' (the default) or leave the switch off."
    )


def _check_forward(module, query, dropout, kwargs) -> None:
    """The refusals an attention call can see: device, compilation, dropout, score biases, quantized weights."""
    if query.device.type != "cpu":
        raise ValueError(_device_refusal(query.device))
    if torch.compiler.is_compiling():
        raise ValueError(
            "batch_invariant(): a compiled forward (torch.compile) generates its own kernels, which the switch does "
            "not cover: run the forward eagerly (serve without --compile) or leave the switch off."
        )
    if dropout:
        raise ValueError("batch_invariant(): attention dropout is not covered: call model.eval() first.")
    for name in ("softcap", "position_bias"):
        if kwargs.get(name) is not None:
            raise ValueError(f"batch_invariant(): attention with {name} is not covered: leave the switch off.")
    if getattr(getattr(module, "config", None), "quantization_config", None) is not None:
        raise ValueError(QUANTIZED_REFUSAL)


def _invariant_sdpa(original):
    @functools.wraps(original)
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        if not is_active():
            return original(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
                **kwargs,
            )  # fmt: skip
        _check_forward(module, query, dropout, kwargs)
        probe_attention_products(query.shape[-1], query.device)
        return tiled_attention(module, query, key, value, attention_mask, scaling, is_causal), None

    return attention


def _refusing(name: str, original):
    @functools.wraps(original)
    def attention(*args, **kwargs):
        if is_active():
            raise ValueError(_attention_refusal(name))
        return original(*args, **kwargs)

    return attention


def _mm(a, b):
    return invariant_mm(a, b) if is_active() else original_mm(a, b)


def _addmm(bias, a, b, *, beta=1, alpha=1):
    if is_active():
        return invariant_addmm(bias, a, b, beta=beta, alpha=alpha)
    out = a.new_empty(torch.broadcast_shapes(bias.shape, (a.shape[0], b.shape[1])))
    return torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=out)  # addmm.out: torch's own kernel


def _install() -> None:
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # torch says once that a kernel is overridden: that is the point here
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        library.impl("mm", _mm, "CPU")
        library.impl("addmm", _addmm, "CPU")
    _installed["library"] = library
    interface = AttentionInterface()  # a fresh instance: the mapping every model shares, no local overrides
    saved = _installed["attention"] = {name: interface[name] for name in interface}
    for name, original in saved.items():
        wrapper = _invariant_sdpa(original) if name == COVERED_ATTENTION else _refusing(name, original)
        AttentionInterface.register(name, wrapper)


def _uninstall() -> None:
    _installed["library"]._destroy()
    _installed["library"] = None
    for name, original in _installed["attention"].items():
        AttentionInterface.register(name, original)
    _installed["attention"] = {}
