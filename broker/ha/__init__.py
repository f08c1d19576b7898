"""The HA pair: two broker nodes, each beside one PostgreSQL server.

The primary's server is the message store; the standby's is a hot standby
fed by PostgreSQL's streaming replication. The nodes heartbeat each other
(``wire``), decide roles and drive their servers (``postgres``: promote,
rewind, follow); ``node`` is the state machine. ``guard`` is what the rest of
Lazaretto sees: the errors a store in maintenance or synchronisation raises,
and the epoch every primary-only duty runs under. ``diverged`` exports the
messages only the losing side of a split brain had.
"""
