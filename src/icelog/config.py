"""The broker's one typed configuration: defaults < icelog.yaml < ICELOG_* environment < CLI flags."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from icelog.errors import ConfigError

DEFAULT_CONFIG_FILE = "icelog.yaml"
SETTINGS_ENV = "ICELOG_ARCHIVER_SETTINGS"  # a parent broker's Settings as JSON, for its archiver and maintenance


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@dataclass(frozen=True)
class Listener:
    """One Kafka listener: its name, security protocol, where it binds and what Metadata tells its clients."""

    name: str
    protocol: str
    host: str
    port: int
    advertised_host: str | None = None
    advertised_port: int | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def authenticates(self, ssl_client_auth: str) -> bool:
        """Whether every client of this listener proves who it is (SASL, or a required client certificate)."""
        return self.sasl or (self.protocol == "SSL" and ssl_client_auth == "required")

    @property
    def loopback(self) -> bool:
        return self.host in ("localhost", "127.0.0.1", "::1") or self.host.startswith("127.")


def _endpoints(value: str, setting: str) -> list[tuple[str, str, int]]:
    """NAME://HOST:PORT,... as (NAME, HOST, PORT); an empty host binds every interface, as Kafka's."""
    out = []
    for item in (v.strip() for v in value.split(",")):
        name, sep, rest = item.partition("://")
        host, colon, port = rest.rpartition(":")
        if not sep or not name or not colon or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"{setting}: {item!r} is not NAME://HOST:PORT (e.g. SASL_SSL://0.0.0.0:9093)")
        out.append((name.upper(), host.strip("[]"), int(port)))
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{setting}: each listener name may appear once, got {', '.join(names)}")
    return out


def parse_listeners(settings: Settings) -> list[Listener]:
    """`listeners` (or PLAINTEXT://<listen>), with protocols from the name or listener_security_protocol_map,
    and the advertised address of each from `advertised_listeners` (or advertised_host)."""
    if settings.listeners is None:
        return [Listener("PLAINTEXT", "PLAINTEXT", settings.host, settings.port, settings.advertised_host)]
    protocol_map = {}
    if settings.listener_security_protocol_map:
        for pair in settings.listener_security_protocol_map.split(","):
            name, sep, protocol = pair.strip().partition(":")
            if not sep or protocol.upper() not in SECURITY_PROTOCOLS:
                raise ValueError(f"listener_security_protocol_map: {pair.strip()!r} is not NAME:PROTOCOL with "
                                 f"PROTOCOL one of {', '.join(SECURITY_PROTOCOLS)}")
            protocol_map[name.upper()] = protocol.upper()
    advertised = {}
    if settings.advertised_listeners:
        advertised = {n: (h, p) for n, h, p in _endpoints(settings.advertised_listeners, "advertised_listeners")}
    specs = []
    for name, host, port in _endpoints(settings.listeners, "listeners"):
        protocol = protocol_map.get(name, name)
        if protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"listeners: {name} is neither a security protocol ({', '.join(SECURITY_PROTOCOLS)}) "
                             "nor named in listener_security_protocol_map")
        if name in advertised and advertised[name][0] in ("", "0.0.0.0", "::"):
            raise ValueError(f"advertised_listeners: {name} must name a host clients can reach, not "
                             f"{advertised[name][0] or 'an empty host'}")
        adv_host, adv_port = advertised.get(name, (settings.advertised_host, None))
        specs.append(Listener(name, protocol, host or "0.0.0.0", port, adv_host, adv_port))
    unknown = set(advertised) - {s.name for s in specs}
    if unknown:
        raise ValueError(f"advertised_listeners: {', '.join(sorted(unknown))} is not in listeners")
    return specs


_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU])?)\s*(?:,|$)")


@dataclass(frozen=True)
class PrincipalRule:
    """One of ssl.principal.mapping.rules: a pattern over the whole subject and its replacement (None: DEFAULT)."""

    pattern: re.Pattern[str] | None
    replacement: str = ""
    case: str = ""  # "L" lower-cases the result, "U" upper-cases it

    def apply(self, subject: str) -> str | None:
        if self.pattern is None:
            return subject
        if not self.pattern.fullmatch(subject):
            return None
        name = self.pattern.sub(self.replacement, subject, count=1)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


