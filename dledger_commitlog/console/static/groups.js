// The consumer-groups page: every group with its members and the queues each holds,
// per queue the committed offset, the end, the lag and the age of its oldest
// unconsumed message, the group's lag, age, retries and dead letters; polled from GET
// /api/v1/groups and /api/v1/groups/{group} (the views of `dledger group
// list|describe --json`) while the page is shown, and the group's figures over time
// (GET /api/v1/groups/{group}/history, what the console sampled) as a chart with a
// UTC time axis. Two admin actions, each behind a confirmation: reset the offsets
// of a topic (earliest, latest, a UTC time) and resend the dead letters.

import { drawLine } from "./chart.js";
import { Polled, confirmAction, el, getJson, postJson, showErrors, table } from "./dom.js";

const POLL_MS = 2000;
const WINDOW_MS = 10 * 60_000; // of the chart
const FIGURES = [
  ["lag", "lag", "messages", 1],
  ["oldest_unconsumed_age_ms", "oldest unconsumed age", "seconds", 1000],
  ["retries", "retries", "messages", 1],
  ["dead_letters", "dead letters", "messages", 1],
];

/** A duration in ms as "850 ms", "42.0 s", "12 min 5 s", "3 h 20 min". */
function duration(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${Math.floor(ms / 60_000)} min ${Math.floor((ms % 60_000) / 1000)} s`;
  return `${Math.floor(ms / 3_600_000)} h ${Math.floor((ms % 3_600_000) / 60_000)} min`;
}
const RESEND_ROUNDS = 64; // pages of at most 256 dead letters per shard

export class GroupsView extends Polled {
  constructor(root) {
    super(POLL_MS);
    this.root = root;
    this.errors = root.querySelector("#groups-errors");
    this.empty = root.querySelector("#groups-empty");
    this.list = root.querySelector("#groups-list");
    this.status = root.querySelector("#groups-status");
    this.cards = new Map(); // group -> {card, body, form}
  }

  async poll() {
    try {
      await this.refresh();
      showErrors(this.errors, []);
    } catch (error) {
      showErrors(this.errors, [{ view: "groups", message: error.message }]);
    }
  }

  async refresh() {
    const rows = (await getJson("/api/v1/groups")).groups;
    const names = [...new Set(rows.map((r) => r.group))].sort();
    const docs = await Promise.all(names.map((n) => getJson(`/api/v1/groups/${encodeURIComponent(n)}`).catch(() => null)));
    const series = await Promise.all(names.map((n) => getJson(`/api/v1/groups/${encodeURIComponent(n)}/history`).catch(() => null)));
    this.empty.hidden = names.length > 0;
    for (const name of [...this.cards.keys()]) if (!names.includes(name)) this.cards.delete(name);
    names.forEach((name, i) => {
      if (docs[i]) this.group(docs[i]);
      const g = this.cards.get(name);
      if (g && series[i]) {
        g.samples = series[i].samples;
        this.draw(g);
      }
    });
    this.list.replaceChildren(...names.filter((n) => this.cards.has(n)).map((n) => this.cards.get(n).card));
  }

  group(doc) {
    let g = this.cards.get(doc.group);
    if (!g) {
      g = { body: el("div"), form: this.actions(doc.group), samples: [] };
      g.canvas = el("canvas", { class: "chart", role: "img", "aria-label": `figures of group ${doc.group} over time` });
      g.figure = el("select", { name: "figure" }, FIGURES.map(([key, label]) => el("option", { value: key, text: label })));
      g.figure.addEventListener("change", () => this.draw(g));
      const history = el("div", { class: "group-history" }, el("label", {}, "Over time: ", g.figure), g.canvas);
      g.card = el("div", { class: "card group", "data-group": doc.group }, el("h2", { text: doc.group }), g.body, history, g.form.root);
      this.cards.set(doc.group, g);
    }
    const total = (key) => doc.shards.reduce((sum, s) => sum + s.summary[key], 0);
    const lag = total("lag");
    const age = Math.max(0, ...doc.shards.map((s) => s.summary.oldest_unconsumed_age_ms));
    const mode = doc.shards.map((s) => s.summary.mode).find((m) => m) ?? "";
    const summary = el(
      "p",
      { class: "note" },
      el("span", { class: "members", "data-members": total("members"), text: `${total("members")} member(s)` }),
      " · ",
      el("span", { class: "lag", "data-lag": lag, text: `lag ${lag} message${lag === 1 ? "" : "s"}` }),
      " · ",
      el("span", { class: "age", "data-age-ms": age, text: age ? `oldest unconsumed ${duration(age)} ago` : "nothing unconsumed" }),
      ` · retries ${total("retries")} · dead letters `,
      el("span", { class: "dead", "data-dead": total("dead_letters"), text: total("dead_letters") }),
      mode ? ` · ${mode}` : "",
    );
    const members = doc.shards.flatMap((s) =>
      s.members.map((m) => ({
        attrs: { "data-member": m.member_id },
        cells: [s.shard, m.member_id, m.client, m.last_seen_ms_ago, m.leases.map((q) => `${q.topic}/${q.queue_id}`).join(" ") || "-"],
      })),
    );
    const queues = doc.shards.flatMap((s) =>
      s.queues.map((q) => ({
        attrs: { "data-topic": q.topic, "data-queue": `${s.shard}/${q.queue_id}`, "data-committed": q.committed },
        cells: [s.shard, q.topic, q.queue_id, q.committed < 0 ? "-" : q.committed, q.max_offset, q.lag, q.oldest_unconsumed_age_ms ? duration(q.oldest_unconsumed_age_ms) : "-", q.owner || "-", q.in_flight],
      })),
    );
    g.body.replaceChildren(
      summary,
      members.length
        ? table(["#shard", "member", "client", "#seen ms ago", "queues held"], members)
        : el("p", { class: "note", text: "No live member." }),
      queues.length ? table(["#shard", "topic", "#queue id", "#committed", "#max offset", "#lag", "#oldest unconsumed", "owner", "#in flight"], queues) : null,
    );
    g.form.topics(doc.shards.flatMap((s) => [...s.queues.map((q) => q.topic), ...s.subscriptions.map((x) => x.topic)]));
  }

  draw(g) {
    const [key, , unit, scale] = FIGURES.find(([k]) => k === g.figure.value) ?? FIGURES[0];
    const points = g.samples.map((s) => ({ t: s.time_ms, v: s[key] / scale }));
    g.canvas.dataset.samples = String(points.length);
    g.canvas.dataset.last = points.length ? String(points[points.length - 1].v) : "";
    drawLine(g.canvas, points, Date.now(), WINDOW_MS, unit);
  }

  actions(group) {
    const topic = el("select", { name: "topic" });
    const to = el("select", { name: "to" }, ["earliest", "latest", "time"].map((v) => el("option", { value: v, text: v })));
    const time = el("input", { name: "time", type: "datetime-local", step: "1" });
    const force = el("input", { name: "force", type: "checkbox" });
    const reset = el("button", { type: "button", class: "reset", text: "Reset offsets…" });
    const resend = el("button", { type: "button", class: "resend", text: "Resend dead letters…" });
    const root = el(
      "div",
      { class: "group-actions" },
      el("label", {}, "Topic ", topic),
      el("label", {}, "to ", to),
      el("label", {}, "time (UTC) ", time),
      el("label", {}, force, " even with live members"),
      reset,
      resend,
    );
    reset.addEventListener("click", () => this.reset(group, topic.value, to.value, time.value, force.checked));
    resend.addEventListener("click", () => this.resend(group));
    let shown = "";
    return {
      root,
      topics(names) {
        const unique = [...new Set(names.filter((n) => !n.startsWith("%")))].sort();
        if (unique.join("\n") === shown) return;
        const keep = topic.value;
        topic.replaceChildren(...unique.map((n) => el("option", { value: n, text: n })));
        if (unique.includes(keep)) topic.value = keep;
        shown = unique.join("\n");
      },
    };
  }

  async reset(group, topic, to, time, force) {
    const doc = { topic, to, force };
    if (!topic) return this.say(`${group}: no topic to reset`);
    if (to === "time") {
      if (!time) return this.say("give the time (UTC) to reset to");
      doc.time_ms = Date.parse(`${time}Z`);
    }
    const where = to === "time" ? `the first message stored at or after ${time} UTC` : `the ${to} offsets`;
    if (!(await confirmAction(`Reset group ${group}'s offsets of ${topic} to ${where}?`))) return;
    try {
      const done = await postJson(`/api/v1/groups/${encodeURIComponent(group)}/reset-offsets`, doc);
      this.say(`${group}: ${topic} reset to ${to} on ${done.offsets.length} queue(s)`);
    } catch (error) {
      this.say(`${group}: the reset failed: ${error.message}`);
    }
    await this.refresh().catch(() => null);
  }

  async resend(group) {
    if (!(await confirmAction(`Resend group ${group}'s dead letters to its retry topic?`))) return;
    const path = `/api/v1/groups/${encodeURIComponent(group)}/dlq/resend`;
    try {
      let resent = 0;
      const first = await postJson(path, {});
      resent += first.resent;
      for (const s of first.shards) {
        let next = s.next_offset;
        for (let i = 0; i < RESEND_ROUNDS && next < s.max_offset; i++) {
          const more = (await postJson(path, { shard: s.shard, from_offset: next })).shards[0];
          resent += more.resent;
          if (more.next_offset <= next) break;
          next = more.next_offset;
        }
      }
      this.say(`${group}: ${resent} dead letter(s) resent`);
    } catch (error) {
      this.say(`${group}: the resend failed: ${error.message}`);
    }
  }

  say(text) {
    this.status.textContent = text;
  }
}
