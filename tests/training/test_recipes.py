"""End-to-end tests of recipes/train_happier.py, recipes/train_roadmap.py and recipes/evaluate.py on tiny settings
(16-px SyntheticShapes, timm ``test_resnet``, a few steps): single process, ``torchrun --nproc_per_node 2`` (gloo),
stop-and-resume and kill-and-resume equal to an uninterrupted run, corrupt checkpoints, ``--config`` YAML, Hub push
with the network call replaced."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from _helpers import import_recipe, parse_recipe, recipe_parser

pytest.importorskip("accelerate")
pytest.importorskip("timm")

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
TINY = [
    "--backbone", "test_resnet", "--image_size", "16", "--num_per_class", "8", "--embedding_size", "16",
    "--batch_size", "32", "--eval_batch_size", "64", "--with_tracking", "false", "--cpu",
]  # fmt: skip


def _env():
    env = dict(os.environ)  # noqa: TID251 - subprocess environment of the tests
    env.update({"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _run(args, timeout=600, check=True):
    proc = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _recipe(name, out, *extra, check=True):
    return _run([sys.executable, str(RECIPES / name), *TINY, "--output_dir", str(out), *extra], check=check)


def _final_weights(out):
    from safetensors.torch import load_file

    return load_file(str(Path(out) / "final" / "model.safetensors"))


def _assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def happier_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("happier")
    proc = _recipe("train_happier.py", out, "--max_train_steps", "3", "--checkpoint_every", "2")
    return out, proc


# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_train_happier_few_steps_writes_everything(happier_run):
    out, proc = happier_run
    text = proc.stdout
    assert "test metrics before training:" in text and "test metrics before / after training:" in text
    for key in ("h_ap", "ndcg", "asi", "ap_level0", "ap_level1", "recall_at_1"):
        assert key in text
    final = out / "final"
    for name in (
        "config.json",
        "model.safetensors",
        "README.md",
        "metrics.json",
        "training_summary.json",
        "history.json",
        "precision_recall.png",
        "hierarchical_precision_recall.png",
        "embedding_map.png",
        "retrieval_grid.png",
    ):
        assert (final / name).is_file(), name
    summary = json.loads((final / "training_summary.json").read_text())
    assert summary["steps"] == 3 and set(summary["before"]) >= {"h_ap", "ndcg", "asi"}
    metrics = json.loads((final / "metrics.json").read_text())
    assert 0.0 <= metrics["h_ap"] <= 1.0
    # every evaluation is recorded once in the history, "before training" at step 0 and "after" at the last step
    evals = [(r["step"], r["eval/h_ap"]) for r in json.loads((final / "history.json").read_text()) if "eval/h_ap" in r]
    assert evals[0] == (0, summary["before"]["h_ap"]) and evals[-1] == (3, metrics["h_ap"])
    assert [s for s, _ in evals] == sorted({s for s, _ in evals})
    config = json.loads((final / "config.json").read_text())
    assert config["training"]["loss"] == "HAPPIER" and config["model_args"]["backbone"] == "test_resnet"
    card = (final / "README.md").read_text()
    assert "precision_recall.png" in card
    # no repo id: the usage line loads the folder itself (written with its final name, never a temporary one)
    assert re.search(r'RetrievalModel.from_pretrained\("(\./)?final"\)', card), card
    run = json.loads((out / "run.json").read_text())
    assert config["training"]["run_fingerprint"] == summary["run_fingerprint"] == run["fingerprint"]
    assert run["config"]["model"]["backbone"] == "test_resnet" and run["config"]["loss"]["name"] == "HAPPIER"
    assert not (out / "run.lock").exists()  # released at the end
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step_00000002", "step_00000003"]
    # the saved model restores offline and gives the evaluated embeddings
    from pml_suprank.models import RetrievalModel

    model = RetrievalModel.from_pretrained(final)
    assert model.embedding_size == 16


@pytest.mark.slow
def test_evaluate_recipe_on_the_final_folder(happier_run, tmp_path):
    out, _ = happier_run
    proc = _run(
        [
            sys.executable,
            str(RECIPES / "evaluate.py"),
            "--model",
            str(out / "final"),
            "--num_per_class",
            "8",
            "--cpu",
            "--output_dir",
            str(tmp_path),
        ]
    )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    trained = json.loads((out / "final" / "metrics.json").read_text())
    assert metrics["h_ap"] == pytest.approx(trained["h_ap"], abs=1e-6)
    assert "h_ap" in proc.stdout and (tmp_path / "retrieval_grid.png").is_file()


@pytest.mark.slow
def test_train_roadmap_few_steps_proxies_bf16(tmp_path):
    # ROADMAP with the ClusterLoss proxies (own optimizer group) under bf16 autocast on the CPU. test_vit (no
    # convolution): on torch 2.14.1's CPU, the bf16 weight gradient of one test_resnet convolution comes out
    # non-finite in about a third of the runs, at step 0, the same on earlier mains and single-threaded
    proc = _recipe(
        "train_roadmap.py",
        tmp_path,
        "--backbone",
        "test_vit",
        "--backbone_kwargs",
        '{"img_size": 16}',
        "--max_train_steps",
        "2",
        "--no_plots",
        "--decomposability",
        "proxy",
        "--mixed_precision",
        "bf16",
    )
    assert "test metrics before / after training:" in proc.stdout and "mixed precision bf16" in proc.stdout
    config = json.loads((tmp_path / "final" / "config.json").read_text())
    assert config["training"]["loss"] == "ROADMAP"
    assert config["training"]["loss_kwargs"]["decomposability_weight"] == 0.1
    history = json.loads((tmp_path / "final" / "history.json").read_text())
    assert any("lr_proxies" in h for h in history)


@pytest.mark.slow
def test_kill_and_resume_equals_uninterrupted_run(tmp_path):
    common = [
        "--max_train_steps",
        "10",
        "--checkpoint_every",
        "2",
        "--keep_checkpoints",
        "0",
        "--skip_initial_eval",
        "--no_plots",
        "--epochs",
        "2",
    ]
    _recipe("train_happier.py", tmp_path / "full", *common)
    out = tmp_path / "killed"
    args = [sys.executable, str(RECIPES / "train_happier.py"), *TINY, "--output_dir", str(out), *common]
    proc = subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if (out / "checkpoints" / "step_00000004").is_dir():
                break
            time.sleep(0.05)
        killed = proc.poll() is None
        if killed:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if killed:
        assert not (out / "final").exists()
    # whatever the kill left behind is a set of complete checkpoints (temporary folders are ignored), and a lock
    # file of a dead process, taken over
    resumed = _recipe("train_happier.py", out, *common, "--resume", "latest")
    _assert_same_weights(_final_weights(tmp_path / "full"), _final_weights(out))
    # the resume passed the fingerprint check: the same run as the uninterrupted one (output_dir aside)
    fingerprint = json.loads((tmp_path / "full" / "run.json").read_text())["fingerprint"]
    assert json.loads((out / "run.json").read_text())["fingerprint"] == fingerprint
    if killed:
        assert "resumed from" in resumed.stdout
    for ckpt in (out / "checkpoints").iterdir():
        assert json.loads((ckpt / "trainer_state.json").read_text())["fingerprint"] == fingerprint


@pytest.mark.slow
def test_resumed_run_keeps_its_recorded_evaluations(happier_run, tmp_path):
    """A resumed run is not evaluated "before training" again: its before metrics are the step-0 evaluation its
    checkpoint recorded (here without ``metrics_before.json``), and history.json holds each evaluation once."""
    out, _ = happier_run
    shutil.copytree(out, tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "final")
    shutil.rmtree(tmp_path / "checkpoints" / "step_00000003")
    (tmp_path / "metrics_before.json").unlink()
    extra = ("--max_train_steps", "3", "--checkpoint_every", "2", "--no_plots", "--resume", "latest")
    proc = _recipe("train_happier.py", tmp_path, *extra)
    assert "resumed from" in proc.stdout and "test metrics before / after training:" in proc.stdout
    assert "test metrics before training:" not in proc.stdout
    before = json.loads((out / "final" / "training_summary.json").read_text())["before"]
    assert json.loads((tmp_path / "final" / "training_summary.json").read_text())["before"] == before
    history = json.loads((tmp_path / "final" / "history.json").read_text())
    evals = [(r["step"], r["eval/h_ap"]) for r in history if "eval/h_ap" in r]
    assert evals[0] == (0, before["h_ap"]) and [s for s, _ in evals] == sorted({s for s, _ in evals})


@pytest.mark.slow
def test_corrupt_checkpoint_gives_a_clear_error(happier_run, tmp_path):
    out, _ = happier_run
    shutil.copytree(out / "checkpoints", tmp_path / "checkpoints")
    ckpt = tmp_path / "checkpoints" / "step_00000002"
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    proc = _recipe(
        "train_happier.py",
        tmp_path,
        "--max_train_steps",
        "3",
        "--checkpoint_every",
        "2",
        "--skip_initial_eval",
        "--no_plots",
        "--resume",
        str(ckpt),
        check=False,
    )
    assert proc.returncode != 0
    assert f"error: --resume {ckpt}: checkpoint" in proc.stderr and "Traceback" not in proc.stderr
    assert "is corrupt: cannot read model.safetensors" in proc.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_two_processes_equals_one_process_with_the_global_batch(tmp_path):
    # test_vit has LayerNorm only (no BatchNorm statistics per process) and SGD keeps weight differences proportional
    # to gradient differences: 2 processes x 32 images must train like 1 process x 64 images (same global batches,
    # same per-item augmentation, loss of the gathered global batch, DDP averaging), with the memory in use from the
    # second step.
    exact = [
        "--backbone",
        "test_vit",
        "--backbone_kwargs",
        '{"img_size": 16}',
        "--optimizer",
        "sgd",
        "--momentum",
        "0",
        "--lr_backbone",
        "0.05",
        "--lr_head",
        "0.05",
        "--lr_proxies",
        "1.0",
        "--max_train_steps",
        "3",
        "--memory_size",
        "192",
        "--memory_warmup_steps",
        "1",
        "--no_plots",
    ]
    single = _recipe("train_happier.py", tmp_path / "one", "--batch_size", "64", *exact, "--skip_initial_eval")
    assert "1 process(es)" in single.stdout
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(RECIPES / "train_happier.py"),
        *TINY,
        "--output_dir",
        str(tmp_path / "two"),
        *exact,
        "--checkpoint_every",
        "1",
    ]
    proc = _run(args, check=False)
    if proc.returncode != 0 and "SIGABRT" in proc.stderr:  # occasional gloo start-up flake on a shared machine
        shutil.rmtree(tmp_path / "two", ignore_errors=True)
        proc = _run(args, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 process(es)" in proc.stdout
    assert proc.stdout.count("test metrics before / after training:") == 1  # accelerator.print: main process only
    state = json.loads((tmp_path / "two" / "checkpoints" / "step_00000003" / "trainer_state.json").read_text())
    assert state["num_processes"] == 2
    assert (tmp_path / "two" / "checkpoints" / "step_00000003" / "random_states_1.pkl").is_file()
    one, two = _final_weights(tmp_path / "one"), _final_weights(tmp_path / "two")
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-5, msg=k)
    # only the main process took the lock (released at the end); a refusal on the main process (here: a new run into
    # a finished run's folder) stops every process instead of leaving the others waiting at a barrier
    assert not (tmp_path / "two" / "run.lock").exists()
    again = _run(args, timeout=300, check=False)
    # every process prints the one error line and ends with status 2 (they leave together: a barrier, the process
    # group destroyed, then an immediate exit — torchrun's SIGTERM to the workers still running after the first exit
    # cannot catch one in the interpreter's teardown); torchrun itself then exits 1 with its own report
    assert again.returncode == 1 and again.stderr.count("exitcode  : 2") == 2, again.stderr[-2000:]
    assert again.stderr.count(": error: output_dir") == 2 and "already holds a previous run" in again.stderr
    assert "Signal 6" not in again.stderr and "Signal 15" not in again.stderr, again.stderr[-2000:]
    assert "pml_suprank/" not in again.stderr  # no traceback of the recipe's own code


# ------------------------------------------------------------------------------------------------------------------
# in-process: --config YAML, Hub push with the upload replaced
# ------------------------------------------------------------------------------------------------------------------


def test_config_yaml_sets_defaults_and_flags_win(tmp_path):
    common, parser = recipe_parser("train_happier")
    cfg = tmp_path / "mine.yaml"
    cfg.write_text(
        "name: mine\nmodel: {backbone: resnet18, embedding_size: 64}\ndata: {dataset: synthetic}\n"
        "loss: {name: HAPPIER, alpha: 2.0, offset: 1.44}\ntraining: {epochs: 3}\n"
        "hub: {paper_results: {h_ap: 50.0}}\n"
    )
    spec = parse_recipe(parser, ["--config", str(cfg), "--epochs", "5"])
    assert spec.model.backbone == "resnet18" and spec.model.embedding_size == 64 and spec.train.epochs == 5
    assert spec.train.alpha == 2.0
    suprank = {k: v for k, v in spec.loss_kwargs().items() if k in ("tau", "rho", "delta", "start", "offset")}
    assert {k: v for k, v in suprank.items() if v is not None} == {"tau": 0.01, "rho": 100.0, "offset": 1.44}
    assert spec.hub_config["hub"]["paper_results"] == {"h_ap": 50.0}
    cfg.write_text(
        "name: mine\nmodel: {backbone: resnet18}\ndata: {dataset: synthetic}\nloss: {name: HAPPIER}\n"
        "training: {epoch: 3}\n"
    )
    with pytest.raises(SystemExit):  # a typo is an error, not a silently ignored key
        parse_recipe(recipe_parser("train_happier")[1], ["--config", str(cfg)])
    with pytest.raises(SystemExit):
        parse_recipe(recipe_parser("train_happier")[1], ["--config", str(tmp_path / "missing.yaml")])


@pytest.mark.parametrize("path", sorted((ROOT / "pml_suprank" / "hub_configs").glob("*.yaml")), ids=lambda p: p.stem)
@pytest.mark.slow
def test_every_training_hub_config_parses_with_its_recipe(path, tmp_path):
    import yaml

    from pml_suprank.data.benchmarks import BENCHMARKS

    raw = yaml.safe_load(path.read_text())
    name = (raw.get("loss") or {}).get("name")
    if name is None:
        pytest.skip(f"{path.name} is not a training config (no loss.name)")
    recipe = "train_roadmap" if name == "ROADMAP" else "train_happier"
    common, parser = recipe_parser(recipe)
    root = ["--data_root", str(tmp_path)] if raw["data"]["dataset"] in BENCHMARKS else []
    spec = parse_recipe(parser, ["--config", str(path), *root])
    assert spec.loss.loss == name
    assert spec.model.backbone == raw["model"]["backbone"] and spec.data.dataset == raw["data"]["dataset"]
    values = spec.values()
    for section in ("optimizer", "sampler_options", "training", "evaluation", "memory", "scheduler"):
        for key, value in (raw.get(section) or {}).items():
            assert values[key] == (tuple(value) if key == "k_values" else value), (section, key)
    spec.training_config()  # every value is a valid TrainingConfig


# ------------------------------------------------------------------------------------------------------------------
# the generated command line: one flag per option field, help with defaults, snake_case, partial --config files
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["train_happier", "train_roadmap"])
def test_flags_are_generated_from_the_option_dataclasses(recipe):
    from dataclasses import fields

    from pml_suprank.training import DataOptions, LossOptions, ModelOptions, RunOptions, TrainingConfig

    common, parser = recipe_parser(recipe)
    flags = {s for a in parser._actions for s in a.option_strings}
    for cls in (TrainingConfig, ModelOptions, DataOptions, RunOptions, LossOptions):
        for f in fields(cls):
            if f.metadata["cli"]:
                assert f"--{f.name}" in flags, f.name
                assert f.metadata["help"], f.name
    assert all(flag == flag.lower() and "-" not in flag[2:] for flag in flags if flag.startswith("--"))
    assert "--list_losses" in flags and "--loss_kwargs" in flags  # one training command: every loss and option
    text = parser.format_help()
    assert "(default: 128)" in text  # eval_batch_size: TrainingConfig's default (the old argparse said 256)
    assert vars(parser.parse_args([])) == {"config": None}  # an option not given stays out: the layers decide
    spec = parse_recipe(parser, [])
    assert spec.train.eval_batch_size == TrainingConfig().eval_batch_size and spec.train.epochs == 12
    assert spec.train.lr_backbone == 1e-3  # the preset's no-argument run
    assert spec.loss.loss == {"train_happier": "HAPPIER", "train_roadmap": "ROADMAP"}[recipe] and not spec.given


def test_bool_list_and_dict_flags():
    common, parser = recipe_parser("train_happier")
    args = parser.parse_args(
        ["--pretrained", "true", "--no_plots", "--push_to_hub", "false", "--layer_norm", "no", "--k_values", "1,10,100",
         "--crop_scale", "0.16,1.0", "--label_columns", "a,b", "--backbone_kwargs", '{"img_size": 64}']
    )  # fmt: skip
    assert args.pretrained is True and args.no_plots is True and args.push_to_hub is False and args.layer_norm is False
    assert args.k_values == [1, 10, 100] and args.crop_scale == [0.16, 1.0] and args.label_columns == ["a", "b"]
    assert args.backbone_kwargs == {"img_size": 64}
    assert parser.parse_args(["--crop_scale", "0.5", "1.0"]).crop_scale == [0.5, 1.0]  # the old space-separated form
    with pytest.raises(SystemExit):
        parser.parse_args(["--pretrained", "maybe"])
    assert parser.parse_args(["--loss", "ROADMAP"]).loss == "ROADMAP"  # every loss: the preset sets the default
    with pytest.raises(SystemExit):
        parse_recipe(parser, ["--loss", "NoSuchLoss"])  # refused by the loss option's check


def test_partial_override_config_files(tmp_path):
    common, parser = recipe_parser("train_happier")
    override = tmp_path / "short.yaml"
    override.write_text("training: {epochs: 7}\noptimizer: {lr_head: 0.5}\n")
    base = ROOT / "pml_suprank" / "hub_configs" / "happier_sop.yaml"
    spec = parse_recipe(parser, ["--config", str(base), "--config", str(override), "--data_root", str(tmp_path)])
    train = spec.train
    assert (
        train.epochs == 7 and train.lr_head == 0.5 and train.lr_backbone == 5.0e-5 and train.sampler == "hierarchical"
    )
    assert spec.hub_config["name"] == "happier_sop" and spec.hub_config["training"]["warmup_epochs"] == 5
    # an override file alone is laid over the recipe's defaults
    spec = parse_recipe(recipe_parser("train_happier")[1], ["--config", str(override)])
    assert spec.train.epochs == 7 and spec.model.backbone == "test_resnet"
    assert spec.hub_config == {"training": {"epochs": 7}, "optimizer": {"lr_head": 0.5}}
    # the options a file leaves out are the recipe's: warmup_epochs 11 < the recipe's 12 epochs (TrainingConfig: 10)
    override.write_text("training: {warmup_epochs: 11}\n")
    spec = parse_recipe(recipe_parser("train_happier")[1], ["--config", str(override)])
    assert spec.train.warmup_epochs == 11 and spec.train.epochs == 12
    # every preset trains every loss: the file's loss replaces the preset's default
    roadmap = ROOT / "pml_suprank" / "hub_configs" / "roadmap_sop.yaml"
    argv = ["--config", str(roadmap), "--data_root", str(tmp_path)]
    assert parse_recipe(recipe_parser("train_happier")[1], argv).loss.loss == "ROADMAP"


@pytest.mark.parametrize("folder", ["recipes", "pml_suprank/recipes"])
@pytest.mark.parametrize(
    "name",
    ["train.py", "train_happier.py", "train_roadmap.py", "evaluate.py", "search.py", "fit_heat.py", "ood_benchmark.py"],
)
def test_every_recipe_sets_a_passive_openmp_wait_policy_before_torch(folder, name):
    """Both the package module (``-m`` / console script: ``pml_suprank`` imports nothing, ``pml_suprank.recipes`` sets
    the policy before any recipe runs) and the repository's entry point set it before anything that may import torch."""
    text = (ROOT / folder / name).read_text()
    if folder == "pml_suprank/recipes":
        text = (ROOT / folder / "__init__.py").read_text() + text
    policy = text.index('os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")')
    for later in ("import torch", "import common", "from pml_suprank"):
        if later in text:
            assert policy < text.index(later), later


