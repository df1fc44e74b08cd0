"""Incremental detokenisation and stop strings, on the shipped byte-level BPE tokenizer."""

import copy
import random

import pytest
from live_server import shipped

from wedlm_hf.serving.incremental_text import IncrementalText


@pytest.fixture(scope="module")
def tokenizer():
    return shipped()[1]


def stream(tokenizer, ids: list[int], stop=(), seed: int = 0) -> tuple[list[str], IncrementalText]:
    """Feeds `ids` in random-sized commits, as decoder steps would; returns the released pieces."""
    text = IncrementalText(tokenizer, list(stop))
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(ids) and not text.stopped:
        n = rng.randint(1, 4)
        pieces.append(text.add(ids[i : i + n]))
        i += n
    pieces.append(text.flush())
    return pieces, text


def test_random_token_streams_concatenate_to_the_full_decode(tokenizer):
    rng = random.Random(0)
    for seed in range(30):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 60))]
        pieces, _ = stream(tokenizer, ids, seed=seed)
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)


def test_multi_byte_characters_are_released_whole(tokenizer):
    source = "naïve café: 世界 😀 ok\n"
    ids = tokenizer(source).input_ids
    assert len(ids) > len(source.split())  # characters are split over several byte tokens
    text = IncrementalText(tokenizer)
    pieces = [text.add([token]) for token in ids] + [text.flush()]
    assert "".join(pieces) == source
    assert not any("\ufffd" in piece for piece in pieces)


def test_broken_bytes_at_the_end_come_out_as_the_full_decode_does(tokenizer):
    ids = tokenizer("😀").input_ids[:-1]  # an emoji missing its last byte
    pieces, _ = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) and pieces[-1].endswith("\ufffd")


def test_stop_string_cuts_text_and_counts_tokens_through_the_completing_one(tokenizer):
    ids = tokenizer(" 100 105 110 115 120 125").input_ids
    pieces, text = stream(tokenizer, ids, stop=[" 115", "zz"])
    assert "".join(pieces) == " 100 105 110"
    assert text.stop_tokens == next(k for k in range(len(ids) + 1) if " 115" in tokenizer.decode(ids[:k]))


def test_a_possible_stop_string_is_held_back_until_it_is_ruled_out(tokenizer):
    head = tokenizer(" 115").input_ids
    ids = tokenizer(" 115 120 1155").input_ids
    assert ids[: len(head)] == head
    text = IncrementalText(tokenizer, [" 1155"])
    assert [text.add([token]) for token in head] == [""] * len(head)  # " 115" could still become " 1155"
    released = "".join(text.add([token]) for token in ids[len(head) :])
    assert released.startswith(" 115 120") and released + text.flush() == " 115 120"


def test_stop_string_inside_a_multi_byte_run(tokenizer):
    ids = tokenizer("abc 世界 def").input_ids
    pieces, text = stream(tokenizer, ids, stop=["界"])
    assert "".join(pieces) == "abc 世" and text.stopped


def test_a_steps_tokens_decoded_together_release_what_they_release_one_by_one(tokenizer):
    """A step's tokens are decoded at once (two tokenizer calls a step); each step releases the text it releases
    fed token by token, multi-byte characters split over steps and stop strings included, and stops at the same
    token."""
    rng = random.Random(3)
    source = "naïve café: 世界 😀 ok\n 100 105 110 115 120 def f(x):\n    return x\n"
    for seed in range(40):
        ids = tokenizer(source).input_ids + [rng.randrange(tokenizer.vocab_size) for _ in range(20)]
        if seed % 2:
            rng.shuffle(ids)
        stop = [" 115", "界"] if seed % 3 else []
        together, apart = IncrementalText(tokenizer, stop), IncrementalText(tokenizer, stop)
        i = 0
        while i < len(ids):
            n = rng.randint(1, 6)
            step = ids[i : i + n]
            assert together.add(step) == "".join(apart.add([token]) for token in step), (seed, i)
            i += n
        assert together.flush() == apart.flush() and together.stop_tokens == apart.stop_tokens
        assert together.tokens == apart.tokens


def test_a_byte_fallback_tokenizers_invalid_bytes_are_taken_one_by_one():
    """Llama 2's byte-fallback decoding turns a whole run of byte tokens into U+FFFD when one byte is invalid: a
    step whose text holds U+FFFD is taken token by token, so the valid character before the invalid byte is still
    released (and a stop string on it still stops the row where it did)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<0x{b:02X}>": b for b in range(256)} | {"A": 256}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    step = [0xE4, 0xB8, 0x96, 0x80, 256]  # the bytes of 世, a stray continuation byte, then "A"
    assert tokenizer.decode(step) == "\ufffd" * 4 + "A"  # the whole run, as the tokenizer decodes it at once
    for stop in ([], ["世"]):
        together, apart = IncrementalText(tokenizer, stop), IncrementalText(tokenizer, stop)
        assert together.add(step) == "".join(apart.add([token]) for token in step)
        assert together.flush() == apart.flush() and together.stop_tokens == apart.stop_tokens
    assert together.stop_tokens == 3


def test_a_fast_tokenizer_is_decoded_by_its_backend_and_any_other_as_it_decodes(tokenizer):
    """transformers' `decode` of a fast tokenizer only calls the tokenizers library's (after walking every id):
    that is called directly, with the same text; a tokenizer class with a `_decode` of its own is called as it is."""
    ids = tokenizer(" def f(x):\n    return 世界 😀").input_ids
    plain = IncrementalText(tokenizer)
    assert plain._backend_decode is not None
    assert plain.add(ids) + plain.flush() == tokenizer.decode(ids, skip_special_tokens=True)

    class Shouting(type(tokenizer)):
        def _decode(self, token_ids, **kwargs):
            return super()._decode(token_ids, **kwargs).upper()

    shouting = copy.copy(tokenizer)
    shouting.__class__ = Shouting
    text = IncrementalText(shouting)
    assert text._backend_decode is None
    assert text.add(ids) + text.flush() == tokenizer.decode(ids, skip_special_tokens=True).upper()
