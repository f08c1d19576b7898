"""Signals the broker sends; other layers listen without the broker
importing them."""

from django.dispatch import Signal

# Sent inside the transaction that made ``count`` messages deliverable on
# ``queue`` (a Queue): a publish, or a move back from a dead-letter queue;
# or right after it, when that was one statement that committed on its own.
# Receivers that act on the outside world must wait for the commit.
# ``announced`` (default False): the sender's statement announced the queue
# itself (``broker.services.delivery.queue_announce``). ``courier_waits``
# (default False): a courier waiting for the queue's announcements will
# claim them, so no wake-up is needed (``broker.services.delivery``).
messages_available = Signal()

# Sent inside the transaction that queued a bulk triage ``job`` (a BulkJob).
bulk_job_submitted = Signal()

# Sent inside the transaction that queued a replay ``job`` (a ReplayJob), new
# or to run again.
replay_job_submitted = Signal()
