"""The rows every installation has (the system dead-letter queue, the HA
pair's row) are there again after ``manage.py flush`` has emptied every
table."""

import pytest
from django.core.management import call_command

from broker.models import HaPair, Queue, QueueKind


@pytest.mark.django_db(transaction=True)
def test_flush_leaves_the_system_dead_letter_queue_and_the_ha_row():
    Queue.objects.create(name="ORDERS.IN", consumer="noop")

    call_command("flush", interactive=False, verbosity=0)

    assert list(Queue.objects.values_list("name", "kind")) == [
        ("SYSTEM.DEAD.LETTER.QUEUE", QueueKind.DEAD_LETTER)
    ]
    assert list(HaPair.objects.values_list("id", "epoch")) == [(1, 1)]
