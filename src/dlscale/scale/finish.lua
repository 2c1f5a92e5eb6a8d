-- dlscale's router: each request to the replica where it would finish first (scale/finish.py).
--
-- HAProxy runs this in its `rest` and `grpc` backends. dlscale writes, over the runtime API, a
-- map (FINISH_MAP, defined on the line it puts above this file) from each member's server name
-- to its batch clock: "seconds:rows", the time one batch takes on that replica and the most rows
-- a batch holds, as the replicas measured them (scale/weights.py), or "-" while unmeasured.
-- From what passes through HAProxy it keeps, per replica, the batch it computes (rows, and when
-- it ends) and the requests waiting behind it, so that a request's finish there is the time
-- left on the running batch plus one batch per `rows` waiting ahead of it, plus its own.
-- The batch time used is the one HAProxy sees, once it has seen batches end: from a batch's
-- start (the request that found the replica idle, or the end of the batch before) to its last
-- answer, averaged; it holds what the replica's statistics leave out (reading the request,
-- writing the answers, a host that is short of CPU). The measured time is used until then.
-- A replica that is down, draining or in maintenance is skipped; while any replica in service
-- is unmeasured, nothing is placed here and HAProxy's weighted leastconn routes instead.

local clocks = Map.new(FINISH_MAP, Map._str)
-- By server name (the same slot in both backends is the same replica): its batch clock.
local replicas = {}
-- Backends whose requests are placed here, both counted in a replica's requests in flight.
local PLACED = { "rest", "grpc" }
-- The weight of the latest batch in the average of those seen.
local NEWEST = 0.2
-- A batch seen to take less or more than these times the measured one is not counted (a
-- start that was missed, an answer held up elsewhere).
local LEAST, MOST = 0.5, 4.0

local function now()
  local t = core.now()
  return t.sec + t.usec * 1e-6
end

local function clock_of(name)
  local value = clocks:lookup(name)
  if value == nil then
    return nil
  end
  local seconds, rows = value:match("^([%d.eE+-]+):(%d+)$")
  if seconds == nil then
    return false -- a member not measured yet
  end
  return { seconds = tonumber(seconds), rows = math.max(1, tonumber(rows)) }
end

local function state_of(name)
  local r = replicas[name]
  if r == nil then
    r = { running = 0, waiting = 0, ends = 0, started = nil, seen = nil }
    replicas[name] = r
  end
  return r
end

-- The time one batch takes on the replica: as HAProxy saw it, or as the replica measured it.
local function batch_seconds(r, clock)
  return r.seen or clock.seconds
end

-- A batch starts on the replica at `t`, with `rows` requests.
local function start(r, clock, t, rows)
  r.running = rows
  r.started = t
  r.ends = t + batch_seconds(r, clock)
end

-- The waiting requests start the next batch (the replica starts one as soon as it is free).
local function next_batch(r, clock, t)
  local rows = math.min(r.waiting, clock.rows)
  r.waiting = r.waiting - rows
  start(r, clock, t, rows)
end

-- The last answer of a batch came at `t`: its time counts in the average.
local function ended(r, clock, t)
  local took = r.started and (t - r.started)
  if took and took >= LEAST * clock.seconds and took <= MOST * clock.seconds then
    r.seen = r.seen and (1 - NEWEST) * r.seen + NEWEST * took or took
  end
  r.started = nil
end

-- HAProxy's own count of requests on the replica: a request whose answer never passed here (a
-- client that left, one sent again elsewhere) is dropped from the clock. One of slack: a
-- request placed on another thread may not have reached its server yet.
local function reconcile(r, name, clock, t)
  local inflight = 0
  for _, backend in ipairs(PLACED) do
    local proxy = core.backends[backend]
    local server = proxy and proxy.servers[name]
    if server ~= nil then
      inflight = inflight + (tonumber(server:get_stats().scur) or 0)
    end
  end
  local extra = r.running + r.waiting - inflight - 1
  if extra <= 0 then
    return
  end
  local gone = math.min(extra, r.waiting)
  r.waiting = r.waiting - gone
  r.running = math.max(0, r.running - (extra - gone))
  if r.running == 0 then
    r.started = nil -- its end was not seen: not counted
    if r.waiting > 0 then
      next_batch(r, clock, t)
    end
  end
end

local function finish(r, clock, t)
  local seconds = batch_seconds(r, clock)
  if r.running == 0 then
    return seconds -- idle: its batch starts now
  end
  local left = math.max(0, r.ends - t)
  return left + (math.floor(r.waiting / clock.rows) + 1) * seconds
end

local function in_service(server)
  local status = server:get_stats().status or ""
  return status:sub(1, 2) == "UP" or status == "no check"
end

core.register_action("dlscale_pick", { "http-req" }, function(txn)
  local t = now()
  local best, best_finish, best_seconds, unmeasured
  for name, server in pairs(core.backends[txn.f:be_name()].servers) do
    local clock = clock_of(name)
    if clock == false then
      replicas[name] = nil -- a new replica in the slot: its clock starts over
      unmeasured = unmeasured or in_service(server)
    elseif clock ~= nil and in_service(server) then
      local r = state_of(name)
      reconcile(r, name, clock, t)
      local f = finish(r, clock, t)
      local seconds = batch_seconds(r, clock)
      if best == nil or f < best_finish or (f == best_finish and seconds < best_seconds) then
        best, best_finish, best_seconds = name, f, seconds
      end
    end
  end
  if best == nil or unmeasured then
    return -- leastconn routes until every replica in service is measured
  end
  local r = state_of(best)
  if r.running == 0 then
    start(r, clock_of(best), t, 1)
  else
    r.waiting = r.waiting + 1
  end
  txn:set_var("txn.dlscale_server", best)
end)

core.register_action("dlscale_done", { "http-res" }, function(txn)
  if txn:get_var("txn.dlscale_server") == nil then
    return -- not placed here
  end
  local name = txn.f:srv_name()
  local r = replicas[name]
  local clock = name and clock_of(name)
  if r == nil or not clock or r.running == 0 then
    return
  end
  r.running = r.running - 1
  if r.running == 0 then
    local t = now()
    ended(r, clock, t)
    if r.waiting > 0 then
      next_batch(r, clock, t)
    end
  end
end)
