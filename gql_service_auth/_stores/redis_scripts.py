"""The Lua scripts of the Redis token store, each on the keys of one identity (one hash slot).

They use only commands of Redis 6.2 and Valkey alike, and run on a cluster too: the keys of
one identity share a hash tag. Plain text, with no dependency: ``redis.py`` runs them.
"""

from __future__ import annotations

from typing import Final

# Newer-only write: a fetch that lands late must not replace a token that lives longer.
# Expiry is compared on Redis's clock (TIME), so hosts' clocks do not matter.
SAVE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = now + tonumber(ARGV[3])
local stored = tonumber(redis.call('HGET', KEYS[1], 'exp') or '0')
-- A key without a time to live (a write that went wrong) never blocks a newer one.
if stored >= expires and redis.call('PTTL', KEYS[1]) > 0 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'fp', ARGV[2], 'exp', expires, 'life', ARGV[4])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'r', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
LOAD: Final = """
local v = redis.call('HMGET', KEYS[1], 'v', 'life', 'r')
return {v[1], v[2], redis.call('PTTL', KEYS[1]), v[3]}
"""
# Compare-and-delete, for a refused token and for the lock: only its owner's value goes.
DISCARD: Final = """
if redis.call('HGET', KEYS[1], 'fp') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# Take the lock if it is free, extend it if it is the caller's, and take over one without a
# time to live (a restore or PERSIST dropped it: none of ours is without one); else answer
# the holder's owner value, which its waiters look up in the failure key once it is gone.
LOCK: Final = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] or redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return false
end
return holder
"""
# Release (compare-and-delete), and publish why the fetch failed, for its waiters, whether or
# not the lock lapsed meanwhile.
UNLOCK: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[2], ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
end
return 0
"""
GET: Final = """
return redis.call('GET', KEYS[1])
"""

NOTE: Final = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

ADMIT: Final = """
local refused = redis.call('GET', KEYS[1])
if refused then
  return {refused, redis.call('PTTL', KEYS[1]), false, false}
end
if ARGV[1] == '' then
  return {false, false, false, false}
end
local used = redis.call('INCR', KEYS[2])
if used == 1 or redis.call('PTTL', KEYS[2]) < 0 then
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
return {false, false, used, redis.call('PTTL', KEYS[2])}
"""
