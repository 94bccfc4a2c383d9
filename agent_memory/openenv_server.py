"""Serve a bundled env, wrapped in a memory strategy, as an OpenEnv server.

    python -m agent_memory.openenv_server --port 8000 env=recall memory=window
    python -m agent_memory.openenv_server --port 8001 env=sokoban memory=full

The arguments after the options are the rollout's Hydra overrides (``configs/``): the env, its
prompt template and parser, the memory strategy. Each OpenEnv session (WebSocket ``/ws``, as
OpenEnv's ``EnvClient`` opens it) plays one env through the same
:class:`~agent_memory.rollout.bank.EnvBank` a rollout worker uses, so what a client sees is what a
rollout's policy sees:

- **action** (:class:`TextAction`): ``message``, the model's whole response (the env's parser
  reads the action out of it: ``<action>...</action>``; ``env.parser.tag=null`` passes it whole);
- **observation** (:class:`MemoryObservation`): ``prompt``, the prompt with the memory's history
  (``messages`` holds a chat prompt); ``observation``, the env's own text; the text contract's
  ``task``, ``admissible_actions``, ``won``, ``state_key``, ``is_action_valid``,
  ``invalid_reason``; ``truncated`` (OpenEnv's ``done`` covers both endings); the ``seed`` played;
  ``memory_turn`` when the next message answers the memory's turn rather than the env; ``error``
  when the env or its memory failed (the episode ends);
- **reward**: the env's, with the parser's invalid-action penalty, as a rollout records it;
- **seed**: ``reset(seed=s)`` plays the episode a rollout plays with seed ``s`` (same seed, same
  episode); without a seed one is drawn, and the observation's ``seed`` names it.

The server passes ``openenv validate --url <server>`` (OpenEnv's runtime conformance check).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
    from pydantic import Field
except ModuleNotFoundError as e:  # the base install: name the extra, not a missing module
    raise ModuleNotFoundError(
        "agent_memory.openenv_server needs openenv-core (openenv is not installed): "
        'pip install -e ".[openenv]"',
        name=e.name,
    ) from None

from agent_memory.cli import report_config_errors
from agent_memory.config import JobConfig, load_job, register_configs
from agent_memory.rollout.bank import EnvBank, PromptView, StepResult
from agent_memory.rollout.messages import EpisodeAssignment

__all__ = [
    "MemoryEnvironment",
    "MemoryObservation",
    "TextAction",
    "compose_job",
    "main",
    "make_app",
]

#: The repository's configs (a source checkout); ``--config-dir`` names another.
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
_META_FIELDS = ("admissible_actions", "task")


class TextAction(Action):
    """The model's whole response; the env's parser reads the action out of it."""

    message: str = Field(..., description="The model's response (e.g. '<action>next</action>')")


class MemoryObservation(Observation):
    """What the policy answers next: the prompt with history, and the env's step as text."""

    prompt: str = Field(default="", description="The prompt with the memory's history")
    messages: list[dict[str, str]] | None = Field(
        default=None, description="The prompt as chat messages (a chat formatter), else null"
    )
    observation: str = Field(default="", description="The env's own observation text")
    task: str | None = Field(default=None, description="The task as the prompt states it")
    admissible_actions: list[str] | None = Field(
        default=None, description="The actions the env accepts now (null: open-ended)"
    )
    won: bool = Field(default=False, description="The episode was won")
    truncated: bool = Field(default=False, description="done by a step limit or an error")
    is_action_valid: bool | None = Field(
        default=None, description="The parser and env took the action (null after a reset)"
    )
    invalid_reason: str | None = Field(default=None, description="Why the action was refused")
    state_key: str | None = Field(default=None, description="A hash of the env's true state")
    history_steps: int = Field(default=0, description="Past steps the prompt shows")
    context_tokens: int = Field(default=0, description="The prompt's tokens")
    seed: int | None = Field(default=None, description="The seed this episode was reset with")
    memory_turn: bool = Field(
        default=False, description="The next message answers the memory's turn, not the env"
    )
    error: str | None = Field(
        default=None, description="The env or memory failed: the episode ends"
    )


class MemoryState(State):
    """The session's episode: its id, steps so far, seed and env."""

    seed: int | None = Field(default=None, description="The seed of the current episode")
    env_id: str = Field(default="", description="The Gymnasium id served")


