// The Ask page: a chat over the ingested corpus under a budget preset. Every question is a turn
// of the page's conversation (chat_id): the history fills the goal section and the server's
// memory recalls older turns into the memory section. Shows the answer (or that no LLM is
// configured), the conversation, the per-section budget table, the sources and the context.
"use strict";

(() => {
  const { api, h, fmt, budgetTable } = CF;
  const form = document.getElementById("ask-form");
  const question = document.getElementById("question");
  const budget = document.getElementById("budget");
  const maxTokens = document.getElementById("max-tokens");
  const mode = document.getElementById("mode");
  const k = document.getElementById("k");
  const button = document.getElementById("ask");
  const error = document.getElementById("error");
  const results = document.getElementById("results");
  const transcript = document.getElementById("transcript");
  const chatPanel = document.getElementById("chat-panel");
  const newChatId = () => "c" + Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
  let chatId = newChatId();
  document.getElementById("new-chat").addEventListener("click", () => {
    chatId = newChatId();
    transcript.replaceChildren();
    document.getElementById("chat-memory").replaceChildren();
    chatPanel.hidden = true;
    results.hidden = true;
  });

  function syncWindow() {
    // fixed5 has five fixed sections: its size is not adjustable.
    maxTokens.disabled = budget.value === "fixed5";
    if (maxTokens.disabled) maxTokens.value = "";
  }
  budget.addEventListener("change", syncWindow);

  async function init() {
    try {
      const info = await api("/dashboard/api/ask");
      budget.replaceChildren(...info.budgets.map((b) => h("option", { value: b }, b)));
      mode.replaceChildren(...info.modes.map((m) => h("option", { value: m }, m)));
      syncWindow();
      document.getElementById("examples").replaceChildren(
        h("span", { class: "muted" }, "Examples:"),
        ...info.examples.map((q) => h("button", { type: "button", class: "example", onclick: () => { question.value = q; submit(); } }, q)),
      );
      document.getElementById("corpus").textContent = info.corpus_exists
        ? `Corpus: ${info.corpus}`
        : `No corpus at ${info.corpus} yet: run \`contextfold ingest PATH...\` first.`;
      const status = document.getElementById("llm-status");
      status.dataset.state = info.llm.configured ? "live" : "down";
      status.textContent = info.llm.configured ? `LLM: ${info.llm.provider} · ${info.llm.model}` : "no LLM configured";
    } catch (err) {
      showError(err);
    }
  }

  function showError(err) {
    error.textContent = String(err.message || err);
    error.hidden = false;
  }

  async function submit() {
    if (!question.value.trim()) { question.focus(); return; }
    const body = { question: question.value.trim(), budget: budget.value, mode: mode.value, k: Number(k.value || 8), chat_id: chatId };
    if (!maxTokens.disabled && maxTokens.value) body.max_tokens = Number(maxTokens.value);
    error.hidden = true;
    button.disabled = true;
    button.textContent = "Asking…";
    document.body.classList.add("busy");
    try {
      render(await api("/dashboard/api/ask", { method: "POST", body }));
    } catch (err) {
      showError(err);
    } finally {
      button.disabled = false;
      button.textContent = "Ask";
      document.body.classList.remove("busy");
    }
  }

  function render(r) {
    const answer = document.getElementById("answer");
    if (r.answer !== null && r.answer !== undefined) {
      answer.replaceChildren(h("p", { class: "answer-text" }, r.answer), h("p", { class: "muted" }, `${r.llm.provider} · ${r.llm.model}`));
    } else {
      answer.replaceChildren(h("p", { class: "notice" }, r.llm.message));
    }
    document.getElementById("budget-table").replaceChildren(budgetTable(r.budget_table.map((row) => ({
      section: row.section,
      budget: row.budget,
      used: row.used,
      status_text: row.status_text,
      truncated: row.status !== "ok",
      description: row.description,
      detail: `${row.kept} kept · ${row.truncated} cut · ${row.dropped} dropped`,
    }))));
    const warning = document.getElementById("truncation-warning");
    warning.hidden = r.truncated_sections.length === 0;
    warning.textContent = `⚠ ${r.truncated_sections.join(", ")} did not fit ${r.truncated_sections.length === 1 ? "its budget" : "their budgets"}: lower-ranked items were cut or dropped (see Sources).`;
    const t = r.totals;
    document.getElementById("totals").textContent =
      `total ${fmt(t.used)} / ${fmt(t.available)} tokens (${fmt(t.max_tokens)} max, ${fmt(t.reserve_output)} reserved for the response) · ` +
      `${t.format} format · ${t.counter}${t.estimated ? " (estimated)" : ""} · ${t.kept} kept, ${t.truncated} truncated, ${t.dropped} dropped of ${t.candidates} · ` +
      `${r.elapsed_ms} ms`;
    document.querySelector("#sources tbody").replaceChildren(...r.sources.map((s) => h("tr", { class: s.action === "kept" ? null : "truncated", title: s.text },
      h("td", { class: "mono" }, s.label),
      h("td", {}, s.file),
      h("td", { class: "num" }, s.score.toFixed(4)),
      h("td", {}, s.match),
      h("td", { class: s.action === "kept" ? null : "warn" }, s.status))));
    if (!r.sources.length) document.querySelector("#sources tbody").replaceChildren(h("tr", {}, h("td", { colspan: "5", class: "muted" }, "no matching chunks")));
    document.getElementById("context").textContent = r.context;
    results.hidden = false;
    if (r.chat) renderChat(r);
  }

  function renderChat(r) {
    const c = r.chat;
    transcript.append(h("li", { class: "turn", "data-turn": String(c.turn) },
      h("p", { class: "you" }, h("strong", {}, `Turn ${c.turn} · you: `), r.question),
      h("p", { class: c.answer ? "assistant" : "muted" }, c.answer ?? "(no answer: no LLM configured)")));
    const recalled = c.memory.length
      ? [h("strong", {}, "Memory recalled this turn:"), h("ul", {}, ...c.memory.map((m) => h("li", {}, m)))]
      : [h("span", {}, "Memory recalled this turn: nothing")];
    const tools = c.tool_outputs.length ? [h("strong", {}, "Tool outputs:"), ...c.tool_outputs.map((t) => h("pre", { class: "context" }, t))] : [];
    document.getElementById("chat-memory").replaceChildren(
      h("p", {}, `History in the goal section: ${c.history.length} message${c.history.length === 1 ? "" : "s"}`),
      ...recalled, ...tools);
    chatPanel.hidden = false;
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); submit(); });
  question.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); submit(); }
  });
  init();
})();