def principal_rules(value: str) -> list[PrincipalRule]:
    """Parse Kafka's ssl.principal.mapping.rules (Java's $1 group references become Python's)."""
    rules, position = [], 0
    while position < len(value.rstrip()):
        match = _RULE.match(value, position)
        if match is None or match.end() == position:
            raise ValueError(f"ssl_principal_mapping_rules: cannot read {value[position:]!r}; write "
                             "RULE:REGEX/REPLACEMENT/[L|U] entries and DEFAULT, separated by commas")
        if match.group(1):
            rules.append(PrincipalRule(None))
        else:
            try:
                pattern = re.compile(match.group(2).replace("\\/", "/"))
            except re.error as exc:
                raise ValueError(f"ssl_principal_mapping_rules: {match.group(2)!r} is not a regex: {exc}") from None
            replacement = re.sub(r"\$(\d+)", r"\\\1", match.group(3).replace("\\/", "/"))
            rules.append(PrincipalRule(pattern, replacement, match.group(4) or ""))
        position = match.end()
    return rules or [PrincipalRule(None)]


class IntakeSettings(BaseModel):
    """How the durable intake log writes."""

    url: str | None = Field(
        None,
        description="Where the intake is stored: s3://BUCKET/PREFIX for any S3-compatible store (endpoint and "
        "credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION or the AWS profile "
        "chain); default: files in <data_dir>/intake.",
    )
    commit_interval_ms: int = Field(
        250, gt=0, description="Object storage: at most one object (holding every partition's batches) per "
        "interval; appends wait until the interval since the last object has passed, at once after a quiet spell "
        "(WarpStream's and inkless's default)."
    )
    object_max_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="Object storage: an object is written before the interval ends once it "
        "holds this many bytes."
    )
    object_cache_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="Object storage: the newest intake objects kept in memory for Fetch at "
        "the tail (older reads are ranged GETs)."
    )

    @field_validator("url")
    @classmethod
    def _intake_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?", value):
            raise ValueError(f"intake.url must be s3://BUCKET[/PREFIX] (or unset: the data dir), got {value!r}")
        return value.rstrip("/")

    segment_bytes: int = Field(256 * 1024 * 1024, gt=0, description="Start a new intake file past this size.")
    flush_max_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="Upper bound on the bytes one group commit (one fsync) carries."
    )
    fsync: bool = Field(True, description="fsync each group commit before acknowledging (turn off only in tests).")
    preallocate_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="Allocate the active intake file this far ahead of its writes (Kafka's log.preallocate): "
        "an fsync of writes inside allocated space skips the block allocation an appending write costs. "
        "0 turns it off.",
    )
    producer_snapshot_interval_ms: int = Field(
        30000, gt=0, description="How often partitions that moved get a producer-state snapshot (start-up replays "
        "only the intake after it)."
    )
    index_cache_chunks: int = Field(
        4096,
        ge=2,
        description="Intake index rows each partition keeps in memory: its newest chunks, and as many older ones "
        "cached for reads (the rest are looked up in the metadata store, so start-up does not grow with the intake).",
    )
    min_free_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=0,
        description="Refuse an append (retriable NOT_ENOUGH_REPLICAS) that would leave the data dir less free space.",
    )
    batch_positions_cache_chunks: int = Field(
        64,
        ge=1,
        description="Chunks per partition whose batch positions (where each batch starts) stay indexed for reads "
        "that start inside a chunk (an LRU).",
    )


class MemorySettings(BaseModel):
    """How the broker's process holds memory (glibc's malloc: src/icelog/allocator.py, docs/operations.md)."""

    arena_max: int = Field(
        2,
        ge=0,
        description="glibc's M_ARENA_MAX: malloc arenas the broker's threads share (0: glibc's default, 8 per "
        "core). Each arena keeps free memory of its own.",
    )
    malloc_free_max_bytes: int = Field(
        16 * 1024 * 1024,
        ge=0,
        description="Free memory malloc may keep: past it (checked every 10 s) the broker gives every free page "
        "back to the system (malloc_trim).",
    )


