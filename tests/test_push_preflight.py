"""``--push_to_hub true`` and ``pml-suprank-push`` check the token, the network and the write access before any work
(huggingface_hub's own ``whoami`` request, answered locally); a model folder is pushed as written (huggingface_hub's
upload, the HTTP answered locally)."""

from __future__ import annotations

import importlib

import pytest
import torch
from _hub_http import fake_hub_http, whoami_answer

from pml_suprank.hub.preflight import PushAccessError, check_push_access
from pml_suprank.models import RetrievalModel

pytestmark = pytest.mark.hub


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_access_granted_for_the_user_and_writable_orgs(token):
    with fake_hub_http(whoami_answer("me", orgs={"team": "write", "viewers": "read"})) as seen:
        assert check_push_access("me/model") == "me"
        assert check_push_access("team/model") == "me"
    assert seen.count("/api/whoami-v2") == 2
    scopes = {"scoped": [{"entity": {"type": "model", "name": "me/model"}, "permissions": ["repo.write"]}]}
    with fake_hub_http(whoami_answer("me", role="fineGrained", fine_grained=scopes)):
        assert check_push_access("me/model") == "me"


@pytest.mark.parametrize(
    ("answer", "repo", "message"),
    [
        (whoami_answer("me", role="read"), "me/model", "read-only"),
        (whoami_answer("me"), "someone/model", "neither the user 'me' nor one of their organisations"),
        (whoami_answer("me", orgs={"viewers": "read"}), "viewers/model", "read role in 'viewers'"),
        (whoami_answer("me", role="fineGrained", fine_grained={"scoped": []}), "me/model", "no repo.write"),
        (None, "me/model", "token is invalid"),
    ],
)
def test_refusals_name_the_cause(token, answer, repo, message):
    with fake_hub_http(answer), pytest.raises(PushAccessError, match=message):
        check_push_access(repo)


def test_no_token_and_no_network_are_refused(monkeypatch, token):
    with fake_hub_http(whoami_answer(), down=True), pytest.raises(PushAccessError, match="unreachable.*refused"):
        check_push_access("me/model")
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with fake_hub_http(whoami_answer()) as seen, pytest.raises(PushAccessError, match="hf auth login"):
        check_push_access("me/model")
    assert "/api/whoami-v2" not in seen  # nothing was asked without a token


def test_training_refuses_before_the_first_step(token, tmp_path, capsys):
    from _helpers import import_recipe

    train = import_recipe("train_happier")
    argv = ["--backbone", "test_resnet", "--image_size", "16", "--num_per_class", "4", "--embedding_size", "8",
            "--cpu", "--no_plots", "--with_tracking", "false", "--output_dir", str(tmp_path / "run"),
            "--push_to_hub", "true", "--hub_model_id", "me/model"]  # fmt: skip
    with fake_hub_http(whoami_answer("me", role="read")), pytest.raises(SystemExit) as raised:
        train.main(argv)
    err = capsys.readouterr().err.strip()
    assert raised.value.code == 2 and len(err.splitlines()) == 1 and "--push_to_hub true: cannot push" in err
    assert not (tmp_path / "run").exists()  # nothing was done


def test_push_command_pushes_a_folder_as_written(token, tmp_path, capsys):
    torch.manual_seed(0)
    final = tmp_path / "final"
    RetrievalModel("test_resnet", embedding_size=8, image_size=32).save_pretrained(final, metrics={"h_ap": 0.5})
    (final / "plots").mkdir()
    (final / "plots" / "curve.png").write_bytes(b"png")
    push = importlib.import_module("pml_suprank.recipes.push")
    with fake_hub_http(whoami_answer("me"), remote=tmp_path / "remote"):
        result = push.main([str(final), "--repo_id", "me/model"])
    remote = tmp_path / "remote" / "me" / "model"
    uploaded = {p.relative_to(remote).as_posix() for p in remote.rglob("*") if p.is_file()}
    assert result["user"] == "me" and {"plots/curve.png", "README.md", "metrics.json"} <= uploaded
    for argv, message in (([str(tmp_path / "nothing"), "--repo_id", "me/model"], "has no config.json"),
                          ([str(final), "--repo_id", "other/model"], "cannot push to 'other/model'")):  # fmt: skip
        with fake_hub_http(whoami_answer("me")), pytest.raises(SystemExit) as raised:
            push.main(argv)
        err = capsys.readouterr().err.strip()
        assert raised.value.code == 2 and len(err.splitlines()) == 1 and message in err, err
