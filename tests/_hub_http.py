"""Tests only: huggingface_hub's real code paths with the last step — the HTTP exchange — answered locally.

:func:`fake_hub_http` installs an ``httpx2.MockTransport`` as huggingface_hub's client (``set_client_factory``), so
``HfApi.whoami`` builds its request, parses the answer and raises its own errors exactly as against the Hub; nothing
leaves the machine. ``whoami`` is the answer of ``/api/whoami-v2`` (``None``: 401 invalid token), ``down=True`` makes
every request fail as a refused connection. The previous client factory is restored afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def whoami_answer(name: str = "me", *, role: str = "write", orgs: dict[str, str] | None = None,
                  fine_grained: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """A ``/api/whoami-v2`` body: user ``name``, token ``role``, ``{org: roleInOrg}``, fine-grained scopes."""
    token: dict[str, Any] = {"displayName": "test", "role": role}
    if fine_grained is not None:
        token["fineGrained"] = fine_grained
    return {"type": "user", "name": name, "orgs": [{"name": k, "roleInOrg": v} for k, v in (orgs or {}).items()],
            "auth": {"type": "access_token", "accessToken": token}}  # fmt: skip


@contextlib.contextmanager
def fake_hub_http(whoami: dict[str, Any] | None, *, down: bool = False) -> Iterator[list[str]]:
    """Answer huggingface_hub's HTTP requests locally; yields the list of requested URL paths."""
    import httpx2
    import huggingface_hub
    import huggingface_hub.utils._http as http

    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.path)
        if down:
            raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)
        if request.url.path == "/api/whoami-v2":
            if whoami is None:
                return httpx2.Response(401, json={"error": "Invalid credentials in Authorization header"})
            return httpx2.Response(200, json=whoami)
        return httpx2.Response(404, json={"error": f"not served by the test: {request.url.path}"})

    previous = http._GLOBAL_CLIENT_FACTORY
    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(handler)))
    try:
        yield seen
    finally:
        huggingface_hub.set_client_factory(previous)
