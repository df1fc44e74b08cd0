"""`wedlm-hf generate`'s checks: what the user can fix is refused before any decoding, naming the user's values."""

import pytest

from wedlm_hf.evaluation.demo import check_prompt


def test_empty_and_over_long_prompts_are_refused_with_the_users_values():
    """Before: an empty prompt died in the AR warm-up, and a long one reported the warm-up's max_new_tokens (2)."""
    with pytest.raises(ValueError, match="The prompt is empty"):
        check_prompt(0, 16, 1024)
    with pytest.raises(ValueError, match="1000 tokens and --max-new-tokens is 128.*1024 positions.*24 at most"):
        check_prompt(1000, 128, 1024)
    with pytest.raises(ValueError, match="2000 tokens and the model has 1024 positions"):
        check_prompt(2000, 1, 1024)
    with pytest.raises(ValueError, match="1024 tokens and the model has 1024 positions"):
        check_prompt(1024, 1, 1024)
    check_prompt(1000, 24, 1024)  # exactly fits
