"""``env_values`` reads only the requested envs' entries of a vector info, with numpy scalars made
Python ones and absent entries (their ``_key`` False) given the default."""

from __future__ import annotations

import numpy as np

from agent_memory.wrappers.vector_env import env_values, infos_at


def _objects(*values):
    arr = np.empty(len(values), dtype=object)
    for j, v in enumerate(values):
        arr[j] = v
    return arr


def test_plain_and_object_arrays_with_their_masks():
    info = {
        "won": np.array([True, False, True]),
        "_won": np.array([True, False, True]),
        "reason": _objects(None, np.str_("bad"), ["a", "b"]),
        "_reason": np.array([False, True, True]),
        "score": np.array([1.5, 2.5, 3.5], dtype=np.float32),
    }
    assert env_values(info, "won", [2, 1, 0], "n/a") == [True, "n/a", True]
    got = env_values(info, "reason", [1, 2, 0], "n/a")
    assert got == ["bad", ["a", "b"], "n/a"] and type(got[0]) is str
    assert (
        env_values(info, "score", [2]) == [3.5] and type(env_values(info, "score", [0])[0]) is float
    )
    assert env_values(info, "missing", [0, 1], 0) == [0, 0]
    assert env_values(info, "won", []) == []


def test_non_array_values_are_read_only_where_present():
    # A dict info (Gymnasium nests dict values) is indexed only at the envs that have the key.
    info = {"nested": {2: "x"}, "_nested": np.array([False, False, True])}
    assert env_values(info, "nested", [0, 2], None) == [None, "x"]


def test_infos_at_gives_the_wanted_keys_of_each_env():
    info = {
        "task": _objects("t0", None, "t2"),
        "_task": np.array([True, False, True]),
        "admissible_actions": _objects(["go"], ["go", "stop"], None),
        "_admissible_actions": np.array([True, True, False]),
        "other": np.array([1, 2, 3]),
        "_other": np.array([True, True, True]),
    }
    assert infos_at(info, [2, 1]) == [{"task": "t2"}, {"admissible_actions": ["go", "stop"]}]
