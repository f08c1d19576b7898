"""Console forms: they parse and check the shape of input; the broker
services decide and report domain errors, which the views put beside the
fields they name (``console.views.common.service_errors``)."""

from __future__ import annotations

import re
from typing import Any, Self

from django import forms
from django.conf import settings
from django.db.models import Q
from django.http import QueryDict

from broker.consumers import handler_names
from broker.errors import InvalidInput
from broker.models import (
    MAX_WEBHOOK_SECRET_LENGTH,
    MIN_WEBHOOK_SECRET_LENGTH,
    QUEUE_NAME_MAX_LENGTH,
    MessageState,
    Overflow,
    Queue,
    QueueKind,
    ReplaySource,
)
from broker.pipeline.schedules import (
    DEFAULT_GIVE_UP_AFTER,
    NAME_MAX_LENGTH,
    SCHEDULE_SOURCES,
    ScheduleSpec,
    Timing,
    timing_problems,
)
from broker.pipeline.selection import (
    MAX_TEXT_FILTER,
    ReplaySpec,
    replay_spec_parse,
    window_problem,
)
from broker.selectors import dead_letter_queue_list, ha_node_names, queue_names, topic_list
from broker.services.publish import NewMessage
from broker.services.queues import LIMIT_SETTINGS, QUEUE_SETTINGS, SECRET_SETTINGS
from broker.services.transitions.blacklist import TRIAGE_ACTIONS

MAX_MESSAGES_HELP = "Waiting + in-flight messages allowed; blank for no limit."


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
    topic = forms.ModelChoiceField(queryset=topic_list(), to_field_name="name")
    queue = forms.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, help_text="Its own queue; created if it does not exist."
    )
    field_order = ["name", "topic", "topic_filter", "queue", *SubscriptionEditForm.field_order[1:]]


