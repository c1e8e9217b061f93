"""The Lua scripts of the Redis hold store: each runs atomically in Redis.

Holds: a running request is a member of three sorted sets (its holder's, its slot group's,
the group's heavy set), scored by its expiry on Redis's own clock, and of ``RUNNING`` (what
runs where, for every replica's views). The house's waiting room: a waiting request is a
member of ``WAITING`` (scored by expiry) and of its holder's ``queued`` set, its place
(``base.Place``, as JSON) in ``PLACES``, and when it last asked for a slot in ``ASKED``;
the house's clock in ``CLOCK``, each payer's last finish tag in ``TAGS`` (its scripts:
``house_scripts.py``). Where a front end's total bounds its people together, their holds
and places are also members of its account's sets (``owui/(all)``), as a holder's are.

``TAKE`` checks every limit and the house's order at once, so two replicas cannot both take
the last slot and no request asking for a slot is passed over by one behind it. The order
is by finish tags kept here (``base.Place``), so every replica compares the same numbers:
``JOIN`` gives a place its tag, ``TAKE`` moves the house's clock to the tag of the request
it starts (and gives one that starts at once the tag it would have had), and each
replica adds its payers' output to their tags as it pools its counters. A place ahead of
the taker counts only while it asks (it asked within ``ASKING_MS``; a request
waiting on a replica looks again at least every half second), and only if it could take
this slot (it asked for this slot group, or just joined and is served by it, its holder
is under their cap, its front end's people under their total, and a heavy one finds the
heavy share free). A place that stopped
asking (its replica holds it back, for a prefill gate or a swap) holds nobody up.
"""

from __future__ import annotations

__all__ = [
    "ASKING_MS",
    "COUNT_IN",
    "FORGET_EXPIRED",
    "LEASES",
    "NOW_MS",
    "RELEASE",
    "RENEW",
    "RENEW_IN_FLIGHT",
    "TAG",
    "TAKE",
]

# A place asks for a slot while it tried to take one within this many milliseconds.
ASKING_MS = 1500

NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function live(key) return redis.call('ZCOUNT', key, '(' .. now, '+inf') end
"""
# KEYS: the waiting set, the places, when each asked.
FORGET_EXPIRED = """
local function forget_expired(waiting, places, asked)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', waiting, '-inf', now)) do
    redis.call('HDEL', places, id)
    redis.call('HDEL', asked, id)
  end
  redis.call('ZREMRANGEBYSCORE', waiting, '-inf', now)
end
"""

# A payer's next finish tag: after the house's clock and after its own last tag, by cost.
# A member of a set scored by expiry, kept until then (the key outlives it by a lease):
# the places and holds gone lately, which a renewal racing their TAKE, LEAVE or RELEASE (sent
# before it, run after it) must not write back; the replicas there.
LEASES = """
local function kept(key, id, expiry, lease)
  redis.call('ZADD', key, expiry, id)
  redis.call('PEXPIRE', key, 2 * tonumber(lease))
end
local function leased(key, id, expiry, lease)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  kept(key, id, expiry, lease)
end
local function still(key, id)
  local until_ = redis.call('ZSCORE', key, id)
  return until_ ~= false and tonumber(until_) > now
end
"""
TAG = """
local function tag(clock_key, last_key, payer, cost)
  local clock = tonumber(redis.call('GET', clock_key) or '0')
  local last = tonumber(redis.call('HGET', last_key, payer) or '0')
  return math.max(clock, last) + tonumber(cost)
end
"""

# KEYS: holder, group, group's heavy, waiting, places, asked, running, holder's queued,
# the house's clock, the payers' last tags, the group's people's light requests. ARGV:
# 1 hold, 2 holder's cap, 3 slots, 4 heavy, 5 heavy slots, 6 lease, 7 place ('' none),
# 8 lane, 9 cost, 10 arrived, 11 group, 12 the hold as RUNNING shows it, 13 key prefix,
# 14 payer, 15 a person's light request ('1'), 16 a heavy one whose prefill may start
# beside people's light requests ('1': it has waited ``wait_for_light``), 17 the cap of
# its front end's people together (-1: none). KEYS[12] and [13], only with one: their
# holds and their queued.
TAKE = (
    NOW_MS
    + FORGET_EXPIRED
    + TAG
    + LEASES
    + """
