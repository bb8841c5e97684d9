// The cluster page: per node its disk use and put latency (p50, p99; from its metrics
// port); per shard (a Raft group of the cluster) its leader, and per node its role,
// term, commit and applied index, lag in entries and in seconds (the age of the first
// entry it lacks, by the console's clock of the leader's log) and membership, and the
// buttons of its admin actions (cluster_admin.js acts on them); TLS and ACL; the
// leader changes this page has seen in the last hour. Redrawn at each snapshot.

import { el, showErrors, table, utc } from "./dom.js";

const HOUR_MS = 3600 * 1000;

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

export class ClusterView {
  constructor(root) {
    this.summary = root.querySelector("#cluster-summary");
    this.errors = root.querySelector("#cluster-errors");
    this.shards = root.querySelector("#cluster-shards");
    this.figures = root.querySelector("#cluster-nodes");
    this.leaders = new Map(); // shard -> {leader, changes: [time_ms]}
  }

  update(doc) {
    showErrors(this.errors, doc.errors.filter((e) => e.view === "cluster"));
    const view = doc.cluster;
    if (!view) return; // keep the last view shown; the error says why it is not new
    const nodes = new Set();
    for (const shard of view.shards) for (const id of Object.keys(shard.replicas)) nodes.add(id);
    this.summary.replaceChildren(
      `${plural(view.shards.length, "shard")} on ${plural(nodes.size, "node")} · TLS ${view.tls ? "on" : "off"} · ACL ${view.acl ? "on" : "off"} · as of ${utc(doc.time_ms)}`,
    );
    this.figures.replaceChildren(view.node_metrics ? this.nodeFigures(view.node_metrics) : "");
    this.shards.replaceChildren(...view.shards.map((shard) => this.shard(shard, doc.time_ms)));
  }

  /** Per node: disk use, and p50/p99 of the puts it led in the window (its metrics port). */
  nodeFigures(rows) {
    const ms = (v) => (v === null || v === undefined ? "-" : v.toFixed(v < 10 ? 2 : 1));
    const window = Math.max(0, ...rows.map((r) => r.window_s ?? 0));
    const body = rows.map((r) => ({
      attrs: { "data-node": r.node_id ?? "", class: r.error !== undefined ? "down" : null },
      cells: [
        r.node_id ?? "?",
        r.address,
        r.metrics,
        r.disk_usage_ratio === null || r.disk_usage_ratio === undefined ? "-" : `${(r.disk_usage_ratio * 100).toFixed(1)} %`,
        ms(r.put_p50_ms),
        ms(r.put_p99_ms),
        r.puts ?? "-",
      ],
    }));
    return el(
      "div",
      { class: "card nodes" },
      el("h2", { text: "nodes" }),
      table(["node", "client address", "metrics", "#disk used", "#put p50 (ms)", "#put p99 (ms)", "#puts"], body),
      el("p", { class: "note", text: `put latency of the puts each node led in the last ${Math.round(window)} s, from its metrics port; disk used: its fullest shard's disk` }),
      rows.filter((r) => r.error !== undefined).map((r) => el("p", { class: "note", text: r.error })),
    );
  }

  changes(shard, leader, now) {
    const seen = this.leaders.get(shard) ?? { leader, changes: [] };
    if (leader !== null && seen.leader !== null && leader !== seen.leader) seen.changes.push(now);
    if (leader !== null) seen.leader = leader;
    seen.changes = seen.changes.filter((t) => now - t < HOUR_MS);
    this.leaders.set(shard, seen);
    return seen.changes;
  }

  shard(shard, now) {
    const changes = this.changes(shard.shard, shard.leader, now);
    const statuses = new Map();
    for (const s of shard.nodes) if (s.node_id !== undefined) statuses.set(String(s.node_id), s);
    const members = new Map(shard.members.map((m) => [String(m.id), m]));
    const ids = [...new Set([...Object.keys(shard.replicas), ...members.keys()])];
    ids.sort((a, b) => Number(a) - Number(b));
    const rows = ids.map((id) => {
      const s = statuses.get(id);
      const m = members.get(id);
      const cell = shard.replicas[id];
      const lag = m && m.lag >= 0 ? m.lag : cell ? cell.lag : "";
      const seconds = m?.lag_seconds ?? cell?.lag_seconds;
      const lagSeconds = seconds === null || seconds === undefined ? "" : seconds.toFixed(1);
      const role = s ? s.role : "down";
      const act = (action, text) =>
        el("button", { type: "button", class: action, "data-action": action, "data-shard": shard.shard, "data-node": id, "data-leader": shard.leader ?? "", text });
      const actions = [
        s && m?.role === "voter" && shard.leader !== null && String(shard.leader) !== id ? act("transfer", "Make leader…") : null,
        m?.role === "learner" ? act("promote", "Promote…") : null,
        m ? act("remove", "Remove…") : null,
      ];
      return {
        attrs: { class: s ? `role-${role}` : "down", "data-node": id },
        cells: [
          id,
          role,
          m ? m.role : "",
          s ? s.term : "",
          s ? s.committed_index : "",
          s ? s.applied_index : "",
          s ? s.last_index : "",
          lag,
          lagSeconds,
          m ? m.client : s ? s.address : "",
          actions,
        ],
      };
    });
    const leader = shard.leader === null ? "no leader" : `leader: node ${shard.leader}`;
    const title = shard.shard === 0 ? "shard 0 (routes)" : `shard ${shard.shard}`;
    const failed = shard.nodes.filter((s) => s.error !== undefined);
    return el(
      "div",
      { class: "card shard", "data-shard": shard.shard },
      el("h2", {}, title, el("span", { class: shard.leader === null ? "leader none" : "leader", "data-leader": shard.leader ?? "", text: leader })),
      table(["node", "role", "member", "#term", "#commit", "#applied", "#last index", "#lag (entries)", "#lag (s)", "client address", "admin"], rows),
      el("p", { class: "note", text: `leader changes seen in the last hour: ${changes.length}${changes.length ? ` (last ${utc(changes[changes.length - 1])})` : ""}` }),
      failed.map((s) => el("p", { class: "note", text: `${s.address}: ${s.error}` })),
    );
  }
}
