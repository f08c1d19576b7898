"""REST API for topics and their subscriptions, and publishing to a topic."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.serializer_helpers import ReturnDict
from rest_framework.views import APIView

from broker.errors import InvalidInput, TopicNotFound
from broker.models import QUEUE_NAME_MAX_LENGTH, Subscription, Topic, queue_name_validator
from broker.selectors import (
    SubscriptionSummary,
    subscription_summaries,
    subscription_summary,
    topic_list,
)
from broker.services.publish import topic_publish
from broker.services.topics import (
    subscription_create,
    subscription_delete,
    subscription_update,
    topic_create,
    topic_delete,
    topic_get,
)
from broker.topic_grammar import (
    MAX_TOPIC_LENGTH,
    TOPIC_FILTER_PATTERN,
    TOPIC_RULES,
    TOPIC_STRING_OR_BLANK_PATTERN,
    TOPIC_STRING_PATTERN,
)
from console.access import check_topic_publish, request_access, subscription_held
from console.api.fields import BodyModelSerializer, BodySerializer, NameRelatedField, fields_through
from console.api.queues import LimitSerializer, PublishSerializer, as_batch
from console.api.schema import ERROR
from console.roles import Role


def topic_text(pattern: str) -> dict[str, Any]:
    """A topic string's or filter's field options: taken as written (a
    level may hold spaces), checked by ``pattern``, which the schema shows."""
    return {"trim_whitespace": False, "validators": [RegexValidator(pattern, TOPIC_RULES)]}


class TopicSerializer(BodyModelSerializer[Topic]):
    class Meta:
        model = Topic
        fields = ["name", "topic_string", "description", "created_at"]
        read_only_fields = ["created_at"]
        extra_kwargs = {"topic_string": topic_text(TOPIC_STRING_PATTERN)}


class SubscriptionSerializer(BodyModelSerializer[Subscription]):
    """A subscription of a queue to a topic."""

    topic = NameRelatedField(missing=TopicNotFound, what="topic", queryset=topic_list())
    queue = serializers.CharField(
        source="queue.name",
        max_length=QUEUE_NAME_MAX_LENGTH,
        validators=[queue_name_validator],
        help_text="The subscription's own queue; created when it does not exist.",
    )

    class Meta:
        model = Subscription
        fields = [
            "name",
            "topic",
            "topic_filter",
            "queue",
            "max_messages",
            "overflow",
            "discard_to_dead_letter",
            "created_at",
        ]
        read_only_fields = ["created_at"]
        extra_kwargs = {"topic_filter": topic_text(TOPIC_FILTER_PATTERN)}


class SubscriptionSummarySerializer(BodySerializer[SubscriptionSummary]):
    """A subscription of a queue to a topic, with its queue's state against
    the subscription's limit."""

    limit = LimitSerializer(
        help_text="The queue's waiting + in-flight messages against this subscription's "
        "max_messages."
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return fields_through(
            SubscriptionSerializer, "subscription", own=super().get_fields(), before="created_at"
        )


class TopicPublishSerializer(PublishSerializer):
    topic_string = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=MAX_TOPIC_LENGTH,
        validators=[RegexValidator(TOPIC_STRING_OR_BLANK_PATTERN, TOPIC_RULES)],
        trim_whitespace=False,
        help_text="Where to publish: the topic's string or one below it (default: the topic's).",
    )


class TopicDeliverySerializer(BodySerializer[dict[str, Any]]):
    subscription = serializers.CharField()
    queue = serializers.CharField()
    ids = serializers.ListField(child=serializers.IntegerField())


class TopicPublishResultSerializer(BodySerializer[dict[str, Any]]):
    count = serializers.IntegerField(help_text="Messages published (before copying).")
    deliveries = TopicDeliverySerializer(many=True)


