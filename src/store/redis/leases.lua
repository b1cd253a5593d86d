-- Releases or renews this process's leases of one scope.
-- KEYS[1] leases. ARGV[1] now in microseconds ('' = the server's TIME), ARGV[2] lease TTL (us),
-- ARGV[3] release channel, ARGV[4] scope id, ARGV[5] count of released ids, then those ids,
-- then the ids still held (renewed: their expiry moves to now + TTL).
local now = now_us(ARGV[1])
local ttl = tonumber(ARGV[2])
local nrel = tonumber(ARGV[5])
if nrel > 0 then
  local ids = {}
  for i = 1, nrel do ids[i] = ARGV[5 + i] end
  if redis.call('ZREM', KEYS[1], unpack(ids)) > 0 then
    redis.call('PUBLISH', ARGV[3], ARGV[4])
  end
end
local renewed = 0
for i = 6 + nrel, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[i])
end
if #ARGV >= 6 + nrel then
  redis.call('PEXPIRE', KEYS[1], ms_ceil(ttl))
end
return renewed
