"""The data pipeline's domain: replay jobs and the message archive, the two
jobs Spark runs (``workers.spark``).

    selection   which messages (MessageSelection), what a replay job does
                (ReplaySpec), and the one parser of a submitted spec
    source      the SQL the Spark drivers read: a replay's source, the
                messages due for the archive
    replay      a replay job's lifecycle: submit, cancel, run again, and what
                its driver reports (start, progress, staged writes, finish)
    archive     the archive's layout on disk and an archive chunk's
                lifecycle: recorded when written, finished when its messages
                are deleted
    selectors   reads for display: jobs, replayed copies, previews, the
                archive's search

The Spark drivers hold Spark code only and call these for every state
change, so each job's state is written in one place.
"""
