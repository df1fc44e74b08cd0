"""Evaluation wing: what the project measures, each run side by side in one process.

- `evaluate`: `wedlm-hf evaluate`, held-out quality and speed of WeDLM against plain AR (the JSON cards quote).
- `benchmark`: `wedlm-hf bench`, AR vs WeDLM vs the no-cache block-wise baseline.
- `blockwise_baseline`: that baseline, in the style of the authors' transformers class.
- `lossless_benchmark`: `wedlm-hf bench-lossless`, lossless WeDLM vs AR and prompt lookup, per prompt family.
- `step_benchmark`: `wedlm-hf bench-step`, the decoder's own cost per step; `structured_benchmark`:
  `wedlm-hf bench-structured`, WeDLM under a JSON schema against AR with the grammar's processor.
- `interleaved_runs`, `bench_report`, `compiled_forward`: what the benchmarks share: runs interleaved and kept at
  their best, the tables, ratios and counts they print, a compiled forward swapped in for some runs.
- `serve_benchmark`: `wedlm-hf bench-serve`, concurrent streaming clients (`streaming_clients`) against servers
  each in its own process (`server_process`, whose `free_port` tests use too); `stock_qwen3`: the same weights as
  a stock Qwen3 checkpoint, for `transformers serve`.
- `demo`: `wedlm-hf generate`, a streamed completion next to plain AR.

Public to other wings: nothing. Imports the core and the data wing's `default_model_path` and task items.
"""
