"""The live partition's publishes fill its pages again (the default
fillfactor), undoing migration 0021.

With pages 45 % full the claim's new version of a row stayed on the row's
page and its WAL record carried only the changed bytes, but a waiting
message took twice the pages. While a transaction stays open, every
delivered row's old version is kept, and a claim from the queue's head
walks past them page by page: twice the pages, twice the walk. In the soak
an idle transaction of 3 minutes then left a backlog about three times as
deep, and its latency took longer to recover.

It applies to the pages written from now on; an existing backlog keeps its
pages as they are.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("broker", "0021_live_partition_room_for_the_claim")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE broker_message_live RESET (fillfactor)",
            "ALTER TABLE broker_message_live SET (fillfactor = 45)",
        )
    ]
