"""Gateway settings, read from the environment (prefix ``GATEWAY_``, ``__`` for nesting).

Every field documents its default; the README's configuration table mirrors this file.
Limits refuse values that would disable them (zero, negative) or exceed what the
model repository supports.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.names import DEFAULT_IMAGE_MODEL, DEFAULT_TEXT_MODEL, IMAGE_TASK, MODEL_NAME, TEXT_TASK, VERSION

MiB = 1024 * 1024
# The most predictions a client may ever ask for; each model's own max_top_k (its
# config.pbtxt) lowers it.
TOP_K_CEILING = 1000


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or localhost): reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class TritonSettings(BaseModel):
    """How to reach Triton."""

    url: str = Field(
        "127.0.0.1:8001",
        description="Triton's gRPC endpoint, host:port (GATEWAY_TRITON__URL); several, comma-separated "
        "(host1:8001,host2:8001); or dns:///host:port for every address a name resolves to (a "
        "headless Service), resolved again every 5 s.",
        pattern=r"^(dns:///[A-Za-z0-9.\-\[\]:]+:\d{1,5}|[A-Za-z0-9.\-\[\]:]+:\d{1,5}"
        r"(,[A-Za-z0-9.\-\[\]:]+:\d{1,5})*)$",
    )
    load_balancing: Literal["shortest_queue", "round_robin", "pick_first"] = Field(
        "shortest_queue",
        description="With several Triton replicas: shortest_queue places each call on the one whose "
        "queue should drain first (its calls in flight, at what its calls have been taking; one that "
        "stops answering is taken out and its waiting calls moved), round_robin on the next one up; "
        "with one dns:/// name, round_robin and pick_first are gRPC's own policies over its addresses.",
    )
    timeout_seconds: float = Field(
        10.0, gt=0, le=300, description="Deadline for each inference call to Triton; past it, 504."
    )
    health_timeout_seconds: float = Field(
        1.0, gt=0, le=60, description="Deadline for each health/metadata call (/readyz, /models)."
    )
    probe_interval_seconds: float = Field(
        0.5,
        gt=0,
        le=60,
        description="How often the circuit breaker's background probe asks Triton whether it is ready.",
    )
    probe_timeout_seconds: float = Field(
        1.0, gt=0, le=60, description="Deadline of one probe; a hung Triton fails it and opens the circuit."
    )
    reconnect_backoff_max_seconds: float = Field(
        1.0,
        gt=0,
        le=120,
        description="Longest wait between gRPC reconnection attempts (gRPC's default is 120 s).",
    )
    keepalive_seconds: float = Field(
        10.0,
        ge=1,
        le=3600,
        description="gRPC keepalive ping interval on a busy channel (dead peer detection).",
    )
    metrics_url: str = Field(
        "http://127.0.0.1:8002/metrics",
        description="Triton's Prometheus endpoint, merged into the gateway's /metrics; empty: not merged.",
    )
    metrics_timeout_seconds: float = Field(
        1.0, gt=0, le=30, description="Deadline for reading Triton's metrics during a scrape."
    )
    retry_after_seconds: int = Field(
        5, ge=1, le=3600, description="Retry-After sent with 503 when Triton or a model is unavailable."
    )
    probe_cache_seconds: float = Field(
        0.5,
        ge=0,
        le=10,
        description="How long /readyz, /v2/health/ready and /v2/health/live reuse Triton's last answer "
        "(probes carry no key; concurrent ones share one round of calls).",
    )
    repository_key: SecretStr = Field(
        SecretStr(""),
        description="The key Triton demands for its repository API (tritonserver "
        "--grpc-restricted-protocol=model-repository,...:triton-gateway-admin-key=<key>); empty: none sent.",
    )
    load_timeout_seconds: float = Field(
        300.0, gt=0, le=3600, description="Deadline for loading or unloading a model (admin surface)."
    )
    max_receive_bytes: int = Field(
        64 * MiB,
        ge=1024 * 1024,
        le=2047 * MiB,
        description="Largest answer accepted from Triton (gRPC receive cap): /v2 serves any catalogued "
        "model, whose outputs (logits, embeddings) may be far larger than a top-k answer.",
    )


class ImageLimits(BaseModel):
    """Checks made on every image before it reaches Triton (from bytes and header only)."""

    max_bytes: int = Field(8 * MiB, gt=0, le=256 * MiB, description="Largest encoded image, in bytes.")
    max_images: int = Field(16, ge=1, le=256, description="Most images in one request.")
    max_pixels: int = Field(
        40_000_000, gt=0, le=1_000_000_000, description="Largest width x height, read from the header."
    )
    max_pixels_full_decode: int = Field(
        16_000_000,
        gt=0,
        le=1_000_000_000,
        description=(
            "Largest width x height of a PNG or WebP. The model decodes those at full size "
            "(about 20-30 ms and 12-19 MiB per megapixel), JPEGs scaled down (under 80 ms and 10 MiB at 40 Mpx)."
        ),
    )
    max_side: int = Field(
        16_384, gt=0, le=65_535, description="Largest width or height, read from the header."
    )
    max_frames: int = Field(100, ge=1, le=10_000, description="Most frames in an animated PNG or WebP.")


class TextLimits(BaseModel):
    """Checks made on every text before it reaches Triton."""

    max_chars: int = Field(10_000, ge=1, le=1_000_000, description="Most characters in one text (after NFC).")
    max_texts: int = Field(
        64,
        ge=1,
        le=4096,
        description="Most texts in one request; each model's max_batch_size lowers it.",
    )
    max_candidate_labels: int = Field(32, ge=1, le=256, description="Most candidate_labels in one request.")
    max_label_chars: int = Field(100, ge=1, le=1000, description="Most characters in one candidate label.")


class AdaptiveSettings(BaseModel):
    """Each model's in-flight limit, computed from what Triton's own statistics say its
    batches cost (gateway.serving.queuegate): the batch worth making running and
    ``queue_target_batches`` of it waiting in Triton, the rest held in the gateway's fair
    queue; every model together under ``server.max_in_flight``."""

    enabled: bool = Field(
        True,
        description="Gate each model on what Triton's statistics say its batches cost "
        "(max_in_flight the ceiling of all together); false: max_in_flight, always "
        "(docs/explanation/reliability.md).",
    )
    floor: int = Field(
        8,
        ge=1,
        le=10_000,
        description="The fewest requests a model's gate lets into Triton at once (max_in_flight "
        "at most): a few clients sending back to back are never refused for want of room in "
        "Triton, whatever the batches measured (a light load's batches of 1 and 2 read as "
        "batching gaining nothing, a gate of 2-4); 1: the gate alone.",
    )
    queue_target_batches: float = Field(
        1.0,
        gt=0,
        le=100,
        description="The batches (each one worth making) a model's requests "
        "may have waiting in Triton behind the one running; more: more throughput where deeper "
        "queues pay, at their latency.",
    )
    batch_efficiency: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="The batch worth making is the smallest that delivers this share "
        "of the most a model's batches can (its requests a second); lower: smaller batches and a shorter "
        "queue in Triton, for less throughput where batching pays.",
    )
    statistics_interval_seconds: float = Field(
        0.25,
        gt=0,
        le=60,
        description="How often Triton's statistics are read while requests are sent.",
    )


class TierSettings(BaseModel):
    """What a key's tier (``tier=`` in the keys file) gives it when requests wait."""

    share: float = Field(
        1.0,
        gt=0,
        le=1000,
        description="Its weight in the in-flight limit when keys contend: a key of share 4 holds "
        "4 slots for a share-1 key's 1 while both wait; idle slots are borrowed freely.",
    )
    priority: int = Field(
        0,
        ge=0,
        le=100,
        description="Waiting requests of a higher priority are admitted first (strictly: a "
        "flood of a higher tier waits out a lower one).",
    )


