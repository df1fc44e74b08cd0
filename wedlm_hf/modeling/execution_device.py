"""The device a model computes on, which is not always `model.device`.

A model that accelerate offloaded (`device_map="auto"` with too little memory, `offload_folder`) keeps the weights
it streams in on the meta device, so `model.device` (its first parameter's) may say "meta". accelerate's hooks then
run each module on the main device of its map: the first one that is neither "cpu" nor "disk", else the CPU. The
decoder puts its inputs and bookkeeping there, as AR `generate` does with inputs on that device.
"""

import torch


def execution_device(model) -> torch.device:
    """`model.device`, or for weights offloaded to the meta device, accelerate's main device of its map."""
    device = model.device
    if device.type != "meta":
        return device
    placed = [d for d in (getattr(model, "hf_device_map", None) or {}).values() if d not in ("cpu", "disk", "meta")]
    if not placed:
        return torch.device("cpu")
    return torch.device("cuda", placed[0]) if isinstance(placed[0], int) else torch.device(placed[0])
