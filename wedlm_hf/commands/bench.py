"""`wedlm-hf bench`: its options; `wedlm_hf.evaluation.benchmark` runs it."""

from .argument_types import non_negative_int, positive_int
from .shared_options import add_decoding_options, add_dtype, add_json_output, add_model_folder

NAME = "bench"
HELP = "AR generate vs WeDLM (eager, and static+compiled) vs the no-cache block-wise baseline, one process"
RUNS = "evaluation.benchmark:bench_command"


def add_arguments(parser) -> None:
    add_model_folder(parser, default="a seeded random 16M model")
    parser.add_argument("--new-tokens", type=positive_int, default=256, help="tokens per run")
    parser.add_argument(
        "--long-tokens", type=non_negative_int, default=1024, help="length of the block-wise comparison (0: skip)"
    )
    parser.add_argument("--batch", type=positive_int, default=4, help="prompts in the batched run")
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="timed runs per row, interleaved (the best is shown)"
    )
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1")
    add_dtype(parser)
    add_json_output(parser)
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="skip the static-cache rows with torch.compile(model.forward) (compiling takes a minute or more)",
    )
    add_decoding_options(parser, tau=1e9)  # accept every mask: measures the mechanics, not a model
