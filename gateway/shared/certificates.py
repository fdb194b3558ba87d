"""The one name a client certificate gives the gateway, whichever door it came through: the
HTTP door reads it from the ``x-forwarded-client-cert`` a trusted proxy appended (Envoy's
XFCC), the gRPC door from the certificate its own mTLS verified. Both end in
:func:`certificate_name`, so one certificate is one name.

- The name is the subject's common name, parsed as RFC 4514 says (escapes, multi-valued
  RDNs: ``cryptography``'s parser, not a regular expression); else the first URI SAN,
  else the first DNS SAN. A subject with several common names, or a name with anything
  but a plain name's characters (``partner-a/x``, a comma, a space), is refused, never
  cut down to a prefix that could be someone else's.
- XFCC: every element is a proxy's account of the certificate it was shown; with
  ``APPEND_FORWARD`` the client's own element comes first and each proxy appends its
  own, so the element of the nearest trusted proxy is the **last** one (of the last
  header, when there are several). Values are parsed with their quotes and escapes.

Names live in a namespace of their own (``cert:<name>``): gateway.serving.caller.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

from cryptography import x509
from cryptography.x509.oid import ExtensionOID, NameOID

from gateway.errors import UnauthorizedError

# A common name that names a caller: plain characters only (no separators of any DN or
# URI syntax, no spaces), short.
_COMMON_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")
_URI = re.compile(r"[a-z][a-z0-9+.-]{0,31}://[A-Za-z0-9._~:/@-]{1,200}")
_DNS = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9-]{1,63})*")


def _refused(why: str) -> UnauthorizedError:
    return UnauthorizedError(f"the client certificate's name is not usable: {why}")


def certificate_name(subject: x509.Name | None, uris: Sequence[str], dns: Sequence[str]) -> str | None:
    """The caller a certificate names (None: it names nothing), or 401 for a name that
    is ambiguous or not plain."""
    if subject is not None:
        common = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if len(common) > 1:
            raise _refused("its subject has several common names")
        if common:
            value = common[0].value
            name = value if isinstance(value, str) else value.decode("utf-8", "replace")
            if not _COMMON_NAME.fullmatch(name):
                raise _refused("its common name holds characters other than letters, digits and '._@-'")
            return name
    for values, pattern, kind in ((uris, _URI, "URI"), (dns, _DNS, "DNS")):
        if values:
            if not pattern.fullmatch(values[0]):
                raise _refused(f"its first {kind} name is not a plain one")
            return values[0]
    return None


def pem_name(pem: bytes) -> str | None:
    """The name of a PEM certificate (what gRPC's auth context gives as ``x509_pem_cert``)."""
    try:
        certificate = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise _refused("it does not parse") from None
    uris: list[str] = []
    dns: list[str] = []
    try:
        extension = certificate.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
    except x509.ExtensionNotFound:
        pass
    else:
        names = extension.value
        assert isinstance(names, x509.SubjectAlternativeName)
        uris = names.get_values_for_type(x509.UniformResourceIdentifier)
        dns = names.get_values_for_type(x509.DNSName)
    return certificate_name(certificate.subject, uris, dns)


def verified_name(
    pem: bytes | None, common_names: Sequence[str], alternative: Sequence[str] = ()
) -> str | None:
    """The name of the certificate a TLS handshake verified: from its PEM when the TLS
    library gives it, else from the common names and SANs it reports."""
    if pem:
        return pem_name(pem)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name) for name in common_names])
    uris = [name for name in alternative if "://" in name]
    return certificate_name(subject, uris, [name for name in alternative if "://" not in name])


def _split(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside double quotes (a backslash escapes the next
    character inside them)."""
    parts: list[str] = []
    start, quoted, escaped = 0, False, False
    for at, char in enumerate(text):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append(text[start:at])
            start = at + 1
    if quoted:
        raise _refused("x-forwarded-client-cert has an unterminated quote")
    parts.append(text[start:])
    return parts


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"')  # Envoy escapes quotes only; a DN keeps its own
    return value


def forwarded_certificate(values: Iterable[bytes]) -> str | None:
    """The name the nearest proxy's element of ``x-forwarded-client-cert`` (every value
    of the header, in order) gives, None when it names no certificate; 401 when it is
    malformed or its name is not usable."""
    elements = [e for value in values for e in _split(value.decode("latin-1"), ",") if e.strip()]
    if not elements:
        return None
    subject: str | None = None
    uris: list[str] = []
    dns: list[str] = []
    for pair in _split(elements[-1], ";"):
        key, equals, value = pair.partition("=")
        if not equals:
            continue
        key, value = key.strip().lower(), _unquote(value)
        if key == "subject":
            if subject is not None:
                raise _refused("x-forwarded-client-cert names two subjects")
            subject = value
        elif key == "uri":
            uris.append(value)
        elif key == "dns":
            dns.append(value)
    name: x509.Name | None = None
    if subject:
        try:
            name = x509.Name.from_rfc4514_string(subject)
        except ValueError:
            raise _refused("its subject is not an RFC 4514 distinguished name") from None
    return certificate_name(name, uris, dns)


XFCC = "x-forwarded-client-cert"


class TrustedProxies:
    """The peers whose ``x-forwarded-client-cert`` is believed (``auth.trusted_proxies``),
    on either door: a mesh's proxy (Envoy, Istio) terminates the client's mTLS and
    forwards what it verified, over HTTP and gRPC alike."""

    def __init__(self, networks: Sequence[str]) -> None:
        self._networks = [ipaddress.ip_network(n, strict=False) for n in networks]

    def __bool__(self) -> bool:
        return bool(self._networks)

    def certified(self, peer: str | None, values: Iterable[bytes]) -> str | None:
        """The forwarded client certificate's name when ``peer`` (an address) is a trusted
        proxy and the header (``values``, every one, in order) names one; 401 for one
        whose name is not usable. From anyone else the header is ignored."""
        if not self._networks or not peer:
            return None
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return None
        if not any(address in network for network in self._networks):
            return None
        return forwarded_certificate(values)


def grpc_peer_address(peer: str) -> str | None:
    """The address in gRPC's peer string (``ipv4:10.0.0.1:5000``, ``ipv6:[::1]:5000``, the
    latter percent-encoded by recent releases: ``ipv6:%5B::1%5D:5000``)."""
    kind, _, rest = unquote(peer).partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return None
