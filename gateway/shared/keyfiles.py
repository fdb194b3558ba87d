"""Keys files watched while serving: a rotated key applies without a restart.

A Kubernetes Secret volume swaps a symlink atomically; a plain file is rewritten in place.
Either way the file's bytes change, so the ring reads the file every
``auth.reload_seconds`` and compares a hash. A change that parses replaces the keys at
once; one that does not (a half-written file, an empty one, a bad line) keeps the keys in
force and logs an error, once per content: never an empty set that locks everyone out.
A changed file is read twice, ``SETTLE_SECONDS`` apart, and taken only when both reads
agree: a file caught mid-rewrite (truncated, or cut at a line) is left for the next check.
A settled file that does not parse is an error, ``gateway_keys_file_valid`` 0 (an alert),
and then, by ``auth.on_invalid_keys_file``: ``refuse`` (the default: no key is accepted
until the file parses again, so a rotation meant to revoke a leaked key never leaves it
working) or ``keep`` (the previous keys stay in force).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import os
import re
import secrets
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from gateway.errors import ConfigurationError
from gateway.observe.metrics import GatewayMetrics
from gateway.periodic import Periodic


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Quota:
    """At most ``limit`` requests (or images) per UTC ``period`` (day or month)."""

    unit: str  # "requests" or "images"
    limit: int
    period: str  # "day" or "month"


@dataclass(frozen=True)
class ApiKey:
    """One client: its id (for logs and metrics), the key's hash, its rate limit, its
    tier (its share of the in-flight limit and queue priority) and its quotas."""

    id: str
    digest: bytes
    rate: float | None = None
    burst: float | None = None
    tier: str = "standard"
    quotas: tuple[Quota, ...] = ()
    # the models it may use, as shell-style patterns (``models=text_*,image_classifier``);
    # empty: every model the gateway exposes
    models: tuple[str, ...] = ()
    # what metrics name it ("": its id): a token tenant outside its issuer's
    # ``metric_tenants``, or an unlisted certificate, shares one label with its kind
    label: str = ""

    @property
    def metric_label(self) -> str:
        return self.label or self.id

    def may_use(self, model: str) -> bool:
        """Whether this key may call (or see) ``model``."""
        return not self.models or any(fnmatchcase(model, pattern) for pattern in self.models)


# A key id is a metric label and a log field: short and plain, and never holds a colon:
# the other sources of identity name their callers ``<source>:<name>`` (certificates
# ``cert:``, each token issuer its own), so no name of theirs is a key's.
_KEY_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
CERTIFICATE_PREFIX = "cert:"
# the label the callers of a source share past its named ones: "*" is in no caller's id
SHARED_LABEL = "*"
# what follows ``cert:`` on a certificate's line (gateway.shared.certificates' names)
_CERT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:/~-]{0,230}")
_TIER = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_QUOTA = re.compile(r"([0-9]{1,15})/(day|month)")
_MODEL_PATTERN = re.compile(r"[A-Za-z0-9_.*?\-]{1,128}")
_OPTIONS = {"tier", "quota", "image-quota", "models"}
_USAGE = (
    "expected '<id> <sha256 hex> [<rate per second> [<burst>]] [tier=<name>] "
    "[quota=<requests>/<day|month>] [image-quota=<images>/<day|month>] [models=<pattern>,...]' "
    "(id: letters, digits, '_.-', at most 64, or cert:<certificate name> with '-' for the hash; "
    "rate and burst: finite, positive, burst >= 1; "
    "quotas: whole numbers >= 1; models: model names or shell patterns with * and ?)"
)


def _options(
    words: list[str], known_tiers: Collection[str] | None
) -> tuple[str, tuple[Quota, ...], tuple[str, ...]]:
    tier = "standard"
    quotas: list[Quota] = []
    models: tuple[str, ...] = ()
    seen: set[str] = set()
    for word in words:
        name, _, value = word.partition("=")
        if name not in _OPTIONS or name in seen:
            raise ValueError
        seen.add(name)
        if name == "models":
            models = tuple(value.split(","))
            if not all(_MODEL_PATTERN.fullmatch(pattern) for pattern in models):
                raise ValueError
            continue
        if name == "tier":
            if not _TIER.fullmatch(value):
                raise ValueError
            if known_tiers is not None and value not in known_tiers:
                raise LookupError(value)
            tier = value
            continue
        match = _QUOTA.fullmatch(value)
        if match is None or int(match.group(1)) < 1:
            raise ValueError
        unit = "requests" if name == "quota" else "images"
        quotas.append(Quota(unit, int(match.group(1)), match.group(2)))
    return tier, tuple(quotas), models


def plain_id(name: str, prefix: str) -> str:
    """``name`` as a caller id (a metric label and a log field): itself when it is a plain
    key id, else ``prefix`` and a hash of it (a token's subject, a certificate's name)."""
    if _KEY_ID.fullmatch(name):
        return name
    return f"{prefix}-" + hashlib.sha256(name.encode()).hexdigest()[:16]


def model_pattern(text: str) -> bool:
    """Whether ``text`` is a model name or shell pattern a caller may be limited to."""
    return _MODEL_PATTERN.fullmatch(text) is not None


def parse_keys(text: str, path: Path, known_tiers: Collection[str] | None = None) -> list[ApiKey]:
    """The keys of a keys file's text; ConfigurationError names the line that is wrong
    (a rate or burst must be a finite positive number: float() takes nan and inf; a
    tier must be one of ``known_tiers`` when given)."""
    keys: list[ApiKey] = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        parts = [w for w in words if "=" not in w]
        try:
            if words[: len(parts)] != parts:  # options come after the positional fields
                raise ValueError
            if len(parts) not in (2, 3, 4):
                raise ValueError
            if parts[0].startswith(CERTIFICATE_PREFIX):  # a certificate's line: no key at all
                if parts[1] != "-" or not _CERT_NAME.fullmatch(parts[0].removeprefix(CERTIFICATE_PREFIX)):
                    raise ValueError
                digest = b""  # never equal to a presented key's digest
            elif len(parts[1]) != 64 or not _KEY_ID.fullmatch(parts[0]):
                raise ValueError
            else:
                digest = bytes.fromhex(parts[1])
            rate = float(parts[2]) if len(parts) > 2 else None
            burst = float(parts[3]) if len(parts) > 3 else (rate if rate else None)
            if rate is not None and not (math.isfinite(rate) and rate > 0):
                raise ValueError
            if rate is not None and not (burst is not None and math.isfinite(burst) and burst >= 1):
                raise ValueError
            tier, quotas, models = _options(words[len(parts) :], known_tiers)
        except LookupError as exc:
            raise ConfigurationError(
                f"{path}:{number}: tier {exc.args[0]!r} is not one of the gateway's tiers "
                f"({', '.join(sorted(known_tiers or ()))}; GATEWAY_TIERS)"
            ) from None
        except ValueError:
            raise ConfigurationError(f"{path}:{number}: {_USAGE}") from None
        keys.append(ApiKey(parts[0], digest, rate, burst, tier, quotas, models))
    if not keys:
        raise ConfigurationError(f"{path} holds no API keys")
    if len({k.id for k in keys}) != len(keys):
        raise ConfigurationError(f"{path} repeats a key id")
    return keys


def new_key(path: Path, key_id: str, rate: float | None = None) -> str:
    """A new random key for ``key_id``, its line appended to the keys file at ``path``
    (created with mode 600); the file must still parse, with no repeated id."""
    key = secrets.token_urlsafe(32)
    line = f"{key_id} {hash_key(key)}" + (f" {rate:g}" if rate is not None else "") + "\n"
    existing = path.read_text() if path.exists() else ""
    parse_keys(existing + line, path)  # refuses a bad id, a bad rate or a repeated id
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(descriptor, "a") as file:
        file.write(line)
    return key


logger = logging.getLogger("gateway.keyfiles")
SETTLE_SECONDS = 0.05


class KeyRing:
    """The keys of one file (``name``: api or admin), as last read successfully."""

    def __init__(
        self,
        path: Path,
        name: str,
        metrics: GatewayMetrics | None = None,
        keep_on_invalid: bool = False,
        tiers: Collection[str] | None = None,
    ) -> None:
        self.path = path
        self._tiers = tiers
        self.name = name
        self._metrics = metrics
        self._keep = keep_on_invalid
        text = self._read()
        if text is None:
            raise ConfigurationError(f"cannot read the {name} keys file {path}")
        self.keys: list[ApiKey] = parse_keys(text.decode("utf-8", errors="replace"), path, tiers)
        self._seen = hashlib.sha256(text).digest()
        self._watching: Periodic | None = None
        self._valid(True)

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def changed(self) -> bytes | None:
        """The file's bytes when they differ from the last ones taken, else None."""
        text = self._read()
        if text is None or hashlib.sha256(text).digest() == self._seen:
            return None  # unchanged, or mid-swap / gone for a moment: the keys in force stay
        return text

    def check(self, expected: bytes | None = None) -> bool:
        """Read the file again; True when new keys were applied. With ``expected`` (an
        earlier read), nothing is taken unless the file still holds exactly that."""
        text = self._read()
        if text is None or (expected is not None and text != expected):
            return False
        digest = hashlib.sha256(text).digest()
        if digest == self._seen:
            return False
        self._seen = digest
        try:
            keys = parse_keys(text.decode("utf-8"), self.path, self._tiers)
        except (ConfigurationError, UnicodeDecodeError) as exc:
            reason = exc.detail if isinstance(exc, ConfigurationError) else "not UTF-8"
            outcome = "the previous keys stay" if self._keep else "no key is accepted until it parses"
            logger.error("%s keys file changed but is not valid (%s): %s", self.name, reason, outcome)
            self._count("refused")
            self._valid(False)
            if not self._keep:
                self.keys = []
            return False
        self.keys = keys
        self._valid(True)
        logger.info("%s keys file changed: %d keys in force", self.name, len(keys))
        self._count("applied")
        return True

    def _valid(self, valid: bool) -> None:
        if self._metrics is not None:
            self._metrics.keys_file_valid.labels(file=self.name).set(1 if valid else 0)

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.key_reloads.labels(file=self.name, outcome=outcome).inc()

    def start(self, interval: float) -> None:
        # a failure keeps the keys in force; the next period checks again
        self._watching = Periodic(f"checking the {self.name} keys file", interval, self._check_once, logger)
        self._watching.start()

    async def _check_once(self) -> None:
        first = self.changed()
        if first is not None:
            await asyncio.sleep(SETTLE_SECONDS)
            self.check(expected=first)

    async def stop(self) -> None:
        if self._watching is not None:
            await self._watching.stop()
            self._watching = None


def find_key(keys: list[ApiKey], headers: Iterable[tuple[bytes, bytes]]) -> ApiKey | None:
    """The key presented in ``headers`` (lower-case names: ``authorization: Bearer ...`` or
    ``x-api-key``; HTTP headers or gRPC metadata), if it is one of ``keys``. Every key is
    compared, in constant time, so timing tells nothing."""
    presented = None
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            presented = value[7:].strip()
        elif name == b"x-api-key":
            presented = value.strip()
    if not presented:
        return None
    digest = hashlib.sha256(presented).digest()
    found = None
    for key in keys:
        if hmac.compare_digest(digest, key.digest):
            found = key
    return found
