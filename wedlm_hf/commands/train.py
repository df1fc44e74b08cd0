"""`wedlm-hf train`: its options, one to one with `train()`'s arguments; `wedlm_hf.training.trainer` runs it."""

from .argument_types import existing_file, existing_folder, non_negative_float, positive_int, training_data

NAME = "train"
HELP = "dual-stream WeDLM training with transformers.Trainer"
RUNS = "training.trainer:train_command"


def add_arguments(parser) -> None:
    parser.add_argument("--output-dir", required=True, help="checkpoints and the final model go here")
    parser.add_argument(
        "--data", nargs="+", type=training_data, required=True, help="'offline-mix', or .txt / .jsonl files"
    )
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument(
        "--model",
        type=existing_folder,
        metavar="DIR",
        help="a WeDLM checkpoint folder to continue from (`convert`); or --config",
    )
    start.add_argument("--config", type=existing_file, help="a WeDLM config JSON, to train from scratch; or --model")
    parser.add_argument(
        "--tokenizer",
        type=existing_folder,
        default=None,
        metavar="DIR",
        help="tokenizer folder (default: the --model folder)",
    )
    parser.add_argument("--seq-len", type=positive_int, default=128, help="tokens per training sample")
    parser.add_argument("--block-size", type=positive_int, default=32, help="dual-stream masking block size")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="samples per device and step")
    parser.add_argument("--grad-accum", type=positive_int, default=1, help="gradient accumulation steps")
    parser.add_argument("--max-steps", type=positive_int, default=1000, help="optimizer steps")
    parser.add_argument("--lr", type=non_negative_float, default=3e-6, help="peak learning rate (AdamW, cosine)")
    parser.add_argument("--warmup-ratio", type=non_negative_float, default=0.1, help="share of steps spent warming up")
    parser.add_argument("--weight-decay", type=non_negative_float, default=0.0, help="AdamW weight decay")
    parser.add_argument("--logging-steps", type=positive_int, default=10, help="steps between log lines")
    parser.add_argument("--save-steps", type=positive_int, default=200, help="steps between checkpoints")
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order and masking")
    parser.add_argument(
        "--items-per-family", type=positive_int, default=20000, help="task items per family in offline-mix"
    )
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    parser.add_argument("--attn-implementation", default="sdpa", choices=("sdpa", "eager"), help="attention kernel")