class ServerSettings(BaseModel):
    """How the gateway protects itself: admission, timeouts, connection cap, shutdown."""

    max_in_flight: int = Field(
        64,
        ge=1,
        le=100_000,
        description="Inference requests (/classify) handled at once, at most (the ceiling of every "
        "model's gate together); more wait up to queue_seconds, then get 503 overloaded with Retry-After.",
    )
    adaptive: AdaptiveSettings = Field(default_factory=AdaptiveSettings)
    queue_seconds: float = Field(
        0.1, ge=0, le=30, description="How long a request may wait for an in-flight slot before 503."
    )
    retry_after_seconds: int = Field(
        1,
        ge=1,
        le=3600,
        description="Retry-After sent with 503 shutting-down, and the least sent with 503 overloaded.",
    )
    retry_after_max_seconds: int = Field(
        10,
        ge=1,
        le=3600,
        description="The most Retry-After sent with 503 overloaded. Between the two: when the queue ahead "
        "will have drained at the measured completion rate, each refused caller told a later second than "
        "the one before once a second's completions are promised (no herd comes back at once).",
    )
    shed_from_headers: bool = Field(
        True,
        description="Refuse a request that would be shed (a queue at least the limit deep that the "
        "recent completion rate cannot serve within queue_seconds) from its headers, before its body "
        "is read, on every door: its 503 comes in milliseconds instead of after its upload and the "
        "queue wait. A small body is read away after the answer and the connection kept; a retry that "
        "comes at once on the same connection is held, twice as long each time, up to "
        "retry_after_seconds (gateway.serving.retries). false: requests wait for a slot up to "
        "queue_seconds, bodies read. Requests with Expect: 100-continue and a draining gateway are "
        "always refused unread.",
    )
    shed_at_head: bool = Field(
        True,
        description="With shed_from_headers, a classify, /v2 inference or /v1 task request that would be "
        "shed is refused in the "
        "HTTP protocol once its head is parsed, with the answer its route gives (the same problem, "
        "headers, hold, metrics and access-log line), before any task, middleware or route runs: about "
        "a third of the gateway CPU a refusal costs through the route (docs/explanation/reliability.md). "
        "Callers that need the whole pipeline first (a token, a certificate, a key with a rate or quotas), "
        "a prediction log, tracing and CORS still go the route's way. false: every refusal goes through "
        "the route.",
    )
    max_connections: int = Field(
        2048,
        ge=16,
        le=1_000_000,
        description="Open connections (and requests) uvicorn accepts; past it, a bare 503 (last backstop).",
    )
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="A connection that has not sent a full request head by then is closed; a gRPC "
        "call's message that is not an inference (64 KiB at most) not received by then is refused "
        "DEADLINE_EXCEEDED.",
    )
    max_head_bytes: int = Field(
        64 * 1024,
        ge=4 * 1024,
        le=1024 * 1024,
        description="A request head (request line and headers) larger than this is answered 431 before "
        "it ends and the connection closed (the rest read away as a refused body's); nothing of a head "
        "past it is kept.",
    )
    max_headers: int = Field(
        100,
        ge=16,
        le=10_000,
        description="Header fields a request head (or a chunked body's trailers) may have; past it, "
        "431 and the connection closed (Apache's and Envoy's default too). Each field costs every "
        "layer that reads the headers a step: 12,000 fields in 60 KB cost 10 ms of CPU against 1 ms.",
    )
    min_chunk_bytes: int = Field(
        1024,
        ge=1,
        le=1024 * 1024,
        description="A chunked request body may come in 64 chunks plus one for every this many bytes "
        "of it; past that it is answered 400 and the connection closed, the rest never parsed (each "
        "chunk costs the parser a step: 1-byte chunks cost the gateway ~100x the CPU of the same "
        "bytes in one piece). Its framing (size lines and their extensions) may take 64 bytes a chunk "
        "beyond its data and max_head_bytes for its trailers; past that, the same 400.",
    )
    max_pipelined: int = Field(
        16,
        ge=1,
        le=1024,
        description="Requests a client may pipeline behind the one being answered on a connection; "
        "the next stops the parser: the last one waiting is answered with Connection: close and the "
        "connection closes after it, the rest never parsed (the client resends it on a new connection).",
    )
    linger_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="A request answered before its body was read (401, 404, a 503 or 413 from its "
        "headers) has this long from its answer, counted once (no byte extends it), for the rest of "
        "its body to arrive, which is read and discarded (up to the largest body): the connection is "
        "kept if it ends in time, closed otherwise; an answer that closes the connection is sent first "
        "and its socket lingers as long, so the client reads its answer instead of meeting a reset.",
    )
    body_timeout_seconds: float = Field(
        30.0, gt=0, le=3600, description="A request body not fully received by then is answered 408."
    )
    keep_alive_seconds: float = Field(
        5.0, gt=0, le=300, description="Idle keep-alive connections are closed after this."
    )
    send_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="An answer the client takes nothing of for this long (its socket's buffers "
        "full, the gateway's writing paused) ends the connection, what was unsent dropped: a client "
        "that reads nothing cannot hold a connection (it is reset: the kernel drops its unsent bytes "
        "too). A client that takes some of it in time keeps it, as nginx's send_timeout does, up to "
        "max_connection_age_seconds.",
    )
    max_connections_per_address: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="Connections one client address (an IPv6 client's /64) may hold at once; the next "
        "is answered 429 too-many-connections at once and closed. One address, however fast it renews "
        "its sockets, never holds the whole door (max_connections). Behind a proxy every client has the "
        "proxy's address: raise it to max_connections there.",
    )
    max_connection_age_seconds: float = Field(
        1800.0,
        gt=0,
        le=604_800,
        description="Every connection ends at this age whatever it sends or takes: idle, it closes; "
        "with a request under way, its answer says Connection: close and the connection closes after "
        "it, cut triton.timeout_seconds later if still open (as the gRPC door's "
        "grpc.max_connection_age_seconds). The one bound on a client that keeps taking its answers "
        "just fast enough for the send deadline.",
    )
    heap_keep_bytes: int = Field(
        128 * MiB,
        ge=0,
        le=64 * 1024 * MiB,
        description="Freed C heap the process keeps for the next requests instead of giving it back "
        "(glibc; blocks under 4 MiB come from the heap): an image buffer reuses pages already mapped "
        "instead of faulting them in again (about 0.9 ms of an 8-image request's CPU). RSS stays up to "
        "this much above what is in use after a peak; 0: glibc's defaults.",
    )
    max_body_bytes_in_flight: int = Field(
        256 * MiB,
        ge=1 * MiB,
        le=64 * 1024 * MiB,
        description="Body bytes the gateway holds at once for requests being read (memory and "
        "multipart spool together, counted after decompression); a request that does not fit gets "
        "503 overloaded before its body is read. Size it to the container: a request's parse and "
        "decode can take about 3x its body, so 256 MiB fits a 1 GiB pod.",
    )
    max_json_values: int = Field(
        65_536,
        ge=1024,
        le=16_777_216,
        description="Most values (numbers, strings, lists, objects) in one /v2 JSON body; a "
        "larger tensor goes in the binary extension, as tritonclient sends it.",
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop",
        description="The event loop uvicorn runs the gateway on: uvloop (libuv's; 0.05 ms less CPU per "
        "text request, 0.12 ms per JPEG, measured) or the standard library's asyncio.",
    )
    drain_delay_seconds: float = Field(
        0.0,
        ge=0,
        le=60,
        description="On SIGTERM, how long /readyz says 503 while new requests are still served, "
        "before the drain starts: time for a load balancer's health checks to take this replica "
        "out (the compose stack's HAProxy: 5 s; Kubernetes uses a preStop sleep instead).",
    )
    shutdown_grace_seconds: float = Field(
        20.0,
        gt=0,
        le=3600,
        description="On SIGTERM: /readyz turns 503, new inference requests get 503, and requests in "
        "flight get this long to finish (longer than the Triton deadline).",
    )


