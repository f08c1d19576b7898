"""Lazaretto's database backend: Django's PostgreSQL backend whose sessions
never wait on a dead or frozen server for longer than their caller allows
(:mod:`broker.store.deadline`). ``DATABASES["default"]["ENGINE"]`` names
this package."""
