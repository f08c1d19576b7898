"""Per-queue grants leak nothing: a leak matrix over every operation of the
API (from the OpenAPI schema) and every page of the console (from the URL
table), so that a new endpoint is covered without editing this file.

A user with operator on ``ORDERS.*`` alone, and no installation role, asks
every operation about the objects of the PAYMENTS side (messages in every
state, bulk and replay jobs, rules tables, a replay schedule, archived rows,
alert episodes, audit events, a subscription, another user's token), and
every operation about those of the ORDERS side, and every mix of the two
(an ORDERS queue's page acting on a PAYMENTS message, an ORDERS message
forwarded to a PAYMENTS queue). A queue the user may not see is answered as
one that does not exist (404), lists show only what the user sees, and no
byte of a PAYMENTS payload, nor any text only PAYMENTS objects hold, appears
in any answer; on the ORDERS side the same operations go through.

Every request runs in a savepoint rolled back after it, so each meets the
same world, and what it wrote (its audit events: every change writes one)
is read before the rollback. Every problem is collected before the test
fails, in one table.
"""

from __future__ import annotations

import html
import itertools
import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.messages.storage.cookie import CookieStorage
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.db.models import Max
from django.http import HttpRequest
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from broker.models import AuditEvent
from console.tokens import token_create
from tests.support.grants import PAYMENTS_MARKER, Side, World, build_world, marker_forms

pytestmark = pytest.mark.django_db

SIDES = ("ORDERS", "PAYMENTS")

# --- exemptions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Exemption:
    """Installation-wide objects and pages that no grant on a queue pattern
    reaches: answers other than 404 that are right for the user on either
    side (``allowed``), for ``method`` (None: any) on paths whose template
    matches ``pattern``."""

    method: str | None
    pattern: str
    allowed: frozenset[int]
    reason: str


EXEMPTIONS = [
    Exemption(
        None,
        r"^/(api/v1/)?(users|groups|grants)/",
        frozenset({403}),
        "user, group and grant management stays admin-only",
    ),
    Exemption(
        None,
        r"^/(api/v1/)?ha/",
        frozenset({403}),
        "the HA page and its commands stay admin-only",
    ),
    Exemption(
        "POST",
        r"^/(api/v1/)?queues/$",
        frozenset({403}),
        "creating a queue needs admin on its name; operator on ORDERS.* is not that",
    ),
    Exemption(
        None,
        r"^/(api/v1/)?(topics|subscriptions)/",
        frozenset({403}),
        "topics and subscriptions are installation-wide, managed by admins",
    ),
    Exemption(
        "GET",
        r"^/api/v1/topics/\{name\}/$",
        frozenset({200}),
        "a topic is installation-wide and may be read, without the subscriptions of "
        "queues the user does not see",
    ),
]

# Console routes left out, by URL name, and why.
CONSOLE_SKIPPED = {
    "login": "signing in: the test is signed in already (it redirects)",
    "logout": "signing out would end the session the matrix runs in",
    "oidc_authentication_init": "single sign-on's steps: off without an issuer (tests/test_sso.py)",
    "oidc_authentication_callback": "single sign-on's steps: off without an issuer (tests/test_sso.py)",
}
# Console routes under api/: the schema covers /api/v1/; /api/schema/,
# /api/docs/ and /api/redoc/ describe the API and hold no queue data; ^api/
# is the JSON 404 of unknown API paths.
CONSOLE_SKIPPED_PREFIX = ("api/", "^api/")

# Installation-wide by design, unchanged by grants: queue names may show
# there (the payload marker still may not).
NAMES_ALLOWED = {"/metrics": "Prometheus metrics stay installation-wide, labelled by queue"}


def exemption(method: str, template: str) -> Exemption | None:
    for rule in EXEMPTIONS:
        if (rule.method is None or rule.method == method) and re.search(rule.pattern, template):
            return rule
    return None


def exempt(method: str, template: str, status: int) -> bool:
    return any(
        (rule.method is None or rule.method == method)
        and re.search(rule.pattern, template)
        and status in rule.allowed
        for rule in EXEMPTIONS
    )


# --- parameters: one mapping from a parameter's name to what it names ----------------


@dataclass(frozen=True)
class Kind:
    """What a parameter names: ``keys`` of a Side (attributes, or message
    states), or values whatever the side (``unscoped``)."""

    keys: tuple[str, ...] = ()
    unscoped: tuple[Any, ...] = ()

    def values(self, side: Side) -> list[Any]:
        if self.unscoped:
            return list(self.unscoped)
        return [
            side.messages[key] if key in side.messages else getattr(side, key) for key in self.keys
        ]


ALL_MESSAGES = Kind(("waiting", "blacklisted", "dead", "delivered", "binary"))


def _segment(template: str) -> str:
    """The first segment of a path, under the console or /api/v1/."""
    return template.removeprefix("/api/v1/").strip("/").split("/")[0]


def _action(template: str) -> str:
    """The last segment when it is a word (release, pause, ...), else ''."""
    last = template.strip("/").split("/")[-1]
    return "" if "{" in last else last


