"""The `wedlm-hf` command: argument parsing and dispatch only; each sub-command's work lives in its wing.

Parsing imports neither torch nor transformers, so `--help` answers at once; a sub-command's module is imported
only when that command runs.

Error policy (`console`, the installed `wedlm-hf` script): a mistake in what the user typed or pointed at
(ValueError, OSError such as FileNotFoundError, an ImportError of a missing optional extra, an argparse error) is
ONE line on stderr, `wedlm-hf CMD: error: what is wrong and what to do`, and exit status 2 (arguments) or 1
(everything else); Ctrl-C is `wedlm-hf CMD: interrupted` and status 130. Any other exception is a bug and keeps its
traceback. `--debug` (or WEDLM_HF_DEBUG=1) shows the traceback of every error. `main(argv)`, for Python callers and
tests, raises as usual.
"""

import argparse
import importlib
import logging
import os
import sys

DEBUG_ENV = "WEDLM_HF_DEBUG"
DTYPES = ("auto", "bfloat16", "float16", "float32", "float64")  # wedlm_hf.data.DTYPES (this module imports no wing)
# wedlm_hf.data.QUANTIZATIONS
QUANTIZATIONS = ("torchao-int8", "torchao-int4", "bitsandbytes-8bit", "bitsandbytes-4bit")
DTYPE_HELP = "weights and activations; auto: the checkpoint's half precision on a GPU, float32 on a CPU"

# Each sub-command's work lives in its wing; the module is imported only when its command runs.
COMMANDS = {
    "generate": "evaluation.demo:generate_command",
    "bench": "evaluation.benchmark:bench_command",
    "bench-lossless": "evaluation.lossless_benchmark:bench_lossless_command",
    "bench-structured": "evaluation.structured_benchmark:bench_structured_command",
    "bench-step": "evaluation.step_benchmark:bench_step_command",
    "evaluate": "evaluation.evaluate:evaluate_command",
    "train-tokenizer": "data.tokenizer_training:train_tokenizer_command",
    "train": "training.trainer:train_command",
    "convert": "training.conversion:convert_command",
    "export": "hub.export:export_command",
    "card": "hub.export:card_command",
    "ship-default": "data.shipped_model:ship_default_command",
    "push": "hub.push:push_command",
    "custom-generate": "hub.custom_generate:custom_generate_command",
    "serve": "serving.server:serve_command",
    "bench-serve": "serving.bench_serve:bench_serve_command",
}


# Argument types: the function name never reaches the user, the ArgumentTypeError message does.


def positive_int(value: str) -> int:
    number = _number(int, value, "a whole number")
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number (1 or more)")
    return number


def non_negative_int(value: str) -> int:
    number = _number(int, value, "a whole number")
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is negative: give 0 or more")
    return number


def tcp_port(value: str) -> int:
    number = _number(int, value, "a whole number")
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port: give 0 to 65535 (0: any free one)")
    return number


def non_negative_float(value: str) -> float:
    number = _number(float, value, "a number")
    if not number >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value!r} is not a number >= 0")
    return number


def positive_float(value: str) -> float:
    number = _number(float, value, "a number")
    if not 0 < number < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number > 0")
    return number


