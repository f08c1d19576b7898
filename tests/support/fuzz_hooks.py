"""schemathesis hooks for fuzzing the API from outside (scripts/fuzz.sh
loads this module through SCHEMATHESIS_HOOKS).

- The fuzzer signs in with one admin token, whose id LAZARETTO_FUZZ_TOKEN_ID
  names. Revoking it would turn every later call into a 401 and hide what
  those calls would find, so no generated call revokes that one token;
  every other token, the ones the fuzzer makes itself, stays fair game.
- A body meant to be valid that the operation's own schema refuses is
  dropped: schemathesis's coverage phase adds to closed objects keys it
  learnt from earlier answers (``field_errors``), and the API is right to
  refuse those, as the schema says it does."""

from __future__ import annotations

import os
from typing import Any

import schemathesis

OWN_TOKEN = os.environ.get("LAZARETTO_FUZZ_TOKEN_ID", "")


def _revokes_own_token(case: Any) -> bool:
    return (
        case.method.upper() == "DELETE"
        and case.path == "/api/v1/tokens/{token_id}/"
        and str((case.path_parameters or {}).get("token_id")) == OWN_TOKEN
    )


def _positive(case: Any) -> bool:
    """Generated to be valid (schemathesis's positive mode)."""
    meta = case.meta
    mode = None if meta is None else meta.generation.mode
    return str(getattr(mode, "value", mode)) == "positive"


def _valid_body_refused_by_its_schema(case: Any) -> bool:
    if not _positive(case):
        return False
    bodies = [body for body in case.operation.body if body.media_type == case.media_type]
    return bool(bodies) and isinstance(case.body, dict) and not bodies[0].is_valid(case.body)


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    return not (_revokes_own_token(case) or _valid_body_refused_by_its_schema(case))
