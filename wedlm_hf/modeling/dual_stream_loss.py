"""The WeDLM training loss on a dual-stream batch, and the mask form that both sdpa and eager attention accept.

A dual-stream batch holds `[x0 ; xt]` per row: the clean stream x0 (first half) learns next-token prediction, the
reordered prediction stream xt (second half) learns to fill its masks. `labels` are already aligned to the row
that predicts them; `label_weights` carry 1/gamma of each masked row's block (0 elsewhere).
"""

import torch
import torch.nn.functional as F


def additive_attention_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean 4D mask (True = may attend) as an additive float mask: eager attention ignores boolean masks."""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def dual_stream_loss(
    logits: torch.Tensor, labels: torch.Tensor, label_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (total, ar, mlm): total = (ar + mlm) / 2.

    ar: mean next-token cross-entropy over the clean stream's labelled rows.
    mlm: cross-entropy of the prediction stream's masked rows, weighted by `label_weights` normalised to sum 1.
    """
    batch, rows, vocab = logits.shape
    if rows % 2:
        raise ValueError(f"A dual-stream batch has an even number of rows ([x0 ; xt]), got {rows}.")
    half = rows // 2
    per_row = F.cross_entropy(
        logits.float().reshape(-1, vocab), labels.reshape(-1), ignore_index=-100, reduction="none"
    ).view(batch, rows)
    labelled = labels != -100

    ar_rows = labelled[:, :half]
    ar = (per_row[:, :half] * ar_rows).sum() / ar_rows.sum().clamp_min(1)

    weights = label_weights[:, half:].float() * labelled[:, half:]
    mlm = (per_row[:, half:] * weights).sum() / weights.sum().clamp_min(torch.finfo(torch.float32).tiny)
    return (ar + mlm) / 2, ar, mlm
