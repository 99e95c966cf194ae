-- wrk script: POST /tool search calls. mode "hit" repeats one query (served from the cache);
-- mode "miss" sends a new query every time (each one goes to the upstream). Arguments:
-- mode, a nonce that makes this run's queries differ from every earlier run's, and an optional
-- think time in ms that each session waits between calls (as an agent does while it generates).
local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  mode = args[1] or "hit"
  nonce = args[2] or "0"
  think_ms = tonumber(args[3] or "0")
  counter = 0
  error_bodies = 0
end

function delay()
  return think_ms
end

function request()
  counter = counter + 1
  local query
  if mode == "hit" then
    query = "silver orrery of haldor"
  else
    query = "query " .. nonce .. " " .. id .. " " .. counter
  end
  local body = '{"session_id":"s' .. id .. '-' .. (counter % 2048) ..
    '","name":"search","arguments":{"query":"' .. query .. '"}}'
  return wrk.format("POST", "/tool", {["Content-Type"] = "application/json"}, body)
end

function response(status, headers, body)
  if string.find(body, '"error":', 1, true) then
    error_bodies = error_bodies + 1
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