# Asymmetric JWS algorithms only: an HMAC one would take a provider's public key as its
# secret (algorithm confusion), and "none" signs nothing.
TOKEN_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class OidcIssuerSettings(BaseModel):
    """One OpenID Connect provider whose access tokens (JWTs) the gateway takes."""

    issuer: str = Field(description="The provider's issuer URL, exactly as its tokens' `iss` claim says.")
    audience: str = Field(description="The `aud` a token must carry to be taken (the gateway's resource).")
    name: str = Field(
        "",
        pattern=r"^([a-z][a-z0-9-]{0,31})?$",
        description="The namespace of this issuer's tenants (`<name>:<tenant>` in quotas, rates, shares, "
        "metrics and logs: never an API key's id, a certificate's or another issuer's tenant); empty: "
        "`oidc-` and 8 hex digits of the issuer URL's SHA-256.",
    )
    algorithms: list[str] = Field(
        default_factory=lambda: ["RS256", "ES256", "PS256"],
        description=f"Signature algorithms taken, of {', '.join(TOKEN_ALGORITHMS)} (never HMAC, never none).",
    )
    jwks_uri: str = Field("", description="The provider's key set; empty: read from its discovery document.")
    tenant_claim: str = Field(
        "azp",
        description="The claim naming the tenant (metrics, logs, shares, quotas); `client_id`, then "
        "`sub` when it is absent. Use a claim with few values (a client id, not a user's id).",
    )
    tier_claim: str = Field(
        "", description="The claim naming the tier (one of GATEWAY_TIERS); empty: standard."
    )
    models_claim: str = Field(
        "",
        description="The claim listing the models the token may use (a list, or names separated by "
        "spaces; shell patterns allowed); empty or absent: every model.",
    )
    require_models_claim: bool = Field(
        False,
        description="A token without models_claim is refused (401) instead of given every model.",
    )
    tiers: list[str] = Field(
        default_factory=list,
        description="The tiers this issuer's tokens may claim (tier_claim); a tier outside them is "
        "standard. Empty: any of GATEWAY_TIERS.",
    )
    metric_tenants: list[str] = Field(
        default_factory=list,
        description="Tenants named in metrics as `<name>:<tenant>`; every other tenant of this issuer "
        "is counted under `<name>:*` (one series, however many tenants the provider mints).",
    )
    rate: float | None = Field(
        None, gt=0, description="Requests a second each tenant may send; unset: no rate."
    )
    quota: str = Field(
        "",
        pattern=r"^([0-9]{1,15}/(day|month))?$",
        description="Requests each tenant may send per UTC day or month ('2000/day'), as a keys-file "
        "line's quota=; empty: none.",
    )
    image_quota: str = Field(
        "", pattern=r"^([0-9]{1,15}/(day|month))?$", description="Images per day or month, as image-quota=."
    )
    burst: float | None = Field(None, ge=1, description="Its burst; unset: the rate.")
    leeway_seconds: float = Field(30.0, ge=0, le=300, description="Clock skew allowed on exp and nbf.")

    @property
    def namespace(self) -> str:
        """The prefix of this issuer's tenant ids."""
        return self.name or "oidc-" + hashlib.sha256(self.issuer.encode()).hexdigest()[:8]

    @model_validator(mode="after")
    def _asymmetric(self) -> OidcIssuerSettings:
        unknown = [a for a in self.algorithms if a not in TOKEN_ALGORITHMS]
        if unknown or not self.algorithms:
            raise ValueError(f"algorithms must be some of {', '.join(TOKEN_ALGORITHMS)}; not {unknown}")
        return self


