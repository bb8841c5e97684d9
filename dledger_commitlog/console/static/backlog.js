// The Topics page's "Waiting" card: delayed messages not yet delivered per delay
// level, and half messages not yet decided per producer group, each with the age of
// the oldest (GET /api/v1/backlog), polled every 2 s while the page is shown.

import { Polled, el, getJson, table, utc } from "./dom.js";

const POLL_MS = 2000;

function seconds(ms) {
  return (ms / 1000).toFixed(1);
}

function levelName(d) {
  return d.level === 0 ? "deliver-at times" : `level ${d.level} (${seconds(d.delay_ms)} s)`;
}

export class BacklogView extends Polled {
  constructor(card) {
    super(POLL_MS);
    this.body = card.querySelector("#backlog-body");
  }

  async poll() {
    try {
      this.render(await getJson("/api/v1/backlog"));
    } catch (error) {
      this.body.replaceChildren(el("p", { class: "note", text: `not read: ${error.message}` }));
    }
  }

  render(doc) {
    const delayed = doc.delayed.filter((d) => d.messages > 0);
    const halves = doc.halves.filter((h) => h.messages > 0);
    this.body.replaceChildren(
      delayed.length
        ? table(
            ["#shard", "delay", "#messages", "oldest stored (UTC)", "#oldest age (s)"],
            delayed.map((d) => ({
              attrs: { "data-level": d.level, "data-messages": d.messages },
              cells: [d.shard, levelName(d), d.messages, utc(d.oldest_stored_ms), seconds(d.oldest_age_ms)],
            })),
          )
        : el("p", { class: "note delayed-none", text: "No delayed message waiting." }),
      halves.length
        ? table(
            ["#shard", "producer group", "#half messages", "oldest stored (UTC)", "#oldest age (s)"],
            halves.map((h) => ({
              attrs: { "data-producer-group": h.producer_group, "data-messages": h.messages },
              cells: [h.shard, h.producer_group || "-", h.messages, utc(h.oldest_stored_ms), seconds(h.oldest_age_ms)],
            })),
          )
        : el("p", { class: "note halves-none", text: "No half message waiting for its decision." }),
    );
  }
}
