"""The rig: real processes for the tests and the benches (a private
redis-server, Celery workers, gunicorn, PostgreSQL clusters, the HA pair,
network namespaces), started, faulted and stopped by both."""
