"""`wedlm-hf serve`: its options; `wedlm_hf.serving.server` runs it (parsing needs neither fastapi nor torch)."""

from .argument_types import non_negative_float, non_negative_int, positive_float, positive_int, tcp_port
from .shared_options import add_dtype

NAME = "serve"
HELP = "OpenAI-compatible server: WeDLM decoding, continuous batching, playground"
RUNS = "serving.server:serve_command"
QUANTIZATIONS = ("torchao-int8", "torchao-int4", "bitsandbytes-8bit", "bitsandbytes-4bit")  # wedlm_hf.data's


def add_arguments(parser) -> None:
    _add_address_and_access(parser)
    _add_limits(parser)
    _add_model_and_decoding(parser)


def _add_address_and_access(parser) -> None:
    """What is served where, and to whom."""
    parser.add_argument(
        "--model",
        default=None,
        metavar="DIR_OR_HUB_ID",
        help="checkpoint folder or Hub id (default: the shipped model)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1: this machine only)")
    parser.add_argument("--port", type=tcp_port, default=8000, help="TCP port, 0 to 65535 (0: any free one)")
    parser.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model's name in the API (default: the --model folder's name or Hub id, or wedlm-hf-default)",
    )
    parser.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1, one of these keys (one per tenant; default: "
        "WEDLM_HF_API_KEY if set, else no key)",
    )
    parser.add_argument(
        "--allowed-hosts",
        nargs="+",
        default=None,
        metavar="NAME",
        help="Host header names accepted, '*' for any (default: the loopback names for a loopback --host, any "
        "for 0.0.0.0, else --host itself)",
    )


def _add_limits(parser) -> None:
    """The bounds on the batch, on one request and on the connections."""
    parser.add_argument("--max-batch-size", type=positive_int, default=16, help="rows decoded together")
    parser.add_argument(
        "--max-queue", type=positive_int, default=256, help="rows of all requests waiting to join; beyond: 429"
    )
    parser.add_argument(
        "--max-request-rows",
        type=positive_int,
        default=None,
        help="rows of one request (prompts x n; default: 64, or --max-queue when that is lower)",
    )
    parser.add_argument("--max-window-size", type=positive_int, default=64, help="largest wedlm_window_size accepted")
    parser.add_argument(
        "--max-step-tokens",
        type=positive_int,
        default=2048,
        help="token rows one forward feeds; longer prompts are prefilled over several steps",
    )
    parser.add_argument(
        "--max-request-bytes", type=positive_int, default=1 << 20, help="largest request body; beyond: 413"
    )
    parser.add_argument(
        "--max-logprob-entries",
        type=positive_int,
        default=1 << 18,
        help="log-probability entries one answer may hold: (echoed prompt tokens + max_tokens with logprobs) x "
        "choices x (1 + top log-probabilities); beyond: 400",
    )
    parser.add_argument(
        "--max-connections",
        type=positive_int,
        default=None,
        help="open connections at once, one client address at most three quarters of them; beyond: closed with a "
        "503 (default: 1024, or half the open-file limit when that is lower)",
    )
    parser.add_argument(
        "--request-read-timeout",
        type=positive_float,
        default=15.0,
        help="seconds a request's headers and body may take to arrive; then 408 and the connection is closed",
    )


def _add_model_and_decoding(parser) -> None:
    """How the model loads and decodes, and how the server stops."""
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    add_dtype(parser)
    parser.add_argument(
        "--quantization",
        default=None,
        choices=QUANTIZATIONS,
        help="quantize the weights as they load: torchao-int8 (CPU and GPU, needs torchao), torchao-int4, "
        "bitsandbytes-8bit, bitsandbytes-4bit (CUDA GPUs); a checkpoint saved quantized loads as saved without it "
        "(default: none)",
    )
    parser.add_argument(
        "--tool-call-parser",
        default="hermes",
        choices=("hermes", "mistral"),
        help="how the model writes tool calls: hermes, <tool_call> JSON </tool_call> (Qwen's, the released WeDLM "
        "models'); mistral, [TOOL_CALLS] and a JSON list",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="decode on --max-batch-size fixed slots with a torch.compile'd step (CUDA graphs on a GPU); the same "
        "answers, and the first requests wait for compilation",
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="each answer independent of the requests decoded beside it: a row's logits depend only on its own "
        "tokens, in every dtype (CPU and sdpa only; not with --compile, --quantization or --tensor-parallel-size)",
    )
    parser.add_argument(
        "--prefix-cache-tokens",
        type=non_negative_int,
        default=16384,
        help="tokens of prompts and answers whose K/V are kept across requests (blocks of 16, least recently used "
        "dropped first); a prompt that starts like an earlier one prefills only the rest; 0: off",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        help="ranks the model is split over (transformers' tp_plan), started here with torchrun's launcher, or "
        "each a torchrun rank on several machines (docs/serving.md); gloo on CPUs, NCCL on GPUs",
    )
    parser.add_argument(
        "--prefix-cache-per-key",
        action="store_true",
        help="keep each --api-key's prefix-cache blocks apart: a tenant never reuses (or learns of) another's "
        "prompts (default: every request shares blocks unless its cache_salt differs)",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--shutdown-timeout", type=non_negative_float, default=10.0, help="seconds running requests get at exit"
    )