local function asked()
  if ARGV[7] ~= '' and redis.call('ZSCORE', KEYS[4], ARGV[7]) then
    redis.call('HSET', KEYS[6], ARGV[7], now .. ' ' .. ARGV[11])
    -- Its caps as its replica reads them now (a reload may have lowered them since it
    -- joined): ahead of another's take, it counts only if it could start under them.
    local json = redis.call('HGET', KEYS[5], ARGV[7])
    if json then
      local place = cjson.decode(json)
      place[2] = tonumber(ARGV[2])
      if place[14] then place[15] = tonumber(ARGV[17]) end  -- written by a replica as old
      redis.call('HSET', KEYS[5], ARGV[7], cjson.encode(place))
    end
  end
  return 0
end
local function before(place, lane, rank, arrived, id)
  local l, r, a = tonumber(place[3]), tonumber(place[4]), tonumber(place[5])
  if l ~= lane then return l < lane end
  if r ~= rank then return r < rank end
  if a ~= arrived then return a < arrived end
  return id < ARGV[7]
end
local function serves(place)
  for _, group in ipairs(place[7]) do
    if group == ARGV[11] then return true end
  end
  return false
end
local function asking(id, place)
  -- It asked for this very slot group lately: a request refused on one group holds up
  -- no other it could use, which its replica may never try. Just joined without a try
  -- ('*'), it asks for every group serving it.
  local asked_at = redis.call('HGET', KEYS[6], id)
  if not asked_at then return false end
  local space = string.find(asked_at, ' ', 1, true)
  if tonumber(string.sub(asked_at, 1, space - 1)) <= now - """
    + str(ASKING_MS)
    + """ then
    return false
  end
  local group = string.sub(asked_at, space + 1)
  return group == ARGV[11] or (group == '*' and serves(place))
end
local function together_full(together, cap)
  if not together or together == '' or tonumber(cap) < 0 then return false end
  return live(ARGV[13] .. ':user:' .. together) >= tonumber(cap)
end
local function ahead(rank, arrived)
  local lane = tonumber(ARGV[8])
  for _, id in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
    local json = id ~= ARGV[7] and redis.call('HGET', KEYS[5], id)
    local place = json and cjson.decode(json)
    if place and asking(id, place) then
      -- A heavy place is held (the prefill gate) while people's light requests run.
      if before(place, lane, rank, arrived, id)
        and live(ARGV[13] .. ':user:' .. place[1]) < tonumber(place[2])
        and not together_full(place[14], place[15])
        and not (place[6] and (live(KEYS[3]) >= tonumber(ARGV[5]) or live(KEYS[11]) > 0)) then
        return true
      end
    end
  end
  return false
end
for i = 1, 3 do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now) end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return asked() end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return asked() end
if ARGV[4] == '1' and redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[5]) then return asked() end
if KEYS[12] then
  redis.call('ZREMRANGEBYSCORE', KEYS[12], '-inf', now)
  local cap = tonumber(ARGV[17])
  if cap >= 0 and redis.call('ZCARD', KEYS[12]) >= cap then return asked() end
end
-- The prefill gate, house-wide: a long prompt waits for people's light requests to end.
redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now)
if ARGV[4] == '1' and ARGV[16] ~= '1' and redis.call('ZCARD', KEYS[11]) > 0 then
  return asked()
end
local rank = nil
if ARGV[7] ~= '' then
  -- Waiting: the tag and arrival it joined with, as every other replica reads them (the
  -- JSON's numbers, not the caller's finer ones); else (starting at once) the tag it
  -- would have.
  local mine = redis.call('HGET', KEYS[5], ARGV[7])
  local arrived = tonumber(ARGV[10])
  if mine then
    mine = cjson.decode(mine)
    rank, arrived = tonumber(mine[4]), tonumber(mine[5])
  else
    rank = tag(KEYS[9], KEYS[10], ARGV[14], ARGV[9])
  end
  forget_expired(KEYS[4], KEYS[5], KEYS[6])
  if redis.call('ZCARD', KEYS[4]) > 0 and ahead(rank, arrived) then return asked() end
