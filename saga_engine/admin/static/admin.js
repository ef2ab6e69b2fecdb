// Operator actions: ask for a reason (and a step, a result), confirm, POST JSON, reload.
// The list page refreshes itself every 5 s while its checkbox is on (remembered).
"use strict";
document.addEventListener("submit", async (event) => {
  const form = event.target.closest("form.action");
  if (!form) return;
  event.preventDefault();
  const action = form.dataset.action;
  const asks = (form.dataset.asks || "").split(" ").filter(Boolean);
  const body = {};
  if (asks.includes("signal")) {
    body.name = form.querySelector("[name=name]").value;
    try { body.payload = JSON.parse(form.querySelector("[name=payload]").value || "{}"); } catch (e) { return showError(`The payload is not JSON: ${e.message}`); }
    if (body.payload === null || typeof body.payload !== "object" || Array.isArray(body.payload)) return showError("The payload must be a JSON object.");
  }
  let url = form.action;
  if (asks.includes("update")) {
    const name = form.querySelector("[name=name]").value;
    url = form.action + encodeURIComponent(name);
    try { body.input = JSON.parse(form.querySelector("[name=input]").value || "{}"); } catch (e) { return showError(`The input is not JSON: ${e.message}`); }
    if (body.input === null || typeof body.input !== "object" || Array.isArray(body.input)) return showError("The input must be a JSON object.");
  }
  if (asks.includes("step")) {
    const steps = (form.dataset.steps || "").split(" ").filter(Boolean);
    const step = steps.length === 1 ? steps[0] : prompt(`Step to ${action} (one of: ${steps.join(", ")}):`, steps[0] || "");
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
  const response = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(body),
  });
  if (response.ok && asks.includes("update")) {
    // The update's answer stays in view until the next reload.
    const answer = await response.json();
    const shown = document.getElementById("update-result");
    shown.textContent = answer.error ? `update failed: ${answer.error.message}` : `result: ${JSON.stringify(answer.result, null, 1)}`;
    shown.hidden = false;
    return;
  }
  if (response.ok) { location.reload(); return; }
  let detail = response.statusText;
  try { const data = await response.json(); detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail); } catch (e) { /* not JSON */ }
  showError(`${action} refused (${response.status}): ${detail}`);
});

// Schedule buttons: confirm, then the admin API's own route (its auth, its audit).
document.addEventListener("submit", async (event) => {
  const form = event.target.closest("form.schedule-action");
  if (!form) return;
  event.preventDefault();
  if (!confirm(`${form.dataset.what}?`)) return;
  const response = await fetch(form.dataset.api, {
    method: form.dataset.method,
    credentials: "same-origin",
    headers: { Accept: "application/json" },
  });
  if (response.ok) { location.reload(); return; }
  let detail = response.statusText;
  try { const data = await response.json(); detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail); } catch (e) { /* not JSON */ }
  showError(`${form.dataset.what}: refused (${response.status}): ${detail}`);
});

function showError(text) {
  const box = document.getElementById("action-error");
  box.textContent = text;
  box.hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  // The signal form: picking a signal fills in an example payload of its model.
  const name = document.getElementById("signal-name");
  if (name) name.addEventListener("change", () => {
    document.getElementById("signal-payload").value = name.selectedOptions[0].dataset.example || "{}";
  });
  const update = document.getElementById("update-name");
  if (update) update.addEventListener("change", () => {
    document.getElementById("update-input").value = update.selectedOptions[0].dataset.example || "{}";
  });
  followProgress(document.getElementById("progress"));
  // Tick labels sit at their percent of the axis (set here: the CSP forbids inline styles).
  for (const tick of document.querySelectorAll(".tick[data-x]")) tick.style.left = `${tick.dataset.x}%`;
  const auto = document.getElementById("auto-refresh");
  if (auto) {
    auto.checked = localStorage.getItem("saga-auto-refresh") === "on";
    let timer = null;
    const arm = () => { clearInterval(timer); timer = auto.checked ? setInterval(() => location.reload(), 5000) : null; };
    auto.addEventListener("change", () => { localStorage.setItem("saga-auto-refresh", auto.checked ? "on" : "off"); arm(); });
    arm();
  }
});

// The saga's progress items (ctx.emit), live: the server-sent events of its stream. The
// browser reconnects by itself with Last-Event-ID (no gap, no duplicate); "end" closes.
function followProgress(list) {
  if (!list || !window.EventSource) return;
  const state = document.getElementById("progress-state");
  const source = new EventSource(list.dataset.stream);
  const count = () => `${list.children.length} item${list.children.length === 1 ? "" : "s"}`;
  source.onmessage = (event) => {
    const item = JSON.parse(event.data);
    if (list.querySelector(`li[data-number="${item.number}"]`)) return;
    const li = document.createElement("li");
    li.value = item.number;
    li.dataset.number = item.number;
    li.append(...progressLine(item.topic, item.payload, item.at));
    list.append(li);
    state.textContent = `${count()}, live`;
  };
  followSteps(source, document.getElementById("step-progress"));
  source.addEventListener("end", (event) => {
    source.close();
    const end = JSON.parse(event.data);
    state.textContent = list.children.length
      ? `${count()}; the saga ended ${end.status}`
      : `No progress items; the saga ended ${end.status}.`;
  });
}

// Participants' reports on the steps running now (tx.progress), from the same stream: the
// latest one per command, replaced as the next arrives, gone when the command ends.
function followSteps(source, list) {
  if (!list) return;
  const rowOf = (id) => [...list.children].find((li) => li.dataset.command === id);
  source.addEventListener("step_progress", (event) => {
    const report = JSON.parse(event.data);
    let li = rowOf(report.command_id);
    if (!li) {
      li = document.createElement("li");
      li.dataset.command = report.command_id;
      list.append(li);
    }
    const label = `${report.step} (attempt ${report.attempt}) #${report.seq}`;
    li.replaceChildren(...progressLine(label, report.body, report.at));
    list.hidden = false;
  });
  const clear = (id) => {
    const li = rowOf(id);
    if (li) li.remove();
    list.hidden = list.children.length === 0;
  };
  source.addEventListener("step_ended", (event) => clear(JSON.parse(event.data).command_id));
  source.addEventListener("end", () => { list.replaceChildren(); list.hidden = true; });
}

// One line of the progress section: its label, its JSON value, when.
function progressLine(label, value, at) {
  const name = document.createElement("span");
  name.className = "topic";
  name.textContent = label;
  const json = document.createElement("code");
  json.textContent = JSON.stringify(value);
  const when = document.createElement("span");
  when.className = "when";
  when.textContent = at;
  return [name, " ", json, when];
}