def test_evaluate_help_shows_defaults():
    evaluate = import_recipe("evaluate")
    text = evaluate.build_parser().format_help()
    assert "--batch_size" in text and "(default: 128)" in text and "--split" in text
    args = evaluate.build_parser().parse_args(["--model", "m", "--split", "val", "--batch_size", "8", "--cpu"])
    assert args.test_split == "val" and args.eval_batch_size == 8 and args.cpu is True


@pytest.mark.slow
@pytest.mark.hub
def test_push_to_hub_upload_replaced(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    train_happier = import_recipe("train_happier")
    calls = {}

    def create_repo(self, repo_id, **kw):
        calls["create"] = repo_id
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, **kw):
        calls["upload"] = kw
        calls["files"] = sorted(p.name for p in Path(kw["folder_path"]).iterdir())
        return "ok"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    argv = [
        *TINY,
        "--output_dir",
        str(tmp_path),
        "--max_train_steps",
        "1",
        "--skip_initial_eval",
        "--no_plots",
        "--push_to_hub",
        "--hub_model_id",
        "me/happier-test",
    ]
    from _hub_http import fake_hub_http, whoami_answer

    monkeypatch.setenv("HF_TOKEN", "hf_test_token")  # the pre-flight check: huggingface_hub's whoami, answered here
    with fake_hub_http(whoami_answer("me")):
        train_happier.main(argv)
    assert calls["create"] == "me/happier-test" and calls["upload"]["repo_id"] == "me/happier-test"
    card = (tmp_path / "final" / "README.md").read_text()
    assert 'from_pretrained("me/happier-test")' in card  # the usage line names the repo pushed to
    assert {"config.json", "model.safetensors", "README.md", "metrics.json"} <= set(calls["files"])

    def failing_upload(self, **kw):
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", failing_upload)
    out2 = tmp_path / "fail"
    argv = [str(out2) if a == str(tmp_path) else a for a in argv]  # the same run into another folder
    with fake_hub_http(whoami_answer("me")), pytest.raises(SystemExit) as exc:
        train_happier.main(argv)
    assert exc.value.code == 1
    assert "network unreachable" in capsys.readouterr().err
    assert (out2 / "final" / "model.safetensors").is_file() and (out2 / "final" / "config.json").is_file()


