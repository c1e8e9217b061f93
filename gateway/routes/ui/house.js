// The house page: /status, polled every second, drawn as slots, a queue and the last hour.

import { askKey, clock, count, duration, el, fill, getJSON, kind, poll, refusedKey, row } from "./common.js";

const SVG = "http://www.w3.org/2000/svg";

async function tick() {
  const reply = await getJSON("/status");
  if (reply.ok) {
    draw(reply.body);
    return true;
  }
  if (reply.status === 401 || reply.status === 403) {
    document.getElementById("house").hidden = true;
    const reason =
      reply.status === 403
        ? "This key is not an admin key: the house page is for admins. Your own requests are under “my requests”."
        : "The house page is for admins: type an admin key (kept in this tab only).";
    document.getElementById("summary").textContent =
      reply.status === 401 ? refusedKey() : reply.message;
    askKey(document.getElementById("key-form"), reason, () => poll(tick));
    return false;
  }
  document.getElementById("summary").textContent = reply.message;
  return true;
}

function draw(status) {
  const backends = Object.entries(status.backends);
  const queue = status.queue;
  document.getElementById("summary").textContent =
    `${status.slots.busy} of ${status.slots.total} slots busy · ${queue.depth} waiting` +
    (queue.depth ? ` · oldest ${duration(queue.oldest_wait_seconds)}` : "") +
    gaveWay(queue.given_way);
  const refused = document.getElementById("policy-error");
  refused.hidden = !status.policy.last_error;
  refused.textContent = status.policy.last_error
    ? `The policy file's last edit was refused; still serving the one before: ${status.policy.last_error}`
    : "";
  document.getElementById("updated").textContent = `updated ${clock()}`;
  fill("backends", ...backends.map(([name, b]) => backend(name, b, status.running)));
  fill("waiting", ...waiting(queue.waiting));
  fill("users", ...Object.entries(status.users).map(([name, u]) => user(name, u)));
  lastHour(status.last_hour);
  fill("refusals", ...refusals(status.refusals), ...strangers(status.strangers));
  document.getElementById("house").hidden = false;
}

function backend(name, b, running) {
  const runs = running.filter((run) => run.backend === name);
  const cells = [];
  for (let i = 0; i < b.slots; i++) cells.push(i < runs.length ? busySlot(runs[i]) : freeSlot());
  const state = b.healthy ? (b.sleeping ? "sleeping" : "up") : "down";
  // An Ollama backend's models as the gateway holds them (its probes and its own dispatches
  // since), as `fairgate status` reads them; other kinds list what their probe saw.
  const models = Object.keys(b.models ?? b.loaded);
  return el(
    "article", "backend",
    el("h3", null, name, " ", el("span", `badge ${state}`, state), " ", el("small", null, b.kind)),
    el("p", "meta",
      `${b.busy} of ${b.slots} slots busy · heavy lane ${b.heavy_running} of ${b.heavy_slots}`,
      models.length ? ` · in memory: ${models.join(", ")}` : " · nothing in memory"),
    b.last_error ? el("p", "error", b.last_error) : null,
    b.runs_fewer ? el("p", "error", b.runs_fewer) : null,
    b.failed_to_load ? el("p", "error", b.failed_to_load) : null,
    b.swap ? el("p", "meta", `swapping in ${b.swap.model}: draining ${b.swap.draining.join(", ")}`) : null,
    el("div", "slots", ...cells),
  );
}

function busySlot(run) {
  return el(
    "div", `slot busy ${run.class}`,
    el("strong", "who", run.user),
    el("span", "what", run.model),
    el("span", "how", `${kind(run)} · ${duration(run.seconds)}`),
  );
}

function freeSlot() {
  return el("div", "slot free", el("span", "what", "free"));
}

function waiting(waiters) {
  if (!waiters.length) return [el("tr", "empty", el("td", null, "nobody waiting"))];
  return waiters.map((w) =>
    row(w.position, w.user, w.model, kind(w), duration(w.waited_seconds), duration(w.estimated_start_seconds)),
  );
}

