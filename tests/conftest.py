"""Shared fixtures: tiny random models built from configs (nothing is downloaded) and a character tokenizer."""

import gc
import os
import re
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="wedlm-hf-modules-"))  # remote code stays local
# One torch thread in every interpreter the tests start too (examples, remote code, `wedlm-hf serve`): the models here
# are tiny, and on two threads they take several times the CPU (a worker's subprocess then also competes with the
# other workers). A command given --threads still sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from wedlm_hf import WeDLMConfig, WeDLMForCausalLM

THREADS = 1  # tiny models: one thread is fastest and deterministic
torch.set_num_threads(THREADS)

VOCAB = 96
MASK_ID = 95
EOS_ID = 94


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_auto_num_workers(config) -> int:
    """What `-n auto` (pyproject's addopts) means: one worker per core this process may run on (its affinity, and
    a container's CPU quota where one is set), at most the physical cores. Each worker runs torch on one thread."""
    import math

    import psutil

    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cores = min(allowed, psutil.cpu_count(logical=False) or allowed)
    try:  # cgroup v2: "max 100000" (no quota) or "200000 100000" (two CPUs' worth)
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(cores, 1)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every test ends on THREADS torch threads, whatever it ran: commands run in-process (`bench`, `evaluate`,
    `serve --threads`) set torch's thread count for the whole process, which would otherwise carry over to the tests
    that follow on the same worker (the tiny models here run several times slower on two threads, and two workers
    on two threads each oversubscribe the cores)."""
    yield
    if torch.get_num_threads() != THREADS:
        torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True, scope="module")
def sockets_and_files_closed():
    """Every test module closes the sockets and files it opens. One left to the garbage collector warns whenever it
    is collected, and that warning fails the test whose wedlm_hf code happens to be running then (`filterwarnings`
    in `pyproject.toml`): a failure by chance, far from its cause. Collected here, at the end of each module, it
    fails that module's last test, every time."""
    yield
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    left = [str(warning.message) for warning in caught if issubclass(warning.category, ResourceWarning)]
    assert not left, f"this module left these to the garbage collector: {left}"


# generate(strategy="wedlm") as most generation tests call it: a small window whose threshold fills several masks
WEDLM_COMMON = dict(
    strategy="wedlm",
    wedlm_window_size=6,
    wedlm_entropy_threshold=0.8,
    eos_token_id=EOS_ID,
    pad_token_id=EOS_ID,
    return_dict_in_generate=True,
)


# a tool's arguments: the schema the tool-calling tests (chat and Responses) give their get_weather tool
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


def window_tokens(row) -> list:
    """A decoding row's window as token ids, None for a mask."""
    return [None if slot is None else slot.token for slot in row.window]


def tiny_config(**overrides) -> WeDLMConfig:
    values = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        mask_token_id=MASK_ID,
        qk_norm=True,
        attention_bias=False,
    )
    values.update(overrides)
    return WeDLMConfig(**values)


def peaky(model, scale: float = 50.0):
    """Sharpen a random model's output so entropies spread over 0..2 nats: thresholds then fill several masks."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def build_model(seed: int = 0, dtype=torch.float64, **overrides) -> WeDLMForCausalLM:
    torch.manual_seed(seed)
    return peaky(WeDLMForCausalLM(tiny_config(**overrides))).to(dtype).eval()


@pytest.fixture(scope="session")
def model64():
    return build_model()


@pytest.fixture(scope="session")
def char_tokenizer():
    """A character-level fast tokenizer over printable ASCII, with <eos> and <mask>; ids fit VOCAB."""
    chars = [chr(c) for c in range(32, 32 + VOCAB - 2)]
    vocab = {ch: i for i, ch in enumerate(chars)}
    vocab["<eos>"] = EOS_ID
    vocab["<mask>"] = MASK_ID
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", mask_token="<mask>", pad_token="<eos>")
    fast.padding_side = "left"
    return fast


def count_unfed_ends(monkeypatch) -> list[int]:
    """Spies on `DecodingRow.unfed_end` (behaviour unchanged): the list of its answers, 1 for each row whose last
    draft went unfed."""
    from wedlm_hf.modeling.decoding_state import DecodingRow

    answers = []
    decide = DecodingRow.unfed_end
    monkeypatch.setattr(DecodingRow, "unfed_end", lambda row: answers.append(decide(row)) or answers[-1])
    return answers


def prompts(batch: int, lengths=(7, 11, 5, 9), seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts (ids below EOS) of the given lengths, with their attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths[:batch])
    ids = torch.full((batch, width), EOS_ID, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for b in range(batch):
        n = lengths[b]
        ids[b, width - n :] = torch.randint(0, EOS_ID, (n,), generator=g)
        mask[b, width - n :] = 1
    return ids, mask


@pytest.fixture(scope="session")
def shipped_model():
    """The checkpoint shipped in the package (float32) and its tokenizer."""
    from transformers import AutoTokenizer

    from wedlm_hf import default_model_path

    path = default_model_path()
    return WeDLMForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def absolute_paths(record) -> list[str]:
    """Every string in a JSON record that is an absolute path (records must not name the machine's folders)."""
    if isinstance(record, dict):
        return [p for value in record.values() for p in absolute_paths(value)]
    if isinstance(record, list):
        return [p for value in record for p in absolute_paths(value)]
    is_path = isinstance(record, str) and (os.path.isabs(record) or re.match(r"^[A-Za-z]:[\\/]", record))
    return [record] if is_path else []


# Scripts for `run_without_wedlm_hf` start with this: a fresh interpreter in which `import wedlm_hf` fails, as on a
# machine with transformers alone (lm-eval, the `transformers` CLI, a Hub user).
WITHOUT_WEDLM_HF = """
import importlib.abc, sys

class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "wedlm_hf" or name.startswith("wedlm_hf."):
            raise ImportError("wedlm_hf is not installed here")

sys.meta_path.insert(0, _Block())
"""


# Loads a saved folder as remote code and prints generate(strategy='wedlm', **settings) (for run_without_wedlm_hf).
REMOTE_GENERATE = """
    import json, sys

    import torch
    from transformers import AutoModelForCausalLM

    folder, request = sys.argv[1], json.loads(sys.argv[2])
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float64)
    ids, mask = torch.tensor(request["ids"]), torch.tensor(request["mask"])
    out = model.generate(ids, attention_mask=mask, strategy="wedlm", **request["settings"])
    print("RESULT " + json.dumps(out.tolist()))
    """


def run_without_wedlm_hf(script: str, args: list[str], workdir) -> dict:
    """Runs `script` where wedlm_hf cannot be imported (remote code goes to `workdir`/modules); returns the JSON it
    printed after "RESULT "."""
    import json
    import subprocess
    import sys
    import textwrap

    env = {**os.environ, "HF_MODULES_CACHE": str(workdir / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_WEDLM_HF + textwrap.dedent(script), *args],
        env=env,
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


def chi_square_p_value(counts: dict, expected: dict, total: int) -> float:
    """Goodness of fit; cells expected under 5 counts are pooled into one."""
    stat, cells, small_obs, small_exp = 0.0, 0, 0, 0.0
    for cell, p in expected.items():
        e, o = p * total, counts.get(cell, 0)
        if e < 5:
            small_obs, small_exp = small_obs + o, small_exp + e
            continue
        stat += (o - e) ** 2 / e
        cells += 1
    if small_exp > 0:
        stat += (small_obs - small_exp) ** 2 / small_exp
        cells += 1
    dof = torch.tensor((cells - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(stat / 2, dtype=torch.float64)))
