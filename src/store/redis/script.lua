-- anarchon: the Redis `script` strategy's claim. One atomic step.
--
-- Scans the job's stream for an entry of this slot among the entries of the
-- last window_ms (newest first). If there is one, its token is the answer;
-- otherwise the caller's claim is appended and the caller's token is the
-- answer. The caller won exactly when the answer is its own token. `now` is
-- Redis's clock (TIME). Entries older than the window are trimmed (MINID ~)
-- and the key expires window_ms after its last claim.
--
-- KEYS: 1 the job's claims stream
-- ARGV: 1 slot, 2 token, 3 node, 4 instance, 5 max_late_ms, 6 window_ms
-- Reply: { status, entry id, token, node, instance, now }, status one of
--   'found' (an entry exists), 'added' (the caller's claim was appended),
--   'late' (no entry, too late: nothing written), 'window' (no entry, and the
--   slot could still be claimed after the window forgets it: nothing written)

local slot_s, token, node, inst = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local slot, max_late, window = tonumber(slot_s), tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = string.format('%.0f', math.max(now - window, 0))

local last = '+'
while true do
  local page = redis.call('XREVRANGE', KEYS[1], last, since, 'COUNT', 100)
  for _, e in ipairs(page) do
    local f = e[2]
    -- fields are written in a fixed order: slot, token, node, instance, at
    if f[1] == 'slot' and f[2] == slot_s then
      return { 'found', e[1], f[4], f[6], f[8], now }
    end
  end
  if #page < 100 then
    break
  end
  last = '(' .. page[#page][1]
end

if slot ~= 0 and now - slot > max_late then
  return { 'late', '', '', '', '', now }
end
if slot + max_late >= now + window then
  return { 'window', '', '', '', '', now }
end
local id = redis.call('XADD', KEYS[1], 'MINID', '~', since, '*',
  'slot', slot_s, 'token', token, 'node', node, 'instance', inst,
  'at', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return { 'added', id, token, node, inst, now }
