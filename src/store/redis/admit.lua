-- One admission attempt for one scope, all or nothing (see src/store/redis/script.rs).
--
-- KEYS[1] cooldown, KEYS[2] leases, KEYS[3] processes waiting for a lease, then two keys per
-- sliding window (its log and units: see the prelude), then one per token bucket.
-- ARGV[1] now in microseconds ('' = the server's TIME), ARGV[2] cost, ARGV[3] in-flight cap
-- (-1: none), ARGV[4] lease id, ARGV[5] lease TTL (us), ARGV[6] windows, ARGV[7] buckets,
-- ARGV[8] release channel, ARGV[9] scope id, ARGV[10] this process's id, ARGV[11] leases this
-- process holds, ARGV[12] leases released since the last call, then those lease ids, then
-- (limit, span us, units charged) per window, then (t us, tau us, guard us) per bucket.
-- Answers {0, now} admitted, {1, us} cooldown, {2} in-flight full, {3, us} quota, or an error.
local now = now_us(ARGV[1])
local cost = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local ttl = tonumber(ARGV[5])
local nw, nb = tonumber(ARGV[6]), tonumber(ARGV[7])
local me, mine = ARGV[10], tonumber(ARGV[11])
local nrel = tonumber(ARGV[12])
local at = 13

-- Leases this process released since its last call go first, in order.
if nrel > 0 then
  local ids = {}
  for i = 1, nrel do ids[i] = ARGV[at + i - 1] end
  if redis.call('ZREM', KEYS[2], unpack(ids)) > 0 then
    redis.call('PUBLISH', ARGV[8], ARGV[9])
  end
end
at = at + nrel

local until_us = redis.call('GET', KEYS[1])
if until_us then
  until_us = tonumber(until_us)
  if not until_us then error('reqwest-throttle: corrupt cooldown ' .. KEYS[1]) end
  if until_us > now then return {1, until_us - now} end
end

-- A process refused a lease waits in KEYS[3] (for a second at most). While others wait,
-- a process holding its fair share (cap / processes waiting or admitting) of the leases is
-- refused too: a release goes to whoever asks first, and the process that released asks
-- first, so without this the process holding most leases would keep them. A process not
-- waiting (it just released, say) is also refused a lease that would put it above the exact
-- share: with fewer slots than processes asking, the share rounds up to a whole lease, and
-- the process that released would take its slot back every time.
local function wait_for_lease()
  redis.call('ZADD', KEYS[3], now, me)
  redis.call('PEXPIRE', KEYS[3], 2000)
  return {2}
end
if cap >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= cap then return wait_for_lease() end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - 1000000)
  local others = redis.call('ZCARD', KEYS[3])
  local waiting = redis.call('ZSCORE', KEYS[3], me)
  if waiting then others = others - 1 end
  if others > 0 then
    local share = cap / (others + 1)
    if mine >= math.ceil(share) or (not waiting and mine + 1 > share) then
      return wait_for_lease()
    end
  end
end

local bucket_tat = {}
if cost > 0 then
  local ready = now
  for i = 1, nw do
    local log, units = KEYS[2 + 2 * i], KEYS[3 + 2 * i]
    local limit, span, charge = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    at = at + 3
    local over = window_total(log, units, now - span) + charge - limit
    if charge > 0 and over > 0 then
      local when = window_ready(log, units, over, span, now)
      if when > ready then ready = when end
    end
  end
  if ready > now then return {3, ready - now} end
  for i = 1, nb do
    local key = KEYS[3 + 2 * nw + i]
    local t, tau, guard = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    at = at + 3
    local nxt, earliest = gcra_take(bucket_state(key), now, t, tau, guard, cost)
    if not nxt then return {3, earliest - now} end
    bucket_tat[i] = nxt
  end
else
  at = at + 3 * nw + 3 * nb
end

-- Admitted: charge everything.
if cap >= 0 then
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ms_ceil(ttl))
  redis.call('ZREM', KEYS[3], me)
end
if cost > 0 then
  local w = 14 + nrel
  for i = 1, nw do
    local span, charge = tonumber(ARGV[w + 3 * (i - 1)]), tonumber(ARGV[w + 3 * (i - 1) + 1])
    if charge > 0 then window_add(KEYS[2 + 2 * i], KEYS[3 + 2 * i], ARGV[4], now, charge, span) end
  end
  for i = 1, nb do
    redis.call('SET', KEYS[3 + 2 * nw + i], bucket_tat[i], 'PX', ms_ceil(bucket_tat[i] - now))
  end
end
return {0, now}
