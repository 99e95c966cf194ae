-- wrk script for both services. Arguments: kind, nonce, think time in ms.
--   tool-hit      POST /tool, one query again and again (served from the cache)
--   tool-miss     POST /tool, a new query every call (each one goes to the upstream)
--   tool-mixed    POST /tool, searches and clicks: every search is followed by a click on its
--                 first result in the same session (queued when the search's answer arrives);
--                 half the searches repeat one of 64 queries (the cache), half are new
--   reward-same   POST /evaluate, one answer again and again (a cached verdict)
--   reward-unique POST /evaluate, a new answer every call (each one goes to the judge)
-- The nonce makes this run's queries and answers differ from every earlier run's; the think
-- time is how long each session waits between calls (as an agent does while it generates).
local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  kind = args[1] or "tool-hit"
  nonce = args[2] or "0"
  think_ms = tonumber(args[3] or "0")
  counter = 0
  error_bodies = 0
  searches = 0
  clicks = {}      -- sessions whose search has answered, waiting for their click
  searching = {}   -- query -> the one session of this thread whose search for it is in flight
  repeats = 0      -- the last repeated query handed out
end

function delay()
  return think_ms
end

local function unique()
  return nonce .. " " .. id .. " " .. counter
end

-- A reply names only its query, so it tells whose search answered only while one session of
-- the thread at a time searches that query: a repeated query goes to a new search only when no
-- other search of this thread for it is in flight (the next free one of REPEATED in turn; all
-- busy: a new query). Queueing the click of the first of several sessions searching one query
-- when any reply for it came sent clicks ahead of their own search's answer (a search still
-- waiting on the server, or joined to another's upstream call): `invalid_link_id`.
local REPEATED = 64

local function next_repeated()
  for _ = 1, REPEATED do
    repeats = repeats % REPEATED + 1
    local query = "repeated query " .. repeats
    if not searching[query] then return query end
  end
  return nil
end

local function mixed()
  local session = table.remove(clicks, 1)
  if session then
    return '{"session_id":"' .. session .. '","name":"click","arguments":{"link_id":1}}'
  end
  searches = searches + 1
  session = "m" .. unique()
  local query = "query " .. unique()
  if searches % 2 == 0 then query = next_repeated() or query end
  searching[query] = session
  return '{"session_id":"' .. session .. '","name":"search","arguments":{"query":"' ..
    query .. '"}}'
end

function request()
  counter = counter + 1
  local path, body
  if kind == "tool-mixed" then
    path = "/tool"
    body = mixed()
  elseif kind == "tool-hit" or kind == "tool-miss" then
    local query = "silver orrery of haldor"
    if kind == "tool-miss" then query = "query " .. unique() end
    path = "/tool"
    body = '{"session_id":"s' .. id .. '-' .. (counter % 2048) ..
      '","name":"search","arguments":{"query":"' .. query .. '"}}'
  else
    local answer = "Paris"
    if kind == "reward-unique" then answer = "answer " .. unique() end
    path = "/evaluate"
    body = '{"response":"<tool_call>{\\"name\\":\\"finish\\",\\"arguments\\":{\\"answer\\":\\"' ..
      answer .. '\\"}}</tool_call>","label":"Paris"}'
  end
  return wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
end

function response(status, headers, body)
  if string.find(body, '"error":{', 1, true) then
    error_bodies = error_bodies + 1
  end
  if kind == "tool-mixed" then
    -- a search's answer names its query (the fake titles results "QUERY result N"), so the
    -- session searching it has its results now and its click may go.
    local query = string.match(body, '"output":"' .. "\227\128\1441\227\128\145" .. '(.-) result 1')
    local session = query and searching[query]
    if session then
      searching[query] = nil
      table.insert(clicks, session)
    end
  end
end

function done(summary, latency, requests)
  local bad = 0
  for _, thread in ipairs(threads) do
    bad = bad + thread:get("error_bodies")
  end
  io.write(string.format(
    'RESULT {"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"error_bodies":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout, bad,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
