"""Training wing: turning AR checkpoints into WeDLM models and training them with the stock Trainer.

- `dual_stream_collator`: `DualStreamCollator`, the `[x0 ; xt]` batches with their 4D mask and weighted labels.
- `trainer`: `wedlm-hf train` (`train()`), Trainer with the loss halves logged, resumable and seeded; bad options
  and malformed data refused.
- `checkpoints`: checkpoints that appear whole, and `--resume` from the newest complete one after a crash.
- `conversion`: `wedlm-hf convert` (`convert_ar_checkpoint()`), an AR checkpoint as a WeDLM one.

Public to other wings: `DualStreamCollator`. Uses the core, the data wing's `offline_mix` and `portable_path`, and
the Hub wing's `check_safetensors` and `staged_checkpoint`.
"""

from .dual_stream_collator import DualStreamCollator

__all__ = ["DualStreamCollator"]
