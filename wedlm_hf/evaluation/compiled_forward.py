"""A compiled forward swapped in for some runs only, as a user compiles a model for static-cache decoding on the CPU.

The benchmarks time eager and compiled decoders on one model: the compiled ones run with `torch.compile` of the
model's own forward in its place, the eager ones with the model's forward as it was.
"""

import contextlib

import torch

# The graphs a benchmark's compiled forward may take: AR and WeDLM at several batch sizes and widths share it, past
# dynamo's default limit (8), where a "compiled" run would go on eagerly with only a warning to say so.
COMPILED_GRAPHS = 64


@contextlib.contextmanager
def swapped_forward(model, forward):
    """`model.forward` is `forward` inside the block (e.g. `torch.compile(model.forward)`), with room for
    COMPILED_GRAPHS graphs; afterwards the model has its own forward again (an instance attribute it had is put
    back, else the class's method shows through)."""
    had = "forward" in vars(model)
    original = vars(model).get("forward")
    model.forward = forward
    room = max(torch._dynamo.config.recompile_limit, COMPILED_GRAPHS)
    try:
        with torch._dynamo.config.patch(recompile_limit=room):
            yield model
    finally:
        if had:
            model.forward = original
        else:
            del model.forward


def compiled_forward(model, backend: str = "inductor"):
    """`torch.compile` of the model's own forward, as a user compiles a model for static-cache AR decoding."""
    return torch.compile(model.forward, backend=backend)


def swapped_in(model, compiled, swap: bool):
    """`swapped_forward(model, compiled)` where `swap`, else a block that changes nothing."""
    return swapped_forward(model, compiled) if swap else contextlib.nullcontext()
