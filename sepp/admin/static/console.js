// The sepp web console's one script (sepp/admin/console.py serves the pages).
// Live dashboard over /admin/api/v1/events, the window picker, and every
// mutation through the JSON admin API with the session cookie. No build step,
// no external fetches (the page's Content-Security-Policy forbids them).

const API = "/admin/api/v1";
const FIELDS = ["ready", "scheduled", "inflight", "dead_letter"];
const RATES = ["enqueued_per_s", "acked_per_s", "dead_lettered_per_s"];

function flash(text, isError) {
  const el = document.getElementById("flash");
  if (!el) return;
  el.textContent = text;
  el.className = isError ? "error" : "ok";
}

async function api(method, path, body) {
  const response = await fetch(API + path, {
    method,
    credentials: "same-origin",
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try {
    data = await response.json();
  } catch (_err) {
    data = null;
  }
  if (!response.ok) {
    const message = data && data.error ? data.error.message : response.statusText;
    throw new Error(message);
  }
  return data;
}

// -- confirmation dialog -------------------------------------------------------------------

function confirmDialog(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-reason").value = "";
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        const reason = document.getElementById("confirm-reason").value;
        resolve(dialog.returnValue === "ok" ? { reason: reason || undefined } : null);
      },
      { once: true },
    );
    dialog.returnValue = "";
    dialog.showModal();
  });
}

function picked() {
  return Array.from(document.querySelectorAll("input.pick:checked")).map((el) => el.value);
}

const ACTIONS = {
  pause: (q) => ({ path: `/queues/${q}:pause`, text: () => `Pause queue ${q}?` }),
  resume: (q) => ({ path: `/queues/${q}:resume`, text: () => `Resume queue ${q}?` }),
  purge: (q, button) => ({
    path: `/queues/${q}:purge`,
    text: () => `Purge ${button.dataset.count} ready and scheduled jobs of ${q}?`,
  }),
  "dead-letter": (q) => ({
    path: `/queues/${q}/jobs:dead-letter`,
    ids: true,
    text: (n) => `Dead-letter ${n} selected job${n === 1 ? "" : "s"} of ${q}?`,
  }),
  requeue: (q) => ({
    path: `/queues/${q}/dead-letters:requeue`,
    ids: true,
    text: (n) => `Requeue ${n} dead letter${n === 1 ? "" : "s"} of ${q}?`,
  }),
  delete: (q) => ({
    path: `/queues/${q}/dead-letters:delete`,
    ids: true,
    text: (n) => `Delete ${n} dead letter${n === 1 ? "" : "s"} of ${q}?`,
  }),
  // The schedules page: the button names the schedule (data-schedule).
  "schedule-pause": (s, button) => ({
    path: `/schedules/${s}:pause`,
    text: () => `Pause schedule ${button.dataset.schedule}? It fires no job until it is resumed.`,
  }),
  "schedule-resume": (s, button) => ({
    path: `/schedules/${s}:resume`,
    text: () => `Resume schedule ${button.dataset.schedule}? It fires again from its next tick.`,
  }),
  "schedule-delete": (s, button) => ({
    method: "DELETE",
    path: `/schedules/${s}`,
    text: () => `Delete schedule ${button.dataset.schedule}? It fires no more jobs; the jobs it fired stay.`,
  }),
};

function wireActions() {
  const all = document.getElementById("pick-all");
  if (all) {
    all.addEventListener("change", () => {
      for (const box of document.querySelectorAll("input.pick")) box.checked = all.checked;
    });
  }
  for (const button of document.querySelectorAll("button.act")) {
    button.addEventListener("click", async () => {
      const target = encodeURIComponent(button.dataset.schedule ?? button.dataset.queue);
      const action = ACTIONS[button.dataset.action](target, button);
      const ids = action.ids ? picked() : null;
      if (ids !== null && ids.length === 0) {
        flash("Select jobs first.", true);
        return;
      }
      const answer = await confirmDialog(action.text(ids ? ids.length : 0));
      if (answer === null) return;
      const body = { reason: answer.reason };
      if (ids) body.ids = ids;
      try {
        await api(action.method || "POST", action.path, body);
        window.location.reload();
      } catch (err) {
        flash(err.message, true);
      }
    });
  }
}

// -- dashboard -----------------------------------------------------------------------------

function drawSpark(svg, values) {
  const width = 120;
  const height = 28;
  const top = Math.max(0, ...values);
  const n = values.length;
  const points = values
    .map((v, i) => `${((i * width) / Math.max(1, n - 1)).toFixed(1)},${(height - (top ? (v / top) * height : 0)).toFixed(1)}`)
    .join(" ");
  let line = svg.querySelector("polyline");
  if (!line) {
    line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    svg.appendChild(line);
  }
  line.setAttribute("points", points);
}

