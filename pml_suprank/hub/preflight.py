"""Before any work that ends in an upload: can this user write to that Hub repo?

:func:`check_push_access` runs before the first training step of ``--push_to_hub true`` (training recipes,
``fit_heat``) and before ``pml-suprank-push`` uploads. One request (``HfApi.whoami``), then local rules: a token must
exist and be valid; the Hub must answer (``HF_HUB_OFFLINE=1`` is refused); a ``"read"`` token is refused, a
fine-grained one needs ``repo.write`` on the repo, its namespace or globally; the namespace (``org`` of ``org/name``)
must be the user or one of their organisations where their role is not ``"read"``. The upload can still fail later.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .transport import check_repo_id

__all__ = ["PushAccessError", "check_push_access", "require_push_access"]


class PushAccessError(RuntimeError):
    """The Hub repo cannot be written with this token, now (the message says why in one sentence)."""


def _fine_grained_allows(scopes: Mapping[str, Any], repo_id: str, namespace: str) -> bool:
    scoped = [s for s in scopes.get("scoped") or () if (s.get("entity") or {}).get("name") in (repo_id, namespace)]
    permissions = [scopes.get("global") or (), *(s.get("permissions") or () for s in scoped)]
    return any("repo.write" in p for p in permissions)


def check_push_access(repo_id: str, *, token: str | None = None) -> str:
    """Check that ``token`` (default: the saved login / ``HF_TOKEN``) can create and write the model repo
    ``repo_id``; returns the user's name.

    Raises:
        ValueError: ``repo_id`` is not ``"org/name"``.
        PushAccessError: no token, the Hub unreachable (or offline mode), an invalid or read-only token, or a
            namespace the user cannot write to.
    """
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    check_repo_id(repo_id)
    namespace = repo_id.split("/")[0]
    token = token or huggingface_hub.get_token()
    if not token:
        raise PushAccessError(
            f"no Hugging Face token to push to {repo_id!r}: log in with `hf auth login` or set HF_TOKEN (a token "
            "with write access), then run again"
        )
    try:
        info = huggingface_hub.HfApi(token=token).whoami(token=token)
    except OfflineModeIsEnabled as e:
        raise PushAccessError(f"cannot push to {repo_id!r}: the Hub is disabled here (HF_HUB_OFFLINE=1): {e}") from e
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        what = "the token is invalid (401)" if status == 401 else f"the Hub answered {status}"
        raise PushAccessError(f"cannot push to {repo_id!r}: {what}: {str(e).splitlines()[0]}") from e
    except Exception as e:  # the transport: DNS, refused or timed-out connection, proxy, TLS
        cause = (str(e).splitlines() or [""])[0]
        message = f"cannot push to {repo_id!r}: the Hub is unreachable ({type(e).__name__}: {cause})"
        raise PushAccessError(message) from e
    user = str(info.get("name") or "")
    access = (info.get("auth") or {}).get("accessToken") or {}
    role = access.get("role")
    if role == "read":
        raise PushAccessError(f"cannot push to {repo_id!r}: the token of {user!r} is read-only; use a token with "
                              "write access (https://huggingface.co/settings/tokens)")  # fmt: skip
    if role == "fineGrained" and not _fine_grained_allows(access.get("fineGrained") or {}, repo_id, namespace):
        raise PushAccessError(f"cannot push to {repo_id!r}: the fine-grained token of {user!r} has no repo.write "
                              f"permission on {repo_id!r} or {namespace!r}")  # fmt: skip
    if namespace != user:
        orgs = {o.get("name"): o.get("roleInOrg") for o in info.get("orgs") or () if isinstance(o, Mapping)}
        if namespace not in orgs:
            raise PushAccessError(
                f"cannot push to {repo_id!r}: {namespace!r} is neither the user {user!r} nor one of their "
                f"organisations ({sorted(n for n in orgs if n) or 'none'})"
            )
        if orgs[namespace] == "read":
            raise PushAccessError(f"cannot push to {repo_id!r}: {user!r} has the read role in {namespace!r}")
    return user


def require_push_access(repo_id: str, *, flag: str = "--push_to_hub true") -> str:
    """:func:`check_push_access` for a command: a refusal ends it with one ``error:`` line naming ``flag`` (exit
    status 2), before any work."""
    from .._terminal import refuse

    try:
        return check_push_access(repo_id)
    except (PushAccessError, ValueError) as e:
        refuse(f"{flag}: {e}")