class AuthSettings(BaseModel):
    """Who may call the gateway (off unless a keys file or a token issuer is given)."""

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            ipaddress.ip_network(network, strict=False)  # ValueError names it
        return value

    oidc: list[OidcIssuerSettings] = Field(
        default_factory=list,
        description="OpenID Connect providers whose access tokens (`Authorization: Bearer <JWT>`) "
        "are taken beside API keys (JSON list of {issuer, audience, ...}).",
    )

    @field_validator("oidc")
    @classmethod
    def _namespaces(cls, value: list[OidcIssuerSettings]) -> list[OidcIssuerSettings]:
        spaces = [issuer.namespace for issuer in value]
        if len(set(spaces)) != len(spaces) or "cert" in spaces:
            raise ValueError(f"each issuer needs a namespace of its own, and none is 'cert': {spaces}")
        return value

    unlisted_certificates: Literal["allow", "refuse"] = Field(
        "allow",
        description="A client certificate (gRPC mTLS or a trusted proxy's XFCC) the keys file has no "
        "`cert:<name> -` line for: allow (a tenant of its own, every model, no limit) or refuse (401).",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses or networks (CIDR, JSON list) of the proxies that terminate client TLS "
        "in front of the gateway (Envoy, Istio): from them only, Envoy's x-forwarded-client-cert "
        "(an HTTP header or gRPC metadata) names the caller as a client certificate does on the gRPC "
        "door; from anyone else it is ignored.",
    )
    jwks_refresh_seconds: float = Field(
        300.0,
        ge=10,
        le=86400,
        description="How often each provider's key set is read again (a key it dropped stops working then).",
    )
    jwks_min_refresh_seconds: float = Field(
        10.0,
        ge=1,
        le=3600,
        description="A token naming a key id the gateway does not hold reads the provider's key set "
        "at once (a rotation), at most this often (a flood of invented ids costs one read).",
    )

    keys_file: Path | None = Field(
        None,
        description="File of API keys, one '<id> <sha256 hex> [<rate/s> [<burst>]]' a line "
        "(see `triton-gateway hash-key`); unset: no authentication.",
    )
    protect_metrics: bool = Field(
        True,
        description="With a keys file: /metrics needs a key too (it names client key ids; Prometheus "
        "scrapes with a key of its own). False: /metrics is open to anyone who reaches the port.",
    )
    metrics_readers: list[str] = Field(
        default_factory=lambda: ["prometheus"],
        description="With protect_metrics: the caller ids that may read /metrics (it names every client "
        "and model), by default the key `make keys` writes for Prometheus; any other key is 403. Empty: "
        "any known caller.",
    )
    protect_docs: bool = Field(False, description="Require a key for /docs, /redoc and /openapi.json too.")
    cors_origins: list[str] = Field(
        default_factory=list, description="Origins allowed by CORS (JSON list); empty: CORS off."
    )
    reload_seconds: float = Field(
        1.0,
        gt=0,
        le=60,
        description="How often the API keys and admin keys files are checked for changes (a rotated "
        "Kubernetes Secret, a rewritten file).",
    )
    on_invalid_keys_file: Literal["refuse", "keep"] = Field(
        "refuse",
        description="When a changed keys file does not parse (gateway_keys_file_valid 0, an alert): "
        "'refuse' accepts no key until it parses (a rotation that revokes a leaked key never leaves "
        "it working); 'keep' keeps the previous keys in force (availability first).",
    )
    allow_anonymous: bool = Field(
        False,
        description="Let `triton-gateway serve` run on a non-loopback address with no keys file: "
        "anyone who reaches the port can classify. Off: such a start is refused.",
    )


