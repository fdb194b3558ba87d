"""The name a verified client certificate gives the gRPC door: its common name, else its
first SAN; nothing over plaintext."""

from __future__ import annotations

from gateway.rpc.service import certified_name


def test_the_common_name_then_the_first_san_over_tls_only() -> None:
    tls = {"transport_security_type": [b"ssl"]}
    assert certified_name({**tls, "x509_common_name": [b"partner-a"]}) == "partner-a"
    assert (
        certified_name({**tls, "x509_subject_alternative_name": [b"spiffe://ml/app", b"x"]})
        == "spiffe://ml/app"
    )
    assert certified_name(tls) is None  # TLS without a client certificate
    assert certified_name({"transport_security_type": [b"insecure"], "x509_common_name": [b"forged"]}) is None
    assert certified_name(None) is None