# ------------------------------------------------------------------------------------------------------------------
# run identity: one run per output folder, resume only the same run, lock file, flags checked before anything is built
# ------------------------------------------------------------------------------------------------------------------
def test_run_flags_are_checked_by_the_parser(capsys):
    common, _ = recipe_parser("train_happier")
    for argv, expected in (
        (["--push_to_hub", "true"], "--push_to_hub true needs --hub_model_id"),
        (["--push_to_hub", "--hub_model_id", "no-slash"], "--hub_model_id: repo_id must look like 'org/name'"),
        (["--resume_ignore_config", "true"], "--resume_ignore_config true needs --resume"),
        (["--overwrite_output_dir", "true", "--resume", "latest"], "cannot be combined with --resume"),
    ):
        with pytest.raises(SystemExit) as exc:
            parse_recipe(recipe_parser("train_happier")[1], argv)
        assert exc.value.code == 2
        assert expected in capsys.readouterr().err
    spec = parse_recipe(recipe_parser("train_happier")[1], ["--push_to_hub", "--hub_model_id", "me/x"])
    assert spec.run.push_to_hub and spec.run.hub_model_id == "me/x"


@pytest.mark.slow
def test_second_run_into_a_run_folder_is_refused_or_isolated(happier_run, tmp_path):
    out, _ = happier_run
    shutil.copytree(out, tmp_path, dirs_exist_ok=True)
    fast = ["--max_train_steps", "3", "--checkpoint_every", "2", "--skip_initial_eval", "--no_plots"]
    # a new run into the folder of a finished run: refused before anything is trained or written
    before = (tmp_path / "final" / "config.json").read_bytes()
    proc = _recipe("train_happier.py", tmp_path, *fast, "--lr_head", "0.005", check=False)
    assert proc.returncode == 2 and "error: output_dir" in proc.stderr and "Traceback" not in proc.stderr
    for hint in ("already holds a previous run", "--resume latest", "--overwrite_output_dir true"):
        assert hint in proc.stderr
    assert (tmp_path / "final" / "config.json").read_bytes() == before
    # resuming it with another --lr_head: refused, naming the setting
    proc = _recipe("train_happier.py", tmp_path, *fast, "--lr_head", "0.005", "--resume", "latest", check=False)
    assert proc.returncode == 2 and "error: --resume latest: checkpoint" in proc.stderr
    assert "lr_head: 0.002 -> 0.005" in proc.stderr and "--resume_ignore_config true" in proc.stderr
    # with the override: continues from step 3 to 5; the first run's checkpoints are not rotated away
    _recipe("train_happier.py", tmp_path, *fast[2:], "--max_train_steps", "5", "--lr_head", "0.005",
            "--resume", "latest", "--resume_ignore_config", "true")  # fmt: skip
    run = json.loads((tmp_path / "run.json").read_text())
    first = json.loads((out / "run.json").read_text())["fingerprint"]
    assert run["previous_fingerprint"] == first and run["fingerprint"] != first
    assert {"step_00000002", "step_00000003", "step_00000005"} <= {p.name for p in (tmp_path / "checkpoints").iterdir()}
    config = json.loads((tmp_path / "final" / "config.json").read_text())
    assert config["training"]["run_fingerprint"] == run["fingerprint"]
    assert config["training"]["training_config"]["lr_head"] == 0.005  # final/ and its config.json: one run
    assert json.loads((tmp_path / "final" / "training_summary.json").read_text())["steps"] == 5