end
local expiry = now + tonumber(ARGV[6])
redis.call('ZADD', KEYS[1], expiry, ARGV[1])
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
if ARGV[4] == '1' then redis.call('ZADD', KEYS[3], expiry, ARGV[1]) end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], 2 * tonumber(ARGV[6])) end
if KEYS[12] then
  redis.call('ZADD', KEYS[12], expiry, ARGV[1])
  redis.call('PEXPIRE', KEYS[12], 2 * tonumber(ARGV[6]))
end
if ARGV[15] == '1' then
  redis.call('ZADD', KEYS[11], expiry, ARGV[1])
  redis.call('PEXPIRE', KEYS[11], 2 * tonumber(ARGV[6]))
end
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
redis.call('ZADD', KEYS[7], expiry, ARGV[12])
redis.call('ZREM', ARGV[13] .. ':house:gone', ARGV[1])  -- taken again: alive
if rank then
  -- The house's clock moves to the tag of the request started; its payer's tag covers it.
  local clock = tonumber(redis.call('GET', KEYS[9]) or '0')
  if rank > clock then redis.call('SET', KEYS[9], tostring(rank)) end
  local last = tonumber(redis.call('HGET', KEYS[10], ARGV[14]) or '0')
  if rank > last then redis.call('HSET', KEYS[10], ARGV[14], tostring(rank)) end
  redis.call('ZREM', KEYS[4], ARGV[7])
  redis.call('HDEL', KEYS[5], ARGV[7])
  redis.call('HDEL', KEYS[6], ARGV[7])
  redis.call('ZREM', KEYS[8], ARGV[7])
  leased(ARGV[13] .. ':house:gone', ARGV[7], expiry, ARGV[6])
  if KEYS[13] then redis.call('ZREM', KEYS[13], ARGV[7]) end
end
return 1
"""
)
# KEYS: holder, group, group's heavy, running, group's people's light, the holds gone, and
# with a front end's total its people's holds. ARGV: hold, lease, heavy, as RUNNING shows
# it, a person's light request. A hold released meanwhile is not written back (0).
RENEW = (
    NOW_MS
    + LEASES
    + """
if still(KEYS[6], ARGV[1]) then return 0 end
local expiry = now + tonumber(ARGV[2])
for i = 1, ARGV[3] == '1' and 3 or 2 do kept(KEYS[i], ARGV[1], expiry, ARGV[2]) end
redis.call('ZADD', KEYS[4], expiry, ARGV[4])
if ARGV[5] == '1' then kept(KEYS[5], ARGV[1], expiry, ARGV[2]) end
if KEYS[7] then kept(KEYS[7], ARGV[1], expiry, ARGV[2]) end
return 1
"""
)
# KEYS: holder, group, group's heavy, running, group's people's light, the holds gone, and
# with a front end's total its people's holds. ARGV: hold, channel, as RUNNING shows it,
# lease. Marked gone for a lease: a renewal sent before, run after, writes nothing back.
RELEASE = (
    NOW_MS
    + LEASES
    + """
for i = 1, 3 do redis.call('ZREM', KEYS[i], ARGV[1]) end
redis.call('ZREM', KEYS[5], ARGV[1])
if KEYS[7] then redis.call('ZREM', KEYS[7], ARGV[1]) end
redis.call('ZREM', KEYS[4], ARGV[3])
leased(KEYS[6], ARGV[1], now + tonumber(ARGV[4]), ARGV[4])
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
"""
)

# A user's requests in flight for budgets: one sorted set per user, scored by expiry, and
# beside it a hash of the tokens each reserves. ARGV: the request, the room in requests, the
# lease, its tokens, the room in tokens (-1: no tokens limit), then requests of the user
# that ended here and whose removal may not have reached Redis yet: an ended request counts
# in the ledger's figures at once, and must not count in flight as well.
COUNT_IN = (
    NOW_MS
    + """
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 6, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
local token_room = tonumber(ARGV[5])
if token_room >= 0 then
  local reserved = 0
  for _, tokens in ipairs(redis.call('HVALS', KEYS[2])) do
    reserved = reserved + tonumber(tokens)
  end
  if reserved >= token_room then return 0 end
end
local lease = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
redis.call('PEXPIRE', KEYS[1], 2 * lease)
redis.call('PEXPIRE', KEYS[2], 2 * lease)
return 1
"""
)
RENEW_IN_FLIGHT = (
    NOW_MS
    + """
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[2]))
return 1
"""
)
