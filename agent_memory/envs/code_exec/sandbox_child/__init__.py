"""The processes inside a Code-env sandbox: a supervisor and the runner of user code.

They run in ``python -I -S`` (standard library only; :mod:`.boot` makes this directory alone
importable). The **supervisor** (:mod:`.supervisor`) owns the env's pipes, builds the sandbox,
forks the **runner** (:mod:`.runner`) and relays each answer after checking it; the runner holds
no descriptor of the env's pipes, and one whose run leaves threads running is replaced. User code
can still shape later answers through what it leaves in the process (a patched ``print``, say).
"""
