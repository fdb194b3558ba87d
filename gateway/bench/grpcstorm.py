"""Clients that retry at once, on the gRPC door: ``clients`` channels (an HTTP/2
connection each), each sending Triton's ``ModelInfer`` for the text classifier again the
moment its answer, a refusal or not, comes back (the gRPC side of ``hey``'s storm in
gateway.bench.capacity).

    .venv/bin/python -m gateway.bench.grpcstorm HOST:PORT [--clients 100] [--seconds 8]

Prints one JSON object: the calls answered, by status code name. Run in a process of its
own, so its CPU is never counted as the gateway's."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

TEXT = b"the film was a delight from start to finish"


def infer_request() -> service_pb2.ModelInferRequest:
    """One text for the text classifier, its three best labels asked."""
    request = service_pb2.ModelInferRequest(model_name="text_classifier")
    text = request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
    text.contents.bytes_contents.append(TEXT)
    top_k = request.inputs.add(name="TOP_K", datatype="INT32", shape=[1, 1])
    top_k.contents.int_contents.append(3)
    return request


async def _client(target: str, until: float, counts: Counter[str]) -> None:
    request = infer_request()
    async with grpc.aio.insecure_channel(target) as channel:
        infer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        while time.monotonic() < until:
            try:
                await infer(request, timeout=30)
            except grpc.aio.AioRpcError as error:
                counts[error.code().name] += 1
            else:
                counts["OK"] += 1


async def storm(target: str, clients: int, seconds: float) -> dict[str, int]:
    """Calls answered in ``seconds``, by status code name."""
    counts: Counter[str] = Counter()
    until = time.monotonic() + seconds
    await asyncio.gather(*(_client(target, until, counts) for _ in range(clients)))
    return dict(counts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", help="the gateway's gRPC door, HOST:PORT")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=8.0)
    options = parser.parse_args(argv)
    print(json.dumps(asyncio.run(storm(options.target, options.clients, options.seconds))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
