"""`wedlm-hf bench-serve`: its options; `wedlm_hf.evaluation.serve_benchmark` runs it."""

from .argument_types import existing_file, positive_int
from .shared_options import DTYPE_HELP, add_dtype, add_json_output, add_model_folder

NAME = "bench-serve"
HELP = "concurrent streaming clients: serve vs batch size 1 vs transformers serve"
RUNS = "evaluation.serve_benchmark:bench_serve_command"


def add_arguments(parser) -> None:
    add_model_folder(parser, default="the shipped one")
    parser.add_argument("--clients", type=positive_int, nargs="+", default=[1, 4, 16], help="concurrency levels")
    parser.add_argument("--requests", type=positive_int, default=2, help="requests per client at each level")
    parser.add_argument("--max-tokens", type=positive_int, default=64, help="max_tokens of every request")
    parser.add_argument(
        "--workload",
        choices=["mixed", "shared-prefix", "long-prompt"],
        default="mixed",
        help="mixed: short counting and copying prompts; shared-prefix: a common ~600-token start and a short "
        "question each (default servers: wedlm and wedlm-nocache, the same without its prefix cache); long-prompt: "
        "mixed, one request of each level as long as the context allows, joining running streams (default server: "
        "wedlm-nocache, so that it is prefilled each time; `gap max`: the longest wait between a stream's pieces)",
    )
    parser.add_argument(
        "--servers",
        nargs="+",
        default=None,
        choices=["wedlm", "wedlm-b1", "wedlm-nocache", "wedlm-tp", "wedlm-bi", "tf", "tf-cb"],
        help="which servers to run (default: wedlm wedlm-b1 tf tf-cb; with --workload shared-prefix: wedlm "
        "wedlm-nocache); wedlm-tp: wedlm over --tensor-parallel-size ranks; wedlm-bi: wedlm with --batch-invariant",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="measure each level this many times per server, the servers side by side taking turns, and keep each "
        "one's best (default 1: one server at a time)",
    )
    parser.add_argument(
        "--tensor-parallel-size", type=positive_int, default=2, help="ranks of the wedlm-tp server (default 2)"
    )
    add_dtype(parser, help=f"every server's dtype: {DTYPE_HELP}")
    parser.add_argument(
        "--transformers-serve-python",
        type=existing_file,
        default=None,
        metavar="PYTHON",
        help="a python with transformers>=5.24 for tf and tf-cb (default: those rows are skipped)",
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads of every server")
    parser.add_argument("--device", default="cpu", help="device of every server")
    add_json_output(parser, metavar="FILE")
