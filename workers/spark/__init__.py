"""The Spark jobs: replay (``replay``) and the archive (``archive``).

Each runs as a driver process of its own, ``python -m workers.spark KIND
[ARGS]``, launched and watched by ``workers.pipeline``. The driver speaks to
PostgreSQL through broker functions for its bookkeeping (every state
change and query) and through Spark's JDBC source and sink for the bulk of
the rows; the executors run ``broker.rules`` (shipped to them as a zip) and
nothing of Django.
"""