def name_kind(template: str) -> Kind | None:
    return {
        "queues": Kind(("queue_in", "queue_dlq")),
        "dead-letters": Kind(("queue_dlq",)),
        "dead-letter-queues": Kind(("queue_dlq",)),
        "topics": Kind(("topic",)),
        "subscriptions": Kind(("subscription",)),
        "users": Kind(unscoped=("payments_pat",)),
        "groups": Kind(("group",)),
    }.get(_segment(template))


def message_kind(template: str) -> Kind:
    if _segment(template) in {"dead-letters", "dead-letter-queues"}:
        return Kind(("dead",))
    return {
        "release": Kind(("blacklisted", "binary")),
        "fail": Kind(("blacklisted",)),
        "purge": Kind(("blacklisted",)),
        "retry": Kind(("dead",)),
        "discard": Kind(("dead",)),
        "forward": Kind(("dead",)),
        "resubmit": Kind(("blacklisted", "dead")),
        "dump": Kind(("blacklisted", "binary")),
    }.get(_action(template), ALL_MESSAGES)


def job_kind(template: str) -> Kind | None:
    return {
        "jobs": Kind(("bulk_job",)),
        "replay": Kind(("replay_job",)),
        "replay-jobs": Kind(("replay_job",)),
    }.get(_segment(template))


# Every path parameter of the API and the console, by name. A parameter
# missing here fails the test: add it, naming what it refers to.
PATH_PARAMETERS: dict[str, Callable[[str], Kind | None]] = {
    "name": name_kind,
    "message_id": message_kind,
    "id": message_kind,
    "job_id": job_kind,
    "table_id": lambda template: Kind(("rules_draft", "rules_active")),
    # A version number is the queue's own: its side is the queue's.
    "version": lambda template: Kind(unscoped=(1, 2)),
    "schedule_id": lambda template: Kind(("schedule",)),
    # Another user's token on the PAYMENTS side, the user's own on ORDERS.
    "token_id": lambda template: Kind(("token",)),
    # The grant of payments_pat on PAYMENTS.*, orders_op's own on ORDERS.*.
    "grant_id": lambda template: Kind(("grant",)),
    # The side's user: payments_pat, or orders_op.
    "user": lambda template: Kind(("user",)),
    "export_id": lambda template: Kind(unscoped=("EXPORT",)),  # the world's one export
    "verb": lambda template: Kind(unscoped=("retry", "forward", "discard")),
}

# Query parameters that name an object, as the schema lists them (the API)
# or a page's filter form does (the console). Others are left out.
QUERY_PARAMETERS: dict[str, Callable[[str], Kind]] = {
    "queue": lambda template: Kind(("queue_dlq",))
    if "rule-tables" in template
    else Kind(("queue_in", "queue_dlq")),
    "source_queue": lambda template: Kind(("queue_dlq",)),
    "target_queue": lambda template: Kind(("queue_in",)),
    "message_id": lambda template: Kind(("blacklisted",)),
    "message": lambda template: Kind(("blacklisted",)),
}


# --- request bodies --------------------------------------------------------------------


def _new_name(template: str, side: Side) -> str:
    return {
        "queues": f"{side.prefix}.NEW",
        "topics": f"{side.prefix}.NEWTOPIC",
        "subscriptions": f"{side.prefix}.NEWSUB",
        "replay-schedules": f"{side.prefix.lower()}-new-schedule",
    }.get(_segment(template), "leak-matrix")


# API body fields filled from the side the body is about, by name; ``p`` is
# the call's path values (a purge's confirmation repeats the queue's name).
BODY_FIELDS: dict[str, Callable[[str, Side, dict[str, Any]], Any]] = {
    "queue": lambda t, s, p: s.queue_dlq if "rule-tables" in t else s.queue_in,
    "queues": lambda t, s, p: [s.queue_in],
    "source_queue": lambda t, s, p: s.queue_dlq,
    "target_queue": lambda t, s, p: s.queue_in,
    "dead_letter_queue": lambda t, s, p: s.queue_dlq,
    "ids": lambda t, s, p: [s.messages["blacklisted"]],
    "name": lambda t, s, p: _new_name(t, s),
    "confirm": lambda t, s, p: p.get("name", ""),
    "topic": lambda t, s, p: s.topic,
    "topic_string": lambda t, s, p: f"{s.prefix.lower()}/new",
    "topic_filter": lambda t, s, p: f"{s.topic_string}/#",
    "payload": lambda t, s, p: "leak matrix",
    "text": lambda t, s, p: "* leak matrix\nACTION(IGNORE)\n",
    "rules_text": lambda t, s, p: "",
    "cron": lambda t, s, p: "0 4 * * *",
    "primary": lambda t, s, p: "B",
    "action": lambda t, s, p: "release",
    "source": lambda t, s, p: "dead_letter",
}
# Optional fields filled all the same: those that name an object.
FILL_OPTIONAL = {
    "queue",
    "queues",
    "source_queue",
    "target_queue",
    "dead_letter_queue",
    "ids",
    "filter",
    "cron",
}


