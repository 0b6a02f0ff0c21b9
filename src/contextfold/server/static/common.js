// Shared by the dashboard and the Ask page: the token, API calls, DOM building and the
// per-section budget table. No framework, no build step; every text goes in as textContent.
"use strict";

const CF = (() => {
  const KEY = "contextfold-dashboard-token";
  const params = new URLSearchParams(location.search);
  let token = params.get("token");
  if (token) {
    // Keep the token for this tab's API and SSE calls, and take it out of the address bar.
    sessionStorage.setItem(KEY, token);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  } else {
    token = sessionStorage.getItem(KEY);
  }

  /** `url` with `?token=` added when a token is in use (links, downloads, EventSource). */
  function withToken(url) {
    if (!token) return url;
    return url + (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
  }

  /** fetch() a dashboard API path as JSON; a non-2xx answer throws its error message. */
  async function api(path, options = {}) {
    const headers = Object.assign({ Accept: "application/json" }, options.headers || {});
    if (token) headers.Authorization = "Bearer " + token;
    if (options.body !== undefined && typeof options.body !== "string") {
      headers["Content-Type"] = "application/json";
      options = Object.assign({}, options, { body: JSON.stringify(options.body) });
    }
    const response = await fetch(path, Object.assign({}, options, { headers }));
    const text = await response.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch (_) {
      body = text;
    }
    if (!response.ok) {
      // The server's one error shape: {"error": {"type", "message", "details"?}}.
      const error = body && body.error ? body.error : null;
      let detail = error ? error.message : body;
      if (error && Array.isArray(error.details)) {
        detail += " (" + error.details.map((d) => (d.loc || []).slice(1).join(".") + ": " + d.msg).join("; ") + ")";
      }
      throw new Error(`${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    }
    return body;
  }

  /** h("td", {class: "x"}, "text", child) — an element with attributes and children. */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") el.className = value;
      else if (name === "dataset") Object.assign(el.dataset, value);
      else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else el.setAttribute(name, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));
  const ms = (n) => (n === null || n === undefined ? "–" : `${Number(n).toFixed(1)} ms`);

  function chips(tags, cls = "tag") {
    if (!tags || !tags.length) return h("span", { class: "muted" }, "none");
    return h("span", { class: "chips" }, tags.map((t) => h("span", { class: cls }, t)));
  }

  /**
   * The per-section budget table. Rows: {section, budget, used, truncated, status_text,
   * description, detail}; a truncated row is marked ⚠ TRUNCATED and gets class "truncated".
   */
  function budgetTable(rows) {
    const described = rows.some((row) => row.description);
    const body = rows.map((row) => {
      const pct = row.budget ? Math.min(100, (100 * row.used) / row.budget) : 0;
      const bar = h("span", { class: "bar" }, h("span", { class: "fill" }));
      bar.firstChild.style.width = pct.toFixed(1) + "%";
      const warn = row.truncated || (row.status_text || "").startsWith("⚠");
      const status = row.status_text || (row.truncated ? "⚠ TRUNCATED" : `${pct.toFixed(0)}%`);
      return h(
        "tr",
        { class: warn ? "truncated" : null, dataset: { section: row.section } },
        h("th", { scope: "row" }, row.section),
        h("td", { class: "num" }, fmt(row.budget)),
        h("td", { class: "num" }, fmt(row.used)),
        h("td", { class: "status" }, bar, h("span", { class: warn ? "warn" : null }, status)),
        h("td", { class: "detail" }, row.detail || ""),
        described ? h("td", { class: "muted" }, row.description || "") : null,
      );
    });
    return h(
      "table",
      { class: "budget" },
      h("thead", {}, h("tr", {}, ["Section", "Budget", "Used", "Status", "Items", described ? "Source" : null].filter(Boolean).map((c) => h("th", {}, c)))),
      h("tbody", {}, body),
    );
  }

  // Navigation links keep the token.
  document.addEventListener("DOMContentLoaded", () => {
    for (const a of document.querySelectorAll("a[data-nav]")) a.href = withToken(a.getAttribute("href"));
  });

  return { api, h, fmt, ms, chips, budgetTable, withToken, hasToken: () => Boolean(token) };
})();