class RedisSettings(BaseModel):
    """Shared state across replicas (off unless a URL is given): per-key rate limits and run-time
    routing (version pins) live in Redis, so every replica applies the same ones."""

    url: SecretStr | None = Field(
        None,
        description="redis:// or rediss:// URL (with its password: redis://:PASSWORD@host:6379/0); "
        "unset: every replica keeps its own limits and pins.",
    )
    prefix: str = Field(
        "triton-gateway", pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="Prefix of every Redis key used."
    )
    on_failure: Literal["local", "refuse", "allow"] = Field(
        "local",
        description="While Redis does not answer: 'local' limits each key per replica at rate/replicas; "
        "'refuse' answers 503 to rate-limited keys; 'allow' lets every request through unlimited.",
    )
    replicas: int = Field(
        2, ge=1, le=1000, description="Replicas sharing the limits: the divisor of the 'local' policy."
    )
    timeout_seconds: float = Field(
        0.05, gt=0, le=5, description="Longest wait for one Redis command; past it the policy applies."
    )
    connect_timeout_seconds: float = Field(0.25, gt=0, le=10, description="Longest wait to connect.")
    retry_seconds: float = Field(
        1.0,
        gt=0,
        le=60,
        description="After a failure, the policy applies for this long before Redis is tried again.",
    )
    routing_poll_seconds: float = Field(
        0.5, gt=0, le=10, description="How often run-time routing (pins) is read back from Redis."
    )
    max_connections: int = Field(32, ge=1, le=1024, description="Connection pool size per process.")


class AdminSettings(BaseModel):
    """The model-control surface: Triton's repository API for operators (off unless a keys
    file is given). Its keys are not client keys: neither opens the other's routes."""

    keys_file: Path | None = Field(
        None,
        description="File of admin keys, in the format of auth.keys_file; unset: no admin surface (404).",
    )
    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Serve /admin on its own listener (admin.host:port) and nowhere else; unset: on the "
        "main port.",
    )
    host: str = Field("127.0.0.1", description="Address of the admin listener (with admin.port).")


class TracingSettings(BaseModel):
    """OpenTelemetry tracing (off unless enabled): spans to an OTLP/HTTP collector, and the
    W3C ``traceparent`` passed on to Triton."""

    enabled: bool = Field(False, description="Record spans and send them to `endpoint`.")
    endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces",
        pattern=r"^https?://[^\s]+$",
        description="OTLP/HTTP traces URL of the collector (Triton is pointed at the same one).",
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of new traces recorded; with trust_inbound, a caller's sampled flag wins.",
    )
    trust_inbound: bool = Field(
        False,
        description="Continue a caller's trace (its traceparent, sampled flag included: it then "
        "forces a trace here and in Triton). Off: every request starts a trace of its own, sampled "
        "at sample_ratio, so no client chooses what is traced; turn it on behind a proxy you trust.",
    )
    service_name: str = Field("triton-gateway", min_length=1, description="service.name of the spans.")
    export_delay_seconds: float = Field(
        1.0, gt=0, le=60, description="Longest wait before queued spans are sent in a batch."
    )
    export_timeout_seconds: float = Field(
        5.0, gt=0, le=60, description="Deadline of one export (off the request path)."
    )
    max_queued_spans: int = Field(
        8192, ge=64, le=1_000_000, description="Spans held while the collector is slow; more are dropped."
    )


class PredictionSettings(BaseModel):
    """What the gateway records of the models' answers (gateway_prediction_* metrics)."""

    confidence_floor: float = Field(
        0.5,
        ge=0,
        le=1,
        description="A top-1 score under this counts in gateway_prediction_low_confidence_total.",
    )
    confidence_floors: dict[str, float] = Field(
        default_factory=dict,
        description="Per-model floors overriding confidence_floor (JSON object, model -> floor in [0, 1]): "
        "a 1000-class image model and a 2-class sentiment model are not confident at the same score.",
    )

    @model_validator(mode="after")
    def _floors(self) -> PredictionSettings:
        for model, floor in self.confidence_floors.items():
            if not 0 <= floor <= 1:
                raise ValueError(f"confidence_floors[{model!r}] must be between 0 and 1")
        return self

    def floor(self, model: str) -> float:
        return self.confidence_floors.get(model, self.confidence_floor)


