"""ApiVersions (18): advertise exactly what the router has, with the feature levels of the
Kafka version KafScale answers as; UpdateFeatures (57) refuses to change them.

Features (KIP-584), what `kafka-features describe`, Admin.describeFeatures and the clients
read from ApiVersions, as a new Kafka 4.0 cluster has them:
- metadata.version: supported 7 (3.3-IV3, the oldest Kafka 4.0 supports) to 25 (4.0-IV3),
  finalized at 25, which is at or above the 4.0-IV2 that transaction.version 1 and 2 need.
- transaction.version: supported 0 to 2, finalized at `--transaction-version` (default 2).
  At 2, Java 4.x and franz-go style clients use transactions v2 (KIP-890 part 2): Produce
  v12+ and TxnOffsetCommit v5+ without AddPartitionsToTxn / AddOffsetsToTxn, EndTxn v5 with
  an epoch bump per transaction (docs/transactions.md). Level 0 is finalized by leaving
  the feature out of the finalized list, as Kafka does; with --transactions false it is
  not advertised at all.
- group.version: supported 0 to 1, finalized at 1: the consumer group protocol of KIP-848
  (ConsumerGroupHeartbeat / ConsumerGroupDescribe, handlers/consumer_groups.py), as a new
  Kafka 4.0 cluster has it.
- share.version: supported 0 to 1, finalized at 1: share groups of KIP-932
  (ShareGroupHeartbeat / ShareGroupDescribe / ShareFetch / ShareAcknowledge,
  handlers/share_groups.py and share_fetch.py), on by default as in Kafka 4.2.
Nothing else is claimed: no kraft.version (there is no KRaft quorum). The levels are fixed per broker: UpdateFeatures answers
INVALID_UPDATE_VERSION for any change (a no-op request for the current level succeeds);
an operator picks the transaction.version level with the flag, on every broker alike."""

import re

from kafscale.errors import ErrorCode
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.protocol.codec import EncodedResponse

METADATA_VERSION = (7, 25, 25)  # (supported min, supported max, finalized level): 3.3-IV3 .. 4.0-IV3
TRANSACTION_VERSION_MAX = 2
GROUP_VERSION = (0, 1, 1)  # KIP-848's consumer group protocol
SHARE_VERSION = (0, 1, 1)  # KIP-932's share groups, on as in a new Kafka 4.2 cluster


def features(broker) -> dict[str, tuple[int, int, int]]:
    """name -> (supported min, supported max, finalized level) of this broker."""
    out = {"metadata.version": METADATA_VERSION}
    if getattr(broker, "transactions", None) is not None:
        out["transaction.version"] = (0, TRANSACTION_VERSION_MAX, broker.config.transaction_version)
    out["group.version"] = GROUP_VERSION
    out["share.version"] = SHARE_VERSION
    return out
FINALIZED_EPOCH = 0
# What Kafka's ApiVersionsRequest.isValid() requires of client_software_name / _version (v3+)
SOFTWARE_NAME_OR_VERSION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


# Answers by everything they are made of (version, the router's APIs, the features): the
# same for every request to a broker, so encoded once (an ApiVersions answer of ~90 APIs
# costs the request path more than a Metadata one). Bounded for processes of many brokers.
_ANSWERS: dict[tuple, EncodedResponse] = {}
_MAX_ANSWERS = 64


async def api_versions(ctx, req):
    cls = response(ApiKey.API_VERSIONS, ctx.version)
    if ctx.version >= 3 and not (
        SOFTWARE_NAME_OR_VERSION.fullmatch(req.client_software_name) and SOFTWARE_NAME_OR_VERSION.fullmatch(req.client_software_version)
    ):
        # Kafka answers INVALID_REQUEST with no API list (KafkaApis.handleApiVersionsRequest)
        return make(cls, error_code=ErrorCode.invalid_request, api_keys=(), throttle_time=0)
    apis = tuple(sorted((a.key, a.min_version, a.max_version) for a in ctx.broker.router.apis.values()))
    feats = tuple(features(ctx.broker).items())
    key = (ctx.version, apis, feats)
    answer = _ANSWERS.get(key)
    if answer is None:
        if len(_ANSWERS) >= _MAX_ANSWERS:
            _ANSWERS.clear()
        answer = _ANSWERS[key] = EncodedResponse(ApiKey.API_VERSIONS, ctx.version, _answer(cls, ctx.version, apis, dict(feats)))
    return answer


def _answer(cls, version: int, apis, feats: dict[str, tuple[int, int, int]]):
    entry = nested(cls, "ApiVersion")
    keys = tuple(make(entry, api_key=k, min_version=lo, max_version=hi) for k, lo, hi in apis)
    extra = {}
    if version >= 3:
        supported_cls, finalized_cls = nested(cls, "SupportedFeatureKey"), nested(cls, "FinalizedFeatureKey")
        # Kafka leaves out features whose minimum is 0 below v4 (old clients fail on them)
        extra["supported_features"] = tuple(
            make(supported_cls, name=n, min_version=lo, max_version=hi) for n, (lo, hi, _) in feats.items() if lo > 0 or version >= 4
        )
        extra["finalized_features_epoch"] = FINALIZED_EPOCH
        extra["finalized_features"] = tuple(
            make(finalized_cls, name=n, min_version_level=level, max_version_level=level) for n, (_, _, level) in feats.items() if level > 0
        )
    return make(cls, error_code=ErrorCode.none, api_keys=keys, throttle_time=0, **extra)


async def update_features(ctx, req):
    cls = response(ApiKey.UPDATE_FEATURES, ctx.version)
    outcomes = []
    feats = features(ctx.broker)
    for u in req.feature_updates:
        known = feats.get(u.feature)
        if known is not None and u.max_version_level == known[2]:
            outcomes.append((u.feature, ErrorCode.none, None))
        elif known is None:
            outcomes.append((u.feature, ErrorCode.invalid_update_version, f"feature {u.feature} is not supported"))
        else:
            outcomes.append((u.feature, ErrorCode.invalid_update_version, f"{u.feature} is fixed at level {known[2]} in KafScale"))
    if ctx.version >= 2:  # v2 has no per-feature results: the first error is the request's (as Kafka)
        code, msg = next(((c, m) for _, c, m in outcomes if c != ErrorCode.none), (ErrorCode.none, None))
        return make(cls, throttle_time=0, error_code=code, error_message=msg)
    result_cls = nested(cls, "UpdatableFeatureResult")
    results = tuple(make(result_cls, feature=f, error_code=c, error_message=m) for f, c, m in outcomes)
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, results=results)


def register(router):
    router.register(ApiKey.API_VERSIONS, api_versions)
    router.register(ApiKey.UPDATE_FEATURES, update_features)
