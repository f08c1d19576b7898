"""Production settings pass Django's deployment check; a server without its
secret key refuses to start."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from rig.processes import ROOT, free_port
from tests.support.processes import manage

pytestmark = pytest.mark.slow

SECURE = {
    "SECURE_SSL_REDIRECT": "true",
    "SESSION_COOKIE_SECURE": "true",
    "CSRF_COOKIE_SECURE": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
}


def production(**overrides: str) -> dict[str, str]:
    """This environment without DEBUG, the secret key or any HTTPS setting
    (as a fresh production host has it), plus ``overrides``."""
    dropped = {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", *SECURE}
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env["ALLOWED_HOSTS"] = "lazaretto.example.com"
    env.update(overrides)
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return manage("check", "--deploy", "--fail-level", "WARNING", environ=env, timeout=120)


def test_check_deploy_is_clean_with_production_settings():
    result = check_deploy(production(SECRET_KEY=secrets.token_urlsafe(50), **SECURE))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_without_debug_the_defaults_are_the_production_settings():
    result = check_deploy(production(SECRET_KEY=secrets.token_urlsafe(50)))

    assert result.returncode == 0, result.stdout + result.stderr


def test_the_local_http_settings_make_run_uses_fail_the_deploy_check():
    local = dict.fromkeys(SECURE, "false") | {"SECURE_HSTS_SECONDS": "0"}

    result = check_deploy(production(SECRET_KEY=secrets.token_urlsafe(50), **local))

    assert result.returncode != 0
    for warning in ("W004", "W008", "W012", "W016"):
        assert f"security.{warning}" in result.stderr


def test_a_missing_secret_key_stops_the_server_from_starting():
    result = subprocess.run(
        [
            *(sys.executable, "-m", "gunicorn", "-c", "python:console.gunicorn_conf"),
            *("--bind", f"127.0.0.1:{free_port()}", "console.wsgi:application"),
        ],
        cwd=ROOT,
        env=production(**SECURE),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "SECRET_KEY: not set and has no default; see .env.example." in result.stderr


def test_a_missing_secret_key_stops_manage_py_with_a_clear_message():
    result = check_deploy(production(**SECURE))

    assert result.returncode != 0
    assert "SECRET_KEY: not set and has no default; see .env.example." in result.stderr
