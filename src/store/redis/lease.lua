-- anarchon: the Redis `lease` strategy. One script, one atomic step per call.
--
-- It implements the lease decision table of SPEC §3.1, the same table as
-- `decide()` in src/claim/decide.rs (the conformance suite proves they agree).
-- `now` is Redis's own clock (TIME), read inside the step.
--
-- KEYS (all carry the job's {hash tag}, so they share one cluster slot):
--   1 runs     hash   slot -> run record, and 'L'..slot -> the lease (ms) the
--                     run was claimed with (a renew without a lease keeps it)
--   2 slots    zset   slot (score = slot_ms): history order and pruning
--   3 running  set    slots whose run may exclude others (RUNNING, lease not
--                     known to have lapsed): what `overlap = SKIP` looks at
--   4 fence    string the job's fencing counter, +1 at every win
--   5 history  stream every claim, takeover, relock, finish, interrupt, end
--   6 (optional, single server only) the job registry set (claim, prune)
--   7 (optional, single server only) the claimer's holder index set (claim)
--   8 (optional, single server only) the memory record (claim): see below
--   9 (optional, single server only) the liveness hash, `node\0instance`
--     -> counter, raised by every sidecar every expiry/4 (claim): see
--     `liveness` below and docs/safety.md
-- On a cluster, keys 6 and 7 live in other slots: the caller updates them
-- with separate commands after the step instead.
--
-- ARGV[1] is the operation; the rest depends on it (see each branch).
--
-- A run record is one string:
--   STATE attempt fencing lease_until claimed_at finished_at token instance node
-- (node last: it is the only field that may contain spaces).

local op = ARGV[1]

-- Integers to strings (all values are whole numbers below 2^53; '%d' is
-- exact for them and cheaper than a float format).
local function num(x)
  return string.format('%d', x)
end

local function decode(v)
  local st, at, fe, lu, ca, fa, tok, inst, node =
    string.match(v, '^(%u+) (%d+) (%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%x+) (%d+) (.*)$')
  if not st then
    return nil
  end
  return {
    state = st, attempt = tonumber(at), fencing = tonumber(fe),
    lease_until = tonumber(lu), claimed_at = tonumber(ca), finished_at = tonumber(fa),
    token = tok, inst = inst, node = node,
  }
end

-- The record from its fields, the numbers already as strings.
local function encode_fields(state, attempt_s, fencing_s, lease_until_s, claimed_at_s,
                             finished_at_s, token, inst, node)
  return state .. ' ' .. attempt_s .. ' ' .. fencing_s .. ' ' .. lease_until_s .. ' ' ..
    claimed_at_s .. ' ' .. finished_at_s .. ' ' .. token .. ' ' .. inst .. ' ' .. node
end

local function encode(r)
  return encode_fields(r.state, num(r.attempt), num(r.fencing), num(r.lease_until),
    num(r.claimed_at), num(r.finished_at), r.token, r.inst, r.node)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- What liveness() returns when the caller names no dead holder.
local function nobody_dead()
  return false
end

-- The dead-holder set, passed in by the caller's sidecar from its mesh view:
-- a count and (node, instance) pairs of dead instances, then a count and
-- (node, newest instance) pairs; any older instance of such a node is dead;
-- then a count and (node, instance, counter) triples of expired instances,
-- dead only if their liveness counter (KEYS[9]) still has that value: the
-- caller saw it unchanged for one expiry, and a holder that refreshed it
-- since is alive. Without KEYS[9] those are not dead.
local function liveness(i)
  if ARGV[i] == '0' and ARGV[i + 1] == '0' and (ARGV[i + 2] or '0') == '0' then
    -- The common case, no dead holder at all: no tables to build.
    return nobody_dead
  end
  local dead, cur = {}, {}
  local n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    dead[ARGV[i] .. '\0' .. ARGV[i + 1]] = true
    i = i + 2
  end
  local m = tonumber(ARGV[i]); i = i + 1
  for _ = 1, m do
    cur[ARGV[i]] = tonumber(ARGV[i + 1])
    i = i + 2
  end
  local k = tonumber(ARGV[i]) or 0; i = i + 1
  for _ = 1, k do
    local id = ARGV[i] .. '\0' .. ARGV[i + 1]
    if KEYS[9] and (redis.call('HGET', KEYS[9], id) or '0') == ARGV[i + 2] then
      dead[id] = true
    end
    i = i + 3
  end
  return function(node, inst)
    if dead[node .. '\0' .. inst] then
      return true
    end
    local c = cur[node]
    return c ~= nil and tonumber(inst) < c
  end
end

local function read(slot_s)
  local v = redis.call('HGET', KEYS[1], slot_s)
  if not v then
    return nil, false
  end
  local r = decode(v)
  if not r then
    return nil, true
  end
  return r, false
end

-- attempt_s and fencing_s: the run's attempt and fencing number as strings.
local function log_fields(ev, slot_s, state, attempt_s, fencing_s, node, inst, maxlen)
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', maxlen, '*',
    'ev', ev, 'slot', slot_s, 'state', state, 'attempt', attempt_s,
    'fencing', fencing_s, 'node', node, 'instance', inst)
