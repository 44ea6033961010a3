-- anarchon: the Redis `idmp` strategy's claim (Redis >= 8.6).
--
-- The de-duplication is the server's: `XADD <stream> IDMP <job> <slot_ms>`
-- appends the claim only if this (producer, idempotent id) pair is new, and
-- otherwise returns the ID of the first entry, which is read back here and
-- whose token is the answer. This script only adds what must happen in the
-- same step:
--   * `now` from TIME, for LATE (nothing is written when too late);
--   * IDMP-DURATION and IDMP-MAXSIZE are set with XCFGSET only when this
--     call creates the stream. XCFGSET wipes the stream's dedup map, so it
--     must never run on a live stream; inside the script no other claim can
--     come between the creation and the configuration.
--
-- KEYS: 1 the job's claims stream
-- ARGV: 1 job (producer id), 2 slot (idempotent id), 3 token, 4 node,
--       5 instance, 6 max_late_ms, 7 IDMP-DURATION (s), 8 IDMP-MAXSIZE,
--       9 trim entries older than this many ms
-- Reply: { status, entry id, token, node, instance, now }, status one of
--   'found' (the entry for this slot, ours or not), 'gone' (the server
--   remembered the slot but its entry was trimmed), 'late', 'window'

local slot_s = ARGV[2]
local slot, max_late = tonumber(slot_s), tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if slot ~= 0 and now - slot > max_late then
  return { 'late', '', '', '', '', now }
end
if slot + max_late >= now + tonumber(ARGV[7]) * 1000 then
  return { 'window', '', '', '', '', now }
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  -- Create the stream empty, then configure it, before any claim is in it.
  redis.call('XADD', KEYS[1], 'MAXLEN', '0', '*', 'created', '1')
  redis.call('XCFGSET', KEYS[1], 'IDMP-DURATION', ARGV[7], 'IDMP-MAXSIZE', ARGV[8])
end
local since = string.format('%.0f', math.max(now - tonumber(ARGV[9]), 0))
local id = redis.call('XADD', KEYS[1], 'IDMP', ARGV[1], slot_s, 'MINID', '~', since, '*',
  'slot', slot_s, 'token', ARGV[3], 'node', ARGV[4], 'instance', ARGV[5],
  'at', string.format('%.0f', now))
local e = redis.call('XRANGE', KEYS[1], id, id)
if #e == 0 then
  return { 'gone', id, '', '', '', now }
end
local f = e[1][2]
return { 'found', id, f[4], f[6], f[8], now }