def threshold(value: str) -> float | None:
    """tau in nats, or 'none' (one token per forward)."""
    if value.strip().lower() == "none":
        return None
    try:
        return non_negative_float(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a number >= 0 nor 'none'") from None


def _number(kind, value: str, what: str):
    try:
        return kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None


def existing_folder(value: str) -> str:
    """A local folder that exists (checkpoints, tokenizers, export folders)."""
    path = os.path.expanduser(value)
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{value} is a file, not a folder: give the folder that holds it")
    raise argparse.ArgumentTypeError(
        f"no folder {value}: give an existing local folder (download Hub models first with "
        "`hf download ORG/NAME --local-dir DIR`)"
    )


def existing_file(value: str) -> str:
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{value} is a folder, not a file")
    raise argparse.ArgumentTypeError(f"no file {value}")


def training_data(value: str) -> str:
    """'offline-mix' or an existing .txt / .jsonl file."""
    if value == "offline-mix":
        return value
    path = existing_file(value)
    if not path.endswith((".txt", ".jsonl")):
        raise argparse.ArgumentTypeError(f"{value}: give .txt or .jsonl files, or 'offline-mix'")
    return path


def prompt_text(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError('the prompt is empty: give the text to continue, e.g. "def fibonacci(n):"')
    return value


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to every option, except where the help text already says what happens by default."""

    def _get_help_string(self, action):
        text = action.help or ""
        unstated = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if "default" in text or unstated or action.required:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse errors as one line that points at --help, instead of the usage block. `check(parser, args)`, when
    set, refuses combinations of options after parsing, as argparse errors (one line, status 2)."""

    check = None

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        if self.check is not None:
            self.check(self, namespace)
        return namespace, rest

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _check_generate(parser: argparse.ArgumentParser, args) -> None:
    """Context drafts exist only in lossless mode: asking to tune them without --lossless is a mistake to name."""
    if args.lossless:
        return
    given = [
        name
        for name, set_ in (("--no-context-drafts", args.no_context_drafts), ("--context-ngram", args.context_ngram))
        if set_
    ]
    if given:
        parser.error(f"{' and '.join(given)} only apply to lossless decoding: add --lossless, or drop them")


def _add_prompt_bench_args(parser, new_tokens: int) -> None:
    """The options the prompt benchmarks (bench-lossless, bench-structured) share."""
    parser.add_argument(
        "--model",
        type=existing_folder,
        default=None,
        metavar="DIR",
        help="checkpoint folder (default: the shipped model)",
    )
    parser.add_argument(
        "--new-tokens", type=positive_int, default=new_tokens, help="new tokens per prompt at most (eos stops)"
    )
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed runs per prompt (the best is kept)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--json", default=None, metavar="FILE", help="also write the measurements to this file (default: none)"
    )


def _add_decoding_args(parser: argparse.ArgumentParser, tau: float = 0.4) -> None:
    parser.add_argument("--window-size", type=positive_int, default=16, help="W: uncommitted slots in the window")
    parser.add_argument(
        "--threshold",
        type=threshold,
        default=tau,
        help="tau: entropy threshold in nats, or 'none' for one token per forward",
    )
    parser.add_argument("--penalty", type=non_negative_float, default=0.02, help="lambda: distance penalty per slot")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="wedlm-hf",
        description="WeDLM streaming parallel decoding for transformers",
        epilog=f"Errors are one line; --debug (or {DEBUG_ENV}=1) shows their traceback.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of any error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help, description=help, formatter_class=_HelpFormatter)
        # SUPPRESS: the sub-command leaves `args.debug` as the main parser set it unless --debug comes after it.
        cmd.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show error tracebacks")
        return cmd

    gen = command("generate", "stream a completion with WeDLM decoding, then compare with plain AR")
    gen.add_argument("prompt", type=prompt_text, help="the text to continue (not empty)")
    gen.add_argument(
        "--model",
        type=existing_folder,
        default=None,
        metavar="DIR",
        help="checkpoint folder (default: the shipped model)",
    )
    gen.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens to generate at most")
    gen.add_argument("--no-compare", action="store_true", help="skip the plain AR run")
    gen.add_argument("--dtype", default="auto", choices=DTYPES, help=DTYPE_HELP)
    _add_decoding_args(gen)
    gen.add_argument(
        "--lossless",
        action="store_true",
        help="commit only tokens the model's own AR decoding agrees with: plain generate()'s output, faster",
    )
    gen.add_argument(
        "--no-context-drafts",
        action="store_true",
        help="with --lossless: draft only the model's own fills, not tokens copied from the context",
    )
    gen.add_argument(
        "--context-ngram",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --lossless: longest suffix matched for context drafts, tried down to 1 (default: 3, or the "
        "model's generation config)",
    )
    gen.check = _check_generate

    bench = command(
        "bench", "AR generate vs WeDLM (eager, and static+compiled) vs the no-cache block-wise baseline, one process"
    )
    bench.add_argument(
        "--model",
        type=existing_folder,
        default=None,
        metavar="DIR",
        help="checkpoint folder (default: a seeded random 16M model)",
    )
    bench.add_argument("--new-tokens", type=positive_int, default=256, help="tokens per run")
    bench.add_argument(
        "--long-tokens", type=non_negative_int, default=1024, help="length of the block-wise comparison (0: skip)"
    )
    bench.add_argument("--batch", type=positive_int, default=4, help="prompts in the batched run")
    bench.add_argument(
        "--repeats", type=positive_int, default=3, help="timed runs per row, interleaved (the best is shown)"
    )
    bench.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    bench.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1")
    bench.add_argument("--dtype", default="auto", choices=DTYPES, help=DTYPE_HELP)
    bench.add_argument("--json", default=None, help="also write the measurements to this file (default: none)")
    bench.add_argument(
        "--no-compile",
        action="store_true",
        help="skip the static-cache rows with torch.compile(model.forward) (compiling takes a minute or more)",
    )
    _add_decoding_args(bench, tau=1e9)  # accept every mask: measures the mechanics, not a model

    bs_ = command("bench-step", "the decoder's own cost per step: AR vs WeDLM, eager and static+compiled, by batch")
    bs_.add_argument("--batches", type=positive_int, nargs="+", default=[1, 16], help="batch sizes to measure")
    bs_.add_argument("--repeats", type=positive_int, default=5, help="timed runs per cell, interleaved (best shown)")
    bs_.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    bs_.add_argument("--json", default=None, help="also write the measurements to this file (default: none)")
    bs_.add_argument("--no-compile", action="store_true", help="skip the static+compiled cells")

    bl = command("bench-lossless", "lossless WeDLM vs AR generate vs prompt lookup decoding, per prompt family")
    bl.add_argument("--prompts-per-family", type=positive_int, default=10, help="prompts of each family")
    _add_prompt_bench_args(bl, new_tokens=64)
    bl.add_argument(
        "--compiled",
        action="store_true",
        help="also AR, WeDLM and lossless on the static cache, compiled (the CPU: torch.compile(model.forward); a GPU: "
        "generate's own compile, CUDA graphs), checked against AR (compiling takes minutes)",
    )
    bl.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1")

    bs = command("bench-structured", "WeDLM under a JSON schema vs AR generate with the grammar's logits processor")
    _add_prompt_bench_args(bs, new_tokens=96)
    bs.add_argument(
        "--no-compile",
        action="store_true",
        help="skip the static-cache rows with torch.compile(model.forward) (compiling takes a minute or more)",
    )

    tok = command("train-tokenizer", "train the byte-level BPE tokenizer of the shipped model")
    tok.add_argument("--data", default="offline-mix", choices=("offline-mix",), help="the tokenizer's corpus")
    tok.add_argument("--vocab-size", type=positive_int, default=4096, help="tokens in the vocabulary")
    tok.add_argument("--output", required=True, help="folder to save the tokenizer to")

    tr = command("train", "dual-stream WeDLM training with transformers.Trainer")
    tr.add_argument("--output-dir", required=True, help="checkpoints and the final model go here")
    tr.add_argument(
        "--data", nargs="+", type=training_data, required=True, help="'offline-mix', or .txt / .jsonl files"
    )
    start = tr.add_mutually_exclusive_group(required=True)
    start.add_argument(
        "--model",
        type=existing_folder,
        metavar="DIR",
        help="a WeDLM checkpoint folder to continue from (`convert`); or --config",
    )
    start.add_argument("--config", type=existing_file, help="a WeDLM config JSON, to train from scratch; or --model")
    tr.add_argument(
        "--tokenizer",
        type=existing_folder,
        default=None,
        metavar="DIR",
        help="tokenizer folder (default: the --model folder)",
    )
    tr.add_argument("--seq-len", type=positive_int, default=128, help="tokens per training sample")
    tr.add_argument("--block-size", type=positive_int, default=32, help="dual-stream masking block size")
    tr.add_argument("--batch-size", type=positive_int, default=8, help="samples per device and step")
    tr.add_argument("--grad-accum", type=positive_int, default=1, help="gradient accumulation steps")
    tr.add_argument("--max-steps", type=positive_int, default=1000, help="optimizer steps")
    tr.add_argument("--lr", type=non_negative_float, default=3e-6, help="peak learning rate (AdamW, cosine)")
    tr.add_argument("--warmup-ratio", type=non_negative_float, default=0.1, help="share of steps spent warming up")
    tr.add_argument("--weight-decay", type=non_negative_float, default=0.0, help="AdamW weight decay")
    tr.add_argument("--logging-steps", type=positive_int, default=10, help="steps between log lines")
    tr.add_argument("--save-steps", type=positive_int, default=200, help="steps between checkpoints")
    tr.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order and masking")
    tr.add_argument("--items-per-family", type=positive_int, default=20000, help="task items per family in offline-mix")
    tr.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    tr.add_argument("--attn-implementation", default="sdpa", choices=("sdpa", "eager"), help="attention kernel")

    ev = command("evaluate", "held-out quality and speed of WeDLM vs AR decoding (JSON for model cards)")
    ev.add_argument(
        "--model",
        type=existing_folder,
        default=None,
        metavar="DIR",
        help="checkpoint folder (default: the shipped model)",
    )
    ev.add_argument("--items", type=positive_int, default=100, help="held-out items per task family")
    ev.add_argument("--code-items", type=non_negative_int, default=40, help="held-out code continuation prompts")
    ev.add_argument(
        "--train-items-per-family", type=positive_int, default=20000, help="as trained, to exclude seen prompts"
    )
    ev.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    ev.add_argument("--dtype", default="auto", choices=DTYPES, help=DTYPE_HELP)
    ev.add_argument("--output", default=None, help="write the results as JSON (default: print only)")
    _add_decoding_args(ev)

    conv = command("convert", "turn a local AR checkpoint (Qwen2, Qwen3, Llama) into a WeDLM checkpoint")
    conv.add_argument("source", type=existing_folder, help="the AR checkpoint folder")
    conv.add_argument("destination", help="folder to write the WeDLM checkpoint to")
    conv.add_argument("--mask-token", default="<|mask|>", help="added to the tokenizer when it has no mask token")
    conv.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the checkpoint in a non-empty DESTINATION (its earlier weight files are removed)",
    )

    exp = command("export", "a Hub-ready folder (remote code, card) from a WeDLM checkpoint")
    exp.add_argument("source", type=existing_folder, help="the WeDLM checkpoint folder")
    exp.add_argument("destination", help="folder to write the Hub-ready copy to")
    exp.add_argument(
        "--mask-token-id", type=non_negative_int, default=None, help="when the config gives none (default: from it)"
    )
    exp.add_argument("--repo-id", default=None, help="Hub name used in the card's usage example (default: none)")
    exp.add_argument("--base-model", default=None, help="base_model in the card metadata (default: none)")
    exp.add_argument("--summary", default=None, help="one paragraph for the card (default: a generic one)")
    exp.add_argument(
        "--recipe",
        type=existing_file,
        default=None,
        help="a script the card quotes as the training command (default: none)",
    )
    exp.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the checkpoint in a non-empty DESTINATION (its earlier weight files are removed)",
    )

    card = command("card", "render a model card from a checkpoint's training and evaluation records")
    card.add_argument(
        "model",
        type=existing_folder,
        help="checkpoint folder (generation_config.json, training_info.json, eval_results.json)",
    )
    card.add_argument("output", help="README.md to write")
    card.add_argument("--repo-id", required=True, help="Hub name used in the usage example")
    card.add_argument("--summary", default="A WeDLM model packaged by wedlm-hf.", help="one paragraph for the card")
    card.add_argument(
        "--recipe",
        type=existing_file,
        default=None,
        help="a script the card quotes as the training command (default: none)",
    )
    card.add_argument("--base-model", default=None, help="base_model in the card metadata (default: none)")

    ship = command("ship-default", "copy a trained checkpoint into the package as the shipped model")
    ship.add_argument("source", type=existing_folder, help="the `final` folder of a `wedlm-hf train` run")

    push = command("push", "upload an export folder to the Hugging Face Hub")
    push.add_argument("folder", type=existing_folder, help="a folder written by `wedlm-hf export`")
    push.add_argument("repo", help="NAME or ORG/NAME")
    push.add_argument("--token", default=None, help="default: HF_TOKEN or the `hf auth login` token")
    push.add_argument("--private", action="store_true", help="create the repository as private")

    cg = command("custom-generate", "write the decoding strategy as a Hub custom_generate repository")
    cg.add_argument("destination", help="folder to write the repository to")
    cg.add_argument("--repo-id", default="wedlm-hf/wedlm-decoding", help="Hub name used in its README")

    srv = command("serve", "OpenAI-compatible server: WeDLM decoding, continuous batching, playground")
    srv.add_argument(
        "--model",
        default=None,
        metavar="DIR_OR_HUB_ID",
        help="checkpoint folder or Hub id (default: the shipped model)",
    )
    srv.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1: this machine only)")
    srv.add_argument("--port", type=tcp_port, default=8000, help="TCP port, 0 to 65535 (0: any free one)")
    srv.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model's name in the API (default: the --model folder's name or Hub id, or wedlm-hf-default)",
    )
    srv.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1, one of these keys (one per tenant; default: "
        "WEDLM_HF_API_KEY if set, else no key)",
    )
    srv.add_argument(
        "--allowed-hosts",
        nargs="+",
        default=None,
        metavar="NAME",
        help="Host header names accepted, '*' for any (default: the loopback names for a loopback --host, any "
        "for 0.0.0.0, else --host itself)",
    )
    srv.add_argument("--max-batch-size", type=positive_int, default=16, help="rows decoded together")
    srv.add_argument(
        "--max-queue", type=positive_int, default=256, help="rows of all requests waiting to join; beyond: 429"
    )
    srv.add_argument(
        "--max-request-rows",
        type=positive_int,
        default=None,
        help="rows of one request (prompts x n; default: 64, or --max-queue when that is lower)",
    )
    srv.add_argument("--max-window-size", type=positive_int, default=64, help="largest wedlm_window_size accepted")
    srv.add_argument(
        "--max-step-tokens",
        type=positive_int,
        default=2048,
        help="token rows one forward feeds; longer prompts are prefilled over several steps",
    )
    srv.add_argument(
        "--max-request-bytes", type=positive_int, default=1 << 20, help="largest request body; beyond: 413"
    )
    srv.add_argument(
        "--max-logprob-entries",
        type=positive_int,
        default=1 << 18,
        help="log-probability entries one answer may hold: (echoed prompt tokens + max_tokens with logprobs) x "
        "choices x (1 + top log-probabilities); beyond: 400",
    )
    srv.add_argument(
        "--max-connections",
        type=positive_int,
        default=None,
        help="open connections at once, one client address at most three quarters of them; beyond: closed with a "
        "503 (default: 1024, or half the open-file limit when that is lower)",
    )
    srv.add_argument(
        "--request-read-timeout",
        type=positive_float,
        default=15.0,
        help="seconds a request's headers and body may take to arrive; then 408 and the connection is closed",
    )
    srv.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    srv.add_argument("--dtype", default="auto", choices=DTYPES, help=DTYPE_HELP)
    srv.add_argument(
        "--quantization",
        default=None,
        choices=QUANTIZATIONS,
        help="quantize the weights as they load: torchao-int8 (CPU and GPU, needs torchao), torchao-int4, "
        "bitsandbytes-8bit, bitsandbytes-4bit (CUDA GPUs); a checkpoint saved quantized loads as saved without it "
        "(default: none)",
    )
    srv.add_argument(
        "--tool-call-parser",
        default="hermes",
        choices=("hermes", "mistral"),
        help="how the model writes tool calls: hermes, <tool_call> JSON </tool_call> (Qwen's, the released WeDLM "
        "models'); mistral, [TOOL_CALLS] and a JSON list",
    )
    srv.add_argument(
        "--compile",
        action="store_true",
        help="decode on --max-batch-size fixed slots with a torch.compile'd step (CUDA graphs on a GPU); the same "
        "answers, and the first requests wait for compilation",
    )
    srv.add_argument(
        "--prefix-cache-tokens",
        type=non_negative_int,
        default=16384,
        help="tokens of prompts and answers whose K/V are kept across requests (blocks of 16, least recently used "
        "dropped first); a prompt that starts like an earlier one prefills only the rest; 0: off",
    )
    srv.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        help="ranks the model is split over (transformers' tp_plan), started here with torchrun's launcher, or "
        "each a torchrun rank on several machines (docs/serving.md); gloo on CPUs, NCCL on GPUs",
    )
    srv.add_argument(
        "--prefix-cache-per-key",
        action="store_true",
        help="keep each --api-key's prefix-cache blocks apart: a tenant never reuses (or learns of) another's "
        "prompts (default: every request shares blocks unless its cache_salt differs)",
    )
    srv.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    srv.add_argument(
        "--shutdown-timeout", type=non_negative_float, default=10.0, help="seconds running requests get at exit"
    )

    bs = command("bench-serve", "concurrent streaming clients: serve vs batch size 1 vs transformers serve")
    bs.add_argument(
        "--model",
        type=existing_folder,
        default=None,
        metavar="DIR",
        help="checkpoint folder (default: the shipped one)",
    )
    bs.add_argument("--clients", type=positive_int, nargs="+", default=[1, 4, 16], help="concurrency levels")
    bs.add_argument("--requests", type=positive_int, default=2, help="requests per client at each level")
    bs.add_argument("--max-tokens", type=positive_int, default=64, help="max_tokens of every request")
    bs.add_argument(
        "--workload",
        choices=["mixed", "shared-prefix"],
        default="mixed",
        help="mixed: short counting and copying prompts; shared-prefix: a common ~600-token start and a short "
        "question each (default servers: wedlm and wedlm-nocache, the same without its prefix cache)",
    )
    bs.add_argument(
        "--servers",
        nargs="+",
        default=None,
        choices=["wedlm", "wedlm-b1", "wedlm-nocache", "wedlm-tp", "tf", "tf-cb"],
        help="which servers to run (default: wedlm wedlm-b1 tf tf-cb; with --workload shared-prefix: wedlm "
        "wedlm-nocache); wedlm-tp: wedlm over --tensor-parallel-size ranks",
    )
    bs.add_argument(
        "--tensor-parallel-size", type=positive_int, default=2, help="ranks of the wedlm-tp server (default 2)"
    )
    bs.add_argument("--dtype", default="auto", choices=DTYPES, help=f"every server's dtype: {DTYPE_HELP}")
    bs.add_argument(
        "--transformers-serve-python",
        type=existing_file,
        default=None,
        metavar="PYTHON",
        help="a python with transformers>=5.24 for tf and tf-cb (default: those rows are skipped)",
    )
    bs.add_argument("--threads", type=positive_int, default=1, help="torch threads of every server")
    bs.add_argument("--device", default="cpu", help="device of every server")
    bs.add_argument(
        "--json", default=None, metavar="FILE", help="also write the measurements to this file (default: none)"
    )
    return parser


