"""Log-probabilities as the server reports them: the model's raw AR log-softmax, without the mask token.

The mask token is WeDLM's placeholder for a slot still to be filled, never text, so it is excluded from the
distribution (as vLLM reports raw log-probabilities by default: before temperature, top-k or top-p). A token's text
in them is that token decoded alone, decoded once per vocabulary id (`TokenTexts`): an echoed prompt with top
alternatives names the same few thousand ids hundreds of thousands of times.
"""

import torch


def prompt_logits(model, prompt: list[int], rows: int):
    """Yields (start, logits) over a prompt's positions, each of `rows` positions predicting the token after it, from
    one uncached forward: the vocabulary-wide logits exist for `rows` positions at a time."""
    ids = torch.tensor([prompt], device=model.device)
    hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0, :-1]
    head = model.get_output_embeddings()
    for start in range(0, len(hidden), rows):
        yield start, head(hidden[start : start + rows])


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


class TokenTexts:
    """Each vocabulary id's text decoded alone, special tokens kept, decoded on first use and remembered (at most
    the vocabulary: a bounded dict). Safe to share between threads: a race decodes an id twice, to the same text."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._tokenizer.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            self._texts[token] = text
        return text
