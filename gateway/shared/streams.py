"""The prediction log in Redis Streams: one stream per model, ``XADD`` with ``MAXLEN ~``
(Redis trims whole nodes, cheaply, so a stream holds about ``max_length`` records), read
back in pages by ``triton-gateway predictions export``.

A record is one field, ``record``, holding its JSON document: a consumer group, ``XREAD``
or ``redis-cli XRANGE`` reads it as well as the export does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

from gateway import jsoncodec
from gateway.errors import SharedStateUnavailableError
from gateway.observe.predictionlog import PredictionRecord

STREAM_FIELD = "record"


def stream_key(prefix: str, model: str) -> str:
    return f"{prefix}:{model}"


class RedisStreamSink:
    """A prediction-log sink: each record appended to its model's stream."""

    def __init__(self, url: str, prefix: str, max_length: int, timeout: float) -> None:
        import redis.asyncio as redis

        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=False
        )
        self._prefix = prefix
        self._max_length = max_length

    async def send(self, record: PredictionRecord) -> None:
        fields: dict[Any, Any] = {STREAM_FIELD: jsoncodec.dumps(record.document())}
        await self._client.xadd(
            stream_key(self._prefix, record.model or "unknown"),
            fields,
            maxlen=self._max_length,
            approximate=True,
        )

    async def close(self) -> None:
        await self._client.aclose()


async def export(
    url: str, prefix: str, models: list[str], since: str = "-", page: int = 1000
) -> AsyncIterator[tuple[str, str, bytes]]:
    """Every record of the models' streams (every model's when ``models`` is empty) after
    ``since`` (a stream id; "-": from the first), oldest first per model: (model, id, document)."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(url, decode_responses=False, socket_timeout=30, socket_connect_timeout=5)
    try:
        async for found in _records(client, prefix, models, since, page):
            yield found
    except (redis.RedisError, OSError) as exc:
        raise SharedStateUnavailableError(
            f"Redis at the prediction log's URL failed: {type(exc).__name__}"
        ) from exc
    finally:
        await client.aclose()


async def _records(
    client: Any, prefix: str, models: list[str], since: str, page: int
) -> AsyncIterator[tuple[str, str, bytes]]:
    if not models:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", _type="stream")]
        models = sorted(key.decode().removeprefix(f"{prefix}:") for key in keys)
    for model in models:
        start = since if since == "-" else f"({since}"
        while True:
            entries = cast(
                list[tuple[bytes, dict[bytes, bytes]]],
                await client.xrange(stream_key(prefix, model), min=start, count=page),
            )
            for entry_id, fields in entries:
                yield model, entry_id.decode(), fields[STREAM_FIELD.encode()]
            if len(entries) < page:
                break
            start = f"({entries[-1][0].decode()}"
