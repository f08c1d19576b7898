"""Consumer modules named by LAZARETTO_CONSUMER_MODULES: a package that lives
outside the project, on PYTHONPATH, loaded by real Celery workers (and by the
web side, which checks a queue's consumer against the same registry); and the
mistakes that must stop a process at start-up, naming the module."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker import consumers
from broker.models import Message, MessageState
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from rig.processes import ROOT, RedisServer, Workers, wait_until
from tests.support.processes import manage, refused_at_start_up

S = MessageState

# The README's example package, word for word.
BILLING_CONSUMERS = '''\
"""Billing consumers for Lazaretto."""

import json
import logging
import os
from pathlib import Path

from broker.consumers import Delivery, FormatError, register

logger = logging.getLogger(__name__)
LEDGER = Path(os.environ.get("BILLING_LEDGER", "/var/lib/billing/ledger.txt"))


@register("billing.invoice")
def invoice(delivery: Delivery) -> None:
    """Append the invoice to the ledger; an error here is retried."""
    with LEDGER.open("ab") as ledger:
        ledger.write(delivery.payload + b"\\n")


@register("billing.refund")
def refund(delivery: Delivery) -> None:
    """A refund is a JSON object with an amount; anything else cannot be
    read and goes straight to the dead-letter queue."""
    try:
        amount = json.loads(delivery.payload)["amount"]
    except (ValueError, TypeError, KeyError) as error:
        raise FormatError(f"not a refund: {error!r}") from None
    logger.info("refund of %s for message %s", amount, delivery.message_id)
'''


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A directory outside the project holding consumer packages."""
    directory = tmp_path / "site"
    write_package(directory, "billing_consumers", BILLING_CONSUMERS)
    return directory


def write_package(site: Path, name: str, source: str) -> None:
    package = site / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(source)


