"""Training wing: turning AR checkpoints into WeDLM models and training them with the stock Trainer.

- `dual_stream_collator`: `DualStreamCollator`, the `[x0 ; xt]` batches with their 4D mask and weighted labels.
- `trainer`: `wedlm-hf train` (`train()`), Trainer with the loss halves logged, resumable and seeded.
- `conversion`: `wedlm-hf convert` (`convert_ar_checkpoint()`), an AR checkpoint as a WeDLM one.

Public to other wings: `DualStreamCollator`. Uses the core and the data wing's `offline_mix`.
"""

from .dual_stream_collator import DualStreamCollator

__all__ = ["DualStreamCollator"]
