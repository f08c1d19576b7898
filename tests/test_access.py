"""Who may do what on which queue (console.access) and the grants that say
it (console.grants): patterns, the highest of a user's roles, groups, a
narrowed caller, and the filter lists use."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from broker.errors import AlreadyExists, InvalidInput
from broker.models import AuditEvent, Queue
from broker.services.queues import queue_create
from console.access import Access, access_of, pattern_covers, pattern_matches, pattern_problem
from console.grants import (
    Grantee,
    GroupNotFound,
    grant_add,
    grant_remove,
    grants_list,
    group_add_member,
    group_create,
    group_delete,
    group_remove_member,
    groups_list,
)
from console.models import ApiToken, Grant
from console.roles import Role
from console.tokens import token_create

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        ("", "Give a queue name"),
        ("ORDERS IN", "not ' '"),
        ("ORDERS.[A-Z]", "not '-' '[' ']'"),
        ("Ü*", "not 'Ü'"),
        ("A" * 49, "matches no queue"),
        ("?" * 49, "matches no queue"),
        ("*" * 97, "At most 96 characters"),
    ],
)
def test_a_pattern_that_is_not_valid_or_cannot_match_says_why(pattern, said):
    problem = pattern_problem(pattern)

    assert problem is not None
    assert said in problem


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("ORDERS.IN", "ORDERS.IN", True),
        ("ORDERS.IN", "ORDERS.INX", False),
        ("ORDERS.*", "ORDERS.IN", True),
        ("ORDERS.*", "ORDERS.EU.IN", True),
        ("ORDERS.*", "ORDERSXIN", False),
        ("ORDERS.??", "ORDERS.IN", True),
        ("ORDERS.??", "ORDERS.OUT", False),
        ("*", "PAYMENTS.IN", True),
        ("orders.*", "ORDERS.IN", False),
    ],
)
def test_a_pattern_matches_names_as_a_glob_in_python_and_in_postgresql(pattern, name, matches):
    queue_create(name=name, consumer="log")
    in_sql = Queue.objects.filter(Access(Role.NONE, ((pattern, Role.VIEWER),)).queues(Role.VIEWER))

    assert pattern_problem(pattern) is None
    assert pattern_matches(pattern, name) is matches
    assert in_sql.filter(name=name).exists() is matches


def test_a_users_role_on_a_queue_is_the_highest_of_their_role_and_their_grants():
    access = Access(
        installation=Role.VIEWER,
        grants=(("ORDERS.*", Role.OPERATOR), ("ORDERS.IN", Role.ADMIN)),
    )

    assert access.role_on("ORDERS.IN") == Role.ADMIN
    assert access.role_on("ORDERS.OUT") == Role.OPERATOR
    assert access.role_on("PAYMENTS.IN") == Role.VIEWER
    assert Access(Role.NONE, (("ORDERS.*", Role.OPERATOR),)).role_on("PAYMENTS.IN") == Role.NONE


def test_a_narrowed_caller_holds_no_more_than_its_pattern_and_role():
    narrowed = Access(installation=Role.OPERATOR, only_pattern="ORDERS.IN", at_most=Role.VIEWER)

    assert narrowed.role_on("ORDERS.IN") == Role.VIEWER
    assert narrowed.role_on("ORDERS.OUT") == Role.NONE
    assert not narrowed.may(Role.OPERATOR, "ORDERS.IN")


def test_lists_take_the_queues_the_caller_holds_the_role_on():
    for name in ("ORDERS.IN", "ORDERS.OUT", "PAYMENTS.IN"):
        queue_create(name=name, consumer="log")
    orders_operator = Access(Role.NONE, (("ORDERS.*", Role.OPERATOR), ("PAYMENTS.IN", Role.VIEWER)))

    def names(access: Access, role: Role) -> list[str]:
        scope = access.queues(role)
        queues = Queue.objects.filter(name__in=["ORDERS.IN", "ORDERS.OUT", "PAYMENTS.IN"])
        held = queues if scope is None else queues.filter(scope)
        return sorted(held.values_list("name", flat=True))

    assert names(orders_operator, Role.OPERATOR) == ["ORDERS.IN", "ORDERS.OUT"]
    assert names(orders_operator, Role.VIEWER) == ["ORDERS.IN", "ORDERS.OUT", "PAYMENTS.IN"]
    assert names(orders_operator, Role.ADMIN) == []
    assert Access(Role.VIEWER).queues(Role.VIEWER) is None
    narrowed = Access(Role.ADMIN, only_pattern="ORDERS.IN", at_most=Role.VIEWER)
    assert names(narrowed, Role.VIEWER) == ["ORDERS.IN"]
    assert names(narrowed, Role.OPERATOR) == []


def test_a_user_holds_what_their_groups_are_granted():
    orders_team = Group.objects.create(name="orders-team")
    user = User.objects.create_user(username="olga", password="x" * 20)
    user.groups.add(orders_team)
    grant_add(pattern="ORDERS.*", role="operator", to=Grantee(group="orders-team"), actor=None)
    grant_add(pattern="PAYMENTS.IN", role="viewer", to=Grantee(user="olga"), actor=None)

    access = access_of(User.objects.get(id=user.id))

    assert access.role_on("ORDERS.IN") == Role.OPERATOR
    assert access.role_on("PAYMENTS.IN") == Role.VIEWER
    assert access.role_on("PAYROLL.IN") == Role.NONE


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"pattern": "ORDERS IN"}, "pattern"),
        ({"role": "owner"}, "role"),
        ({"to": Grantee(user="nobody")}, "user"),
        ({"to": Grantee(group="nobody")}, "group"),
        ({"to": Grantee()}, "user"),
    ],
)
def test_a_grant_that_is_not_valid_is_refused_by_field_and_nothing_is_saved(values, field):
    User.objects.create_user(username="olga", password="x" * 20)
    asked = {"pattern": "ORDERS.*", "role": "operator", "to": Grantee(user="olga"), **values}

    with pytest.raises(InvalidInput) as refused:
        grant_add(**asked, actor=None)

    assert field in refused.value.field_errors
    assert not Grant.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="grant").exists()


def test_grants_are_added_listed_refused_twice_and_removed_with_an_audit_event_each():
    User.objects.create_user(username="olga", password="x" * 20)
    grant = grant_add(pattern="ORDERS.*", role="operator", to=Grantee(user="olga"), actor=None)

    with pytest.raises(AlreadyExists):
        grant_add(pattern="ORDERS.*", role="viewer", to=Grantee(user="olga"), actor=None)
    listed = grants_list(to=Grantee(user="olga"))
    grant_remove(grant_id=grant.id, actor=None)

    assert [(g.pattern, g.role) for g in listed] == [("ORDERS.*", Role.OPERATOR)]
    assert not Grant.objects.exists()
    events = AuditEvent.objects.filter(action__startswith="grant").order_by("id")
    assert [(e.action, e.details["pattern"], e.details["user"]) for e in events] == [
        ("grant.add", "ORDERS.*", "olga"),
        ("grant.remove", "ORDERS.*", "olga"),
    ]


# --- narrowed tokens -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outer", "inner", "covers"),
    [
        ("ORDERS.*", "ORDERS.IN", True),
        ("ORDERS.*", "ORDERS.EU.*", True),
        ("*", "ORDERS.*", True),
        ("ORDERS.IN", "ORDERS.*", False),
        ("ORDERS.?", "ORDERS.*", False),
        ("ORDERS.??", "ORDERS.I?", True),
        ("ORDERS.*", "PAYMENTS.IN", False),
    ],
)
def test_a_pattern_covers_another_when_it_matches_every_name_the_other_does(outer, inner, covers):
    assert pattern_covers(outer, inner) is covers


def test_a_token_narrowed_to_viewer_on_one_queue_holds_nothing_else(operator):
    token, _ = token_create(user=operator, name="ci", only_pattern="ORDERS.IN", at_most="viewer")

    access = access_of(operator, token)

    assert access.role_on("ORDERS.IN") == Role.VIEWER
    assert not access.may(Role.OPERATOR, "ORDERS.IN")
    assert access.role_on("ORDERS.OUT") == Role.NONE
    assert access_of(operator).role_on("ORDERS.OUT") == Role.OPERATOR


def test_a_token_holds_no_more_than_its_user_holds_now():
    olga = User.objects.create_user(username="olga", password="x" * 20)
    grant = grant_add(pattern="ORDERS.*", role="operator", to=Grantee(user="olga"), actor=None)
    token, _ = token_create(user=olga, name="ci", only_pattern="ORDERS.IN", at_most="operator")
    assert access_of(User.objects.get(id=olga.id), token).role_on("ORDERS.IN") == Role.OPERATOR

    grant_remove(grant_id=grant.id, actor=None)

    assert access_of(User.objects.get(id=olga.id), token).role_on("ORDERS.IN") == Role.NONE


@pytest.mark.parametrize(
    ("only_pattern", "at_most", "field"),
    [
        ("PAYMENTS.*", "", "only_pattern"),  # holds nothing there
        ("ORDERS.*", "admin", "at_most"),  # holds operator there
        ("ORDERS IN", "", "only_pattern"),
        ("ORDERS.IN", "owner", "at_most"),
        ("", "operator", "at_most"),  # not on every queue
    ],
)
def test_a_token_wider_than_its_user_is_refused_and_nothing_is_saved(only_pattern, at_most, field):
    olga = User.objects.create_user(username="olga", password="x" * 20)
    grant_add(pattern="ORDERS.*", role="operator", to=Grantee(user="olga"), actor=None)

    with pytest.raises(InvalidInput) as refused:
        token_create(
            user=User.objects.get(id=olga.id), name="ci", only_pattern=only_pattern, at_most=at_most
        )

    assert field in refused.value.field_errors
    assert not ApiToken.objects.exists()


# --- groups ------------------------------------------------------------------------------


def test_a_team_is_made_given_members_and_deleted_with_its_grants_each_audited():
    olga = User.objects.create_user(username="olga", password="x" * 20)
    group_create(name="orders-team", actor=None)
    group_add_member(name="orders-team", user="olga", actor=None)
    grant_add(pattern="ORDERS.*", role="operator", to=Grantee(group="orders-team"), actor=None)
    assert access_of(User.objects.get(id=olga.id)).role_on("ORDERS.IN") == Role.OPERATOR
    assert [(g.name, [u.username for u in g.user_set.all()]) for g in groups_list()] == [
        ("orders-team", ["olga"])
    ]

    group_remove_member(name="orders-team", user="olga", actor=None)
    assert access_of(User.objects.get(id=olga.id)).role_on("ORDERS.IN") == Role.NONE
    group_delete(name="orders-team", actor=None)

    assert not Grant.objects.exists()
    events = AuditEvent.objects.filter(action__startswith="group").order_by("id")
    assert [e.action for e in events] == [
        "group.create",
        "group.add",
        "group.remove",
        "group.delete",
    ]


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", InvalidInput),
        ("operator", InvalidInput),
        ("x" * 151, InvalidInput),
        ("team", AlreadyExists),
    ],
)
def test_a_group_that_cannot_be_made_says_why(name, error):
    Group.objects.create(name="team")

    with pytest.raises(error) as refused:
        group_create(name=name, actor=None)

    assert "name" in refused.value.field_errors


def test_a_role_group_is_no_team_to_delete_or_join():
    Group.objects.create(name="admin")
    User.objects.create_user(username="olga", password="x" * 20)

    with pytest.raises(GroupNotFound):
        group_add_member(name="admin", user="olga", actor=None)
    with pytest.raises(GroupNotFound):
        group_delete(name="admin", actor=None)
