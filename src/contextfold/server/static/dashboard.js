// The request grid (live over SSE), the turn inspector and the session stats.
"use strict";

(() => {
  const { api, h, fmt, ms, chips, budgetTable, withToken } = CF;
  const records = new Map(); // id -> record
  const rows = new Map(); // id -> <tr>
  const sessions = new Set();
  let selected = null;
  let filter = "";
  let statsTimer = null;
  let ingestedTimer = null;
  let captureEnabled = false;

  const tbody = document.querySelector("#grid tbody");
  const inspector = document.getElementById("inspector");
  const live = document.getElementById("live");
  const sessionFilter = document.getElementById("session-filter");

  document.getElementById("export").href = withToken("/dashboard/api/export");
  sessionFilter.addEventListener("change", () => {
    filter = sessionFilter.value;
    for (const [id, tr] of rows) tr.hidden = Boolean(filter) && records.get(id).session_id !== filter;
    updateCount();
  });

  function time(iso) {
    const d = new Date(iso);
    return d.toLocaleTimeString("en-GB", { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
  }

  function flags(r) {
    const out = [];
    if (r.broad) out.push(h("span", { class: "flag broad" }, "broad"));
    if (r.temporal) out.push(h("span", { class: "flag temporal" }, "temporal"));
    if (r.error) out.push(h("span", { class: "flag error", title: r.error }, "fail-open"));
    return out.length ? out : h("span", { class: "muted" }, "–");
  }

  // A context call is never tagged afterwards: its row is complete when it appears.
  function responseCell(r, pending) {
    if (r.kind === "context") return h("span", { class: "muted" }, "–");
    return pending ? h("span", { class: "pending" }, "pending…") : chips(r.response_tags, "tag resp");
  }

  function cells(r) {
    const pending = r.response_tags === null || r.response_tags === undefined;
    return [
      h("td", { class: "mono" }, time(r.created_at)),
      h("td", { class: "num" }, String(r.turn)),
      h("td", { class: "mono", title: r.session_id }, r.session_id.slice(0, 12)),
      h("td", { class: "request" }, h("span", { class: "fmt" }, r.format), " ", r.model || r.path || r.kind),
      h("td", { class: "inbound" }, chips(r.inbound_tags)),
      h("td", { class: "response" }, responseCell(r, pending)),
      h("td", { class: "num" }, `${fmt(r.tokens_in)} → ${fmt(r.tokens_forwarded)}`),
      h("td", { class: "num" }, fmt(r.memory_tokens)),
      h("td", { class: "num" }, ms(r.overhead_ms)),
      h("td", { class: "num" }, ms(r.upstream_ms)),
      h("td", {}, flags(r)),
      h("td", { class: "num" }, String(r.dropped_turns)),
      h("td", { class: r.status && r.status >= 400 ? "bad" : null }, r.status === null ? "…" : String(r.status)),
    ];
  }

  function upsert(r, fresh) {
    if (r.kind === "compaction") return; // counted in the stats tiles, not a request row
    if (r.extra && r.extra.ingested) scheduleIngested();
    const known = records.get(r.id);
    records.set(r.id, r);
    if (!sessions.has(r.session_id)) {
      sessions.add(r.session_id);
      sessionFilter.append(h("option", { value: r.session_id }, r.session_id));
    }
    let tr = rows.get(r.id);
    if (tr) {
      tr.replaceChildren(...cells(r));
    } else {
      tr = h("tr", { dataset: { id: r.id }, tabindex: "0", onclick: () => select(r.id), onkeydown: (e) => e.key === "Enter" && select(r.id) }, cells(r));
      rows.set(r.id, tr);
      // Newest on top: place before the first row that is older.
      let before = null;
      for (const other of tbody.children) {
        if (Date.parse(records.get(other.dataset.id).created_at) < Date.parse(r.created_at)) { before = other; break; }
      }
      tbody.insertBefore(tr, before);
    }
    tr.hidden = Boolean(filter) && r.session_id !== filter;
    tr.classList.toggle("selected", r.id === selected);
    tr.classList.toggle("complete", r.response_tags !== null && r.response_tags !== undefined);
    if (fresh) {
      tr.classList.remove("flash");
      void tr.offsetWidth; // restart the animation
      tr.classList.add("flash");
    }
    if (r.id === selected && known) renderInspector(r);
    updateCount();
  }

  function updateCount() {
    const shown = [...rows.values()].filter((tr) => !tr.hidden).length;
    document.getElementById("count").textContent = `${shown} request${shown === 1 ? "" : "s"}`;
    document.getElementById("empty").hidden = records.size > 0;
  }

  // --- stats -------------------------------------------------------------------------------
  function tile(label, value, id) {
    return h("div", { class: "tile", dataset: { stat: id } }, h("span", { class: "value" }, value), h("span", { class: "label" }, label));
  }

  function uptime(seconds) {
    const s = Math.floor(seconds);
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }

  // Requests forwarded without memory because of their route; the routes in the tooltip.
  function passedTile(passed) {
    const t = tile("passed through, no memory", fmt(passed.total), "passed");
    t.title = Object.entries(passed.routes).map(([route, n]) => `${route}: ${n}`).join("\n");
    return t;
  }

  async function refreshStats() {
    try {
      const s = await api("/dashboard/api/stats");
      document.getElementById("stats").replaceChildren(
        tile("requests", fmt(s.requests), "requests"),
        tile("sessions", fmt(s.sessions), "sessions"),
        tile("tagged replies", fmt(s.completed), "completed"),
        tile("avg overhead", ms(s.avg_overhead_ms), "overhead"),
        tile("avg upstream", ms(s.avg_upstream_ms), "upstream"),
        tile("tokens in → fwd", `${fmt(s.tokens_in)} → ${fmt(s.tokens_forwarded)}`, "tokens"),
        tile("dropped turns", fmt(s.dropped_turns), "dropped"),
        tile("errors", fmt(s.errors), "errors"),
        tile("compactions", fmt(s.compactions), "compactions"),
        tile("tokens freed", fmt(s.tokens_freed), "freed"),
        tile("compression", s.compression_ratio === null ? "–" : `${s.compression_ratio.toFixed(2)}×`, "ratio"),
        passedTile(s.passed_through),
        tile("uptime", uptime(s.uptime_s), "uptime"),
      );
    } catch (err) {
      document.getElementById("stats").replaceChildren(h("p", { class: "error" }, String(err.message)));
    }
  }

  function scheduleStats() {
    if (statsTimer) return;
    statsTimer = setTimeout(() => { statsTimer = null; refreshStats(); }, 250);
  }

  // --- ingested history --------------------------------------------------------------------
  function scheduleIngested() {
    if (ingestedTimer) return;
    ingestedTimer = setTimeout(() => { ingestedTimer = null; refreshIngested(); }, 250);
  }

  async function refreshIngested() {
    const panel = document.getElementById("ingested");
    try {
      const conversations = await api("/dashboard/api/ingested");
      const rowsOut = [];
      for (const c of conversations) {
        for (const t of c.turns) {
          rowsOut.push(h("tr", { dataset: { session: c.session_id } },
            h("td", { class: "mono", title: c.session_id }, c.session_id.slice(0, 12)),
            h("td", { class: "num" }, String(t.turn)),
            h("td", { class: "tags" }, t.tags.length ? chips(t.tags) : h("span", { class: "pending" }, "tagging…")),
            h("td", { class: "preview" }, t.user),
            h("td", { class: "preview" }, t.assistant)));
        }
      }
      panel.hidden = rowsOut.length === 0;
      document.querySelector("#ingested-grid tbody").replaceChildren(...rowsOut);
      const turns = conversations.reduce((n, c) => n + c.turns.length, 0);
      document.getElementById("ingested-count").textContent =
        `${turns} turn${turns === 1 ? "" : "s"} from ${conversations.length} conversation${conversations.length === 1 ? "" : "s"}`;
      if (conversations.some((c) => !c.tagged)) setTimeout(scheduleIngested, 1000);
    } catch (err) {
      panel.hidden = false;
      document.querySelector("#ingested-grid tbody").replaceChildren(h("tr", {}, h("td", { colspan: "5", class: "error" }, String(err.message))));
    }
  }

  async function loadCaptureSetting() {
    try {
      captureEnabled = (await api("/dashboard/api/captures")).enabled;
    } catch (_) {
      captureEnabled = false;
    }
  }

  // --- inspector ---------------------------------------------------------------------------
  function select(id) {
    selected = id;
    for (const [rid, tr] of rows) tr.classList.toggle("selected", rid === id);
    renderInspector(records.get(id));
  }

  function section(title, ...body) {
    return h("section", { class: "panel" }, h("h3", {}, title), ...body);
  }

  function renderInspector(r) {
    const pending = r.response_tags === null || r.response_tags === undefined;
    const meta = [
      ["session", r.session_id], ["format", r.format], ["path", r.path || "–"], ["model", r.model || "–"],
      ["stream", r.stream ? "yes" : "no"], ["status", r.status === null ? "…" : r.status],
      ["tokens in", fmt(r.tokens_in)], ["tokens forwarded", fmt(r.tokens_forwarded)],
      ["memory tokens", fmt(r.memory_tokens)], ["overhead", ms(r.overhead_ms)], ["upstream", ms(r.upstream_ms)],
    ];
    const messages = r.messages.length
      ? h("ol", { class: "messages" }, r.messages.map((m) => h("li", { class: "message role-" + m.role },
          h("div", { class: "message-head" }, h("span", { class: "role" }, m.role), chips(m.blocks, "block")),
          h("pre", { class: "text" }, m.text))))
      : h("p", { class: "muted" }, "no messages recorded");
    const budget = r.budget.length
      ? budgetTable(r.budget.map((b) => ({ section: b.section, budget: b.budget, used: b.used, truncated: b.truncated, detail: `${b.items} item${b.items === 1 ? "" : "s"}` })))
      : h("p", { class: "muted" }, "no budget table recorded");
    inspector.replaceChildren(...[
      h("div", { class: "inspector-head" },
        h("h2", {}, `Turn ${r.turn}`, h("span", { class: "muted mono" }, " · " + r.id)),
        h("button", { class: "close", type: "button", title: "Close", onclick: () => { inspector.hidden = true; selected = null; for (const tr of rows.values()) tr.classList.remove("selected"); } }, "×")),
      h("dl", { class: "meta" }, meta.map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))])),
      section("Tags",
        h("div", { class: "tags-compare" },
          h("div", {}, h("h4", {}, "inbound"), chips(r.inbound_tags)),
          h("div", { class: "response-tags" }, h("h4", {}, "response"), responseCell(r, pending))),
        r.broad || r.temporal || r.error ? h("p", {}, flags(r)) : null),
      r.error ? section("Engine error (forwarded unmodified)", h("pre", { class: "error" }, r.error)) : null,
      section(`Messages (${r.messages.length})`, messages),
      section("Assembled context", r.context ? h("pre", { class: "context" }, r.context) : h("p", { class: "muted" }, "nothing injected")),
      section("Budget", budget),
      r.kind === "proxy"
        ? h("section", { class: "panel", id: "capture-panel" }, h("h3", {}, "Sent upstream (raw body)"),
            h("p", { class: "muted" }, captureEnabled ? "loading…" : "not captured: start the server with --capture-bodies (dashboard.capture) to keep the last bodies sent upstream"))
        : null,
      r.dropped_turns || r.dropped.length
        ? section(`Dropped turns (${r.dropped_turns})`, h("ul", { class: "dropped" }, r.dropped.map((d) => h("li", {}, d))))
        : null,
      h("section", { class: "panel", id: "session-panel" }, h("h3", {}, "Session"), h("p", { class: "muted" }, "loading…")),
    ].filter(Boolean));
    inspector.hidden = false;
    loadSession(r.session_id);
    if (r.kind === "proxy" && captureEnabled) loadCapture(r.id);
  }

  async function loadCapture(id) {
    const panel = document.getElementById("capture-panel");
    const title = h("h3", {}, "Sent upstream (raw body)");
    try {
      const c = await api("/dashboard/api/captures/" + encodeURIComponent(id));
      const text = JSON.stringify(c.body, null, 2);
      const download = h("a", { class: "button", download: `contextfold-request-${id}.json`,
        href: URL.createObjectURL(new Blob([text], { type: "application/json" })) }, "Download JSON");
      if (panel.isConnected) panel.replaceChildren(title, h("p", { class: "muted" }, `${fmt(c.bytes)} bytes · ${c.path} · credentials redacted `, download), h("pre", { class: "capture" }, text));
    } catch (err) {
      if (panel.isConnected) panel.replaceChildren(title, h("p", { class: "muted" }, String(err.message)));
    }
  }

  async function loadSession(sessionId) {
    const panel = document.getElementById("session-panel");
    try {
      const s = await api("/dashboard/api/sessions/" + encodeURIComponent(sessionId));
      const m = s.memory;
      const body = m
        ? [
            h("dl", { class: "meta" },
              [["turns", fmt(m.turns)], ["live turns", fmt(m.live_turns)],
               ["live tokens", `${fmt(m.live_tokens)} / ${fmt(m.context_window)}`], ["level", m.level],
               ["compaction watermark", fmt(m.compaction_watermark)], ["segments", fmt(m.segments)],
               ["tag summaries", `${fmt(m.tag_summaries)} (${fmt(m.stale_tag_summaries)} stale)`],
               ["requests here", fmt(s.requests)]].map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))])),
            h("h4", {}, "tags"),
            Object.keys(m.tags).length
              ? h("span", { class: "chips" }, Object.entries(m.tags).map(([t, n]) => h("span", { class: "tag" }, `${t} ${n}`)))
              : h("span", { class: "muted" }, "none yet"),
            Object.keys(m.working_set).length
              ? [h("h4", {}, "working set"), h("span", { class: "chips" }, Object.entries(m.working_set).map(([t, d]) => h("span", { class: "tag" }, `${t}: ${d}`)))]
              : null,
          ]
        : [h("p", { class: "muted" }, `not in memory yet · ${fmt(s.requests)} request(s) seen`)];
      if (panel.isConnected) panel.replaceChildren(h("h3", {}, "Session"), ...body.flat(Infinity).filter(Boolean));
    } catch (err) {
      if (panel.isConnected) panel.replaceChildren(h("h3", {}, "Session"), h("p", { class: "error" }, String(err.message)));
    }
  }

  // --- live updates ------------------------------------------------------------------------
  function connect() {
    const source = new EventSource(withToken("/dashboard/api/events"));
    source.addEventListener("open", () => { live.dataset.state = "live"; live.textContent = "● live"; });
    source.addEventListener("snapshot", (e) => {
      for (const r of JSON.parse(e.data).reverse()) upsert(r, false);
      scheduleStats();
    });
    source.addEventListener("record", (e) => {
      upsert(JSON.parse(e.data), true);
      scheduleStats();
    });
    source.addEventListener("error", () => {
      live.dataset.state = "down";
      live.textContent = source.readyState === EventSource.CLOSED ? "○ disconnected (reload)" : "○ reconnecting…";
    });
  }

  updateCount();
  loadCaptureSetting();
  refreshIngested();
  refreshStats();
  setInterval(refreshStats, 5000);
  connect();
})();