@pytest.mark.slow
def test_a_locked_output_folder_is_refused(tmp_path):
    import socket

    (tmp_path / "run.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    proc = _recipe("train_happier.py", tmp_path, "--max_train_steps", "1", "--skip_initial_eval", check=False)
    assert proc.returncode == 2 and "error: another run holds the lock file" in proc.stderr
    assert str(tmp_path / "run.lock") in proc.stderr and f"pid {os.getpid()}" in proc.stderr
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "run.json").exists()


def test_compile_loss_compiles_in_place_and_keeps_state_dict_keys():
    common, parser = recipe_parser("train_happier")
    args = parse_recipe(parser, ["--loss", "HAPPIER", "--compile_loss"])
    plain = parse_recipe(parser, ["--loss", "HAPPIER"])
    compiled, reference = common.make_loss(args, 12, 16), common.make_loss(plain, 12, 16)
    assert compiled._compiled_call_impl is not None and reference._compiled_call_impl is None
    assert list(compiled.state_dict()) == list(reference.state_dict())


@pytest.mark.slow
def test_roadmap_recipe_trains_with_a_compiled_dense_loss(tmp_path):
    proc = _recipe("train_roadmap.py", tmp_path, "--max_train_steps", "2", "--kernel", "dense", "--compile_loss")
    weights = _final_weights(tmp_path)
    assert weights and all(torch.isfinite(w).all() for w in weights.values()), proc.stdout[-2000:]


