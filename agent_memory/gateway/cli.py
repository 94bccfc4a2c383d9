"""The gateway's command line (``python -m agent_memory.gateway --help``).

Example:
    >>> parser = build_parser()
    >>> args = parser.parse_args(["export", "runs/gw", "runs/rows"])
    >>> args.command, args.algo
    ('export', 'grpo')
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from agent_memory.gateway.settings import GatewaySettings

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``serve`` and ``export`` commands and their flags."""
    parser = argparse.ArgumentParser(
        prog="python -m agent_memory.gateway",
        description="A token-capturing OpenAI-compatible gateway: serve, or export sessions.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the gateway (the default command)")
    defaults = GatewaySettings("http://127.0.0.1:8000/v1", ".")
    serve.add_argument("--upstream", required=True, help="the upstream's base URL (vLLM's /v1)")
    serve.add_argument("--dir", required=True, help="the session directory")
    serve.add_argument("--host", default=defaults.host, help="listen address (loopback)")
    serve.add_argument("--port", type=int, default=defaults.port, help="0: any free port")
    serve.add_argument("--token", default=None, help="bearer token (needed beyond loopback)")
    serve.add_argument("--max-sessions", type=int, default=defaults.max_sessions)
    serve.add_argument("--max-in-flight", type=int, default=defaults.max_in_flight)
    serve.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    serve.add_argument("--upstream-timeout-s", type=float, default=defaults.upstream_timeout_s)
    serve.add_argument("--no-fsync", action="store_true", help="flush lines without fsync")
    serve.add_argument(
        "--tokenizer", default=None, help="the served model's tokenizer: ids checked against text"
    )
    export = commands.add_parser("export", help="write a session directory's rows")
    export.add_argument("session_dir")
    export.add_argument("out_dir")
    export.add_argument("--algo", default="grpo", choices=("grpo", "gigpo"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (``serve`` when the first argument is a flag)."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if not args_in or (args_in[0].startswith("-") and args_in[0] not in ("-h", "--help")):
        args_in.insert(0, "serve")
    args = build_parser().parse_args(args_in)
    if args.command == "export":
        from agent_memory.gateway.export import export_sessions

        try:
            summary = export_sessions(args.session_dir, args.out_dir, args.algo)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        keys = ("sessions", "open_sessions", "segments", "declared_rewrites", "undeclared_breaks")
        print(json.dumps({k: summary[k] for k in keys}))
        return 0
    try:
        settings = GatewaySettings(
            args.upstream,
            args.dir,
            host=args.host,
            port=args.port,
            token=args.token,
            max_sessions=args.max_sessions,
            max_in_flight=args.max_in_flight,
            max_body_bytes=args.max_body_bytes,
            upstream_timeout_s=args.upstream_timeout_s,
            fsync=not args.no_fsync,
            tokenizer=args.tokenizer,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(settings))
    except KeyboardInterrupt:
        return 130
    return 0


async def _serve(settings: GatewaySettings) -> None:
    from agent_memory.gateway.app import Gateway

    gateway = Gateway(settings)
    await gateway.start()
    store = gateway.store
    print(
        f"gateway listening on {gateway.base_url} (upstream {settings.upstream}; "
        f"{len(store.sessions)} sessions in {settings.session_dir}, {store.torn_lines} torn "
        "lines skipped)",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await gateway.close()
