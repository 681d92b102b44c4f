"""Security commands: `kafscale certs generate DIR` (self-signed CA, server and client
certificates for trying TLS out) and `kafscale users add NAME --mechanism SCRAM-SHA-512
--password-file F` (SCRAM credentials, through AlterUserScramCredentials on a broker)."""

from __future__ import annotations

import argparse
import sys


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
    add_user_commands(sub)



def _client_settings(pairs: list[str]) -> dict[str, str]:
    out = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"-X expects KEY=VALUE, not {item!r}")
        out[key.strip()] = value
    return out


def _users_add(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    from kafscale.security import scram

    mechanism = args.mechanism.upper()
    if mechanism not in scram.MECHANISMS:
        print(f"unsupported mechanism {args.mechanism} (SCRAM-SHA-256 or SCRAM-SHA-512)", file=sys.stderr)
        return 2
    with open(args.password_file, encoding="utf-8") as f:
        password = f.read().rstrip("\r\n")
    if not password:
        print(f"{args.password_file} is empty", file=sys.stderr)
        return 2
    mech = ScramMechanism.SCRAM_SHA_256 if mechanism == "SCRAM-SHA-256" else ScramMechanism.SCRAM_SHA_512
    admin = AdminClient({"bootstrap.servers": args.bootstrap, **_client_settings(args.X)})
    # The client salts and hashes the password (AlterUserScramCredentials carries the
    # salted password, never the password itself).
    futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(args.name, ScramCredentialInfo(mech, args.iterations), password.encode())])
    try:
        futures[args.name].result(30)
    except Exception as e:  # noqa: BLE001 - the broker's error, shown to the operator
        print(f"could not set {mechanism} credentials of {args.name}: {e}", file=sys.stderr)
        return 1
    print(f"{mechanism} credentials of {args.name} set ({args.iterations} iterations)")
    return 0


def _users_delete(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AdminClient, ScramMechanism, UserScramCredentialDeletion

    mech = ScramMechanism.SCRAM_SHA_256 if args.mechanism.upper() == "SCRAM-SHA-256" else ScramMechanism.SCRAM_SHA_512
    admin = AdminClient({"bootstrap.servers": args.bootstrap, **_client_settings(args.X)})
    try:
        admin.alter_user_scram_credentials([UserScramCredentialDeletion(args.name, mech)])[args.name].result(30)
    except Exception as e:  # noqa: BLE001
        print(f"could not delete credentials of {args.name}: {e}", file=sys.stderr)
        return 1
    print(f"{args.mechanism.upper()} credentials of {args.name} deleted")
    return 0


def add_user_commands(sub) -> None:
    users = sub.add_parser("users", help="SCRAM users (AlterUserScramCredentials on a broker)")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    for name, func, help_text in (("add", _users_add, "create or change a user's SCRAM credentials"), ("delete", _users_delete, "delete a user's SCRAM credentials")):
        cmd = users_sub.add_parser(name, help=help_text)
        cmd.add_argument("name")
        cmd.add_argument("--mechanism", default="SCRAM-SHA-512", help="SCRAM-SHA-256 or SCRAM-SHA-512")
        if name == "add":
            cmd.add_argument("--password-file", required=True, help="file holding the password (one line)")
            cmd.add_argument("--iterations", type=int, default=8192, help="PBKDF2 iterations (4096-16384)")
        cmd.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a broker")
        cmd.add_argument("-X", action="append", default=[], metavar="KEY=VALUE",
                         help="client setting, e.g. -X security.protocol=SASL_SSL -X sasl.mechanism=SCRAM-SHA-512")
        cmd.set_defaults(func=func)