end

local function log(ev, slot_s, r, maxlen)
  log_fields(ev, slot_s, r.state, num(r.attempt), num(r.fencing), r.node, r.inst, maxlen)
end

local MALFORMED = 'ERR anarchon: malformed run record in '

-- The memory record, `<prefix>:memory` = "id until floor" (one server only).
-- A Redis without persistence that restarts forgets every claim; so do
-- FLUSHALL and eviction. The record tells: a caller that saw the record of
-- an incarnation (`expected`, its id) and finds no record knows the server
-- forgot. Then a new record is written: no claim is decided before `until`
-- (now + quarantine: every lease granted before has run out), and no slot at
-- or before `floor` (the moment it was found) is ever handed out again, since
-- it may have been won already. A caller that knew nothing (a new deployment)
-- starts a record without either. Returns ok, id, until, floor.
local function memory(now, expected, quarantine_ms)
  local key = KEYS[8]
  if not key then
    return true, '', 0, 0
  end
  local v = redis.call('GET', key)
  if v then
    local id, untl, floor = string.match(v, '^(%S+) (%d+) (%d+)$')
    if id then
      untl, floor = tonumber(untl), tonumber(floor)
      return untl <= now, id, untl, floor
    end
  end
  local untl, floor = 0, 0
  if expected ~= '' then
    untl, floor = now + tonumber(quarantine_ms), now
  end
  local id = string.format('%x', now)
  redis.call('SET', key, id .. ' ' .. num(untl) .. ' ' .. num(floor))
  return untl <= now, id, untl, floor
end

