"""`generate` under tensor parallelism, as a transformers user runs it: `torchrun --nproc-per-node 2` (gloo on this
CPU) with `distributed_config=DistributedConfig(tp_plan="auto")` gives the single process's tokens in every mode
(AR, WeDLM, lossless; greedy and seeded sampling; batched and alone), ranks seeded apart sample the same tokens
(`rank_random_state`), and our code raises no warning."""

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


def torchrun(folder: str, dtype: str, out: Path) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [*command, str(SCRIPT), folder, dtype, str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("which", ["shipped", "random-float64"])
def test_tensor_parallel_generate_equals_one_process(which, tmp_path, char_tokenizer):  # noqa: F811
    if which == "shipped":
        folder, dtype = default_model_path(), "float32"
        model = WeDLMForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
    else:
        folder, dtype = str(tmp_path / "model"), "float64"
        model = build_model()
        model.save_pretrained(folder)
        char_tokenizer.save_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    expected = run_cases(model, tokenizer)
    ranks = torchrun(folder, dtype, tmp_path / "out.json")
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