class DriftSettings(BaseModel):
    """Drift of each classifier's answers against its reference (gateway_prediction_drift)."""

    window_seconds: float = Field(
        600, ge=10, le=7 * 86400, description="The live window: answers of the last this many seconds."
    )
    slot_seconds: float = Field(
        15,
        ge=1,
        le=3600,
        description="The window slides by slots this long (kept in Redis as one hash each).",
    )
    window_inputs: int = Field(
        0,
        ge=0,
        le=100_000_000,
        description="With a value: the window is only the newest slots that reach this many inputs "
        "(a count window inside the time window); 0: the whole time window.",
    )
    min_inputs: int = Field(
        100,
        ge=10,
        le=10_000_000,
        description="Fewer inputs in the window: no drift is reported; fewer in a capture: refused (409).",
    )
    interval_seconds: float = Field(
        5, ge=0.2, le=600, description="How often counts are shared and the distances recomputed."
    )
    quantile: float = Field(
        0.99,
        gt=0.5,
        lt=1,
        description="gateway_prediction_drift_threshold is this quantile of the distance between "
        "samples of the reference itself (how rarely chance alone crosses it).",
    )
    max_labels: int = Field(
        2000,
        ge=10,
        le=100_000,
        description="Distinct top-1 labels counted by name per model and process; later ones count as '(other)'.",
    )
    reference_dir: str = Field(
        "",
        description="Without Redis: the directory where captured references are kept across restarts "
        "(empty: in memory only). With Redis, references live in Redis, for every replica, and this "
        "is not used.",
    )

    @model_validator(mode="after")
    def _slots(self) -> DriftSettings:
        if self.slot_seconds > self.window_seconds:
            raise ValueError("slot_seconds must not exceed window_seconds")
        if self.window_seconds / self.slot_seconds > 1000:
            raise ValueError("a window of over 1000 slots: raise slot_seconds")
        return self


class PredictionLogSettings(BaseModel):
    """A sampled log of the models' answers (off unless a URL and a rate are given)."""

    url: SecretStr = Field(
        SecretStr(""),
        description="Where records go: http(s):// (CloudEvents in KServe's payload-logger format), "
        "redis(s)://[:PASSWORD@]host:port/db (a Redis Stream per model; `triton-gateway predictions "
        "export` reads them back) or file:///path (JSON lines); empty: no log.",
    )
    sample_rate: float = Field(0.0, ge=0, le=1, description="Share of answered requests logged (0: none).")
    key_sample_rates: dict[str, float] = Field(
        default_factory=dict,
        description="Per API key id, a sample rate overriding sample_rate (JSON object, key id -> rate "
        "in [0, 1]): all of a new integration's traffic, none of a noisy batch job's.",
    )
    capture_inputs: bool = Field(
        False,
        description="Also log each input itself (images base64, texts as sent) when it is at most "
        "max_captured_bytes; off: a digest and a size only. Mind what your inputs may hold.",
    )
    max_captured_bytes: int = Field(
        64 * 1024, ge=1, le=8 * MiB, description="With capture_inputs: larger inputs keep their digest only."
    )
    stream_prefix: str = Field(
        "triton-gateway:predictions",
        pattern=r"^[A-Za-z0-9_:.\-]{1,100}$",
        description="Redis sink: each model's stream is <prefix>:<model>.",
    )
    max_stream_length: int = Field(
        100_000, ge=100, le=100_000_000, description="Redis sink: records kept per model's stream (about)."
    )
    failure_sample_rate: float = Field(
        1.0, ge=0, le=1, description="Share of refused or failed requests logged (with a URL)."
    )
    max_queued: int = Field(
        1000, ge=1, le=1_000_000, description="Records waiting for the sink; past it, records are dropped."
    )
    timeout_seconds: float = Field(2.0, gt=0, le=60, description="Deadline of one send to an HTTP sink.")
    max_file_bytes: int = Field(
        64 * MiB,
        ge=1024,
        le=64 * 1024 * MiB,
        description="A file sink is rotated to <file>.1 past this size.",
    )
    source: str = Field(
        "triton-gateway", min_length=1, max_length=200, description="ce-source of the events."
    )

    @model_validator(mode="after")
    def _log(self) -> PredictionLogSettings:
        url = self.url.get_secret_value()
        if url and not re.fullmatch(r"(https?|rediss?|file)://\S+", url):
            raise ValueError("url must be http(s)://, redis(s):// or file:// (or empty)")
        for key, rate in self.key_sample_rates.items():
            if not 0 <= rate <= 1:
                raise ValueError(f"key_sample_rates[{key!r}] must be between 0 and 1")
        return self


