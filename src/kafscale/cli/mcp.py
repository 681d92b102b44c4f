"""`kafscale mcp`: serve the cluster's MCP tools (kafscale/console/mcp_server.py) over stdio
or streamable HTTP."""

from __future__ import annotations

import logging
import os
import sys

from kafscale.cli.common import run_command
from kafscale.cli.console import add_metrics_options, cluster, hostport, metrics_reader
from kafscale.client import CliError, add_connection_options


def _token(args) -> str:
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            return f.read().strip()
    return os.environ.get("KAFSCALE_MCP_TOKEN", "").strip()


def mcp(args) -> int:
    from kafscale.console.mcp_server import BearerToken, make_server

    # stdout is the protocol on stdio: logs go to stderr only.
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = _token(args)
    if args.transport == "http" and args.allow_writes and not token:
        raise CliError("--allow-writes over HTTP needs a bearer token: --token-file FILE or the KAFSCALE_MCP_TOKEN variable", 2)
    server = make_server(cluster(args), metrics_reader(args), args.allow_writes)
    if args.transport == "stdio":
        server.run("stdio")
        return 0
    import uvicorn

    host, port = hostport(args.listen)
    app = server.streamable_http_app(host=host)
    if token:
        app = BearerToken(app, token)
    print(f"KafScale MCP server on http://{host}:{port}/mcp for {args.bootstrap}"
          + (" (writes allowed)" if args.allow_writes else " (read-only)") + (" (bearer token required)" if token else ""), file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
    return 0


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("mcp", help="MCP server for agents: cluster status, topics, records, groups and lag, broker metrics",
                              description="Serve MCP tools over stdio (default) or streamable HTTP; read-only unless --allow-writes.")
    add_connection_options(p.add_argument_group("connection"))
    s = p.add_argument_group("MCP")
    s.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="stdio (launched by the client) or http (streamable HTTP at /mcp)")
    s.add_argument("--listen", default="127.0.0.1:8090", help="HOST:PORT for --transport http (default 127.0.0.1:8090)")
    s.add_argument("--allow-writes", action="store_true",
                   help="also the tools that change the cluster (create/delete topic, produce, reset offsets, delete group); over HTTP only with a bearer token")
    s.add_argument("--token-file", metavar="FILE", help="bearer token every HTTP request must carry (default: the KAFSCALE_MCP_TOKEN variable)")
    s.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"], help="log level on stderr (default warning)")
    add_metrics_options(p)
    p.set_defaults(func=run_command(mcp))
