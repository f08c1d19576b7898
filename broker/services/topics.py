"""Topics and subscriptions: create, change, delete."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from broker.errors import (
    AlreadyExists,
    InvalidInput,
    OutsideTopic,
    QueueInUse,
    SubscriptionNotFound,
    TopicNotFound,
)
from broker.models import Queue, QueueKind, Subscription, Topic
from broker.services.audit import Actor, audit_record
from broker.services.queues import queue_create

SUBSCRIPTION_FIELDS = frozenset(
    {"topic_filter", "max_messages", "overflow", "discard_to_dead_letter"}
)


# Problems that are conflicts with what exists (409 in the API), by their codes.
CONFLICTS: dict[frozenset[str], type[InvalidInput]] = {
    frozenset({"unique"}): AlreadyExists,
    frozenset({"outside_topic"}): OutsideTopic,
}


def _validated(
    instance: Topic | Subscription, *, unique: bool = True, exclude: list[str] | None = None
) -> None:
    try:
        instance.full_clean(validate_unique=unique, exclude=exclude)
    except ValidationError as error:
        codes = {
            str(problem.code) for problems in error.error_dict.values() for problem in problems
        }
        refusal = CONFLICTS.get(frozenset(codes), InvalidInput)
        raise refusal(
            f"The {type(instance).__name__.lower()} is not valid.", field_errors=error.message_dict
        ) from None


def topic_get(*, name: str) -> Topic:
    topic = Topic.objects.filter(name=name).first()
    if topic is None:
        raise TopicNotFound(f"There is no topic named {name!r}.")
    return topic


def subscription_get(*, name: str) -> Subscription:
    subscription = Subscription.objects.select_related("topic", "queue").filter(name=name).first()
    if subscription is None:
        raise SubscriptionNotFound(f"There is no subscription named {name!r}.")
    return subscription


@transaction.atomic
def topic_create(
    *, name: str, topic_string: str, description: str = "", actor: Actor = None
) -> Topic:
    """Create a topic: a named root of the topic tree."""
    topic = Topic(name=name, topic_string=topic_string, description=description)
    _validated(topic)
    topic.save()
    audit_record(action="topic_create", actor=actor, details={"topic": name})
    return topic


@transaction.atomic
def topic_delete(*, topic: Topic, actor: Actor = None) -> None:
    """Delete a topic; refused while subscriptions hang on it."""
    names = list(topic.subscriptions.values_list("name", flat=True)[:5])
    if names:
        raise QueueInUse(f"Topic {topic.name} still has subscriptions: {', '.join(names)}.")
    topic.delete()
    audit_record(action="topic_delete", actor=actor, details={"topic": topic.name})


@transaction.atomic
def subscription_create(
    *, name: str, topic: Topic, queue_name: str, actor: Actor = None, **fields: Any
) -> Subscription:
    """Subscribe a queue to a topic filter. The queue is created (standard,
    without a consumer) when it does not exist yet; an existing one must be a
    standard queue that no other subscription uses."""
    unknown = set(fields) - SUBSCRIPTION_FIELDS
    if unknown:
        raise InvalidInput(
            "Unknown subscription settings.",
            field_errors={key: ["Unknown setting."] for key in unknown},
        )
    queue = Queue.objects.filter(name=queue_name).first()
    if queue is not None and (queue.kind != QueueKind.STANDARD or hasattr(queue, "subscription")):
        problem = f"{queue_name} is a dead-letter queue or already belongs to a subscription."
        raise InvalidInput(problem, field_errors={"queue": [problem]})
    subscription = Subscription(name=name, topic=topic, **fields)
    _validated(subscription, exclude=["queue"])  # the queue may not exist yet
    if queue is None:
        try:
            queue = queue_create(name=queue_name, actor=actor)
        except InvalidInput as error:
            raise InvalidInput(
                error.detail, field_errors={"queue": error.field_errors.get("name", [error.detail])}
            ) from None
    subscription.queue = queue
    subscription.save()
    audit_record(
        action="subscription_create",
        actor=actor,
        queue_name=queue.name,
        details={"subscription": name, "topic": topic.name, "filter": subscription.topic_filter},
    )
    return subscription


@transaction.atomic
def subscription_update(
    *, subscription: Subscription, actor: Actor = None, **fields: Any
) -> Subscription:
    """Change a subscription's filter or limit; topic and queue stay."""
    unknown = set(fields) - SUBSCRIPTION_FIELDS
    if unknown:
        raise InvalidInput(
            "These cannot be changed.",
            field_errors={key: ["Cannot be changed."] for key in unknown},
        )
    changed = {key: value for key, value in fields.items() if getattr(subscription, key) != value}
    if not changed:
        return subscription
    for key, value in changed.items():
        setattr(subscription, key, value)
    _validated(subscription, unique=False)
    subscription.save(update_fields=list(changed))
    audit_record(
        action="subscription_update",
        actor=actor,
        queue_name=subscription.queue.name,
        details={"subscription": subscription.name, "changed": sorted(changed)},
    )
    return subscription


@transaction.atomic
def subscription_delete(*, subscription: Subscription, actor: Actor = None) -> None:
    """Stop the subscription; its queue and the messages in it stay."""
    subscription.delete()
    audit_record(
        action="subscription_delete",
        actor=actor,
        queue_name=subscription.queue.name,
        details={"subscription": subscription.name},
    )
