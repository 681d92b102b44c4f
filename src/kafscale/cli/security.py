"""Security commands: `kafscale certs generate DIR` (self-signed CA, server and client
certificates for trying TLS out) and `kafscale users add NAME --mechanism SCRAM-SHA-512
--password-file F` (SCRAM credentials, through AlterUserScramCredentials on a broker)."""

from __future__ import annotations

import argparse


def _certs_generate(args: argparse.Namespace) -> int:
    from kafscale.security.certs import write_self_signed

    hosts = tuple(h for h in ",".join(args.host).split(",") if h) or ("localhost", "127.0.0.1")
    clients = tuple(c for c in ",".join(args.client).split(",") if c)
    paths = write_self_signed(args.directory, hosts, clients)
    for name, path in paths.items():
        print(f"{name}: {path}")
    print(f"broker: --ssl-cert {paths['cert']} --ssl-key {paths['key']} --ssl-ca {paths['ca']}")
    return 0


def add_commands(sub) -> None:
    certs = sub.add_parser("certs", help="self-signed TLS certificates for trying TLS out")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True)
    gen = certs_sub.add_parser("generate", help="write ca.pem, server.pem/.key and client certificates into DIR")
    gen.add_argument("directory")
    gen.add_argument("--host", action="append", default=[], help="DNS name or IP of the broker (repeatable or comma separated; default localhost,127.0.0.1)")
    gen.add_argument("--client", action="append", default=[], help="also a client certificate with this CN (repeatable)")
    gen.set_defaults(func=_certs_generate)