# Loggers whose import-time warnings say nothing to a wedlm-hf user: transformers imports torchao whenever it is
# installed (the quantization extra), and torchao then reports each CUDA kernel library it cannot load on this
# machine and a torch deprecation of its own. Errors still show.
IMPORT_NOISE = ("torchao", "torch.utils._pytree")


def _run(command: str, args) -> None:
    for name in IMPORT_NOISE:
        logging.getLogger(name).setLevel(logging.ERROR)
    module, function = COMMANDS[command].split(":")
    getattr(importlib.import_module(f"{__package__}.{module}"), function)(args)


def main(argv: list[str] | None = None) -> None:
    """Parses `argv` and runs the command; errors raise (the `console` script turns them into one line)."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a command that starts more processes passes on
    _run(args.command, args)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def console(argv: list[str] | None = None) -> int:
    """The installed `wedlm-hf` script: `main` with the error policy of this module's docstring."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = list(argv)
    prog = f"wedlm-hf {args.command}"
    if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        _run(args.command, args)
        return 0
    try:
        _run(args.command, args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, ImportError) as error:  # ImportError: an optional extra is not installed
        print(f"{prog}: error: {_one_line(error)}", file=sys.stderr)
        return 1
    except SystemExit as exit_:
        if isinstance(exit_.code, str):  # a wing's `raise SystemExit("message")`
            print(f"{prog}: error: {_one_line(exit_)}", file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(console())
