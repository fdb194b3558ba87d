"""A real OpenID Provider for the token tests: node-oidc-provider (tests/oidc-provider,
installed by `make test`), run with Node.js on a loopback port, issuing JWT access tokens
with the client-credentials grant. Its signing keys are made here, so a test can rotate
them (restart with other keys) and sign the tokens a provider would never issue (expired,
another audience) with the provider's own key."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from gateway.dev.tritonserver import free_port

PROVIDER = Path(__file__).resolve().parents[1] / "oidc-provider"
AUDIENCE = "https://gateway.test/classify"


def signing_key(kid: str) -> tuple[rsa.RSAPrivateKey, dict[str, Any]]:
    """A new RSA key and its private JWK (what the provider signs with)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(private))
    jwk.update(kid=kid, use="sig", alg="RS256")
    return private, jwk


@dataclass
class OidcProvider:
    folder: Path
    port: int = field(default_factory=free_port)
    clients: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> extra token claims
    ttl: int = 300
    keys: dict[str, rsa.RSAPrivateKey] = field(default_factory=dict)  # kid -> key
    _jwks: list[dict[str, Any]] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def use_keys(self, kids: list[str]) -> None:
        """Sign with these keys (the first first); new ids get new keys."""
        jwks = []
        for kid in kids:
            if kid not in self.keys:
                self.keys[kid], jwk = signing_key(kid)
            else:
                jwk = json.loads(RSAAlgorithm.to_jwk(self.keys[kid]))
                jwk.update(kid=kid, use="sig", alg="RS256")
            jwks.append(jwk)
        self._jwks = jwks

    def start(self) -> OidcProvider:
        node = shutil.which("node")
        if node is None or not (PROVIDER / "node_modules" / "oidc-provider").exists():
            raise RuntimeError(
                "Node.js and tests/oidc-provider/node_modules are needed: `make test` installs them"
            )
        if not self._jwks:
            self.use_keys(["first"])
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "provider.json"
        config.write_text(
            json.dumps(
                {
                    "issuer": self.issuer,
                    "port": self.port,
                    "audience": AUDIENCE,
                    "ttl": self.ttl,
                    "alg": "RS256",
                    "keys": self._jwks,
                    "clients": [
                        {
                            "client_id": client,
                            "client_secret": f"{client}-secret",
                            "grant_types": ["client_credentials"],
                            "redirect_uris": [],
                            "response_types": [],
                            "token_endpoint_auth_method": "client_secret_basic",
                        }
                        for client in self.clients
                    ],
                    "claims": self.clients,
                }
            )
        )
        log = (self.folder / "provider.log").open("ab")
        self.process = subprocess.Popen(
            [node, str(PROVIDER / "provider.mjs"), str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.folder / "provider.log").read_text()
            try:
                if httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(
            f"the OpenID provider did not start: {(self.folder / 'provider.log').read_text()}"
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self, kids: list[str]) -> None:
        """The provider with these signing keys, on the same port (a rotation)."""
        self.stop()
        self.use_keys(kids)
        self.start()

    def token(self, client: str) -> str:
        """An access token for ``client`` by the client-credentials grant."""
        basic = base64.b64encode(f"{client}:{client}-secret".encode()).decode()
        answer = httpx.post(
            f"{self.issuer}/token",
            data={"grant_type": "client_credentials", "scope": "classify", "resource": AUDIENCE},
            headers={"authorization": f"Basic {basic}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        return str(answer.json()["access_token"])

    def forge(self, claims: dict[str, Any], kid: str | None = None, **header: Any) -> str:
        """A token signed with the provider's key ``kid`` (the first by default)."""
        kid = kid or self._jwks[0]["kid"]
        return jwt.encode(claims, self.keys[kid], algorithm="RS256", headers={"kid": kid, **header})
