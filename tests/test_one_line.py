"""A config error is one line on stderr and writes nothing (issue "A newcomer's second hour", bugs
3 and 4): Hydra's "Error executing job with overrides" line no longer comes first, a refused job
leaves no run directory (24 of 36 run directories of one afternoon were such leftovers), and a
mistake in a config file of the user's own names the file, the key and the nearest valid key
instead of OmegaConf's five-line error or PyYAML's traceback.

The scripts run as a user runs them: from a directory of theirs, by subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from agent_memory.cli import CONFIG_ERROR_EXIT, discard_run_dir
from agent_memory.config import load_job, register_configs

REPO = Path(__file__).resolve().parents[1]

register_configs()


def _script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    path = os.pathsep.join(p for p in (str(REPO), environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, "PYTHONPATH": path},
    )


def _refused(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused run printed (asserting it is one line, and the exit status)."""
    assert proc.returncode == CONFIG_ERROR_EXIT, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("Config error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("script", "args", "line"),
    [
        pytest.param(
            "rollout.py",
            ["env.id=NoSuch-v0"],
            "Config error: env.id='NoSuch-v0' is not a registered Gymnasium id",
            id="preflight",
        ),
        pytest.param(
            "rollout.py",
            ["rollout.group_size=0"],
            "Config error: rollout.group_size must be",
            id="load-job",
        ),
        pytest.param(
            "train.py",
            ["trainer.model=/no/such/model"],
            "Config error: trainer.model: expected 'tiny', a model directory",
            id="train",
        ),
        pytest.param(
            "train.py",
            ["trainer.iterations=1", "memory=window", "+memory.params.top_k=5"],
            "Config error: memory.params has no parameter 'top_k' for strategy 'window'",
            id="train-preflight",
        ),
    ],
)
def test_a_refused_run_prints_one_line_and_leaves_no_directory(tmp_path, script, args, line):
    proc = _script(script, *args, cwd=tmp_path)
    assert _refused(proc).startswith(line)
    assert "Error executing job" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no outputs/rollout/<date>/<time>/


def test_a_refused_sweep_leaves_no_directory(tmp_path):
    proc = _script("rollout.py", "-m", "env.id=NoSuch-v0,Nor-v0", cwd=tmp_path)
    assert _refused(proc).startswith("Config error: env.id='NoSuch-v0'")
    assert list(tmp_path.iterdir()) == []  # no multirun/rollout/<date>/<time>/


def test_a_given_run_directory_keeps_what_was_there(tmp_path):
    """A directory that existed before the run (hydra.run.dir=) stays, with what it held; only
    what Hydra wrote is removed."""
    given = tmp_path / "mine"
    given.mkdir()
    (given / "notes.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    for folder in (given, tmp_path / "empty"):
        proc = _script("rollout.py", "env.id=NoSuch-v0", f"hydra.run.dir={folder}", cwd=tmp_path)
        _refused(proc)
    assert sorted(p.name for p in given.iterdir()) == ["notes.txt"]
    assert list((tmp_path / "empty").iterdir()) == []


# ---------------------------------------------------------------------- the user's own config file

CORRIDOR = """\
defaults:
  - gym
  - _self_
id: my_envs:Corridor-v0
kwargs:
  length: 6
max_steps: 12
"""


def _own_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "configs_mine" / "env" / "corridor.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("typo", "line"),
    [
        pytest.param(
            ("max_steps: 12", "max_step: 12"),
            "Config error: configs_mine/env/corridor.yaml: max_step is not a config key "
            "(env.max_step): did you mean max_steps? (keys of env: id, kwargs, history_length, "
            "formatter, template, parser, max_steps, random_actions)",
            id="unknown-key",
        ),
        pytest.param(
            ("kwargs:", "kwarg:"),
            "Config error: configs_mine/env/corridor.yaml: kwarg is not a config key "
            "(env.kwarg): did you mean kwargs? (keys of env: ",
            id="unknown-group-key",
        ),
        pytest.param(
            ("max_steps: 12", "max_steps: twelve"),
            "Config error: configs_mine/env/corridor.yaml: env.max_steps: Value 'twelve' of type "
            "'str' could not be converted to Integer",
            id="wrong-type",
        ),
        pytest.param(
            ("length: 6", "length: [6"),
            "Config error: configs_mine/env/corridor.yaml, line 7, column 10: expected ',' or "
            "']', but got ':' (while parsing a flow sequence that starts at line 6, column 11): "
            "fix the YAML there",
            id="broken-yaml",
        ),
    ],
)
def test_a_mistake_in_the_users_env_yaml_is_one_line_naming_the_file(tmp_path, typo, line):
    _own_config(tmp_path, CORRIDOR.replace(*typo))
    proc = _script("rollout.py", "--config-dir", "configs_mine", "env=corridor", cwd=tmp_path)
    assert _refused(proc).startswith(line), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configs_mine"]