class ArchiveSettings(BaseModel):
    """The Spark archiver: where the Iceberg catalog is, how Spark runs, and per-topic archive defaults."""

    enabled: bool = Field(True, description="`icelog serve` runs `icelog archive` as a child process.")
    default_kind: str = Field(
        "iceberg",
        pattern="^(iceberg|none)$",
        description="icelog.archive.kind of topics that do not set it: iceberg archives, none does not.",
    )
    catalog_type: str = Field("jdbc", pattern="^(jdbc|rest|hadoop)$", description="Iceberg catalog kind.")
    catalog_uri: str | None = Field(
        None, description="jdbc:... or http(s)://... (REST); default jdbc:sqlite:<data_dir>/catalog.db."
    )
    catalog_name: str = Field("lake", description="Spark catalog name (the default catalog of `icelog sql`).")
    catalog_properties: dict[str, str] = Field(
        default_factory=dict, description="Extra Iceberg catalog properties, e.g. jdbc.user, jdbc.password."
    )
    warehouse: str | None = Field(
        None, description="Where the tables' files live: file:///PATH, or s3://BUCKET/PATH in any S3-compatible "
        "store (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); default "
        "file://<data_dir>/warehouse.")
    namespace: str = Field("icelog", description="Namespace of archive tables (a topic's table config wins).")
    spark_master: str = Field(
        default_factory=lambda: f"local[{max(1, (os.cpu_count() or 2) // 2)}]",
        description="spark.master: local[N] (default: half the cores, the rest stay the broker's), or spark://HOST:PORT.",
    )
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark conf entries.")
    read_via: str = Field(
        "auto",
        pattern="^(files|kafka|auto)$",
        description="How archive tasks read the intake: files (open the broker's intake files: the archiver's "
        "Spark runs on the broker's machine), kafka (Fetch requests to the broker: executors anywhere), auto "
        "(files with a local[N] master, kafka with any other).",
    )
    bootstrap_servers: str | None = Field(
        None,
        description="HOST:PORT,... the archive tasks fetch from when reading via kafka; default: the broker's "
        "first listener (its advertised address).",
    )
    client_properties: dict[str, str] = Field(
        default_factory=dict,
        description="The archive's Kafka client settings under librdkafka's names: security.protocol, "
        "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location, "
        "ssl.key.location, ssl.key.password, ssl.endpoint.identification.algorithm. Never logged.",
    )
    poll_interval_ms: int = Field(250, gt=0, description="How often the archiver looks for due archives.")
    retry_backoff_max_ms: int = Field(
        30000, gt=0, description="Longest wait between retries of a failing topic (backoff is per topic)."
    )
    topic_wait_ms: int = Field(
        30000, gt=0, description="Longest a continuous pass waits for one topic before going on to the others."
    )
    nice: int = Field(
        15, ge=0, le=19, description="CPU niceness the archiver process (and Spark under it) adds to the broker's "
        "(the one it inherits, as `nice -n`; at most 19); 0: as the broker. Measured on two quiet cores at 5 MB/s: "
        "+15 keeps produce ack p99 within 1.5x of no archiver and freshness under 1 s (docs/archiving.md)."
    )
    max_lag_bytes: int = Field(
        4 * 1024 * 1024 * 1024,
        gt=0,
        description="Default icelog.archive.max.lag.bytes: unarchived intake per topic before produce is refused.",
    )
    max_bytes: int = Field(
        128 * 1024 * 1024, gt=0, description="Default icelog.archive.max.bytes: an archive is cut at this size."
    )
    complete_delay_max_ms: int = Field(
        500, ge=0, description="Default icelog.archive.complete.delay.max.ms: longest an archive stays open."
    )
    idle_max_ms: int = Field(
        250, ge=0, description="Default icelog.archive.idle.max.ms: complete an archive idle this long."
    )
    intake_retention_ms: int = Field(
        3600000,
        ge=-1,
        description="Default icelog.intake.retention.ms: drop archived intake older than this once consumers "
        "can read the table instead (-1: keep it).",
    )
    readback_cache_bytes: int = Field(
        256 * 1024 * 1024, gt=0, description="Record batches built from archive tables kept in memory (LRU)."
    )
    readback_file_cache_bytes: int = Field(
        1024 * 1024 * 1024, ge=0, description="Data files of tables on object storage copied to the broker's disk "
        "(<data_dir>/cache/readback-files) on their first read-back, LRU; 0: read them from the bucket."
    )
    maintenance_interval_ms: int = Field(
        300_000, gt=0, description="Least time between two automatic maintenance rounds of one table."
    )
    maintenance_min_new_files: int = Field(
        50, ge=1, description="Data files added since the last round that make a table due for compaction."
    )
    maintenance_small_file_bytes: int = Field(
        32 * 1024 * 1024, gt=0, description="Data files below this size are compacted (min-file-size-bytes)."
    )
    maintenance_group_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="Most bytes one compaction commit (and one rewrite task) rewrites (max-file-group-size-bytes); "
        "at most maintenance_small_file_bytes, so a compacted file fills a group alone and is not rewritten again.",
    )
    maintenance_min_input_files: int = Field(
        2, ge=2, description="Fewest small files of one partition worth rewriting (min-input-files)."
    )
    maintenance_delete_ratio: float = Field(
        0.3, gt=0, le=1, description="Rewrite a data file once deletes cover this share of its rows."
    )
    maintenance_snapshot_age_ms: int = Field(
        3_600_000, gt=0, description="history.expire.max-snapshot-age-ms of tables that do not set it."
    )
    maintenance_min_snapshots: int = Field(
        10, ge=1, description="history.expire.min-snapshots-to-keep of tables that do not set it."
    )
    maintenance_orphan_age_ms: int = Field(
        86_400_000,
        ge=3_600_000,
        description="Only files unreferenced and older than this are removed as orphans (at least 1 h).",
    )
    maintenance_max_manifests: int = Field(
        32, ge=2, description="Rewrite a table's manifests once its current snapshot has more than this many."
    )
    maintenance_nice: int = Field(
        19,
        ge=0,
        le=19,
        description="CPU niceness of maintenance rounds: the archiver runs each round as a child process "
        "(`icelog maintain --due`, a Spark of its own) at this niceness, so archive passes get the CPU first.",
    )