class TopicListView(APIView):
    write_role = Role.ADMIN
    installation_wide_writes = True

    @extend_schema(responses=TopicSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(TopicSerializer(topic_list(), many=True).data)

    @extend_schema(request=TopicSerializer, responses={201: TopicSerializer, 400: ERROR})
    def post(self, request: Request) -> Response:
        serializer = TopicSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        topic = topic_create(actor=request.user, **serializer.validated_data)
        return Response(TopicSerializer(topic).data, status=status.HTTP_201_CREATED)


class TopicDetailView(APIView):
    write_role = Role.ADMIN
    installation_wide_writes = True

    @extend_schema(responses={200: TopicSerializer, 404: ERROR})
    def get(self, request: Request, name: str) -> Response:
        return Response(TopicSerializer(topic_get(name=name)).data)

    @extend_schema(responses={204: None, 404: ERROR, 409: ERROR})
    def delete(self, request: Request, name: str) -> Response:
        topic_delete(topic=topic_get(name=name), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TopicPublishView(APIView):
    @extend_schema(
        request=TopicPublishSerializer,
        responses={201: TopicPublishResultSerializer, 400: ERROR, 404: ERROR, 409: ERROR},
        examples=[
            OpenApiExample(
                "On a topic string below the topic",
                value={"topic_string": "orders/eu/paid", "payload": '{"order": 1017}'},
                request_only=True,
            )
        ],
        description=(
            "Publish on the topic (or on `topic_string` below it): one copy per matching "
            "subscription, all or nothing. A full reject_new subscription refuses the whole "
            "publish with 409 `max_messages_reached`."
        ),
    )
    def post(self, request: Request, name: str) -> Response:
        check_topic_publish(request_access(request), name)
        serializer = TopicPublishSerializer(data=as_batch(request.data))
        serializer.is_valid(raise_exception=True)
        deliveries = topic_publish(
            topic_name=name,
            topic_string=serializer.validated_data.get("topic_string", ""),
            messages=serializer.new_messages(),
            put_user=request.user.get_username(),
            put_application="api",
        )
        return Response(
            {
                "count": len(serializer.validated_data["messages"]),
                "deliveries": [asdict(d) for d in deliveries],
            },
            status=status.HTTP_201_CREATED,
        )


def subscription_json(subscription: Subscription) -> ReturnDict[str, Any]:
    return SubscriptionSummarySerializer(subscription_summary(subscription=subscription)).data


class SubscriptionListView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses=SubscriptionSummarySerializer(many=True))
    def get(self, request: Request) -> Response:
        within = request_access(request).queues(Role.VIEWER, field="queue__name")
        summaries = subscription_summaries(within=within)
        # many=True builds a ListSerializer, which takes the list.
        return Response(SubscriptionSummarySerializer(summaries, many=True).data)  # type: ignore[arg-type]

    @extend_schema(
        request=SubscriptionSerializer, responses={201: SubscriptionSummarySerializer, 400: ERROR}
    )
    def post(self, request: Request) -> Response:
        serializer = SubscriptionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        request_access(request).check_create(data["queue"]["name"])
        subscription = subscription_create(
            actor=request.user, queue_name=data.pop("queue")["name"], **data
        )
        return Response(subscription_json(subscription), status=status.HTTP_201_CREATED)


class SubscriptionDetailView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses={200: SubscriptionSummarySerializer, 404: ERROR})
    def get(self, request: Request, name: str) -> Response:
        return Response(subscription_json(subscription_held(request, Role.VIEWER, name)))

    @extend_schema(
        request=SubscriptionSerializer, responses={200: SubscriptionSummarySerializer, 400: ERROR}
    )
    def patch(self, request: Request, name: str) -> Response:
        subscription = subscription_held(request, Role.ADMIN, name)
        serializer = SubscriptionSerializer(subscription, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        fixed = {
            "name": subscription.name,
            "topic": subscription.topic,
            "queue": {"name": subscription.queue.name},
        }
        moved = [
            key for key, value in fixed.items() if key in changes and changes.pop(key) != value
        ]
        if moved:
            raise InvalidInput(
                "A subscription keeps its name, topic and queue.",
                field_errors={key: ["Cannot be changed."] for key in moved},
            )
        return Response(
            subscription_json(
                subscription_update(subscription=subscription, actor=request.user, **changes)
            )
        )

    @extend_schema(responses={204: None, 404: ERROR})
    def delete(self, request: Request, name: str) -> Response:
        subscription = subscription_held(request, Role.ADMIN, name)
        subscription_delete(subscription=subscription, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
