"""The console's Users page: admins only; it creates users, changes roles and
deactivates, each an audit event by the admin, errors beside their field,
and never leaves the instance without an active admin."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from broker.models import AuditEvent
from console.roles import Role, user_role
from tests.support.console import error_beside, logged_in


def test_only_admins_see_the_page_and_its_link(admin: User, operator: User, viewer: User) -> None:
    for user in (operator, viewer):
        client = logged_in(user)
        assert client.get("/users/").status_code == 403
        assert 'href="/users/"' not in client.get("/").content.decode()
    client = logged_in(admin)
    page = client.get("/users/").content.decode()
    assert f'data-user="{operator.username}"' in page
    assert 'href="/users/"' in client.get("/").content.decode()


def test_an_admin_creates_a_user(admin: User) -> None:
    response = logged_in(admin).post(
        "/users/", {"name": "nina", "role": "operator", "password": "a long pass phrase"}
    )
    assert response.status_code == 200
    assert "User nina created as operator." in response.content.decode()
    assert user_role(User.objects.get(username="nina")) == Role.OPERATOR
    event = AuditEvent.objects.get(action="user.create")
    assert event.actor_name == admin.username


@pytest.mark.parametrize(
    ("form", "field", "message"),
    [
        (
            {"name": "vera", "role": "viewer", "password": "long enough pass"},
            "name",
            "already exists",
        ),
        ({"name": "nina", "role": "viewer", "password": ""}, "password", "This field is required"),
        (
            {"name": "nina", "role": "root", "password": "long enough pass"},
            "role",
            "Select a valid",
        ),
        ({"name": "n i n a", "role": "viewer", "password": "long enough pass"}, "name", "valid"),
    ],
)
def test_bad_input_shows_beside_its_field_and_creates_nothing(
    admin: User, viewer: User, form: dict[str, str], field: str, message: str
) -> None:
    count = User.objects.count()
    page = logged_in(admin).post("/users/", form).content.decode()
    assert message in error_beside(page, field)
    assert User.objects.count() == count


def test_an_admin_changes_a_role_and_deactivates(admin: User, operator: User) -> None:
    client = logged_in(admin)
    client.post(f"/users/{operator.username}/role/", {"role": "viewer"})
    assert user_role(User.objects.get(id=operator.id)) == Role.VIEWER
    client.post(f"/users/{operator.username}/deactivate/")
    assert not User.objects.get(id=operator.id).is_active
    actions = list(
        AuditEvent.objects.filter(action__startswith="user.")
        .order_by("id")
        .values_list("action", "actor_name")
    )
    assert actions == [("user.role", admin.username), ("user.deactivate", admin.username)]


def test_the_last_admin_is_not_demoted_and_the_page_says_why(admin: User) -> None:
    client = logged_in(admin)
    page = client.post(f"/users/{admin.username}/role/", {"role": "viewer"}, follow=True)
    assert "is the only active admin" in page.content.decode()
    assert user_role(User.objects.get(id=admin.id)) == Role.ADMIN
    client.post(f"/users/{admin.username}/deactivate/")
    assert User.objects.get(id=admin.id).is_active