@pytest.mark.parametrize(
    ("name", "required"),
    [("evaluate", ["--model", "m"]), ("search", ["--model", "m", "--output_dir", "o"]), ("fit_heat", []),
     ("ood_score", ["--model", "m", "--images", "i", "--output_dir", "o"])],
)  # fmt: skip
def test_embedding_cache_is_one_shared_option(name, required, capsys):
    """``--embedding_cache`` is declared once (ModelUseOptions) and checked alike in every recipe that embeds."""
    recipe = import_recipe(name)
    assert recipe.parse_args(required).embedding_cache is None
    assert recipe.parse_args([*required, "--embedding_cache", "cache"]).embedding_cache == "cache"
    with pytest.raises(SystemExit) as raised:
        recipe.parse_args([*required, "--embedding_cache", ""])
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert raised.value.code == 2 and len(err) == 1 and "--embedding_cache must be null or a folder path" in err[0]


def _one_error_line(capsys, raised) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert raised.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [(["--backbone_kwargs", '{"no_such_argument": 1}'], r"--backbone_kwargs \{\"no_such_argument\": 1\}: timm\.create_"
      r"model\('test_resnet'\) refused them \(.*unexpected keyword argument 'no_such_argument'"),
     (["--chunk_size", "8"], r"--chunk_size 8: the backbone test_resnet has BatchNorm layers.*--freeze_batch_norm")],
)  # fmt: skip
def test_a_model_the_flags_cannot_build_is_one_error_line(extra, expected, tmp_path, capsys):
    """A keyword the timm model class refuses and gradient caching over BatchNorm: ``error:`` naming the flag, exit 2,
    nothing written."""
    from pml_suprank.recipes import train_happier

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as raised:
        train_happier.main([*TINY, "--cpu", "--output_dir", str(out), *extra])
    assert re.search(expected, _one_error_line(capsys, raised))
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "required"),
    [("evaluate", []), ("search", ["--output_dir", "o"]), ("fit_heat", []),
     ("ood_score", ["--images", "i", "--output_dir", "o"])],
)  # fmt: skip
def test_device_is_checked_by_name_and_by_machine(name, required, monkeypatch, capsys):
    """``--device`` must parse as a torch device (checked by the parser), and a CUDA device this machine lacks is
    refused by name before any work, not a ``RuntimeError`` traceback."""
    from pml_suprank.recipes import _common

    recipe = import_recipe(name)
    required = [*required, "--model", "m"] if name != "fit_heat" else []
    if name != "evaluate":  # evaluate picks its device through Accelerate (--cpu)
        with pytest.raises(SystemExit) as raised:
            recipe.parse_args([*required, "--device", "nope"])
        assert "--device must be null or a torch device such as cpu, cuda or cuda:1; got 'nope'" in _one_error_line(
            capsys, raised
        )
        assert recipe.parse_args([*required, "--device", "cuda:1"]).device == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(SystemExit) as raised:
        _common.device("cuda:1")
    assert "--device='cuda:1' but CUDA is not available on this machine" in _one_error_line(capsys, raised)
    assert _common.device("cpu") == torch.device("cpu") and _common.device(None) == torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "extra"),
    [("evaluate", []), ("search", []), ("ood_score", ["--images", "IMAGES"]), ("fit_heat", []), ("ood_benchmark", [])],
)
def test_output_dir_inside_the_model_folder_is_refused(name, extra, tmp_path, capsys):
    """``--output_dir`` in the ``--model`` folder would replace the model's own ``metrics.json`` and plots (and be
    pushed with it): refused naming both flags before the model is read or anything is written (``ood_benchmark``:
    also when it extracts the features through fit_heat's steps)."""
    model = tmp_path / "final"
    model.mkdir()
    (model / "metrics.json").write_text('{"ap": 0.5}')
    out = model / "eval"
    argv = ["--model", str(model), "--output_dir", str(out), *[str(tmp_path) if a == "IMAGES" else a for a in extra]]
    with pytest.raises(SystemExit) as raised:
        import_recipe(name).main(argv)
    line = _one_error_line(capsys, raised)
    assert f"--output_dir '{out}' lies inside the input folder --model '{model}'" in line
    assert not out.exists() and (model / "metrics.json").read_text() == '{"ap": 0.5}'


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--max_side", "64"], "--max_side applies to the revisited protocol of roxford5k / rparis6k only (no --split); "
      "the test set here is synthetic"),
     (["--benchmark", "roxford5k", "--split", "test", "--max_side", "64"], "here is roxford5k --split test"),
     (["--benchmark", "sop", "--dataset", "cub"], "--benchmark sop and --dataset cub name two test sets; give one")],
)  # fmt: skip
def test_evaluate_refuses_flags_it_would_ignore(argv, expected, capsys):
    """``--max_side`` outside the revisited protocol and a second test set were silently ignored."""
    recipe = import_recipe("evaluate")
    with pytest.raises(SystemExit) as raised:
        recipe.parse_args(["--model", "m", *argv])
    assert expected in _one_error_line(capsys, raised)
    assert recipe.parse_args(["--model", "m", "--benchmark", "roxford5k", "--max_side", "64"]).max_side == 64