class QueueSettingsForm(forms.ModelForm):
    dead_letter_queue = forms.ModelChoiceField(
        queryset=dead_letter_queue_list(),
        to_field_name="name",
        required=False,
    )
    # The secret is never shown, not even to admins: the field starts empty
    # and only a value typed into it replaces the current one.
    webhook_secret = forms.CharField(
        required=False,
        strip=False,
        min_length=MIN_WEBHOOK_SECRET_LENGTH,
        max_length=MAX_WEBHOOK_SECRET_LENGTH,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        label="New webhook secret",
    )
    clear_webhook_secret = forms.BooleanField(
        required=False, label="Clear the webhook secret (webhook POSTs go unsigned)"
    )
    field_order = [
        "description",
        "consumer",
        "webhook_timeout",
        "webhook_secret",
        "clear_webhook_secret",
    ]

    class Meta:
        model = Queue
        # Kind, pause and limits have their own controls; the secret is the
        # write-only field above.
        fields = [
            name
            for name in QUEUE_SETTINGS
            if name not in {"kind", "paused", *LIMIT_SETTINGS, *SECRET_SETTINGS}
        ]
        labels = {
            "webhook_timeout": "Webhook timeout (seconds)",
            "alert_waiting_above": "Alert: messages waiting above",
            "alert_oldest_waiting_seconds": "Alert: oldest waiting message older than (seconds)",
            "alert_dead_letter_per_minute": "Alert: dead-lettered a minute above",
            "alert_blacklisted_above": "Alert: blacklisted (NDLV) above",
            "alert_stalled_seconds": "Alert: no acknowledgement while messages wait for (seconds)",
        }
        help_texts = {
            "webhook_timeout": "A webhook consumer has this long to accept the connection, "
            "and again to answer (0.1-300); longer is a handler error.",
            "crash_threshold": "Crashes while delivering a message before it is poison.",
            "poison_limit": (
                "Deliveries ending without an answer (crashes and timeouts) before a "
                "message is poison."
            ),
            "suspect_delay_seconds": (
                "Back-off before a suspect that failed alone is tried again; doubles "
                "each time, at most 5 s (0-5)."
            ),
            "poison_action": "Quarantine keeps a poison message as NDLV; purge deletes it. "
            "Both dump its payload.",
            "alarm_webhook_url": "Poison alarms and alerts of this queue are posted here "
            "(blank: the installation's LAZARETTO_ALARM_WEBHOOK_URL).",
            "alert_waiting_above": "An alert fires when more messages than this wait (TBDL); "
            "0: any. Blank: no alert.",
            "alert_oldest_waiting_seconds": "An alert fires when the longest-waiting message "
            "arrived longer ago than this (1 s to a year). Blank: no alert.",
            "alert_dead_letter_per_minute": "An alert fires when more messages than this were "
            "dead-lettered over the last minute: from this queue, or into it for a dead-letter "
            "queue. Blank: no alert.",
            "alert_blacklisted_above": "An alert fires when more messages than this are "
            "blacklisted (NDLV); 0: any. Blank: no alert.",
            "alert_stalled_seconds": "An alert fires when no message was acknowledged for this "
            "long while messages wait to be delivered (1 s to a year). Blank: no alert.",
            "delivered_retention": "What the acknowledgement keeps of each message it "
            "delivers: the whole message, all but its payload, or nothing. Applies to messages "
            "acknowledged from now on.",
            "archive_retention_days": "Delivered and failed messages published longer ago "
            "than this many days move to the archive (blank: LAZARETTO_ARCHIVE_RETENTION_DAYS).",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        handlers = ", ".join(handler_names())
        consumer = self.fields["consumer"]
        consumer.help_text = f"A handler name ({handlers}) or an http(s) webhook URL."
        self.fields["webhook_secret"].help_text = (
            "A secret is set: webhook POSTs are signed (Lazaretto-Signature). Type a new "
            "one to replace it; leave blank to keep it."
            if self.instance.webhook_signed
            else f"No secret is set: webhook POSTs are not signed. Type one "
            f"({MIN_WEBHOOK_SECRET_LENGTH}-{MAX_WEBHOOK_SECRET_LENGTH} characters) to sign them."
        )

    def clean(self) -> dict[str, Any]:
        """The service's ``webhook_secret``: a new secret typed, blank to clear
        it, or absent to keep the current one."""
        super().clean()
        cleaned = self.cleaned_data
        secret = cleaned.pop("webhook_secret", "")
        clear = cleaned.pop("clear_webhook_secret", False)
        if secret and clear:
            self.add_error("clear_webhook_secret", "Type a new secret or clear it, not both.")
        elif clear:
            cleaned["webhook_secret"] = ""
        elif secret:
            cleaned["webhook_secret"] = secret
        return cleaned


class QueueCreateForm(forms.Form):
    """A new queue's name, kind, consumer and description; the queue service
    checks the name and the consumer (errors beside these fields)."""

    name = forms.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH,
        help_text="1 to 48 letters, digits and . _ / %, e.g. PAYROLL.IN",
    )
    kind = forms.ChoiceField(choices=QueueKind.choices, initial=QueueKind.STANDARD)
    consumer = forms.CharField(max_length=2048, required=False)
    description = forms.CharField(max_length=200, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        handlers = ", ".join(handler_names())
        self.fields[
            "consumer"
        ].help_text = (
            f"A handler name ({handlers}) or an http(s) webhook URL; blank: nothing delivers."
        )


class PublishForm(forms.Form):
    """One test message as an operator types it: text payload, headers as
    name=value lines."""

    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "class": "code"}), strip=False, required=False
    )
    content_type = forms.CharField(max_length=100, initial="text/plain")
    headers = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "class": "code"}),
        required=False,
        help_text="One name=value a line, e.g. region=eu",
    )
    priority = forms.IntegerField(min_value=0, max_value=9, initial=4, help_text="0-9")

    def clean_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["headers"].splitlines(), start=1):
            if not line.strip():
                continue
            name, equals, value = line.partition("=")
            if not equals or not name.strip():
                raise forms.ValidationError(f"Line {number}: write it as name=value.")
            headers[name.strip()] = value.strip()
        return headers

    def new_message(self) -> NewMessage:
        data = self.cleaned_data
        return NewMessage(
            payload=data["payload"].encode(),
            content_type=data["content_type"],
            headers=data["headers"],
            priority=data["priority"],
        )


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


STATE_CHOICES = [("", "any state"), *MessageState.choices]


