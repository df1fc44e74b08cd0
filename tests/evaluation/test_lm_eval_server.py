"""lm-evaluation-harness's OpenAI-style client scores a `loglikelihood` task against `wedlm-hf serve` as `--model hf`
does on the same weights: `local-completions` sends token-id prompts with `echo: true, max_tokens: 1, logprobs: 1`
and reads the prompt's log-probabilities back (the real `lm_eval` command, in a subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_lm_eval import LM_EVAL

from wedlm_hf import default_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from live_server import MODEL_ID, LiveServer  # noqa: E402

TASK = "wedlm_counting_choice"
ITEMS = [(start, step) for start in (3, 7, 12, 20, 41, 66) for step in (1, 2)][:8]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    """A local multiple-choice task: which continuation counts on from the prompt (nothing downloaded)."""
    folder = tmp_path_factory.mktemp("lm_eval_choice")
    data = folder / "choices.jsonl"
    lines = []
    for start, step in ITEMS:
        numbers = [start + step * i for i in range(6)]
        right = " ".join(map(str, numbers[3:]))
        wrong = [" ".join(map(str, numbers[2:5])), " ".join(map(str, [n + 1 for n in numbers[3:]]))]
        question = f"count from {start} by {step}, 6 numbers: " + " ".join(map(str, numbers[:3]))
        lines.append(json.dumps({"question": question, "choices": [wrong[0], right, wrong[1]], "label": 1}))
    data.write_text("\n".join(lines) + "\n")
    (folder / f"{TASK}.yaml").write_text(
        f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {json.dumps(str(data))}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
    )
    return folder


def run(task_dir: Path, out: Path, model: str, model_args: str) -> tuple[float, dict]:
    """The task's accuracy and, by document, the log-likelihood of every choice."""
    assert LM_EVAL, "lm-eval is not installed: it is a test dependency (scripts/setup.sh, pip install -e '.[test]')"
    command = [
        LM_EVAL,
        "--model",
        model,
        "--model_args",
        model_args,
        "--include_path",
        str(task_dir),
        "--device",
        "cpu",
    ]
    command += ["--tasks", TASK, "--batch_size", "1", "--output_path", str(out), "--log_samples"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(out / "d")}
    env |= {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        command, env=env, cwd=out.parent, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = out.rglob("results_*.json")
    (samples,) = out.rglob(f"samples_{TASK}_*.jsonl")
    scores = {}
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        scores[sample["doc_id"]] = [float(resp[0][0]) for resp in sample["resps"]]
    return json.loads(report.read_text())["results"][TASK]["acc,none"], scores


def test_loglikelihood_through_the_server_equals_the_hf_model(task_dir, tmp_path):
    path = default_model_path()
    hf = run(task_dir, tmp_path / "hf", "hf", f"pretrained={path},trust_remote_code=True,dtype=float32")
    with LiveServer() as server:
        args = f"base_url={server.url}/v1/completions,model={MODEL_ID},tokenizer={path},tokenized_requests=True"
        served = run(task_dir, tmp_path / "served", "local-completions", args + ",num_concurrent=1,max_retries=1")
    assert hf[0] > 0.5 and served[0] == hf[0]  # the shipped model mostly picks the right continuation
    assert served[1].keys() == hf[1].keys() and len(hf[1]) == len(ITEMS)
    for doc, choices in hf[1].items():
        assert served[1][doc] == pytest.approx(choices, abs=1e-3), doc
