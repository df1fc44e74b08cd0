"""gpu_check.sh part (f): how many times a sampled WeDLM step waits for the device.

Rows that sample, each with its own generator (a server's seeded requests), decode on a small random model, default
and lossless mode. On CUDA, torch's sync debug mode ("warn") reports every synchronising call, those inside torch's
own operators included; the step's one read is the target. The CPU dry run has no synchronisations to report: it
counts the Python-level reads instead (`step_benchmark.HostReads`). Then whether samplers processed as one batch
(`sampler_batch`) give each row, on the device, the scores transformers' warpers give it alone (on CUDA a temperature
is a product with its reciprocal, as PyTorch divides by a Python number there).
"""

import warnings

import torch

from wedlm_hf import WeDLMConfig, WeDLMForCausalLM
from wedlm_hf.evaluation.step_benchmark import HostReads
from wedlm_hf.modeling.decoding_state import DecodingSettings
from wedlm_hf.modeling.streaming_decoder import StreamingDecoder
from wedlm_hf.modeling.window_filling import FillSampler

MODEL = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
MODEL |= dict(head_dim=64, vocab_size=32000, max_position_embeddings=4096, mask_token_id=31999)


def _count(device: str, step) -> int:
    """Synchronisations (CUDA) or host reads (CPU) while `step()` runs."""
    if device == "cpu":
        with HostReads() as reads:
            step()
        return reads.count
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def sampled_step_syncs(device: str, dtype: torch.dtype, rows: int = 8, steps: int = 6) -> dict:
    """Per mode: the synchronisations of each decoding step after the first (the prefill), printed, and the most."""
    torch.manual_seed(0)
    model = WeDLMForCausalLM(WeDLMConfig(**MODEL)).to(device=device, dtype=dtype).eval()
    most = {}
    for lossless in (False, True):
        decoder = StreamingDecoder(model, MODEL["mask_token_id"])
        decoder.draws_before_read = True  # what an accelerator does; a CPU's default is after the read
        for r in range(rows):
            generator = torch.Generator(device=device).manual_seed(r)
            sampler = FillSampler(True, _warpers(), generator=generator)
            settings = DecodingSettings(max_new_tokens=64, window_size=16, lossless=lossless, sampler=sampler)
            decoder.add(torch.randint(0, 31990, (16 + r,)).tolist(), settings)
        decoder.step()
        counts = [_count(device, decoder.step) for _ in range(steps) if decoder.busy]
        mode = "lossless" if lossless else "default"
        what = "host reads" if device == "cpu" else "synchronisations"
        print(f"sampled {mode} mode, {rows} rows with their own generators: {what} per step {counts} (target 1)")
        most[mode] = max(counts)
    most["batched warpers equal"] = batched_warpers_equal(device)
    return most


def batched_warpers_equal(device: str, samplers: int = 24) -> bool:
    """Whether rows of seeded samplers with one set of warpers (their own settings), processed as one batch on
    `device`, get exactly what each sampler's transformers warpers give its rows; printed."""
    from transformers import LogitsProcessorList
    from transformers.generation import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from wedlm_hf.modeling.sampler_batch import process

    g = torch.Generator().manual_seed(0)
    made, blocks = [], []
    for i in range(samplers):
        t, k, p = (
            0.05 + 2 * float(torch.rand((), generator=g)),
            1 + 97 * i,
            0.05 + 0.9 * float(torch.rand((), generator=g)),
        )
        warpers = LogitsProcessorList([TemperatureLogitsWarper(t), TopKLogitsWarper(k), TopPLogitsWarper(p)])
        made.append(FillSampler(True, warpers, generator=torch.Generator(device=device).manual_seed(i)))
        blocks.append((torch.randn(3, MODEL["vocab_size"], generator=g) * 6).to(device))
    together = process(torch.cat(blocks), made, [3] * samplers)
    expected = []
    for sampler, block in zip(made, blocks):
        for warper in sampler.warpers:
            block = warper(None, block)
        expected.append(block)
    equal = torch.equal(together, torch.cat(expected))
    print(f"{samplers} seeded samplers processed as one batch on {device}: rows' scores equal their warpers': {equal}")
    return equal


def _warpers():
    from transformers import LogitsProcessorList
    from transformers.generation import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    return LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(50), TopPLogitsWarper(0.95)])
