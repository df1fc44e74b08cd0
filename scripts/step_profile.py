"""gpu_check.sh part (g): where a WeDLM step's time goes at serving scale (a batch of 64 on the 8B shape).

Rows in the default mode as `wedlm-hf serve` runs it (context drafts on; (g)'s compiled rows, like (d)'s, time the
paper's rule), at forced acceptance (every mask filled under the threshold, W = 16), share one `StreamingDecoder`;
after the prefill and two warm-up steps, `steps` decoding steps run under torch.profiler. Averaged over them, per
step: the wall time, the host's time outside torch's operators (the decoder's Python), the time the device was busy
(the kernels' own time) and the torch operators the host issued; then the operators that took the most device time
and the most host time. Where the device is busy for much less than the wall time, the step waits for the
host: the per-row Python that issue 57's batch state removes. The CPU dry run profiles the host alone.
"""

import time

import torch
from torch.profiler import ProfilerActivity, profile

from wedlm_hf.modeling.decoding_state import DecodingSettings
from wedlm_hf.modeling.streaming_decoder import StreamingDecoder


def _device_self(event) -> float:
    """An averaged event's own device time in microseconds (the attribute's name changed across torch versions)."""
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)


def step_profile(model, batch: int, prompt_len: int, steps: int = 5, rows: int = 10) -> dict:
    """Profiles `steps` decoding steps of `batch` rows with random prompts of `prompt_len` tokens; prints the per-step
    summary and the top `rows` operators by device and by host time; returns the summary."""
    device, window = model.device, 16
    decoder = StreamingDecoder(model, model.config.mask_token_id)
    g = torch.Generator().manual_seed(0)
    for _ in range(batch):
        prompt = torch.randint(0, model.config.vocab_size - 1, (prompt_len,), generator=g).tolist()
        settings = DecodingSettings(max_new_tokens=(steps + 4) * window, window_size=window, entropy_threshold=1e9)
        decoder.add(prompt, settings)
    for _ in range(3):  # the prefill, then two warm-up steps (kernels chosen, allocator settled)
        decoder.step()
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            decoder.step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    if len(decoder.active) != batch:
        raise RuntimeError(f"{batch - len(decoder.active)} row(s) finished before the profiled steps ended")
    events = prof.key_averages()
    calls = sum(event.count for event in events if event.key.startswith("aten::"))
    operators = sum(event.self_cpu_time_total for event in events) / 1e6  # host time inside torch's operators
    summary = {"wall_ms_per_step": wall / steps * 1e3, "aten_calls_per_step": calls / steps}
    summary["host_outside_operators_ms_per_step"] = (wall - operators) / steps * 1e3
    line = (
        f"batch {batch}, {steps} decoding steps: wall {summary['wall_ms_per_step']:.2f} ms/step, of which "
        f"{summary['host_outside_operators_ms_per_step']:.2f} ms outside torch's operators (Python)"
    )
    if cuda:
        busy = sum(_device_self(event) for event in events) / 1e6
        summary["device_busy_ms_per_step"] = busy / steps * 1e3
        line += f", device busy {summary['device_busy_ms_per_step']:.2f} ms/step ({busy / wall:.0%} of the wall)"
    print(f"{line}; {summary['aten_calls_per_step']:.0f} aten calls per step (nested ones included)")
    if cuda:  # the device-time key's name changed across torch versions
        key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
        print(events.table(sort_by=key, row_limit=rows))
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows))
    return summary
