"""Drafts on screen: `generate(strategy="wedlm", streamer=...)` hands a streamer with `put_draft` (transformers'
`TextDiffusionStreamer` convention) the window's tentative fills after each step, between the committed text."""

import contextlib
import io
import re

import pytest
import torch
from conftest import MASK_ID, build_model, prompts
from transformers import TextDiffusionStreamer, TextStreamer


class Recorder:
    """A streamer with `put_draft`, recording what it is given in order."""

    def __init__(self):
        self.events = []

    def put(self, value):
        self.events.append(("put", value.flatten().tolist()))

    def put_draft(self, value):
        assert value.dim() == 2 and value.shape[0] == 1
        self.events.append(("draft", value[0].tolist()))

    def end(self):
        self.events.append(("end", None))


@pytest.fixture(scope="module")
def model():
    return build_model(seed=3)


@pytest.mark.parametrize("mode", ["paper-rule", "default", "lossless"])
def test_drafts_arrive_between_commits_and_become_the_text(model, mode):
    ids, _ = prompts(1)
    recorder = Recorder()
    out = model.generate(
        ids,
        strategy="wedlm",
        max_new_tokens=30,
        eos_token_id=None,
        wedlm_window_size=6,
        wedlm_lossless=mode == "lossless",
        wedlm_context_drafts=mode != "paper-rule",
        streamer=recorder,
    )
    generated = out[0, ids.shape[1] :].tolist()
    puts = [value for kind, value in recorder.events if kind == "put"]
    assert puts[0] == ids[0].tolist() and sum(puts[1:], []) == generated  # the committed text is unchanged
    assert recorder.events[-1] == ("end", None)
    committed, confirmed = 0, 0
    drafts = 0
    for kind, value in recorder.events[1:]:
        if kind == "put":
            committed += len(value)
        elif kind == "draft":
            drafts += 1
            assert value and any(token != MASK_ID for token in value)
            assert mode == "lossless" or len(value) <= 6  # (lossless mode may reach past W with copied drafts)
            lead = value[: value.index(MASK_ID)] if MASK_ID in value else value
            rest = generated[committed:]
            if mode == "paper-rule":  # it commits a window's leading run whole at the next forward
                assert rest[: len(lead)] == lead[: len(rest)]
            confirmed += bool(lead) and rest[:1] == lead[:1]
    assert drafts > 3 and confirmed > 0


def test_transformers_diffusion_streamer_shows_drafts_and_the_text(model):
    ids, _ = prompts(1)
    tokenizer = _CharTokenizer()
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        out = model.generate(
            ids,
            strategy="wedlm",
            max_new_tokens=20,
            eos_token_id=None,
            wedlm_window_size=4,
            wedlm_entropy_threshold=None,  # one fill per forward: a draft after each
            streamer=TextDiffusionStreamer(tokenizer),
        )
    printed = buffer.getvalue()
    assert printed.count("\033[33m") > 3  # drafts, in yellow, each erased by what comes next
    text = re.sub(r"\0337\033\[33m.*?\033\[0m", "", printed).replace("\0338\033[J", "")
    assert text.strip() == tokenizer.decode(out[0].tolist())  # what stays on screen: the text
    plain = io.StringIO()
    with contextlib.redirect_stdout(plain):
        model.generate(ids, strategy="wedlm", max_new_tokens=20, eos_token_id=None, streamer=TextStreamer(tokenizer))
    assert "\033[33m" not in plain.getvalue()  # a streamer without put_draft gets only the text, as before


class _CharTokenizer:
    """Decodes ids as letters: enough for transformers' text streamers."""

    def decode(self, ids, **kwargs):
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return "".join(chr(ord("a") + i % 26) for i in ids)
