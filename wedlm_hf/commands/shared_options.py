"""Options several commands take alike: the checkpoint folder, the dtype, WeDLM's decoding knobs, the benchmarks'
common ones. Defined once so that the same flag reads the same in every command's --help."""

from .argument_types import existing_file, existing_folder, non_negative_float, positive_int, threshold

DTYPES = ("auto", "bfloat16", "float16", "float32", "float64")  # wedlm_hf.data.DTYPES (parsing imports no wing)
DTYPE_HELP = "weights and activations; auto: the checkpoint's half precision on a GPU, float32 on a CPU"


def add_model_folder(parser, default: str = "the shipped model") -> None:
    """--model DIR, a local checkpoint folder; `default` says what runs without it."""
    parser.add_argument(
        "--model",
        type=existing_folder,
        default=None,
        metavar="DIR",
        help=f"checkpoint folder (default: {default})",
    )


def add_dtype(parser, help: str = DTYPE_HELP) -> None:
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help=help)


def add_decoding_options(parser, tau: float = 0.4) -> None:
    """W, tau and lambda of WeDLM decoding."""
    parser.add_argument("--window-size", type=positive_int, default=16, help="W: uncommitted slots in the window")
    parser.add_argument(
        "--threshold",
        type=threshold,
        default=tau,
        help="tau: entropy threshold in nats, or 'none' for one token per forward",
    )
    parser.add_argument("--penalty", type=non_negative_float, default=0.02, help="lambda: distance penalty per slot")


def add_json_output(parser, metavar: str | None = None) -> None:
    """--json FILE: a benchmark's measurements, also written to a file."""
    parser.add_argument(
        "--json", default=None, metavar=metavar, help="also write the measurements to this file (default: none)"
    )


def add_prompt_bench_options(parser, new_tokens: int) -> None:
    """The options the prompt benchmarks (bench-lossless, bench-structured) share."""
    add_model_folder(parser)
    parser.add_argument(
        "--new-tokens", type=positive_int, default=new_tokens, help="new tokens per prompt at most (eos stops)"
    )
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed runs per prompt (the best is kept)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    add_json_output(parser, metavar="FILE")


def add_overwrite(parser) -> None:
    """--overwrite of the commands that write a checkpoint folder (convert, export)."""
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the checkpoint in a non-empty DESTINATION (its earlier weight files are removed)",
    )


def add_card_recipe(parser) -> None:
    """--recipe of the commands that write a model card (export, card)."""
    parser.add_argument(
        "--recipe",
        type=existing_file,
        default=None,
        help="a script the card quotes as the training command (default: none)",
    )