-- claim() gives { code, attempt, fencing, lease_until, now, holder node,
-- holder instance, reason, created }. code: 1 WON, 2 RUNNING, 3 DONE, 4 LATE,
-- 5 OVERLAP, 6 the server forgot its claims (no decision before lease_until).
-- created = 1 when this claim created the job's runs hash. The reply to the
-- caller is one string (see `op == 'claim'` below).
local mem_id = ''
local function claim()
  -- ARGV: 2 slot, 3 token, 4 node, 5 instance, 6 lease_ms, 7 max_late_ms,
  --       8 overlap skip (0/1), 9 max_attempts, 10 history maxlen,
  --       11 holder index member, 12 holder index ttl ms, 13 job,
  --       14 expected memory id, 15 quarantine ms,
  --       16 time-floored fencing ('1' on a cluster or behind Sentinel), 17.. dead holders
  local slot_s, token, node, inst = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
  local slot = tonumber(slot_s)
  -- Numbers are parsed where they are needed: every conversion costs.
  local skip = ARGV[8] == '1'
  local maxlen = ARGV[10]
  local is_dead = liveness(17)
  local time_fence = ARGV[16] == '1'
  local now = now_ms()
  local ok, untl, floor
  ok, mem_id, untl, floor = memory(now, ARGV[14], ARGV[15])
  if not ok then
    return { 6, 0, 0, untl, now, '', '', 'store_restarted', 0 }
  end

  local function excludes(r)
    return r.state == 'RUNNING' and r.lease_until > now and not is_dead(r.node, r.inst)
  end

  -- Another run of the job that excludes (overlap = SKIP only). Entries that
  -- can no longer exclude are dropped from the set on the way; a renew or a
  -- takeover puts a run back.
  local function overlapping()
    if not skip then
      return nil
    end
    for _, s in ipairs(redis.call('SMEMBERS', KEYS[3])) do
      if s ~= slot_s then
        local o = read(s)
        if not o or o.state ~= 'RUNNING' or o.lease_until <= now then
          redis.call('SREM', KEYS[3], s)
        elseif not is_dead(o.node, o.inst) then
          return o
        end
      end
    end
    return nil
  end

  local function index()
    if KEYS[7] then
      redis.call('SADD', KEYS[7], ARGV[11])
      redis.call('PEXPIRE', KEYS[7], ARGV[12])
    end
  end

  -- The record is written from strings: the caller's own arguments as they
  -- came (token, instance, node, lease_ms) and one conversion per number.
  local function win(attempt, ev)
    if floor > 0 and redis.call('EXISTS', KEYS[4]) == 0 then
      -- The counter was forgotten with the rest: start above every number
      -- the forgotten incarnation can have handed out (one per win, fewer
      -- than the milliseconds since 1970).
      redis.call('SET', KEYS[4], num(floor))
    end
    local fencing = redis.call('INCR', KEYS[4])
    if time_fence and fencing < now * 1000 then
      -- With replicas, a failover can lose the last increments of the
      -- counter: never below a thousand per millisecond of the store's
      -- clock, so a number handed out before the loss is never handed out
      -- again (unless a job won more than a thousand times a millisecond).
      fencing = now * 1000
      redis.call('SET', KEYS[4], num(fencing))
    end
    local lease_until = now + tonumber(ARGV[6])
    local attempt_s = attempt == 1 and '1' or num(attempt)
    local fencing_s = num(fencing)
    redis.call('HSET', KEYS[1], slot_s,
      encode_fields('RUNNING', attempt_s, fencing_s, num(lease_until), num(now), '0',
        token, inst, node),
      'L' .. slot_s, ARGV[6])
    redis.call('ZADD', KEYS[2], slot_s, slot_s)
    redis.call('SADD', KEYS[3], slot_s)
    log_fields(ev, slot_s, 'RUNNING', attempt_s, fencing_s, node, inst, maxlen)
    index()
    return { 1, attempt, fencing, lease_until, now, node, inst, '', 0 }
  end

  local r, malformed = read(slot_s)
  if malformed then
    return redis.error_reply(MALFORMED .. KEYS[1])
  end
  if not r then
    if slot ~= 0 and now - slot > tonumber(ARGV[7]) then
      return { 4, 0, 0, 0, now, '', '', 'too_late', 0 }
    end
    if slot ~= 0 and slot <= floor then
      -- It may have been won before the server forgot.
      return { 4, 0, 0, 0, now, '', '', 'store_restarted', 0 }
    end
    local o = overlapping()
    if o then
      return { 5, 0, 0, 0, now, o.node, o.inst, 'job_running', 0 }
    end
    local created = redis.call('EXISTS', KEYS[1]) == 0
    local res = win(1, 'claim')
    if created then
      res[9] = 1
      if KEYS[6] then
        redis.call('SADD', KEYS[6], ARGV[13])
      end
    end
    return res
  end
  if r.state == 'RUNNING' then
    if excludes(r) then
      if r.token == token then
        -- A resend: the caller still holds the run. No write.
        index()
        return { 1, r.attempt, r.fencing, r.lease_until, now, r.node, r.inst, '', 0 }
      end
      return { 2, r.attempt, 0, r.lease_until, now, r.node, r.inst, '', 0 }
    end
    if slot == 0 or r.attempt < tonumber(ARGV[9]) then
      return win(r.attempt + 1, 'takeover')
    end
    r.state = 'INTERRUPTED'
    r.finished_at = now
    redis.call('HSET', KEYS[1], slot_s, encode(r))
    redis.call('SREM', KEYS[3], slot_s)
    log('interrupt', slot_s, r, maxlen)
    return { 3, r.attempt, 0, 0, now, '', '', 'interrupted', 0 }
  end
  if slot == 0 then
    -- A finished lock is free again: a new run (attempt 1), not a takeover.
    local o = overlapping()
    if o then
      return { 5, 0, 0, 0, now, o.node, o.inst, 'job_running', 0 }
    end
    -- A new run of the lock (attempt 1), not a takeover; fencing rises.
    return win(1, 'relock')
  end
  local reasons = { SUCCEEDED = 'succeeded', FAILED = 'failed', INTERRUPTED = 'interrupted' }
  return { 3, r.attempt, 0, 0, now, '', '', reasons[r.state] or 'finished', 0 }
