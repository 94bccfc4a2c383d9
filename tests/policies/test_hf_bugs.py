"""A model path that is not there names the key the user set (``policy.params.path`` for the
``hf`` and ``score`` policies), not the constructor's other arguments ``model`` / ``tokenizer``
(issue "A newcomer runs their own env in five minutes", bug 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_memory.policies.local_model import resolve_model

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"

MISSING = (
    "path must be a directory saved by save_pretrained() (config.json, weights, "
    "tokenizer_config.json) or the id of a hub repo already in the local Hugging Face cache, "
    "got '/nonexistent' (not a directory, not a cached hub id); nothing is downloaded"
)


def test_resolve_model_names_the_argument():
    with pytest.raises(FileNotFoundError, match=re.escape(MISSING)):
        resolve_model("/nonexistent")
    with pytest.raises(FileNotFoundError, match=re.escape(MISSING.replace("path", "model_dir"))):
        resolve_model("/nonexistent", key="model_dir")


def test_resolve_model_names_the_missing_file(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(
            "path must be a directory saved by save_pretrained() (config.json, weights, "
            f"tokenizer_config.json), got {str(tmp_path)!r} (no config.json in it); nothing is "
            "downloaded"
        ),
    ):
        resolve_model(tmp_path)


def test_resolve_tokenizer_names_the_tokenizer_argument(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(
            "tokenizer must be a directory with tokenizer.json or tokenizer_config.json or the id "
            "of a hub repo already in the local Hugging Face cache, got 'no-org/not-cached' (not "
            "a directory, not a cached hub id); nothing is downloaded"
        ),
    ):
        resolve_model("no-org/not-cached", need="tokenizer")
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(
            "tokenizer must be a directory with tokenizer.json or tokenizer_config.json, got "
            f"{str(tmp_path)!r} (neither file in it); nothing is downloaded"
        ),
    ):
        resolve_model(tmp_path, need="tokenizer")


def test_hf_policy_names_path():
    pytest.importorskip("transformers")
    from agent_memory.policies.hf import HFPolicy

    with pytest.raises(FileNotFoundError, match=re.escape(MISSING)):
        HFPolicy("/nonexistent")


@pytest.mark.parametrize("policy", ["hf", "score"])
def test_preflight_tells_to_change_policy_params_path(policy):
    """What ``python scripts/rollout.py policy=hf policy.params.path=/nonexistent`` prints."""
    pytest.importorskip("transformers")
    from hydra import compose, initialize_config_dir

    from agent_memory.config import ConfigError, load_job, register_configs
    from agent_memory.rollout.driver.preflight import preflight

    register_configs()
    overrides = [f"policy={policy}", "policy.params.path=/nonexistent"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        job = load_job(compose(config_name="config", overrides=overrides))
    with pytest.raises(ConfigError) as e:
        preflight(job, probe=False)
    assert str(e.value) == (
        f"policy={policy} cannot be built: FileNotFoundError: {MISSING}: change policy.params.path"
    )
    assert e.value.key == "policy.params.path"
