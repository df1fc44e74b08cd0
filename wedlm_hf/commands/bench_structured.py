"""`wedlm-hf bench-structured`: its options; `wedlm_hf.evaluation.structured_benchmark` runs it."""

from .shared_options import add_prompt_bench_options

NAME = "bench-structured"
HELP = "WeDLM under a JSON schema vs AR generate with the grammar's logits processor"
RUNS = "evaluation.structured_benchmark:bench_structured_command"


def add_arguments(parser) -> None:
    add_prompt_bench_options(parser, new_tokens=96)
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="skip the static-cache rows with torch.compile(model.forward) (compiling takes a minute or more)",
    )
