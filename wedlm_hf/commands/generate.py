"""`wedlm-hf generate`: its options; `wedlm_hf.evaluation.demo` runs it."""

from .argument_types import positive_int, prompt_text
from .shared_options import add_decoding_options, add_dtype, add_model_folder

NAME = "generate"
HELP = "stream a completion with WeDLM decoding, then compare with plain AR"
RUNS = "evaluation.demo:generate_command"


def add_arguments(parser) -> None:
    parser.add_argument("prompt", type=prompt_text, help="the text to continue (not empty)")
    add_model_folder(parser)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens to generate at most")
    parser.add_argument("--no-compare", action="store_true", help="skip the plain AR run")
    add_dtype(parser)
    add_decoding_options(parser)
    parser.add_argument(
        "--lossless",
        action="store_true",
        help="commit only tokens the model's own AR decoding agrees with: plain generate()'s output, faster",
    )
    parser.add_argument(
        "--no-context-drafts",
        action="store_true",
        help="draft only the model's own fills, not tokens copied from the context (both modes)",
    )
    parser.add_argument(
        "--context-ngram",
        type=positive_int,
        default=None,
        metavar="N",
        help="longest suffix matched for context drafts, tried down to 1 (default: 3, or the model's generation "
        "config)",
    )
