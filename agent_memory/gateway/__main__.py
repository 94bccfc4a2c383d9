"""``python -m agent_memory.gateway``: start the gateway (``serve``, the default), or write a
session directory's rows (``export``)::

    python -m agent_memory.gateway --upstream http://127.0.0.1:8000/v1 --dir runs/gw
    python -m agent_memory.gateway export runs/gw runs/gw-rows --algo grpo

Point the agent at ``http://127.0.0.1:8100/s/<session>/v1`` (its OpenAI ``base_url``).
"""

from __future__ import annotations

from agent_memory.gateway.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
