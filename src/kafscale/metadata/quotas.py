"""Client quotas (KIP-546): the entities, keys and validation of AlterClientQuotas and the
filter of DescribeClientQuotas, as Kafka's controller has them; no I/O (the store keeps one
document per entity, `MetadataStore.alter_client_quota`).

An entity maps entity types (user, client-id, ip) to a name, None being the default entity
(`<default>`). user and client-id combine; ip stands alone. Keys: producer_byte_rate and
consumer_byte_rate (integral, bytes/s), request_percentage and controller_mutation_rate
(fractional) for user/client-id; connection_creation_rate (integral) for ip. Every value
must be > 0. Enforced by broker/quota_manager.py (producer_byte_rate, consumer_byte_rate,
request_percentage); controller_mutation_rate and connection_creation_rate are stored only.

DescribeClientQuotas answers in Kafka's order (`kafka_order`), which clients compare exactly.
"""

from __future__ import annotations

import ipaddress

from kafscale.errors import ErrorCode, KafkaError

USER, CLIENT_ID, IP = "user", "client-id", "ip"
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
_LONG_MAX, _INT_MAX = float((1 << 63) - 1), float((1 << 31) - 1)
USER_CLIENT_KEYS = {"producer_byte_rate": _LONG_MAX, "consumer_byte_rate": _LONG_MAX, "request_percentage": None, "controller_mutation_rate": None}
IP_KEYS = {"connection_creation_rate": _INT_MAX}

Entity = tuple[tuple[str, str | None], ...]  # sorted (type, name) pairs


class QuotaError(KafkaError):
    """A quota request refused with `code` (INVALID_REQUEST, UNSUPPORTED_VERSION)."""


def _invalid(msg: str) -> QuotaError:
    return QuotaError(ErrorCode.invalid_request, msg)


def entity_of(pairs) -> Entity:
    """The validated entity of AlterClientQuotas' (type, name) pairs."""
    seen: dict[str, str | None] = {}
    if not pairs:
        raise _invalid("invalid empty client quota entity")
    for kind, name in pairs:
        if kind in seen:
            raise _invalid(f"invalid client quota entity, duplicate entity entry {kind}")
        if kind not in (USER, CLIENT_ID, IP):
            raise _invalid(f"unhandled client quota entity type: {kind}")
        if name is not None and name == "":
            raise _invalid(f"empty {kind} not supported")
        seen[kind] = name
    if IP in seen:
        if len(seen) > 1:
            raise _invalid("invalid quota entity combination: ip cannot be combined with user or client-id")
        if seen[IP] is not None:
            try:
                ipaddress.ip_address(seen[IP])
            except ValueError:
                raise _invalid(f"{seen[IP]} is not a valid IP") from None
    return tuple(sorted(seen.items()))


def check_value(entity: Entity, key: str, value: float) -> None:
    keys = IP_KEYS if entity[0][0] == IP else USER_CLIENT_KEYS
    if key not in keys:
        raise _invalid(f"invalid configuration key {key}")
    if value <= 0.0:
        raise _invalid(f"quota {key} must be greater than 0")
    limit = keys[key]
    if limit is not None:
        if value > limit:
            raise _invalid(f"proposed value for {key} is too large")
        if abs(value % 1.0) > 1e-6:
            raise _invalid(f"{key} cannot be a fractional value")


def change(entity: Entity, current: dict[str, float], ops) -> dict[str, float]:
    """The entity's values after `ops` ((key, value, remove) triples), each value checked."""
    new = dict(current)
    for key, value, remove in ops:
        if remove:
            new.pop(key, None)
        else:
            check_value(entity, key, value)
            new[key] = float(value)
    return new


def matcher(components, strict: bool):
    """A predicate over entities for DescribeClientQuotas' filter ((type, match_type, match)
    triples); QuotaError for a filter Kafka refuses."""
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for kind, match_type, match in components:
        if not kind:
            raise _invalid("invalid empty entity type")
        if kind in exact or kind in specified:
            raise _invalid(f"entity type {kind} cannot appear more than once in the filter")
        if kind not in (USER, CLIENT_ID, IP):
            raise QuotaError(ErrorCode.unsupported_version, f"unsupported entity type {kind}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise _invalid("MATCH_TYPE_EXACT with a null match string")
            exact[kind] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise _invalid("MATCH_TYPE_DEFAULT with a match string")
            exact[kind] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise _invalid("MATCH_TYPE_SPECIFIED with a match string")
            specified.add(kind)
        else:
            raise _invalid(f"unknown match type {match_type}")
    kinds = set(exact) | specified
    if IP in kinds and kinds & {USER, CLIENT_ID}:
        raise _invalid("an ip filter component cannot be used with user or client-id components")

    def matches(entity: Entity) -> bool:
        d = dict(entity)
        if strict and len(d) != len(kinds):
            return False
        return all(k in d and d[k] == v for k, v in exact.items()) and all(k in d for k in specified)

    return matches


# -- Kafka's answer order -----------------------------------------------------------------
#
# A Kafka broker answers DescribeClientQuotas from its metadata image, where an entity is a
# java.util.HashMap of type -> name (ClientQuotaImage.dataToEntity: a default HashMap) and
# its quotas a HashMap of key -> value that each metadata delta rebuilds (ClientQuotaDelta:
# the changed keys gathered in a default HashMap, then put into a HashMap sized by the
# previous image, 0 for a new entity). Components and values come out in those maps'
# iteration order. That order depends on the entity's history (a key added later to a
# bucket shared with an older key follows it); KafScale keeps no history and answers as
# Kafka does for an entity loaded in one delta: one AlterClientQuotas, or after a restart.
# Entries (whole entities) come sorted: Kafka's entry order depends on the image's whole
# history and on the filter.


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (31 * h + each UTF-16 code unit), as an unsigned 32-bit int."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h


def java_hashmap_order(keys, initial_capacity: int | None = None) -> list[str]:
    """The iteration order of a java.util.HashMap of String keys after `keys` are put in this
    order into `new HashMap<>()` (None) or `new HashMap<>(initial_capacity)`: by bucket (the
    hash with its high half folded into the low, masked by the table size), ties in
    insertion order. The table starts at 16, or at the power of two >= initial_capacity (at
    least 1), and doubles once the map holds more than 3/4 of it."""
    order: list[str] = []
    for key in keys:
        if key not in order:
            order.append(key)
    capacity = 16 if initial_capacity is None else 1 << max(initial_capacity - 1, 0).bit_length()
    while len(order) > capacity * 3 // 4:
        capacity *= 2
    # Splitting a bucket on a resize keeps its entries' order, so the final table decides.
    return sorted(order, key=lambda k: (java_string_hash(k) ^ java_string_hash(k) >> 16) & (capacity - 1))


def kafka_order(entity: Entity, values: dict[str, float]) -> tuple[Entity, list[tuple[str, float]]]:
    """An entity's components and its (key, value) pairs in the order Kafka answers them."""
    names = dict(entity)
    changed = java_hashmap_order(values)  # the delta's HashMap of changed keys
    return (tuple((kind, names[kind]) for kind in java_hashmap_order(names)),
            [(key, values[key]) for key in java_hashmap_order(changed, initial_capacity=0)])
