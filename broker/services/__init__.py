"""Broker services: every write in Lazaretto goes through one of these."""
