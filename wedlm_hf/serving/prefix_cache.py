"""K/V of token prefixes kept across requests, so that a prompt that starts like an earlier one prefills only the rest.

Prefixes are stored in blocks of `block` tokens. A block is keyed by its parent block's key and its own tokens, so a
key names the whole prefix up to the block's end exactly (no hashing collisions), and prompts that share a start
share its blocks. A lookup walks the prompt's full blocks while they are cached, at most up to the prompt's last
token (which is always fed: its row predicts the first new token); an insert stores the full blocks of a finished
row's prompt and answer, so the next turn of a chat or an agent finds its history. Only the decoding loop's thread
uses it.

A chain's first block is keyed under its `salt`: requests share blocks only when their salts are equal (the server
salts with the request's `cache_salt` and, with `--prefix-cache-per-key`, its API key), so a client cannot learn
from `cached_tokens` or its time to first token whether a request under another salt began with the same text.

At most `max_tokens` tokens are kept, the least recently used blocks going first. A block is touched after its
descendants (a lookup or insert touches a chain from its end back to its start), so a parent is always more recent
than its children: eviction takes chains from their tails and never strands a cached tail behind a missing parent.
"""

from collections import OrderedDict

import torch


class PrefixCache:
    def __init__(self, max_tokens: int, block: int = 16):
        if max_tokens < 0:
            raise ValueError(f"--prefix-cache-tokens must be >= 0 (0 turns the prefix cache off), got {max_tokens}.")
        self.max_tokens = max_tokens
        self.block = block
        self._blocks: OrderedDict = OrderedDict()  # (parent key, block tokens) -> per-layer (K, V) of the block
        self.hits = 0  # lookups that found at least one block
        self.misses = 0
        self.cached_tokens = 0  # prompt tokens served from the cache, all lookups together

    @property
    def enabled(self) -> bool:
        return self.max_tokens >= self.block

    @property
    def tokens(self) -> int:
        return len(self._blocks) * self.block

    def lookup(self, prompt: list[int], salt=None) -> tuple[list | None, int]:
        """(per-layer (heads, n, head_dim) K/V of the prompt's longest cached prefix under `salt`, n), or (None, 0)."""
        if not self.enabled:
            return None, 0
        keys, parent = [], ("salt", salt)
        for start in range(0, len(prompt) - 1 - self.block + 1, self.block):
            key = (parent, tuple(prompt[start : start + self.block]))
            if key not in self._blocks:
                break
            keys.append(key)
            parent = key
        if not keys:
            self.misses += 1
            return None, 0
        for key in reversed(keys):  # the tail first: parents stay more recent than their children
            self._blocks.move_to_end(key)
        layers = zip(*(self._blocks[key] for key in keys))
        kv = [(torch.cat([k for k, _ in blocks], dim=1), torch.cat([v for _, v in blocks], dim=1)) for blocks in layers]
        n = len(keys) * self.block
        self.hits += 1
        self.cached_tokens += n
        return kv, n

    def insert(self, tokens: list[int], kv: list, salt=None) -> None:
        """Stores, under `salt`, the full blocks of `tokens` that `kv` (per layer, (heads, >= n, head_dim)) covers,
        at most as many as the cache holds (a chain's start)."""
        if not self.enabled or not kv:
            return
        covered = min(len(tokens), kv[0][0].shape[1], self.max_tokens // self.block * self.block)
        keys, parent = [], ("salt", salt)
        for start in range(0, covered - self.block + 1, self.block):
            key = (parent, tuple(tokens[start : start + self.block]))
            if key not in self._blocks:
                end = start + self.block
                self._blocks[key] = [(k[:, start:end].clone(), v[:, start:end].clone()) for k, v in kv]
            keys.append(key)
            parent = key
        for key in reversed(keys):  # the tail first: parents stay more recent than their children
            self._blocks.move_to_end(key)
        while self.tokens > self.max_tokens:
            self._blocks.popitem(last=False)

    def stats(self) -> dict:
        return {
            "enabled": self.enabled,
            "max_tokens": self.max_tokens,
            "stored_tokens": self.tokens,
            "hits": self.hits,
            "misses": self.misses,
            "cached_tokens": self.cached_tokens,
        }