function user(name, u) {
  const today = u.today;
  return row(
    name,
    (u.max_concurrent ? `${u.running} of ${u.max_concurrent}` : `${u.running}`) +
      tasks(u.background.running),
    (u.max_queued !== null ? `${u.queued} of ${u.max_queued}` : `${u.queued}`) +
      tasks(u.background.queued),
    u.weight ?? "–",
    count(today.requests),
    count(today.prompt_tokens + today.completion_tokens),
    count(today.refused),
  );
}

// What background work giving its slot to people has cost since the start, once it has.
function gaveWay(given) {
  if (!given.restarts) return "";
  const times = given.restarts === 1 ? "once" : `${given.restarts} times`;
  return ` · background work gave way ${times} (${duration(given.slot_seconds)} of slots)`;
}

// A person's background work (their front end's tasks), shown beside their own requests.
function tasks(count) {
  return count ? ` + ${count} background` : "";
}

// Callers the gateway did not recognise (a wrong key), below the household's own.
function strangers(list) {
  if (!list.length) return [];
  const heading = el("tr", "strangers", el("td", null, "not recognised (a wrong key)"));
  return [heading, ...list.map((r) => row(new Date(r.at * 1000).toLocaleTimeString(), "?", r.reason, r.path))];
}

function refusals(list) {
  if (!list.length) return [el("tr", "empty", el("td", null, "none"))];
  return list.map((r) =>
    row(new Date(r.at * 1000).toLocaleTimeString(), r.user ?? "–", r.reason, r.model ?? r.path),
  );
}

function lastHour(minutes) {
  const p50 = minutes.map((m) => m.ttft_p50);
  const p95 = minutes.map((m) => m.ttft_p95);
  const rate = minutes.map((m) => m.refusals);
  const latest = [...minutes].reverse().find((m) => m.ttft_p50 !== null);
  document.getElementById("ttft-caption").textContent = latest
    ? `time to first token: p50 ${duration(latest.ttft_p50)}, p95 ${duration(latest.ttft_p95)}`
    : "time to first token: no replies this hour";
  const refused = rate.reduce((a, b) => a + b, 0);
  document.getElementById("refusals-caption").textContent =
    `refusals: ${refused} this hour, ${rate[rate.length - 1]} this minute`;
  fill("ttft", spark([p95, p50], ["p95", "p50"]));
  fill("refusal-rate", bars(rate));
}

const W = 240;
const H = 40;

function svg() {
  const node = document.createElementNS(SVG, "svg");
  node.setAttribute("viewBox", `0 0 ${W} ${H}`);
  node.setAttribute("class", "spark");
  node.setAttribute("preserveAspectRatio", "none");
  return node;
}

// Lines over the hour, broken where a minute had no reply; one scale for all of them.
function spark(series, classes) {
  const node = svg();
  const top = Math.max(0.001, ...series.flat().filter((v) => v !== null));
  series.forEach((values, k) => {
    let points = [];
    const flush = () => {
      if (points.length) node.append(line(points, classes[k]));
      points = [];
    };
    values.forEach((v, i) => {
      if (v === null) return flush();
      points.push(`${((i * W) / (values.length - 1)).toFixed(1)},${(H - 2 - (v / top) * (H - 4)).toFixed(1)}`);
    });
    flush();
  });
  return node;
}

function line(points, className) {
  if (points.length === 1) points.push(points[0].replace(/^[\d.]+/, (x) => String(Number(x) + 2)));
  const node = document.createElementNS(SVG, "polyline");
  node.setAttribute("points", points.join(" "));
  node.setAttribute("class", className);
  return node;
}

function bars(values) {
  const node = svg();
  const top = Math.max(1, ...values);
  const width = W / values.length;
  values.forEach((v, i) => {
    if (!v) return;
    const bar = document.createElementNS(SVG, "rect");
    const height = Math.max(1, (v / top) * (H - 2));
    bar.setAttribute("x", (i * width).toFixed(1));
    bar.setAttribute("y", (H - height).toFixed(1));
    bar.setAttribute("width", Math.max(1, width - 1).toFixed(1));
    bar.setAttribute("height", height.toFixed(1));
    node.append(bar);
  });
  return node;
}

poll(tick);