class MessageFilterForm(forms.Form):
    queue = forms.CharField(max_length=QUEUE_NAME_MAX_LENGTH, required=False)
    state = forms.ChoiceField(choices=STATE_CHOICES, required=False)
    reason = forms.CharField(max_length=64, required=False, help_text="dead-letter reason")
    since = forms.DateTimeField(required=False, help_text="published at or after")
    until = forms.DateTimeField(required=False, help_text="published before")
    header = forms.CharField(max_length=200, required=False, help_text="name=value")
    text = forms.CharField(
        max_length=200, required=False, strip=False, help_text="payload contains"
    )
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def clean_header(self) -> str:
        header: str = self.cleaned_data["header"]
        if header and "=" not in header:
            raise forms.ValidationError("Write it as name=value.")
        return header


class ImportForm(forms.Form):
    file = forms.FileField(label="JSON Lines file", help_text="one message document a line")
    partial = forms.BooleanField(
        required=False, label="Import the good lines and list the bad ones"
    )

    def clean_file(self) -> Any:
        upload = self.cleaned_data["file"]
        limit = settings.LAZARETTO_MAX_IMPORT_BYTES
        if upload.size > limit:
            raise forms.ValidationError(
                f"The file is {upload.size:,} bytes; an import holds at most {limit:,}."
            )
        return upload


class AuditFilterForm(forms.Form):
    actor = forms.CharField(max_length=150, required=False)
    action = forms.CharField(max_length=64, required=False)
    queue = forms.CharField(max_length=QUEUE_NAME_MAX_LENGTH, required=False)
    message = forms.IntegerField(required=False, min_value=1, label="Message id")
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