class Schema:
    """The served OpenAPI schema, and a minimal body for a request schema."""

    def __init__(self) -> None:
        self.document = SchemaGenerator().get_schema(request=None, public=True)
        self.components = self.document["components"]["schemas"]

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = self.components[schema["$ref"].split("/")[-1]]
        return schema

    def example(
        self, schema: dict[str, Any], template: str, side: Side, path: dict[str, Any]
    ) -> Any:
        schema = self.resolve(schema)
        if "oneOf" in schema:  # the first shape: text message, by ids, dead-letter source
            return self.example(schema["oneOf"][0], template, side, path)
        if "allOf" in schema:
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                merged.update(self.example(part, template, side, path))
            return merged
        if "enum" in schema:
            return next(value for value in schema["enum"] if value is not None)
        kind = schema.get("type", "object")
        if isinstance(kind, list):
            kind = next(k for k in kind if k != "null")
        if kind == "object":
            required = set(schema.get("required", ()))
            body = {}
            for name, property_schema in schema.get("properties", {}).items():
                if property_schema.get("readOnly") or (
                    name not in required and name not in FILL_OPTIONAL
                ):
                    continue
                if name in BODY_FIELDS:
                    body[name] = BODY_FIELDS[name](template, side, path)
                else:
                    body[name] = self.example(property_schema, template, side, path)
            return body
        if kind == "array":
            return [self.example(schema.get("items", {}), template, side, path)]
        if kind in {"integer", "number"}:
            return max(1, schema.get("minimum", 1))
        if kind == "boolean":
            return False
        return "leak-matrix"


def _schedule_form(side: Side) -> dict[str, Any]:
    return {
        "name": f"{side.prefix.lower()}-new-schedule",
        **_replay_form(side),
        "cron": "0 4 * * *",
        "time_zone": "UTC",
        "cool_off_minutes": "0",
        "give_up_after": "3",
        "enabled": "on",
    }


def _replay_form(side: Side) -> dict[str, Any]:
    return {
        "source": "dead_letter",
        "source_queue": side.queue_dlq,
        "queues": side.queue_in,
        "target_queue": side.queue_in,
    }


# Console forms, by URL name: what a plain POST of the page's form sends (a
# route not listed posts an empty form: enough to see whether it looks its
# object up first). ``p`` is the call's path values.
CONSOLE_FORMS: dict[str, Callable[[Side, dict[str, Any]], dict[str, Any]]] = {
    "queue-new": lambda s, p: {"name": f"{s.prefix}.NEW", "kind": "standard"},
    "queue-publish": lambda s, p: {
        "payload": "leak matrix",
        "content_type": "text/plain",
        "headers": "",
        "priority": "4",
    },
    "queue-limits": lambda s, p: {"max_messages": "100", "overflow": "reject_new"},
    "queue-pause": lambda s, p: {"paused": "1"},
    "queue-purge": lambda s, p: {"confirmation": p.get("name", "")},
    "queue-import": lambda s, p: {
        "file": SimpleUploadedFile(
            "messages.jsonl", b'{"payload": "leak matrix"}\n', "application/x-ndjson"
        )
    },
    "message-release": lambda s, p: {"reason": "leak matrix"},
    "message-fail": lambda s, p: {"reason": "leak matrix"},
    "message-purge": lambda s, p: {"reason": "leak matrix"},
    "message-resubmit": lambda s, p: {
        "queue": s.queue_in,
        "content_type": "text/plain",
        "priority": "4",
        "headers": "{}",
        "payload": "leak matrix",
    },
    "blacklist-bulk": lambda s, p: {
        "action": "release",
        "scope": "selected",
        "ids": [str(s.messages["blacklisted"])],
    },
    "replay-new": lambda s, p: _replay_form(s),
    "replay-preview": lambda s, p: _replay_form(s),
    "schedule-new": lambda s, p: _schedule_form(s),
    "schedule-edit": lambda s, p: _schedule_form(s),
    "rules-editor": lambda s, p: {"text": "* leak matrix\nACTION(IGNORE)\n", "intent": "dry-run"},
    "dead-letter-act": lambda s, p: {
        "reason": "leak matrix",
        **({"queue": s.queue_in} if p.get("verb") == "forward" else {}),
    },
    "topic-new": lambda s, p: {"name": f"{s.prefix}.NEWTOPIC", "topic_string": "x/new"},
    "subscription-new": lambda s, p: {
        "name": f"{s.prefix}.NEWSUB",
        "topic": s.topic,
        "topic_filter": f"{s.topic_string}/#",
        "queue": f"{s.prefix}.NEWFEED",
        "overflow": "reject_new",
    },
    "subscription-edit": lambda s, p: {
        "topic_filter": f"{s.topic_string}/#",
        "overflow": "reject_new",
    },
    "time-zone": lambda s, p: {"time_zone": "Europe/Paris"},
    "tokens": lambda s, p: {"name": "leak-matrix"},
    "ha-resolve": lambda s, p: {"primary": "B"},
}


# --- operations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    kind: str  # "api" or "console"
    method: str
    template: str  # /api/v1/queues/{name}/ or /queues/{name}/
    ident: str  # operationId or URL name
    params: tuple[str, ...]
    filters: tuple[str, ...] = ()  # query parameters that name objects
    required_query: tuple[str, ...] = ()
    body_schema: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    content_type: str = ""


