"""Managing who may touch which queue: grants and groups through
``manage.py grant`` and ``group``, the REST API and the console's Users and
Groups pages; narrowed tokens through the API; a user with no
installation-wide role. Every change is an audit event."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

from broker.models import AuditEvent
from broker.services.queues import queue_create
from console.grants import Grantee, grant_add
from console.models import ApiToken, Grant
from console.roles import Role
from console.users import user_create, user_set_role
from tests.support.console import error_beside, logged_in

pytestmark = pytest.mark.django_db
GRANTS = "/api/v1/grants/"
GROUPS = "/api/v1/groups/"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def a_user(name: str, role: str = "none") -> User:
    return user_create(name=name, role=role, password="a long enough password 7", actor=None)


# --- manage.py ----------------------------------------------------------------------


def test_the_commands_make_a_team_grant_it_a_pattern_and_take_it_back():
    a_user("ana")

    assert run("group", "create", "orders-team") == "Group orders-team created.\n"
    assert run("group", "add", "orders-team", "ana") == "ana is a member of orders-team.\n"
    said = run("grant", "add", "ORDERS.*", "operator", "--group", "orders-team")
    [grant] = Grant.objects.all()
    assert said == f"Grant {grant.id}: operator on ORDERS.* to orders-team.\n"
    assert run("grant", "list") == f"{grant.id}\tORDERS.*\toperator\tgroup orders-team\n"
    assert run("group", "list") == "orders-team\tmembers: ana\tgrants: operator on ORDERS.*\n"

    run("grant", "remove", str(grant.id))
    run("group", "remove", "orders-team", "ana")
    run("group", "delete", "orders-team")

    assert not Grant.objects.exists()
    assert not Group.objects.filter(name="orders-team").exists()
    assert list(
        AuditEvent.objects.filter(action__regex=r"^(grant|group)\.")
        .order_by("id")
        .values_list("action", "actor_name")
    ) == [
        ("group.create", "system"),
        ("group.add", "system"),
        ("grant.add", "system"),
        ("grant.remove", "system"),
        ("group.remove", "system"),
        ("group.delete", "system"),
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("grant", "add", "ORDERS.[", "viewer", "--user", "ana"), "not valid"),
        (("grant", "add", "ORDERS.*", "owner", "--user", "ana"), "not valid"),
        (("grant", "add", "ORDERS.*", "viewer", "--user", "nobody"), "not valid"),
        (("grant", "add", "ORDERS.*", "viewer", "--group", "nobody"), "not valid"),
        (("grant", "add", "ORDERS.*", "viewer"), "not valid"),
        (("grant", "remove", "999"), "There is no grant 999."),
        (("group", "add", "nobody", "ana"), "There is no group 'nobody'."),
        (("group", "create", "admin"), "admin is a role"),
    ],
)
def test_a_command_with_bad_input_says_why_and_changes_nothing(args, said):
    a_user("ana")

    with pytest.raises(CommandError, match=said):
        run(*args)

    assert not Grant.objects.exists()
    assert not AuditEvent.objects.filter(action__regex=r"^(grant|group)\.").exists()


# --- the API ------------------------------------------------------------------------


def test_an_admin_manages_grants_and_groups_through_the_api(admin_api):
    a_user("ana")

    team = admin_api.post(GROUPS, {"name": "orders-team"}, format="json")
    assert team.status_code == 201
    assert (
        admin_api.post(f"{GROUPS}orders-team/members/", {"user": "ana"}, format="json").status_code
        == 204
    )
    made = admin_api.post(
        GRANTS, {"pattern": "ORDERS.*", "role": "operator", "group": "orders-team"}, format="json"
    )
    assert made.status_code == 201, made.json()
    assert made.json() | {"created_at": None} == {
        "id": made.json()["id"],
        "pattern": "ORDERS.*",
        "role": "operator",
        "user": "",
        "group": "orders-team",
        "created_at": None,
    }
    [listed] = admin_api.get(GROUPS).json()
    assert listed["members"] == ["ana"]
    assert [grant["pattern"] for grant in listed["grants"]] == ["ORDERS.*"]

    assert admin_api.delete(f"{GRANTS}{made.json()['id']}/").status_code == 204
    assert admin_api.delete(f"{GROUPS}orders-team/members/ana/").status_code == 204
    assert admin_api.delete(f"{GROUPS}orders-team/").status_code == 204
    assert admin_api.get(GRANTS).json() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"pattern": "ORDERS IN", "role": "viewer", "user": "ana"}, "pattern"),
        ({"pattern": "*" + "A" * 49, "role": "viewer", "user": "ana"}, "pattern"),
        ({"pattern": "ORDERS.*", "role": "root", "user": "ana"}, "role"),
        ({"pattern": "ORDERS.*", "role": "viewer", "user": "nobody"}, "user"),
        ({"pattern": "ORDERS.*", "role": "viewer", "group": "nobody"}, "group"),
        ({"pattern": "ORDERS.*", "role": "viewer", "group": "viewer"}, "group"),
        ({"pattern": "ORDERS.*", "role": "viewer"}, "user"),
        ({"pattern": "ORDERS.*", "role": "viewer", "user": "ana", "group": "t"}, "user"),
    ],
)
def test_a_bad_grant_is_a_400_naming_its_field_and_saves_nothing(admin_api, body, field):
    a_user("ana")

    response = admin_api.post(GRANTS, body, format="json")

    assert response.status_code == 400, response.json()
    assert field in response.json()["field_errors"]
    assert not Grant.objects.exists()


@pytest.mark.parametrize("who", ["viewer_api", "operator_api"])
def test_only_an_admin_of_the_installation_manages_grants(request, who):
    client = request.getfixturevalue(who)

    assert client.get(GRANTS).status_code == 403
    assert client.post(GROUPS, {"name": "t"}, format="json").status_code == 403


def test_a_queue_admin_by_grant_is_no_admin_of_the_installation(client):
    ana = a_user("ana")
    grant_add(pattern="ORDERS.*", role="admin", to=Grantee(user="ana"), actor=None)
    client.force_login(ana)

    assert client.get("/api/v1/grants/").status_code == 403
    assert client.get("/users/").status_code == 403
    assert client.get("/groups/").status_code == 403
    assert client.get("/ha/").status_code == 403


def test_nobody_grants_more_than_they_hold():
    queue_create(name="ORDERS.IN")
    ana, bob = a_user("ana"), a_user("bob")
    grant_add(pattern="ORDERS.*", role="operator", to=Grantee(user="ana"), actor=None)

    from broker.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        grant_add(pattern="ORDERS.*", role="admin", to=Grantee(user="bob"), actor=ana)
    assert (
        "You do not hold admin on every queue ORDERS.* matches."
        in refused.value.field_errors["role"]
    )
    with pytest.raises(InvalidInput):
        grant_add(pattern="*", role="viewer", to=Grantee(user="bob"), actor=ana)
    grant_add(pattern="ORDERS.IN", role="viewer", to=Grantee(user="bob"), actor=ana)
    assert [g.pattern for g in Grant.objects.filter(user=bob)] == ["ORDERS.IN"]


# --- narrowed tokens through the API ----------------------------------------------------


def test_a_token_is_narrowed_through_the_api_and_never_wider_than_its_user(operator_api):
    made = operator_api.post(
        "/api/v1/tokens/",
        {"name": "orders reader", "only_pattern": "ORDERS.IN", "at_most": "viewer"},
        format="json",
    )
    assert made.status_code == 201, made.json()
    assert (made.json()["only_pattern"], made.json()["at_most"]) == ("ORDERS.IN", "viewer")
    token = ApiToken.objects.get(name="orders reader")
    assert (token.only_pattern, token.at_most) == ("ORDERS.IN", Role.VIEWER)

    wider = operator_api.post(
        "/api/v1/tokens/", {"name": "too wide", "at_most": "admin"}, format="json"
    )
    assert wider.status_code == 400
    assert "at_most" in wider.json()["field_errors"]
    assert not ApiToken.objects.filter(name="too wide").exists()


# --- the console ----------------------------------------------------------------------


def test_an_admin_grants_on_the_users_page_and_takes_it_back(admin):
    a_user("ana")
    client = logged_in(admin)

    page = client.post(
        "/grants/",
        {"pattern": "ORDERS.*", "role": "operator", "user": "ana"},
        HTTP_HX_REQUEST="true",
    ).content.decode()

    [grant] = Grant.objects.all()
    assert f'data-grant="{grant.id}"' in page
    assert "ana holds operator on ORDERS.*." in page
    client.post(f"/grants/{grant.id}/remove/")
    assert not Grant.objects.exists()


def test_a_bad_grant_on_the_users_page_is_shown_beside_its_field(admin):
    client = logged_in(admin)

    page = client.post(
        "/grants/",
        {"pattern": "ORDERS IN", "role": "operator", "user": "ana"},
        HTTP_HX_REQUEST="true",
    ).content.decode()

    assert "Use the characters of a queue name" in error_beside(page, "pattern")
    assert not Grant.objects.exists()


def test_an_admin_makes_a_team_on_the_groups_page_and_adds_a_member(admin):
    a_user("ana")
    client = logged_in(admin)

    client.post("/groups/", {"name": "orders-team"})
    page = client.post(
        "/groups/orders-team/members/add/", {"user": "ana"}, HTTP_HX_REQUEST="true"
    ).content.decode()

    assert 'data-group="orders-team"' in page
    assert list(
        Group.objects.get(name="orders-team").user_set.values_list("username", flat=True)
    ) == ["ana"]


def test_a_user_may_have_no_installation_wide_role():
    ana = a_user("ana", role="viewer")

    user_set_role(name="ana", role="none", actor=None)

    assert not ana.groups.exists()
    assert run("user", "list").startswith("ana\tnone\t")


def test_a_token_is_narrowed_on_the_tokens_page_and_says_what_it_holds(operator):
    client = logged_in(operator)

    page = client.post(
        "/tokens/",
        {"name": "orders reader", "only_pattern": "ORDERS.*", "at_most": "viewer"},
        HTTP_HX_REQUEST="true",
    ).content.decode()

    token = ApiToken.objects.get(name="orders reader")
    assert (token.only_pattern, token.at_most) == ("ORDERS.*", Role.VIEWER)
    assert "viewer on <code>ORDERS.*</code>" in page


def test_a_token_wider_than_its_user_is_refused_beside_the_field(viewer):
    page = (
        logged_in(viewer)
        .post("/tokens/", {"name": "too wide", "at_most": "operator"}, HTTP_HX_REQUEST="true")
        .content.decode()
    )

    assert "You do not hold operator on every queue * matches." in error_beside(page, "at_most")
    assert not ApiToken.objects.filter(name="too wide").exists()
