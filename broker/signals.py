"""Signals the broker sends; other layers listen without the broker
importing them."""

from django.dispatch import Signal

# Sent inside the publishing transaction with ``queue`` (a Queue) and
# ``count``. Receivers that act on the outside world must wait for the commit.
messages_published = Signal()
