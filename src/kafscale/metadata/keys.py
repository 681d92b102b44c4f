"""Every metadata key, built and parsed in one place.

Layout, relative to the backend's prefix (`/kafscale` on etcd):

    /topics/{topic}                           TopicMeta
    /partitions/{topic}/{p}                   PartitionState
    /segments/{topic}/{p}/{base:020d}         SegmentInfo
    /consumer-groups/{group}                  group state (owned by the coordinator)
    /committed-offsets/{group}/{topic}/{p}    CommittedOffset
    /producer-ids                             next free producer id block
    /brokers/{id}                             live broker registration (etcd lease)
    /owners/{topic}/{p}                       current owner and leader epoch (owner's lease)
    /scram-credentials/{user}/{mechanism}     salted SCRAM credential (security/scram.py)
    /acls/{type}/{pattern}/{name}/{principal}/{host}/{operation}/{permission}
                                              one ACL binding (security/acl.py; numbers are the protocol's)
    /transactions/{transactional id}          transaction state (owned by its coordinator)
    /pending-offsets/{group}/{producer id}/{topic}/{p}
                                              TxnOffsetCommit offsets until the transaction ends
    /client-quotas/{entity}                   a client quota entity and its values; {entity} is
                                              type=name pairs joined by "," (name empty: default)
    /group-configs/{group}                    a group's config overrides (GROUP config resources,
                                              metadata/group_config.py); kept apart from the
                                              group's state: a config may exist before its group

Every name in a key goes through `escape`: each UTF-8 byte outside [A-Za-z0-9._-] becomes
%XX (so an escaped name never holds "/", and "%" itself is escaped), and a name made only
of dots is escaped whole. Escaping is reversible, hence injective, and no escaped name
contains "/", so a name's key or prefix never covers another name's keys (group `orders`
vs `orders/eu`) and no key has path-like `.`/`..` parts. Kafka topic names
([a-zA-Z0-9._-], not "." or "..") escape to themselves, so topic keys are what they were
before escaping existed.

Group ids may be any string, so the old `/groups/{group}` and `/offsets/{group}/{t}/{p}`
keys (raw group id) are ambiguous; the group keys moved to new roots and
`MetadataStore.migrate_legacy_keys` moves old keys over. The LEGACY_* parsers below read
that old layout (unambiguously: topic names never contain "/").
"""

from __future__ import annotations

import re

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_PLAIN = re.compile("[A-Za-z0-9._-]+")  # names of _SAFE characters only
_HEX = "0123456789ABCDEF"

TOPICS = "/topics/"
PARTITIONS = "/partitions/"
SEGMENTS = "/segments/"
GROUPS = "/consumer-groups/"
OFFSETS = "/committed-offsets/"
PRODUCER_IDS = "/producer-ids"
BROKERS = "/brokers/"
OWNERS = "/owners/"
TRANSACTIONS = "/transactions/"
PENDING_OFFSETS = "/pending-offsets/"
CLIENT_QUOTAS = "/client-quotas/"
SCRAM_CREDENTIALS = "/scram-credentials/"
ACLS = "/acls/"
SHARE_STATES = "/share-states/"
GROUP_CONFIGS = "/group-configs/"

# The layout before names were escaped (raw group ids); read only by the migration.
LEGACY_GROUPS = "/groups/"
LEGACY_OFFSETS = "/offsets/"


class MalformedKey(ValueError):
    """A key under one of our roots that this layout cannot have produced."""


def escape(name: str) -> str:
    """One key component for `name`: never contains "/", reversible by `unescape`."""
    if _PLAIN.fullmatch(name) and name.strip("."):
        # Itself (nearly every name): no per-byte join, which was 2-3% of a broker's
        # samples committing flushes of 1,024 partitions (#32).
        return name
    raw = name.encode("utf-8", "surrogatepass")  # lone surrogates must not crash a request
    if raw and raw.strip(b".") == b"":
        return "".join(f"%{b:02X}" for b in raw)  # ".", ".." and friends: never path-like
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)