def test_search_refuses_a_query_split_without_queries(capsys):
    """``--query_split`` without ``--queries`` was silently ignored; the spec's ``RULES`` refuse it when parsed."""
    recipe = import_recipe("search")
    with pytest.raises(SystemExit) as raised:
        recipe.parse_args(["--model", "m", "--output_dir", "o", "--query_split", "test"])
    assert "--query_split applies to --queries" in _one_error_line(capsys, raised)
    spec = recipe.parse_args(["--model", "m", "--output_dir", "o", "--queries", "q", "--query_split", "test"])
    assert replace(spec, queries=None).query_split == "test"  # checked once, when built: replace() does not check


@pytest.mark.parametrize(("recipe_name", "flag"), [("search", "--gallery"), ("search", "--queries"),
                                                   ("evaluate", "--dataset")])  # fmt: skip
def test_a_missing_local_path_is_named_as_such(recipe_name, flag, tmp_path, capsys):
    """A local path that does not exist was answered with '--label_columns is required'."""
    from pml_suprank.models import RetrievalModel

    model = tmp_path / "final"
    RetrievalModel("test_resnet", embedding_size=8, image_size=32).save_pretrained(model)
    argv = ["--model", str(model), flag, str(tmp_path / "nowhere")]
    argv += ["--output_dir", str(tmp_path / "out"), "--device", "cpu"] if recipe_name == "search" else ["--cpu"]
    argv += ["--gallery", "synthetic"] if flag == "--queries" else []
    with pytest.raises(SystemExit) as raised:
        import_recipe(recipe_name).main(argv)
    assert f"{flag} no such folder or file: {tmp_path / 'nowhere'}" in _one_error_line(capsys, raised)


