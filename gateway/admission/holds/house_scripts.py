"""The Lua scripts of the house's one waiting room in Redis (``redis_house.py``): each runs
atomically in Redis, beside the holds' (``scripts.py``, whose clock, expiry and finish-tag
pieces they share).

A waiting request is a member of ``WAITING`` (scored by expiry) and of its holder's
``queued`` set (and, where its front end's total bounds its people, of theirs), its place
(``base.Place``, as JSON) in ``PLACES``, and when it last asked for a slot in ``ASKED``.
"""

from __future__ import annotations

from gateway.admission.holds.scripts import FORGET_EXPIRED, LEASES, NOW_MS, TAG

__all__ = ["HOUSE", "JOIN", "LEAVE", "PRESENT", "RENEW_PLACE"]

# KEYS: waiting, places, asked, holder's queued, the house's clock, the payers' last tags,
# the places gone, and with a front end's total its people's queued. ARGV: place, its
# JSON, max_queued, max_depth, lease, payer, cost, the slot group its request was just
# refused ('' none: it asks for every group serving it until it tries one), the total's
# max_queued (-1: none).
# Its finish tag (as a string: Redis would cut a number to an integer); -1: its holder
# (or its front end's people together) has max_queued waiting; -2: the house is full.
JOIN = (
    NOW_MS
    + FORGET_EXPIRED
    + TAG
    + """
-- A full house is full for background work; a person is not refused for the background
-- places in it (one gateway turns the newest away; here they stay), only for people's:
-- the house then holds at most max_depth places more.
local function full_for(place)
  if place[3] ~= 0 then return true end
  local people = 0
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local json = redis.call('HGET', KEYS[2], id)
    if json and cjson.decode(json)[3] == 0 then people = people + 1 end
  end
  return people >= tonumber(ARGV[4])
end
forget_expired(KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local joined = redis.call('HGET', KEYS[2], ARGV[1])
if joined then return tostring(cjson.decode(joined)[4]) end
if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[3]) then return -1 end
if KEYS[8] then
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now)
  local most = tonumber(ARGV[9])
  if most >= 0 and redis.call('ZCARD', KEYS[8]) >= most then return -1 end
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) and full_for(cjson.decode(ARGV[2])) then
  return -2
end
local finish = tag(KEYS[5], KEYS[6], ARGV[6], ARGV[7])
redis.call('HSET', KEYS[6], ARGV[6], tostring(finish))
local place = cjson.decode(ARGV[2])
place[4] = finish
local expiry = now + tonumber(ARGV[5])
redis.call('ZADD', KEYS[1], expiry, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(place))
redis.call('HSET', KEYS[3], ARGV[1], now .. ' ' .. (ARGV[8] ~= '' and ARGV[8] or '*'))
redis.call('ZADD', KEYS[4], expiry, ARGV[1])
redis.call('PEXPIRE', KEYS[4], 2 * tonumber(ARGV[5]))
redis.call('ZREM', KEYS[7], ARGV[1])  -- a place taken and back (its take given back)
if KEYS[8] then
  redis.call('ZADD', KEYS[8], expiry, ARGV[1])
  redis.call('PEXPIRE', KEYS[8], 2 * tonumber(ARGV[5]))
end
return tostring(finish)
"""
)
# KEYS: waiting, places, asked, holder's queued, the places gone, and with a front end's
# total its people's queued. ARGV: place, channel, lease. A place that leaves may have
# held others back: they look again.
LEAVE = (
    NOW_MS
    + LEASES
    + """
local was = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
leased(KEYS[5], ARGV[1], now + tonumber(ARGV[3]), ARGV[3])
if KEYS[6] then redis.call('ZREM', KEYS[6], ARGV[1]) end
if was == 1 then redis.call('PUBLISH', ARGV[2], ARGV[1]) end
return was
"""
)
# KEYS: waiting, holder's queued, places, the places gone, and with a front end's total its
# people's queued. ARGV: place, lease, its JSON. As RENEW does for holds, a place that a
# restarted Redis lost is written again; not one taken or left meanwhile (0).
RENEW_PLACE = (
    NOW_MS
    + LEASES
    + """
if still(KEYS[4], ARGV[1]) then return 0 end
local expiry = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], expiry, ARGV[1])
kept(KEYS[2], ARGV[1], expiry, ARGV[2])
redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[3])
if KEYS[5] then kept(KEYS[5], ARGV[1], expiry, ARGV[2]) end
return 1
"""
)
# KEYS: the replicas. ARGV: this replica, its lease. A replica is there, idle or not, while
# it renews; one killed outright is gone within its lease.
PRESENT = (
    NOW_MS
    + LEASES
    + """
leased(KEYS[1], ARGV[1], now + tonumber(ARGV[2]), ARGV[2])
return 1
"""
)
# KEYS: waiting, places, asked, running, the house's clock, the payers' last tags, the
# replicas. The house: Redis's time, every place (its JSON), every running hold, every
# replica there. A payer's tag at or below the clock counts as the clock: it is dropped, so
# the hash holds only payers ahead.
HOUSE = (
    NOW_MS
    + FORGET_EXPIRED
    + """
forget_expired(KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local clock = tonumber(redis.call('GET', KEYS[5]) or '0')
local tags = redis.call('HGETALL', KEYS[6])
for i = 1, #tags, 2 do
  if tonumber(tags[i + 1]) <= clock then redis.call('HDEL', KEYS[6], tags[i]) end
end
local places = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local json = redis.call('HGET', KEYS[2], id)
  if json then table.insert(places, json) end
end
local replicas = redis.call('ZRANGEBYSCORE', KEYS[7], '(' .. now, '+inf')
return {now, places, redis.call('ZRANGE', KEYS[4], 0, -1), replicas}
"""
)