def unescape(component: str) -> str:
    """The name that `escape` turned into `component`."""
    out = bytearray()
    i, n = 0, len(component)
    while i < n:
        c = component[i]
        if c == "%":
            hexpart = component[i + 1 : i + 3]
            if len(hexpart) != 2 or any(h not in _HEX for h in hexpart):
                raise MalformedKey(f"bad escape in key component {component!r}")
            out.append(int(hexpart, 16))
            i += 3
            continue
        if ord(c) >= 128 or ord(c) not in _SAFE:
            raise MalformedKey(f"unescaped character {c!r} in key component {component!r}")
        out.append(ord(c))
        i += 1
    return out.decode("utf-8", "surrogatepass")


def _int(text: str, key: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise MalformedKey(f"not a number in key {key!r}")
    return int(text)


def _split(key: str, root: str, parts: int) -> list[str]:
    if not key.startswith(root):
        raise MalformedKey(f"key {key!r} is not under {root!r}")
    fields = key[len(root) :].split("/")
    if len(fields) != parts:
        raise MalformedKey(f"key {key!r} does not have {parts} part(s) under {root!r}")
    return fields


# -- topics, partitions, segments ------------------------------------------------------------


def topic(name: str) -> str:
    return TOPICS + escape(name)


def partition(topic_name: str, p: int) -> str:
    return f"{PARTITIONS}{escape(topic_name)}/{int(p)}"


def partition_of(key: str) -> tuple[str, int]:
    """(topic, partition) of a `partition(...)` key."""
    t, p = _split(key, PARTITIONS, 2)
    return unescape(t), _int(p, key)


def topic_partitions_prefix(topic_name: str) -> str:
    """Every partition key of the topic."""
    return f"{PARTITIONS}{escape(topic_name)}/"


def segment(topic_name: str, p: int, base_offset: int) -> str:
    # Zero-padded so that key order is offset order.
    return f"{segments_prefix(topic_name, p)}{int(base_offset):020d}"


def segments_prefix(topic_name: str, p: int) -> str:
    """Every segment key of one partition."""
    return f"{SEGMENTS}{escape(topic_name)}/{int(p)}/"


def topic_segments_prefix(topic_name: str) -> str:
    """Every segment key of every partition of the topic."""
    return f"{SEGMENTS}{escape(topic_name)}/"


# -- groups and offsets ------------------------------------------------------------------------


def group(group_id: str) -> str:
    return GROUPS + escape(group_id)


def group_id_of(key: str) -> str:
    """The group id of a `group(...)` key."""
    return unescape(_split(key, GROUPS, 1)[0])


def offset(group_id: str, topic_name: str, p: int) -> str:
    return f"{group_offsets_prefix(group_id)}{escape(topic_name)}/{int(p)}"


def group_offsets_prefix(group_id: str) -> str:
    """Every committed-offset key of exactly this group."""
    return f"{OFFSETS}{escape(group_id)}/"


def offset_partition_of(key: str) -> tuple[str, int]:
    """(topic, partition) of an `offset(...)` key."""
    _group, t, p = _split(key, OFFSETS, 3)
    return unescape(t), _int(p, key)


# -- brokers and ownership ---------------------------------------------------------------------


def broker(node_id: int) -> str:
    return f"{BROKERS}{int(node_id)}"


def broker_id_of(key: str) -> int:
    return _int(_split(key, BROKERS, 1)[0], key)


def owner(topic_name: str, p: int) -> str:
    return f"{OWNERS}{escape(topic_name)}/{int(p)}"


def topic_owners_prefix(topic_name: str) -> str:
    """Every owner key of the topic's partitions."""
    return f"{OWNERS}{escape(topic_name)}/"


def owner_partition_of(key: str) -> tuple[str, int]:
    """(topic, partition) of an `owner(...)` key."""
    t, p = _split(key, OWNERS, 2)
    return unescape(t), _int(p, key)


# -- transactions -----------------------------------------------------------------------------


def transaction(transactional_id: str) -> str:
    return TRANSACTIONS + escape(transactional_id)


def transactional_id_of(key: str) -> str:
    """The transactional id of a `transaction(...)` key."""
    return unescape(_split(key, TRANSACTIONS, 1)[0])


def group_pending_offsets_prefix(group_id: str) -> str:
    """Every pending (transactional) offset key of exactly this group, of any producer."""
    return f"{PENDING_OFFSETS}{escape(group_id)}/"


def producer_pending_offsets_prefix(group_id: str, producer_id: int) -> str:
    """The pending offset keys one producer's transaction wrote for this group."""
    return f"{group_pending_offsets_prefix(group_id)}{int(producer_id)}/"


def pending_offset(group_id: str, producer_id: int, topic_name: str, p: int) -> str:
    return f"{producer_pending_offsets_prefix(group_id, producer_id)}{escape(topic_name)}/{int(p)}"


def pending_offset_of(key: str) -> tuple[int, str, int]:
    """(producer id, topic, partition) of a `pending_offset(...)` key."""
    _group, pid, t, p = _split(key, PENDING_OFFSETS, 4)
    return _int(pid, key), unescape(t), _int(p, key)


# -- the layout before escaping (migration only) ----------------------------------------------


def legacy_group_id_of(key: str) -> str:
    """Group id of an old `/groups/{raw group id}` key (the id could hold "/")."""
    if not key.startswith(LEGACY_GROUPS):
        raise MalformedKey(f"key {key!r} is not under {LEGACY_GROUPS!r}")
    return key[len(LEGACY_GROUPS) :]


def legacy_offset_of(key: str) -> tuple[str, str, int]:
    """(group, topic, partition) of an old `/offsets/{raw group}/{topic}/{p}` key.

    Unambiguous from the right: Kafka topic names never contain "/"."""
    if not key.startswith(LEGACY_OFFSETS):
        raise MalformedKey(f"key {key!r} is not under {LEGACY_OFFSETS!r}")
    fields = key[len(LEGACY_OFFSETS) :].rsplit("/", 2)
    if len(fields) != 3:
        raise MalformedKey(f"key {key!r} is not /offsets/{{group}}/{{topic}}/{{partition}}")
    return fields[0], fields[1], _int(fields[2], key)


# -- group configs -----------------------------------------------------------------------------


def group_config(group_id: str) -> str:
    return GROUP_CONFIGS + escape(group_id)


def group_config_id_of(key: str) -> str:
    """The group id of a key made by `group_config`."""
    (name,) = _split(key, GROUP_CONFIGS, 1)
    return unescape(name)


# -- client quotas -------------------------------------------------------------------------------


def client_quota(entity) -> str:
    """The key of a quota entity ((type, name or None) pairs, sorted). Escaped names never
    hold "=", "," or "/", and a name is never empty (Kafka refuses it), so the empty name
    stands for the default entity unambiguously."""
    return CLIENT_QUOTAS + ",".join(f"{escape(kind)}={escape(name) if name is not None else ''}" for kind, name in entity)
# -- SCRAM credentials ---------------------------------------------------------------------


def scram_credential(user: str, mechanism: str) -> str:
    return f"{SCRAM_CREDENTIALS}{escape(user)}/{escape(mechanism)}"


def scram_user_prefix(user: str) -> str:
    return f"{SCRAM_CREDENTIALS}{escape(user)}/"


def scram_credential_of(key: str) -> tuple[str, str]:
    """(user, mechanism) of a key made by `scram_credential`."""
    user, mechanism = _split(key, SCRAM_CREDENTIALS, 2)
    return unescape(user), unescape(mechanism)


# -- ACL bindings ------------------------------------------------------------------------------


def acl(resource_type: int, name: str, pattern_type: int, principal: str, host: str, operation: int, permission: int) -> str:
    """One key per binding: creating the same binding twice writes the same key."""
    return (f"{ACLS}{int(resource_type)}/{int(pattern_type)}/{escape(name)}/{escape(principal)}/{escape(host)}/"
            f"{int(operation)}/{int(permission)}")


# -- share groups -------------------------------------------------------------------------------


def share_state(group_id: str, topic_name: str, p: int) -> str:
    return f"{share_states_prefix(group_id)}{escape(topic_name)}/{int(p)}"


def share_states_prefix(group_id: str) -> str:
    """Every share-partition state key of exactly this share group."""
    return f"{SHARE_STATES}{escape(group_id)}/"


def share_state_of(key: str) -> tuple[str, str, int]:
    """(group, topic, partition) of a `share_state(...)` key."""
    g, t, p = _split(key, SHARE_STATES, 3)
    return unescape(g), unescape(t), _int(p, key)