@pytest.mark.parametrize("name", ["roxford5k", "dyml_animal", "gldv2_hier"])
def test_evaluate_protocol_on_an_incomplete_archive_is_one_error_line(name, tmp_path, capsys):
    """A benchmark evaluated by its own protocol, its archive lacking a file: refused naming ``--data_root`` and the
    file (a ``ValueError`` traceback before)."""
    from pml_suprank.models import RetrievalModel

    model = tmp_path / "final"
    RetrievalModel("test_resnet", embedding_size=8, image_size=32).save_pretrained(model)
    (tmp_path / "archive").mkdir()
    argv = ["--model", str(model), "--benchmark", name, "--data_root", str(tmp_path / "archive"), "--cpu"]
    with pytest.raises(SystemExit) as raised:
        import_recipe("evaluate").main(argv)
    line = _one_error_line(capsys, raised)
    assert f"--data_root {tmp_path / 'archive'}: benchmark {name}, split " in line and "missing file" in line


def test_hub_model_id_is_checked_without_push_to_hub(capsys):
    """``--hub_model_id`` alone names the repo in the model card's usage line: its form is checked all the same."""
    with pytest.raises(SystemExit) as raised:
        parse_recipe(recipe_parser("train_happier")[1], ["--hub_model_id", "no slash"])
    assert "--hub_model_id: repo_id must look like 'org/name'; got 'no slash'" in _one_error_line(capsys, raised)
    assert parse_recipe(recipe_parser("train_happier")[1], ["--hub_model_id", "me/x"]).run.hub_model_id == "me/x"
