"""Users and roles from the command line: create (the password from stdin or
a prompt, never an argument), list, change a role, deactivate; each change an
audit event, bad input refused with nothing changed, and the instance never
left without an active admin. A deactivated user's session and API token
stop at once."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from broker.models import AuditEvent
from console.roles import Role, user_role
from console.tokens import token_create


def user(*args: str, stdin: str = "", monkeypatch: pytest.MonkeyPatch | None = None) -> str:
    out = io.StringIO()
    if monkeypatch is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    call_command("user", *args, stdout=out)
    return out.getvalue()


def signs_in(name: str, password: str) -> bool:
    response = Client().post("/login/", {"username": name, "password": password})
    return response.status_code == 302 and response.wsgi_request.user.is_authenticated


def test_a_user_is_created_with_a_role_and_signs_in(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = user(
        "create",
        "nina",
        "--role",
        "operator",
        stdin="a long pass phrase\n",
        monkeypatch=monkeypatch,
    )
    assert said == "User nina created with role operator.\n"
    nina = User.objects.get(username="nina")
    assert user_role(nina) == Role.OPERATOR
    assert signs_in("nina", "a long pass phrase")
    event = AuditEvent.objects.get(action="user.create")
    assert (event.actor_name, event.details) == ("system", {"user": "nina", "role": "operator"})
    listed = user("list")
    assert listed.startswith("nina\toperator\tactive\t")


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["create", "Nina", "--role", "viewer"], "pass phrase\n", "'Nina' already exists"),
        (["create", "omar", "--role", "root"], "pass phrase\n", "no role 'root'"),
        (["create", "omar", "--role", "viewer"], "\n", "give a password"),
        (["create", "o m a r", "--role", "viewer"], "pass phrase\n", "user name: Enter a valid"),
        (["role", "nobody", "admin"], "", "There is no user 'nobody'"),
        (["deactivate", "nobody"], "", "There is no user 'nobody'"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    db: None, monkeypatch: pytest.MonkeyPatch, args: list[str], stdin: str, message: str
) -> None:
    User.objects.create_user(username="nina", password="x")
    before = list(User.objects.values_list("username", "is_active").order_by("id"))
    with pytest.raises(CommandError, match=message):
        user(*args, stdin=stdin, monkeypatch=monkeypatch)
    assert list(User.objects.values_list("username", "is_active").order_by("id")) == before
    assert not AuditEvent.objects.filter(action__startswith="user.").exists()


def test_a_password_is_never_an_argument(db: None) -> None:
    with pytest.raises(CommandError, match="unrecognized arguments: hunter2"):
        user("create", "omar", "--role", "viewer", "hunter2")
    assert not User.objects.filter(username="omar").exists()


def test_a_role_changes_and_the_change_is_audited(admin: User, operator: User) -> None:
    assert user("role", operator.username, "viewer") == f"{operator.username} is now viewer.\n"
    operator.refresh_from_db()
    assert user_role(User.objects.get(id=operator.id)) == Role.VIEWER
    event = AuditEvent.objects.get(action="user.role")
    assert event.details == {"user": operator.username, "from": "operator", "to": "viewer"}


def test_the_last_active_admin_cannot_be_demoted_or_deactivated(
    admin: User, operator: User
) -> None:
    for args in (["role", admin.username, "operator"], ["deactivate", admin.username]):
        with pytest.raises(CommandError, match="is the only active admin"):
            user(*args)
    assert user_role(User.objects.get(id=admin.id)) == Role.ADMIN
    # With a second admin, the first may go.
    user("role", operator.username, "admin")
    user("deactivate", admin.username)
    assert not User.objects.get(id=admin.id).is_active


def test_a_deactivated_users_session_and_token_stop_at_once(admin: User, operator: User) -> None:
    browser = Client()
    browser.force_login(operator)
    _, key = token_create(user=operator, name="script")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert browser.get("/").status_code == 200
    assert api.get("/api/v1/queues/").status_code == 200

    said = user("deactivate", operator.username)
    assert "their sessions and API tokens stop working" in said

    page: Any = browser.get("/")
    assert page.status_code == 302
    assert page["Location"].startswith("/login/")
    assert api.get("/api/v1/queues/").status_code == 401
    assert AuditEvent.objects.filter(action="user.deactivate").count() == 1
    assert user("list").splitlines()[-1].split("\t")[:3] == [
        operator.username,
        "operator",
        "deactivated",
    ]
