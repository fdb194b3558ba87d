"""One certificate, one name, on both doors (gateway.shared.certificates): the subject's
common name parsed as RFC 4514 says, else its first URI or DNS SAN; a name that is
ambiguous or not plain is refused, never cut down; XFCC's element is the nearest proxy's
(the last); the gRPC door's verified certificate gives the name XFCC gives for it."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.errors import UnauthorizedError
from gateway.rpc.service import certified_name
from gateway.shared.certificates import forwarded_certificate, pem_name


def _xfcc(*values: str) -> str | None:
    return forwarded_certificate(value.encode() for value in values)


def test_the_common_name_parsed_as_rfc_4514() -> None:
    assert _xfcc('Hash=a;Subject="CN=partner-a,OU=ml,O=Acme"') == "partner-a"
    assert _xfcc('Hash=a;Subject="OU=a\\,b,CN=partner-a"') == "partner-a"  # an escaped comma
    assert _xfcc('Hash=a;Subject="CN=partner-a+O=Acme,C=US"') == "partner-a"  # a multi-valued RDN
    # the old reading took what followed '/CN=' inside another field
    assert _xfcc('Hash=a;Subject="O=evil/CN=admin,CN=real"') == "real"


@pytest.mark.parametrize(
    "subject",
    [
        "CN=partner-a/x,O=Acme",  # was cut to partner-a
        "CN=partner-a\\,x",  # an escaped separator inside the name
        "CN=a,CN=b",  # two common names
        "CN=two words",
        "/C=US/OU=Lyft/CN=lab-7",  # not RFC 4514: OpenSSL's one-line form
    ],
)
def test_a_name_that_is_not_plain_or_not_one_is_refused(subject: str) -> None:
    with pytest.raises(UnauthorizedError):
        _xfcc(f'Hash=a;Subject="{subject}"')


def test_the_sans_when_there_is_no_common_name() -> None:
    assert _xfcc("Hash=a;URI=spiffe://ml/app;URI=spiffe://ml/other;DNS=app.ml") == "spiffe://ml/app"
    assert _xfcc("Hash=a;DNS=app.ml") == "app.ml"
    assert _xfcc("Hash=a") is None
    with pytest.raises(UnauthorizedError):
        _xfcc('Hash=a;URI="spiffe://ml/a b"')


def test_the_element_of_the_nearest_proxy_is_taken() -> None:
    """With APPEND_FORWARD the client's own element comes first: the trusted proxy's is
    the last, of the last header when there are several."""
    spoof = 'Hash=x;Subject="CN=admin"'
    proxy = 'By=spiffe://mesh/gw;Hash=a;Subject="CN=partner-a,OU=ml";URI=spiffe://mesh/partner'
    assert _xfcc(f"{spoof},{proxy}") == "partner-a"
    assert _xfcc(spoof, proxy) == "partner-a"
    with pytest.raises(UnauthorizedError):
        _xfcc('Hash=a;Subject="CN=a";Subject="CN=b"')  # two subjects in one element
    with pytest.raises(UnauthorizedError):
        _xfcc('Hash=a;Subject="CN=a')  # an unterminated quote


def _certificate(subject: x509.Name, sans: list[x509.GeneralName]) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def test_the_grpc_doors_certificate_names_what_xfcc_names_for_it() -> None:
    tls = {"transport_security_type": [b"ssl"]}
    subject = x509.Name.from_rfc4514_string("CN=partner-a+O=Acme,C=US")
    pem = _certificate(subject, [x509.UniformResourceIdentifier("spiffe://ml/x")])
    xfcc = f'Hash=a;Subject="{subject.rfc4514_string()}";URI=spiffe://ml/x'
    assert certified_name({**tls, "x509_pem_cert": [pem]}) == _xfcc(xfcc) == "partner-a"
    slashed = _certificate(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "partner-a/x")]), [])
    with pytest.raises(UnauthorizedError):  # the raw CN is no longer taken whole
        certified_name({**tls, "x509_pem_cert": [slashed], "x509_common_name": [b"partner-a/x"]})
    uri_only = _certificate(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme")]), [
        x509.UniformResourceIdentifier("spiffe://ml/app"),
        x509.DNSName("app.ml"),
    ])  # fmt: skip
    assert pem_name(uri_only) == "spiffe://ml/app"


def test_nothing_over_plaintext_and_the_reported_names_without_a_pem() -> None:
    tls = {"transport_security_type": [b"ssl"]}
    assert certified_name({**tls, "x509_common_name": [b"partner-a"]}) == "partner-a"
    assert (
        certified_name({**tls, "x509_subject_alternative_name": [b"spiffe://ml/app", b"x"]})
        == "spiffe://ml/app"
    )
    assert certified_name(tls) is None  # TLS without a client certificate
    assert certified_name({"transport_security_type": [b"insecure"], "x509_common_name": [b"forged"]}) is None
    assert certified_name(None) is None


def test_a_forwarded_certificate_is_believed_from_trusted_proxies_only_on_either_door() -> None:
    from gateway.shared.certificates import TrustedProxies, grpc_peer_address

    proxies = TrustedProxies(["10.0.0.0/8", "::1/128"])
    header = [b'Hash=ab;Subject="CN=lab"']
    assert proxies.certified("10.1.2.3", header) == "lab"
    assert proxies.certified("::1", header) == "lab"
    assert proxies.certified("192.168.1.1", header) is None  # anyone else: ignored
    assert proxies.certified(None, header) is None
    assert TrustedProxies([]).certified("10.1.2.3", header) is None
    # gRPC's peer strings, as its core writes them
    assert grpc_peer_address("ipv4:10.1.2.3:50123") == "10.1.2.3"
    assert grpc_peer_address("ipv6:[::1]:50123") == "::1"
    assert grpc_peer_address("ipv6:%5B%3A%3A1%5D:50123") == "::1"
    assert grpc_peer_address("unix:/tmp/socket") is None