class GrpcSettings(BaseModel):
    """The gRPC door: Triton's GRPCInferenceService served by the gateway (off unless a port)."""

    port: int = Field(
        0, ge=0, le=65535, description="Port of the gRPC door (KServe v2 GRPCInferenceService); 0: off."
    )
    host: str = Field(
        "",
        description="Address the gRPC door listens on; empty: the HTTP port's (without API keys, a "
        "non-loopback address is refused at start, as for the HTTP port).",
    )
    grace_seconds: float = Field(
        5.0, ge=0, le=300, description="At shutdown, how long calls in flight may finish."
    )
    max_concurrent_calls: int = Field(
        64,
        ge=1,
        le=100_000,
        description="Calls the gRPC door runs at once; more are refused at once with RESOURCE_EXHAUSTED "
        "before their message is handled. gRPC reads a whole message before the call starts, so the "
        "door holds at most this many messages (each up to the largest OIP request) at a time.",
    )
    max_streams_per_connection: int = Field(
        32,
        ge=1,
        le=10_000,
        description="HTTP/2 streams one client connection may have open at once (gRPC's "
        "max_concurrent_streams): one connection cannot take every call slot by itself.",
    )
    max_connections: int = Field(
        2048,
        ge=16,
        le=1_000_000,
        description="Client connections the gRPC door holds at once; past it, a new one is closed at "
        "once. A connection that has not finished its handshake (TLS, the HTTP/2 preface and "
        "SETTINGS) within server.header_timeout_seconds is closed.",
    )
    max_health_watches: int = Field(
        8,
        ge=1,
        le=10_000,
        description="Health-service Watch streams (which anyone may open, and which stay open) at once; "
        "past it, RESOURCE_EXHAUSTED at once. It bounds the door's calls that callers without a key "
        "can hold; Check (what probes call) is not counted with them.",
    )
    compressed_messages: bool = Field(
        False,
        description="Take request messages sent compressed (gzip, deflate; tritonclient's "
        "compression_algorithm). Off by default: gRPC inflates a message whole, up to the door's "
        "largest, before the gateway can look at it, so 40 KB on the wire makes 40 MiB in memory. "
        "Off, a compressed call is refused UNIMPLEMENTED before it is inflated; turn it on where "
        "every client is trusted.",
    )
    idle_seconds: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="A connection with no call open this long is told to go (GOAWAY); pings do not "
        "extend it, and gRPC clients reconnect on their next call.",
    )
    max_connection_age_seconds: float = Field(
        1800.0,
        gt=0,
        le=604_800,
        description="Every connection is told to go at this age whatever it does, its calls in flight "
        "given triton.timeout_seconds to end (clients reconnect: behind a balancer they spread anew).",
    )
    tls_cert_file: Path | None = Field(
        None, description="The door's certificate chain (PEM): the door speaks TLS. Unset: plaintext."
    )
    tls_key_file: Path | None = Field(None, description="The private key of tls_cert_file (PEM).")
    client_ca_file: Path | None = Field(
        None,
        description="CA certificates (PEM) the door requires client certificates from: a call "
        "without one signed by them never starts. The certificate's subject common name (else "
        "its first DNS or URI SAN) names the tenant; a keys-file line with that id gives its "
        "tier, rate, quotas and models (no key needed).",
    )

    @model_validator(mode="after")
    def _tls_pairs(self) -> GrpcSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError(
                "client_ca_file needs tls_cert_file and tls_key_file (client certificates need TLS)"
            )
        return self


class OpenAISettings(BaseModel):
    """The task APIs of other servers (/v1/classify, /v1/embeddings, /v1/models)."""

    embedding_models: list[str] = Field(
        default_factory=lambda: ["text_embedder"],
        description="Models POST /v1/embeddings serves (JSON list): each takes TEXT (BYTES, one text "
        "a row) and answers embedding_output.",
    )
    embedding_output: str = Field(
        "EMBEDDING", pattern=r"^[A-Za-z0-9_.\-]{1,64}$", description="The embedding models' output tensor."
    )

    @model_validator(mode="after")
    def _names(self) -> OpenAISettings:
        for name in self.embedding_models:
            if not re.fullmatch(MODEL_NAME, name):
                raise ValueError(f"embedding_models: {name!r} is not a model name")
        return self


