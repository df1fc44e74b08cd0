"""A slow, literal WeDLM decoder for tests: no KV cache, one sequence at a time, line by line as
docs/algorithm.md section 3 states it.

Every step re-runs the whole sequence (committed tokens, then the window's filled slots, then its masks, each at
its logical position) under a plain causal mask. It shares no code with `wedlm_hf` beyond the model itself.
"""

import torch


def reference_decode(
    model,
    prompt: list[int],
    mask_token_id: int,
    window_size: int,
    threshold: float | None,
    penalty: float,
    max_new_tokens: int,
    stop_ids: tuple[int, ...] = (),
) -> tuple[list[int], int]:
    """Greedy decoding; returns (generated tokens, decoding forwards)."""
    committed = list(prompt)
    end = len(prompt) + max_new_tokens
    window: list[int | None] = []
    forwards = 0
    while True:
        run = 0
        while run < len(window) and window[run] is not None:
            run += 1
        if any(t in stop_ids for t in window[:run]) or len(committed) + run >= end:
            # The run ends the text: the forward that would commit it has nothing else to do, so none is run.
            for t in window[:run]:
                committed.append(t)
                if t in stop_ids or len(committed) == end:
                    return committed[len(prompt) :], forwards
        stop_in_window = any(t is not None and t in stop_ids for t in window)
        while not stop_in_window and len(window) < window_size + run and len(committed) + len(window) < end:
            window.append(None)

        base = len(committed)
        filled = [(t, base + i) for i, t in enumerate(window) if t is not None]
        masks = [base + i for i, t in enumerate(window) if t is None]
        tokens = committed + [t for t, _ in filled] + [mask_token_id] * len(masks)
        positions = list(range(base)) + [p for _, p in filled] + masks
        with torch.no_grad():
            logits = model(
                input_ids=torch.tensor([tokens]),
                position_ids=torch.tensor([positions]),
                attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
            ).logits[0]
        forwards += 1

        for t in window[:run]:
            committed.append(t)
            if t in stop_ids or len(committed) == end:
                return committed[len(prompt) :], forwards
        window = window[run:]
        if not masks:
            continue

        mask_logits = logits[len(tokens) - len(masks) :].double().clone()
        mask_logits[:, mask_token_id] = float("-inf")
        probs = torch.softmax(mask_logits, dim=-1)
        entropies = [-(row[row > 0] * row[row > 0].log()).sum().item() for row in probs]
        adjusted = [h + penalty * (m - masks[0]) for h, m in zip(entropies, masks)]
        best = min(adjusted)
        chosen = [i for i, a in enumerate(adjusted) if threshold is not None and a < threshold]
        if not chosen:
            chosen = [adjusted.index(best)]
        slot_of_mask = [i for i, t in enumerate(window) if t is None]
        for i in chosen:
            window[slot_of_mask[i]] = int(mask_logits[i].argmax())
