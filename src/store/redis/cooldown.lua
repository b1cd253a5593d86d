-- Closes a scope's cooldown for a while; a cooldown closed for longer stays as it is.
-- KEYS[1] cooldown. ARGV[1] now in microseconds ('' = the server's TIME), ARGV[2] wait (us).
-- Answers the microseconds the cooldown stays closed from now.
local now
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local wait = tonumber(ARGV[2])
local until_us = now + wait
local current = redis.call('GET', KEYS[1])
if current then
  current = tonumber(current)
  if not current then error('reqwest-throttle: corrupt cooldown ' .. KEYS[1]) end
  if current >= until_us then return current - now end
end
if wait > 0 then
  redis.call('SET', KEYS[1], until_us, 'PX', math.floor((wait + 999) / 1000) + 1)
end
return wait
