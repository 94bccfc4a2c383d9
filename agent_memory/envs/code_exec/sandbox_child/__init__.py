"""The processes inside a Code-env sandbox: a supervisor and the runner of user code.

They run in ``python -I -S`` (standard library only): :mod:`.boot` makes this directory alone
importable, as ``sandbox_child`` (``tasks.py`` never is), and starts the **supervisor**
(:mod:`.supervisor`), which owns the env's pipes, builds the sandbox, forks the **runner**
(:mod:`.runner`) and relays each answer after checking it; it never runs user code. The runner
hardens itself and runs the cells; it holds no descriptor of the env's pipes, so user code can at
worst replace the answer of its own run. Frames: a 4-byte big-endian length, then a UTF-8 JSON
object (:mod:`.protocol`). The parent imports these modules only for doctests.
"""
