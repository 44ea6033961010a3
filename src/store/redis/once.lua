-- anarchon: release for the Redis once strategies (stream-id, idmp, script).
--
-- Once strategies keep no leases: a release only records the result next to
-- the claim, after checking that the token is the one that claimed the slot.
-- Claims are immutable stream entries, so the check and the write cannot be
-- overtaken by a claim of the same slot.
--
-- KEYS: 1 the job's claims stream, 2 the job's results hash (same {job} slot)
-- ARGV: 1 slot, 2 token, 3 state (SUCCEEDED/FAILED), 4 the entry ID when it
--       is known from the slot (stream-id) or '' to scan for it, 5 results
--       TTL in ms (0 = keep), 6 how many entries a scan looks at, at most
-- Reply: { 1 } or { 0, 'not_found' | 'not_holder' } (a once backend has no
-- takeovers: a token other than the stored claim's never held the slot)

local function fields(f)
  local t = {}
  for i = 1, #f, 2 do
    t[f[i]] = f[i + 1]
  end
  return t
end

local slot_s, token = ARGV[1], ARGV[2]
local entry
if ARGV[4] ~= '' then
  local e = redis.call('XRANGE', KEYS[1], ARGV[4], ARGV[4])
  if #e > 0 then
    entry = fields(e[1][2])
  end
else
  local last, seen, limit = '+', 0, tonumber(ARGV[6])
  while not entry and seen < limit do
    local page = redis.call('XREVRANGE', KEYS[1], last, '-', 'COUNT', 100)
    for _, e in ipairs(page) do
      local f = fields(e[2])
      if f.slot == slot_s then
        entry = f
        break
      end
    end
    if #page < 100 then
      break
    end
    seen = seen + #page
    last = '(' .. page[#page][1]
  end
end
if not entry then
  return { 0, 'not_found' }
end
if entry.token ~= token then
  return { 0, 'not_holder' }
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The first result stays: a repeated release is a no-op.
redis.call('HSETNX', KEYS[2], slot_s, ARGV[3] .. ' ' .. string.format('%.0f', now) .. ' ' .. token)
if tonumber(ARGV[5]) > 0 then
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
return { 1 }