class MemoryEnvironment(Environment[TextAction, MemoryObservation, MemoryState]):
    """One OpenEnv session: one env of ``job`` in an :class:`EnvBank` of one, built at the first
    reset (OpenEnv makes an instance for every HTTP ``/state`` or ``/metadata`` call too).

    Example:
        >>> from agent_memory.config import EnvConfig, JobConfig
        >>> env = MemoryEnvironment(JobConfig(env=EnvConfig(id="agent_memory/Recall-v0")))
        >>> first = env.reset(seed=3)
        >>> first.observation.startswith("Remember this:"), first.admissible_actions
        (True, ['next'])
        >>> after = env.step(TextAction(message="<action>next</action>"))
        >>> after.history_steps, after.done, env.state.step_count
        (1, False, 1)
        >>> env.close()
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, job: JobConfig) -> None:
        super().__init__()
        self.job = job
        self._bank: EnvBank | None = None
        self._state = MemoryState(env_id=job.env.id)
        self._turn = False
        self._live = False

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> MemoryObservation:
        """Start an episode: ``seed`` as a rollout plays it (one is drawn when None)."""
        if self._bank is None:
            self._bank = EnvBank(self.job, num_envs=1, meta_fields=_META_FIELDS, name="session")
        if seed is None:
            seed = random.SystemRandom().randrange(2**31)
        episode = episode_id or uuid.uuid4().hex
        self._state = MemoryState(episode_id=episode, seed=seed, env_id=self.job.env.id)
        (start,) = self._bank.reset_envs([EpisodeAssignment(0, episode, episode, seed)])
        self._turn = False
        self._live = start.view is not None
        if start.view is None:
            return MemoryObservation(done=True, truncated=True, error=start.error, seed=seed)
        return self._observe(start.view, seed, state_key=self._bank.state_keys[0])

    def step(
        self, action: TextAction, timeout_s: float | None = None, **kwargs: Any
    ) -> MemoryObservation:
        """Answer the prompt (the env's step, or the memory's turn when one was asked)."""
        if self._bank is None or not self._live:
            return MemoryObservation(
                done=True,
                truncated=True,
                is_action_valid=False,
                error="no running episode: reset first (an episode that is done needs a reset)",
            )
        turns = (0,) if self._turn else ()
        (result,) = self._bank.step({0: action.message}, turns=turns)
        self._state.step_count += 0 if self._turn else 1
        self._live = not result.done
        return self._stepped(result)

    @property
    def state(self) -> MemoryState:
        """The current episode's id, steps, seed and env."""
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        """The env and memory served."""
        memory = self.job.memory.strategy
        return EnvironmentMetadata(
            name=f"{self.job.env.id} with memory={memory}",
            description=(
                f"agent_memory serves {self.job.env.id}: each observation's prompt holds the "
                f"history of the {memory} memory strategy (history_length="
                f"{self.job.env.history_length}); the action is the model's whole response."
            ),
            version=_version(),
        )

    def close(self) -> None:
        """Close the session's env and memory."""
        if self._bank is not None:
            self._bank.close()
            self._bank = None

    def _stepped(self, result: StepResult) -> MemoryObservation:
        assert self._bank is not None
        self._turn = result.memory_turn is not None
        view = result.memory_turn or result.next
        obs = self._observe(view, self._state.seed, state_key=self._bank.state_keys[0])
        obs.reward = result.reward
        obs.done = result.done
        obs.truncated = result.done and not result.terminated
        obs.won = result.won
        obs.is_action_valid = result.is_action_valid
        obs.invalid_reason = result.invalid_reason
        obs.error = result.error
        obs.memory_turn = self._turn
        return obs

    def _observe(
        self, view: PromptView, seed: int | None, state_key: str | None
    ) -> MemoryObservation:
        chat = not isinstance(view.prompt, str)
        actions = view.meta.get("admissible_actions")
        return MemoryObservation(
            prompt=json.dumps(view.prompt) if chat else str(view.prompt),
            messages=list(view.prompt) if chat else None,
            observation=view.observation or "",
            task=view.meta.get("task"),
            admissible_actions=None if actions is None else [str(a) for a in actions],
            state_key=state_key,
            history_steps=view.history_steps,
            context_tokens=view.context_tokens,
            seed=seed,
        )


def compose_job(overrides: Sequence[str], config_dir: Path = CONFIG_DIR) -> JobConfig:
    """The rollout job that ``overrides`` compose from ``config_dir`` (as ``scripts/rollout.py``
    composes it), with a synchronous vector env (one env per session, in the server's process).

    Example:
        >>> job = compose_job(["env=recall", "memory=full"])
        >>> job.env.id, job.memory.strategy, job.rollout.vectorization
        ('agent_memory/Recall-v0', 'full', 'sync')
    """
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        job = load_job(compose(config_name="config", overrides=list(overrides)))
    return dataclasses.replace(job, rollout=dataclasses.replace(job.rollout, vectorization="sync"))


def make_app(job: JobConfig, max_sessions: int = 64) -> Any:
    """OpenEnv's FastAPI app (``create_app``) serving ``job``'s env, up to ``max_sessions``
    WebSocket sessions at once."""
    return create_app(
        lambda: MemoryEnvironment(job),
        TextAction,
        MemoryObservation,
        env_name=job.env.id,
        max_concurrent_envs=max_sessions,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m agent_memory.openenv_server [--host H] [--port P] [overrides...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m agent_memory.openenv_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=64, help="WebSocket sessions at once")
    parser.add_argument("--config-dir", type=Path, default=CONFIG_DIR, help="the Hydra configs")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. env=recall memory=full")
    args = parser.parse_args(argv)
    config_dir = args.config_dir.resolve()
    job = report_config_errors(lambda: compose_job(args.overrides, config_dir), [str(config_dir)])
    import uvicorn

    app = make_app(job, args.max_sessions)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agent-memory")
    except PackageNotFoundError:
        return "0"


if __name__ == "__main__":
    main()
