"""Broker settings: one dataclass, filled from command-line flags or KAFSCALE_<NAME> env vars."""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields

from kafscale.metadata.url import MetadataURL
from kafscale.storage.url import StorageURL


@dataclass
class BrokerConfig:
    listen: str = field(default="127.0.0.1:9092", metadata={"help": "HOST:PORT to accept Kafka clients on"})
    advertise: str = field(default="", metadata={"help": "HOST:PORT given to clients (default: --listen)"})
    listeners: str = field(default="", metadata={"help": "NAME://HOST:PORT,... to accept clients on, Kafka style (names PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL or mapped by --listener-security-protocol-map; default: PLAINTEXT://<--listen>)"})
    advertised_listeners: str = field(default="", metadata={"help": "NAME://HOST:PORT,... given to clients per listener (default: each listener as bound; with --listen: PLAINTEXT://<--advertise>)"})
    listener_security_protocol_map: str = field(default="", metadata={"help": "NAME:PROTOCOL,... for custom listener names (PROTOCOL: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL); the standard names map to themselves"})
    ssl_cert: str = field(default="", metadata={"help": "PEM certificate chain of the TLS listeners (SSL, SASL_SSL)"})
    ssl_key: str = field(default="", metadata={"help": "PEM private key of --ssl-cert (encrypted: give --ssl-key-password)"})
    ssl_key_password: str = field(default="", metadata={"help": "password of an encrypted private key (Kafka's ssl.key.password); the variable KAFSCALE_SSL_KEY_PASSWORD keeps it out of the process list"})
    ssl_keystore_location: str = field(default="", metadata={"help": "instead of --ssl-cert/--ssl-key: a PKCS#12 keystore, or a PEM file with the key and the certificate chain (Kafka's ssl.keystore.location)"})
    ssl_keystore_password: str = field(default="", metadata={"help": "password of the PKCS#12 keystore (Kafka's ssl.keystore.password); better as KAFSCALE_SSL_KEYSTORE_PASSWORD"})
    ssl_keystore_type: str = field(default="", metadata={"help": "PKCS12 or PEM (Kafka's ssl.keystore.type; default: from the file, PEM if it is text)"})
    ssl_ca: str = field(default="", metadata={"help": "PEM CA certificates that sign client certificates (for --ssl-client-auth)"})
    ssl_truststore_location: str = field(default="", metadata={"help": "CA certificates that sign client certificates, PEM or PKCS#12 (Kafka's ssl.truststore.location; with or instead of --ssl-ca)"})
    ssl_truststore_password: str = field(default="", metadata={"help": "password of a PKCS#12 truststore (Kafka's ssl.truststore.password); better as KAFSCALE_SSL_TRUSTSTORE_PASSWORD"})
    ssl_truststore_type: str = field(default="", metadata={"help": "PKCS12 or PEM (Kafka's ssl.truststore.type; default: from the file)"})
    ssl_client_auth: str = field(default="none", metadata={"help": "none, requested or required: ask TLS clients for a certificate (Kafka's ssl.client.auth)"})
    listener_ssl: str = field(default="", metadata={"append": ";", "help": "TLS settings of one listener, Kafka's listener.name.<name>.ssl.*: NAME:key=value,... (keys cert, key, key-password, keystore-location, keystore-password, keystore-type, ca, truststore-location, truststore-password, truststore-type, client-auth, cipher-suites, and last principal-mapping-rules); repeat the flag or separate listeners with ';'; what a listener does not set comes from --ssl-*; passwords better as KAFSCALE_LISTENER_<NAME>_SSL_KEY_PASSWORD (_KEYSTORE_PASSWORD, _TRUSTSTORE_PASSWORD)"})
    ssl_cipher_suites: str = field(default="", metadata={"help": "OpenSSL cipher list for TLS 1.2 (TLS 1.3 suites are OpenSSL's; '' keeps Python's default)"})
    ssl_principal_mapping_rules: str = field(default="DEFAULT", metadata={"help": "client certificate subject to principal: DEFAULT and RULE:pattern/replacement/[LU], comma separated (Kafka's ssl.principal.mapping.rules)"})
    ssl_reload_interval_ms: int = field(default=5000, metadata={"help": "how often the TLS files are checked for changes (a change is loaded without restart; 0: never)"})
    ssl_handshake_timeout_ms: int = field(default=10_000, metadata={"help": "close a TLS connection whose handshake is not done in this time"})
    sasl_mechanisms: str = field(default="PLAIN,SCRAM-SHA-256,SCRAM-SHA-512", metadata={"help": "SASL mechanisms offered on SASL listeners (Kafka's sasl.enabled.mechanisms)"})
    sasl_users_file: str = field(default="", metadata={"help": "PLAIN users, NAME:PASSWORD per line (PLAIN also accepts SCRAM users' passwords)"})
    connections_max_reauth_ms: int = field(default=0, metadata={"help": "SASL session lifetime: clients re-authenticate (KIP-368) before it ends or are disconnected (Kafka's connections.max.reauth.ms; 0: no limit)"})
    sasl_server_max_receive_size: int = field(default=524_288, metadata={"help": "largest request before SASL authentication completes (Kafka's sasl.server.max.receive.size)"})
    sasl_failed_authentication_delay_ms: int = field(default=100, metadata={"help": "how long the answer of a failed authentication is held back; doubles with each failure from the same address up to 5 s, and failures from one address are answered one at a time (Kafka's connection.failed.authentication.delay.ms)"})
    inter_broker_listener_name: str = field(default="", metadata={"help": "the listener brokers reach each other on (transaction markers; Kafka's inter.broker.listener.name); default PLAINTEXT if there is one, else the first listener"})
    sasl_mechanism_inter_broker_protocol: str = field(default="PLAIN", metadata={"help": "SASL mechanism towards other brokers on a SASL inter-broker listener: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (Kafka's sasl.mechanism.inter.broker.protocol)"})
    inter_broker_sasl_username: str = field(default="", metadata={"help": "this broker's SASL user towards other brokers (it needs CLUSTER_ACTION, or to be a super user, under --authorizer acls)"})
    inter_broker_sasl_password: str = field(default="", metadata={"help": "its password; the environment variable KAFSCALE_INTER_BROKER_SASL_PASSWORD keeps it out of the process list"})
    inter_broker_ssl_ca: str = field(default="", metadata={"help": "PEM CA certificates that sign the other brokers' certificates on a TLS inter-broker listener (default --ssl-ca, else the system's)"})
    oauth_jwks: str = field(default="", metadata={"help": "OAUTHBEARER: JWKS file (re-read on change) or http(s) URL (cached 5 min) with the keys that sign tokens"})
    oauth_issuer: str = field(default="", metadata={"help": "OAUTHBEARER: required iss claim ('' accepts any)"})
    oauth_audience: str = field(default="", metadata={"help": "OAUTHBEARER: required aud value ('' accepts any)"})
    oauth_principal_claim: str = field(default="sub", metadata={"help": "OAUTHBEARER: the claim naming the principal (Kafka's sasl.oauthbearer.sub.claim.name)"})
    oauth_allow_unsecured: bool = field(default=False, metadata={"help": "OAUTHBEARER: accept unsigned (alg none) tokens; for tests only"})
    authorizer: str = field(default="none", metadata={"help": "none or acls: check every request against the ACLs in the metadata store (Kafka's authorizer.class.name)"})
    super_users: str = field(default="", metadata={"help": "principals allowed everything, ';' separated: User:admin;User:ops (Kafka's super.users)"})
    allow_everyone_if_no_acl_found: bool = field(default=False, metadata={"help": "with --authorizer acls: allow access to resources no ACL applies to (Kafka's allow.everyone.if.no.acl.found)"})
    acl_refresh_ms: int = field(default=500, metadata={"help": "with --authorizer acls: how often ACLs changed through other brokers are read"})
    quota_window_num: int = field(default=11, metadata={"help": "client quotas: how many windows a rate is measured over (Kafka's quota.window.num)"})
    quota_window_size_seconds: int = field(default=1, metadata={"help": "client quotas: the length of one window (Kafka's quota.window.size.seconds)"})
    quota_refresh_ms: int = field(default=1000, metadata={"help": "how often client quotas changed through other brokers are read (changes through this broker apply at once)"})
    data_dir: str = field(default="./data", metadata={"help": "local directory for embedded metadata and objects"})
    broker_id: int = field(default=0, metadata={"help": "this broker's node id"})
    broker_rack: str = field(default="", metadata={"help": "this broker's rack or availability zone (Kafka's broker.rack): given to clients in Metadata, and the rack of the partitions it owns for rack-aware assignment of consumer groups whose members set client.rack ('' for none)"})
    storage: str = field(default="", metadata={"help": "object store URL: file:///dir or s3://bucket/prefix (default file://<data-dir>/objects)"})
    namespace: str = field(default="default", metadata={"help": "first component of every object key"})
    metadata: str = field(default="embedded", metadata={"help": "metadata store: embedded or etcd://host:port[,host:port]"})
    metadata_prefix: str = field(default="/kafscale", metadata={"help": "key prefix in etcd"})
    metadata_timeout_ms: int = field(default=5000, metadata={"help": "longest wait for one etcd call, failover and retries included; past it the request answers a retriable error"})
    metadata_backup: str = field(default="", metadata={"help": "object store URL for metadata snapshots, e.g. a separate backup bucket s3://backups/kafscale (default: the --storage store); snapshots are under <namespace>/~metadata/ there"})
    metadata_snapshot_interval_ms: int = field(default=60_000, metadata={"help": "how often one broker of the cluster writes a metadata snapshot (also soon after topic, ACL, user, quota or group config changes; 0: never)"})
    metadata_snapshots_keep: int = field(default=10, metadata={"help": "metadata snapshots kept; older ones are deleted"})
    metadata_auto_restore: bool = field(default=False, metadata={"help": "when the metadata store is empty but the namespace holds data, run `kafscale metadata restore` before starting instead of refusing to start"})
    http: str = field(default="127.0.0.1:9093", metadata={"help": "HOST:PORT for /metrics, /healthz, /readyz ('' disables)"})
    http_tls: bool = field(default=False, metadata={"help": "serve --http over TLS with --ssl-cert/--ssl-key"})
    http_basic_auth: str = field(default="", metadata={"help": "USER:PASSWORD required for /metrics (HTTP basic auth; /healthz and /readyz stay open for probes); prefer the KAFSCALE_HTTP_BASIC_AUTH variable"})
    schema_registry: str = field(default="", metadata={"help": "HOST:PORT to serve the Confluent-compatible schema registry REST API on, its log the compacted topic _schemas ('' disables; docs/schema-registry.md)"})
    schema_registry_advertise: str = field(default="", metadata={"help": "HOST:PORT other brokers forward schema registry writes to (default: the --schema-registry address, or the advertised Kafka host at its port when it listens on all interfaces)"})
    schema_registry_tls: bool = field(default=False, metadata={"help": "serve --schema-registry over TLS with --ssl-cert/--ssl-key"})
    schema_registry_basic_auth: str = field(default="", metadata={"help": "USER:PASSWORD required on every --schema-registry request (HTTP basic auth); prefer the KAFSCALE_SCHEMA_REGISTRY_BASIC_AUTH variable"})
    max_frame_bytes: int = field(default=100 * 1024 * 1024, metadata={"help": "largest request frame accepted"})
    # 256 MiB: two frames of the largest size (100 MiB) at once plus room for small requests,
    # and several times what acks=all producers keep in flight at full speed (about
    # throughput x flush interval). Kafka's own default is unbounded (-1).
    max_request_memory: int = field(default=256 * 1024 * 1024, metadata={"help": "total bytes of requests being read or handled, at most half of --cache-bytes (or 32 MiB when that is less; the cache gives way to requests waiting to become durable, and keeps the other half for reads); a connection whose next request does not fit waits (Kafka's queued.max.request.bytes; 0: no limit)"})
    max_connections: int = field(default=10_000, metadata={"help": "client connections accepted at once; more are closed at accept (Kafka's max.connections; 0: no limit)"})
    max_connections_per_ip: int = field(default=0, metadata={"help": "client connections accepted at once from one address (Kafka's max.connections.per.ip; 0: no limit)"})
    connections_max_idle_ms: int = field(default=600_000, metadata={"help": "close a connection with no traffic and no open request for this long (Kafka's connections.max.idle.ms; 0: never)"})
    flush_interval_ms: int = field(default=500, metadata={"help": "longest time a record waits in the write buffer"})
    min_flush_interval_ms: int = field(default=-1, metadata={"help": "least time between two uploads of one partition (-1: 0 for file://, the flush interval for s3://)"})
    segment_bytes: int = field(default=4 * 1024 * 1024, metadata={"help": "default segment.bytes: seal a segment at this size"})
    index_min_bytes: int = field(default=16 * 1024 * 1024, metadata={"help": "write a segment's sparse .index only from this size on (smaller segments are read whole; 0: always)"})
    auto_create_topics: bool = field(default=True, metadata={"help": "create unknown topics on Metadata requests"})
    default_partitions: int = field(default=1, metadata={"help": "partitions of auto-created topics"})
    cache_bytes: int = field(default=256 * 1024 * 1024, metadata={"help": "memory for recently written and read segments"})
    write_ahead_objects: bool = field(default=None, metadata={"help": "a flush writes ONE write-ahead object holding the data of every partition of this broker, committed in one metadata transaction, instead of a segment per partition (PUTs independent of the partition count); the merger rewrites it into each partition's segments later (docs/performance.md); false: each partition uploads its own segment at every flush (default: true for s3://, false for a local directory)"})
    segment_max_age_ms: int = field(default=600_000, metadata={"help": "with write-ahead objects: longest time a partition's data stays in write-ahead objects before the merger rewrites it into the partition's own segments (sooner once it has half of segment.bytes)"})
    write_ahead_orphan_age_ms: int = field(default=300_000, metadata={"help": "with write-ahead objects: a write-ahead object no segment refers to is deleted once this old (and unreferenced for --merge-grace-ms); a flush commits nothing into an object older than a quarter of it, so this bounds the clock skew between brokers tolerated"})
    merge_interval_ms: int = field(default=10_000, metadata={"help": "how often small adjacent segments are merged and write-ahead pieces rewritten into segments (0 disables merging; the rewrite and the deletion of write-ahead objects then run every 10 s)"})
    merge_grace_ms: int = field(default=60_000, metadata={"help": "longest time merged-away objects stay for in-flight readers"})
    merge_max_pending_objects: int = field(default=1000, metadata={"help": "while more merged-away segments than this wait for deletion, the oldest go after --merge-min-grace-ms"})
    merge_min_grace_ms: int = field(default=5000, metadata={"help": "least time merged-away objects stay (readers' segment lists are at most a few seconds old)"})
    compaction_interval_ms: int = field(default=15_000, metadata={"help": "how often compacted partitions are checked for a compaction pass (Kafka's log.cleaner.backoff.ms; 0 disables compaction)"})
    compaction_key_map_bytes: int = field(default=128 * 1024 * 1024, metadata={"help": "memory for one compaction pass's key map (Kafka's log.cleaner.dedupe.buffer.size; about 176 bytes a key)"})
    retention_check_interval_ms: int = field(default=30_000, metadata={"help": "how often retention runs"})
    group_initial_rebalance_delay_ms: int = field(default=3000, metadata={"help": "wait for more members before the first rebalance of a new group"})
    group_min_session_timeout_ms: int = field(default=6000, metadata={"help": "least session timeout a group member may ask for (Kafka's group.min.session.timeout.ms)"})
    group_max_session_timeout_ms: int = field(default=1_800_000, metadata={"help": "greatest session timeout a group member may ask for (Kafka's group.max.session.timeout.ms)"})
    group_consumer_session_timeout_ms: int = field(default=45_000, metadata={"help": "session timeout of consumer-protocol (KIP-848, group.protocol=consumer) group members, set by the broker (Kafka's group.consumer.session.timeout.ms)"})
    group_consumer_heartbeat_interval_ms: int = field(default=5_000, metadata={"help": "how often consumer-protocol group members heartbeat (Kafka's group.consumer.heartbeat.interval.ms)"})
    group_consumer_max_size: int = field(default=2**31 - 1, metadata={"help": "most members of a consumer-protocol group; more get GROUP_MAX_SIZE_REACHED (Kafka's group.consumer.max.size)"})
    group_consumer_assignors: str = field(default="uniform,range", metadata={"help": "server-side assignors of consumer-protocol groups, the first the default (Kafka's group.consumer.assignors)"})
    group_consumer_migration_policy: str = field(default="bidirectional", metadata={"help": "online migration between the classic and the consumer group protocol: bidirectional, upgrade (a classic group becomes a consumer group when a group.protocol=consumer member joins), downgrade (back when its last such member leaves) or disabled (Kafka's group.consumer.migration.policy)"})
    group_consumer_min_session_timeout_ms: int = field(default=45_000, metadata={"help": "least consumer.session.timeout.ms a group config may set (Kafka's group.consumer.min.session.timeout.ms)"})
    group_consumer_max_session_timeout_ms: int = field(default=60_000, metadata={"help": "greatest consumer.session.timeout.ms a group config may set (Kafka's group.consumer.max.session.timeout.ms)"})
    group_consumer_min_heartbeat_interval_ms: int = field(default=5_000, metadata={"help": "least consumer.heartbeat.interval.ms a group config may set (Kafka's group.consumer.min.heartbeat.interval.ms)"})
    group_consumer_max_heartbeat_interval_ms: int = field(default=15_000, metadata={"help": "greatest consumer.heartbeat.interval.ms a group config may set (Kafka's group.consumer.max.heartbeat.interval.ms)"})
    group_share_session_timeout_ms: int = field(default=45_000, metadata={"help": "session timeout of share group members (KIP-932), unless the group's share.session.timeout.ms says otherwise (Kafka's group.share.session.timeout.ms)"})
    group_share_min_session_timeout_ms: int = field(default=45_000, metadata={"help": "least share.session.timeout.ms a group config may set (Kafka's group.share.min.session.timeout.ms)"})
    group_share_max_session_timeout_ms: int = field(default=60_000, metadata={"help": "greatest share.session.timeout.ms a group config may set (Kafka's group.share.max.session.timeout.ms)"})
    group_share_heartbeat_interval_ms: int = field(default=5_000, metadata={"help": "how often share group members heartbeat, unless the group's share.heartbeat.interval.ms says otherwise (Kafka's group.share.heartbeat.interval.ms)"})
    group_share_min_heartbeat_interval_ms: int = field(default=5_000, metadata={"help": "least share.heartbeat.interval.ms a group config may set (Kafka's group.share.min.heartbeat.interval.ms)"})
    group_share_max_heartbeat_interval_ms: int = field(default=15_000, metadata={"help": "greatest share.heartbeat.interval.ms a group config may set (Kafka's group.share.max.heartbeat.interval.ms)"})
    group_share_max_size: int = field(default=200, metadata={"help": "most members of a share group (Kafka's group.share.max.size)"})
    group_share_delivery_count_limit: int = field(default=5, metadata={"help": "deliveries of a record to a share group before it is archived (Kafka's group.share.delivery.count.limit, 2-10)"})
    group_share_partition_max_record_locks: int = field(default=2000, metadata={"help": "most records of one share-partition delivered and not yet acknowledged at once (Kafka's group.share.partition.max.record.locks, 100-10000)"})
    group_share_record_lock_duration_ms: int = field(default=30_000, metadata={"help": "how long a record delivered to a share group member stays locked to it, unless the group's share.record.lock.duration.ms says otherwise (Kafka's group.share.record.lock.duration.ms)"})
    group_share_min_record_lock_duration_ms: int = field(default=15_000, metadata={"help": "least share.record.lock.duration.ms a group config may set (Kafka's group.share.min.record.lock.duration.ms)"})
    group_share_max_record_lock_duration_ms: int = field(default=60_000, metadata={"help": "greatest share.record.lock.duration.ms a group config may set (Kafka's group.share.max.record.lock.duration.ms)"})
    group_config_refresh_ms: int = field(default=1000, metadata={"help": "how often a group's coordinator re-reads the group's configs (GROUP config resources) changed through other brokers (changes through this broker apply at once)"})
    offsets_retention_minutes: int = field(default=7 * 24 * 60, metadata={"help": "committed offsets of empty groups expire after this"})
    offsets_retention_check_interval_ms: int = field(default=600_000, metadata={"help": "how often expired committed offsets are removed and old-layout group keys migrated (Kafka's offsets.retention.check.interval.ms)"})
    offsets_topic_num_partitions: int = field(default=50, metadata={"help": "partitions of the internal topic __consumer_offsets when the broker creates it; a group's coordinator is the owner of partition hash(group) % its partition count (Kafka's offsets.topic.num.partitions)"})
    offsets_topic_segment_bytes: int = field(default=104_857_600, metadata={"help": "segment.bytes of __consumer_offsets when the broker creates it (Kafka's offsets.topic.segment.bytes)"})
    producer_id_expiration_ms: int = field(default=86_400_000, metadata={"help": "forget an idempotent producer's state after this long without writes"})
    transactions: bool = field(default=True, metadata={"help": "serve the transaction APIs (false: transactional ids are refused and the APIs not advertised)"})
    transaction_partition_verification_enable: bool = field(default=True, metadata={"help": "a partition accepts the first transactional batch of a transaction only if the coordinator has the partition in it (KIP-890; Kafka's setting of this name)"})
    transaction_version: int = field(default=2, metadata={"help": "the transaction.version feature level the broker finalizes in ApiVersions (Kafka's feature, set there with kafka-features or kafka-storage format --feature transaction.version=N): 2, as a new Kafka 4.0 cluster, lets clients use transactions v2 (KIP-890: a produce or offset commit adds its partition or group to the transaction itself, every commit or abort bumps the epoch); 0 or 1 keeps them on AddPartitionsToTxn/AddOffsetsToTxn. Give every broker of a cluster the same level"})
    transaction_max_timeout_ms: int = field(default=900_000, metadata={"help": "greatest transaction.timeout.ms a transactional producer may ask for (Kafka's transaction.max.timeout.ms)"})
    transactional_id_expiration_ms: int = field(default=7 * 24 * 3600 * 1000, metadata={"help": "forget a transactional id after this long without a transaction (Kafka's transactional.id.expiration.ms)"})
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = field(default=10_000, metadata={"help": "how often transactions past their timeout are aborted and prepared ones this broker coordinates are finished (Kafka's setting of this name)"})
    lease_ttl_s: int = field(default=10, metadata={"help": "etcd lease TTL for broker liveness and ownership"})
    ownership_resync_ms: int = field(default=5000, metadata={"help": "with etcd: re-read brokers, owners and topics this often even when the etcd watches report no change (a safety net)"})
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING, ERROR"})
    log_format: str = field(default="text", metadata={"help": "text or json"})

    def __post_init__(self) -> None:
        if not self.advertise:
            self.advertise = self.listen
        if not self.storage:
            self.storage = "file://" + os.path.abspath(os.path.join(self.data_dir, "objects"))
        # Parsed once, here; raises ValueError for an unsupported scheme.
        self.storage_url = StorageURL.parse(self.storage)
        self.metadata_url = MetadataURL.parse(self.metadata)
        self.metadata_backup_url = StorageURL.parse(self.metadata_backup) if self.metadata_backup else None
        if self.metadata_timeout_ms <= 0:
            raise ValueError(f"--metadata-timeout-ms must be positive, not {self.metadata_timeout_ms}")
        if self.min_flush_interval_ms < 0:
            # A local directory makes an upload cheap, so acknowledge at once. On S3 every
            # upload is billed (one PUT: the segment; a second for its index only from
            # --index-min-bytes on), so a busy partition uploads at most once per flush
            # interval: the spec's cost profile (README: "Latency and S3 cost"). An idle
            # partition still answers at once.
            self.min_flush_interval_ms = self.flush_interval_ms if self.storage_url.is_s3 else 0
        if self.write_ahead_objects is None:
            # Write-ahead objects make the PUT bill independent of the partition count: on
            # S3, where every PUT is billed. A local directory bills nothing, and there a
            # partition's own segment answers sooner (docs/performance.md, #33: paced p50
            # 8.5 ms against 12-37 ms with write-ahead objects on the embedded default).
            self.write_ahead_objects = self.storage_url.is_s3

    def resolved_listeners(self):
        """(bound, advertised) listeners; raises security.listeners.ListenerError."""
        from kafscale.security.listeners import resolve

        return resolve(self.listeners, self.advertised_listeners, self.listener_security_protocol_map, self.listen, self.advertise)

    def given(self) -> set[str]:
        """Names of the fields the operator set (flags or KAFSCALE_* variables); for a
        config built in code, the fields that differ from their defaults."""
        explicit = self.__dict__.get("_given")
        if explicit is not None:
            return set(explicit)
        return {f.name for f in fields(self) if f.default is not MISSING and getattr(self, f.name) != f.default}

    def kafka_static_configs(self) -> dict[str, str]:
        """The operator-given settings that are Kafka broker configs, by Kafka's name (what
        Kafka reports as STATIC_BROKER_CONFIG), e.g. {"log.segment.bytes": "1000000"}."""
        given = self.given()
        return {kafka: _kafka_value(getattr(self, name)) for name, kafka in KAFKA_NAMES.items() if name in given}

    def tls_settings(self):
        from kafscale.security.tls import TlsSettings

        return TlsSettings(
            self.ssl_cert, self.ssl_key, self.ssl_ca, self.ssl_client_auth, self.ssl_cipher_suites, self.ssl_key_password,
            self.ssl_keystore_location, self.ssl_keystore_password, self.ssl_keystore_type,
            self.ssl_truststore_location, self.ssl_truststore_password, self.ssl_truststore_type,
        )

    def listener_tls_settings(self, listeners=None) -> dict:
        """TLS settings by TLS listener name: --listener-ssl over the --ssl-* settings.
        Raises ValueError for a --listener-ssl entry that names no TLS listener."""
        from kafscale.security.tls import listener_settings, parse_listener_ssl

        if listeners is None:
            listeners = self.resolved_listeners()[0]
        base = self.tls_settings()
        overrides = parse_listener_ssl(self.listener_ssl)
        tls_names = {l.name for l in listeners if l.tls}
        for name in overrides:
            if name not in tls_names:
                raise ValueError(f"--listener-ssl names {name}, which is not a TLS listener (TLS listeners: {', '.join(sorted(tls_names)) or 'none'})")
        return {name: listener_settings(base, overrides[name], name, os.environ) if name in overrides else base for name in sorted(tls_names)}

    def listener_principal_rules(self) -> dict[str, str]:
        """Principal mapping rules by listener name, for listeners whose --listener-ssl sets them."""
        from kafscale.security.tls import PRINCIPAL_RULES, parse_listener_ssl

        return {name: keys[PRINCIPAL_RULES] for name, keys in parse_listener_ssl(self.listener_ssl).items() if PRINCIPAL_RULES in keys}

    def check_security(self) -> None:
        """Refuse settings that cannot work, before anything starts (ValueError subclasses)."""
        from kafscale.security.principal import parse_rules

        bound, _adv = self.resolved_listeners()
        checked = set()
        for settings in self.listener_tls_settings(bound).values():
            if settings not in checked:
                settings.check()
                checked.add(settings)
        parse_rules(self.ssl_principal_mapping_rules)
        for rules in self.listener_principal_rules().values():
            parse_rules(rules)
        if self.http_tls and not self.ssl_keystore_location and (not self.ssl_cert or not self.ssl_key):
            raise ValueError("--http-tls needs --ssl-cert and --ssl-key (or --ssl-keystore-location)")
        if self.http_basic_auth and ":" not in self.http_basic_auth:
            raise ValueError("--http-basic-auth must be USER:PASSWORD")
        if self.schema_registry_tls and not self.ssl_keystore_location and (not self.ssl_cert or not self.ssl_key):
            raise ValueError("--schema-registry-tls needs --ssl-cert and --ssl-key (or --ssl-keystore-location)")
        if self.schema_registry_basic_auth and ":" not in self.schema_registry_basic_auth:
            raise ValueError("--schema-registry-basic-auth must be USER:PASSWORD")
        from kafscale.security.inter_broker import InterBrokerSecurity

        InterBrokerSecurity.from_config(self)
        if not 0 <= self.transaction_version <= 2:
            raise ValueError(f"--transaction-version must be 0, 1 or 2 (the transaction.version levels), not {self.transaction_version}")
        if self.authorizer not in ("none", "acls"):
            raise ValueError(f"--authorizer must be none or acls, not {self.authorizer!r}")
        from kafscale.groups.consumer_coordinator import consumer_group_config
        from kafscale.metadata.group_config import GroupLimits

        GroupLimits.from_config(self).check()  # the group settings' bounds, as Kafka checks them at start
        consumer_group_config(self)  # known assignors
        from kafscale.groups.migration import MigrationPolicy

        MigrationPolicy.parse(self.group_consumer_migration_policy)
        if any(l.sasl for l in bound):
            from kafscale.security.sasl import load_users_file, parse_mechanisms

            mechanisms = parse_mechanisms(self.sasl_mechanisms)
            if not mechanisms:
                raise ValueError("a SASL listener needs at least one mechanism in --sasl-mechanisms")
            if "OAUTHBEARER" in mechanisms and not self.oauth_jwks and not self.oauth_allow_unsecured:
                raise ValueError("OAUTHBEARER needs --oauth-jwks (or --oauth-allow-unsecured true, for tests)")
            if self.sasl_users_file:
                load_users_file(self.sasl_users_file)

    @staticmethod
    def split_hostport(value: str) -> tuple[str, int]:
        host, _, port = value.rpartition(":")
        return host or "0.0.0.0", int(port)


