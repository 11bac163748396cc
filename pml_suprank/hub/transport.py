"""Moving saved folders between the local disk and the Hugging Face Hub.

Reading resolves a local folder or a Hub repo id (``"org/name"``) to a local folder holding the requested files: one
``huggingface_hub.snapshot_download`` restricted to them (all from one commit, through the local cache), raising
as :func:`resolve_folder` says. Writing uploads a folder written by ``save_pretrained``, without pickles, checkpoints
and hidden files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .serialization import CONFIG_NAME, PICKLE_SUFFIXES, WEIGHTS_NAME

__all__ = ["check_repo_id", "is_repo_id", "resolve_folder", "upload_folder"]


def is_repo_id(repo_id: Any) -> bool:
    """``repo_id`` looks like ``"org/name"``."""
    return isinstance(repo_id, str) and repo_id.count("/") == 1 and all(repo_id.split("/"))


def check_repo_id(repo_id: Any) -> str:
    """Return ``repo_id`` if it looks like ``"org/name"``, else raise ``ValueError``."""
    if not is_repo_id(repo_id):
        raise ValueError(f"repo_id must look like 'org/name'; got {repo_id!r}")
    return repo_id


def _check_files(folder: Path, filenames: Sequence[str], optional: Sequence[str], where: str) -> Path:
    """``folder`` when it holds every non-optional file of ``filenames``; ``where`` names it in the error."""
    for filename in filenames:
        if filename in optional or (folder / filename).is_file():
            continue
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if filename == WEIGHTS_NAME and pickles:
            raise ValueError(
                f"{folder} has no {WEIGHTS_NAME} but pickle checkpoints {pickles}; pml-suprank only loads "
                "safetensors weights (pickles can execute code). Convert them with safetensors.torch.save_model."
            )
        raise FileNotFoundError(f"{where} has no {filename}; expected a folder written by save_pretrained (pickle "
                                "checkpoints are not supported: only safetensors)")  # fmt: skip
    return folder


def resolve_folder(
    path_or_repo_id: str | Path,
    filenames: Sequence[str] = (CONFIG_NAME, WEIGHTS_NAME),
    *,
    optional: Sequence[str] = (),
    **hub_options: Any,
) -> Path:
    """A local folder holding ``filenames`` (those in ``optional`` may be absent) of an existing folder or a Hub repo
    id ``"org/name"`` (``hub_options``: ``revision``, ``cache_dir``, ``local_files_only``, ``token``,
    ``force_download``).

    Raises:
        TypeError: ``path_or_repo_id`` is neither a path nor a string.
        FileNotFoundError: The folder, the repo, or one of the files does not exist (or is not cached when offline).
        ValueError: The repo id is malformed, or the folder holds pickle weights instead of safetensors.
    """
    if not isinstance(path_or_repo_id, (str, Path)) or not str(path_or_repo_id):
        raise TypeError(f"path_or_repo_id must be a folder path or a Hub repo id; got {path_or_repo_id!r}")
    local = Path(path_or_repo_id)
    if local.is_dir():
        return _check_files(local, filenames, optional, str(local))
    repo_id = str(path_or_repo_id)
    if isinstance(path_or_repo_id, Path) or repo_id.count("/") != 1 or repo_id.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{repo_id} is neither an existing folder nor a Hub repo id of the form 'org/name'")
    if local.exists():
        raise FileNotFoundError(f"{repo_id} is a file, neither a folder written by save_pretrained nor a Hub repo id")
    return _check_files(
        _download(repo_id, list(filenames), **hub_options), filenames, optional, f"Hub repo {repo_id!r}"
    )


def _download(repo_id: str, filenames: list[str], **options: Any) -> Path:
    import huggingface_hub
    from huggingface_hub.errors import (
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=filenames, **options))
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"{repo_id!r} is not an existing local folder, and {filenames} of the Hub repo {repo_id!r} are not in the "
            "local Hub cache"
            f"{' ' + str(options['cache_dir']) if options.get('cache_dir') else ''} and downloading is disabled "
            f"(offline mode or local_files_only=True) or failed: {e}"
        ) from e
    except HFValidationError as e:
        raise ValueError(f"{repo_id!r} is neither an existing folder nor a valid Hub repo id: {e}") from e
    except RevisionNotFoundError as e:
        raise FileNotFoundError(f"Hub repo {repo_id!r} has no revision {options.get('revision')!r}: {e}") from e
    except RepositoryNotFoundError as e:
        raise FileNotFoundError(
            f"{repo_id!r} is neither an existing local folder nor a Hub repo you can access "
            f"(missing, private or gated): {e}"
        ) from e


def upload_folder(
    folder: str | Path,
    repo_id: str,
    *,
    commit_message: str = "Upload pml-suprank model",
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    ignore_patterns: Sequence[str] | None = None,
) -> Any:
    """Upload a folder written by ``save_pretrained`` (``config.json`` and ``model.safetensors`` required; pickles,
    checkpoints and hidden files left out) to the Hub repo ``repo_id``; return the ``CommitInfo`` (a ``str``: the
    commit URL). The folder is never modified: a failed upload raises ``RuntimeError`` saying where the files are."""
    import huggingface_hub

    check_repo_id(repo_id)
    folder = Path(folder)
    for required in (CONFIG_NAME, WEIGHTS_NAME):
        if not (folder / required).is_file():
            raise FileNotFoundError(f"{folder} has no {required}; write it with save_pretrained before pushing")
    ignore = [*(f"*{s}" for s in PICKLE_SUFFIXES), ".*", "checkpoint*/**", "checkpoints/**", *(ignore_patterns or [])]
    api = huggingface_hub.HfApi(token=token)
    try:
        url = api.create_repo(repo_id=repo_id, private=private, exist_ok=True)
        target = getattr(url, "repo_id", None) or repo_id
        return api.upload_folder(
            repo_id=target,
            repo_type="model",
            folder_path=str(folder),
            commit_message=commit_message,
            revision=revision,
            create_pr=create_pr,
            ignore_patterns=ignore,
        )
    except Exception as e:
        raise RuntimeError(
            f"pushing {folder} to the Hub repo {repo_id!r} failed ({type(e).__name__}: {e}); "
            f"the local files are kept in {folder.resolve()}"
        ) from e
