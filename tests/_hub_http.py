"""Tests only: huggingface_hub's real code paths with the last step — the HTTP exchange — answered locally.

:func:`fake_hub_http` installs an ``httpx2.MockTransport`` as huggingface_hub's client (``set_client_factory``), so
``HfApi.whoami``, ``create_repo`` and ``upload_folder`` build their requests, parse the answers and raise their own
errors exactly as against the Hub; nothing leaves the machine. ``whoami`` is the answer of ``/api/whoami-v2``
(``None``: 401 invalid token); with ``remote`` a folder, repo creation, pre-upload and commit are answered and each
committed file is written to ``remote/<org>/<name>/<path>`` (``fail_commit=True``: the commit is refused with a
403); ``down=True`` makes every request fail as a refused connection. The previous client factory is restored
afterwards.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
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
def fake_hub_http(whoami: dict[str, Any] | None = None, *, down: bool = False, remote: Path | None = None,
                  fail_commit: bool = False) -> Iterator[list[str]]:  # fmt: skip
    """Answer huggingface_hub's HTTP requests locally; yields the list of requested URL paths."""
    import httpx2
    import huggingface_hub
    import huggingface_hub.utils._http as http

    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        seen.append(path)
        upload = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(preupload|commit)/.+", path)
        if down:
            raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)
        if fail_commit and upload and upload.group(2) == "commit":  # refused: a 403 is not retried
            return httpx2.Response(403, json={"error": "commit refused by the test"})
        if path == "/api/whoami-v2":
            if whoami is None:
                return httpx2.Response(401, json={"error": "Invalid credentials in Authorization header"})
            return httpx2.Response(200, json=whoami)
        if remote is not None and path == "/api/repos/create":
            body = json.loads(request.content)
            repo = f"{body['organization']}/{body['name']}"
            return httpx2.Response(200, json={"url": f"https://huggingface.co/{repo}", "name": repo})
        if remote is not None and path == "/api/validate-yaml":  # the model card's metadata, checked before a commit
            return httpx2.Response(200, json={})
        if remote is not None and upload and upload.group(2) == "preupload":
            files = json.loads(request.content)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            return httpx2.Response(200, json={"files": modes})
        if remote is not None and upload:
            for line in request.content.splitlines():
                entry = json.loads(line)
                if entry["key"] == "file":
                    target = remote / upload.group(1) / entry["value"]["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(base64.b64decode(entry["value"]["content"]))
            url = f"https://huggingface.co/{upload.group(1)}/commit/{'0' * 40}"
            return httpx2.Response(200, json={"commitUrl": url, "commitOid": "0" * 40, "pullRequestUrl": None})
        return httpx2.Response(404, json={"error": f"not served by the test: {path}"})

    previous = http._GLOBAL_CLIENT_FACTORY
    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(handler)))
    try:
        yield seen
    finally:
        huggingface_hub.set_client_factory(previous)
