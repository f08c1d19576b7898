"""The API answers as its OpenAPI schema says, tried from outside as a
client would: scripts/fuzz.sh serves the API with gunicorn (DEBUG off, on a
database of its own with the demo's data) and runs schemathesis over the
served schema with an admin's token: every phase (the schema's examples,
coverage of each constraint's edges, generated input, and the stateful
phase that follows links from what one call made to the calls that use
it) and every check. A schema-valid request refused, an invalid one
accepted, a response off its schema or of an undocumented content type,
a 5xx: each is a failure. `make fuzz` runs the same for longer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from drf_spectacular.generators import SchemaGenerator
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parent.parent
# A run bounded by cases, not by time: every phase draws MAX_EXAMPLES per
# operation (the coverage phase, every edge of every constraint, whatever
# that takes), so the seeded run sends the same 4,800-odd requests however
# busy the machine is; about 110 s on one core of two.
MAX_EXAMPLES = 20
MIN_CASES = 4000
TIMEOUT_SECONDS = 600


@pytest.mark.fuzz
def test_schemathesis_finds_no_failure_from_outside(tmp_path):
    # One schemathesis worker: the suite runs beside other tests, and two
    # of its workers have been seen to trip over each other's cache.
    env = {**os.environ, "FUZZ_SECONDS": "0", "FUZZ_REPORTS": str(tmp_path), "FUZZ_WORKERS": "1"}
    run = subprocess.run(
        [
            "bash",
            "scripts/fuzz.sh",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            "29",
            "--no-color",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    report = run.stdout[-20000:] + run.stderr[-3000:]
    sys.stdout.write(report)
    generated = re.search(r"(\d+) generated", run.stdout)
    assert generated, report
    assert int(generated.group(1)) >= MIN_CASES, report
    assert run.returncode == 0, report
    assert re.search(r"Stateful \(in [0-9.]+s\)", run.stdout), report


def test_every_default_the_schema_states_is_a_valid_value():
    """A generated client sends a field's default when the caller leaves it
    out: a default its own constraints refuse (a blank default on a field
    that may not be blank) would make every such call fail."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    wrong = []
    for name, component in schema["components"]["schemas"].items():
        for field, definition in component.get("properties", {}).items():
            default = definition.get("default")
            # A reference's default (an enum's) is checked by its schema's own
            # validation.
            if "default" not in definition or "$ref" in json.dumps(definition):
                continue
            errors = Draft202012Validator(definition).iter_errors(default)
            wrong += [f"{name}.{field}: {error.message}" for error in errors]
    assert wrong == []


def test_every_operation_states_the_503_of_an_outage():
    """A client generated from the schema knows that any call may be
    answered 503 while the store or Redis cannot be reached, with the
    error body and its code."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    missing = [
        f"{method.upper()} {path}"
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if "redis_unavailable" not in str(operation["responses"].get("503", {}).get("description"))
    ]
    assert missing == []


def test_the_schema_is_openapi_3_1_and_says_null_its_way():
    """Every schema in it is valid JSON Schema 2020-12 (OpenAPI 3.1's), and
    null is a "null" in a type list: 3.0's ``nullable``, which 3.1 ignores,
    would make a null answer off its schema; ``oneOf: [{}, null]`` refuses
    a null, which matches both."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    found: list[str] = []

    def visit(node: object, where: str) -> None:
        if isinstance(node, list):
            for index, item in enumerate(node):
                visit(item, f"{where}[{index}]")
        if not isinstance(node, dict):
            return
        if "nullable" in node:
            found.append(f"{where}: nullable")
        if isinstance(node.get("oneOf"), list) and {} in node["oneOf"]:
            found.append(f"{where}: oneOf with {{}}")
        for key, value in node.items():
            visit(value, f"{where}/{key}")

    visit(schema["paths"], "paths")
    visit(schema["components"], "components")
    meta = Draft202012Validator(Draft202012Validator.META_SCHEMA)
    for name, component in schema["components"]["schemas"].items():
        found += [f"{name}: {error.message}" for error in meta.iter_errors(component)]
    assert schema["openapi"] == "3.1.0"
    assert found == []
