"""Ray's processes never outlive the run that started them, also when its driver is SIGKILLed.

The raylet's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) outlive the driver, so a
local instance starts with a *reaper* (:mod:`.reap`, its own session) reading a pipe from the
driver: it notes the processes carrying the run's environment marker, and when the pipe closes
(:meth:`Reaper.release`, or the driver's death) ends them and removes the private directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["MARKER", "Reaper"]

#: The environment variable whose value (the instance's directory) marks its processes.
MARKER = "AGENT_MEMORY_RAY_RUN"

#: The reaper's program (:mod:`.reap`): a module of the standard library only, run by its path
#: under ``python -I -S`` (milliseconds and a few MB, none of the package's imports).
_PROGRAM = str(Path(__file__).with_name("reap.py"))


class Reaper:
    """The reaper of the processes marked with ``root`` (see the module); Linux only.

    Args:
        root: the instance's private directory (removed when the reaper ends).

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> r = Reaper(root)
        >>> r.noted()  # the instance started: note its processes now
        >>> r.release()
        0
        >>> os.path.exists(root)
        False
    """

    def __init__(self, root: str) -> None:
        self.root = root
        read, self._pipe = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _PROGRAM, MARKER, root],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read)

    def noted(self) -> None:
        """Have the reaper note the instance's processes now (rather than at its next look)."""
        os.write(self._pipe, b"n")

    def release(self, timeout: float = 30.0) -> int | None:
        """End what is left of the instance, remove its directory; the reaper's exit status."""
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:  # it goes on alone; nothing waits for it
            return None
