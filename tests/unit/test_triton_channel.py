"""The Triton transport's liveness is asked on the connection inference takes.

The breaker's probe and /readyz vouch for Triton through ``is_live``/``server_status``. When
they were asked on tritonclient's channel, a restarted Triton (a new address, under compose)
was "live" while the inference channel still dialled the old one: the gateway was put back
in rotation and answered 503 (tests/containers/test_compose.py, CI of 2026-11-29). A fake
gRPC server here (a real Triton does not say which connection a call came on) records each
call's peer (the client's address and port, one per TCP connection); the inference channel's
own state says whether the probe went through it."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc
import numpy as np
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2

from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import Tracing
from gateway.settings import TracingSettings, TritonSettings
from gateway.triton.client import TritonBackend
from gateway.triton.tensors import Tensor


class Peers:
    """A Triton that answers ServerLive, ServerMetadata and ModelInfer, and notes the peer
    (client address:port) each call came from."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = defaultdict(set)

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(method: str, request_type: type, answer: object) -> grpc.RpcMethodHandler:
            async def handle(request: object, context: grpc.aio.ServicerContext) -> object:
                self.seen[method].add(context.peer())
                return answer

            return grpc.unary_unary_rpc_method_handler(
                handle,
                request_deserializer=request_type.FromString,  # type: ignore[attr-defined]
                response_serializer=lambda message: message.SerializeToString(),
            )

        return grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService",
            {
                "ServerLive": unary(
                    "ServerLive", service_pb2.ServerLiveRequest, service_pb2.ServerLiveResponse(live=True)
                ),
                "ServerMetadata": unary(
                    "ServerMetadata",
                    service_pb2.ServerMetadataRequest,
                    service_pb2.ServerMetadataResponse(name="triton", version="2.51.0"),
                ),
                "ModelInfer": unary(
                    "ModelInfer",
                    service_pb2.ModelInferRequest,
                    service_pb2.ModelInferResponse(model_name="m", model_version="1"),
                ),
            },
        )


def test_liveness_and_readiness_are_asked_on_the_inference_connection() -> None:
    peers = Peers()
    states: list[grpc.ChannelConnectivity] = []

    async def scenario() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((peers.handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        settings = TritonSettings(url=f"127.0.0.1:{port}")
        backend = TritonBackend(
            settings, GatewayMetrics(CollectorRegistry()), Tracing(TracingSettings()), max_send_bytes=1 << 20
        )
        inference = backend._channel  # the channel ModelInfer takes
        try:
            assert inference.get_state() is grpc.ChannelConnectivity.IDLE
            # before any inference: the probe alone connects the inference channel
            assert await backend.is_live(2.0)
            states.append(inference.get_state())
            status = await backend.server_status()
            assert status.live
            assert status.version == "2.51.0"
            result = await backend.infer("m", "1", [Tensor("INPUT", "FP32", np.zeros(1, np.float32))], "r1")
            assert result.model_version == "1"
        finally:
            await backend.close()
            await server.stop(None)

    asyncio.run(scenario())
    assert states == [grpc.ChannelConnectivity.READY]
    # and on the same connection (gRPC shares a connection between channels of equal
    # arguments; what differs is each channel's resolved addresses and state)
    (inference,) = peers.seen["ModelInfer"]
    assert peers.seen["ServerLive"] == {inference}, dict(peers.seen)
