"""``pml-suprank-push RUN/final --repo_id your-name/model [--private true]``: upload a model folder written by the
recipes (its card, plots, metrics and OOD guard) to the Hub, as written.

The folder is checked first (config.json + model.safetensors; an OOD guard in ood/ must belong to these weights), then
the token, the network and the write access to the repo (one request); only then is anything uploaded. Pickles,
checkpoints and hidden files are never uploaded. Any refusal: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pml_suprank.training.spec import str2bool

from ._common import console_script

__all__ = ["build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Upload a model folder written by the recipes (RUN/final) to the Hugging Face Hub, as it is.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("folder", help="the model folder (config.json + model.safetensors, card, plots, ood/)")
    parser.add_argument("--repo_id", required=True, help="the Hub repo, org/name (created if needed)")
    parser.add_argument("--private", type=str2bool, default=False, nargs="?", const=True,
                        help="create the repo as private")  # fmt: skip
    parser.add_argument("--commit_message", default="Upload pml-suprank model", help="the commit message")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from pml_suprank import hub
    from pml_suprank._terminal import refuse
    from pml_suprank.hub.preflight import check_push_access
    from pml_suprank.hub.transport import check_repo_id
    from pml_suprank.ood.guard import GUARD_DIR, GUARD_FILE, OODGuard

    parser = build_parser()
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    try:
        check_repo_id(args.repo_id)
    except ValueError as e:
        parser.error(f"--repo_id: {e}")
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            refuse(f"{folder} has no {name}: give a model folder written by the recipes (RUN/final)")
    try:
        if (folder / GUARD_DIR / GUARD_FILE).is_file():
            OODGuard.load(folder)
    except (OSError, ValueError) as e:
        refuse(f"{folder}: its OOD guard cannot be pushed with it: {e}")
    try:
        user = check_push_access(args.repo_id)
        info = hub.push_folder_to_hub(folder, args.repo_id, private=args.private or None,
                                      commit_message=args.commit_message)  # fmt: skip
    except (OSError, RuntimeError, ValueError) as e:  # PushAccessError is a RuntimeError
        refuse(e)
    url = getattr(info, "commit_url", None) or str(info)
    print(f"pushed {folder} to {args.repo_id} as {user}: {url}")  # noqa: T201 - the command's report
    return {"repo_id": args.repo_id, "user": user, "commit": url}


run = console_script(main)  #: the console script ``pml-suprank-push``

if __name__ == "__main__":
    run()
