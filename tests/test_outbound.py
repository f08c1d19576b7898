"""Webhooks go to public addresses only, unless the operator lists the
network: every form of a private address is refused, at save and at each
connection, on the address the connection then uses (a name that resolves
elsewhere later is caught)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from ipaddress import ip_network
from typing import Any

import pytest

from broker import outbound
from broker.outbound import DestinationRefused, check_url, outbound_client


@pytest.fixture(autouse=True)
def public_only(settings: Any) -> None:
    """The rule as it stands by default: no network listed."""
    settings.LAZARETTO_WEBHOOK_ALLOWED_NETWORKS = []


def resolving(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> list[str]:
    """A DNS stub: each name resolves to its list of addresses; the names
    asked, in order."""
    asked: list[str] = []

    def fake(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        asked.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]

    monkeypatch.setattr(outbound, "getaddrinfo", fake)
    return asked


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:5432/", "127.0.0.1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
        ("http://[::1]/", "::1 is a loopback address"),
        ("http://2130706433/", "2130706433 (127.0.0.1) is a loopback address"),
        ("http://0177.0.0.1/", "0177.0.0.1 (127.0.0.1) is a loopback address"),
        ("http://0x7f.1/", "0x7f.1 (127.0.0.1) is a loopback address"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1 (127.0.0.1) is a loopback address"),
        ("http://10.1.2.3/", "10.1.2.3 is a private address"),
        ("http://0.0.0.0/", "0.0.0.0 is a"),
        ("http://224.0.0.251/", "224.0.0.251 is a multicast address"),
        ("http://internal.example/", "internal.example (10.0.0.1) is a private address"),
        ("http://nowhere.example/", "nowhere.example does not resolve"),
    ],
)
def test_a_url_that_names_no_public_address_is_refused(
    monkeypatch: pytest.MonkeyPatch, url: str, why: str
) -> None:
    resolving(monkeypatch, {"internal.example": ["10.0.0.1"]})
    with pytest.raises(DestinationRefused, match=why.replace("(", r"\(").replace(")", r"\)")):
        check_url(url)


def test_a_public_address_and_a_listed_network_are_allowed(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    resolving(
        monkeypatch,
        {"hooks.example": ["93.184.216.34"], "mixed.example": ["93.184.216.34", "10.0.0.9"]},
    )
    check_url("https://hooks.example/in")
    check_url("http://93.184.216.34/")
    # Every address a name has must be allowed, not only the first.
    with pytest.raises(DestinationRefused, match=r"mixed.example \(10.0.0.9\) is a private"):
        check_url("http://mixed.example/")
    settings.LAZARETTO_WEBHOOK_ALLOWED_NETWORKS = [ip_network("10.0.0.0/8")]
    check_url("http://mixed.example/")
    check_url("http://10.1.2.3/")


@pytest.fixture
def local_server() -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on loopback; the Host header of each request it got."""
    hosts: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hosts.append(self.headers["Host"])
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], hosts
    finally:
        server.shutdown()


def test_a_name_that_resolves_to_loopback_at_connect_time_is_refused(
    monkeypatch: pytest.MonkeyPatch, local_server: tuple[int, list[str]]
) -> None:
    port, hosts = local_server
    answers = {"hooks.example": ["93.184.216.34"]}
    asked = resolving(monkeypatch, answers)
    check_url(f"http://hooks.example:{port}/")  # saved: public then
    answers["hooks.example"] = ["127.0.0.1"]  # rebound since
    with outbound_client(timeout=2) as client, pytest.raises(DestinationRefused, match="loopback"):
        client.post(f"http://hooks.example:{port}/", content=b"{}")
    assert hosts == []
    assert asked == ["hooks.example", "hooks.example"]


def test_a_connection_goes_to_the_address_checked_with_the_urls_host(
    monkeypatch: pytest.MonkeyPatch, settings: Any, local_server: tuple[int, list[str]]
) -> None:
    port, hosts = local_server
    settings.LAZARETTO_WEBHOOK_ALLOWED_NETWORKS = [ip_network("127.0.0.0/8")]
    resolving(monkeypatch, {"hooks.example": ["127.0.0.1"]})
    with outbound_client(timeout=2) as client:
        response = client.post(f"http://hooks.example:{port}/in", content=b"{}")
    assert response.status_code == 204
    assert hosts == [f"hooks.example:{port}"]


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:5432/", "http://169.254.169.254/", "http://[::1]/", "http://2130706433/"],
)
def test_the_api_refuses_such_a_webhook_beside_its_field(admin_api: Any, url: str) -> None:
    from broker.models import Queue

    answer = admin_api.post("/api/v1/queues/", {"name": "HOOKED", "consumer": url}, format="json")
    assert answer.status_code == 400
    assert answer.data["code"] == "invalid"
    [error] = answer.data["field_errors"]["consumer"]
    assert error.startswith("Not an allowed webhook: ")
    assert "webhooks go to public addresses only" in error
    assert not Queue.objects.filter(name="HOOKED").exists()


def test_a_delivery_to_an_address_no_longer_allowed_fails_without_the_socket_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from broker.consumers import Delivery, HandlerError, WebhookOptions, _post_webhook

    resolving(monkeypatch, {"hooks.example": ["10.0.0.7"]})
    delivery = Delivery(
        message_id=1,
        queue="Q",
        payload=b"{}",
        content_type="application/json",
        headers={},
        attempt=1,
        isolated=False,
    )
    with pytest.raises(
        HandlerError, match=r"not an allowed destination: hooks.example \(10.0.0.7\)"
    ):
        _post_webhook("http://hooks.example/in", delivery, WebhookOptions(timeout=1.0, secret=""))
