"""The gRPC door over TLS with client certificates: a call without a certificate from the
configured CA never starts; one with names its tenant by the certificate (the keys file's
line of that id gives its limits and models, no key needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException

from gateway.dev.tritonserver import TritonServer, free_port
from gateway.settings import Settings

from helpers.certs import Authority
from helpers.triton_fixtures import gateway_settings


def _text_inputs() -> list[Any]:
    text = tritongrpc.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"The striker scored twice in the final."]], dtype=np.object_))
    top_k = tritongrpc.InferInput("TOP_K", [1, 1], "INT32")
    top_k.set_data_from_numpy(np.array([[2]], dtype=np.int32))
    return [text, top_k]


def test_client_certificates_name_the_caller_on_the_grpc_door(
    triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client], tmp_path: Path
) -> None:
    authority = Authority(tmp_path / "ca")
    server_chain, server_key = authority.issue("gateway", server=True)
    keys = tmp_path / "keys"
    keys.write_text("cert:partner-a - models=text_*\n")
    door = free_port()
    settings = gateway_settings(
        triton,
        auth={"keys_file": keys, "protect_metrics": False},
        grpc={
            "port": door,
            "host": "127.0.0.1",
            "tls_cert_file": server_chain,
            "tls_key_file": server_key,
            "client_ca_file": authority.ca_file,
        },
    )
    http = serve_gateway(settings)
    address = f"127.0.0.1:{door}"

    def client(name: str | None, issuer: Authority = authority) -> Any:
        chain = key = None
        if name is not None:
            chain, key = issuer.issue(name)
        return tritongrpc.InferenceServerClient(
            address,
            ssl=True,
            root_certificates=str(authority.ca_file),
            private_key=None if key is None else str(key),
            certificate_chain=None if chain is None else str(chain),
        )

    partner = client("partner-a")
    # no API key: the certificate names the caller, its keys-file line its models
    assert partner.infer("text_classifier", _text_inputs()).as_numpy("LABELS").size == 2
    assert not partner.is_model_ready("image_classifier")
    # a certificate the keys file does not name: a tenant of its own, every model
    assert client("lab-7").is_model_ready("image_classifier")
    metrics = http.get("/metrics").text
    assert 'gateway_client_requests_total{client="cert:partner-a",outcome="allowed"}' in metrics
    # ... counted under the one label unlisted certificates share (never a series each)
    assert 'gateway_client_requests_total{client="cert:*",outcome="allowed"}' in metrics
    assert "lab-7" not in metrics
    # no certificate, or one from another authority: the call never starts
    stranger = Authority(tmp_path / "other-ca", name="other-ca")
    for refused in (client(None), client("partner-a", issuer=stranger)):
        with pytest.raises(InferenceServerException) as failed:
            refused.is_server_live()
        assert str(failed.value.status()) == "StatusCode.UNAVAILABLE"
