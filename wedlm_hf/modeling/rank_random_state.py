"""Sampling under tensor parallelism: every rank draws what rank 0 draws.

A model split by transformers' `tp_plan` runs each forward on every rank, and WeDLM decoding's number of forwards
depends on the tokens drawn. Ranks whose random generators differ (none seeded, or seeded apart) would draw different
tokens from the same logits, run different numbers of forwards, and wait for each other forever. So a generation on
a split model starts from rank 0's random state on every rank: its tokens are those a single process with that state
draws, and the ranks stay in step.
"""

import torch
import torch.distributed as dist


def share_random_state(model) -> None:
    """Gives every rank of `model`'s tensor-parallel group rank 0's torch random state (and its CUDA device's);
    nothing for a model that is not split."""
    if (getattr(model, "tp_size", None) or 1) <= 1 or not dist.is_initialized():
        return
    mesh = getattr(getattr(model, "_mesh_manager", None), "get_mesh", None)
    group = mesh("tp").get_group() if mesh is not None else None
    device = model.device
    states = [torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None]
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(states, src=src, group=group, device=device if device.type == "cuda" else None)
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1], device)
