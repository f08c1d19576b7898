"""Console forms: they parse and check the shape of input; the broker
services decide and report domain errors, which ``add_service_errors`` puts
beside the fields they name."""

from __future__ import annotations

from django import forms

from broker.errors import BrokerError
from broker.models import QUEUE_NAME_MAX_LENGTH, Overflow, Queue, QueueKind, Topic
from broker.services.queues import LIMIT_SETTINGS, QUEUE_SETTINGS

MAX_MESSAGES_HELP = "Waiting + in-flight messages allowed; blank for no limit."


def add_service_errors(form: forms.BaseForm, error: BrokerError) -> None:
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


class QueueSettingsForm(forms.ModelForm):
    dead_letter_queue = forms.ModelChoiceField(
        queryset=Queue.objects.filter(kind=QueueKind.DEAD_LETTER).order_by("name"),
        to_field_name="name",
        required=False,
    )

    class Meta:
        model = Queue
        # Kind, pause and limits have their own controls.
        fields = [
            name for name in QUEUE_SETTINGS if name not in {"kind", "paused", *LIMIT_SETTINGS}
        ]
        help_texts = {
            "consumer": "A handler name (noop, log, json, demo) or an http(s) webhook URL.",
            "crash_threshold": "Crashes before a message is blacklisted.",
            "poison_limit": "Unacknowledged deliveries before a message is blacklisted.",
            "suspect_delay_seconds": "Pause between isolated deliveries of crash suspects (0-5).",
        }


class PurgeForm(forms.Form):
    confirmation = forms.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, help_text="Type the queue's name to confirm."
    )


class ResubmitForm(forms.Form):
    queue = forms.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    content_type = forms.CharField(max_length=100)
    priority = forms.IntegerField(min_value=0, max_value=9)
    headers = forms.JSONField(
        required=False, help_text='A JSON object of strings, e.g. {"region": "eu"}'
    )
    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 12, "class": "code"}), strip=False, required=False
    )

    def clean_headers(self) -> dict[str, str]:
        headers = self.cleaned_data["headers"] or {}
        if not isinstance(headers, dict) or not all(
            isinstance(value, str) for value in headers.values()
        ):
            raise forms.ValidationError("Headers must be a JSON object of string values.")
        return headers