def test_the_suggested_key_fixes_the_file(tmp_path):
    path = _own_config(tmp_path, CORRIDOR.replace("max_steps:", "max_step:"))
    proc = _script("rollout.py", "--config-dir", "configs_mine", "env=corridor", cwd=tmp_path)
    suggested = _refused(proc).split("did you mean ", 1)[1].split("?", 1)[0]
    path.write_text(path.read_text().replace("max_step:", f"{suggested}:"))
    search = f"hydra.searchpath=[file://{tmp_path / 'configs_mine'}]"
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        job = load_job(compose(config_name="config", overrides=[search, "env=corridor"]))
    assert job.env.max_steps == 12


def test_the_file_is_named_wherever_the_config_dir_is(tmp_path):
    """``--config-dir=DIR`` (one argument) and a directory outside the working directory."""
    _own_config(tmp_path, CORRIDOR.replace("max_steps:", "max_step:"))
    here = tmp_path / "elsewhere"
    here.mkdir()
    proc = _script(
        "rollout.py", f"--config-dir={tmp_path / 'configs_mine'}", "env=corridor", cwd=here
    )
    expected = f"Config error: {tmp_path / 'configs_mine' / 'env' / 'corridor.yaml'}: max_step "
    assert _refused(proc).startswith(expected)


# ---------------------------------------------------------------------- what is removed, exactly


@pytest.fixture
def job_in(tmp_path):
    """``job_in(run_dir)``: Hydra's config for a job running in ``run_dir``, launched from
    ``tmp_path``, with what Hydra writes before the job (``.hydra/``, an empty log)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    saved = HydraConfig.instance().cfg

    def make(run_dir: Path) -> Path:
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
            cfg = compose(
                config_name="config",
                overrides=[f"hydra.run.dir={run_dir}"],
                return_hydra_config=True,
            )
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(run_dir)
            cfg.hydra.runtime.cwd = str(tmp_path)
            cfg.hydra.job.name = "rollout"
        HydraConfig.instance().set_config(cfg)
        (run_dir / ".hydra").mkdir(parents=True)
        for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
            (run_dir / ".hydra" / name).write_text("{}")
        (run_dir / "rollout.log").touch()
        return run_dir

    yield make
    HydraConfig.instance().cfg = saved


def test_hydras_files_and_the_empty_directories_above_go(tmp_path, job_in):
    (tmp_path / "outputs" / "rollout" / "2026-01-01" / "09-00-00").mkdir(parents=True)  # earlier
    run_dir = job_in(tmp_path / "outputs" / "rollout" / "2026-01-01" / "10-00-00")
    assert discard_run_dir() == [run_dir]  # the date's directory holds the earlier run
    (tmp_path / "outputs" / "rollout" / "2026-01-01" / "09-00-00").rmdir()
    run_dir = job_in(tmp_path / "outputs" / "rollout" / "2026-01-01" / "10-00-00")
    assert discard_run_dir() == [run_dir, *run_dir.parents[:3]]
    assert list(tmp_path.iterdir()) == []  # the launch directory itself stays


@pytest.mark.parametrize(
    "written",
    [
        pytest.param({"summary.json": "{}"}, id="another-runs-outputs"),
        pytest.param({"rollout.log": "[INFO] rollout started"}, id="a-log-with-lines"),
        pytest.param({".hydra/multirun.yaml": "{}"}, id="a-file-hydra-does-not-write"),
    ],
)
def test_a_run_directory_holding_more_is_left_as_it_is(tmp_path, job_in, written):
    run_dir = job_in(tmp_path / "outputs" / "rollout" / "2026-01-01" / "10-00-00")
    for name, text in written.items():
        (run_dir / name).write_text(text)
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    assert discard_run_dir() == []
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
