"""Domain errors. Each carries a stable ``code`` that the API and the console
show to users; the HTTP status is the console's business, not the broker's."""

from __future__ import annotations


class BrokerError(Exception):
    code = "broker_error"
    # Seconds after which a retry may succeed (the Retry-After header), for
    # errors that pass by themselves.
    retry_after: int | None = None

    def __init__(self, detail: str, *, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field_errors = field_errors or {}


class InvalidInput(BrokerError):
    code = "invalid"


class NamesNothing(InvalidInput):
    """Input whose only fault is naming queues that are not there: the API's
    404, as a path naming them would be; elsewhere an error by field."""

    code = "queue_not_found"


class Conflict(InvalidInput):
    """Well formed, but in conflict with what exists (the API's 409); the
    console shows it beside the field it names, as any invalid input."""

    code = "conflict"


class AlreadyExists(Conflict):
    """A name (or another unique value) another object already has."""

    code = "already_exists"


class OutsideTopic(Conflict):
    """A subscription's filter, or a publication's topic string, that is not
    under its topic's string."""

    code = "outside_topic"


class ConfirmationMismatch(Conflict):
    """A destructive command's confirmation does not repeat what it names
    (a purge typed with another queue's name): well formed, but not a
    confirmation of this command."""

    code = "confirmation_mismatch"


class QueueIsNotDeadLetter(Conflict):
    """A queue named where a dead-letter queue belongs (a dead-letter
    replay's source) is one that delivers: well formed, but the queue is of
    the other kind."""

    code = "queue_is_not_dead_letter"


class ReplayIntoDeadLetter(Conflict):
    """A replay's target that is a dead-letter queue: messages arrive there
    only by dead-lettering, as a publish there is refused (the same code)."""

    code = "queue_is_dead_letter"


class NotFound(BrokerError):
    """What a getter was asked for does not exist. The console answers any
    of these with its 404 page, the API with 404 and the subclass's code."""

    code = "not_found"


class QueueNotFound(NotFound):
    code = "queue_not_found"


class TopicNotFound(NotFound):
    code = "topic_not_found"


class SubscriptionNotFound(NotFound):
    code = "subscription_not_found"


class MessageNotFound(NotFound):
    code = "message_not_found"


class BulkJobNotFound(NotFound):
    code = "bulk_job_not_found"


class ReplayJobNotFound(NotFound):
    code = "replay_job_not_found"


class ReplayJobBusy(BrokerError):
    """A replay job in the wrong status for the request: cancelling a
    finished job, running again one that runs."""

    code = "replay_job_busy"


class ScheduleNotFound(NotFound):
    code = "schedule_not_found"


class SchedulePaused(Conflict):
    """Run now on a paused replay schedule: resume it first."""

    code = "schedule_paused"


class ScheduleDeleted(Conflict):
    """A deleted replay schedule: its jobs stay, it fires no more."""

    code = "schedule_deleted"


class ScheduleBusy(Conflict):
    """Run now while the schedule's previous job still runs: two jobs of one
    schedule never run at once."""

    code = "schedule_busy"


class QueueIsDeadLetter(BrokerError):
    """Applications publish to ordinary queues; only the broker dead-letters."""

    code = "queue_is_dead_letter"


class QueueNotEmpty(BrokerError):
    code = "queue_not_empty"


class QueueInUse(BrokerError):
    code = "queue_in_use"


class PayloadTooLarge(BrokerError):
    code = "payload_too_large"

    def __init__(self, detail: str, *, index: int, size: int, limit: int) -> None:
        super().__init__(detail)
        self.index = index
        self.size = size
        self.limit = limit


class BatchTooLarge(BrokerError):
    code = "batch_too_large"


class IllegalTransition(BrokerError):
    """A message was asked to move between states the state machine does not
    connect, or it was no longer in the state the caller expected."""

    code = "illegal_transition"


class MaxMessagesReached(BrokerError):
    """A reject_new queue or subscription is full; the publish wrote nothing."""

    code = "max_messages_reached"

    def __init__(
        self,
        detail: str,
        *,
        owner: str,
        subscription: str | None,
        queue: str,
        limit: int,
        depth: int,
    ) -> None:
        super().__init__(detail)
        self.owner = owner
        self.subscription = subscription
        self.queue = queue
        self.limit = limit
        self.depth = depth


class RuleTableNotFound(NotFound):
    code = "rule_table_not_found"


class NotADraft(BrokerError):
    code = "not_a_draft"


class NothingToRollBack(BrokerError):
    code = "nothing_to_roll_back"


class RulesInvalid(BrokerError):
    """A rules table with errors cannot be activated."""

    code = "rules_invalid"

    def __init__(self, detail: str, *, errors: list[dict[str, object]]) -> None:
        super().__init__(detail)
        self.errors = errors


class NoActiveRules(BrokerError):
    """A dead-letter queue with no active rules table cannot be scanned."""

    code = "no_active_rules"


class HaMaintenance(BrokerError):
    """The HA pair is in maintenance after a split brain: the store refuses
    every write until an admin picks the primary."""

    code = "ha_maintenance"


class HaSynchronising(BrokerError):
    """A standby is rejoining: configuration changes wait until it is synchronised."""

    code = "ha_synchronising"


class StaleEpoch(BrokerError):
    """A primary duty issued under an epoch the store has left behind."""

    code = "ha_stale_epoch"


class HaNodeUnreachable(BrokerError):
    """No broker node answered a command (resolve, switchover, status)."""

    code = "ha_node_unreachable"


class HaNotConfigured(BrokerError):
    """This instance runs no HA pair: no broker node has recorded where it
    answers, so there is nobody to send a switchover or resolve to. A state
    of configuration, not an outage."""

    code = "ha_not_configured"


class HaCommandRefused(BrokerError):
    """A broker node refused a command: an unknown node name, a resolve
    without a split brain, a switchover without a synchronised standby."""

    code = "ha_command_refused"


class HaSecretMismatch(HaNodeUnreachable):
    """The peer answered, but refused this node's signature: the nodes'
    HA_SECRET differ."""

    code = "ha_secret_mismatch"


class HaMisconfigured(BrokerError):
    """A broker node's settings would make the pair unsafe; it does not run."""

    code = "ha_misconfigured"


class StoreUnavailable(BrokerError):
    """The message store cannot be reached or takes no writes now: a
    failover or a switchover is under way. Retrying shortly succeeds."""

    code = "store_unavailable"
    retry_after = 2
