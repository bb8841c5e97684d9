// The message search: by id, by key (and a UTC time range), by queue and offset.
// Each message found is shown with its properties, tags, keys and store time, and
// its body as text, pretty-printed JSON, or hex, with a link to its raw bytes, and
// its trace (GET /messages/{id}/trace: stored, delivered, acked, nacked, retried,
// dead-lettered, resent), loaded at once when the search found one message. The
// body is put into the page as text only.

import { el, getJson, table, utc } from "./dom.js";

const API = "/api/v1";
const HEX_MAX_BYTES = 64 * 1024;

function bytesOf(m) {
  if (m.body_encoding === "base64") return Uint8Array.from(atob(m.body), (c) => c.charCodeAt(0));
  return new TextEncoder().encode(m.body);
}

function hexDump(bytes) {
  const lines = [];
  const shown = bytes.subarray(0, HEX_MAX_BYTES);
  for (let at = 0; at < shown.length; at += 16) {
    const row = shown.subarray(at, at + 16);
    const hex = [...row].map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = [...row].map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${at.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${ascii}`);
  }
  if (bytes.length > shown.length) lines.push(`… ${bytes.length - shown.length} more bytes: download the raw bytes`);
  return lines.join("\n");
}

/** The views of a body: {text, json, hex}, each a string or null (not this kind). */
function bodyViews(m) {
  const bytes = bytesOf(m);
  const text = m.body_encoding === "base64" ? null : m.body;
  let json = null;
  if (text !== null) {
    try {
      json = JSON.stringify(JSON.parse(text), null, 2);
    } catch {
      json = null;
    }
  }
  return { text, json, hex: hexDump(bytes) };
}

function utcInput(value) {
  return value ? Date.parse(`${value}Z`) : 0; // a datetime-local read as UTC
}

export class SearchView {
  constructor(root) {
    this.status = root.querySelector("#search-status");
    this.results = root.querySelector("#search-results");
    this.form(root, "#by-id", (f) => `${API}/messages/${encodeURIComponent(f.get("msg_id").trim())}`);
    this.form(root, "#by-key", (f) => {
      const q = new URLSearchParams({ key: f.get("key"), max: f.get("max") || "32" });
      const begin = utcInput(f.get("begin"));
      const end = utcInput(f.get("end"));
      if (begin) q.set("begin_ms", String(begin));
      if (end) q.set("end_ms", String(end));
      return `${API}/topics/${encodeURIComponent(f.get("topic").trim())}/messages?${q}`;
    });
    this.form(root, "#by-offset", (f) => {
      const q = new URLSearchParams({ queue: f.get("queue"), offset: f.get("offset"), count: f.get("count") || "10" });
      return `${API}/topics/${encodeURIComponent(f.get("topic").trim())}/messages?${q}`;
    });
  }

  form(root, selector, url) {
    const form = root.querySelector(selector);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.search(url(new FormData(form)));
    });
  }

  async search(url) {
    this.status.textContent = "searching…";
    this.results.replaceChildren();
    try {
      const doc = await getJson(url);
      const found = doc.messages ?? [doc];
      const range = doc.next_offset !== undefined ? ` (queue offsets ${doc.min_offset} to ${doc.max_offset}; next ${doc.next_offset})` : "";
      this.status.textContent = `${found.length} message${found.length === 1 ? "" : "s"} found${range}`;
      this.results.replaceChildren(...found.map((m) => this.message(m, found.length === 1)));
    } catch (error) {
      this.status.textContent = `not found: ${error.message}`;
    }
  }

  message(m, traced) {
    const fields = [
      ["message id", m.msg_id],
      ["topic", m.topic],
      ["queue id / offset", `${m.queue_id} / ${m.queue_offset}`],
      ["shard", m.shard],
      ["stored", utc(m.store_timestamp_ms)],
      ["born", utc(m.born_timestamp_ms)],
      ["tags", m.tags],
      ["keys", m.keys.join(" ")],
      ["unique key", m.uniq_key],
      ["commit log offset", m.commitlog_offset],
      ["size (body / stored)", `${m.body_size} / ${m.size} bytes`],
    ];
    for (const [name, value] of Object.entries(m.properties)) fields.push([`property ${name}`, value]);
    const views = bodyViews(m);
    const pre = el("pre", { class: "body" });
    const buttons = [];
    const choose = (kind) => {
      pre.textContent = views[kind];
      pre.dataset.view = kind;
      for (const b of buttons) b.setAttribute("aria-pressed", String(b.dataset.view === kind));
    };
    for (const [kind, label] of [["text", "Text"], ["json", "JSON"], ["hex", "Hex"]]) {
      const button = el("button", { type: "button", "data-view": kind, disabled: views[kind] === null, text: label, onclick: () => choose(kind) });
      buttons.push(button);
    }
    choose(views.json !== null ? "json" : views.text !== null ? "text" : "hex");
    const raw = `${API}/messages/${encodeURIComponent(m.msg_id)}/raw`;
    const trace = el("div", { class: "trace" });
    const load = () => showTrace(trace, m.msg_id);
    if (traced) load();
    return el(
      "div",
      { class: "card message", "data-msg-id": m.msg_id },
      el("dl", { class: "fields" }, fields.map(([name, value]) => [el("dt", { text: name }), el("dd", { text: value })])),
      el("div", { class: "body-views" }, "Body: ", buttons, " ", el("a", { href: raw, download: `${m.msg_id}.bin`, text: "download raw bytes" })),
      pre,
      el("div", { class: "trace-actions" }, el("button", { type: "button", class: "trace-load", text: "Trace", onclick: load })),
      trace,
    );
  }
}

const EVENT_NAMES = {
  stored: "stored",
  delivered: "delivered",
  acked: "acked",
  nacked: "nacked",
  retry: "retry scheduled",
  retry_stored: "retry stored",
  dead_lettered: "dead-lettered",
  resent: "resent",
};

/** What an event says beyond its kind, group and member. */
function eventDetail(e) {
  const where = `${e.topic} queue ${e.queue_id} offset ${e.queue_offset}`;
  switch (e.kind) {
    case "stored":
    case "retry_stored":
      return where;
    case "delivered":
      return `delivery ${e.delivery_count} of ${where}`;
    case "nacked":
      return e.outcome === "dead-letter" ? "retries spent: to the dead-letter topic" : `${e.outcome}, delay level ${e.delay_level}`;
    case "retry":
      return `delay level ${e.delay_level}, retry ${e.reconsume_times}, due ${utc(e.due_ms)}`;
    case "dead_lettered":
      return `reason ${e.reason}, after ${e.reconsume_times} retries: ${where}`;
    case "resent":
      return `to ${where}`;
    default:
      return where;
  }
}

async function showTrace(box, msgId) {
  box.replaceChildren(el("p", { class: "summary", text: "tracing…" }));
  try {
    const doc = await getJson(`${API}/messages/${encodeURIComponent(msgId)}/trace`);
    const rows = doc.events.map((e) => ({
      attrs: { "data-kind": e.kind, "data-group": e.group },
      cells: [utc(e.time_ms), EVENT_NAMES[e.kind] ?? e.kind, e.group, e.member_id, eventDetail(e)],
    }));
    const notes = doc.groups.map((g) => {
      const gaps = g.history_complete ? "" : `; its deliveries before ${utc(g.history_since_ms)} are not known (another leader, or too long ago)`;
      return el("li", { text: `group ${g.group}: ${g.consumed ? "consumed" : "not consumed yet"}${gaps}` });
    });
    box.replaceChildren(
      el("h3", { text: "Trace" }),
      table(["time (UTC)", "event", "group", "member", "detail"], rows),
      el("ul", { class: "trace-groups" }, notes),
    );
  } catch (error) {
    box.replaceChildren(el("p", { class: "summary", text: `no trace: ${error.message}` }));
  }
}
