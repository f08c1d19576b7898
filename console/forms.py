"""Console forms: they parse and check the shape of input; the broker
services decide and report domain errors, which ``add_service_errors`` puts
beside the fields they name."""

from __future__ import annotations

from django import forms

from broker.errors import BrokerError
from broker.models import QUEUE_NAME_MAX_LENGTH, Overflow, Topic

MAX_MESSAGES_HELP = "Waiting + in-flight messages allowed; blank for no limit."


def add_service_errors(form: forms.Form, error: BrokerError) -> None:
    """Show a service's error beside the fields it names (or above the form)."""
    if not error.field_errors:
        form.add_error(None, error.detail)
    for field, messages in error.field_errors.items():
        target = field if field in form.fields else None
        for message in messages:
            form.add_error(target, message)


class LimitFields(forms.Form):
    max_messages = forms.IntegerField(min_value=1, required=False, help_text=MAX_MESSAGES_HELP)
    overflow = forms.ChoiceField(choices=Overflow.choices, initial=Overflow.REJECT_NEW)
    discard_to_dead_letter = forms.BooleanField(
        required=False, help_text="discard_old moves discards to the dead-letter queue."
    )


class QueueLimitsForm(LimitFields):
    pass


class TopicForm(forms.Form):
    name = forms.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    topic_string = forms.CharField(
        max_length=1024, strip=False, help_text="The root of the tree, e.g. orders"
    )
    description = forms.CharField(max_length=200, required=False)


class SubscriptionEditForm(LimitFields):
    topic_filter = forms.CharField(
        max_length=1024,
        strip=False,
        help_text="+ is one level, # (last) any number: orders/+/created",
    )
    field_order = ["topic_filter", "max_messages", "overflow", "discard_to_dead_letter"]


class SubscriptionForm(SubscriptionEditForm):
    name = forms.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    topic = forms.ModelChoiceField(queryset=Topic.objects.order_by("name"), to_field_name="name")
    queue = forms.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, help_text="Its own queue; created if it does not exist."
    )
    field_order = ["name", "topic", "topic_filter", "queue", *SubscriptionEditForm.field_order[1:]]
