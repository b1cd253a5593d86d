-- Starts token buckets empty (a bucket whose quota changed, as the in-memory store does).
-- KEYS: the bucket keys. ARGV[1] now in microseconds ('' = the server's TIME), then
-- (t us, tau us) per bucket.
local now
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
for i = 1, #KEYS do
  local t, tau = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local tat = now + t + tau
  redis.call('SET', KEYS[i], tat, 'PX', math.floor((tat - now + 999) / 1000) + 1)
end
return #KEYS
