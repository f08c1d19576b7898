"""The pair's witness: a third voice, in Redis, for what two nodes that
cannot hear each other cannot settle between themselves.

Cut the link between the nodes, and each finds the other silent: the
primary would go on without its standby while the standby took over, and
both would take writes. The witness (Redis, which the web and the workers
see too) keeps two keys per pair, changed only by the scripts below, each
one atomic:

- the **term**: the epoch, its primary, and the standby that primary waits
  for on every commit (empty while it goes on alone);
- the **lease**: the primary's name, with a time to live of the heartbeat
  timeout, on Redis's clock, renewed at every step of the primary's.

A node becomes primary only by a grant (``begin``), which opens the next
epoch. A standby's grant to take over asks that the lease has lapsed and
that the term names it the synchronous standby; a primary that goes on
alone first has the term say so (``renew`` with no standby), so of a
standby that takes over and a primary that drops it, exactly one wins.
A primary whose renewal is refused has been replaced: it fences its server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.exceptions import RedisError

# What both scripts read first (KEYS: term, lease; ARGV[1]: the node's
# name): the term, the lease's holder, and a refusal when another node holds
# the lease. Every answer is {outcome, epoch, primary, standby, holder}.
_READ = """
local name = ARGV[1]
local t = redis.call('HMGET', KEYS[1], 'epoch', 'primary', 'standby')
local epoch, primary, standby = tonumber(t[1]) or 0, t[2] or '', t[3] or ''
local holder = redis.call('GET', KEYS[2]) or ''
local function answer(outcome) return {outcome, epoch, primary, standby, holder} end
if holder ~= '' and holder ~= name then return answer('lease') end
"""

# ARGV: name, base epoch, "1" for a takeover, lease in ms.
_BEGIN = (
    _READ
    + """
local base, takeover = tonumber(ARGV[2]), ARGV[3] == '1'
if epoch > base and primary ~= name then return answer('behind') end
if takeover and (standby ~= name or epoch ~= base) then return answer('not-synchronous') end
local new = math.max(base, epoch) + 1
redis.call('HSET', KEYS[1], 'epoch', new, 'primary', name, 'standby', '')
redis.call('SET', KEYS[2], name, 'PX', ARGV[4])
return {'granted', new, name, '', name}
"""
)

# ARGV: name, epoch, standby, lease in ms.
_RENEW = (
    _READ
    + """
local mine = tonumber(ARGV[2])
if epoch > mine or (epoch == mine and primary ~= '' and primary ~= name) then
  return answer('superseded')
end
redis.call('HSET', KEYS[1], 'epoch', mine, 'primary', name, 'standby', ARGV[3])
redis.call('SET', KEYS[2], name, 'PX', ARGV[4])
return {'granted', mine, name, ARGV[3], name}
"""
)

# KEYS: lease. ARGV: name.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Term:
    """What the witness holds: the epoch, its primary, its synchronous
    standby, and who holds the lease now (empty: it lapsed)."""

    epoch: int
    primary: str
    standby: str
    holder: str


class WitnessRefused(Exception):
    def __init__(self, reason: str, term: Term) -> None:
        self.reason = reason
        self.term = term
        super().__init__(self.detail)

    @property
    def detail(self) -> str:
        term = self.term
        if self.reason == "lease":
            return f"{term.holder} holds the lease of epoch {term.epoch}"
        if self.reason == "behind":
            return f"{term.primary} has been primary since epoch {term.epoch}; this store may lack its writes"
        if self.reason == "not-synchronous":
            return (
                f"the primary of epoch {term.epoch} ({term.primary or 'none'}) waits for "
                f"{term.standby or 'no standby'}, not for this node"
            )
        return f"{term.primary} is primary at epoch {term.epoch}"


class WitnessUnreachable(Exception):
    pass


class Witness:
    """The pair's keys in one Redis: ``lazaretto:ha:<cluster>:term`` and
    ``:lease``, where the cluster is the servers' system identifier (one
    Redis may witness several pairs)."""

    def __init__(self, url: str, *, lease_seconds: float, timeout: float) -> None:
        self.url = url
        self.lease_ms = max(1, round(lease_seconds * 1000))
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=True
        )
        self._begin = self._redis.register_script(_BEGIN)
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self._keys: list[str] = []

    @property
    def bound(self) -> bool:
        return bool(self._keys)

    def bind(self, cluster: str) -> None:
        prefix = f"lazaretto:ha:{cluster}"
        self._keys = [f"{prefix}:term", f"{prefix}:lease"]

    def begin(self, name: str, *, epoch: int, takeover: bool) -> int:
        """The next epoch, granted to ``name`` (whose store is at ``epoch``):
        its lease starts and the term names no standby yet."""
        answer = self._run(self._begin, self._keys, [name, epoch, int(takeover), self.lease_ms])
        return self._granted(answer).epoch

    def renew(self, name: str, *, epoch: int, standby: str) -> None:
        """Renew the lease of ``name``'s ``epoch``; the term records ``standby``
        as the one every commit waits for."""
        self._granted(self._run(self._renew, self._keys, [name, epoch, standby, self.lease_ms]))

    def release(self, name: str) -> None:
        """End ``name``'s lease now (a handover, a switchover, maintenance)."""
        self._run(self._release, self._keys[1:], [name])

    def term(self) -> Term:
        try:
            fields = cast("dict[str, str]", self._redis.hgetall(self._keys[0]))
            holder = cast("str | None", self._redis.get(self._keys[1])) or ""
        except RedisError as error:
            raise WitnessUnreachable(
                f"the witness ({self.where}) does not answer: {error}"
            ) from error
        return Term(
            epoch=int(fields.get("epoch") or 0),
            primary=fields.get("primary", ""),
            standby=fields.get("standby", ""),
            holder=str(holder),
        )

    @property
    def where(self) -> str:
        kwargs = self._redis.connection_pool.connection_kwargs
        return f"redis {kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"

    def _run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        if not self._keys:
            raise WitnessUnreachable("the witness is not bound to the pair's cluster yet")
        try:
            return script(keys=keys, args=args)
        except RedisError as error:
            raise WitnessUnreachable(
                f"the witness ({self.where}) does not answer: {error}"
            ) from error

    @staticmethod
    def _granted(answer: Any) -> Term:
        outcome, epoch, primary, standby, holder = answer
        term = Term(
            epoch=int(epoch), primary=str(primary), standby=str(standby), holder=str(holder)
        )
        if outcome != "granted":
            raise WitnessRefused(str(outcome), term)
        return term
