"""A text env that fails on purpose, in every way an env can (registered as Faulty-v0).

Five steps of ``go`` to win. ``fault`` chooses what goes wrong, for episodes whose reset seed is
``bad_seed``, at step ``at_step``:

* ``"exit"``: ``os._exit(3)`` — the process ends, nothing can catch it;
* ``"segv"``: a real segmentation fault (reading address 0, as a broken C extension would);
* ``"sysexit"``: ``sys.exit(4)`` (a ``SystemExit``);
* ``"hang"``: the step sleeps for an hour;
* ``"nan"``: the step's reward is NaN;
* ``"reward_shape"``, ``"terminated_array"``, ``"terminated_text"``, ``"info_list"``: the step
  returns a reward of shape (3,), ``terminated=np.array([1, 1])``, ``terminated="no"``, or a
  list as its info (values Gymnasium's vector step cannot take, or misreads);
* ``"regex"``: the step runs a catastrophic regular expression (hours in C code, holding the GIL);
* ``"reset"``: ``reset`` raises (with any seed, for the first reset in each process only);
* ``"broken"``: ``reset`` always raises (every episode fails);
* ``"init"``: the constructor raises;
* ``"lock"``: the observation after the step carries ``[lock]``, on which the ``locked_db``
  memory strategy (registered here too) raises SQLite's "database is locked" when it stores it.

``log`` (a file path) gets one line per constructor call, so tests can count restarts.
``step_s``: every step sleeps this long (episodes that last, for a test to interrupt).
"""

from __future__ import annotations

import ctypes
import os
import re
import sqlite3
import string
import sys
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import register, registry

from agent_memory.memory import HistoryMemory, available_memories, register_memory

_RESETS_IN_PROCESS = [0]


class FaultyEnv(gym.Env):
    def __init__(
        self,
        fault: str = "none",
        bad_seed: int = 1,
        at_step: int = 2,
        log: str | None = None,
        step_s: float = 0.0,
    ) -> None:
        self.observation_space = spaces.Text(64, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(64, min_length=0, charset=string.printable)
        self.fault, self.bad_seed, self.at_step, self.step_s = fault, bad_seed, at_step, step_s
        if log is not None:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
        if fault == "init":
            raise ValueError(f"FaultyEnv cannot start: fault={fault!r} is set")
        self.t, self.bad = 0, False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        _RESETS_IN_PROCESS[0] += 1
        if (self.fault == "reset" and _RESETS_IN_PROCESS[0] == 1) or self.fault == "broken":
            raise RuntimeError("the simulator failed to load its level")
        self.t, self.bad = 0, seed == self.bad_seed
        return "t0", {"admissible_actions": ["go"], "won": False, "state_key": "s0"}

    def step(self, action):
        time.sleep(self.step_s)
        self.t += 1
        reward = 0.0
        if self.bad and self.t == self.at_step:
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "segv":  # a real one: read address 0, as a broken C extension does
                ctypes.string_at(0)
            if self.fault == "sysexit":
                sys.exit(4)
            if self.fault == "hang":
                time.sleep(3600)
            if self.fault == "nan":
                reward = float("nan")
            if self.fault == "regex":  # exponential backtracking: the GIL is never released
                re.match(r"(a+)+$", "a" * 64 + "b")
        done = self.t >= 5
        info = {"admissible_actions": ["go"], "won": done, "state_key": f"s{self.t}"}
        bad = self.bad and self.t == self.at_step
        lock = " [lock]" if bad and self.fault == "lock" else ""
        obs, reward = f"t{self.t}{lock}", reward + float(done)
        if bad and self.fault in BAD_VALUES:
            return BAD_VALUES[self.fault](obs, reward, done, info)
        return obs, reward, done, False, info


#: Faults whose step returns a value of the wrong type or shape: (obs, reward, done, info) ->
#: the step's return.
BAD_VALUES = {
    "reward_shape": lambda o, r, d, i: (o, np.full(3, r), d, False, i),
    "terminated_array": lambda o, r, d, i: (o, r, np.array([1, 1]), False, i),
    "terminated_text": lambda o, r, d, i: (o, r, "no", False, i),
    "info_list": lambda o, r, d, i: (o, r, d, False, [i]),
}


class LockedDB(HistoryMemory):
    """The window memory, with a store that fails as a database held locked past its retries."""

    def store(self, record, env_ids=None):
        if any("[lock]" in str(o) for o in record.get("observation", [])):
            raise sqlite3.OperationalError("database is locked")
        super().store(record, env_ids)


if "Faulty-v0" not in registry:
    register("Faulty-v0", entry_point=FaultyEnv, max_episode_steps=20)
if "locked_db" not in available_memories():
    register_memory("locked_db")(LockedDB)
