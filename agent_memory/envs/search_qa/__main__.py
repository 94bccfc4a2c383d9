"""``python -m agent_memory.envs.search_qa --seed 0 --out corpus.json``: dump a generated corpus as
JSON."""

from __future__ import annotations

from agent_memory.envs.search_qa.corpus import main

if __name__ == "__main__":
    main()