class SinkSettings(BaseModel):
    """One sink: topics of an external Kafka cluster archived into icelog's Iceberg tables (`icelog sink`)."""

    model_config = {"extra": "forbid"}

    bootstrap_servers: str = Field(description="HOST:PORT[,HOST:PORT…] of the source cluster.")
    group_id: str | None = Field(
        None, description="The source's consumer group the sink commits its progress to; default icelog-sink-<name>."
    )
    topics: list[str] = Field(default_factory=list, description="Source topics to archive (or topic_pattern).")
    topic_pattern: str | None = Field(None, description="A regular expression: every source topic it matches.")
    namespace: str | None = Field(None, description="Iceberg namespace of the sink's tables; default its name.")
    registry_url: str | None = Field(
        None, description="The source's schema registry (http://HOST:PORT): typed tables, as for built-in topics."
    )
    client: dict[str, str] = Field(
        default_factory=dict,
        description="Kafka client settings for the source, named as librdkafka names them (security.protocol, "
        "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, …).",
    )
    topic_configs: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="Per source topic, icelog topic configs (the archive and table keys)."
    )

    @model_validator(mode="after")
    def _check_topics(self) -> SinkSettings:
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("a sink names its topics with exactly one of topics: [...] and topic_pattern: '...'")
        if self.topic_pattern:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ValueError(f"topic_pattern {self.topic_pattern!r} is not a regular expression: {exc}") from None
        return self


