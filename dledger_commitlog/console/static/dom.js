// DOM helpers of the console. Every string from the cluster goes into the page as
// text (textContent, text nodes), never as HTML: a message body "<script>" is shown,
// not run. Nothing here, nor in the other modules, uses innerHTML.

/** A new element: attrs (class, text, on<event> listeners, other attributes), children. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, String(value));
  }
  append(node, children);
  return node;
}

/** Append children (nodes, or strings as text nodes), skipping null and undefined. */
export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** A time in ms since the epoch as "YYYY-MM-DD HH:MM:SS.mmm UTC". */
export function utc(ms) {
  if (!ms) return "";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC");
}

/** A table: column heads (a "#" prefix right-aligns), then rows of cells. */
export function table(heads, rows) {
  const num = heads.map((h) => h.startsWith("#"));
  const head = el("tr", {}, heads.map((h, i) => el("th", { class: num[i] ? "num" : null, text: num[i] ? h.slice(1) : h })));
  const body = rows.map((row) => {
    const tr = el("tr", row.attrs ?? {});
    row.cells.forEach((cell, i) => tr.append(el("td", { class: num[i] ? "num" : null }, cell)));
    return tr;
  });
  return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
}

/** A list of {view, message} errors (the API's refusals) as <li> text. */
export function showErrors(list, errors) {
  list.replaceChildren(...errors.map((e) => el("li", { text: `${e.view ?? "request"}: ${e.message}` })));
}

/** GET a JSON document of the API; an Error with the API's message on a refusal. */
export async function getJson(path) {
  const reply = await fetch(path, { headers: { Accept: "application/json" } });
  let doc = null;
  try {
    doc = await reply.json();
  } catch {
    doc = null;
  }
  if (!reply.ok) {
    const message = doc?.error?.message ?? `${reply.status} ${reply.statusText}`;
    throw new Error(message);
  }
  return doc;
}

/** Send a JSON document to the API with `method` (with the header its CSRF rule asks
 * for); the answer, or an Error with the API's message. */
export async function sendJson(method, path, doc) {
  const reply = await fetch(path, {
    method,
    headers: { Accept: "application/json", "Content-Type": "application/json", "X-Dledger-Request": "1" },
    body: doc === undefined ? undefined : JSON.stringify(doc),
  });
  const answer = await reply.json().catch(() => null);
  if (!reply.ok) throw new Error(answer?.error?.message ?? `${reply.status} ${reply.statusText}`);
  return answer;
}

/** POST a JSON document to the API (see sendJson). */
export function postJson(path, doc) {
  return sendJson("POST", path, doc);
}

/** Ask in the page's confirmation dialog; true when the user confirms. */
export function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// A view read again every `ms` while it is shown: `show(visible)` starts and stops
// the timer; the subclass's `poll()` reads and renders once.
export class Polled {
  constructor(ms) {
    this.ms = ms;
    this.timer = null;
  }

  show(visible) {
    if (!visible) {
      clearTimeout(this.timer);
      this.timer = null;
    } else if (this.timer === null) this.tick();
  }

  tick() {
    this.timer = setTimeout(() => this.tick(), this.ms);
    this.poll();
  }
}
