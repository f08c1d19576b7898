"""Identity providers for the console's single sign-on (console.oidc).

``Provider``: a provider's three back-channel endpoints on 127.0.0.1
(token, userinfo, JWKS), answering what a test sets: ID tokens signed with a
real RSA key, spoiled as a test asks. The browser-facing authorization step
is the test's own: it reads the state and nonce the console sent with its
redirect, and comes back to the callback with a code.

``RealProvider``: django-oauth-toolkit in a process of its own, with its
login page, for the browser to sign in through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from rig.processes import ROOT, free_port, wait_until

CLIENT_ID = "lazaretto-console"
CLIENT_SECRET = "a-client-secret-for-the-tests"


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class Provider:
    """``claims``: what the next ID token and userinfo hold (the nonce is
    added per token); ``signing_key`` signs the ID token and ``published_key``
    is the one in the JWKS (another key: a token signed by a stranger)."""

    claims: dict[str, Any] = field(default_factory=dict)
    nonce: str = ""
    token_overrides: dict[str, Any] = field(default_factory=dict)
    signing_key: rsa.RSAPrivateKey = field(default_factory=rsa_key)
    published_key: rsa.RSAPrivateKey | None = None
    kid: str = "test-key-1"
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def issuer(self) -> str:
        return f"{self.url}/issuer"

    def settings(self) -> dict[str, Any]:
        """The console's settings for this provider."""
        return {
            "LAZARETTO_OIDC_ISSUER": self.issuer,
            "OIDC_RP_CLIENT_ID": CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_RP_SIGN_ALGO": "RS256",
            "OIDC_RP_SCOPES": "openid profile email",
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.url}/authorize",
            "OIDC_OP_TOKEN_ENDPOINT": f"{self.url}/token",
            "OIDC_OP_USER_ENDPOINT": f"{self.url}/userinfo",
            "OIDC_OP_JWKS_ENDPOINT": f"{self.url}/jwks",
            "OIDC_USE_PKCE": True,
            "OIDC_TIMEOUT": 2.0,
            "LOGIN_REDIRECT_URL_FAILURE": "/login/?sso=failed",
        }

    def id_token(self) -> str:
        now = int(time.time())
        payload = {
            "iss": self.issuer,
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": self.nonce,
            **self.claims,
            **self.token_overrides,
        }
        return jwt.encode(payload, self.signing_key, algorithm="RS256", headers={"kid": self.kid})

    def jwks(self) -> dict[str, Any]:
        public = (self.published_key or self.signing_key).public_key()
        key = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))
        return {"keys": [{**key, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def start(self) -> None:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/jwks":
                    self._answer(provider.jwks())
                elif self.path == "/userinfo":
                    self._answer(provider.claims)
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/token":
                    self._answer({"id_token": provider.id_token(), "access_token": "at-1"})
                else:
                    self.send_error(404)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


# --- a real provider ---------------------------------------------------------------


@dataclass
class RealProvider:
    """django-oauth-toolkit with OpenID Connect on (tests/support/oidc_provider)
    in a process of its own on 127.0.0.1, with its own database: its login
    page, its consent skipped for the console, RS256 ID tokens."""

    database_url: str
    port: int = field(default_factory=free_port)
    key_pem: str = ""
    _process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def issuer(self) -> str:
        return f"{self.url}/o"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.support.oidc_provider.settings",
            "IDP_DATABASE_URL": self.database_url,
            "IDP_ISSUER": self.issuer,
            "IDP_RSA_KEY": self.key_pem,
        }

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=self._env(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]

    def start(self, *, redirect_uri: str) -> None:
        self.key_pem = (
            rsa_key()
            .private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            .decode()
        )
        self._run("-m", "django", "migrate", "--noinput")
        self._run("-m", PEOPLE, "client", CLIENT_ID, CLIENT_SECRET, redirect_uri)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
            cwd=ROOT,
            env=self._env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(
            lambda: _answers(f"{self.issuer}/.well-known/openid-configuration"),
            timeout=30,
            what="the identity provider to answer",
        )

    def person(self, name: str, password: str, *groups: str) -> None:
        """The provider's user ``name``, in exactly these groups."""
        self._run("-m", PEOPLE, "user", name, password, *groups)

    def settings(self) -> dict[str, Any]:
        """The console's settings for this provider."""
        return {
            "LAZARETTO_OIDC_ISSUER": self.issuer,
            "LAZARETTO_OIDC_NAME": "Acme sign-on",
            "OIDC_RP_CLIENT_ID": CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_RP_SIGN_ALGO": "RS256",
            "OIDC_RP_SCOPES": "openid profile email",
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.issuer}/authorize/",
            "OIDC_OP_TOKEN_ENDPOINT": f"{self.issuer}/token/",
            "OIDC_OP_USER_ENDPOINT": f"{self.issuer}/userinfo/",
            "OIDC_OP_JWKS_ENDPOINT": f"{self.issuer}/.well-known/jwks.json",
            "OIDC_USE_PKCE": True,
            "OIDC_TIMEOUT": 5.0,
            "LOGIN_REDIRECT_URL_FAILURE": "/login/?sso=failed",
        }

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)


PEOPLE = "tests.support.oidc_provider.people"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False
