// The topics page: per topic its messages and each queue's min and max offsets, and
// its put rate (messages a second) over the last two minutes as a chart with a UTC
// time axis. The rate is the growth of the sum of the topic's max offsets between
// two snapshots, as this page has seen them (it starts when the page opens).

import { drawLine } from "./chart.js";
import { el, showErrors, table } from "./dom.js";

const WINDOW_MS = 120 * 1000;

export class TopicsView {
  constructor(root) {
    this.root = root;
    this.errors = root.querySelector("#topics-errors");
    this.empty = root.querySelector("#topics-empty");
    this.list = root.querySelector("#topics-list");
    this.topics = new Map(); // name -> {card, summary, queues, canvas, rate, samples, points}
    this.now = Date.now();
    this.last = null; // the time of the last snapshot read
  }

  update(doc) {
    showErrors(this.errors, doc.errors.filter((e) => e.view === "topics"));
    if (!doc.topics) return;
    this.now = doc.time_ms;
    this.empty.hidden = doc.topics.length > 0;
    for (const topic of doc.topics) this.topic(topic, doc.time_ms);
    this.last = doc.time_ms;
    const names = doc.topics.map((t) => t.topic);
    for (const name of [...this.topics.keys()]) {
      if (!names.includes(name)) {
        this.topics.get(name).card.remove();
        this.topics.delete(name);
      }
    }
    this.list.replaceChildren(...names.map((n) => this.topics.get(n).card));
    if (!this.root.hidden) this.redraw();
  }

  topic(topic, now) {
    let t = this.topics.get(topic.topic);
    if (!t) {
      // a topic absent from the last snapshot had no messages then
      t = { samples: this.last ? [{ t: this.last, total: 0 }] : [], points: [] };
      t.summary = el("p", { class: "note" });
      t.queues = el("div");
      t.rate = el("p", { class: "note rate" });
      t.canvas = el("canvas", { class: "chart", role: "img", "aria-label": `put rate of ${topic.topic}` });
      t.card = el(
        "div",
        { class: "card topic", "data-topic": topic.topic },
        el("h2", { text: topic.topic }),
        el("div", { class: "topic-grid" }, el("div", {}, t.summary, t.queues), el("div", {}, t.canvas, t.rate)),
      );
      this.topics.set(topic.topic, t);
    }
    const total = topic.queues.reduce((sum, q) => sum + q.max_offset, 0);
    const last = t.samples[t.samples.length - 1];
    if (last && now > last.t) t.points.push({ t: now, v: (Math.max(0, total - last.total) * 1000) / (now - last.t) });
    t.samples.push({ t: now, total });
    t.samples = t.samples.filter((s) => now - s.t <= WINDOW_MS);
    t.points = t.points.filter((p) => now - p.t <= WINDOW_MS);
    t.summary.replaceChildren(
      el("span", { class: "messages", "data-messages": topic.messages, text: `${topic.messages} message${topic.messages === 1 ? "" : "s"}` }),
      ` in ${topic.queues.length} queue${topic.queues.length === 1 ? "" : "s"}`,
    );
    const rows = topic.queues.map((q) => ({
      attrs: { "data-queue": q.queue ?? "" },
      cells: [q.queue ?? "", q.shard, q.queue_id, q.min_offset, q.max_offset, q.messages],
    }));
    t.queues.replaceChildren(table(["#queue", "#shard", "#queue id", "#min offset", "#max offset", "#messages"], rows));
    const rate = t.points.length ? t.points[t.points.length - 1].v : 0;
    const peak = Math.max(0, ...t.points.map((p) => p.v));
    t.rate.textContent = `put rate now: ${rate.toFixed(1)} messages/s (peak ${peak.toFixed(1)})`;
    t.canvas.dataset.peak = String(peak);
  }

  redraw() {
    for (const t of this.topics.values()) drawLine(t.canvas, t.points, this.now, WINDOW_MS, "messages/s");
  }
}