class MessageIdsField(forms.Field):
    """Selected message ids (any; the service keeps only blacklisted ones)."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[int]:
        values = value or []
        if not all(str(item).isdigit() for item in values):
            raise forms.ValidationError("Message ids are whole numbers.")
        return [int(item) for item in values]


class BulkForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a.capitalize()) for a in TRIAGE_ACTIONS])
    note = forms.CharField(max_length=500, required=False, label="Reason")
    scope = forms.ChoiceField(choices=[("selected", "selected"), ("filter", "filter")])
    ids = MessageIdsField(required=False)
    confirmed = forms.BooleanField(required=False)


class RulesForm(forms.Form):
    text = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false", "class": "code"}),
        strip=False,
        max_length=200_000,
        label="Rules table (runmqdlq syntax)",
    )


DATETIME_LOCAL = "%Y-%m-%dT%H:%M:%S"


def _datetime_local(help_text: str) -> forms.DateTimeField:
    """A time picked in the browser (its datetime-local input, to the second;
    the console's time zone) or typed in ISO 8601."""
    widget = forms.DateTimeInput(
        attrs={"type": "datetime-local", "step": "1"}, format=DATETIME_LOCAL
    )
    return forms.DateTimeField(required=False, widget=widget, help_text=help_text)


class WindowForm(forms.Form):
    """A form with a since/until window that must end after it starts."""

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        problem = window_problem(self.cleaned_data.get("since"), self.cleaned_data.get("until"))
        if problem:
            self.add_error("until", problem)
        return data


class ReplayForm(WindowForm):
    """A replay job as an operator writes it. The shape is checked here; the
    replay service checks the rest (queues, time range, rules table, velocity)
    and the view puts its errors beside these fields, which carry the names
    of ``InvalidInput.field_errors``."""

    source = forms.ChoiceField(choices=ReplaySource.choices, initial=ReplaySource.DEAD_LETTER)
    source_queue = forms.ModelChoiceField(
        queryset=dead_letter_queue_list(),
        to_field_name="name",
        required=False,
        empty_label="—",
        help_text="The dead-letter queue to read, for a dead-letter source.",
        error_messages={
            "invalid_choice": "%(value)s is not a dead-letter queue: choose one of the list."
        },
    )
    queues = forms.CharField(
        max_length=2000,
        required=False,
        help_text="Comma or space separated; for a dead-letter source, the queues the "
        "messages were dead-lettered from. Blank: all.",
    )
    reason = forms.CharField(
        max_length=MAX_TEXT_FILTER,
        required=False,
        help_text="dead-letter reason, e.g. handler_error",
    )
    since = _datetime_local("published at or after")
    until = _datetime_local("published before")
    header = forms.CharField(max_length=MAX_TEXT_FILTER, required=False, help_text="name=value")
    payload_text = forms.CharField(
        max_length=MAX_TEXT_FILTER, required=False, strip=False, help_text="payload contains"
    )
    target_queue = forms.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH,
        required=False,
        help_text="Blank: each message goes back to its original queue.",
    )
    rules_text = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "code"}),
        strip=False,
        max_length=200_000,
        required=False,
        label="Rules table (runmqdlq syntax)",
        help_text="Routes each message (first match wins); blank: every matching message is "
        "written to the target.",
    )
    velocity = forms.IntegerField(
        required=False, help_text="Messages written per second; blank for no limit."
    )
    dry_run = forms.BooleanField(
        required=False, help_text="Count and sample what would be written; write nothing."
    )

    def __init__(self, *args: Any, within: Q | None = None, **kwargs: Any) -> None:
        """``within``: the queues the user sees (console.access), the only
        dead-letter queues offered."""
        super().__init__(*args, **kwargs)
        if within is not None:
            field = self.fields["source_queue"]
            assert isinstance(field, forms.ModelChoiceField)
            field.queryset = dead_letter_queue_list().filter(within)

    @classmethod
    def prefilled(cls, query: QueryDict, *, within: Q | None = None) -> Self:
        """An unbound form showing the query string's values (an archive
        search's "Replay these"); a value that does not parse is left out."""
        form = cls(within=within)
        for name, field in form.fields.items():
            if query.get(name):
                try:
                    form.initial[name] = field.clean(query[name])
                except forms.ValidationError:
                    continue
        return form

    def clean_queues(self) -> tuple[str, ...]:
        names = re.split(r"[\s,]+", self.cleaned_data["queues"])
        return tuple(dict.fromkeys(name for name in names if name))

    def spec(self) -> ReplaySpec:
        """The job the valid form describes, checked whole by the replay
        service's parser (InvalidInput: errors the view puts beside fields)."""
        data = self.cleaned_data
        source_queue: Queue | None = data["source_queue"]
        return replay_spec_parse(
            source=data["source"],
            source_queue=source_queue.name if source_queue else "",
            queues=data["queues"],
            reason=data["reason"],
            since=data["since"],
            until=data["until"],
            header=data["header"],
            payload_text=data["payload_text"],
            target_queue=data["target_queue"],
            rules_text=data["rules_text"],
            velocity=data["velocity"],
            dry_run=data.get("dry_run", False),
        )


class TimingForm(forms.Form):
    """When a replay schedule fires, as typed: a cron line in a time zone,
    or an interval. The schedule service says what is wrong with it
    (``timing_problems``), by these field names."""

    cron = forms.CharField(
        max_length=200,
        required=False,
        label="Cron line",
        help_text="Five fields: minute hour day-of-month month day-of-week, e.g. 0 3 * * * "
        "(03:00 every day). Blank when an interval is given.",
        widget=forms.TextInput(attrs={"class": "code", "spellcheck": "false"}),
    )
    time_zone = forms.CharField(
        max_length=100,
        required=False,
        help_text="The zone whose wall clock the cron line follows (an IANA name such as "
        "Europe/Paris); blank: UTC.",
        widget=forms.TextInput(attrs={"list": "time-zones", "autocomplete": "off"}),
    )
    every_seconds = forms.IntegerField(
        required=False,
        label="Or every (seconds)",
        help_text="An interval instead of a cron line, from 1 s to a year.",
    )

    def timing(self) -> Timing:
        data = self.cleaned_data
        return Timing(
            cron=data["cron"],
            time_zone=data["time_zone"] or "UTC",
            every_seconds=data["every_seconds"],
        )