@pytest.fixture
def loaded(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """billing_consumers loaded in this (test) process too, as the console
    loads it, so queues may name its handlers; forgotten afterwards."""
    monkeypatch.setattr(consumers, "_HANDLERS", dict(consumers._HANDLERS))
    monkeypatch.syspath_prepend(str(site))
    consumers.load_consumer_modules(["billing_consumers"])
    yield
    sys.modules.pop("billing_consumers", None)


def python_path(*directories: Path) -> str:
    return os.pathsep.join([*map(str, directories), os.environ.get("PYTHONPATH", "")])


@pytest.mark.slow
def test_a_worker_delivers_to_the_handlers_of_a_package_outside_the_project(
    loaded: None, site: Path, tmp_path: Path, start_workers: Callable[..., Workers]
):
    ledger = tmp_path / "ledger.txt"
    invoices = queue_create(name="INVOICES.IN", consumer="billing.invoice")
    refunds = queue_create(name="REFUNDS.IN", consumer="billing.refund", retry_limit=5)
    start_workers(
        PYTHONPATH=python_path(site),
        LAZARETTO_CONSUMER_MODULES="demo_consumers,billing_consumers",
        BILLING_LEDGER=str(ledger),
    )

    invoice_ids = messages_publish(
        queue_name=invoices.name,
        messages=[NewMessage(payload=b"INV-1 100.00"), NewMessage(payload=b"INV-2 42.50")],
    )
    [good, bad] = messages_publish(
        queue_name=refunds.name,
        messages=[NewMessage(payload=b'{"amount": 5}'), NewMessage(payload=b"five euros")],
    )

    wait_until(
        lambda: Message.objects.filter(id__in=[*invoice_ids, good], state=S.DELIVERED).count() == 3,
        timeout=30,
        what="the invoices and the good refund delivered",
    )
    assert ledger.read_bytes() == b"INV-1 100.00\nINV-2 42.50\n"
    dead = wait_until(
        lambda: Message.objects.filter(id=bad, queue__name="SYSTEM.DEAD.LETTER.QUEUE").first(),
        timeout=30,
        what="the unreadable refund dead-lettered",
    )
    header = dead.dead_letter or {}
    assert header["reason"] == "format_error"
    assert "not a refund" in header["error"]
    assert dead.attempts == 1  # a format error is not retried


def test_a_queue_may_name_a_handler_of_a_loaded_module_and_not_of_an_unloaded_one(
    loaded: None, admin_api
):
    accepted = admin_api.post(
        "/api/v1/queues/", {"name": "INVOICES.IN", "consumer": "billing.invoice"}, format="json"
    )
    refused = admin_api.post(
        "/api/v1/queues/", {"name": "TAXES.IN", "consumer": "billing.taxes"}, format="json"
    )

    assert accepted.status_code == 201
    assert refused.status_code == 400
    assert "billing.invoice, billing.refund" in refused.json()["field_errors"]["consumer"][0]


@pytest.mark.slow
def test_the_console_process_loads_the_modules_the_variable_names(site: Path):
    result = manage(
        "shell",
        "-c",
        "from broker.consumers import handler_names; print(handler_names())",
        PYTHONPATH=python_path(site),
        LAZARETTO_CONSUMER_MODULES="billing_consumers",
    )

    assert result.returncode == 0, result.stderr
    assert "'billing.invoice', 'billing.refund', 'json', 'log', 'noop'" in result.stdout


# --- mistakes stop the worker, naming the module ---------------------------------


@pytest.fixture
def start_worker_expecting_failure(
    db: None, redis_server: RedisServer, tmp_path: Path
) -> Callable[..., tuple[int, str]]:
    def start(**env: str) -> tuple[int, str]:
        workers = Workers(directory=tmp_path, broker_url=redis_server.url, extra_env=env)
        command = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "deliveries"]
        result = subprocess.run(
            [*command, "-c", "1", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT,
            env=workers.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        return result.returncode, result.stdout + result.stderr

    return start


@pytest.mark.slow
def test_a_module_that_is_not_there_stops_the_worker(site: Path, start_worker_expecting_failure):
    code, output = start_worker_expecting_failure(
        PYTHONPATH=python_path(site),
        LAZARETTO_CONSUMER_MODULES="demo_consumers,billing_consumerz",
    )

    assert code != 0
    assert (
        "LAZARETTO_CONSUMER_MODULES: consumer module 'billing_consumerz' not found "
        "(no module named 'billing_consumerz'); put the directory that holds it on PYTHONPATH."
    ) in output


@pytest.mark.slow
def test_an_import_error_inside_a_module_is_told_apart_from_a_missing_module(
    site: Path, start_worker_expecting_failure
):
    write_package(site, "payroll_consumers", "import payroll_sdk_not_installed\n")

    code, output = start_worker_expecting_failure(
        PYTHONPATH=python_path(site), LAZARETTO_CONSUMER_MODULES="payroll_consumers"
    )

    assert code != 0
    assert (
        "LAZARETTO_CONSUMER_MODULES: consumer module 'payroll_consumers' was found but failed "
        "while it was imported: ModuleNotFoundError: No module named 'payroll_sdk_not_installed'"
    ) in output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("second", "registers", "first"),
    [
        ("invoicing_consumers", "billing.invoice", "billing_consumers"),
        ("chatty_consumers", "log", "broker.consumers"),
    ],
)
def test_a_handler_name_registered_twice_stops_the_worker(
    site: Path, start_worker_expecting_failure, second, registers, first
):
    write_package(
        site,
        second,
        "from broker.consumers import register\n\n"
        f"@register({registers!r})\n"
        "def handler(delivery):\n"
        "    pass\n",
    )

    code, output = start_worker_expecting_failure(
        PYTHONPATH=python_path(site),
        LAZARETTO_CONSUMER_MODULES=f"billing_consumers,{second}",
    )

    assert code != 0
    assert (
        f"LAZARETTO_CONSUMER_MODULES: consumer module {second!r} registers the handler name "
        f"{registers!r}, which {first} already registered"
    ) in output


@pytest.mark.slow
@pytest.mark.parametrize("value", ["billing consumers", "billing_consumers,,demo_consumers"])
def test_a_value_that_is_not_a_list_of_module_names_stops_start_up(value):
    error = refused_at_start_up("check", LAZARETTO_CONSUMER_MODULES=value)

    assert "LAZARETTO_CONSUMER_MODULES" in error


@pytest.mark.slow
def test_the_demo_command_says_which_module_it_needs():
    error = refused_at_start_up("demo", LAZARETTO_CONSUMER_MODULES="")

    assert "set LAZARETTO_CONSUMER_MODULES=demo_consumers" in error
