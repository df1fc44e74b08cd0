"""The `wedlm-hf` command: argument parsing and dispatch only; each sub-command's work lives in its wing."""

import argparse
import importlib
import sys


def _threshold(value: str) -> float | None:
    return None if value.lower() == "none" else float(value)


def _add_decoding_args(parser: argparse.ArgumentParser, threshold: float = 0.4) -> None:
    parser.add_argument("--window-size", type=int, default=16, help="W: uncommitted slots in the window (16)")
    parser.add_argument(
        "--threshold",
        type=_threshold,
        default=threshold,
        help=f"tau: entropy threshold in nats, or 'none' for one token per forward ({threshold:g})",
    )
    parser.add_argument("--penalty", type=float, default=0.02, help="lambda: distance penalty per slot (0.02)")


# Each sub-command's work lives in its wing; the module is imported only when its command runs.
COMMANDS = {
    "generate": "evaluation.demo:generate_command",
    "bench": "evaluation.benchmark:bench_command",
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


def _run(command: str, args) -> None:
    module, function = COMMANDS[command].split(":")
    getattr(importlib.import_module(f"{__package__}.{module}"), function)(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wedlm-hf", description="WeDLM streaming parallel decoding for transformers")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream a completion with WeDLM decoding, then compare with plain AR")
    gen.add_argument("prompt")
    gen.add_argument("--model", default=None, help="checkpoint folder (default: the model shipped in the package)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--no-compare", action="store_true", help="skip the plain AR run")
    _add_decoding_args(gen)

    bench = sub.add_parser("bench", help="AR generate vs WeDLM vs the no-cache block-wise baseline, one process")
    bench.add_argument("--model", default=None, help="checkpoint folder (default: a seeded random 16M model)")
    bench.add_argument("--new-tokens", type=int, default=256)
    bench.add_argument("--long-tokens", type=int, default=1024, help="length of the block-wise comparison (0: skip)")
    bench.add_argument("--batch", type=int, default=4)
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--threads", type=int, default=2)
    bench.add_argument("--json", default=None, help="also write the measurements to this file")
    _add_decoding_args(bench, threshold=1e9)  # accept every mask: measures the mechanics, not a model

    tok = sub.add_parser("train-tokenizer", help="train the byte-level BPE tokenizer of the shipped model")
    tok.add_argument("--data", default="offline-mix")
    tok.add_argument("--vocab-size", type=int, default=4096)
    tok.add_argument("--output", required=True)

    tr = sub.add_parser("train", help="dual-stream WeDLM training with transformers.Trainer")
    tr.add_argument("--output-dir", required=True)
    tr.add_argument("--data", nargs="+", required=True, help="'offline-mix', or .txt / .jsonl files")
    tr.add_argument("--model", default=None, help="a WeDLM checkpoint to continue from (see `convert`)")
    tr.add_argument("--config", default=None, help="a WeDLM config JSON, to train from scratch")
    tr.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the --model folder)")
    tr.add_argument("--seq-len", type=int, default=128)
    tr.add_argument("--block-size", type=int, default=32)
    tr.add_argument("--batch-size", type=int, default=8)
    tr.add_argument("--grad-accum", type=int, default=1)
    tr.add_argument("--max-steps", type=int, default=1000)
    tr.add_argument("--lr", type=float, default=3e-6)
    tr.add_argument("--warmup-ratio", type=float, default=0.1)
    tr.add_argument("--weight-decay", type=float, default=0.0)
    tr.add_argument("--logging-steps", type=int, default=10)
    tr.add_argument("--save-steps", type=int, default=200)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--items-per-family", type=int, default=20000, help="task items per family in offline-mix")
    tr.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    tr.add_argument("--attn-implementation", default="sdpa", choices=("sdpa", "eager"))

    ev = sub.add_parser("evaluate", help="held-out quality and speed of WeDLM vs AR decoding (JSON for model cards)")
    ev.add_argument("--model", default=None, help="checkpoint folder (default: the model shipped in the package)")
    ev.add_argument("--items", type=int, default=100, help="held-out items per task family")
    ev.add_argument("--code-items", type=int, default=40, help="held-out code continuation prompts")
    ev.add_argument("--train-items-per-family", type=int, default=20000, help="as trained, to exclude seen prompts")
    ev.add_argument("--threads", type=int, default=2)
    ev.add_argument("--output", default=None, help="write the results as JSON")
    _add_decoding_args(ev)

    conv = sub.add_parser("convert", help="turn a local AR checkpoint (Qwen2, Qwen3, Llama) into a WeDLM checkpoint")
    conv.add_argument("source")
    conv.add_argument("destination")
    conv.add_argument("--mask-token", default="<|mask|>", help="added to the tokenizer when it has no mask token")

    exp = sub.add_parser("export", help="a Hub-ready folder (remote code, card) from a WeDLM checkpoint")
    exp.add_argument("source")
    exp.add_argument("destination")
    exp.add_argument("--mask-token-id", type=int, default=None, help="when the config gives none")
    exp.add_argument("--repo-id", default=None, help="Hub name used in the card's usage example")
    exp.add_argument("--base-model", default=None, help="base_model in the card metadata")
    exp.add_argument("--summary", default=None, help="one paragraph for the card")
    exp.add_argument("--recipe", default=None, help="a script whose text the card quotes as the training command")

    card = sub.add_parser("card", help="render a model card from a checkpoint's training and evaluation records")
    card.add_argument("model", help="checkpoint folder (generation_config.json, training_info.json, eval_results.json)")
    card.add_argument("output", help="README.md to write")
    card.add_argument("--repo-id", required=True, help="Hub name used in the usage example")
    card.add_argument("--summary", default="A WeDLM model packaged by wedlm-hf.")
    card.add_argument("--recipe", default=None, help="a script whose text the card quotes as the training command")
    card.add_argument("--base-model", default=None)

    ship = sub.add_parser("ship-default", help="copy a trained checkpoint into the package as the shipped model")
    ship.add_argument("source", help="the `final` folder of a `wedlm-hf train` run")

    push = sub.add_parser("push", help="upload an export folder to the Hugging Face Hub")
    push.add_argument("folder")
    push.add_argument("repo", help="NAME or ORG/NAME")
    push.add_argument("--token", default=None, help="default: HF_TOKEN or the `hf auth login` token")
    push.add_argument("--private", action="store_true")

    cg = sub.add_parser("custom-generate", help="write the decoding strategy as a Hub custom_generate repository")
    cg.add_argument("destination")
    cg.add_argument("--repo-id", default="wedlm-hf/wedlm-decoding", help="Hub name used in its README")

    srv = sub.add_parser("serve", help="OpenAI-compatible server: WeDLM decoding, continuous batching, playground")
    srv.add_argument("--model", default=None, help="checkpoint folder or Hub id (default: the shipped model)")
    srv.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1: this machine only)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--max-batch-size", type=int, default=16, help="rows decoded together (16)")
    srv.add_argument("--max-queue", type=int, default=64, help="requests waiting to join; beyond: 429 (64)")
    srv.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    srv.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    srv.add_argument("--shutdown-timeout", type=float, default=10.0, help="seconds running requests get at exit")

    bs = sub.add_parser("bench-serve", help="concurrent streaming clients: serve vs batch size 1 vs transformers serve")
    bs.add_argument("--model", default=None, help="checkpoint folder (default: the shipped model)")
    bs.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16], help="concurrency levels (1 4 16)")
    bs.add_argument("--requests", type=int, default=2, help="requests per client at each level (2)")
    bs.add_argument("--max-tokens", type=int, default=64)
    bs.add_argument("--servers", nargs="+", default=["wedlm", "wedlm-b1", "tf", "tf-cb"], help="which to run")
    bs.add_argument("--transformers-serve-python", default=None, help="python with transformers>=5.24 for tf, tf-cb")
    bs.add_argument("--threads", type=int, default=1, help="torch threads of every server (1)")
    bs.add_argument("--device", default="cpu", help="device of every server (cpu)")
    bs.add_argument("--json", default=None, help="also write the measurements to this file")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    _run(args.command, args)


if __name__ == "__main__":
    main(sys.argv[1:])
