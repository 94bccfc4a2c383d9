"""What a process has used so far, read from ``/proc`` (Linux): peak memory and CPU time."""

from __future__ import annotations

import os


def vm_hwm_mib(pid: int) -> float:
    """The peak resident memory of process ``pid`` (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        # The fields after the command's name (which may hold spaces).
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[tuple[int, str], float]:
    """CPU seconds (user + system) each thread of process ``pid`` has used so far, by (thread
    id, name); threads that ended in between are left out."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:  # the thread ended
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[(int(tid), name)] = (int(fields[11]) + int(fields[12])) / tick
    return out
