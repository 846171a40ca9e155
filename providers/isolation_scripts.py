"""The Lua scripts of :mod:`providers.isolation` (token bucket, breaker, bulkhead, and the one-round-trip
admission that runs three of them): each runs atomically in Redis, instants from Redis ``TIME``."""

# KEYS: high bucket, standard bucket. ARGV: high rate/s, high capacity, standard rate/s, standard
# capacity, tokens wanted, tier, partial (1 = grant what is there). Returns {granted, wait_ms}.
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function load(key, rate, cap)
  local v = redis.call('HMGET', key, 't', 'ts')
  local tokens, ts = tonumber(v[1]), tonumber(v[2])
  if tokens == nil then tokens, ts = cap, now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate / 1000)
  return tokens
end
local hrate, hcap = tonumber(ARGV[1]), tonumber(ARGV[2])
local srate, scap = tonumber(ARGV[3]), tonumber(ARGV[4])
local want, tier, partial = tonumber(ARGV[5]), ARGV[6], ARGV[7] == '1'
local high = load(KEYS[1], hrate, hcap)
local std = load(KEYS[2], srate, scap)
local granted = 0
if tier == 'high' then
  local from_high = math.min(want, math.floor(high))
  local from_std = math.min(want - from_high, math.floor(std))
  if partial or from_high + from_std == want then
    granted = from_high + from_std
    high = high - from_high
    std = std - from_std
  end
else
  local avail = math.floor(std)
  if partial then granted = math.min(want, avail) elseif avail >= want then granted = want end
  std = std - granted
end
redis.call('HSET', KEYS[1], 't', high, 'ts', now)
redis.call('PEXPIRE', KEYS[1], 60000)
redis.call('HSET', KEYS[2], 't', std, 'ts', now)
redis.call('PEXPIRE', KEYS[2], 60000)
local wait = 0
if granted < want then
  local missing = math.max(1, math.min(want - granted, scap))
  if tier == 'high' then
    local rate = hrate + srate
    if rate > 0 then wait = math.ceil(1000 * (missing - high - std) / rate) end
  elseif srate > 0 then
    wait = math.ceil(1000 * (missing - std) / srate)
  else
    wait = 1000
  end
end
return {granted, math.max(wait, 1)}
"""

# KEYS: state hash, probe key. ARGV: probe lease ms, may probe (1/0). Returns {allowed, wait_ms, probe}.
ALLOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HMGET', KEYS[1], 'state', 'until')
local state, untl = v[1], tonumber(v[2] or '0')
if not state or state == 'closed' then return {1, 0, 0} end
if state == 'open' and now < untl then return {0, untl - now, 0} end
if ARGV[2] ~= '1' then return {0, 500, 0} end
if state == 'open' then redis.call('HSET', KEYS[1], 'state', 'half_open') end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', tonumber(ARGV[1])) then return {1, 0, 1} end
return {0, 500, 0}
"""

# KEYS: state hash, probe key, window key prefix. ARGV: successes, failures, window s,
# min calls, failure rate, open ms, probe (1/0). Returns {state after, failure rate * 1000}.
# The hash also keeps when the current (or last) open spell began (``since``, ms: closed → open; a
# failed probe re-opens the same spell) and when it last closed (``closed_at``, ms) for the admin.
RECORD = """
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec * 1000 + math.floor(tonumber(t[2]) / 1000)
local ok, fail = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, min_calls, threshold = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local open_ms, probe = tonumber(ARGV[6]), ARGV[7] == '1'
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'half_open' or probe then
  redis.call('DEL', KEYS[2])
  if fail > 0 then
    redis.call('HSET', KEYS[1], 'state', 'open', 'until', now + open_ms)
    if state == 'closed' then redis.call('HSET', KEYS[1], 'since', now) end
    redis.call('HINCRBY', KEYS[1], 'opened', 1)
    return {'open', 1000}
  end
  if ok > 0 then
    redis.call('HSET', KEYS[1], 'state', 'closed', 'until', 0)
    if state ~= 'closed' then redis.call('HSET', KEYS[1], 'closed_at', now) end
    for i = 0, window - 1 do redis.call('DEL', KEYS[3] .. (sec - i)) end
    return {'closed', 0}
  end
  return {state, 0}
end
if state == 'open' then return {state, 0} end
local key = KEYS[3] .. sec
if ok > 0 then redis.call('HINCRBY', key, 'ok', ok) end
if fail > 0 then redis.call('HINCRBY', key, 'fail', fail) end
redis.call('EXPIRE', key, window + 2)
if fail == 0 then return {'closed', 0} end
local total_ok, total_fail = 0, 0
for i = 0, window - 1 do
  local c = redis.call('HMGET', KEYS[3] .. (sec - i), 'ok', 'fail')
  total_ok = total_ok + tonumber(c[1] or '0')
  total_fail = total_fail + tonumber(c[2] or '0')
end
local calls = total_ok + total_fail
local rate = total_fail / calls
if calls >= min_calls and rate >= threshold then
  redis.call('HSET', KEYS[1], 'state', 'open', 'until', now + open_ms, 'since', now)
  redis.call('HINCRBY', KEYS[1], 'opened', 1)
  return {'open', math.floor(rate * 1000)}
end
return {'closed', math.floor(rate * 1000)}
"""

# KEYS: slots zset. ARGV: wanted, limit, lease ms, slot id prefix. Returns granted slot ids.
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local free = tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1])
local n = math.min(tonumber(ARGV[1]), free)
local ids = {}
for i = 1, n do
  local id = ARGV[4] .. ':' .. i
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
  ids[i] = id
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + 1000)
return ids
"""

RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #ARGV - 1 do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[#ARGV]), ARGV[i])
end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[#ARGV]) + 1000 then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[#ARGV]) + 1000)
end
return 1
"""

# One round trip before a high-tier call (docs/PERFORMANCE.md, "What an OTP costs"): the three
# scripts above, unchanged, as local functions run in the order the callers ran them: the breaker's
# verdict; if allowed, the bulkhead slots; if any, a first try at the tokens. KEYS: breaker state,
# probe key, slots zset, high bucket, standard bucket. ARGV: ALLOW's 2, then ACQUIRE's 4, then
# TAKE's 7. Returns {allow's answer, slot ids, take's answer ({0, 0}: not tried)}.
ADMIT = ("local function allow(KEYS, ARGV)\n" + ALLOW + "end\n"
          "local function acquire(KEYS, ARGV)\n" + ACQUIRE + "end\n"
          "local function take(KEYS, ARGV)\n" + TAKE + "end\n" + """
local verdict = allow({KEYS[1], KEYS[2]}, {ARGV[1], ARGV[2]})
if verdict[1] == 0 then return {verdict, {}, {0, 0}} end
local slots = acquire({KEYS[3]}, {ARGV[3], ARGV[4], ARGV[5], ARGV[6]})
if #slots == 0 then return {verdict, slots, {0, 0}} end
return {verdict, slots, take({KEYS[4], KEYS[5]}, {ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13]})}
""")
