"""transformers' stopping-criteria contract for a decoder whose rows advance at different speeds.

`generate` calls each criterion after every new token with the whole batch's ids `(batch, prompt + n)` (finished
rows padded with `pad_token_id`) and reads one bool per row (a tensor, or one Python bool for all rows); criteria
such as lm-eval's keep per-row state indexed by the batch row and look at each row's tail. Rows of WeDLM decoding
commit several tokens per forward, and not the same number, so position n is consulted only once every unfinished
row has committed it: each call then sees exactly the batch an AR `generate` would have shown at that length.
A row a criterion stops at n keeps its first n tokens (it may have committed more by then) and leaves the batch.
"""

import torch


class BatchStoppingCriteria:
    def __init__(self, criteria: list, prompt_ids: torch.Tensor, pad_token_id: int | None):
        self.criteria = list(criteria)
        self.prompt_ids = prompt_ids  # (batch, T) as given to generate, left-padded
        self.pad_token_id = 0 if pad_token_id is None else pad_token_id
        self.consulted = 0  # positions 1..consulted have been shown to the criteria
        self.ended_at: dict[int, int] = {}  # row -> the position at which it ended (a stop token, the budget, ...)

    def consult(self, rows: list) -> dict[int, int]:
        """Consults every position that all unfinished rows have reached; returns {row index: tokens to keep} for
        rows the criteria stop. `rows` are the decoder's rows in batch order; finished rows have `done` set."""
        if not self.criteria:
            return {}
        for row in rows:
            if row.done and row.index not in self.ended_at:
                self.ended_at[row.index] = len(row.generated)
        open_rows = [row for row in rows if row.index not in self.ended_at]
        limit = min((len(row.generated) for row in open_rows), default=max(self.ended_at.values(), default=0))
        stopped: dict[int, int] = {}
        while self.consulted < limit:
            n = self.consulted + 1
            if all(self.ended_at.get(row.index, n) < n for row in rows):
                break  # every row ended before n: nothing left to ask
            ids = self.prompt_ids.new_full((len(rows), self.prompt_ids.shape[1] + n), self.pad_token_id)
            ids[:, : self.prompt_ids.shape[1]] = self.prompt_ids
            for row in rows:
                tokens = row.generated[:n]
                if tokens:
                    ids[row.index, self.prompt_ids.shape[1] : self.prompt_ids.shape[1] + len(tokens)] = torch.tensor(
                        tokens
                    )
            done = torch.zeros(len(rows), dtype=torch.bool, device=ids.device)
            for criterion in self.criteria:
                done |= _per_row(criterion(ids, None), len(rows), ids.device)
            for row in rows:
                if done[row.index] and self.ended_at.get(row.index, n) >= n and row.index not in stopped:
                    stopped[row.index] = n
                    self.ended_at[row.index] = n
            self.consulted = n
        return stopped


def _per_row(result, batch: int, device) -> torch.Tensor:
    """A criterion's answer as one bool per row: a Python bool speaks for every row."""
    if isinstance(result, torch.Tensor):
        result = result.to(device=device, dtype=torch.bool).flatten()
        if result.numel() == 1:
            return result.expand(batch)
        if result.numel() != batch:
            raise ValueError(
                f"A stopping criterion returned {result.numel()} values for a batch of {batch}: return one bool per "
                "row (or one Python bool for all rows)."
            )
        return result
    return torch.full((batch,), bool(result), dtype=torch.bool, device=device)
