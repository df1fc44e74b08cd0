"""Log-probabilities as the server reports them: the model's raw AR log-softmax, without the mask token.

The mask token is WeDLM's placeholder for a slot still to be filled, never text, so it is excluded from the
distribution (as vLLM reports raw log-probabilities by default: before temperature, top-k or top-p).
"""

import torch


def token_log_probabilities(logits: torch.Tensor, tokens: list[int], mask_token_id: int, top: int) -> list:
    """Per row of `logits` (positions x vocabulary, each predicting the token at its place in `tokens`):
    (token, its log-probability, [(id, log-probability)] of the `top` most likely tokens)."""
    scores = logits.to(torch.float32, copy=True)
    scores[:, mask_token_id] = float("-inf")
    logprobs = torch.log_softmax(scores, dim=-1)
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, device=logprobs.device)].tolist()
    if top:
        values, indices = logprobs.topk(top, dim=-1)
        alternatives = [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
    else:
        alternatives = [[] for _ in tokens]
    return list(zip(tokens, chosen, alternatives))
