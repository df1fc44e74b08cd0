"""Uploading to the Hub: `wedlm-hf push DIR REPO` and `WeDLMForCausalLM.push_to_hub`.

Both upload one folder holding weights, config with `auto_map`, remote code, generation config, tokenizer and
model card, through `huggingface_hub.HfApi`. The repo name and the token are checked first, with errors that say
what to do; a Hub that cannot be reached (no network, offline mode) ends in an error that says so, not in the
HTTP client's raw exception.
"""

import importlib
import re
import shutil
import socket
import tempfile
from pathlib import Path

from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

from ..modeling import WeDLMForCausalLM
from .export import TOKENIZER_FILES, remote_code_files, weight_files, write_card

REPO_ID = re.compile(r"^([A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
HUB_FILES = ("config.json", "generation_config.json", "README.md")


def network_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the Hub was not reached: socket errors (refused, reset, timed out, unknown host) and the
    transport errors of whichever HTTP client huggingface_hub uses. Not HTTP answers, nor local file errors."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError, socket.gaierror]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "ConnectionError")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


class HubUnreachableError(ConnectionError):
    """The Hub could not be reached; the message says why and what to do."""


def reach_hub(api: HfApi, call, *args, **kwargs):
    """`call(*args, **kwargs)`, with a failure to reach the Hub turned into an error that names the network problem."""
    try:
        return call(*args, **kwargs)
    except HfHubHTTPError:
        raise  # the Hub answered (401, 404, ...): its message already says what is wrong
    except OfflineModeIsEnabled as error:
        raise HubUnreachableError(
            "HF_HUB_OFFLINE is set, so nothing can be uploaded: unset it (`unset HF_HUB_OFFLINE`) and push again."
        ) from error
    except network_errors() as error:
        raise HubUnreachableError(
            f"Could not reach the Hugging Face Hub at {api.endpoint} ({type(error).__name__}: {error}): check the "
            "network connection (and HF_ENDPOINT or a proxy, if set), then push again; a repeated upload is safe, "
            "files already on the Hub are not sent twice."
        ) from error


def check_repo_id(repo_id: str | None) -> str:
    if not repo_id or not REPO_ID.match(repo_id):
        raise ValueError(
            f"Invalid or missing repo name {repo_id!r}: give the Hub repository as NAME or ORG/NAME "
            "(e.g. `wedlm-hf push DIR my-org/my-wedlm`)."
        )
    return repo_id


def check_token(token: str | None) -> str:
    token = token or get_token()
    if not token:
        raise ValueError("No Hugging Face token found: run `hf auth login`, set HF_TOKEN, or pass token=... (--token).")
    return token


def check_hub_folder(folder: Path) -> None:
    """A folder ready to upload has weights, configs, card and our remote code; say what is missing and how to fix."""
    missing = [name for name in HUB_FILES if not (folder / name).exists()]
    missing += [p.name for p in remote_code_files() if not (folder / p.name).exists()]
    try:
        weight_files(folder)
    except FileNotFoundError:
        missing.append("model.safetensors")
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        missing.append("tokenizer files")
    if missing:
        raise FileNotFoundError(
            f"{folder} is missing {', '.join(missing)}: create the folder with `wedlm-hf export SRC DST` first."
        )


def push_folder(
    folder: str,
    repo_id: str,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload WeDLM checkpoint (wedlm-hf)",
    commit_description: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
):
    """Uploads an export folder as it is; returns the commit info of the upload."""
    path = Path(folder)
    check_repo_id(repo_id)
    token = check_token(token)
    check_hub_folder(path)
    api = HfApi(token=token)
    repo = reach_hub(api, api.create_repo, repo_id, private=private, exist_ok=True, repo_type="model")
    return reach_hub(
        api,
        api.upload_folder,
        folder_path=str(path),
        repo_id=repo.repo_id,
        repo_type="model",
        commit_message=commit_message,
        commit_description=commit_description,
        revision=revision,
        create_pr=create_pr,
    )


def push_model(
    model,
    repo_id: str,
    tokenizer=None,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    tags: list[str] | None = None,
    max_shard_size: int | str | None = "50GB",
):
    """`model.push_to_hub`: saves the model with its tokenizer and card into a temporary folder, then uploads it.

    The tokenizer is the one given, else the one saved beside the model it was loaded from. The card is the source
    folder's README.md when there is one, else rendered from the training and evaluation records found there.
    """
    check_repo_id(repo_id)
    token = check_token(token)
    source = Path(model.name_or_path) if model.name_or_path else None
    if tokenizer is None and source is not None and any((source / n).exists() for n in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer is None:
        raise ValueError("push_to_hub needs the tokenizer to upload with the model: pass tokenizer=...")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model.save_pretrained(folder, max_shard_size=max_shard_size)
        tokenizer.save_pretrained(folder)
        for name in ("training_info.json", "eval_results.json"):
            if source is not None and (source / name).exists():
                shutil.copyfile(source / name, folder / name)
        if source is not None and (source / "README.md").exists():
            shutil.copyfile(source / "README.md", folder / "README.md")
        else:
            write_card(
                folder,
                folder / "README.md",
                repo_id=repo_id,
                tags=tags,
                summary="A WeDLM model trained or converted with wedlm-hf.",
            )
        return push_folder(
            str(folder),
            repo_id,
            token=token,
            private=private,
            revision=revision,
            create_pr=create_pr,
            commit_message=commit_message or "Upload WeDLM model (wedlm-hf)",
            commit_description=commit_description,
        )


def _push_to_hub(self, repo_id: str, *, tokenizer=None, **kwargs):
    """Uploads weights, remote code, generation config, tokenizer and model card to the Hub repo `repo_id`.

    The tokenizer is the one given, else the one saved beside the checkpoint the model was loaded from; the card is
    that folder's README.md, else one rendered from its training and evaluation records.
    """
    return push_model(self, repo_id, tokenizer=tokenizer, **kwargs)


def attach_push_to_hub() -> None:
    """Gives `WeDLMForCausalLM` the push above. The model file stays free of Hub tooling: loaded as remote code
    without wedlm-hf, the class keeps transformers' own `push_to_hub` (model only)."""
    WeDLMForCausalLM.push_to_hub = _push_to_hub


def push_command(args) -> None:
    """`wedlm-hf push FOLDER REPO`."""
    info = push_folder(args.folder, args.repo, token=args.token, private=args.private or None)
    print(f"uploaded {args.folder} to {args.repo}: {getattr(info, 'commit_url', info)}")
