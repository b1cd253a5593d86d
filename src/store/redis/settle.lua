-- Settles one admission's charge with what its answer says (Store::settle's rules).
-- KEYS: two per sliding window (log, units), then one per token bucket.
-- ARGV[1] now in microseconds ('' = the server's TIME), ARGV[2] the admission's entry id
-- (its lease id), ARGV[3] its time (us; '': unknown), ARGV[4] its estimate ('': unknown, or
-- already settled), ARGV[5] the true cost ('': none), ARGV[6] tokens the server says remain
-- ('': none), ARGV[7] windows, ARGV[8] buckets, then (limit, span us, unit: 0 cost,
-- 1 requests, 2 tokens) per window, then (t us, tau us, guard us) per bucket.
local now = now_us(ARGV[1])
local id, place = ARGV[2], tonumber(ARGV[3])
local estimate, actual, remaining = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local nw, nb = tonumber(ARGV[7]), tonumber(ARGV[8])
local settling = estimate and actual

for i = 1, nw do
  local log, units = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 9 + 3 * (i - 1)
  local limit, span, unit = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local total = window_total(log, units, now - span)
  -- The send's place, while this window still counts it.
  local at = place and place + span > now and place
  local sent = at and redis.call('ZSCORE', log, id)
  if settling and unit ~= 1 and sent then
    local held = number_or_error(redis.call('HGET', units, id) or '0', 'window entry ' .. id)
    if actual < estimate then
      -- A refund: never more than the charge, nor than the entry still holds.
      local back = math.min(estimate - actual, held)
      if back > 0 then
        redis.call('HINCRBY', units, 'total', -back)
        total = total - back
        if back == held then
          redis.call('ZREM', log, id)
          redis.call('HDEL', units, id)
        else
          redis.call('HINCRBY', units, id, -back)
        end
      end
    else
      -- An extra charge at the send's place, cut to the room left.
      local more = math.min(actual - estimate, math.max(limit - total, 0))
      if more > 0 then
        window_add(log, units, id, at, more, span)
        total = total + more
      end
    end
  end
  if remaining and unit == 2 then
    -- The server is the judge: what it says is left, the window leaves too.
    local over = math.max(limit - total, 0) - remaining
    if over > 0 then
      if at then
        window_add(log, units, id, at, over, span)
      else
        window_add(log, units, 'r' .. id .. '@' .. now, now, over, span)
      end
    end
  end
end

-- A token bucket is only charged more, and never past empty: as many cells as fit, found as
-- the in-memory bucket does (halving: a refused take charges nothing).
if settling and actual > estimate then
  for i = 1, nb do
    local key = KEYS[2 * nw + i]
    local a = 9 + 3 * nw + 3 * (i - 1)
    local t, tau, guard = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local burst = math.floor(tau / t) + 1
    local kept = bucket_state(key)
    local cells, taken = actual - estimate, 0
    local want = math.min(cells, burst)
    while want > 0 do
      local nxt = gcra_take(kept, now, t, tau, guard, want)
      if nxt then
        kept = nxt
        taken = taken + want
        want = math.min(want, cells - taken)
      else
        want = math.floor(want / 2)
      end
    end
    if taken > 0 then redis.call('SET', key, kept, 'PX', ms_ceil(kept - now)) end
  end
end
return 0