def api_operations(schema: Schema, problems: list[str]) -> list[Operation]:
    """Every path and method of the schema."""
    operations = []
    for template, methods in schema.document["paths"].items():
        for method, operation in methods.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            parameters = operation.get("parameters", [])
            query = [p for p in parameters if p["in"] == "query"]
            required = tuple(p["name"] for p in query if p.get("required"))
            problems += [
                f"{method.upper()} {template}: required query parameter {name!r} is not in "
                "QUERY_PARAMETERS; add it, naming what it refers to"
                for name in required
                if name not in QUERY_PARAMETERS
            ]
            content = operation.get("requestBody", {}).get("content", {})
            content_type = (
                "application/json" if "application/json" in content else next(iter(content), "")
            )
            operations.append(
                Operation(
                    kind="api",
                    method=method.upper(),
                    template=template,
                    ident=operation["operationId"],
                    params=tuple(p["name"] for p in parameters if p["in"] == "path"),
                    filters=tuple(p["name"] for p in query if p["name"] in QUERY_PARAMETERS),
                    required_query=required,
                    body_schema=content.get(content_type, {}).get("schema"),
                    content_type=content_type,
                )
            )
    return operations


def console_operations(skipped: dict[str, str]) -> list[Operation]:
    """Every route of the console's URL table but the API's, GET and POST."""
    routes: list[tuple[str, str]] = []

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if route.startswith(CONSOLE_SKIPPED_PREFIX):
                skipped[route] = "under /api/: the schema's operations cover it"
            elif isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern):
                if pattern.name in CONSOLE_SKIPPED:
                    skipped[route] = CONSOLE_SKIPPED[pattern.name]
                else:
                    routes.append((route, pattern.name or route))

    walk(get_resolver().url_patterns, "")
    operations = []
    for route, name in routes:
        template = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        params = tuple(re.findall(r"\{(\w+)\}", template))
        for method in ("GET", "POST"):
            operations.append(
                Operation(
                    kind="console", method=method, template=template, ident=name, params=params
                )
            )
    return operations


def get_form_fields(page: str) -> set[str]:
    """The names of the fields of a page's GET forms (its filters)."""
    names: set[str] = set()
    for form in re.finditer(r"<form\b([^>]*)>(.*?)</form>", page, re.S | re.I):
        method = re.search(r"""method\s*=\s*["']?(\w+)""", form.group(1), re.I)
        if method and method.group(1).lower() != "get":
            continue
        names |= set(
            re.findall(
                r"""<(?:input|select|textarea)\b[^>]*\bname\s*=\s*["']([^"']+)""",
                form.group(2),
                re.I,
            )
        )
    return names


AREAS = {
    "queues": "queues",
    "messages": "messages",
    "blacklist": "triage/bulk",
    "jobs": "triage/bulk",
    "replay": "replay",
    "replay-jobs": "replay",
    "archive": "archive",
    "topics": "topics",
    "subscriptions": "topics",
    "alerts": "alerts",
    "audit": "audit",
    "dead-letters": "dead letters",
    "dead-letter-queues": "dead letters",
    "": "dashboard",
    "tokens": "tokens",
    "users": "users",
    "groups": "users",
    "grants": "users",
    "ha": "ha",
}
TRIAGE = {"release", "fail", "purge", "retry", "discard", "forward", "resubmit", "bulk"}


def area_of(template: str) -> str:
    segment = _segment(template)
    if segment == "messages" and _action(template) in TRIAGE:
        return "triage/bulk"
    if "rules" in template or segment == "rule-tables":
        return "rules"
    if "schedules" in template:
        return "schedules"
    return AREAS.get(segment, "other")


# --- calls: operations filled from the sides ------------------------------------------


@dataclass
class Call:
    op: Operation
    path: str
    query: dict[str, Any]
    body: Any  # a JSON value, bytes, a form (dict), or None
    # The side each scoped part was filled from: {"name": "PAYMENTS", "body": "ORDERS"}.
    slots: dict[str, str]
    values: dict[str, Any]  # the path's values

    @property
    def scope(self) -> str:
        sides = set(self.slots.values())
        if sides - {"ORDERS"}:
            return "PAYMENTS"
        return "ORDERS" if sides else "unscoped"

    @property
    def path_names_payments(self) -> bool:
        return any(side != "ORDERS" for slot, side in self.slots.items() if slot in self.op.params)

    @property
    def shown(self) -> str:
        return f"{self.path}?{urlencode(self.query)}" if self.query else self.path

    @property
    def slots_shown(self) -> str:
        sides = set(self.slots.values())
        if len(sides) <= 1:
            return next(iter(sides), "-")
        return " ".join(f"{slot.lstrip('?')}={side[0]}" for slot, side in self.slots.items())

    def text(self) -> str:
        """Everything the request says, to tell an echo from a leak."""
        body = self.body
        if isinstance(body, bytes):
            return f"{self.shown} {body.decode(errors='replace')}"
        if isinstance(body, dict):
            body = {key: str(value) for key, value in body.items()}
        return f"{self.shown} {json.dumps(body)}"

    def key(self) -> str:
        return f"{self.op.method} {self.shown} {_comparable(self.body)}"


def _comparable(body: Any) -> str:
    if isinstance(body, dict):
        return json.dumps({key: str(value) for key, value in body.items()}, sort_keys=True)
    return repr(body)


