"""The Spark jobs: replay (``replay``) and the archive (``archive``).

Each runs as a driver process of its own, ``python -m workers.spark KIND
[ARGS]``, launched and watched by ``workers.pipeline``: a client of the
Spark Connect server SPARK_REMOTE names, or a driver with a JVM of its own
on SPARK_MASTER (``session``); ``connect_server`` starts a local Connect
server. The driver speaks to PostgreSQL through broker functions for its
bookkeeping (every state change and query) and through Spark's JDBC source
and sink for the bulk of the rows; the executors run ``broker.rules``
(shipped to them as a zip) and nothing of Django.
"""
