"""Keys files watched while serving: a rotated key applies without a restart.

A Kubernetes Secret volume swaps a symlink atomically; a plain file is rewritten in place.
Either way the file's bytes change, so the ring reads the file every
``auth.reload_seconds`` and compares a hash. A change that parses replaces the keys at
once; one that does not (a half-written file, an empty one, a bad line) keeps the keys in
force and logs an error, once per content: never an empty set that locks everyone out.
A changed file is read twice, ``SETTLE_SECONDS`` apart, and taken only when both reads
agree: a file caught mid-rewrite (truncated, or cut at a line) is left for the next check.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from pathlib import Path

from gateway.auth import ApiKey, parse_keys
from gateway.errors import ConfigurationError
from gateway.metrics import GatewayMetrics

logger = logging.getLogger("gateway.keyfiles")
SETTLE_SECONDS = 0.05


class KeyRing:
    """The keys of one file (``name``: api or admin), as last read successfully."""

    def __init__(self, path: Path, name: str, metrics: GatewayMetrics | None = None) -> None:
        self.path = path
        self.name = name
        self._metrics = metrics
        text = self._read()
        if text is None:
            raise ConfigurationError(f"cannot read the {name} keys file {path}")
        self.keys: list[ApiKey] = parse_keys(text.decode("utf-8", errors="replace"), path)
        self._seen = hashlib.sha256(text).digest()
        self._task: asyncio.Task[None] | None = None

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
            keys = parse_keys(text.decode("utf-8"), self.path)
        except (ConfigurationError, UnicodeDecodeError) as exc:
            reason = exc.detail if isinstance(exc, ConfigurationError) else "not UTF-8"
            logger.error(
                "%s keys file changed but is not valid (%s): the previous keys stay", self.name, reason
            )
            self._count("refused")
            return False
        self.keys = keys
        logger.info("%s keys file changed: %d keys in force", self.name, len(keys))
        self._count("applied")
        return True

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.key_reloads.labels(file=self.name, outcome=outcome).inc()

    def start(self, interval: float) -> None:
        self._task = asyncio.create_task(self._watch(interval), name=f"{self.name}-keys-watch")

    async def _watch(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                first = self.changed()
                if first is not None:
                    await asyncio.sleep(SETTLE_SECONDS)
                    self.check(expected=first)
            except Exception:  # never let the watch die: the keys in force stay
                logger.exception("checking the %s keys file failed", self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
