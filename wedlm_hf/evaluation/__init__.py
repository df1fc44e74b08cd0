"""Evaluation wing: what the project measures, each run side by side in one process.

- `evaluate`: `wedlm-hf evaluate`, held-out quality and speed of WeDLM against plain AR (the JSON cards quote).
- `benchmark`: `wedlm-hf bench`, AR vs WeDLM vs the no-cache block-wise baseline.
- `blockwise_baseline`: that baseline, in the style of the authors' transformers class.
- `lossless_benchmark`: `wedlm-hf bench-lossless`, lossless WeDLM vs AR and prompt lookup, per prompt family.
- `demo`: `wedlm-hf generate`, a streamed completion next to plain AR.

Public to other wings: nothing. Imports the core and the data wing's `default_model_path` and task items.
"""
