"""A token-capturing OpenAI-compatible gateway: any agent program's chat calls through it
become exact rows (docs/gateway.md).

Modules: :mod:`~agent_memory.gateway.app` (the server and its routes),
:mod:`~agent_memory.gateway.calls` (one call: the upstream request, the sampled tokens, the
agent's answer), :mod:`~agent_memory.gateway.records` (durable session files),
:mod:`~agent_memory.gateway.export` (sessions to rows), :mod:`~agent_memory.gateway.http_server`
(HTTP/1.1 server side), :mod:`~agent_memory.gateway.settings`, :mod:`~agent_memory.gateway.cli`.
"""

from __future__ import annotations

from agent_memory.gateway.export import export_sessions
from agent_memory.gateway.settings import GatewaySettings

__all__ = ["GatewaySettings", "export_sessions"]
