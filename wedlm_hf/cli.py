"""The `wedlm-hf` command: generate, bench, train, train-tokenizer, convert, evaluate, export, push."""

import argparse
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


def _generate(args) -> None:
    from .demo import run_demo

    run_demo(
        prompt=args.prompt,
        model_path=args.model,
        max_new_tokens=args.max_new_tokens,
        window_size=args.window_size,
        threshold=args.threshold,
        penalty=args.penalty,
        compare=not args.no_compare,
    )


def _bench(args) -> None:
    from .benchmark import main as bench_main

    bench_main(args)


def _evaluate(args) -> None:
    from .evaluation import main as evaluate_main

    evaluate_main(args)


def _train_tokenizer(args) -> None:
    from .offline_mix import tokenizer_corpus
    from .tokenizer_training import train_tokenizer

    if args.data != "offline-mix":
        raise SystemExit("--data: only 'offline-mix' is built in; train other tokenizers with `tokenizers` directly.")
    train_tokenizer(tokenizer_corpus(), vocab_size=args.vocab_size).save_pretrained(args.output)
    print(f"tokenizer saved to {args.output}")


def _train(args) -> None:
    from .training import train

    final = train(
        output_dir=args.output_dir,
        data=args.data,
        model=args.model,
        config=args.config,
        tokenizer=args.tokenizer,
        seq_len=args.seq_len,
        block_size=args.block_size,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay,
        logging_steps=args.logging_steps,
        save_steps=args.save_steps,
        seed=args.seed,
        items_per_family=args.items_per_family,
        resume=args.resume,
        attn_implementation=args.attn_implementation,
    )
    print(f"final model: {final}")


def _convert(args) -> None:
    from .conversion import convert_ar_checkpoint

    out = convert_ar_checkpoint(args.source, args.destination, mask_token=args.mask_token)
    print(f"WeDLM checkpoint written to {out}")


def _export(args) -> None:
    from .hub_export import export_checkpoint

    recipe = open(args.recipe).read() if args.recipe else None
    out = export_checkpoint(
        args.source,
        args.destination,
        mask_token_id=args.mask_token_id,
        repo_id=args.repo_id,
        base_model=args.base_model,
        summary=args.summary,
        recipe=recipe,
    )
    print(f"Hub-ready checkpoint written to {out}")


def _card(args) -> None:
    from .hub_export import write_card

    recipe = open(args.recipe).read() if args.recipe else None
    out = write_card(
        args.model, args.output, repo_id=args.repo_id, summary=args.summary, recipe=recipe, base_model=args.base_model
    )
    print(f"model card written to {out}")


def _ship_default(args) -> None:
    from .default_model import ship_default_model

    print(f"shipped checkpoint updated: {ship_default_model(args.source)}")


def _push(args) -> None:
    from .hub_push import push_folder

    info = push_folder(args.folder, args.repo, token=args.token, private=args.private or None)
    print(f"uploaded {args.folder} to {args.repo}: {getattr(info, 'commit_url', info)}")