class Filler:
    """The calls of each operation: filled from the ORDERS side, from the
    PAYMENTS side, and from every mix of the two over its scoped parts (path
    parameters, query filter, body)."""

    def __init__(
        self, world: World, schema: Schema, problems: list[str], page: Callable[[str], str]
    ) -> None:
        self.world = world
        self.schema = schema
        self.problems = problems
        self.page = page  # a console page's HTML as the user sees it
        self.sides = {"PAYMENTS": world.payments, "ORDERS": world.orders, "GHOST": world.ghost}

    def kind_of(self, op: Operation, param: str) -> Kind | None:
        mapping = PATH_PARAMETERS.get(param)
        if mapping is None:
            self.problems.append(
                f"{op.method} {op.template}: path parameter {param!r} is not in "
                "PATH_PARAMETERS; add it, naming what it refers to on each side"
            )
            return None
        kind = mapping(op.template)
        if kind is None:
            self.problems.append(
                f"{op.method} {op.template}: PATH_PARAMETERS[{param!r}] does not say what it "
                f"names under /{_segment(op.template)}/; add that"
            )
        elif kind.unscoped == ("EXPORT",):
            kind = Kind(unscoped=(self.world.export,))
        return kind

    def body(self, op: Operation, side: Side, path: dict[str, Any]) -> Any:
        if op.kind == "console":
            form = CONSOLE_FORMS.get(op.ident)
            return None if op.method != "POST" else form(side, path) if form else {}
        if op.body_schema is None:
            return None
        if op.content_type != "application/json":
            return b'{"payload": "leak matrix"}\n'
        return self.schema.example(op.body_schema, op.template, side, path)

    def filters(self, op: Operation) -> tuple[str, ...]:
        if op.kind == "api" or op.method != "GET" or op.params:
            return op.filters
        return tuple(sorted(get_form_fields(self.page(op.template)) & set(QUERY_PARAMETERS)))

    def calls(self, op: Operation) -> list[Call]:
        kinds: dict[str, Kind] = {}
        for param in op.params:
            kind = self.kind_of(op, param)
            if kind is None:
                return []
            kinds[param] = kind
        choices: list[str | None] = [] if op.required_query else [None]
        choices += list(self.filters(op))
        calls: dict[str, Call] = {}
        for query_param in choices:
            for call in self._calls(op, kinds, query_param):
                calls.setdefault(call.key(), call)
        return list(calls.values())

    def _path_combos(
        self, kinds: dict[str, Kind], assignment: dict[str, str]
    ) -> list[dict[str, Any]]:
        uniform = len(set(assignment.values())) <= 1
        lists = []
        for param, kind in kinds.items():
            values = kind.values(self.sides[assignment.get(param, "ORDERS")])
            lists.append(values if uniform or kind.unscoped else values[:1])
        return [dict(zip(kinds, combo, strict=True)) for combo in itertools.product(*lists)]

    def _calls(self, op: Operation, kinds: dict[str, Kind], query_param: str | None) -> list[Call]:
        slots = [param for param, kind in kinds.items() if not kind.unscoped]
        if query_param:
            slots.append(f"?{query_param}")
        paths = self._path_combos(kinds, dict.fromkeys(slots, "PAYMENTS"))
        if any(
            _comparable(self.body(op, self.world.payments, path))
            != _comparable(self.body(op, self.world.orders, path))
            for path in paths
        ):
            slots.append("body")
        assignments = [
            dict(zip(slots, sides, strict=True))
            for sides in itertools.product(SIDES, repeat=len(slots))
        ]
        calls = []
        for assignment in assignments:
            uniform = len(set(assignment.values())) <= 1
            queries: list[Any] = [None]
            if query_param:
                side = self.sides[assignment[f"?{query_param}"]]
                queries = QUERY_PARAMETERS[query_param](op.template).values(side)
                queries = queries if uniform else queries[:1]
            for path, query in itertools.product(self._path_combos(kinds, assignment), queries):
                calls.append(self.fill(op, assignment, path, query_param, query))
        return calls

    def fill(
        self,
        op: Operation,
        assignment: dict[str, str],
        values: dict[str, Any],
        query_param: str | None,
        query_value: Any,
    ) -> Call:
        path = op.template
        for param, value in values.items():
            path = path.replace("{" + param + "}", str(value))
        body = self.body(op, self.sides[assignment.get("body", "ORDERS")], values)
        slots = dict(assignment)
        if "body" in slots and _comparable(body) == _comparable(
            self.body(op, self.world.orders, values)
        ):
            slots["body"] = "ORDERS"  # this path's body names nothing of a side
        return Call(
            op=op,
            path=path,
            query={query_param: query_value} if query_param else {},
            body=body,
            slots=slots,
            values=values,
        )

    def ghost_of(self, call: Call) -> Call:
        """The call with every PAYMENTS part naming nothing that exists."""
        ghostly = {
            slot: "GHOST" if side == "PAYMENTS" else side for slot, side in call.slots.items()
        }
        values = dict(call.values)
        for param in call.op.params:
            if ghostly.get(param) == "GHOST":
                kind = self.kind_of(call.op, param)
                assert kind is not None
                values[param] = kind.values(self.world.ghost)[0]
        query_param = next(iter(call.query), None)
        query_value = call.query.get(query_param) if query_param else None
        if query_param and ghostly[f"?{query_param}"] == "GHOST":
            kind = QUERY_PARAMETERS[query_param](call.op.template)
            query_value = kind.values(self.world.ghost)[0]
        return self.fill(call.op, ghostly, values, query_param, query_value)