end

-- Reply: one string, the fields separated by single spaces, the node last
-- (the only field that may contain spaces):
--   code attempt fencing lease_until now instance reason created memory_id node
-- One bulk string instead of a ten-element array: the sidecar parses it in a
-- fraction of the instructions (docs/BENCHMARKS.md, round 10).
if op == 'claim' then
  local res = claim()
  if res.err then
    return res
  end
  return num(res[1]) .. ' ' .. num(res[2]) .. ' ' .. num(res[3]) .. ' ' .. num(res[4]) ..
    ' ' .. num(res[5]) .. ' ' .. res[7] .. ' ' .. res[8] .. ' ' .. num(res[9]) .. ' ' ..
    mem_id .. ' ' .. res[6]
end

-- Reply: { 1, lease_until, attempt, fencing, now } or { 0, reason }.
if op == 'renew' then
  -- ARGV: 2 slot, 3 token, 4 lease_ms (0 = the lease the run was claimed
  --       with), 5.. dead holders
  local slot_s, token, lease_ms = ARGV[2], ARGV[3], tonumber(ARGV[4])
  local is_dead = liveness(5)
  local r, malformed = read(slot_s)
  if malformed then
    return redis.error_reply(MALFORMED .. KEYS[1])
  end
  if not r then
    return { 0, 'not_found' }
  end
  if r.token ~= token then
    -- claim::wrong_token: only a run that was taken over had other holders.
    if r.attempt > 1 then
      return { 0, 'taken_over' }
    end
    return { 0, 'not_holder' }
  end
  if r.state == 'SUCCEEDED' or r.state == 'FAILED' then
    return { 0, 'released' }
  end
  if r.state ~= 'RUNNING' then
    return { 0, 'finished' }
  end
  if is_dead(r.node, r.inst) then
    return { 0, 'holder_dead' }
  end
  if lease_ms <= 0 then
    -- A run claimed before the lease was recorded: its first lease.
    lease_ms = tonumber(redis.call('HGET', KEYS[1], 'L' .. slot_s))
      or math.max(r.lease_until - r.claimed_at, 1)
  end
  local now = now_ms()
  r.lease_until = now + lease_ms
  redis.call('HSET', KEYS[1], slot_s, encode(r))
  redis.call('SADD', KEYS[3], slot_s)
  return { 1, r.lease_until, r.attempt, r.fencing, now }
end

