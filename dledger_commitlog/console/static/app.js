// The console's single page: four views switched by the URL's #fragment, fed live
// by the server-sent events of /api/v1/events (a snapshot of the cluster and its
// topics each second; the browser reconnects a cut stream by itself); the groups
// view polls the group views while it is shown.

import { ClusterAdmin } from "./cluster_admin.js";
import { ClusterView } from "./cluster_view.js";
import { TopicsView } from "./topics.js";
import { SearchView } from "./search.js";
import { GroupsView } from "./groups.js";
import { BacklogView } from "./backlog.js";

const PAGES = ["cluster", "topics", "groups", "search"];
const live = document.getElementById("live");
const cluster = new ClusterView(document.getElementById("page-cluster"));
new ClusterAdmin(document.getElementById("page-cluster"));
const topics = new TopicsView(document.getElementById("page-topics"));
new SearchView(document.getElementById("page-search"));
const groups = new GroupsView(document.getElementById("page-groups"));
const backlog = new BacklogView(document.getElementById("backlog"));

function show() {
  const wanted = location.hash.slice(1).split("?")[0];
  const page = PAGES.includes(wanted) ? wanted : "cluster";
  for (const name of PAGES) {
    document.getElementById(`page-${name}`).hidden = name !== page;
    const link = document.getElementById(`nav-${name}`);
    if (name === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (page === "topics") topics.redraw();
  groups.show(page === "groups");
  backlog.show(page === "topics");
}

function connect() {
  const events = new EventSource("/api/v1/events");
  events.addEventListener("open", () => {
    live.className = "live on";
    live.textContent = "live";
  });
  events.addEventListener("error", () => {
    live.className = "live off";
    live.textContent = "reconnecting…";
  });
  events.addEventListener("snapshot", (event) => {
    const doc = JSON.parse(event.data);
    live.className = "live on";
    live.textContent = `live · ${new Date(doc.time_ms).toISOString().slice(11, 19)} UTC`;
    cluster.update(doc);
    topics.update(doc);
  });
}

window.addEventListener("hashchange", show);
show();
connect();
