"""`import wedlm_hf` is light, yet the Auto classes know model_type "wedlm" whichever is imported first.

Each case runs in a fresh interpreter: what is imported first is the point.
"""

import subprocess
import sys

import pytest

LOAD = (
    "m = AutoModelForCausalLM.from_pretrained(wedlm_hf.default_model_path())\n"
    "assert type(m).__name__ == 'WeDLMForCausalLM', type(m)\n"
    "assert m.push_to_hub.__module__ == 'wedlm_hf.hub.push'  # the Hub wing's upload, attached on registration\n"
    "print('ok')\n"
)


def run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_import_is_light_and_public_names_are_unchanged():
    out = run(
        "import sys, wedlm_hf\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
        "from wedlm_hf import WeDLMForCausalLM, generate_wedlm, DualStreamCollator, default_model_path\n"
        "from wedlm_hf.modeling import WeDLMForCausalLM as core\n"
        "assert WeDLMForCausalLM is core and callable(generate_wedlm) and callable(default_model_path)\n"
        "assert set(wedlm_hf.__all__) <= set(dir(wedlm_hf))\n"
        "assert all(getattr(wedlm_hf, name) is not None for name in wedlm_hf.__all__)\n"
        "print('ok')\n"
    )
    assert out == "[]\nok\n"


@pytest.mark.parametrize(
    "first",
    [
        "import wedlm_hf\nfrom transformers import AutoModelForCausalLM\n",  # wedlm_hf first, transformers later
        "from transformers import AutoModelForCausalLM\nimport wedlm_hf\n",  # the README's order
        "from wedlm_hf.modeling import WeDLMConfig\nfrom transformers import AutoModelForCausalLM\nimport wedlm_hf\n",
    ],
    ids=["wedlm_hf-first", "transformers-first", "core-first"],
)
def test_auto_classes_load_wedlm_checkpoints_after_import_wedlm_hf(first):
    assert run(first + LOAD) == "ok\n"
