-- Shared by every script of the Redis store (src/store/redis/script.rs prepends it).
-- Now in microseconds: ARGV's value, or '' for the server's TIME (one clock for the fleet).
local function now_us(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Microseconds as whole milliseconds for PEXPIRE/PX, rounded up, plus one.
local function ms_ceil(us) return math.floor((us + 999) / 1000) + 1 end

-- A sliding window is two keys: `log`, a sorted set of its sends (member: an entry id, the
-- admission's lease id; score: the send's time, us), and `units`, a hash of each entry's units
-- and their sum under the field 'total'. Both have the same expiry.
local function number_or_error(v, what)
  local n = tonumber(v)
  if not n then error('reqwest-throttle: corrupt ' .. what) end
  return n
end

-- The units the window holds once the sends at or before `cutoff` have left (read in batches,
-- so that only the sends leaving are read).
local function window_total(log, units, cutoff)
  local total = number_or_error(redis.call('HGET', units, 'total') or '0', 'window total ' .. units)
  while true do
    local gone = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff, 'LIMIT', 0, 512)
    if #gone == 0 then break end
    local vals = redis.call('HMGET', units, unpack(gone))
    for j = 1, #gone do
      total = total - number_or_error(vals[j] or '0', 'window entry ' .. gone[j])
    end
    redis.call('ZREM', log, unpack(gone))
    redis.call('HDEL', units, unpack(gone))
  end
  if total < 0 then total = 0 end
  if total == 0 then redis.call('DEL', units) else redis.call('HSET', units, 'total', total) end
  return total
end

-- When enough of the oldest sends will have left for `over` more units: their time + span.
local function window_ready(log, units, over, span, now)
  local freed, from = 0, 0
  while true do
    local page = redis.call('ZRANGE', log, from, from + 63, 'WITHSCORES')
    if #page == 0 then return now + span end
    local ids = {}
    for j = 1, #page, 2 do ids[#ids + 1] = page[j] end
    local vals = redis.call('HMGET', units, unpack(ids))
    for j = 1, #ids do
      freed = freed + number_or_error(vals[j] or '0', 'window entry ' .. ids[j])
      if freed >= over then return tonumber(page[2 * j]) + span end
    end
    from = from + 64
  end
end

-- Adds `n` units to entry `id` (sent at `at`) and to the total; both keys expire after span.
local function window_add(log, units, id, at, n, span)
  if redis.call('ZSCORE', log, id) == false then redis.call('ZADD', log, at, id) end
  redis.call('HINCRBY', units, id, n)
  redis.call('HINCRBY', units, 'total', n)
  redis.call('PEXPIRE', log, ms_ceil(span))
  redis.call('PEXPIRE', units, ms_ceil(span))
end

-- One token bucket's GCRA, as governor computes it, with `guard` of its tolerance kept in hand
-- (src/store/token_bucket.rs): the bucket's state after taking `n` cells at `now`, or nil and
-- the earliest time they fit. `kept` is the stored theoretical arrival time (nil: full).
local function gcra_take(kept, now, t, tau, guard, n)
  local shown = kept and kept + guard
  local tat = shown or now
  local extra = t * (n - 1)
  local earliest = tat + extra - tau
  if now < earliest then return nil, earliest end
  local nxt = math.max(tat, now) + t + extra
  if kept then nxt = math.max(kept, now) + (nxt - math.max(shown, now)) end
  return nxt
end

local function bucket_state(key)
  local kept = redis.call('GET', key)
  return kept and number_or_error(kept, 'token bucket ' .. key)
end
