-- wrk script: the viewer's mixed routes against one acquisition, round robin
-- per connection (BF/ABF/ADF with varied radii, CoM, cbed at varied
-- positions, region means, sessions, residency). Counts non-2xx/304 answers.
-- Used by scripts/bench-wrk.sh; SOURCE is "session=...&file=...".
local source = os.getenv("SOURCE")
local paths = {}
local counter = 0
local bad = 0

local function build()
  local p = {}
  for i = 0, 9 do
    local outer = string.format("%.7f", 1.0 + i * 0.01)
    table.insert(p, "/api/browse/realspace?" .. source .. "&mode=BF&inner=0&outer=" .. outer)
    table.insert(p, "/api/browse/realspace?" .. source .. "&mode=ADF&inner=1&outer=" .. string.format("%.7f", 3 + i * 0.01))
    table.insert(p, "/api/browse/cbed?" .. source .. "&sx=" .. i .. "&sy=" .. (i * 3 % 16))
    table.insert(p, "/api/browse/cbed-region?" .. source .. "&cx=" .. (4 + i % 5) .. "&cy=6&radius=3&reduce=mean")
  end
  table.insert(p, "/api/browse/realspace?" .. source .. "&mode=CoMx")
  table.insert(p, "/api/browse/realspace?" .. source .. "&mode=iCoM")
  table.insert(p, "/api/browse/sessions")
  table.insert(p, "/api/browse/residency?" .. source)
  return p
end

function init(args)
  paths = build()
end

function request()
  counter = counter + 1
  local path = paths[(counter % #paths) + 1]
  return wrk.format("GET", path, {["Host"] = "127.0.0.1"})
end

function response(status, headers, body)
  if status ~= 200 and status ~= 304 then
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  io.write(string.format('{"requests": %d, "errors_connect": %d, "errors_read": %d, "errors_write": %d, ' ..
    '"errors_status": %d, "errors_timeout": %d, "duration_s": %.1f, "p50_ms": %.3f, "p90_ms": %.3f, ' ..
    '"p99_ms": %.3f, "max_ms": %.3f}\n',
    summary.requests, summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.status,
    summary.errors.timeout, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
