"""`wedlm-hf evaluate`: quality and speed of WeDLM decoding against plain AR `generate`, on held-out items.

For each low-entropy task family, items are drawn from the evaluation seed and any whose prompt occurs among the
training items is dropped; code continuation uses held-out stdlib files. Every item is decoded both ways in the same
process, interleaved, so the wall-clock ratio compares like with like. The JSON it writes is what model cards quote.
"""

import json
import platform
import random
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer

from ..data import (
    EVAL_TASK_SEED,
    FAMILIES,
    TRAIN_TASK_SEED,
    default_model_path,
    load_dtype,
    portable_path,
    stdlib_texts,
    task_items,
)
from ..modeling import WeDLMForCausalLM
from .interleaved_runs import timed

LOW_ENTROPY = ("counting", "copying")


def held_out_items(family: str, count: int, train_items_per_family: int) -> list[tuple[str, str]]:
    """`count` evaluation items whose prompts never appear among the first training items of that family."""
    seen = {q for q, _ in task_items(family, train_items_per_family, TRAIN_TASK_SEED)}
    items, pool = [], task_items(family, count * 20, EVAL_TASK_SEED)
    for question, answer in pool:
        if question not in seen and question not in {q for q, _ in items}:
            items.append((question, answer))
        if len(items) == count:
            break
    return items


