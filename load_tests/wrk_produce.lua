-- wrk script: POST produce requests to the Strata ingest gateway (docs/gateway.md).
--
--   wrk -t2 -c64 -d20s --latency -s load_tests/wrk_produce.lua <gateway-url> \
--       -- <cluster_id> <topic> [batch_size] [record_size] [api_key]
--
-- batch_size 1 (default) sends `POST .../records` with one record per request; above 1,
-- `POST .../records:batch` with that many records. record_size: value bytes (default 100).
-- api_key, if given, goes into `Authorization: Bearer <api_key>`.
-- At the end one JSON line starting with "WRK_JSON " gives requests/s, latency
-- percentiles (ms) and error counts (status = answers other than 2xx/3xx). Records/s is
-- requests/s times batch_size: done() runs in wrk's main Lua state, which never sees the
-- arguments, so it cannot multiply.

function init(args)
  local cluster, topic = args[1], args[2]
  local batch = tonumber(args[3] or "1")
  local size = tonumber(args[4] or "100")
  local key = args[5]
  local value = string.rep("x", size)
  local record = '{"value":{"type":"STRING","data":"' .. value .. '"}}'
  local path = "/v3/clusters/" .. cluster .. "/topics/" .. topic .. "/records"
  local body
  if batch > 1 then
    local entries = {}
    for i = 1, batch do entries[i] = record end
    path = path .. ":batch"
    body = '{"entries":[' .. table.concat(entries, ",") .. ']}'
  else
    body = record
  end
  local headers = {["Content-Type"] = "application/json"}
  if key and key ~= "" then headers["Authorization"] = "Bearer " .. key end
  req = wrk.format("POST", path, headers, body)
end

function request()
  return req
end

function done(summary, latency, requests)
  local secs = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "seconds": %.2f, "requests_per_sec": %.0f, ' ..
    '"p50_ms": %.2f, ' ..
    '"p90_ms": %.2f, "p99_ms": %.2f, "max_ms": %.2f, "errors_status": %d, ' ..
    '"errors_connect": %d, "errors_read": %d, "errors_write": %d, "errors_timeout": %d}\n',
    summary.requests, secs, summary.requests / secs,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, e.status, e.connect, e.read,
    e.write, e.timeout))
end
