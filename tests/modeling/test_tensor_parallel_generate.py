"""`generate` under tensor parallelism, as a transformers user runs it: `torchrun --nproc-per-node 2` (gloo on this
CPU) with `distributed_config=DistributedConfig(tp_plan="auto")` gives the single process's tokens in every mode
(AR, WeDLM, lossless; greedy and seeded sampling; batched and alone), ranks seeded apart sample the same tokens
(`rank_random_state`), and our code raises no warning. One `torchrun` runs both models (the shipped one in float32,
a random one in float64), one after the other in one process group; each model's test checks its own results."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import build_model, char_tokenizer  # noqa: F401 - char_tokenizer is a fixture
from tp_generate import run_cases
from transformers import AutoTokenizer

from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.modeling.transformers_versions import distributed_argument

SCRIPT = Path(__file__).with_name("tp_generate.py")


def torchrun(models: list[tuple[str, str]], out: Path) -> dict:
    """`tp_generate.py` on two ranks over each (folder, dtype) in turn: {folder: what the ranks found}."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    args = [str(out), *(part for model in models for part in model)]
    done = subprocess.run([*command, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def random_folder(tmp_path_factory, char_tokenizer):  # noqa: F811
    """A random model (conftest's `build_model`, float64) saved with the character tokenizer."""
    folder = tmp_path_factory.mktemp("tp-random") / "model"
    build_model().save_pretrained(folder)
    char_tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def ranked(random_folder, tmp_path_factory) -> dict:
    """What the two ranks found for each model, from one torchrun."""
    models = [(str(default_model_path()), "float32"), (random_folder, "float64")]
    return torchrun(models, tmp_path_factory.mktemp("tp-out") / "out.json")


@pytest.mark.heavy
@pytest.mark.parametrize("which", ["shipped", "random-float64"])
def test_tensor_parallel_generate_equals_one_process(which, ranked, random_folder):
    if which == "shipped":
        folder = str(default_model_path())
        model = WeDLMForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    else:
        folder = random_folder
        model = build_model()  # the one saved there
    tokenizer = AutoTokenizer.from_pretrained(folder)
    expected = run_cases(model, tokenizer)
    ranks = ranked[folder]
    assert ranks["world"] == 2 and ranks["sharded"] == "DTensor"  # the weights really were split
    assert ranks["warnings"] == []
    assert ranks["results"] == expected
    assert ranks["apart"][0] == ranks["apart"][1]  # ranks seeded apart sample what rank 0 samples


def test_tp_plan_passed_directly_warns_at_the_callers_line():
    with pytest.warns(FutureWarning, match="DistributedConfig") as caught:
        moved = distributed_argument({"tp_plan": "auto", "dtype": "auto"}, stacklevel=1)
    assert caught[0].filename == __file__
    assert moved["dtype"] == "auto" and "tp_plan" not in moved
    assert moved["distributed_config"].tp_plan == "auto"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert distributed_argument({"dtype": "auto"}, stacklevel=1) == {"dtype": "auto"}
    with pytest.raises(ValueError, match="not both"):
        distributed_argument({"tp_plan": "auto", "distributed_config": object()}, stacklevel=1)