def _custom_generate(args) -> None:
    from .custom_generate_export import export_custom_generate

    print(f"custom_generate repository written to {export_custom_generate(args.destination, args.repo_id)}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wedlm-hf", description="WeDLM streaming parallel decoding for transformers")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream a completion with WeDLM decoding, then compare with plain AR")
    gen.add_argument("prompt")
    gen.add_argument("--model", default=None, help="checkpoint folder (default: the model shipped in the package)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--no-compare", action="store_true", help="skip the plain AR run")
    _add_decoding_args(gen)
    gen.set_defaults(func=_generate)

    bench = sub.add_parser("bench", help="AR generate vs WeDLM vs the no-cache block-wise baseline, one process")
    bench.add_argument("--model", default=None, help="checkpoint folder (default: a seeded random 16M model)")
    bench.add_argument("--new-tokens", type=int, default=256)
    bench.add_argument("--long-tokens", type=int, default=1024, help="length of the block-wise comparison (0: skip)")
    bench.add_argument("--batch", type=int, default=4)
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--threads", type=int, default=2)
    bench.add_argument("--json", default=None, help="also write the measurements to this file")
    _add_decoding_args(bench, threshold=1e9)  # accept every mask: measures the mechanics, not a model
    bench.set_defaults(func=_bench)

    tok = sub.add_parser("train-tokenizer", help="train the byte-level BPE tokenizer of the shipped model")
    tok.add_argument("--data", default="offline-mix")
    tok.add_argument("--vocab-size", type=int, default=4096)
    tok.add_argument("--output", required=True)
    tok.set_defaults(func=_train_tokenizer)

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
    tr.set_defaults(func=_train)

    ev = sub.add_parser("evaluate", help="held-out quality and speed of WeDLM vs AR decoding (JSON for model cards)")
    ev.add_argument("--model", default=None, help="checkpoint folder (default: the model shipped in the package)")
    ev.add_argument("--items", type=int, default=100, help="held-out items per task family")
    ev.add_argument("--code-items", type=int, default=40, help="held-out code continuation prompts")
    ev.add_argument("--train-items-per-family", type=int, default=20000, help="as trained, to exclude seen prompts")
    ev.add_argument("--threads", type=int, default=2)
    ev.add_argument("--output", default=None, help="write the results as JSON")
    _add_decoding_args(ev)
    ev.set_defaults(func=_evaluate)

    conv = sub.add_parser("convert", help="turn a local AR checkpoint (Qwen2, Qwen3, Llama) into a WeDLM checkpoint")
    conv.add_argument("source")
    conv.add_argument("destination")
    conv.add_argument("--mask-token", default="<|mask|>", help="added to the tokenizer when it has no mask token")
    conv.set_defaults(func=_convert)
    exp = sub.add_parser("export", help="a Hub-ready folder (remote code, card) from a WeDLM checkpoint")
    exp.add_argument("source")
    exp.add_argument("destination")
    exp.add_argument("--mask-token-id", type=int, default=None, help="when the config gives none")
    exp.add_argument("--repo-id", default=None, help="Hub name used in the card's usage example")
    exp.add_argument("--base-model", default=None, help="base_model in the card metadata")
    exp.add_argument("--summary", default=None, help="one paragraph for the card")
    exp.add_argument("--recipe", default=None, help="a script whose text the card quotes as the training command")
    exp.set_defaults(func=_export)

    card = sub.add_parser("card", help="render a model card from a checkpoint's training and evaluation records")
    card.add_argument("model", help="checkpoint folder (generation_config.json, training_info.json, eval_results.json)")
    card.add_argument("output", help="README.md to write")
    card.add_argument("--repo-id", required=True, help="Hub name used in the usage example")
    card.add_argument("--summary", default="A WeDLM model packaged by wedlm-hf.")
    card.add_argument("--recipe", default=None, help="a script whose text the card quotes as the training command")
    card.add_argument("--base-model", default=None)
    card.set_defaults(func=_card)

    ship = sub.add_parser("ship-default", help="copy a trained checkpoint into the package as the shipped model")
    ship.add_argument("source", help="the `final` folder of a `wedlm-hf train` run")
    ship.set_defaults(func=_ship_default)

    push = sub.add_parser("push", help="upload an export folder to the Hugging Face Hub")
    push.add_argument("folder")
    push.add_argument("repo", help="NAME or ORG/NAME")
    push.add_argument("--token", default=None, help="default: HF_TOKEN or the `hf auth login` token")
    push.add_argument("--private", action="store_true")
    push.set_defaults(func=_push)

    cg = sub.add_parser("custom-generate", help="write the decoding strategy as a Hub custom_generate repository")
    cg.add_argument("destination")
    cg.add_argument("--repo-id", default="wedlm-hf/wedlm-decoding", help="Hub name used in its README")
    cg.set_defaults(func=_custom_generate)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