# --- running a call --------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str
    wrote: list[AuditEvent]
    error: str = ""
    location: str = ""
    # The console's flash messages the answer set (shown on the next page).
    flash: list[str] = field(default_factory=list)

    @property
    def seen(self) -> bytes:
        """Everything the user is shown: the body and the flash messages."""
        return b"\n".join([self.body, *(text.encode() for text in self.flash)])

    def said(self, world: World) -> list[str]:
        """What a console answer says about the request, names and numbers
        masked: its flash messages and the errors beside its fields."""
        errors = re.findall(
            r"""<[^>]*class=["'][^"']*\berror\b[^"']*["'][^>]*>(.*?)</""",
            self.body.decode(errors="replace"),
            re.S,
        )
        masked = []
        for text in [*self.flash, *errors]:
            text = html.unescape(re.sub(r"<[^>]+>", "", text))
            for side in (world.payments, world.ghost):
                text = text.replace(side.queue_in, "<IN>").replace(side.queue_dlq, "<DLQ>")
            masked.append(re.sub(r"\d+", "<n>", text).strip())
        return masked

    def code(self) -> str:
        """An API error's ``code``."""
        try:
            document = json.loads(self.body)
        except ValueError:
            return ""
        return str(document.get("code", "")) if isinstance(document, dict) else ""


FLASH = CookieStorage(HttpRequest())


def run(client: APIClient, call: Call) -> Answer:
    """The call's answer, in a savepoint rolled back after it, with the
    audit events it wrote and the flash messages it set (taken from the
    client, so that no later page shows them)."""
    if isinstance(call.body, dict):
        for value in call.body.values():
            if hasattr(value, "seek"):
                value.seek(0)  # an upload read by an earlier run of the call
    with transaction.atomic():
        last = AuditEvent.objects.aggregate(last=Max("id"))["last"] or 0
        method = call.op.method
        response: Any
        if method == "GET":
            response = client.get(call.path, call.query)
        elif call.body is None:
            response = client.generic(method, call.shown)
        elif call.op.kind == "console":
            response = client.post(call.shown, call.body)
        elif isinstance(call.body, bytes):
            response = client.generic(
                method, call.shown, call.body.decode(), content_type=call.op.content_type
            )
        else:
            response = client.generic(
                method, call.shown, json.dumps(call.body), content_type="application/json"
            )
        body = (
            b"".join(response.streaming_content)
            if getattr(response, "streaming", False)
            else response.content
        )
        exc_info = getattr(response, "exc_info", None)
        error = f"{exc_info[0].__name__}: {exc_info[1]}"[:160] if exc_info else ""
        try:
            wrote = list(AuditEvent.objects.filter(id__gt=last))
        except Exception as failure:  # the view left the transaction unusable
            wrote = [AuditEvent(action=f"? {type(failure).__name__}")]
        transaction.set_rollback(True)
    cookie = response.cookies.get(CookieStorage.cookie_name)
    messages = FLASH._decode(cookie.value) if cookie else None  # type: ignore[attr-defined]
    flash = [str(message) for message in messages or []]
    client.cookies.pop(CookieStorage.cookie_name, None)
    return Answer(
        status=response.status_code,
        body=body,
        content_type=response.get("Content-Type", ""),
        wrote=wrote,
        error=error,
        location=response.get("Location", ""),
        flash=flash,
    )


# --- judging an answer -----------------------------------------------------------------

HREFS = {
    "message": "/messages/{}/",
    "bulk_job": "/jobs/{}/",
    "replay_job": "/replay/{}/",
    "schedule": "/replay/schedules/{}/",
}


