// What both pages share: the key (typed once, kept for this tab only), fetching JSON with
// it, polling, and small helpers that build the page from data without parsing it as HTML.

const STORE = "fairgate.key";
export const EVERY_MS = 1000;

export async function getJSON(path) {
  const key = sessionStorage.getItem(STORE);
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  let reply;
  try {
    reply = await fetch(path, { headers, cache: "no-store" });
  } catch {
    return { ok: false, status: 0, message: "the gateway does not answer; retrying" };
  }
  if (reply.ok) return { ok: true, body: await reply.json() };
  let message = reply.statusText;
  try {
    const error = (await reply.json()).error;
    message = typeof error === "string" ? error : error.message;
  } catch {
    // not JSON: keep the status text
  }
  return { ok: false, status: reply.status, message };
}

// What to say above the key form after a 401: nothing when no key was typed yet (the form
// says what to do; the API's "send Authorization: Bearer" is for programs, not people), and
// that the key is unknown when one was.
export function refusedKey() {
  return sessionStorage.getItem(STORE)
    ? "That key is not one this gateway knows: check it, or ask whoever runs the gateway."
    : "";
}

// Ask for a key in `form` (shown with `reason`); `done` runs once one is given.
export function askKey(form, reason, done) {
  form.querySelector(".reason").textContent = reason;
  form.hidden = false;
  const input = form.querySelector("input");
  input.value = "";
  input.focus();
  form.onsubmit = (event) => {
    event.preventDefault();
    if (!input.value) return;
    sessionStorage.setItem(STORE, input.value);
    form.hidden = true;
    done();
  };
}

// Call `tick` now and again EVERY_MS after each finishes, until it returns false.
export function poll(tick) {
  const again = async () => {
    if (await tick()) setTimeout(again, EVERY_MS);
  };
  again();
}

export function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function row(...cells) {
  return el("tr", null, ...cells.map((cell) => el("td", null, cell)));
}

export function fill(id, ...nodes) {
  document.getElementById(id).replaceChildren(...nodes);
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const minutes = Math.floor(seconds / 60);
  const rest = String(Math.round(seconds % 60)).padStart(2, "0");
  return minutes < 60 ? `${minutes} m ${rest} s` : `${Math.floor(minutes / 60)} h ${minutes % 60} m`;
}

export function count(n) {
  return n >= 10000 ? `${(n / 1000).toFixed(0)}k` : String(n);
}

export function clock() {
  return new Date().toLocaleTimeString();
}

// The class, and the lane when it is not a person's own request (a front end's task).
export function kind(request) {
  return request.lane === "background" ? `${request.class} · background` : request.class;
}