function newCard(name) {
  const section = document.createElement("section");
  section.className = "card";
  section.dataset.queue = name;
  const h2 = document.createElement("h2");
  const a = document.createElement("a");
  a.href = `/queues/${encodeURIComponent(name)}`;
  a.textContent = name;
  const mark = document.createElement("span");
  mark.className = "pause-mark";
  h2.append(a, mark);
  const dl = document.createElement("dl");
  const labels = { ready: "ready", scheduled: "scheduled", inflight: "in flight", dead_letter: "dead", enqueued_per_s: "enq/s", acked_per_s: "ack/s", dead_lettered_per_s: "dead/s" };
  for (const field of [...FIELDS, ...RATES]) {
    const div = document.createElement("div");
    const dt = document.createElement("dt");
    dt.textContent = labels[field];
    const dd = document.createElement("dd");
    dd.dataset.field = field;
    dd.textContent = "0";
    div.append(dt, dd);
    dl.appendChild(div);
  }
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 120 28");
  svg.setAttribute("width", "120");
  svg.setAttribute("height", "28");
  section.append(h2, dl, svg);
  document.getElementById("cards").appendChild(section);
  const none = document.getElementById("no-queues");
  if (none) none.remove();
  return section;
}

function dashboard() {
  const cards = document.getElementById("cards");
  if (!cards) return;
  const live = document.getElementById("live");
  const picker = document.getElementById("window");
  const series = new Map();
  let windowS = Number(picker.value) / 1000;

  async function loadHistory() {
    let body;
    try {
      const response = await fetch(`/console/history?window=${picker.value}`, { credentials: "same-origin" });
      if (!response.ok) return;
      body = await response.text();
    } catch (_err) {
      // Cut short, before the answer or while its body was read: the page is
      // navigating away (Firefox rejects with an AbortError, an uncaught one is
      // a console error) or the server is down (the EventSource's handler shows
      // it). The sparklines stay as they are and the live events draw on. A
      // body that is not JSON is the server's bug: parsed outside, it throws.
      return;
    }
    const data = JSON.parse(body);
    windowS = Number(picker.value) / 1000;
    series.clear();
    for (const [name, values] of Object.entries(data.series)) {
      series.set(name, values);
      const card = cards.querySelector(`section[data-queue="${CSS.escape(name)}"]`);
      if (card) drawSpark(card.querySelector("svg.spark"), values);
    }
  }
  picker.addEventListener("change", () => {
    const url = new URL(window.location.href);
    url.searchParams.set("window", picker.value);
    window.history.replaceState(null, "", url);
    loadHistory();
  });

  function onStats(event) {
    const data = JSON.parse(event.data);
    live.textContent = data.serving ? "live" : "not serving";
    live.className = data.serving ? "live on" : "live off";
    const rates = document.getElementById("rates");
    rates.textContent = `acked ${data.rates.acked}/s · reserved ${data.rates.reserved}/s · enqueued ${data.rates.enqueued}/s`;
    // A queue that has no job left leaves the snapshot: its card shows zeros
    // (unless queues past the label limit are summed under "_other").
    for (const card of cards.querySelectorAll("section[data-queue]")) {
      if (!(card.dataset.queue in data.queues) && !("_other" in data.queues)) {
        for (const dd of card.querySelectorAll("dd[data-field]")) dd.textContent = "0";
      }
    }
    for (const [name, row] of Object.entries(data.queues)) {
      let card = cards.querySelector(`section[data-queue="${CSS.escape(name)}"]`);
      if (!card) card = newCard(name);
      for (const field of [...FIELDS, ...RATES]) {
        const dd = card.querySelector(`dd[data-field="${field}"]`);
        if (dd) dd.textContent = String(row[field]);
      }
      card.classList.toggle("is-paused", Boolean(row.paused));
      card.querySelector(".pause-mark").textContent = row.paused ? "paused" : "";
      // Only at 1 min does each event add a point (longer windows are averaged).
      if (windowS <= 60) {
        const values = series.get(name) || [];
        values.push(Math.round(row.enqueued_per_s));
        while (values.length > windowS) values.shift();
        series.set(name, values);
        drawSpark(card.querySelector("svg.spark"), values);
      }
    }
  }

  let source = null;
  function connect() {
    source = new EventSource(`${API}/events`);
    source.addEventListener("stats", onStats);
    source.addEventListener("open", () => {
      live.textContent = "live";
    });
    source.addEventListener("error", () => {
      live.textContent = "reconnecting…";
      live.className = "live off";
      // EventSource retries by itself unless the server refused (closed):
      // then start a new one (after a restart the session may be gone).
      if (source.readyState === EventSource.CLOSED) {
        source.close();
        fetch("/console/history?window=60000", { credentials: "same-origin" })
          .then((response) => {
            if (response.status === 401) {
              window.location.href = "/login?next=%2F";
            } else {
              window.setTimeout(connect, 2000);
            }
          })
          .catch(() => window.setTimeout(connect, 2000));
      }
    });
  }
  connect();
  loadHistory();
}

// -- enqueue -------------------------------------------------------------------------------

function utf8Base64(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary);
}

