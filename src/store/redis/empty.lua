-- Starts token buckets empty (a bucket whose quota changed, as the in-memory store does).
-- KEYS: the bucket keys. ARGV[1] now in microseconds ('' = the server's TIME), then
-- (t us, tau us) per bucket.
local now = now_us(ARGV[1])
for i = 1, #KEYS do
  local t, tau = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local tat = now + t + tau
  redis.call('SET', KEYS[i], tat, 'PX', ms_ceil(tat - now))
end
return #KEYS
