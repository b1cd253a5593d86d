-- Shared by every script of the Redis store (src/store/redis/script.rs prepends it).
-- Now in microseconds: ARGV's value, or '' for the server's TIME (one clock for the fleet).
local function now_us(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Microseconds as whole milliseconds for PEXPIRE/PX, rounded up, plus one.
local function ms_ceil(us) return math.floor((us + 999) / 1000) + 1 end