// A payload {data (base64), encoding} from a form's text, read as kind "json"
// (checked, default application/json), "text" (UTF-8) or "base64"; throws on
// text that is not what its kind says.
function payloadOf(kind, raw, encoding) {
  if (kind === "json") {
    JSON.parse(raw || "null");
    return { data: utf8Base64(raw || "null"), encoding: encoding || "application/json" };
  }
  if (kind === "text") {
    return { data: utf8Base64(raw), encoding: encoding || "text/plain; charset=utf-8" };
  }
  atob(raw.trim());
  return { data: raw.trim(), encoding: encoding || "application/octet-stream" };
}

function enqueueForm() {
  const form = document.getElementById("enqueue");
  if (!form) return;
  const result = document.getElementById("enqueue-result");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const f = new FormData(form);
    const queue = String(f.get("queue"));
    const kind = f.get("kind");
    const raw = String(f.get("payload"));
    const job = { job_type: String(f.get("job_type")) };
    try {
      job.payload = payloadOf(kind, raw, String(f.get("encoding")) || null);
      if (f.get("priority") !== "") job.priority = Number(f.get("priority"));
      if (f.get("max_attempts")) job.max_attempts = Number(f.get("max_attempts"));
      if (f.get("scheduled_at")) job.scheduled_at_ms = Date.parse(`${f.get("scheduled_at")}Z`);
      if (f.get("idempotency_key")) job.idempotency_key = String(f.get("idempotency_key"));
      if (String(f.get("custom")).trim()) job.custom = JSON.parse(String(f.get("custom")));
    } catch (err) {
      result.textContent = `Invalid input: ${err.message}`;
      result.className = "error";
      return;
    }
    try {
      const data = await api("POST", `/queues/${encodeURIComponent(queue)}/jobs`, job);
      const first = data.results[0];
      if (first.rejection) {
        result.textContent = `Rejected: ${first.rejection.message}`;
        result.className = "error";
        return;
      }
      result.textContent = "";
      const link = document.createElement("a");
      const id = first.job_id;
      link.href = `/jobs/${encodeURIComponent(id)}`;
      link.textContent = `Enqueued ${id}`;
      result.appendChild(link);
      result.className = "ok";
    } catch (err) {
      result.textContent = err.message;
      result.className = "error";
    }
  });
}

// -- schedules -----------------------------------------------------------------------------

function scheduleForm() {
  const form = document.getElementById("schedule-form");
  if (!form) return;
  const result = document.getElementById("schedule-result");
  function fail(text) {
    result.textContent = text;
    result.className = "error";
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const f = new FormData(form);
    const name = String(f.get("name"));
    const body = { queue: String(f.get("queue")), job_type: String(f.get("job_type")) };
    try {
      const cron = String(f.get("cron")).trim();
      if (cron) {
        body.cron = cron;
        body.timezone = String(f.get("timezone")).trim() || "UTC";
      }
      if (f.get("every_ms")) body.every_ms = Number(f.get("every_ms"));
      const raw = String(f.get("payload"));
      if (raw) body.payload = payloadOf(f.get("kind"), raw, String(f.get("encoding")) || null);
      body.catch_up = String(f.get("catch_up"));
    } catch (err) {
      fail(`Invalid input: ${err.message}`);
      return;
    }
    // PUT creates or replaces: replacing one that is listed is asked first.
    if (document.querySelector(`tr[data-schedule="${CSS.escape(name)}"]`)) {
      const answer = await confirmDialog(`Replace schedule ${name}? Its definition is overwritten by this form's.`);
      if (answer === null) return;
      body.reason = answer.reason;
    }
    try {
      await api("PUT", `/schedules/${encodeURIComponent(name)}`, body);
      window.location.reload();
    } catch (err) {
      fail(err.message);
    }
  });
}

// -- audit ---------------------------------------------------------------------------------

function auditPage() {
  const rows = document.getElementById("audit-rows");
  if (!rows) return;
  const more = document.getElementById("audit-more");
  const params = new URLSearchParams(window.location.search);
  let before = null;
  async function load() {
    const q = new URLSearchParams({ limit: "50" });
    if (params.get("actor")) q.set("actor", params.get("actor"));
    if (params.get("action")) q.set("action_prefix", params.get("action"));
    if (before !== null) q.set("before", String(before));
    try {
      const data = await api("GET", `/audit?${q}`);
      for (const entry of data.entries) {
        const tr = document.createElement("tr");
        const ids = entry.ids || entry.job_ids || [];
        for (const value of [entry.seq, entry.time, entry.actor, entry.role, entry.action, entry.queue, ids.join(" "), entry.reason]) {
          const td = document.createElement("td");
          td.textContent = value === null || value === undefined ? "" : String(value);
          tr.appendChild(td);
        }
        rows.appendChild(tr);
      }
      before = data.next_before;
      more.hidden = before === null || before === undefined;
    } catch (err) {
      flash(err.message, true);
    }
  }
  more.addEventListener("click", load);
  load();
}

wireActions();
dashboard();
enqueueForm();
scheduleForm();
auditPage();
