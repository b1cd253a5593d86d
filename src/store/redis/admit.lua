-- One admission attempt for one scope, all or nothing (see src/store/redis/script.rs).
--
-- KEYS[1] cooldown, KEYS[2] leases, then one key per sliding window, then one per token bucket.
-- ARGV[1] now in microseconds ('' = the server's TIME), ARGV[2] cost, ARGV[3] in-flight cap
-- (-1: none), ARGV[4] lease id, ARGV[5] lease TTL (us), ARGV[6] windows, ARGV[7] buckets,
-- ARGV[8] release channel, ARGV[9] scope id, ARGV[10] leases released since the last call,
-- then those lease ids, then (limit, span us) per window, then (t us, tau us, guard us) per
-- bucket.
-- Answers {0} admitted, {1, us} cooldown, {2} in-flight full, {3, us} quota, or an error.
local function now_us(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function ms_ceil(us) return math.floor((us + 999) / 1000) + 1 end
local function units(member)
  local n = tonumber(string.match(member, ':(%d+)$'))
  if not n then error('reqwest-throttle: corrupt window entry ' .. member) end
  return n
end

local now = now_us(ARGV[1])
local cost = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local ttl = tonumber(ARGV[5])
local nw, nb = tonumber(ARGV[6]), tonumber(ARGV[7])
local nrel = tonumber(ARGV[10])
local at = 11

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

if cap >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= cap then return {2} end
end

local bucket_tat = {}
if cost > 0 then
  local ready = now
  for i = 1, nw do
    local key = KEYS[2 + i]
    local limit, span = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
    at = at + 2
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - span)
    local log = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    local used = 0
    for j = 1, #log, 2 do used = used + units(log[j]) end
    local over = used + cost - limit
    if over > 0 then
      local freed, when = 0, now + span
      for j = 1, #log, 2 do
        freed = freed + units(log[j])
        if freed >= over then when = tonumber(log[j + 1]) + span; break end
      end
      if when > ready then ready = when end
    end
  end
  if ready > now then return {3, ready - now} end
  for i = 1, nb do
    local key = KEYS[2 + nw + i]
    local t, tau, guard = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    at = at + 3
    local kept = redis.call('GET', key)
    if kept then
      kept = tonumber(kept)
      if not kept then error('reqwest-throttle: corrupt token bucket ' .. key) end
    end
    -- GCRA as governor computes it, the guard kept in hand (src/store/token_bucket.rs).
    local shown = kept and kept + guard
    local tat = shown or now
    local extra = t * (cost - 1)
    local earliest = tat + extra - tau
    if now < earliest then return {3, earliest - now} end
    local nxt = math.max(tat, now) + t + extra
    if kept then nxt = math.max(kept, now) + (nxt - math.max(shown, now)) end
    bucket_tat[i] = nxt
  end
else
  at = at + 2 * nw + 3 * nb
end

-- Admitted: charge everything.
if cap >= 0 then
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ms_ceil(ttl))
end
if cost > 0 then
  local w = 12 + nrel
  for i = 1, nw do
    local key, span = KEYS[2 + i], tonumber(ARGV[w + 2 * (i - 1)])
    redis.call('ZADD', key, now, ARGV[4] .. ':' .. cost)
    redis.call('PEXPIRE', key, ms_ceil(span))
  end
  for i = 1, nb do
    redis.call('SET', KEYS[2 + nw + i], bucket_tat[i], 'PX', ms_ceil(bucket_tat[i] - now))
  end
end
return {0}
