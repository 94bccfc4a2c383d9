"""An OpenEnv server that misbehaves on request, for tests of ``env=openenv`` (run as
``python -m tests.envs.openenv_unruly PORT``).

Its reset ignores ``seed`` (each reset draws a fresh number, as two of OpenEnv's catalogue envs
do); its step echoes the message, except ``"slow"`` (answers after 5 s) and ``"boom"`` (raises).
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

_DRAWS = itertools.count(1)


class Message(Action):
    message: str = Field(...)


class Echo(Observation):
    text: str = Field(default="")


class Unruly(Environment[Message, Echo, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="e")

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Echo:
        return Echo(text=f"draw {next(_DRAWS)}")  # the seed is ignored

    def step(self, action: Message, timeout_s: float | None = None, **kw: Any) -> Echo:
        if action.message == "slow":
            time.sleep(5)
        if action.message == "boom":
            raise RuntimeError("the env broke")
        self._state.step_count += 1
        return Echo(text=action.message, reward=1.0, done=action.message == "stop")

    @property
    def state(self) -> State:
        return self._state


if __name__ == "__main__":
    import uvicorn

    app = create_app(Unruly, Message, Echo, max_concurrent_envs=8)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