class Settings(BaseSettings):
    """Everything the gateway can be told. Environment: GATEWAY_<FIELD>, GATEWAY_<GROUP>__<FIELD>."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    host: str = Field("0.0.0.0", description="Address `triton-gateway serve` listens on.")
    port: int = Field(8080, ge=1, le=65535, description="Port `triton-gateway serve` listens on.")
    image_model: str = Field(
        DEFAULT_IMAGE_MODEL,
        description="The image classifier POST /classify uses; empty: /classify takes no images "
        "(other image classifiers stay reachable at /models/{model}/classify).",
    )
    image_model_version: str = Field(
        "",
        pattern=rf"^({VERSION})?$",
        description="Version pin of image_model at start; empty: Triton's latest.",
    )
    text_model: str = Field(
        DEFAULT_TEXT_MODEL,
        description="The text classifier POST /classify uses; empty: /classify takes no texts.",
    )
    text_model_version: str = Field(
        "",
        pattern=rf"^({VERSION})?$",
        description="Version pin of text_model at start; empty: Triton's latest.",
    )
    expose: list[str] = Field(
        default_factory=lambda: ["*"],
        description="Name patterns (fnmatch, JSON list) of the classifiers the gateway exposes: "
        "every model whose config.pbtxt has a gateway_task parameter and matches one.",
    )
    hide: list[str] = Field(
        default_factory=list,
        description="Name patterns (JSON list) never exposed, even when `expose` matches.",
    )
    catalog_refresh_seconds: float = Field(
        2.0,
        ge=0.2,
        le=3600,
        description="How often the model catalog is read again from Triton (also right after "
        "every /admin load, reload and unload).",
    )
    default_top_k: int = Field(
        5, ge=1, le=TOP_K_CEILING, description="Predictions per input when not asked (at most the model's)."
    )
    max_top_k: int = Field(
        20,
        ge=1,
        le=TOP_K_CEILING,
        description="Largest top_k a client may ask for; each model's own max_top_k lowers it.",
    )
    max_body_bytes: int = Field(
        32 * MiB,
        gt=0,
        le=1024 * MiB,
        description="Largest multipart body; a base64 JSON body may be 4/3 of this (plus 64 KiB).",
    )
    triton: TritonSettings = Field(default_factory=TritonSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    predictions: PredictionSettings = Field(default_factory=PredictionSettings)
    prediction_log: PredictionLogSettings = Field(default_factory=PredictionLogSettings)
    drift: DriftSettings = Field(default_factory=DriftSettings)
    openai: OpenAISettings = Field(default_factory=OpenAISettings)
    grpc: GrpcSettings = Field(default_factory=GrpcSettings)
    tiers: dict[str, TierSettings] = Field(
        default_factory=lambda: {"standard": TierSettings()},
        description='Key tiers by name (JSON: {"gold": {"share": 4, "priority": 1}, ...}); '
        "'standard' (share 1, priority 0) is every key's unless its line says tier=<name>.",
    )
    v2_models: list[str] = Field(
        default_factory=list,
        description="Models the /v2 Open Inference Protocol routes expose besides the catalog's "
        "classifiers (JSON list of names, e.g. an embedder). Any other model is 404 there.",
    )
    image: ImageLimits = Field(default_factory=ImageLimits)
    text: TextLimits = Field(default_factory=TextLimits)
    shadow_in_flight: int = Field(
        4,
        ge=1,
        le=256,
        description="Shadow requests of rollouts running at once (outside admission); past it, or "
        "while the gateway sheds load, shadows are dropped and counted.",
    )
    check_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Worker threads for CPU-heavy checks of large bodies (JSON parsing, base64, "
        "image headers), so no request holds the event loop.",
    )
    docs_enabled: bool = Field(True, description="Serve /docs, /redoc and /openapi.json.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as plain text or one JSON object a line (for log shippers)."
    )
    log_flush_seconds: float = Field(
        0.25,
        ge=0,
        le=10,
        description="The access log's lines are written to stderr in batches at most this far "
        "apart (0: each line at once). Any other line is written at once, with the access lines "
        "before it. A process killed with SIGKILL loses at most this much of its access log.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.default_top_k > self.max_top_k:
            raise ValueError("default_top_k must not exceed max_top_k")
        if self.image.max_bytes > self.max_body_bytes:
            raise ValueError("image.max_bytes must not exceed max_body_bytes")
        if self.admin.port is not None and self.admin.port == self.port:
            raise ValueError("admin.port must differ from port")
        if self.server.shutdown_grace_seconds <= self.triton.timeout_seconds:
            raise ValueError(
                "server.shutdown_grace_seconds must exceed triton.timeout_seconds, "
                "or a request in flight at SIGTERM could be cut off"
            )
        if "standard" not in self.tiers:
            raise ValueError("tiers must define 'standard', every key's tier unless its line names one")
        if any(not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name) for name in self.tiers):
            raise ValueError("a tier's name is lower-case letters, digits, '_' and '-', at most 32")
        if len(self.tiers) > 16:
            raise ValueError("at most 16 tiers (each is a metric label)")
        return self

    @property
    def grpc_host(self) -> str:
        """Where the gRPC door listens: its own address, else the HTTP port's."""
        return self.grpc.host or self.host

    def exposure_problem(self, host: str) -> str | None:
        """Why serving on ``host`` as configured would be open to anyone who reaches it, or
        None: a non-loopback address with no keys file is refused unless the operator
        wrote the choice down (auth.allow_anonymous)."""
        if (
            self.auth.keys_file is not None
            or self.auth.oidc
            or self.auth.allow_anonymous
            or is_loopback(host)
        ):
            return None
        return (
            f"refusing to serve on {host} with no API keys: anyone who reaches the port could classify. "
            "Set GATEWAY_AUTH__KEYS_FILE (see `triton-gateway hash-key`), listen on 127.0.0.1, "
            "or set GATEWAY_AUTH__ALLOW_ANONYMOUS=true to serve without keys on purpose"
        )

    @property
    def admin_listener_port(self) -> int | None:
        """The port of /admin's own listener, when the admin surface is on and has one."""
        return self.admin.port if self.admin.keys_file is not None else None

    def default_models(self) -> dict[str, str]:
        """Task -> the model POST /classify uses for it (none: that kind is not taken there)."""
        chosen = {IMAGE_TASK: self.image_model, TEXT_TASK: self.text_model}
        return {task: name for task, name in chosen.items() if name}

    def default_pins(self) -> dict[str, str]:
        """The version pins at start (model -> version)."""
        pins = {self.image_model: self.image_model_version, self.text_model: self.text_model_version}
        return {name: version for name, version in pins.items() if name and version}

    @property
    def max_json_body_bytes(self) -> int:
        """Base64 grows data by 4/3; leave room for the JSON around it."""
        return -(-self.max_body_bytes * 4 // 3) + 64 * 1024

    def list_caps(self) -> dict[str, int]:
        """The most items each list field of a JSON /classify body may hold."""
        return {
            "images": self.image.max_images,
            "texts": self.text.max_texts,
            "candidate_labels": self.text.max_candidate_labels,
        }

    @property
    def max_text_body_bytes(self) -> int:
        """The largest JSON body a text request can need: every text and label at its cap,
        each character written as a JSON escape (12 bytes for a surrogate pair), plus room."""
        chars = self.text.max_texts * self.text.max_chars
        chars += self.text.max_candidate_labels * self.text.max_label_chars
        return chars * 12 + 64 * 1024
