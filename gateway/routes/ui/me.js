// "Where am I": /ui/me.json, polled every second, for whoever holds the key.

import { askKey, clock, count, duration, el, fill, getJSON, kind, poll, refusedKey, row } from "./common.js";

// The policy's budget fields, as the page says them.
const BUDGET_WORDS = {
  tokens_per_day: "budget: tokens per day",
  requests_per_minute: "budget: requests per minute",
  requests_per_hour: "budget: requests per hour",
  slot_seconds_per_day: "budget: slot time per day",
};

// "1200 left of 5000, renews 00:00" (slot time as a duration).
function left(name, limit) {
  const amount = name === "slot_seconds_per_day" ? duration : count;
  const renews = new Date(limit.renews_at * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  return `${amount(limit.remaining)} left of ${amount(limit.limit)}, renews ${renews}`;
}

async function tick() {
  const reply = await getJSON("/ui/me.json");
  if (reply.ok) {
    draw(reply.body);
    return true;
  }
  if (reply.status === 401) {
    document.getElementById("me").hidden = true;
    document.getElementById("summary").textContent = refusedKey();
    askKey(
      document.getElementById("key-form"),
      "Type your API key to see your requests (kept in this tab only).",
      () => poll(tick),
    );
    return false;
  }
  document.getElementById("summary").textContent = reply.message;
  return true;
}

function draw(me) {
  document.getElementById("who").textContent = me.user;
  document.getElementById("summary").textContent = me.summary;
  document.getElementById("updated").textContent = `updated ${clock()}`;
  document.getElementById("house-link").hidden = !me.admin;
  fill(
    "running",
    ...(me.running.length
      ? me.running.map((r) => row(r.model, r.backend, kind(r), duration(r.seconds)))
      : [el("tr", "empty", el("td", null, "nothing running"))]),
  );
  fill(
    "waiting",
    ...(me.waiting.length
      ? me.waiting.map((w) =>
          row(w.position, w.ahead, w.model, kind(w), duration(w.waited_seconds), duration(w.estimated_start_seconds)),
        )
      : [el("tr", "empty", el("td", null, "nothing waiting"))]),
  );
  const limits = me.limits;
  const today = me.today;
  fill(
    "limits",
    row("running at once", `${me.running.length} of ${limits.max_concurrent ?? "–"}`),
    row("waiting at most", `${me.waiting.length} of ${limits.max_queued ?? "–"}`),
    row("weight", limits.weight ?? "–"),
    row("requests today", count(today.requests)),
    row("tokens today", `${count(today.prompt_tokens)} in, ${count(today.completion_tokens)} out`),
    row("refused today", count(today.refused)),
    row("slot time today", duration(today.slot_seconds)),
    ...Object.entries(me.budget).map(([name, limit]) => row(BUDGET_WORDS[name] ?? name, left(name, limit))),
  );
  document.getElementById("me").hidden = false;
}

poll(tick);
