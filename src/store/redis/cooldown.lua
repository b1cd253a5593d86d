-- Closes a scope's cooldown for a while; a cooldown closed for longer stays as it is.
-- KEYS[1] cooldown. ARGV[1] now in microseconds ('' = the server's TIME), ARGV[2] wait (us).
-- Answers the microseconds the cooldown stays closed from now.
local now = now_us(ARGV[1])
local wait = tonumber(ARGV[2])
local until_us = now + wait
local current = redis.call('GET', KEYS[1])
if current then
  current = tonumber(current)
  if not current then error('reqwest-throttle: corrupt cooldown ' .. KEYS[1]) end
  if current >= until_us then return current - now end
end
if wait > 0 then
  redis.call('SET', KEYS[1], until_us, 'PX', ms_ceil(wait))
end
return wait
