// The Cluster page's admin actions, each behind the page's confirmation dialog: hand a
// shard's leadership to a node, add, promote or remove a shard's member (the buttons
// of each node's row), balance the shards' leaders and run retention now on every node
// (the buttons above the shards). Each is an endpoint of "Cluster admin" in
// docs/http-api.md; the cluster decides who may: with an ACL the signed-in user needs
// the admin right, and a refusal is shown in the page's status line. The page shows
// what came of an action with the next snapshot of the event stream (no reload).

import { confirmAction, postJson, sendJson } from "./dom.js";

const API = "/api/v1";

function moveText(m) {
  return `shard ${m.shard} from node ${m.from} to node ${m.to}`;
}

export class ClusterAdmin {
  constructor(root) {
    this.status = root.querySelector("#cluster-status");
    // the rows are redrawn at each snapshot: one listener for their buttons
    root.querySelector("#cluster-shards").addEventListener("click", (event) => {
      const button = event.target.closest("button[data-action]");
      if (button) this.onNode(button.dataset);
    });
    const force = root.querySelector("#clean-force");
    root.querySelector("#balance").addEventListener("click", () => this.balance());
    root.querySelector("#clean-now").addEventListener("click", () => this.cleanNow(force.checked));
    root.querySelector("#member-add").addEventListener("submit", (event) => {
      event.preventDefault();
      this.add(new FormData(event.target));
    });
  }

  say(text) {
    this.status.textContent = text;
  }

  /** Run `work` once the user confirms `question`; say its outcome, or its refusal. */
  async confirmed(question, failure, work) {
    if (!(await confirmAction(question))) return;
    try {
      this.say(await work());
    } catch (error) {
      this.say(`${failure}: ${error.message}`);
    }
  }

  onNode({ action, shard, node, leader }) {
    const path = `${API}/shards/${shard}/members/${node}`;
    if (action === "transfer") {
      const question = `Hand shard ${shard}'s leadership from node ${leader} to node ${node}?`;
      return this.confirmed(question, `shard ${shard}: the transfer to node ${node} failed`, async () => {
        const done = await postJson(`${API}/shards/${shard}/transfer-leader`, { to: Number(node) });
        return `shard ${shard}: node ${done.leader} leads`;
      });
    }
    if (action === "promote") {
      return this.confirmed(`Make learner ${node} a voter of shard ${shard}?`, `shard ${shard}: promoting node ${node} failed`, async () => {
        await postJson(`${path}/promote`, {});
        return `shard ${shard}: node ${node} is a voter`;
      });
    }
    if (action === "remove") {
      return this.confirmed(`Remove node ${node} from shard ${shard}?`, `shard ${shard}: removing node ${node} failed`, async () => {
        await sendJson("DELETE", path);
        return `shard ${shard}: node ${node} removed`;
      });
    }
    return null;
  }

  async balance() {
    let plan;
    try {
      plan = await postJson(`${API}/shards/balance`, { dry_run: true });
    } catch (error) {
      return this.say(`the balance failed: ${error.message}`);
    }
    if (plan.moves.length === 0) return this.say("balanced: no move needed");
    const question = `Move ${plan.moves.length} leader(s): ${plan.moves.map(moveText).join("; ")}?`;
    return this.confirmed(question, "the balance failed", async () => {
      const done = await postJson(`${API}/shards/balance`, {});
      const failed = done.failed.map((m) => `${moveText(m)} failed: ${m.error}`);
      return [`${done.moves.length} leader(s) moved`, ...failed].join("; ");
    });
  }

  cleanNow(force) {
    const question = `Run commit-log retention now on every node${force ? ", whatever the segments' age" : ""}?`;
    return this.confirmed(question, "clean-now failed", async () => {
      const done = await postJson(`${API}/cluster/clean-now`, { force });
      const deleted = done.nodes.reduce((sum, n) => sum + (n.deleted_segments ?? 0), 0);
      const failed = done.nodes.filter((n) => n.error !== undefined).map((n) => `${n.server}: ${n.error}`);
      return [`clean-now: ${deleted} segment(s) deleted`, ...failed].join("; ");
    });
  }

  add(form) {
    const shard = form.get("shard");
    const doc = { id: Number(form.get("id")), raft: form.get("raft"), client: form.get("client"), learner: form.get("learner") === "on" };
    const role = doc.learner ? "a learner" : "a voter";
    const question = `Add node ${doc.id} (Raft ${doc.raft}, client ${doc.client}) to shard ${shard} as ${role}?`;
    return this.confirmed(question, `shard ${shard}: adding node ${doc.id} failed`, async () => {
      await postJson(`${API}/shards/${shard}/members`, doc);
      return `shard ${shard}: node ${doc.id} added as ${role}`;
    });
  }
}
