"""`wedlm-hf bench-lossless`: its options; `wedlm_hf.evaluation.lossless_benchmark` runs it."""

from .argument_types import positive_int
from .shared_options import DTYPES, add_prompt_bench_options

NAME = "bench-lossless"
HELP = "lossless WeDLM vs AR generate vs prompt lookup decoding, per prompt family"
RUNS = "evaluation.lossless_benchmark:bench_lossless_command"


def add_arguments(parser) -> None:
    parser.add_argument("--prompts-per-family", type=positive_int, default=10, help="prompts of each family")
    add_prompt_bench_options(parser, new_tokens=64)
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="also AR, WeDLM and lossless on the static cache, compiled (the CPU: torch.compile(model.forward); a GPU: "
        "generate's own compile, CUDA graphs), checked against AR (compiling takes minutes)",
    )
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="the model's weights and activations (default float32; auto: the checkpoint's half precision on a GPU)",
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="run every decoder inside wedlm_hf.batch_invariant(): lossless equals AR bit for bit in every dtype "
        "(the CPU; not with --compiled)",
    )
