"""lm-evaluation-harness's OpenAI-style client scores `multiple_choice` and `loglikelihood_rolling` tasks against
`wedlm-hf serve` as `--model hf` does on the same weights: `local-completions` sends token-id prompts with
`echo: true, max_tokens: 1, logprobs: 1` and reads the prompt's log-probabilities back (the real `lm_eval` command,
in a subprocess)."""

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
ROLLING = "wedlm_counting_rolling"
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
    texts = folder / "texts.jsonl"
    counts = [" ".join(str(start + step * i) for i in range(12)) for start, step in ITEMS]
    texts.write_text("".join(json.dumps({"text": f"count from {c.split()[0]}: {c}"}) + "\n" for c in counts))
    (folder / f"{ROLLING}.yaml").write_text(
        f"""task: {ROLLING}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {json.dumps(str(texts))}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""
    )
    return folder


def run(task_dir: Path, out: Path, model: str, model_args: str) -> dict:
    """Per task: its first metric and, by document, the log-likelihoods lm-eval computed."""
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
    command += ["--tasks", f"{TASK},{ROLLING}", "--batch_size", "1", "--output_path", str(out), "--log_samples"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(out / "d")}
    env |= {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        command, env=env, cwd=out.parent, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = out.rglob("results_*.json")
    results = json.loads(report.read_text())["results"]
    found = {}
    for task, metric in ((TASK, "acc,none"), (ROLLING, "word_perplexity,none")):
        (samples,) = out.rglob(f"samples_{task}_*.jsonl")
        scores = {}
        for line in samples.read_text().splitlines():
            sample = json.loads(line)
            scores[sample["doc_id"]] = [float(r[0][0] if isinstance(r[0], list) else r[0]) for r in sample["resps"]]
        found[task] = (results[task][metric], scores)
    return found


def test_loglikelihood_through_the_server_equals_the_hf_model(task_dir, tmp_path):
    path = default_model_path()
    hf = run(task_dir, tmp_path / "hf", "hf", f"pretrained={path},trust_remote_code=True,dtype=float32")
    with LiveServer() as server:
        args = f"base_url={server.url}/v1/completions,model={MODEL_ID},tokenizer={path},tokenized_requests=True"
        served = run(task_dir, tmp_path / "served", "local-completions", args + ",num_concurrent=1,max_retries=1")
    assert hf[TASK][0] > 0.5 and served[TASK][0] == hf[TASK][0]  # the model mostly picks the right continuation
    assert served[ROLLING][0] == pytest.approx(hf[ROLLING][0], rel=1e-4)
    for task in (TASK, ROLLING):
        assert served[task][1].keys() == hf[task][1].keys() and len(hf[task][1]) == len(ITEMS)
        for doc, loglikelihoods in hf[task][1].items():
            # relative: the server leaves the mask token out of the softmax (lm-eval's hf model does not), which
            # moves a log-likelihood by log(1 - p(mask)) per token, about 5e-5 per token on this model
            assert served[task][1][doc] == pytest.approx(loglikelihoods, rel=1e-4, abs=1e-4), (task, doc)
