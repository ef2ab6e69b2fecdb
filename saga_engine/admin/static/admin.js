// Operator actions: ask for a reason (and a step, a result), confirm, POST JSON, reload.
"use strict";
document.addEventListener("submit", async (event) => {
  const form = event.target.closest("form.action");
  if (!form) return;
  event.preventDefault();
  const action = form.dataset.action;
  const asks = (form.dataset.asks || "").split(" ").filter(Boolean);
  const body = {};
  if (asks.includes("step")) {
    const step = prompt(`Step to ${action}:`, form.dataset.step || "");
    if (!step) return;
    body.step = step;
  }
  if (asks.includes("result")) {
    const text = prompt("The step's result, as a JSON object:", "{}");
    if (text === null) return;
    try { body.result = JSON.parse(text); } catch (e) { return showError(`Not JSON: ${e.message}`); }
  }
  const reason = prompt(`Why ${action} this saga? (recorded in its history)`, "");
  if (!reason || !reason.trim()) return;
  body.reason = reason;
  if (!confirm(`${action} saga ${document.getElementById("saga-id").textContent}?`)) return;
  const response = await fetch(form.action, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(body),
  });
  if (response.ok) { location.reload(); return; }
  let detail = response.statusText;
  try { const data = await response.json(); detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail); } catch (e) { /* not JSON */ }
  showError(`${action} refused (${response.status}): ${detail}`);
});

function showError(text) {
  const box = document.getElementById("action-error");
  box.textContent = text;
  box.hidden = false;
}