class Judge:
    """What of the PAYMENTS side an answer shows."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.marker_forms = marker_forms(PAYMENTS_MARKER)
        self.secrets = [secret.encode() for secret in world.payments.secrets]
        ids = world.payments.object_ids()
        self.message_ids = ids["message"]
        self.hrefs = [
            pattern.format(object_id).encode()
            for kind, pattern in HREFS.items()
            for object_id in ids[kind]
        ]

    def marker(self, body: bytes) -> bool:
        return any(form in body for form in self.marker_forms)

    def shows_orders_payload(self, answer: Answer) -> bool:
        return any(form in answer.body for form in marker_forms(self.world.orders.marker))

    def leaks(self, call: Call, answer: Answer) -> list[str]:
        """What of the PAYMENTS side the answer says that the request did not."""
        found = []
        seen = answer.seen
        secrets = [secret.decode() for secret in self.secrets if secret in seen]
        if secrets:
            found.append("PAYMENTS-only text " + ", ".join(secrets))
        if "payments" not in call.text().lower() and call.path not in NAMES_ALLOWED:
            names = sorted({name.decode() for name in re.findall(rb"(?i)payments[\w.\-]*", seen)})
            names = [name for name in names if name.encode() not in self.secrets]
            if names:
                found.append("names " + ", ".join(names[:5]))
        return found

    def acted(self, answer: Answer) -> list[str]:
        """The audit events a request wrote about PAYMENTS objects."""
        return [
            f"{event.action}({event.queue_name or event.message_id or '-'})"
            for event in answer.wrote
            if event.queue_name.upper().startswith("PAYMENTS")
            or event.message_id in self.message_ids
            or "payments" in json.dumps(event.details).lower()
            or event.action.startswith("?")
        ]

    def objects_listed(self, answer: Answer) -> bool:
        """Whether a list's answer holds PAYMENTS objects."""
        if self.marker(answer.body) or any(secret in answer.body for secret in self.secrets):
            return True
        if "html" in answer.content_type:
            return any(href in answer.body for href in self.hrefs)
        if "application/json" in answer.content_type:
            try:
                document = json.loads(answer.body)
            except ValueError:
                return False
            if isinstance(document, dict):
                document = document.get("results", document)
            return "payments" in json.dumps(document).lower()
        return "payments" in answer.body.decode(errors="replace").lower()

    @staticmethod
    def listed(answer: Answer) -> int | None:
        """How many items a JSON or JSON Lines list holds; None: not a list."""
        if "ndjson" in answer.content_type:
            return len([line for line in answer.body.splitlines() if line.strip()])
        if "json" not in answer.content_type:
            return None
        try:
            document = json.loads(answer.body)
        except ValueError:
            return None
        if isinstance(document, dict) and isinstance(document.get("results"), list):
            return len(document["results"])
        return len(document) if isinstance(document, list) else None


@dataclass
class Row:
    call: Call
    answer: Answer
    problems: list[str]
    marker: bool

    def sort_key(self) -> tuple[str, ...]:
        return (
            area_of(self.call.op.template),
            self.call.op.kind,
            self.call.path,
            self.call.op.method,
        )

    def line(self) -> str:
        status = str(self.answer.status)
        if self.answer.location:
            status += f" -> {self.answer.location}"
        return (
            f"| {area_of(self.call.op.template):<12} | {self.call.op.kind:<7} | "
            f"{self.call.op.method:<6} | {self.call.shown:<50} | {self.call.slots_shown:<13} | "
            f"{status:<6} | {'LEAKED' if self.marker else 'no':<6} | {'; '.join(self.problems)}"
        )


@dataclass
class Matrix:
    filler: Filler
    judge: Judge
    client: APIClient  # orders_op
    control: APIClient  # oscar, an installation-wide operator
    seen: dict[str, Answer] = field(default_factory=dict)  # answers already had, by call
    rows: list[Row] = field(default_factory=list)
    checked: int = 0

    def check(self, call: Call) -> None:
        answer = self.seen.pop(call.key(), None) or run(self.client, call)
        self.checked += 1
        marker = self.judge.marker(answer.seen)
        problems = ["the PAYMENTS payload marker in the body"] if marker else []
        problems += self.judge.leaks(call, answer)
        if answer.status >= 500:
            problems.append(f"server error {answer.error}")
        elif call.scope == "PAYMENTS":
            problems += self.payments_problems(call, answer)
        else:
            problems += self.own_problems(call, answer)
        if problems:
            self.rows.append(Row(call, answer, problems, marker))

    def payments_problems(self, call: Call, answer: Answer) -> list[str]:
        """A call naming a PAYMENTS object: answered as if it did not exist."""
        acted = self.judge.acted(answer) if call.op.method != "GET" else []
        problems = [f"acted on PAYMENTS: wrote {', '.join(acted[:3])}"] if acted else []
        status = answer.status
        if status == 404 or exempt(call.op.method, call.op.template, status):
            return problems
        if status == 405 and call.op.kind == "console":
            return problems  # the route does not take the method, whatever it names
        ghost = run(self.client, self.filler.ghost_of(call))
        world = self.filler.world
        if call.op.kind == "console":
            same = ghost.status == status and ghost.said(world) == answer.said(world)
        else:
            same = ghost.status == status and ghost.code() == answer.code()
        if call.path_names_payments:
            return [
                *problems,
                f"expected 404 (the path names a PAYMENTS object), got {status}; "
                f"a name of nothing gets {ghost.status}{' too' if same else ''}",
            ]
        if call.op.method == "GET" and 200 <= status < 300:
            if self.judge.objects_listed(answer):
                return [*problems, "PAYMENTS objects in the list"]
            return problems
        if same and not acted:
            return problems  # answered as for a name of nothing (a form's error, say)
        if call.op.kind == "console" and ghost.status == status:
            return [
                *problems,
                f"answered {status} unlike a name of nothing: says {answer.said(world)[:2]}, "
                f"for nothing {ghost.said(world)[:2]}",
            ]
        return [
            *problems,
            f"expected 404 (a PAYMENTS object in the request), got {status} {answer.code()}; "
            f"a name of nothing gets {ghost.status} {ghost.code()}".rstrip(),
        ]

    def own_problems(self, call: Call, answer: Answer) -> list[str]:
        """A call naming ORDERS objects, or none: it goes through."""
        status = answer.status
        what = "the ORDERS side" if call.scope == "ORDERS" else "no side's objects"
        if exempt(call.op.method, call.op.template, status):
            return []
        if status == 403:
            control = run(self.control, call)
            if control.status == 403:
                return []  # it needs admin: an installation-wide operator is refused too
            return [f"403 on {what}; an installation-wide operator gets {control.status}"]
        if status == 404:
            return [f"404 on {what}"]
        if status == 405 and call.op.kind == "console":
            return []
        if call.op.method == "GET" and not 200 <= status < 400:
            return [f"GET answered {status} {answer.code()} on {what}".rstrip()]
        if (
            call.scope == "ORDERS"
            and call.op.method == "GET"
            and status == 200
            and _segment(call.op.template) == "messages"
            and "message_id" in call.op.params
            and not self.judge.shows_orders_payload(answer)
        ):
            # The canary: the user's own payload shows, in a form the marker
            # check knows; else that check could miss the PAYMENTS one.
            return ["the ORDERS payload does not show in any form the marker check knows"]
        if (
            call.scope == "ORDERS"
            and call.op.kind == "api"
            and call.op.method == "GET"
            and call.query
            and status == 200
            and self.judge.listed(answer) == 0
        ):
            return [f"the ORDERS objects are missing from the list filtered by {call.query}"]
        return []

    def report(self) -> str:
        header = (
            f"| {'area':<12} | {'kind':<7} | {'method':<6} | {'path':<50} | {'PAYMENTS':<13} | "
            f"{'status':<6} | {'marker':<6} | problems"
        )
        rows = sorted(self.rows, key=Row.sort_key)
        return "\n".join([header, *(row.line() for row in rows)])


