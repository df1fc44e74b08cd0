"""`wedlm-hf evaluate`: its options; `wedlm_hf.evaluation.evaluate` runs it."""

from .argument_types import non_negative_int, positive_int
from .shared_options import add_decoding_options, add_dtype, add_model_folder

NAME = "evaluate"
HELP = "held-out quality and speed of WeDLM vs AR decoding (JSON for model cards)"
RUNS = "evaluation.evaluate:evaluate_command"


def add_arguments(parser) -> None:
    add_model_folder(parser)
    parser.add_argument("--items", type=positive_int, default=100, help="held-out items per task family")
    parser.add_argument("--code-items", type=non_negative_int, default=40, help="held-out code continuation prompts")
    parser.add_argument(
        "--train-items-per-family", type=positive_int, default=20000, help="as trained, to exclude seen prompts"
    )
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    add_dtype(parser)
    parser.add_argument("--output", default=None, help="write the results as JSON (default: print only)")
    add_decoding_options(parser)
