"""The processes inside a Code-env sandbox: a supervisor and the runner of user code.

These modules run in ``python -I -S`` processes started by
:class:`agent_memory.envs.code_exec.sandbox.Sandbox`
(standard library only, nothing of the project on ``sys.path``): :mod:`.boot` registers this
directory as the package ``sandbox_child`` (only this directory: the rest of
``agent_memory/envs/code_exec``,
``tasks.py`` included, is never importable from inside) and starts :mod:`.supervisor`. The parent
only imports them for doctests.

Two processes per sandbox:

* the **supervisor** (:mod:`.supervisor`) owns the pipes to the env; it reads the modules to
  preload, builds the private file-system view (:mod:`.isolation`), forks the runner, then drops
  every privilege and installs seccomp itself; it never runs user code. It relays each ``exec`` to
  the runner with a sequence number and forwards the runner's answer only after checking it
  (bounded size, types, the sequence number), rebuilt from scratch;
* the **runner** (:mod:`.runner`) hardens itself (rlimits, privileges, Landlock, seccomp, audit
  hook) and runs the code cells in one persistent namespace. It holds no descriptor of the env's
  pipes: whatever user code writes on its own channel can at worst replace the answer of the run it
  is part of, never reach the env or shift later answers.

Frames on every pipe: a 4-byte big-endian length and a UTF-8 JSON object (:mod:`.protocol`).
"""