class Settings(BaseSettings):
    """Everything `icelog serve` needs; each field can come from icelog.yaml, ICELOG_<NAME> or a flag."""

    model_config = SettingsConfigDict(env_prefix="ICELOG_", env_nested_delimiter="__", extra="forbid")

    listen: str = Field("localhost:9092", description="HOST:PORT of the Kafka listener.")
    advertised_host: str | None = Field(None, description="Host name clients are told to connect to.")
    data_dir: Path = Field(Path("./icelog-data"), description="Where all state lives.")
    node_id: int = Field(0, ge=0, le=(1 << 22) - 1, description="Kafka's node.id: distinct per broker of a cluster.")
    cluster_id: str = "icelog-cluster"
    broker_rack: str | None = Field(None, description="Kafka's broker.rack, as Metadata names it.")
    inter_broker_listener_name: str | None = Field(
        None, description="Kafka's inter.broker.listener.name: the listener a cluster's brokers reach each other on "
        "(transaction markers); unset: the first PLAINTEXT listener, else the first.")
    inter_broker_client_properties: dict[str, str] = Field(
        default_factory=dict,
        description="How this broker logs in on the other brokers' inter-broker listener, under librdkafka's names: "
        "sasl.mechanism, sasl.username, sasl.password (a super user, or a user with CLUSTER_ACTION), ssl.ca.location, "
        "ssl.certificate.location, ssl.key.location, ssl.key.password; the protocol is the listener's. Never logged.")
    broker_heartbeat_interval_ms: int = Field(
        1000, gt=0, description="Kafka's broker.heartbeat.interval.ms: how often a broker of a cluster (intake on "
        "object storage, metadata on PostgreSQL) renews its registration and reviews who leads what."
    )
    broker_session_timeout_ms: int = Field(
        6000, gt=0, description="Kafka's broker.session.timeout.ms: a broker whose heartbeats stop this long leaves "
        "the cluster, and its partitions and coordinators move to the others."
    )
    meta_url: str | None = Field(None, description="Metadata store; default sqlite:///<data_dir>/meta.db.")
    auto_create_topics_enable: bool = Field(True, description="Kafka's auto.create.topics.enable.")
    num_partitions: int = Field(1, ge=1, description="Partitions of auto-created topics (Kafka's num.partitions).")
    socket_request_max_bytes: int = Field(100 * 1024 * 1024, gt=0, description="Largest request accepted.")
    connections_max_idle_ms: int = Field(
        600000, gt=0, description="Kafka's connections.max.idle.ms: close a connection with no request in flight "
        "that sent no request for this long."
    )
    queued_max_request_bytes: int = Field(
        200 * 1024 * 1024,
        gt=0,
        description="Kafka's queued.max.request.bytes: bytes of requests being read or handled, over all "
        "connections, taken as they arrive (requests before a SASL login take none); at the bound the broker stops "
        "reading requests until some finish, and a single request larger than it closes its connection.",
    )
    max_connections: int | None = Field(
        None, gt=0, description="Kafka's max.connections: further connections (TLS handshakes under way included) "
        "are closed when accepted; default: the process's descriptor limit less what the registry, the metrics "
        "listener and the broker's own files keep (docs/security.md)."
    )
    max_connections_per_ip: int = Field(
        2147483647, gt=0, description="Kafka's max.connections.per.ip: further connections from one address "
        "are closed when accepted."
    )
    sasl_server_max_receive_size: int = Field(
        524288, gt=0, description="Kafka's sasl.server.max.receive.size: the largest request a connection to a SASL "
        "listener may send before it has logged in; a larger size closes the connection at once."
    )
    connection_setup_timeout_ms: int = Field(
        10000, gt=0, description="A connection must finish its TLS handshake and its SASL login within this long "
        "of being accepted, or it is closed (the broker's side of Kafka clients' socket.connection.setup.timeout.ms)."
    )
    connection_failed_authentication_delay_ms: int = Field(
        100, ge=0, description="Kafka's connection.failed.authentication.delay.ms: a failed login (SASL, or the "
        "registry's HTTP basic auth) is answered this much later, which slows password guessing."
    )
    registry_failed_logins_burst: int = Field(
        20, ge=1, description="failed registry logins one client address may have at once; past them it gets 429 "
        "with Retry-After, unchecked, until it earns another (registry_failed_logins_per_second)"
    )
    registry_failed_logins_per_second: float = Field(
        1.0, gt=0, description="failed registry logins a client address earns back each second once past "
        "registry_failed_logins_burst"
    )
    # -- security, named after Kafka's broker settings (docs/security.md) -------------------------------------
    listeners: str | None = Field(
        None,
        description="Kafka's listeners: comma-separated PROTOCOL://HOST:PORT (PLAINTEXT, SSL, SASL_PLAINTEXT, "
        "SASL_SSL), or NAME://HOST:PORT with listener_security_protocol_map; unset: PLAINTEXT://<listen>.",
    )
    advertised_listeners: str | None = Field(
        None, description="Kafka's advertised.listeners: the HOST:PORT Metadata names for each listener, by name."
    )
    listener_security_protocol_map: str | None = Field(
        None, description="Kafka's listener.security.protocol.map: NAME:PROTOCOL pairs for named listeners."
    )
    ssl_certfile: Path | None = Field(None, description="PEM certificate (chain) of the SSL/SASL_SSL listeners.")
    ssl_keyfile: Path | None = Field(None, description="PEM private key of ssl_certfile (not readable by others).")
    ssl_keyfile_password: SecretStr | None = Field(None, description="Password of an encrypted ssl_keyfile.")
    ssl_cafile: Path | None = Field(None, description="PEM CA certificates that client certificates must chain to.")
    ssl_client_auth: str = Field(
        "none", pattern="^(none|requested|required)$",
        description="Kafka's ssl.client.auth: ask TLS clients for a certificate; its subject is the principal.",
    )
    ssl_principal_mapping_rules: str = Field(
        "DEFAULT",
        description="Kafka's ssl.principal.mapping.rules: RULE:REGEX/REPLACEMENT/[L|U] entries tried in order on a "
        "client certificate's subject (CN=alice,O=...), DEFAULT keeps the subject as it is.",
    )
    sasl_enabled_mechanisms: str = Field(
        "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
        description="Kafka's sasl.enabled.mechanisms on SASL listeners (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).",
    )
    sasl_oauthbearer_jwks_endpoint_url: str | None = Field(
        None,
        description="Kafka's sasl.oauthbearer.jwks.endpoint.url, as a file (path or file: URL) holding the identity "
        "provider's JWKS; OAUTHBEARER logins are checked against its keys (re-read when the file changes).",
    )
    sasl_oauthbearer_expected_audience: str | None = Field(
        None, description="Kafka's sasl.oauthbearer.expected.audience: comma-separated; a token must name one."
    )
    sasl_oauthbearer_expected_issuer: str | None = Field(
        None, description="Kafka's sasl.oauthbearer.expected.issuer: a token's iss must be this."
    )
    sasl_oauthbearer_sub_claim_name: str = Field(
        "sub", description="Kafka's sasl.oauthbearer.sub.claim.name: the claim that names the user."
    )
    sasl_oauthbearer_clock_skew_seconds: int = Field(
        30, ge=0, description="Kafka's sasl.oauthbearer.clock.skew.seconds: leeway for exp, nbf and iat."
    )
    super_users: str = Field("", description="Kafka's super.users: User:NAME;User:OTHER may do anything.")
    authorizer_enabled: bool | None = Field(
        None,
        description="Whether ACLs apply (Kafka's authorizer.class.name); default: on when a listener "
        "authenticates clients (SASL_*, or SSL with ssl_client_auth=required).",
    )
    allow_everyone_if_no_acl_found: bool = Field(
        False, description="Kafka's allow.everyone.if.no.acl.found: a resource with no ACL is open to all."
    )
    retention_check_interval_ms: int = Field(5000, gt=0)
    group_initial_rebalance_delay_ms: int = Field(
        3000, ge=0, description="Kafka's group.initial.rebalance.delay.ms: wait for more members of a new group."
    )
    group_min_session_timeout_ms: int = Field(6000, gt=0, description="Kafka's group.min.session.timeout.ms.")
    group_max_session_timeout_ms: int = Field(1800000, gt=0, description="Kafka's group.max.session.timeout.ms.")
    group_consumer_session_timeout_ms: int = Field(
        45000, gt=0,
        description="Kafka's group.consumer.session.timeout.ms: a KIP-848 member silent this long is removed.",
    )
    group_consumer_heartbeat_interval_ms: int = Field(
        5000, gt=0, description="Kafka's group.consumer.heartbeat.interval.ms: how often KIP-848 members heartbeat."
    )
    group_consumer_assignors: str = Field(
        "uniform,range", pattern=r"^(uniform|range)(,(uniform|range))*$",
        description="Kafka's group.consumer.assignors: the server-side assignors KIP-848 members may name; the first "
        "is the default.",
    )
    transaction_max_timeout_ms: int = Field(900000, gt=0, description="Kafka's transaction.max.timeout.ms.")
    registry_listen: str = Field(
        "localhost:8081",
        description="HOST:PORT of the embedded Confluent-compatible schema registry ('off': do not serve it).",
    )
    metrics_listen: str = Field(
        "localhost:9644",
        description="HOST:PORT of the metrics listener: Prometheus's /metrics, /healthz and /readyz ('off': do not "
        "serve them). HTTPS with the broker's certificate when a Kafka listener uses TLS; no authentication.",
    )
    registry_url: str | None = Field(
        None, description="An external schema registry (http://HOST:PORT); when set, icelog serves none of its own."
    )
    registry_cache_ttl_ms: int = Field(
        5000, ge=0, description="How long produce-time enforcement trusts a subject's cached latest schema."
    )
    topic_defaults: dict[str, str] = Field(
        default_factory=dict, description="Topic config defaults for new topics, e.g. retention.ms: '86400000'."
    )
    intake: IntakeSettings = Field(default_factory=lambda: IntakeSettings())  # type: ignore[call-arg]
    archive: ArchiveSettings = Field(default_factory=lambda: ArchiveSettings())  # type: ignore[call-arg]
    memory: MemorySettings = Field(default_factory=lambda: MemorySettings())  # type: ignore[call-arg]
    sinks: dict[str, SinkSettings] = Field(
        default_factory=dict, description="External Kafka clusters whose topics icelog archives (`icelog sink`)."
    )

    @field_validator("sinks")
    @classmethod
    def _check_sink_names(cls, value: dict[str, SinkSettings]) -> dict[str, SinkSettings]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
                raise ValueError(f"sink name {name!r}: use letters, digits, '.', '_' and '-' (it names a namespace, "
                                 "a consumer group and a directory)")
        return value

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"listen must be HOST:PORT, got {value!r}")
        return value

    @property
    def listener_specs(self) -> list[Listener]:
        """The Kafka listeners, parsed (the checks ran when the settings loaded)."""
        return parse_listeners(self)

    @property
    def inter_broker_listener(self) -> Listener:
        """The listener the brokers of a cluster reach each other on (the checks ran when the settings loaded)."""
        specs = parse_listeners(self)
        if self.inter_broker_listener_name is not None:
            return next(s for s in specs if s.name == self.inter_broker_listener_name.upper())
        return next((s for s in specs if s.protocol == "PLAINTEXT"), specs[0])

    @property
    def authorizes(self) -> bool:
        """Whether ACLs apply: set explicitly, or on as soon as some listener authenticates its clients."""
        if self.authorizer_enabled is not None:
            return self.authorizer_enabled
        return any(spec.authenticates(self.ssl_client_auth) for spec in self.listener_specs)

    @property
    def super_user_set(self) -> frozenset[str]:
        """super.users as principals ("User:admin"); Kafka separates them with ';' (',' accepted too)."""
        return frozenset(p.strip() for p in self.super_users.replace(",", ";").split(";") if p.strip())

    @property
    def sasl_mechanisms(self) -> tuple[str, ...]:
        return tuple(m.strip().upper() for m in self.sasl_enabled_mechanisms.split(",") if m.strip())

    @model_validator(mode="after")
    def _check_security(self) -> Settings:
        specs = parse_listeners(self)  # raises ValueError with the fix
        unknown = [m for m in self.sasl_mechanisms if m not in SASL_MECHANISMS]
        if unknown:
            raise ValueError(f"sasl_enabled_mechanisms: {', '.join(unknown)} not supported; use some of "
                             f"{', '.join(SASL_MECHANISMS)}")
        principal_rules(self.ssl_principal_mapping_rules)  # raises ValueError with the fix
        if "OAUTHBEARER" in self.sasl_mechanisms and not self.sasl_oauthbearer_jwks_endpoint_url:
            raise ValueError("sasl_enabled_mechanisms has OAUTHBEARER but no sasl_oauthbearer_jwks_endpoint_url: "
                             "name the JWKS file of your identity provider, or drop OAUTHBEARER")
        bad = [p for p in self.super_user_set if not p.startswith("User:") or p == "User:"]
        if bad:
            raise ValueError(f"super_users: {', '.join(bad)} is not a principal; write User:NAME;User:OTHER")
        name = self.inter_broker_listener_name
        if name is not None and name.upper() not in {spec.name for spec in specs}:
            raise ValueError(f"inter_broker_listener_name: {name} is not one of the listeners "
                             f"({', '.join(spec.name for spec in specs)})")
        if any(spec.tls for spec in specs) and (self.ssl_certfile is None or self.ssl_keyfile is None):
            raise ValueError("an SSL or SASL_SSL listener needs ssl_certfile and ssl_keyfile (PEM files)")
        return self

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0] or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @field_validator("registry_listen")
    @classmethod
    def _check_registry_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if value != "off" and (not sep or not port.isdigit()):
            raise ValueError(f"registry_listen must be HOST:PORT or off, got {value!r}")
        return value

    @field_validator("metrics_listen")
    @classmethod
    def _check_metrics_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if value != "off" and (not sep or not port.isdigit()):
            raise ValueError(f"metrics_listen must be HOST:PORT or off, got {value!r}")
        return value

    @property
    def serves_metrics(self) -> bool:
        """Whether this broker serves /metrics, /healthz and /readyz."""
        return self.metrics_listen != "off"

    @property
    def serves_registry(self) -> bool:
        """Whether this broker serves the embedded schema registry."""
        return self.registry_url is None and self.registry_listen != "off"

    @property
    def metadata_url(self) -> str:
        return self.meta_url or f"sqlite:///{self.data_dir / 'meta.db'}"

    @property
    def catalog_uri(self) -> str:
        """The Iceberg catalog URI (embedded default: JDBC on SQLite in the data directory)."""
        return self.archive.catalog_uri or f"jdbc:sqlite:{Path(self.data_dir).resolve() / 'catalog.db'}"

    @property
    def archive_reads_via_kafka(self) -> bool:
        """Whether archive tasks fetch over Kafka (archive.read_via; auto: unless the Spark master is local)."""
        via = self.archive.read_via
        return via == "kafka" or (via == "auto" and not self.archive.spark_master.startswith("local"))

    @property
    def archive_bootstrap(self) -> list[str]:
        """HOST:PORT addresses the archive fetches from: archive.bootstrap_servers, else the first listener's."""
        if self.archive.bootstrap_servers:
            return [a.strip() for a in self.archive.bootstrap_servers.split(",") if a.strip()]
        first = self.listener_specs[0]
        host = first.advertised_host or first.host
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        return [f"{host}:{first.advertised_port or first.port}"]

    @property
    def warehouse(self) -> str:
        return self.archive.warehouse or (Path(self.data_dir).resolve() / "warehouse").as_uri()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) win over the environment, which wins over the YAML file.
        yaml_file = _yaml_file_for_load
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        if yaml_file is not None:
            sources += (YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file),)
        return sources


_yaml_file_for_load: Path | None = None


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from the YAML file (if any), the ICELOG_* environment and explicit overrides."""
    global _yaml_file_for_load
    path = Path(config_file) if config_file else Path(os.environ.get("ICELOG_CONFIG", DEFAULT_CONFIG_FILE))
    if config_file and not path.exists():
        raise ConfigError(f"config file {path} does not exist; create it or drop --config")
    if path.exists():
        try:
            content = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if content is not None and not isinstance(content, dict):
            raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    _yaml_file_for_load = path if path.exists() else None
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            ": ".join(filter(None, (".".join(str(p) for p in err["loc"]), err["msg"].removeprefix("Value error, "))))
            for err in exc.errors()
        )
        where = path if path.exists() else "environment/flags"
        raise ConfigError(f"invalid configuration ({where}): {problems}") from exc
    finally:
        _yaml_file_for_load = None
