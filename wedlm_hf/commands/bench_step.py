"""`wedlm-hf bench-step`: its options; `wedlm_hf.evaluation.step_benchmark` runs it."""

from .argument_types import positive_int
from .shared_options import add_json_output

NAME = "bench-step"
HELP = "the decoder's own cost per step: AR vs WeDLM, eager and static+compiled, by batch"
RUNS = "evaluation.step_benchmark:bench_step_command"


def add_arguments(parser) -> None:
    parser.add_argument("--batches", type=positive_int, nargs="+", default=[1, 16, 64], help="batch sizes to measure")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs per cell, interleaved (best shown)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    add_json_output(parser)
    parser.add_argument("--no-compile", action="store_true", help="skip the static+compiled cells")
