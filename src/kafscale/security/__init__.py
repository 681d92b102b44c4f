"""Security: listeners and their protocols, TLS, SASL authentication, principals.

Pure parts (parsing, the SASL and SCRAM state machines, principal mapping) have no I/O;
the broker wires them into its connections (`kafscale.broker.server`, `broker/auth.py`).
Imports only `kafscale.errors` and `kafscale.metadata` (keys).
"""