# --- the tests -------------------------------------------------------------------------


@pytest.fixture
def world(settings: Any, tmp_path: Any, dumps: Any) -> World:
    settings.ARCHIVE_DIR = tmp_path / "archive"
    return build_world(settings.ARCHIVE_DIR)


def signed_in(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    client.raise_request_exception = False
    return client


def test_a_user_with_operator_on_orders_sees_nothing_of_payments(world: World) -> None:
    client = signed_in(world.orders_op)
    seen: dict[str, Answer] = {}

    def page(template: str) -> str:
        """A console page as the user sees it (kept: the matrix asks for it too)."""
        op = Operation(kind="console", method="GET", template=template, ident="", params=())
        call = Call(op=op, path=template, query={}, body=None, slots={}, values={})
        seen[call.key()] = run(client, call)
        return seen[call.key()].body.decode(errors="replace")

    problems: list[str] = []
    schema = Schema()
    skipped: dict[str, str] = {}
    with quiet_requests():
        operations = api_operations(schema, problems) + console_operations(skipped)
        filler = Filler(world, schema, problems, page)
        calls = [call for op in operations for call in filler.calls(op)]
        if problems:
            pytest.fail(
                "The matrix cannot fill every operation:\n" + "\n".join(problems), pytrace=False
            )
        assert {"PAYMENTS", "ORDERS"} <= {call.scope for call in calls}
        matrix = Matrix(
            filler=filler,
            judge=Judge(world),
            client=client,
            control=signed_in(world.oscar),
            seen=seen,
        )
        for call in calls:
            matrix.check(call)

    if matrix.rows:
        pytest.fail(
            f"{len(matrix.rows)} of {matrix.checked} requests ({len(operations)} operations) "
            "leak or fail for orders_op (operator on ORDERS.* by a grant, no role). PAYMENTS: "
            "which parts of the request named PAYMENTS objects (P) and which ORDERS ones (O); "
            "marker: whether the PAYMENTS payload marker was in the body.\n" + matrix.report(),
            pytrace=False,
        )


@contextmanager
def quiet_requests() -> Iterator[None]:
    """Django logs every 4xx (a 403 with its traceback): hundreds here, by
    design. Errors (5xx) are still logged."""
    logger = logging.getLogger("django.request")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def test_a_narrowed_token_holds_no_more_than_its_pattern_and_role(world: World) -> None:
    _token, key = token_create(
        user=world.orders_op, name="orders-in-viewer", only_pattern="ORDERS.IN", at_most="viewer"
    )
    client = APIClient()
    client.raise_request_exception = False
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    blacklisted = world.orders.messages["blacklisted"]

    def status(method: str, path: str, body: Any = None) -> int:
        op = Operation(kind="api", method=method, template=path, ident="", params=())
        return run(client, Call(op=op, path=path, query={}, body=body, slots={}, values={})).status

    expected = {
        ("GET", "/api/v1/queues/ORDERS.IN/", None): 200,  # in its pattern: readable
        ("POST", f"/api/v1/messages/{blacklisted}/release/", "{}"): 403,  # viewer at most
        ("POST", f"/api/v1/messages/{blacklisted}/fail/", "{}"): 403,
        ("GET", "/api/v1/queues/ORDERS.OUT/", None): 404,  # outside its pattern
        ("GET", "/api/v1/queues/ORDERS.OUT/messages/", None): 404,
    }
    answered = {
        (method, path, body): status(method, path, {} if body else None)
        for method, path, body in expected
    }
    assert answered == expected, "\n".join(
        f"{method} {path}: {answered[(method, path, body)]}, expected {want}"
        for (method, path, body), want in expected.items()
        if answered[(method, path, body)] != want
    )
