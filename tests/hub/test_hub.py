"""Hub packaging: remote code without wedlm_hf, re-export of released checkpoints, cards, push, custom_generate."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import EOS_ID, MASK_ID, build_model, peaky, prompts, run_without_wedlm_hf, tiny_config
from huggingface_hub import HfApi
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM, pipeline

from wedlm_hf import WeDLMConfig, WeDLMForCausalLM, generate_wedlm
from wedlm_hf.cli import main as cli
from wedlm_hf.evaluation.server_process import free_port
from wedlm_hf.hub.custom_generate import export_custom_generate
from wedlm_hf.hub.export import export_checkpoint, remote_code_files
from wedlm_hf.hub.push import HubUnreachableError

CODE_FILES = {p.name for p in remote_code_files()}
DECODE = dict(
    max_new_tokens=12, wedlm_window_size=5, wedlm_entropy_threshold=0.9, eos_token_id=EOS_ID, pad_token_id=EOS_ID
)

# Loads and decodes a saved folder as remote code (run where wedlm_hf cannot be imported).
REMOTE = """
    import json, sys

    import torch
    from transformers import AutoModelForCausalLM

    folder, request = sys.argv[1], json.loads(sys.argv[2])
    try:
        AutoModelForCausalLM.from_pretrained(folder)
        untrusted = "loaded"
    except Exception as error:
        untrusted = str(error)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    ids = torch.tensor(request["ids"])
    mask = torch.tensor(request["mask"])
    wedlm = model.generate(ids, attention_mask=mask, strategy="wedlm", **request["decode"])
    ar = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=8, eos_token_id=None, pad_token_id=0)
    print("RESULT " + json.dumps({"module": type(model).__module__, "wedlm": wedlm.tolist(), "ar": ar.tolist(),
                      "untrusted": untrusted, "window": model.generation_config.wedlm_window_size}))
    """


def run_without_package(folder: Path, tmp_path: Path, dtype=torch.float32) -> dict:
    ids, mask = prompts(2)
    request = json.dumps({"ids": ids.tolist(), "mask": mask.tolist(), "decode": DECODE})
    return run_without_wedlm_hf(REMOTE, [str(folder), request], tmp_path)


def installed_outputs(model) -> tuple[list, list]:
    ids, mask = prompts(2)
    wedlm = model.generate(ids, attention_mask=mask, strategy="wedlm", **DECODE)
    ar = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=8, eos_token_id=None, pad_token_id=0)
    return wedlm.tolist(), ar.tolist()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_save_pretrained_writes_a_complete_remote_code_folder(tmp_path, char_tokenizer):
    model = build_model(dtype=torch.float32)
    model.generation_config.wedlm_window_size = 7
    model.save_pretrained(tmp_path, tokenizer=char_tokenizer)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= files
    assert CODE_FILES <= files and "configuration_wedlm.py" in CODE_FILES and "streaming_decoder.py" in CODE_FILES
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_wedlm.WeDLMForCausalLM"
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation["strategy"] == "ar" and generation["wedlm_window_size"] == 7
    assert {"wedlm_entropy_threshold", "wedlm_pos_penalty_factor"} <= set(generation)
    # Remote code imports only torch, transformers, the standard library and its own flat files.
    for name in CODE_FILES:
        for line in (tmp_path / name).read_text().splitlines():
            if line.startswith(("import ", "from ")):
                top = line.split()[1].split(".")[0]
                assert top in {"torch", "transformers", ""} or top in sys.stdlib_module_names, line


def test_remote_code_loads_and_decodes_without_the_package(tmp_path):
    model = build_model(dtype=torch.float32)
    model.generation_config.wedlm_window_size = 9
    model.save_pretrained(tmp_path / "ckpt")
    result = run_without_package(tmp_path / "ckpt", tmp_path)
    wedlm, ar = installed_outputs(model)
    assert result["module"].startswith("transformers_modules.")
    assert result["wedlm"] == wedlm and result["ar"] == ar and result["window"] == 9
    assert "trust_remote_code=True" in result["untrusted"]


def released_checkpoint(folder: Path) -> WeDLMForCausalLM:
    """A tiny checkpoint shaped like the released ones: Qwen vocabulary, mask id null, the authors' remote code."""
    torch.manual_seed(0)
    config = WeDLMConfig(
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=151936,
        qk_norm=True,
        attention_bias=False,
        max_position_embeddings=512,
    )
    model = WeDLMForCausalLM(config).eval()
    model.save_pretrained(folder)
    for name in CODE_FILES:
        (folder / name).unlink()
    (folder / "modeling_wedlm.py").write_text("# the authors' remote code\n")
    (folder / "configuration_wedlm.py").write_text("# the authors' remote code\n")
    raw = json.loads((folder / "config.json").read_text())
    raw.update(
        mask_token_id=None,
        auto_map={
            "AutoConfig": "configuration_wedlm.WeDLMConfig",
            "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(raw))
    (folder / "generation_config.json").unlink()
    return model


def test_reexport_of_a_released_checkpoint(tmp_path):
    model = released_checkpoint(tmp_path / "released")
    cli(["export", str(tmp_path / "released"), str(tmp_path / "ours")])
    out = tmp_path / "ours"
    assert sha256(out / "model.safetensors") == sha256(tmp_path / "released" / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    assert config["mask_token_id"] == 151665 and config["auto_map"]["AutoModelForCausalLM"].startswith("modeling_wedlm")
    assert "authors' remote code" not in (out / "modeling_wedlm.py").read_text()
    assert CODE_FILES <= {p.name for p in out.iterdir()}
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["strategy"] == "ar" and generation["wedlm_window_size"] == 16
    reloaded = WeDLMForCausalLM.from_pretrained(out)
    assert reloaded.config.mask_token_id == 151665
    ids = torch.randint(0, 1000, (1, 6))
    kwargs = dict(strategy="wedlm", max_new_tokens=6, eos_token_id=None)
    model.config.mask_token_id = 151665
    assert torch.equal(reloaded.generate(ids, **kwargs), model.generate(ids, **kwargs))


def test_released_checkpoint_loads_as_this_package_and_decodes_with_the_released_mask_id(tmp_path):
    """The README's released-checkpoint example: with wedlm_hf imported, AutoModelForCausalLM (no trust_remote_code)
    builds wedlm_hf's class, not the authors' remote code, and `mask_token_id=151665` stands in for the null config."""
    model = released_checkpoint(tmp_path / "released")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "released")
    assert type(loaded) is WeDLMForCausalLM and loaded.config.mask_token_id is None
    ids = torch.randint(0, 1000, (1, 6))
    kwargs = dict(strategy="wedlm", max_new_tokens=6, eos_token_id=None, mask_token_id=151665)
    assert torch.equal(loaded.generate(ids, **kwargs), model.generate(ids, **kwargs))


def test_export_errors_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        export_checkpoint(tmp_path / "nothing", tmp_path / "out")
    released_checkpoint(tmp_path / "r")
    (tmp_path / "r" / "model.safetensors").rename(tmp_path / "r" / "weights.bin")
    with pytest.raises(FileNotFoundError, match="no safetensors weights.*save_pretrained"):
        export_checkpoint(tmp_path / "r", tmp_path / "out")

    small = tmp_path / "small"
    build_model(mask_token_id=None).save_pretrained(small)
    with pytest.raises(ValueError, match="no mask_token_id.*--mask-token-id"):
        export_checkpoint(small, tmp_path / "out")
    assert (
        json.loads((export_checkpoint(small, tmp_path / "out", mask_token_id=95) / "config.json").read_text())[
            "mask_token_id"
        ]
        == 95
    )

    generation = json.loads((small / "generation_config.json").read_text())
    generation["strategy"] = "turbo"
    (small / "generation_config.json").write_text(json.dumps(generation))
    with pytest.raises(ValueError, match="unknown strategy 'turbo'.*set \"strategy\""):
        export_checkpoint(small, tmp_path / "out2", mask_token_id=95)

    qwen = tmp_path / "qwen"
    Qwen3ForCausalLM(
        Qwen3Config(
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=96,
        )
    ).save_pretrained(qwen)
    with pytest.raises(ValueError, match="wedlm-hf convert"):
        export_checkpoint(qwen, tmp_path / "out3")


def same_weights(model, folder: Path) -> bool:
    loaded = WeDLMForCausalLM.from_pretrained(folder).state_dict()
    return all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())


def test_export_into_a_non_empty_folder_needs_overwrite_and_leaves_no_stale_weights(tmp_path, char_tokenizer):
    old, new = build_model(seed=0, dtype=torch.float32), build_model(seed=1, dtype=torch.float32)
    old.save_pretrained(tmp_path / "old", tokenizer=char_tokenizer)
    new.save_pretrained(tmp_path / "new", tokenizer=char_tokenizer, max_shard_size="100KB")
    assert (tmp_path / "new" / "model.safetensors.index.json").exists()
    dst = tmp_path / "hub"
    cli(["export", str(tmp_path / "old"), str(dst)])
    (dst / "notes.txt").write_text("mine")
    (dst / "pytorch_model.bin").write_bytes(b"older still")
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    with pytest.raises(FileExistsError, match=r"hub already holds files.*--overwrite"):
        cli(["export", str(tmp_path / "new"), str(dst)])
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before  # refused: nothing touched

    # A sharded export over a single-file one: the old model.safetensors would otherwise be what loads.
    cli(["export", str(tmp_path / "new"), str(dst), "--overwrite"])
    names = {p.name for p in dst.iterdir()}
    assert "model.safetensors" not in names and "pytorch_model.bin" not in names
    assert "model.safetensors.index.json" in names and (dst / "notes.txt").read_text() == "mine"
    assert same_weights(new, dst) and not same_weights(old, dst)
    assert not list(tmp_path.glob(".hub.export-*"))
    # And back: a single-file export over the sharded one leaves no index or shard behind.
    export_checkpoint(tmp_path / "old", dst, overwrite=True)
    assert not list(dst.glob("model-*.safetensors")) and not (dst / "model.safetensors.index.json").exists()
    assert same_weights(old, dst)


def test_an_interrupted_export_leaves_nothing_that_looks_complete(tmp_path, char_tokenizer, monkeypatch):
    build_model(dtype=torch.float32).save_pretrained(tmp_path / "src", tokenizer=char_tokenizer)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("wedlm_hf.hub.export.write_card", disk_full)  # the last file an export writes
    with pytest.raises(OSError, match="No space left"):
        export_checkpoint(tmp_path / "src", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no half-written folder, no staging folder


def test_export_names_a_truncated_weight_file(tmp_path, char_tokenizer):
    build_model(dtype=torch.float32).save_pretrained(tmp_path / "src", tokenizer=char_tokenizer)
    weights = tmp_path / "src" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"src/model\.safetensors is not a readable safetensors file.*truncated"):
        cli(["export", str(tmp_path / "src"), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_card_metadata_and_measured_statistics(tmp_path, char_tokenizer):
    src = tmp_path / "src"
    build_model(dtype=torch.float32).save_pretrained(src, tokenizer=char_tokenizer)
    results = {
        "settings": {
            "window_size": 16,
            "entropy_threshold": 0.4,
            "pos_penalty_factor": 0.02,
            "threads": 2,
            "torch": "t",
            "transformers": "x",
        },
        "families": {
            "counting": {
                "items": 10,
                "ar_exact_match": 0.9,
                "wedlm_exact_match": 0.8,
                "tokens_per_forward": 4.25,
                "tokens_per_forward_ceiling": 6.5,
                "ar_tokens_per_s": 100.0,
                "wedlm_tokens_per_s": 310.0,
                "speedup": 3.1,
            }
        },
    }
    (src / "eval_results.json").write_text(json.dumps(results))
    export_checkpoint(src, tmp_path / "out", repo_id="me/tiny-wedlm", base_model="Qwen/Qwen3-8B")
    text = (tmp_path / "out" / "README.md").read_text()
    meta = yaml.safe_load(text.split("---")[1])
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert meta["license"] == "apache-2.0" and meta["base_model"] == "Qwen/Qwen3-8B"
    assert {"wedlm", "diffusion", "custom_code"} <= set(meta["tags"])
    assert "| counting | 10 | 90.0% | 80.0% | 4.25 | 6.50 | 100 | 310 | 3.10x |" in text
    assert 'from_pretrained("me/tiny-wedlm", trust_remote_code=True)' in text


@pytest.fixture
def fake_hub(monkeypatch):
    """Intercepts the two Hub calls an upload makes; records the repo and the exact files of the folder."""
    calls = {}

    def create_repo(self, repo_id, **kwargs):
        calls["repo"] = repo_id
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, *, folder_path, repo_id, **kwargs):
        root = Path(folder_path)
        calls["files"] = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        calls["card"] = (root / "README.md").read_text()
        calls["token"] = self.token
        return "https://huggingface.co/fake/commit"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    return calls


def test_push_command_uploads_the_export_folder(tmp_path, char_tokenizer, fake_hub):
    build_model(dtype=torch.float32).save_pretrained(tmp_path / "src", tokenizer=char_tokenizer)
    export_checkpoint(tmp_path / "src", tmp_path / "out")
    cli(["push", str(tmp_path / "out"), "me/tiny-wedlm"])
    expected = sorted(
        CODE_FILES
        | {
            "README.md",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        }
    )
    assert fake_hub["repo"] == "me/tiny-wedlm" and fake_hub["files"] == expected
    assert fake_hub["token"] == "hf_test_token"


def test_model_push_to_hub_uploads_weights_code_tokenizer_and_card(tmp_path, char_tokenizer, fake_hub):
    model = build_model(dtype=torch.float32)
    model.push_to_hub("me/pushed", tokenizer=char_tokenizer)
    expected = sorted(
        CODE_FILES
        | {
            "README.md",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        }
    )
    assert fake_hub["files"] == expected
    meta = yaml.safe_load(fake_hub["card"].split("---")[1])
    assert meta["library_name"] == "transformers" and "wedlm" in meta["tags"]
    # Loaded from a folder with a tokenizer, the model finds it by itself.
    model.save_pretrained(tmp_path / "m", tokenizer=char_tokenizer)
    WeDLMForCausalLM.from_pretrained(tmp_path / "m").push_to_hub("me/pushed2")
    assert fake_hub["repo"] == "me/pushed2" and "tokenizer.json" in fake_hub["files"]


def test_push_errors(tmp_path, char_tokenizer, fake_hub, monkeypatch):
    model = build_model(dtype=torch.float32)
    with pytest.raises(ValueError, match="needs the tokenizer"):
        model.push_to_hub("me/x")
    with pytest.raises(ValueError, match="repo name.*ORG/NAME"):
        model.push_to_hub("", tokenizer=char_tokenizer)
    with pytest.raises(ValueError, match="repo name"):
        cli(["push", str(tmp_path), "not a/valid/name"])
    model.save_pretrained(tmp_path / "incomplete")
    with pytest.raises(FileNotFoundError, match="missing README.md.*tokenizer files.*wedlm-hf export"):
        cli(["push", str(tmp_path / "incomplete"), "me/x"])
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr("wedlm_hf.hub.push.get_token", lambda: None)
    with pytest.raises(ValueError, match="No Hugging Face token.*hf auth login.*HF_TOKEN"):
        model.push_to_hub("me/x", tokenizer=char_tokenizer)


def test_push_without_network_names_the_network_problem(tmp_path, char_tokenizer):
    build_model(dtype=torch.float32).save_pretrained(tmp_path / "src", tokenizer=char_tokenizer)
    export_checkpoint(tmp_path / "src", tmp_path / "out")
    port = free_port()  # a port nothing listens on
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_TOKEN="hf_test_token")
    result = subprocess.run(
        [sys.executable, "-m", "wedlm_hf.cli", "push", str(tmp_path / "out"), "me/tiny-wedlm"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert f"Could not reach the Hugging Face Hub at http://127.0.0.1:{port}" in result.stderr
    assert "check the network connection" in result.stderr


def test_push_in_offline_mode_says_to_unset_it(tmp_path, char_tokenizer, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    build_model(dtype=torch.float32).save_pretrained(tmp_path / "src", tokenizer=char_tokenizer)
    export_checkpoint(tmp_path / "src", tmp_path / "out")
    with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE is set.*unset"):
        cli(["push", str(tmp_path / "out"), "me/tiny-wedlm"])


def test_custom_generate_on_models_with_their_own_code(tmp_path):
    folder = export_custom_generate(tmp_path / "wedlm-decoding")
    meta = yaml.safe_load((folder / "README.md").read_text().split("---")[1])
    assert "custom_generate" in meta["tags"]
    ids, mask = prompts(2)
    torch.manual_seed(0)
    stock = peaky(
        Qwen3ForCausalLM(
            Qwen3Config(
                **{
                    k: v
                    for k, v in tiny_config().to_dict().items()
                    if k
                    in (
                        "hidden_size",
                        "intermediate_size",
                        "num_hidden_layers",
                        "num_attention_heads",
                        "num_key_value_heads",
                        "vocab_size",
                        "head_dim",
                        "max_position_embeddings",
                    )
                }
            )
        )
    ).eval()
    via_hub = stock.generate(
        ids, attention_mask=mask, custom_generate=str(folder), trust_remote_code=True, mask_token_id=MASK_ID, **DECODE
    )
    installed = generate_wedlm(stock, ids, attention_mask=mask, mask_token_id=MASK_ID, **DECODE)
    assert torch.equal(via_hub, installed)

    # A checkpoint shipping its own model class (as the authors' release does), loaded as remote code.
    own = tmp_path / "own-code"
    own.mkdir()
    (own / "modeling_custom.py").write_text(
        "from transformers import Qwen3ForCausalLM\n\n\nclass CustomForCausalLM(Qwen3ForCausalLM):\n    pass\n"
    )
    stock.save_pretrained(own)
    raw = json.loads((own / "config.json").read_text())
    raw["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    (own / "config.json").write_text(json.dumps(raw))
    from transformers import AutoModelForCausalLM

    custom = AutoModelForCausalLM.from_pretrained(own, trust_remote_code=True).eval()
    assert type(custom).__name__ == "CustomForCausalLM"
    out = custom.generate(
        ids, attention_mask=mask, custom_generate=str(folder), trust_remote_code=True, mask_token_id=MASK_ID, **DECODE
    )
    assert torch.equal(out, installed)


def test_pipeline_passes_strategy_through(tmp_path, char_tokenizer):
    model = build_model(dtype=torch.float32)
    model.save_pretrained(tmp_path, tokenizer=char_tokenizer)
    pipe = pipeline("text-generation", model=str(tmp_path), trust_remote_code=True)
    prompt = "hello"
    text = pipe(  # the pipeline samples unless told otherwise
        prompt,
        strategy="wedlm",
        max_new_tokens=10,
        wedlm_window_size=4,
        eos_token_id=None,
        return_full_text=False,
        do_sample=False,
    )[0]["generated_text"]
    ids = char_tokenizer(prompt, return_tensors="pt").input_ids
    direct = model.generate(ids, strategy="wedlm", max_new_tokens=10, wedlm_window_size=4, eos_token_id=None)
    assert text == char_tokenizer.decode(direct[0, ids.shape[1] :], skip_special_tokens=True)  # as pipelines do
    assert AutoTokenizer.from_pretrained(tmp_path).mask_token_id == MASK_ID
