"""One job per distinct configuration in a context-length sweep.

``-m memory=none,window,full env.history_length=1,3,6`` is a cartesian product: Hydra launches
nine jobs, but ``memory=none`` and ``memory=full`` fix the history length (0 and -1) whatever
``env.history_length`` says — three identical jobs each. So before a sweep's job runs
anything, it claims its *effective* configuration in the sweep directory (:func:`job_key`: the
validated job with the window in effect in place of ``env.history_length``, and the memory config's
name, which labels its rows); a job whose configuration an earlier job of the sweep claimed returns
at once and says which job it repeats. A job that fails gives its claim back.

Example:
    >>> import tempfile
    >>> from agent_memory.config import JobConfig, MemoryConfig
    >>> def job(env_k, strategy):
    ...     j = JobConfig(memory=MemoryConfig(strategy=strategy))
    ...     j.env.history_length = env_k
    ...     return job_key(j, strategy)
    >>> job(1, "none") == job(3, "none"), job(1, "window") == job(3, "window")
    (True, False)
    >>> sweep = tempfile.mkdtemp()
    >>> with claim_job(sweep, job(1, "none"), "0_memory=none,env.history_length=1") as first:
    ...     first is None  # claimed: this job runs
    True
    >>> with claim_job(sweep, job(3, "none"), "1_memory=none,env.history_length=3") as first:
    ...     first  # the job this one repeats
    '0_memory=none,env.history_length=1'
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent_memory.config import JobConfig

__all__ = ["claim_job", "job_key"]

#: Where a sweep's claims live, under its directory (one file per effective configuration).
CLAIMS_DIR = ".claims"


def job_key(job: JobConfig, memory_choice: str) -> str:
    """A hash of what the job runs: equal keys, identical jobs (same episodes, same prompts).

    ``env.history_length`` enters only as the window in effect (``job.history_length``), so
    strategies that override it (``memory=none``, ``full``, ``token_budget``) get one key
    whatever it is; ``memory_choice`` (the config's name) keeps differently labelled rows apart.
    """
    config = dataclasses.asdict(job)
    config["env"]["history_length"] = job.history_length
    text = json.dumps([memory_choice, config], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@contextlib.contextmanager
def claim_job(sweep_dir: str | os.PathLike[str], key: str, job_name: str) -> Iterator[str | None]:
    """Claim ``key`` for ``job_name`` in the sweep; yields None when this job claimed it (and
    should run), or the name of the job that claimed it first (this one repeats it).

    The claim is one file linked into place (atomic, also across parallel launchers); it is
    removed again if the block raises, so a failed job does not hide its configuration.
    """
    claims = Path(sweep_dir) / CLAIMS_DIR
    claims.mkdir(parents=True, exist_ok=True)
    path = claims / key
    # Written aside, then linked into place: the claim appears atomically with its content.
    fd, tmp = tempfile.mkstemp(prefix=f".{key}-", dir=claims)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(job_name)
    try:
        os.link(tmp, path)
    except FileExistsError:
        taken = True
    else:
        taken = False
    finally:
        os.unlink(tmp)
    if taken:
        yield path.read_text(encoding="utf-8")
        return
    try:
        yield None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