class ScheduleForm(ReplayForm, TimingForm):
    """A replay schedule: the replay form's fields (never a dry run, and
    only the sources a schedule reads), its name, timing, cool-off, give-up
    limit and whether it is enabled. The replay part is parsed as a replay
    job's is; the schedule service checks the rest."""

    name = forms.CharField(max_length=NAME_MAX_LENGTH, help_text="Unique among the schedules.")
    source = forms.ChoiceField(
        choices=[
            (value, label) for value, label in ReplaySource.choices if value in SCHEDULE_SOURCES
        ],
        initial=ReplaySource.DEAD_LETTER,
    )
    cool_off_minutes = forms.IntegerField(
        initial=0,
        label="Cool-off (minutes)",
        help_text="Only messages dead (or blacklisted, or failed) at least this long are replayed.",
    )
    give_up_after = forms.IntegerField(
        initial=DEFAULT_GIVE_UP_AFTER,
        label="Give up after (replays)",
        help_text="A message replayed this many times over its copies is left where it is, "
        "marked given up.",
    )
    enabled = forms.BooleanField(
        required=False, initial=True, help_text="Unticked: saved paused; resume it later."
    )

    field_order = [
        "name",
        *ReplayForm.base_fields,
        *TimingForm.base_fields,
        "cool_off_minutes",
        "give_up_after",
        "enabled",
    ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self.fields["dry_run"]  # a schedule writes: preview with a one-off dry run

    @classmethod
    def of(cls, spec: ScheduleSpec, *, within: Q | None = None) -> ScheduleForm:
        """An unbound form showing a saved schedule's spec."""
        replay, selection, timing = spec.replay, spec.replay.filter, spec.timing
        return cls(
            within=within,
            initial={
                "name": spec.name,
                "source": replay.source,
                "source_queue": replay.source_queue,
                "queues": " ".join(selection.queues),
                "reason": selection.reason,
                "since": selection.since,
                "until": selection.until,
                "header": selection.header,
                "payload_text": selection.payload_text,
                "target_queue": replay.target_queue,
                "rules_text": replay.rules_text,
                "velocity": replay.velocity,
                "cron": timing.cron,
                "time_zone": timing.time_zone,
                "every_seconds": timing.every_seconds,
                "cool_off_minutes": spec.cool_off_minutes,
                "give_up_after": spec.give_up_after,
                "enabled": spec.enabled,
            },
        )

    def replay_fields(self) -> list[forms.BoundField]:
        """Its name and what it replays: the fields before its timing."""
        return [
            self["name"],
            *(self[name] for name in ReplayForm.base_fields if name in self.fields),
        ]

    def timing_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in TimingForm.base_fields]

    def limit_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in ("cool_off_minutes", "give_up_after", "enabled")]

    def schedule_spec(self) -> ScheduleSpec:
        """The schedule the valid form describes. Its replay part is parsed
        first, as a replay job's (``spec``: InvalidInput naming its fields);
        that refusal carries the timing's problems too, so one post shows
        both. The schedule service checks the whole when it saves."""
        data = self.cleaned_data
        timing = self.timing()
        try:
            replay = self.spec()
        except InvalidInput as error:
            raise InvalidInput(
                error.detail, field_errors={**error.field_errors, **timing_problems(timing)}
            ) from error
        return ScheduleSpec(
            name=data["name"],
            replay=replay,
            timing=timing,
            cool_off_minutes=data["cool_off_minutes"],
            give_up_after=data["give_up_after"],
            enabled=data["enabled"],
        )


class ArchiveSearchForm(WindowForm):
    queue = forms.ChoiceField(required=False)
    since = _datetime_local("published at or after")
    until = _datetime_local("published before")
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def __init__(self, *args: Any, within: Q | None = None, **kwargs: Any) -> None:
        """``within``: the queues the user sees (console.access), the only ones offered."""
        super().__init__(*args, **kwargs)
        queue = self.fields["queue"]
        assert isinstance(queue, forms.ChoiceField)
        names = queue_names(within=within)
        queue.choices = [("", "choose a queue"), *((name, name) for name in names)]


def _node_choices() -> list[tuple[str, str]]:
    # No node is chosen for the admin: the survivor is a decision to make.
    return [("", "— choose a node —"), *((name, name) for name in ha_node_names())]


class ResolveForm(forms.Form):
    """The survivor of a split brain: one of the pair's nodes."""

    primary = forms.ChoiceField(
        choices=_node_choices,
        label="Keep as primary",
        help_text="The other node exports what only it had, then rejoins as standby.",
    )