def _parse_bool(s: str) -> bool:
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {s!r}")


def add_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One flag per BrokerConfig field (`only`: just these fields, for commands that open a
    broker's stores); the default comes from KAFSCALE_<NAME> if set."""
    for f in fields(BrokerConfig):
        if only is not None and f.name not in only:
            continue
        flag = "--" + f.name.replace("_", "-")
        env = "KAFSCALE_" + f.name.upper()
        kind = _parse_bool if f.type in (bool, "bool") else int if f.type in (int, "int") else str
        default = os.environ.get(env)
        # argparse reads help as a %-format string: a '%' written in a help text is a percent sign.
        help_text = f"{f.metadata.get('help', '')} (env {env})".replace("%", "%%")
        if f.metadata.get("append"):  # a flag that may be repeated; the values are joined
            parser.add_argument(flag, dest=f.name, action="append", default=[default] if default is not None else None, help=help_text)
            continue
        parser.add_argument(flag, dest=f.name, type=kind, default=kind(default) if default is not None else None, help=help_text)


# The flags that say where a broker's stores are: commands that open them directly
# (`kafscale metadata ...`) take exactly these.
STORE_FLAGS = ("data_dir", "storage", "namespace", "metadata", "metadata_prefix", "metadata_backup", "metadata_snapshots_keep")


def from_args(ns: argparse.Namespace) -> BrokerConfig:
    given = {f.name: getattr(ns, f.name) for f in fields(BrokerConfig) if getattr(ns, f.name, None) is not None}
    for f in fields(BrokerConfig):
        if f.metadata.get("append") and isinstance(given.get(f.name), list):
            given[f.name] = f.metadata["append"].join(given[f.name])
    config = BrokerConfig(**given)
    config._given = frozenset(given)
    return config


# BrokerConfig fields that are Apache Kafka broker configs, by Kafka's name.
KAFKA_NAMES = {
    "broker_id": "broker.id",
    "auto_create_topics": "auto.create.topics.enable",
    "default_partitions": "num.partitions",
    "segment_bytes": "log.segment.bytes",
    "max_frame_bytes": "socket.request.max.bytes",
    "max_request_memory": "queued.max.request.bytes",
    "max_connections": "max.connections",
    "max_connections_per_ip": "max.connections.per.ip",
    "connections_max_idle_ms": "connections.max.idle.ms",
    "retention_check_interval_ms": "log.retention.check.interval.ms",
    "group_initial_rebalance_delay_ms": "group.initial.rebalance.delay.ms",
    "group_min_session_timeout_ms": "group.min.session.timeout.ms",
    "group_max_session_timeout_ms": "group.max.session.timeout.ms",
    "group_consumer_session_timeout_ms": "group.consumer.session.timeout.ms",
    "group_consumer_heartbeat_interval_ms": "group.consumer.heartbeat.interval.ms",
    "group_consumer_max_size": "group.consumer.max.size",
    "group_consumer_assignors": "group.consumer.assignors",
    "group_consumer_migration_policy": "group.consumer.migration.policy",
    "group_consumer_min_session_timeout_ms": "group.consumer.min.session.timeout.ms",
    "group_consumer_max_session_timeout_ms": "group.consumer.max.session.timeout.ms",
    "group_consumer_min_heartbeat_interval_ms": "group.consumer.min.heartbeat.interval.ms",
    "group_consumer_max_heartbeat_interval_ms": "group.consumer.max.heartbeat.interval.ms",
    "group_share_session_timeout_ms": "group.share.session.timeout.ms",
    "group_share_min_session_timeout_ms": "group.share.min.session.timeout.ms",
    "group_share_max_session_timeout_ms": "group.share.max.session.timeout.ms",
    "group_share_heartbeat_interval_ms": "group.share.heartbeat.interval.ms",
    "group_share_min_heartbeat_interval_ms": "group.share.min.heartbeat.interval.ms",
    "group_share_max_heartbeat_interval_ms": "group.share.max.heartbeat.interval.ms",
    "group_share_max_size": "group.share.max.size",
    "group_share_delivery_count_limit": "group.share.delivery.count.limit",
    "group_share_partition_max_record_locks": "group.share.partition.max.record.locks",
    "group_share_record_lock_duration_ms": "group.share.record.lock.duration.ms",
    "group_share_min_record_lock_duration_ms": "group.share.min.record.lock.duration.ms",
    "group_share_max_record_lock_duration_ms": "group.share.max.record.lock.duration.ms",
    "offsets_retention_minutes": "offsets.retention.minutes",
    "offsets_retention_check_interval_ms": "offsets.retention.check.interval.ms",
    "offsets_topic_num_partitions": "offsets.topic.num.partitions",
    "offsets_topic_segment_bytes": "offsets.topic.segment.bytes",
    "producer_id_expiration_ms": "producer.id.expiration.ms",
    "transaction_max_timeout_ms": "transaction.max.timeout.ms",
    "transactional_id_expiration_ms": "transactional.id.expiration.ms",
    "transaction_abort_timed_out_transaction_cleanup_interval_ms": "transaction.abort.timed.out.transaction.cleanup.interval.ms",
}


def _kafka_value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