-- Reply: { 1, holder node, holder instance, wrote } or { 0, reason }.
if op == 'release' then
  -- ARGV: 2 slot, 3 token, 4 state (SUCCEEDED/FAILED), 5 history maxlen, 6.. dead holders
  local slot_s, token, state, maxlen = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
  local is_dead = liveness(6)
  local r, malformed = read(slot_s)
  if malformed then
    return redis.error_reply(MALFORMED .. KEYS[1])
  end
  if not r then
    return { 0, 'not_found' }
  end
  if r.token ~= token then
    -- claim::wrong_token: only a run that was taken over had other holders.
    if r.attempt > 1 then
      return { 0, 'taken_over' }
    end
    return { 0, 'not_holder' }
  end
  if r.state == 'SUCCEEDED' or r.state == 'FAILED' then
    return { 1, r.node, r.inst, 0 }
  end
  if r.state ~= 'RUNNING' then
    return { 0, 'finished' }
  end
  if is_dead(r.node, r.inst) then
    return { 0, 'holder_dead' }
  end
  r.state = state
  r.finished_at = now_ms()
  redis.call('HSET', KEYS[1], slot_s, encode(r))
  redis.call('SREM', KEYS[3], slot_s)
  log('finish', slot_s, r, maxlen)
  return { 1, r.node, r.inst, 1 }
end

-- Ends a current lease at once, so the next claimer takes the run over.
-- 'end': the holder of ARGV[3] (a token); 'end_holder': held by the holder
-- (node ARGV[3], instance ARGV[4]). Reply: { 1, node, instance } or { 0 }.
if op == 'end' or op == 'end_holder' then
  -- ARGV: 2 slot, 3 token | node, 4 maxlen | instance, 5 maxlen (end_holder)
  local slot_s = ARGV[2]
  local r, malformed = read(slot_s)
  if malformed then
    return redis.error_reply(MALFORMED .. KEYS[1])
  end
  local maxlen
  local mine
  if op == 'end' then
    maxlen = ARGV[4]
    mine = r and r.token == ARGV[3]
  else
    maxlen = ARGV[5]
    mine = r and r.node == ARGV[3] and r.inst == ARGV[4]
  end
  local now = now_ms()
  if not mine or r.state ~= 'RUNNING' or r.lease_until <= now then
    return { 0 }
  end
  r.lease_until = now
  redis.call('HSET', KEYS[1], slot_s, encode(r))
  redis.call('SREM', KEYS[3], slot_s)
  log('end', slot_s, r, maxlen)
  return { 1, r.node, r.inst }
end

-- Runs newest slot first. Reply: { slot, record, slot, record, ... }.
if op == 'history' then
  -- ARGV: 2 max score ('+inf' or '(<slot>'), 3 limit
  local out = {}
  local slots = redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[2], '-inf', 'LIMIT', 0, ARGV[3])
  for _, s in ipairs(slots) do
    local v = redis.call('HGET', KEYS[1], s)
    if v then
      out[#out + 1] = s
      out[#out + 1] = v
    end
  end
  return out
end

-- Deletes up to ARGV[3] runs claimed before the cutoff that are finished or
-- whose lease lapsed before it, looking at no more than ARGV[4] of the
-- oldest slots, and trims the history stream to the cutoff.
-- Reply: { deleted, runs left (0 = the job has no runs any more) }.
if op == 'prune' then
  -- ARGV: 2 cutoff_ms, 3 limit, 4 scan limit, 5 job
  local cutoff, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
  local n = 0
  for _, s in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2], 'LIMIT', 0, ARGV[4])) do
    if n >= limit then
      break
    end
    local v = redis.call('HGET', KEYS[1], s)
    local r = v and decode(v)
    if not v then
      redis.call('ZREM', KEYS[2], s)
      redis.call('SREM', KEYS[3], s)
    elseif r and r.claimed_at < cutoff and (r.state ~= 'RUNNING' or r.lease_until < cutoff) then
      redis.call('HDEL', KEYS[1], s, 'L' .. s)
      redis.call('ZREM', KEYS[2], s)
      redis.call('SREM', KEYS[3], s)
      n = n + 1
    end
  end
  redis.call('XTRIM', KEYS[5], 'MINID', '~', ARGV[2])
  local left = redis.call('HLEN', KEYS[1])
  if left == 0 and KEYS[6] then
    redis.call('SREM', KEYS[6], ARGV[5])
  end
  return { n, left }
end

return redis.error_reply('ERR anarchon: unknown lease operation ' .. tostring(op))