def fewest_forwards(tokens: int, window_size: int) -> int:
    """The fewest decoding forwards that can commit `tokens` (docs/algorithm.md section 3.h): a forward fills at most
    W masks, so even a model certain of everything needs ceil(n / W) (the last fills, which end the text, commit
    in the step that fills them). Drafting from the context (section 3.m) AR's token takes the first of the W
    slots and the fills the others: the same ceiling, where no copy from the context was checked."""
    return -(-tokens // window_size)


def code_snippets(tokenizer, count: int, prompt_tokens: int, seed: int = 0) -> list[list[int]]:
    """Prompts cut from held-out stdlib files at line starts."""
    rng = random.Random(seed)
    texts = [t for t in stdlib_texts("eval") if len(t) > 2000]
    snippets = []
    while len(snippets) < count:
        text = rng.choice(texts)
        lines = text.splitlines(keepends=True)
        start = rng.randrange(0, max(1, len(lines) - 40))
        ids = tokenizer("".join(lines[start : start + 40]), add_special_tokens=False)["input_ids"]
        if len(ids) >= prompt_tokens + 8:
            snippets.append(ids[:prompt_tokens])
    return snippets


class _Lossless:
    """Lossless decoding of the same items: its own clock and counts, and every output checked against AR's."""

    def __init__(self, family: str):
        self.family, self.clock = family, _Clock()
        self.forwards = self.accepted = self.rejected = self.accepted_context = 0
        self.differing: list[str] = []

    def add(self, prompt: str, prompt_tokens: int, ar: list[int], out) -> None:
        stats = out.wedlm_stats[0]
        self.clock.tokens += stats.tokens
        self.forwards += stats.forwards
        self.accepted += stats.accepted_drafts
        self.rejected += stats.rejected_drafts
        self.accepted_context += stats.accepted_context_drafts
        if out.sequences[0, prompt_tokens:].tolist() != ar:
            self.differing.append(prompt)

    def report(self, ar_clock: "_Clock") -> dict:
        """Lossless output is AR's by construction; a difference is a bug, reported rather than averaged in."""
        if self.differing:
            raise AssertionError(
                f"lossless decoding differed from plain AR generate on {len(self.differing)} {self.family} item(s), "
                f"e.g. {self.differing[0]!r}: this is a bug in wedlm_hf, please report it."
            )
        checked = self.accepted + self.rejected
        return dict(
            identical_to_ar=True,
            tokens_per_forward=self.clock.tokens / self.forwards,
            tokens_per_s=self.clock.tokens_per_s,
            speedup=self.clock.tokens_per_s / ar_clock.tokens_per_s,
            acceptance_rate=self.accepted / checked if checked else None,
            # Which drafts paid off: the model's own fills, or tokens copied from the context (prompt lookup).
            accepted_drafts={"model": self.accepted - self.accepted_context, "context": self.accepted_context},
        )


class _Clock:
    """Accumulates generated tokens and seconds of one decoding method."""

    def __init__(self):
        self.tokens, self.seconds = 0, 0.0

    def run(self, fn):
        seconds, out = timed(fn)
        self.seconds += seconds
        return out

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class _SideBySide:
    """AR, WeDLM and lossless WeDLM on each item of one family, one after the other so that all three clocks see the
    same machine; WeDLM's forwards are counted against the fewest that could commit its tokens."""

    def __init__(self, model, eos: int, family: str, wedlm_args: dict):
        self.model, self.eos, self.wedlm_args = model, eos, wedlm_args
        self.ar_clock, self.wedlm_clock, self.lossless = _Clock(), _Clock(), _Lossless(family)
        self.forwards = self.tokens = self.fewest = 0

    def __call__(self, ids: list[int], new_tokens: int, prompt: str) -> tuple[list[int], list[int]]:
        """The tokens AR and WeDLM generate after `ids`; lossless WeDLM's are checked against AR's."""
        model, eos, x = self.model, self.eos, torch.tensor([ids])
        ar = self.ar_clock.run(
            lambda: model.generate(x, max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos)
        )[0, len(ids) :].tolist()
        out = self.wedlm_clock.run(lambda: model.generate(x, max_new_tokens=new_tokens, **self.wedlm_args))
        exact = self.lossless.clock.run(
            lambda: model.generate(x, max_new_tokens=new_tokens, wedlm_lossless=True, **self.wedlm_args)
        )
        stats = out.wedlm_stats[0]
        self.ar_clock.tokens += len(ar)
        self.wedlm_clock.tokens += stats.tokens
        self.lossless.add(prompt, len(ids), ar, exact)
        self.forwards += stats.forwards
        self.tokens += stats.tokens
        self.fewest += fewest_forwards(stats.tokens, self.wedlm_args["wedlm_window_size"])
        return ar, out.sequences[0, len(ids) :].tolist()

    def speeds(self) -> dict:
        """Tokens per forward (and its ceiling), the three speeds and lossless decoding's report."""
        ar, wedlm = self.ar_clock.tokens_per_s, self.wedlm_clock.tokens_per_s
        return dict(
            tokens_per_forward=self.tokens / self.forwards,
            tokens_per_forward_ceiling=self.tokens / self.fewest,
            ar_tokens_per_s=ar,
            wedlm_tokens_per_s=wedlm,
            speedup=wedlm / ar,
            lossless=self.lossless.report(self.ar_clock),
        )


def evaluate(
    model_path: str,
    items_per_family: int = 100,
    code_items: int = 40,
    code_prompt_tokens: int = 48,
    code_new_tokens: int = 32,
    train_items_per_family: int = 20000,
    window_size: int = 16,
    threshold: float | None = 0.4,
    penalty: float = 0.02,
    threads: int = 2,
    log=print,
    dtype: str = "auto",
) -> dict:
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = WeDLMForCausalLM.from_pretrained(model_path, dtype=load_dtype(dtype, "cpu", model_path)).eval()
    eos = tokenizer.eos_token_id
    wedlm_args = dict(
        strategy="wedlm",
        wedlm_window_size=window_size,
        wedlm_entropy_threshold=threshold,
        wedlm_pos_penalty_factor=penalty,
        return_dict_in_generate=True,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    settings = dict(
        model=portable_path(model_path),  # the record travels with the model: no local absolute path
        window_size=window_size,
        entropy_threshold=threshold,
        pos_penalty_factor=penalty,
        items_per_family=items_per_family,
        code_items=code_items,
        code_prompt_tokens=code_prompt_tokens,
        code_new_tokens=code_new_tokens,
        threads=threads,
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=platform.python_version(),
    )
    report = {"settings": settings, "families": {}}
    for family in FAMILIES:
        side_by_side = _SideBySide(model, eos, family, wedlm_args)
        items = held_out_items(family, items_per_family, train_items_per_family)
        report["families"][family] = _family_report(side_by_side, tokenizer, items)
        log(f"{family:<12} {_row(report['families'][family])}")
    snippets = code_snippets(tokenizer, code_items, code_prompt_tokens)
    report["code"] = _code_report(_SideBySide(model, eos, "code", wedlm_args), tokenizer, snippets, code_new_tokens)
    code = report["code"]
    log(
        f"{'code':<12} identical to AR {code['identical_to_ar']:.2f}, token agreement "
        f"{code['token_agreement_with_ar']:.2f}, tokens/forward {code['tokens_per_forward']:.2f} "
        f"(ceiling {code['tokens_per_forward_ceiling']:.2f}), "
        f"speed-up {code['speedup']:.2f}x; {_lossless_row(code['lossless'])}"
    )
    return report


def _family_report(side_by_side: _SideBySide, tokenizer, items: list[tuple[str, str]]) -> dict:
    """A task family's exact matches (the answer, up to eos) by AR and WeDLM, beside the speeds."""
    eos = tokenizer.eos_token_id

    def strip(tokens: list[int]) -> list[int]:
        return tokens[: tokens.index(eos)] if eos in tokens else tokens

    ar_hits = wedlm_hits = 0
    for question, answer in items:
        ids = tokenizer(question, add_special_tokens=False)["input_ids"]
        target = tokenizer(answer, add_special_tokens=False)["input_ids"]
        ar, wedlm = side_by_side(ids, len(target) + 8, tokenizer.decode(ids))
        ar_hits += strip(ar) == target
        wedlm_hits += strip(wedlm) == target
    return dict(
        items=len(items),
        ar_exact_match=ar_hits / len(items),
        wedlm_exact_match=wedlm_hits / len(items),
        **side_by_side.speeds(),
    )


def _code_report(side_by_side: _SideBySide, tokenizer, snippets: list[list[int]], new_tokens: int) -> dict:
    """Code continuation has no single answer: how often WeDLM writes AR's continuation, and token by token."""
    same = agree = total = 0
    for ids in snippets:
        ar, wedlm = side_by_side(ids, new_tokens, tokenizer.decode(ids))
        same += ar == wedlm
        agree += sum(a == b for a, b in zip(ar, wedlm))
        total += max(len(ar), len(wedlm))
    return dict(
        items=len(snippets),
        identical_to_ar=same / len(snippets),
        token_agreement_with_ar=agree / total,
        **side_by_side.speeds(),
    )


def _row(r: dict) -> str:
    return (
        f"exact match AR {r['ar_exact_match']:.2f} / WeDLM {r['wedlm_exact_match']:.2f}, "
        f"tokens/forward {r['tokens_per_forward']:.2f} (ceiling {r['tokens_per_forward_ceiling']:.2f}), "
        f"tokens/s AR {r['ar_tokens_per_s']:.0f} / "
        f"WeDLM {r['wedlm_tokens_per_s']:.0f} = {r['speedup']:.2f}x; {_lossless_row(r['lossless'])}"
    )


def _lossless_row(r: dict) -> str:
    rate = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.0%}"
    by_source = r["accepted_drafts"]
    return (
        f"lossless (identical to AR) tokens/forward {r['tokens_per_forward']:.2f}, {r['speedup']:.2f}x AR, "
        f"{rate} of drafts accepted (model {by_source['model']}, context {by_source['context']})"
    )


def evaluate_command(args) -> None:
    """`wedlm-hf evaluate`."""
    report = evaluate(
        args.model or default_model_path(),
        items_per_family=args.items,
        code_items=args.code_items,
        train_items_per_family=args.train_items_per_family,
        window_size=args.window_size,
        threshold=args.threshold,
        penalty=args.penalty,
        threads=args.threads,
        dtype=args.dtype,
    )
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
        print(f"results written to {args.output}")
