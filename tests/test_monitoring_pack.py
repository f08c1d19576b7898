"""The monitoring pack in deploy/: the Prometheus rules pass promtool's check
and their unit tests, every expression of the rules and of the Grafana
dashboard is valid PromQL, and each metric they name is one /metrics
exposes, scraped from the application with a little of everything in the
database."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from broker.models import Queue
from broker.services.dead_letters import dead_letter_scan
from broker.services.delivery import queue_deliver
from broker.services.heartbeats import heartbeat
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_activate, rule_table_create
from tests.support.messages import blacklisted, dead_lettered
from tests.support.publishing import published

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy/prometheus/lazaretto-rules.yml"
RULE_TESTS = ROOT / "deploy/prometheus/lazaretto-rules.test.yml"
DASHBOARD = ROOT / "deploy/grafana/lazaretto-dashboard.json"

# What a Grafana panel's expression may hold that PromQL does not, and what
# stands in for it when promtool checks the expression.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$queue": ".*"}


def promtool() -> str:
    """promtool's path; its absence fails the test, never skips it."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not on PATH: `bash scripts/promtool.sh` installs it from Debian's "
            "prometheus package (make test and make test-fast run that first)"
        )
    return found


def run_promtool(*arguments: str | Path, cwd: Path) -> None:
    result = subprocess.run(
        [promtool(), *map(str, arguments)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (
        f"promtool {' '.join(map(str, arguments))}:\n{result.stdout}{result.stderr}"
    )


def rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def panel_targets(panels: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in panels:
        for target in panel.get("targets", []):
            yield panel["title"], target
        yield from panel_targets(panel.get("panels", []))


def dashboard_expressions() -> dict[str, str]:
    """Each panel query's expression, by panel title and query id."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        f"{title} {target['refId']}": target["expr"]
        for title, target in panel_targets(dashboard["panels"])
    }


def template_metrics() -> set[str]:
    """The metrics the dashboard's template variables read values from."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        metric
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
        for metric in re.findall(r"label_values\(\s*([A-Za-z_:][\w:]*)", variable["definition"])
    }


def as_promql(expression: str) -> str:
    for variable, stand_in in GRAFANA_VARIABLES.items():
        expression = expression.replace(variable, stand_in)
    assert "$" not in expression, f"a Grafana variable the test does not know: {expression}"
    return expression


# --- promtool -----------------------------------------------------------------


@pytest.mark.slow
def test_promtool_finds_the_rules_valid() -> None:
    run_promtool("check", "rules", RULES, cwd=RULES.parent)


@pytest.mark.slow
def test_each_alert_fires_and_stays_quiet_as_its_unit_tests_expect() -> None:
    run_promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }

    assert {rule["alert"] for rule in rules()} == tested


def test_every_alert_has_a_severity_a_summary_and_a_description() -> None:
    for rule in rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


@pytest.mark.slow
def test_promtool_finds_every_dashboard_expression_valid(tmp_path: Path) -> None:
    recording = [
        {"record": f"lazaretto_dashboard:query_{number}", "expr": as_promql(expression)}
        for number, expression in enumerate(dashboard_expressions().values())
    ]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recording}]}))

    run_promtool("check", "rules", path, cwd=tmp_path)


# --- the metrics they name ------------------------------------------------------

# What PromQL spells with the letters of a metric name but is not one.
PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
}


def metric_names(expression: str) -> set[str]:
    """The metrics a PromQL expression selects: its names that are not
    functions, keywords, labels (matchers and grouping lists), strings,
    durations or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expression)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for found in re.finditer(r"(?<![\w.$:])[A-Za-z_:][\w:]*", text):
        calls = text[found.end() :].lstrip().startswith("(")
        if not calls and found.group().lower() not in PROMQL_WORDS:
            names.add(found.group())
    return names


def test_metric_names_are_read_from_promql_as_prometheus_would() -> None:
    expression = (
        'histogram_quantile(0.99, sum by (queue, le) (rate(a_bucket{queue=~"$queue"}[5m])))'
        " > on (queue) group_left (state) max without (instance) (b_total offset 1h) * 1e3"
        ' or label_replace(c, "duty", "sweeper", "", "") and d:recorded'
    )

    assert metric_names(expression) == {"a_bucket", "b_total", "c", "d:recorded"}


@pytest.fixture
def every_family(transactional_db: None) -> None:
    """A little of everything /metrics reports: messages in each state,
    delivered in this process (the latency histogram), dead-lettered and
    handled by a dead-letter rule, blacklisted, and a worker's heartbeat."""
    dead_letter_queue = queue_create(name="PACK.DLQ", kind="dead_letter")
    orders = queue_create(name="PACK.ORDERS", consumer="noop", dead_letter_queue=dead_letter_queue)
    dead_lettered(orders, 2)
    published(orders, 5)
    assert queue_deliver(queue_id=orders.id, worker="test:1").acked == 5
    blacklisted(orders, 1)
    published(orders, 3)
    rule_table_activate(
        table=rule_table_create(
            queue=dead_letter_queue,
            text="RETRYINT(0) WAIT(NO)\nDESTQ(PACK.ORDERS) ACTION(DISCARD)\n",
        )
    )
    dead_letter_scan(queue=Queue.objects.get(id=dead_letter_queue.id))
    heartbeat(name="control")


def exposed_samples() -> set[str]:
    """The names of the samples GET /metrics answers, as Prometheus stores
    them: a counter's ``_total``, a histogram's ``_bucket``, ``_sum`` and
    ``_count``."""
    response = Client().get("/metrics")
    assert response.status_code == 200, response.content
    return {
        sample.name
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def test_every_metric_the_rules_and_the_dashboard_name_is_on_metrics(every_family) -> None:
    used = {f"rule {rule['alert']}": metric_names(rule["expr"]) for rule in rules()}
    used |= {
        f"panel {name}": metric_names(expression)
        for name, expression in dashboard_expressions().items()
    }
    used["the dashboard's template variables"] = template_metrics()
    exposed = exposed_samples()

    missing = {where: names - exposed for where, names in used.items() if names - exposed}

    assert all(used.values()), used
    assert not missing, f"not on /metrics: {missing}"
