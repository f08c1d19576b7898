"""What the tests share, one home for each helper. Fixtures stay in
tests/conftest.py (and tests/browser/conftest.py) and call in here; test
modules import from here, never from one another.

- ``console``: a logged-in test client, the error shown beside a form field,
  the queue settings form, a publish the API refuses.
- ``browser``: logging in through the real form in Chromium, what a page did
  that a test did not ask for.
- ``publishing``: messages published as a client of the publish service would.
- ``messages``: messages walked into a state through the transitions
  production uses, and what a test reads or waits for of their states.
- ``webhooks``: one HTTP server on 127.0.0.1 that records the POSTs it is
  sent, for webhook consumers and alarm webhooks alike.
- ``archive``: Parquet files laid out as the archive job writes them.
- ``processes``: ``manage.py`` run as a child process.
- ``databases``: a database of a test's own beside the test database; one
  value a query selects.
- ``arguments``: what a command's argument parser says refusing arguments.
- ``rules``: a rules table parsed for the tests of broker.rules (no Django).
- ``replay``: a replay job moved on as its Spark driver would report it.
"""
