// model-asynch console: calls the JSON API with the key kept in this tab's
// sessionStorage.  The DOM is built with textContent only (never innerHTML
// with data), so nothing a model or a caller stored can run as script.
"use strict";

const KEY = "asynch.key", ROLE = "asynch.role", TENANT = "asynch.tenant";
// A job has ended once it has a finish time (a state this file does not know, e.g. a new terminal one, too).
const TERMINAL = new Set(["done", "failed", "timeout", "canceled", "expired"]);
const ended = (j) => !!j.finished_at || TERMINAL.has(j.state);
const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") n.className = v;
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    n.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return n;
}

const NS = "http://www.w3.org/2000/svg";
function svgEl(tag, attrs, text) {
  const n = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
  if (text !== undefined) n.textContent = text;
  return n;
}

function flash(msg, ok) {
  const f = $("#flash");
  f.textContent = msg || "";
  f.hidden = !msg;
  f.className = ok ? "ok" : "";
}

function toLogin() {
  sessionStorage.removeItem(KEY);
  location.href = "/console/login?next=" + encodeURIComponent(location.pathname + location.search);
}

async function api(method, path, body, key) {
  const headers = { Authorization: "Bearer " + (key || sessionStorage.getItem(KEY) || "") };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body),
                                   credentials: "omit", cache: "no-store" });
  if (resp.status === 401 && !key) { toLogin(); throw new Error("not logged in"); }
  const ctype = resp.headers.get("Content-Type") || "";
  const data = ctype.includes("json") ? await resp.json() : null;
  return { status: resp.status, data, resp };
}

const isAdmin = () => sessionStorage.getItem(ROLE) === "admin";
const fmtTime = (iso) => (iso ? new Date(iso).toLocaleString() : "");
// "1 job", "2 jobs", "1 try", "3 tries": never "1 jobs" or "job(s)".
const plural = (n, one, many) => `${n} ${n === 1 ? one : many || one + "s"}`;

// --- field errors: a 422's pointers (or the client's own) next to their inputs ---------

function clearErrors(form) {
  form.querySelectorAll(".field").forEach((f) => { f.classList.remove("invalid"); f.querySelector(".error").textContent = ""; });
}

function showErrors(form, errors) {
  const unplaced = [];
  for (const e of errors) {
    let field = null;
    for (const f of form.querySelectorAll(".field[data-pointer]")) {
      const p = f.dataset.pointer;
      if (p && (e.pointer === p || e.pointer.startsWith(p + "/"))) { field = f; break; }
    }
    if (!field) { unplaced.push(`${e.pointer || "body"}: ${e.message}`); continue; }
    field.classList.add("invalid");
    const box = field.querySelector(".error");
    box.textContent = (box.textContent ? box.textContent + "; " : "") + e.message;
  }
  return unplaced;
}

// --- payload helpers -------------------------------------------------------------------
// The console judges no payload itself: every rule is the server's (the
// model's form, checked by app/catalog/forms.py), and its 422 pointers are
// shown next to the fields they name.

const esc = (t) => t.replace(/~/g, "~0").replace(/\//g, "~1");
const optionValue = (o) => (o && typeof o === "object" && !Array.isArray(o) && "value" in o ? o.value : o);

// --- pages ------------------------------------------------------------------------------

const pages = {};

pages.login = () => {
  $("#login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = $("#api-key").value.trim();
    const r = await api("GET", "/v1/models", undefined, key);
    if (r.status !== 200) { flash(r.data && r.data.error ? r.data.error : "login failed"); return; }
    const admin = (await api("GET", "/v1/keys", undefined, key)).status === 200;
    const who = await api("GET", "/v1/tenants", undefined, key);
    sessionStorage.setItem(KEY, key);
    sessionStorage.setItem(ROLE, admin ? "admin" : "user");
    sessionStorage.setItem(TENANT, who.status === 200 ? who.data.caller : "");
    const next = new URLSearchParams(location.search).get("next");
    location.href = next && next.startsWith("/console/") ? next : "/console/models";
  });
};

function bar(value, limit) {
  const pct = limit > 0 ? Math.min(100, (100 * value) / limit) : 100;
  const fill = el("span");
  fill.style.width = pct + "%";  // CSSOM, allowed by the CSP (a style attribute is not)
  return el("span", { class: "bar" + (value >= limit ? " full" : "") }, fill);
}

async function loadModels() {
  const r = await api("GET", "/v1/overview");
  const tbody = $("#models-table tbody");
  tbody.replaceChildren(...r.data.models.map((m) => el("tr", { "data-model": m.model_name },
    el("td", {}, m.model_name),
    el("td", {}, m.enabled ? "yes" : "no"),
    el("td", { class: "depth" }, bar(m.queue_depth, m.queue_limit), `${m.queue_depth} / ${m.queue_limit}`,
       m.queue_limit !== m.queue_limit_configured ? ` (configured ${m.queue_limit_configured})` : ""),
    el("td", { class: "running" }, bar(m.running, m.max_concurrency), `${m.running} / ${m.max_concurrency}`,
       // The upstream controller (429/503, latency) holds the model below its limit, or paused for Retry-After:
       // said in words, a bare "(upstream 1)" beside "0 / 2" explained nothing.
       m.effective_concurrency < m.max_concurrency ? el("div", { class: "hint upstream" }, `upstream limit `
         + `${m.effective_concurrency}: the model pushed back (429/503 or slow answers), so at most `
         + `${m.effective_concurrency} run at once until it recovers`) : null,
       m.paused_until ? el("div", { class: "hint paused" }, `paused until ${fmtTime(m.paused_until)} (the model's Retry-After)`) : null),
    el("td", {}, ["queue_limit", "max_concurrency"].filter((k) => m.runtime[k] !== null)
      .map((k) => `${k}=${m.runtime[k]}`).join(", ") || "none"),
    el("td", {},
       m.enabled ? el("a", { href: "/console/submit?model=" + encodeURIComponent(m.model_name) }, "Submit") : "",
       " ", isAdmin() ? el("a", { href: "/console/models/edit?name=" + encodeURIComponent(m.model_name) }, "Edit") : ""))));
}

// Every chart: values on its axes, and the values under the pointer in its readout line (and a tooltip).
function hover(target, readout, text) {
  target.append(svgEl("title", {}, text));
  target.addEventListener("mouseenter", () => { readout.textContent = text; });
}

const num = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : 1));
const clock = (t) => new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });

function chart(name, buckets, since, bucketMinutes) {
  const W = 360, H = 150, left = 30, right = 40, top = 20, bottom = 34, n = buckets.length;
  const bw = (W - left - right) / n, ph = H - top - bottom, y0 = H - bottom;
  const maxDone = Math.max(1, ...buckets.map((b) => b.done));
  const maxP = Math.max(0.001, ...buckets.map((b) => b.p90_seconds ?? 0));
  const total = buckets.reduce((a, b) => a + b.done, 0);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "chart", role: "img",
                             "aria-label": `${name} throughput and P90` });
  const readout = svgEl("text", { x: left, y: H - 4, class: "readout" }, "Point at a bar for its values.");
  svg.append(svgEl("text", { x: left, y: 12, class: "caption" }, `${name}: ${total} done, P90 up to ${num(maxP)} s`));
  for (const f of [0, 0.5, 1]) {
    const y = y0 - ph * f;
    svg.append(svgEl("line", { x1: left, x2: W - right, y1: y, y2: y, class: "grid" }),
      svgEl("text", { x: left - 4, y: y + 3, class: "axis", "text-anchor": "end" }, Number.isInteger(maxDone * f) ? maxDone * f : ""),
      svgEl("text", { x: W - right + 4, y: y + 3, class: "axis p90-axis" }, num(maxP * f) + " s"));
  }
  const pts = [], t0 = new Date(since).getTime(), step = bucketMinutes * 60000;
  buckets.forEach((b, i) => {
    const x = left + i * bw, h = (ph * b.done) / maxDone;
    const g = svgEl("g", { class: "bucket", "data-bucket": i });
    g.append(svgEl("rect", { x, y: top, width: bw, height: ph, class: "hit" }),
             svgEl("rect", { x: x + 1, y: y0 - h, width: Math.max(1, bw - 2), height: h, class: "done-bar" }));
    hover(g, readout, `${clock(t0 + i * step)}–${clock(t0 + (i + 1) * step)}: ${b.done} done, P90 `
      + (b.p90_seconds === null ? "none" : num(b.p90_seconds) + " s"));
    svg.append(g);
    if (b.p90_seconds === null) return;
    pts.push(`${x + bw / 2},${y0 - (ph * b.p90_seconds) / maxP}`);
    g.append(svgEl("circle", { cx: x + bw / 2, cy: y0 - (ph * b.p90_seconds) / maxP, r: 2.5, class: "p90-point" }));
  });
  if (pts.length) svg.append(svgEl("polyline", { class: "p90", points: pts.join(" ") }));
  for (const i of [0, n / 2, n]) {
    svg.append(svgEl("text", { x: left + i * bw, y: y0 + 12, class: "axis", "text-anchor": i ? (i === n ? "end" : "middle") : "start" },
                     clock(t0 + i * step)));
  }
  svg.append(readout);
  return svg;
}

async function loadCharts() {
  const r = await api("GET", "/v1/overview/series?minutes=60");
  const names = Object.keys(r.data.models);
  $("#charts").replaceChildren(...(names.length ? names.map((m) => chart(m, r.data.models[m], r.data.since, r.data.bucket_minutes))
    : [el("p", { class: "hint" }, "No job finished in the last hour.")]));
}

pages.models = async () => {
  const tick = async () => { await loadModels(); await loadCharts(); };
  await tick();
  setInterval(tick, 5000);
};

// The model form is the declared shape (ModelInput in the OpenAPI document): one field per property, so
// none is ever left out.  anyOf with null: the field may be cleared; writeOnly: a secret; readOnly: not sent.
async function declaredShape(path, method) {
  const doc = await (await fetch("/openapi.json", { credentials: "omit" })).json();
  const deref = (x) => (x && x.$ref ? doc.components.schemas[x.$ref.split("/").pop()] : x);
  return deref(doc.paths[path][method].requestBody.content["application/json"].schema);
}

function shapeField(name, prop, required) {
  const alts = prop.anyOf || [prop], t = alts.find((x) => x.type && x.type !== "null") || {};
  const kind = t.type === "boolean" ? "checkbox" : t.type === "integer" || t.type === "number" ? "number"
    : t.type === "array" || t.type === "object" ? "json" : prop.writeOnly ? "password" : (t.maxLength || 0) >= 4000 ? "textarea" : "text";
  const id = "m-" + name, dflt = prop.default === null || typeof prop.default === "object" ? undefined : prop.default;
  const attrs = { id, name, "data-kind": kind, "data-nullable": alts.some((x) => x.type === "null") ? "1" : undefined };
  const input = kind === "json" || kind === "textarea" ? el("textarea", { ...attrs, rows: kind === "json" ? 8 : 2 })
    : el("input", { ...attrs, type: kind, min: t.minimum, max: t.maximum, placeholder: kind === "checkbox" ? undefined : dflt });
  if (kind === "checkbox") input.checked = dflt === true;
  const label = name.charAt(0).toUpperCase() + name.slice(1).replace(/_/g, " ") + (required ? " *" : "");
  return el("div", { class: "field", "data-pointer": "/" + esc(name) }, el("label", { for: id }, label), input,
    prop.description ? el("div", { class: "hint" }, prop.description) : null, el("div", { class: "error" }));
}

pages.model_edit = async () => {
  const name = new URLSearchParams(location.search).get("name");
  const form = $("#model-form");
  const input = (f) => form.elements[f];
  const shape = await declaredShape("/v1/models", "post");
  $("#model-fields").replaceChildren(...Object.entries(shape.properties).filter(([, p]) => !p.readOnly)
    .map(([k, p]) => shapeField(k, p, (shape.required || []).includes(k))));
  let original = {};
  if (name) {
    const r = await api("GET", "/v1/models/" + encodeURIComponent(name));
    if (r.status !== 200) { flash(r.data.error); return; }
    original = r.data;
    for (const [k, v] of Object.entries(r.data)) {
      const i = input(k);
      if (!i) continue;
      if (i.dataset.kind === "password") { i.placeholder = v ? `${v} (unchanged unless you type new ones)` : ""; continue; }
      if (i.type === "checkbox") i.checked = !!v;
      else if (i.dataset.kind === "json") i.value = v ? JSON.stringify(v, null, 2) : "";
      else i.value = v === null ? "" : v;
    }
    input("model_name").readOnly = true;
  }
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    flash("");
    const body = {}, errs = [];
    for (const i of form.elements) {
      if (!i.name) continue;
      let v;
      if (i.type === "checkbox") v = i.checked;
      else if (i.dataset.kind === "number") {
        if (i.value !== "") v = Number(i.value);
        else if (name && i.dataset.nullable && original[i.name] !== null) v = null;  // cleared: back to the default rule
        else continue;
      }
      else if (i.dataset.kind === "json") {
        if (i.value.trim() === "") { v = null; } else {
          try { v = JSON.parse(i.value); } catch (e) { errs.push({ pointer: "/" + i.name, message: "is not valid JSON: " + e.message }); continue; }
        }
      } else v = i.value;
      if (i.dataset.kind === "password" && v === "") continue;  // keep the stored secret
      if (name && JSON.stringify(original[i.name]) === JSON.stringify(v)) continue;
      body[i.name] = v;
    }
    if (errs.length) { showErrors(form, errs); return; }
    const r = name ? await api("PATCH", "/v1/models/" + encodeURIComponent(name), body) : await api("POST", "/v1/models", body);
    if (r.status === 200 || r.status === 201) { flash("Saved.", true); if (!name) location.href = "/console/models"; return; }
    const rest = showErrors(form, (r.data && r.data.errors) || []);
    flash([r.data ? r.data.error : `HTTP ${r.status}`, ...rest].join(" — "));
  });
};

function fieldInput(f, id) {
  const t = f.type || "string";
  const common = { id, name: f.field, required: f.required ? true : undefined, "data-type": t };
  if (t === "text") return el("textarea", { ...common, rows: 4, maxlength: f.maxLength, minlength: f.minLength });
  if (t === "array" || t === "object") return el("textarea", { ...common, rows: 3, placeholder: t === "array" ? "[...]" : "{...}" });
  if (t === "boolean") return el("input", { ...common, type: "checkbox" });
  if (t === "select") {
    return el("select", common, f.required ? null : el("option", { value: "" }, ""),
      (f.options || []).map((o, i) => el("option", { value: String(i) },
        o && typeof o === "object" && "label" in o ? o.label : String(optionValue(o)))));
  }
  if (t === "number" || t === "integer") return el("input", { ...common, type: "number", step: t === "integer" ? "1" : "any", min: f.min, max: f.max });
  return el("input", { ...common, type: t === "url" || t === "image" ? "url" : "text", pattern: f.pattern,
                       maxlength: f.maxLength, minlength: f.minLength });
}

function readPayload(form, fields) {
  const payload = {};
  for (const f of fields) {
    const i = form.elements[f.field], t = f.type || "string";
    if (t === "boolean") { payload[f.field] = i.checked; continue; }
    const raw = i.value;
    if (raw === "") continue;  // absent, as the server sees a missing field
    if (t === "select") payload[f.field] = optionValue(f.options[Number(raw)]);
    else if (t === "number" || t === "integer") payload[f.field] = Number.isFinite(Number(raw)) ? Number(raw) : raw;
    else if (t === "array" || t === "object") { try { payload[f.field] = JSON.parse(raw); } catch (e) { payload[f.field] = raw; } }
    else payload[f.field] = raw;
  }
  return payload;
}

pages.submit = async () => {
  const r = await api("GET", "/v1/models");
  const models = r.data.models.filter((m) => m.enabled);
  const sel = $("#model-select"), form = $("#job-form");
  sel.replaceChildren(...models.map((m) => el("option", { value: m.model_name }, m.model_name)));
  const wanted = new URLSearchParams(location.search).get("model");
  if (wanted) sel.value = wanted;
  let fields = [];
  const render = () => {
    const m = models.find((x) => x.model_name === sel.value);
    fields = (m && m.form) || [];
    $("#model-remark").textContent = m ? m.remark : "No enabled model.";
    $("#job-fields").replaceChildren(...fields.map((f, i) => el("div", { class: "field", "data-pointer": "/" + esc(f.field) },
      el("label", { for: "ff-" + i }, (f.label || f.field) + (f.required ? " *" : "")), fieldInput(f, "ff-" + i),
      el("div", { class: "error" }))));
  };
  sel.addEventListener("change", render);
  render();
  form.noValidate = true;  // the browser's checks would be a second copy of the server's rules
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    flash("");
    // "Other fields" is the one thing the console parses itself: text that is not a JSON object is said next to
    // the field and nothing is sent (showErrors places no pointer "", which names the whole body).
    let extra = {}, why = null;
    const extraRaw = $("#extra-json").value.trim();
    if (extraRaw) {
      try { extra = JSON.parse(extraRaw); } catch (e) { why = "is not valid JSON: " + e.message; }
      if (!why && (extra === null || typeof extra !== "object" || Array.isArray(extra))) {
        why = `must be a JSON object ({"field": value, ...}), not ${Array.isArray(extra) ? "an array" : extra === null ? "null" : "a " + typeof extra}`;
      }
    }
    if (why) {
      $("#extra-field").classList.add("invalid");
      $("#extra-json-error").textContent = why;
      $("#extra-json").focus();
      flash("Nothing was sent: see Other fields.");
      return;
    }
    const payload = { ...extra, ...readPayload(form, fields) };
    const resp = await api("POST", `/v1/models/${encodeURIComponent(sel.value)}/jobs`, payload);
    if (resp.status === 202) {
      const href = "/console/jobs/" + encodeURIComponent(resp.data.job_id);
      $("#submitted-link").textContent = resp.data.job_id;
      $("#submitted-link").href = href;
      $("#submitted").hidden = false;
      flash("Job admitted.", true);
      return;
    }
    const rest = showErrors(form, (resp.data && resp.data.errors) || []);
    flash([resp.data ? resp.data.error : `HTTP ${resp.status}`, ...rest].join(" — "));
  });
};

// --- event streams ------------------------------------------------------------------------
// EventSource cannot send an Authorization header, so a stream is a fetch()
// whose body is read chunk by chunk and parsed as text/event-stream here
// (fields id/event/data, comments are keep-alives, a blank line ends an
// event).  A dropped stream reconnects with Last-Event-ID, so nothing is
// missed; onEvent returning true ends it for good (a job's terminal event).

function openStream(path, onEvent, { onOpen, onFail } = {}) {
  const st = { closed: false, ac: null, lastId: null };
  const close = () => { st.closed = true; if (st.ac) st.ac.abort(); };
  window.addEventListener("pagehide", close);
  (async () => {
    let delay = 1000;
    while (!st.closed) {
      st.ac = new AbortController();
      const headers = { Authorization: "Bearer " + (sessionStorage.getItem(KEY) || ""), Accept: "text/event-stream" };
      if (st.lastId) headers["Last-Event-ID"] = st.lastId;
      try {
        const resp = await fetch(path, { headers, signal: st.ac.signal, credentials: "omit", cache: "no-store" });
        if (resp.status === 401) { toLogin(); return; }
        if (resp.status !== 200 || !resp.body) {
          if (onFail && onFail(resp.status)) return;  // the caller falls back (e.g. 429: waiter caps)
          throw new Error("HTTP " + resp.status);
        }
        if (onOpen) onOpen();
        delay = 1000;
        const reader = resp.body.getReader(), dec = new TextDecoder();
        let buf = "", ev = { id: null, event: "message", data: [] };
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let nl;
          while ((nl = buf.indexOf("\n")) >= 0) {
            const line = buf.slice(0, nl).replace(/\r$/, "");
            buf = buf.slice(nl + 1);
            if (line === "") {
              if (ev.data.length) {
                let data = ev.data.join("\n");
                // A job's output is text as the model sent it, even when it reads as JSON.
                if (ev.event !== "output") try { data = JSON.parse(data); } catch (e) { /* not JSON: the text */ }
                if (ev.id !== null) st.lastId = ev.id;
                if (onEvent({ id: ev.id, event: ev.event, data })) { close(); return; }
              }
              ev = { id: null, event: "message", data: [] };
              continue;
            }
            if (line.startsWith(":")) continue;  // a keep-alive
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            const val = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "id") ev.id = val;
            else if (field === "event") ev.event = val;
            else if (field === "data") ev.data.push(val);
          }
        }
      } catch (e) {
        if (st.closed) return;
      }
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(15000, delay * 2);
    }
  })();
  return { close };
}

function liveStatus(text) { const s = $("#live-status"); if (s) s.textContent = text; }

// --- jobs -------------------------------------------------------------------------------

const secs = (ms) => (ms / 1000).toFixed(1) + " s";

// A row of a job that has not ended keeps counting from the server's elapsed_ms (no clock skew).
function jobRow(j) {
  const tr = el("tr", { "data-job": j.job_id, "data-tenant": j.tenant, "data-live": ended(j) ? undefined : "1" },
    el("td", {}, el("a", { href: "/console/jobs/" + encodeURIComponent(j.job_id) }, j.job_id)),
    el("td", {}, j.model), el("td", { class: "tenant" }, j.tenant ?? ""), el("td", { class: "state state-" + j.state }, j.state),
    el("td", {}, fmtTime(j.created_at)), el("td", { class: "elapsed" }, secs(j.elapsed_ms)), el("td", {}, j.attempt),
    // Why it ended (failed, timeout, canceled) or is waiting to retry; a long one is cut here, whole on the job page.
    el("td", { class: "error", title: j.error && j.error.length > 200 ? j.error : undefined },
       j.error ? (j.error.length > 200 ? j.error.slice(0, 200) + "…" : j.error) : ""));
  tr.since = performance.now() - j.elapsed_ms;
  return tr;
}

setInterval(() => document.querySelectorAll("tr[data-live]").forEach((tr) => {
  tr.querySelector(".elapsed").textContent = secs(performance.now() - tr.since);
}), 500);

pages.jobs = async () => {
  const form = $("#job-filters");
  const params = new URLSearchParams(location.search);
  if (isAdmin()) form.querySelectorAll(".admin-only").forEach((n) => { n.hidden = false; });
  const models = (await api("GET", "/v1/models")).data.models;
  $("#f-model").append(...models.map((m) => el("option", { value: m.model_name }, m.model_name)));
  for (const k of ["model", "state", "tenant", "since", "until"]) if (params.get(k)) form.elements[k].value = params.get(k);
  const query = () => {
    const q = new URLSearchParams();
    for (const k of ["state", "tenant"]) if (form.elements[k].value) q.set(k, form.elements[k].value);
    for (const k of ["since", "until"]) if (form.elements[k].value) q.set(k, new Date(form.elements[k].value).toISOString());
    return q;
  };
  let cursor = null;
  const load = async (append) => {
    const q = query();
    q.set("limit", "50");
    if (append && cursor) q.set("cursor", cursor);
    // One model's jobs are its own listing (GET /v1/jobs has no model filter).
    const model = form.elements.model.value;
    const r = await api("GET", (model ? `/v1/models/${encodeURIComponent(model)}/jobs?` : "/v1/jobs?") + q.toString());
    if (r.status !== 200) { flash(r.data.error + " " + JSON.stringify(r.data.errors || "")); return; }
    const rows = r.data.jobs.map(jobRow);
    const tbody = $("#jobs-table tbody");
    if (append) tbody.append(...rows); else tbody.replaceChildren(...rows);
    cursor = r.data.next_cursor;
    $("#more").hidden = !cursor;
  };
  // Live: the tenant's job events update the rows shown and add new jobs that match the filters.
  let stream = null;
  const follow = () => {
    if (stream) stream.close();
    const q = new URLSearchParams();
    if (form.elements.model.value) q.set("model", form.elements.model.value);
    if (isAdmin() && form.elements.tenant.value) q.set("tenant", form.elements.tenant.value);
    stream = openStream("/v1/events" + (q.toString() ? "?" + q : ""), (ev) => {
      const j = ev.data;
      if (!j || !j.job_id) return false;
      const old = document.querySelector(`tr[data-job="${CSS.escape(j.job_id)}"]`);
      if (!j.tenant && old) j.tenant = old.dataset.tenant;
      const f = form.elements;
      const fits = (!f.model.value || f.model.value === j.model) && (!f.state.value || f.state.value === j.state) && !f.until.value
        && (!f.since.value || new Date(j.created_at) >= new Date(f.since.value));
      if (old && fits) old.replaceWith(jobRow(j));
      else if (old) old.remove();
      else if (fits) $("#jobs-table tbody").prepend(jobRow(j));
      return false;
    }, { onOpen: () => liveStatus("Live: following job events."),
         onFail: (status) => { liveStatus(`Live updates unavailable (HTTP ${status}); reload to refresh.`); return status === 429; } });
  };
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    history.replaceState(null, "", "?" + new URLSearchParams([...new FormData(form)].filter(([, v]) => v)).toString());
    load(false);
    follow();
  });
  $("#more").addEventListener("click", () => load(true));
  await load(false);
  follow();
};

// --- a job: fields, timeline, attempts, deliveries, result ------------------------------------

const EXT = { "application/json": "json", "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "text/plain": "txt",
              "image/svg+xml": "svg", "text/csv": "csv", "text/html": "html" };

function jsonTree(v, key, depth) {
  const label = key === undefined ? [] : [el("span", { class: "json-key" }, String(key)), ": "];
  if (v !== null && typeof v === "object") {
    const entries = Array.isArray(v) ? v.map((x, i) => [i, x]) : Object.entries(v);
    const shown = entries.slice(0, 1000);
    return el("details", { open: depth < 3 },
      el("summary", {}, ...label, Array.isArray(v) ? `[${entries.length}]` : `{${entries.length}}`),
      el("ul", {}, shown.map(([k, x]) => el("li", {}, jsonTree(x, k, depth + 1))),
         entries.length > shown.length ? el("li", { class: "hint" }, `… ${entries.length - shown.length} more`) : null));
  }
  return el("span", { class: "leaf" }, ...label,
            el("span", { class: "json-" + (v === null ? "null" : typeof v) }, JSON.stringify(v)));
}

async function showResult(job) {
  const box = $("#result");
  const resp = await fetch(job.result_url, { headers: { Authorization: "Bearer " + sessionStorage.getItem(KEY) }, credentials: "omit" });
  if (resp.status !== 200) { box.replaceChildren(el("p", { class: "error" }, `result: HTTP ${resp.status}`)); return; }
  const ctype = (resp.headers.get("Content-Type") || "application/octet-stream").split(";")[0].trim().toLowerCase();
  const blob = await resp.blob();
  const url = URL.createObjectURL(blob);
  let preview;
  if (ctype === "application/json" || ctype.endsWith("+json")) {
    const text = await blob.text();
    try {
      const parsed = JSON.parse(text);
      preview = [el("div", { id: "result-tree", class: "json-tree" }, jsonTree(parsed, undefined, 0)),
        el("details", {}, el("summary", {}, "Raw JSON"), el("pre", { id: "result-json" }, JSON.stringify(parsed, null, 2)))];
    } catch (e) { preview = el("pre", { id: "result-text" }, text.slice(0, 20000)); }
  } else if (ctype.startsWith("image/")) {
    preview = el("img", { id: "result-image", src: url, alt: `result image (${ctype})` });
  } else if (ctype.startsWith("text/")) {
    const text = await blob.text();
    preview = [el("pre", { id: "result-text" }, text.slice(0, 20000)),
      text.length > 20000 ? el("p", { class: "hint" }, `First 20000 of ${text.length} characters.`) : null];
  } else {
    preview = el("p", { class: "hint", id: "result-binary" }, `${ctype}, ${blob.size} bytes: no preview.`);
  }
  box.replaceChildren(...[preview].flat().filter(Boolean),
    el("p", {}, el("a", { id: "download", class: "button", href: url, download: `${job.job_id}.${EXT[ctype] || "bin"}` },
      `Download (${ctype}, ${blob.size} bytes)`)));
}

const seconds = (a, b) => (a && b ? ((new Date(b) - new Date(a)) / 1000).toFixed(2) + " s" : "");

function renderAttempts(j) {
  const items = j.attempts.map((a) => el("li", { class: "attempt outcome-" + a.outcome, "data-attempt": a.attempt, "data-outcome": a.outcome },
    el("strong", {}, `Attempt ${a.attempt}`), " ", el("span", { class: "state state-" + a.outcome }, a.outcome === "retry_wait" ? "failed, retried" : a.outcome),
    el("div", { class: "when" }, `${fmtTime(a.started_at)} → ${fmtTime(a.ended_at)} (${seconds(a.started_at, a.ended_at)})`,
       a.worker ? ` on ${a.worker}` : ""),
    a.error ? el("div", { class: "error attempt-error" }, a.error) : null,
    a.error_detail ? el("details", {}, el("summary", {}, "Detail (admins)"), el("pre", {}, a.error_detail)) : null));
  if (j.state === "running" && !j.attempts.some((a) => a.attempt === j.attempt)) {
    items.push(el("li", { class: "attempt outcome-running", "data-attempt": j.attempt, "data-outcome": "running" },
      el("strong", {}, `Attempt ${j.attempt}`), " ", el("span", { class: "state state-running" }, "running"),
      el("div", { class: "when" }, `since ${fmtTime(j.started_at)}`)));
  }
  $("#attempts").replaceChildren(...items);
  $("#no-attempts").hidden = items.length > 0;
}

// A job's deliveries, both kinds in one list (GET /v1/jobs/{id}/deliveries: empty when it has none, so a job
// without a callback costs no 404): the seed's GET callback on done, and Standard Webhooks POSTs.
const deliveryDetail = (d) => (d.status === "delivered" ? `delivered ${fmtTime(d.delivered_at)}`
  : d.status === "pending" && d.next_attempt_at ? `next try ${fmtTime(d.next_attempt_at)}` : (d.last_error || ""));

async function loadDeliveries(j) {
  const r = await api("GET", `/v1/jobs/${encodeURIComponent(j.job_id)}/deliveries`);
  const all = r.status === 200 ? r.data.deliveries : [];
  const box = $("#deliveries");
  if (!all.length) { box.replaceChildren(el("p", { class: "hint", id: "no-deliveries" }, "No delivery for this job.")); return all; }
  // The title names the event it was sent for (job.failed) apart from how the delivery went (delivered):
  // "webhook failed: delivered" read as a failed webhook.
  box.replaceChildren(...all.map((d, i) => el("section", { class: "delivery", "data-kind": d.kind === "webhook" ? `webhook ${d.event}` : d.kind,
                                                           "data-status": d.status },
    el("h3", {}, d.kind === "webhook" ? `Webhook for job.${d.event}` : `Callback (GET on job.${d.event})`, " — ",
       el("span", { class: "delivery-status status-" + d.status }, d.status), ` after ${plural(d.attempts, "try", "tries")}`),
    el("p", { class: "target" }, `${d.kind === "webhook" ? "POST" : "GET"} ${d.url}`),
    deliveryDetail(d) ? el("p", { class: "hint" }, deliveryDetail(d)) : null,
    el("div", { class: "table-wrap" }, el("table", { class: "delivery-log", "aria-label": `${d.kind} ${i + 1} tries` },
      el("thead", {}, el("tr", {}, ["Try", "At", "Took", "Address", "HTTP", "Error"].map((h) => el("th", {}, h)))),
      el("tbody", {}, d.log.map((a) => el("tr", { "data-try": a.attempt },
        el("td", {}, a.attempt), el("td", {}, fmtTime(a.at)), el("td", {}, a.duration_ms === null ? "" : a.duration_ms + " ms"),
        el("td", {}, a.address || ""), el("td", {}, a.http_status === null ? "" : a.http_status),
        el("td", { class: a.error ? "error" : "" }, a.error || "")))))))));
  return all;
}

// The text an OpenAI-style chunk carries (an SSE "data: {...}" event or an NDJSON line); other output as it is.
function chunkText(text) {
  const body = text.trim().replace(/^data:\s*/, "");
  if (body === "[DONE]") return "";
  try {
    const c = JSON.parse(body).choices[0];
    const t = c.delta ? c.delta.content : c.text;
    return typeof t === "string" ? t : "";
  } catch (e) { return text; }
}

// A streaming model's output, live (GET stream_url): a retry starts it anew; at the end the stream says how the
// job ended.  Resumes by itself (openStream sends Last-Event-ID).
function followOutput(j) {
  const box = $("#output"), state = $("#output-state");
  $("#output-section").hidden = false;
  state.textContent = "Waiting for output…";
  openStream(j.stream_url, (ev) => {
    if (ev.event === "attempt") {
      box.textContent = "";
      state.textContent = ev.data.attempt > 1 ? `Live: attempt ${ev.data.attempt} started the output anew.` : "Live.";
    } else if (ev.event === "output") {
      box.textContent += chunkText(ev.data);
    } else if (ev.id === "end") {
      state.textContent = ev.event === "done" ? "Complete." : `Ended ${ev.data.state}: output so far.`;
      return true;
    }
    return false;
  }, { onFail: (status) => { state.textContent = `Output unavailable (HTTP ${status}).`; return true; } });
}

// What holds a pending job now (its detail's waiting_on; docs/api.md "Why a job waits"), in words.
function waitingText(w) {
  if (!w) return "";
  switch (w.reason) {
    case "behind_own_jobs": return `behind ${plural(w.ahead, "job")} of its own tenant`;
    case "tenant_limit": return `its tenant holds ${w.running}${w.limit === undefined ? "" : ` of ${w.limit}`} calls `
      + `(${{ max_concurrency: "the model's max_concurrency", burst: "its burst ceiling", upstream: "cut by the upstream",
             model_key: "its model key's limit" }[w.ceiling] || w.ceiling})`;
    case "upstream_paused": return `upstream paused (${w.scope}) until ${fmtTime(w.until)}`
      + (w.answer ? ` after an HTTP ${w.answer} answer` : "");
    case "retry_backoff": return `retry backoff until ${fmtTime(w.until)}`;
    case "no_worker": return `no worker has taken it yet (ready since ${fmtTime(w.since)})`;
    default: return w.reason;
  }
}

pages.job = async () => {
  const id = document.body.dataset.jobId;
  let shown = false, delivered = false, job = null, rereading = null;
  const tick = async () => {
    const r = await api("GET", "/v1/jobs/" + encodeURIComponent(id));
    if (r.status !== 200) { flash(r.data.error); return true; }
    const j = job = r.data;
    const rows = [["Job", j.job_id], ["Model", j.model], ["State", j.state], ["Internal state", j.internal_state],
      ["Tenant", j.tenant], ["Attempt", j.attempt], ["Retries", j.retry_count], ["Priority", j.priority ?? ""],
      ["Elapsed", (j.elapsed_ms / 1000).toFixed(2) + " s"], ["Error", j.error || ""], ["Payload", JSON.stringify(j.payload)]];
    if (j.waiting_on) rows.splice(3, 0, ["Waiting on", waitingText(j.waiting_on)]);
    // A wait's reason changes without an event of the job's own: re-read while it waits.
    if (j.waiting_on && !rereading) rereading = setTimeout(() => { rereading = null; tick(); }, 2000);
    // A long value (a 6 KB payload) wraps inside a box of its own height, which scrolls: the page keeps its size.
    $("#job-fields").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k),
      el("dd", { "data-field": k.toLowerCase(), class: String(v).length > 600 ? "long" : undefined }, v)]));
    $("#timeline").replaceChildren(...j.timeline.map((e) => el("li", { "data-event": e.event },
      el("strong", {}, e.event), " ", e.at ? `${fmtTime(e.at)} ` : "", e.detail,
      // The row keeps only its latest requeue's time (docs/api.md, the job detail's timeline).
      e.at ? "" : e.event === "requeued" ? " (time not recorded: only the latest requeue's time is kept)" : " (time not recorded)")));
    renderAttempts(j);
    const cancel = $("#cancel-job");
    const over = ended(j);
    cancel.hidden = over;
    cancel.onclick = async () => { const c = await api("POST", j.poll_url + "/cancel"); flash(c.data.error || "Canceled.", !c.data.error); tick(); };
    // The result box says what the state says: a result, loading, none (how it ended), or not yet.
    if (j.state === "done") {
      if (!shown) { shown = true; $("#result").replaceChildren(el("p", { class: "hint" }, "Loading the result…")); await showResult(j); }
    } else {
      $("#result").replaceChildren(el("p", { class: "hint", id: over ? "no-result" : "not-yet" }, over
        ? `No result: the job ended ${j.state}${j.error ? ` (${j.error})` : ""}.` : "Not finished yet."));
    }
    if (over) liveStatus(`Finished: ${j.state}.`);
    if (over && !delivered) { delivered = true; followDeliveries(j); }
    return over;
  };
  // A delivery is retried on its own schedule after the job ended: its log is re-read while one is in flight.
  const followDeliveries = async (j) => {
    for (let i = 0; i < 40; i++) {
      const all = await loadDeliveries(j);
      if (!all.some((d) => d.status === "pending" || d.status === "sending")) return;
      await new Promise((r) => setTimeout(r, 1500));
    }
  };
  const over = await tick();
  if (job && job.stream_url) followOutput(job);  // also once ended: the output is replayed
  if (over) return;
  // Live: the job's own event stream; each event re-reads the detail (attempts, timeline).
  let polling = null;
  const poll = () => { if (!polling) polling = setInterval(async () => { if (await tick()) clearInterval(polling); }, 1000); };
  openStream(`/v1/models/${encodeURIComponent(job.model)}/jobs/${encodeURIComponent(id)}/events`, (ev) => {
    const last = ev.id === "end";
    tick();
    return last;
  }, { onOpen: () => liveStatus("Live: following this job's events."),
       onFail: (status) => { liveStatus(`Live updates unavailable (HTTP ${status}); polling.`); poll(); return true; } });
};

// --- tenants: usage per day, queue share, rate limit -----------------------------------------

const isoDay = (d) => d.toISOString().slice(0, 10);

function usageChart(tenant, days, rows) {
  const today = new Date();
  const dayList = [];
  for (let i = days - 1; i >= 0; i--) dayList.push(isoDay(new Date(today.getTime() - i * 86400000)));
  const modelsSeen = [...new Set(rows.map((r) => r.model_name))].sort();
  const per = new Map(dayList.map((d) => [d, new Map()]));
  for (const r of rows) {
    const m = per.get(r.day);
    if (m) m.set(r.model_name, (m.get(r.model_name) || 0) + r.request_count);
  }
  const totals = dayList.map((d) => [...per.get(d).values()].reduce((a, b) => a + b, 0));
  const total = totals.reduce((a, b) => a + b, 0), max = Math.max(1, ...totals);
  const W = 640, H = 216, left = 36, bottom = 38, top = 20, bw = (W - left - 8) / days;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, class: "usage", role: "img",
                             "aria-label": `Model calls per day for ${tenant}: ${total} in ${days} days` });
  svg.append(svgEl("title", {}, `Model calls per day for ${tenant}`));
  svg.append(svgEl("text", { x: left, y: 12, class: "caption" }, `${plural(total, "call")} in ${days} days, at most ${Math.max(...totals)} a day`));
  const readout = svgEl("text", { x: left, y: H - 4, class: "readout" }, "Point at a day for its calls.");
  for (const frac of [0, 0.5, 1]) {
    const y = H - bottom - (H - bottom - top) * frac;
    svg.append(svgEl("line", { x1: left, x2: W - 8, y1: y, y2: y, class: "grid" }),
               svgEl("text", { x: left - 4, y: y + 3, class: "axis", "text-anchor": "end" },
                      String(Number.isInteger(max * frac) ? max * frac : (max * frac).toFixed(1))));
  }
  dayList.forEach((d, i) => {
    let y = H - bottom;
    const g = svgEl("g", { class: "day", "data-day": d });
    g.append(svgEl("rect", { x: left + i * bw, y: top, width: bw, height: H - bottom - top, class: "hit" }));
    hover(g, readout, `${d}: ${plural(totals[i], "call")}` + (totals[i] ? " — " + [...per.get(d)].map(([m, n]) => `${m} ${n}`).join(", ") : ""));
    modelsSeen.forEach((m, k) => {
      const n = per.get(d).get(m) || 0;
      if (!n) return;
      const h = ((H - bottom - top) * n) / max;
      y -= h;
      const rect = svgEl("rect", { x: left + i * bw + 1, y, width: Math.max(1, bw - 2), height: h, class: "series-" + (k % 6),
                                   "data-model": m, "data-count": n });
      rect.append(svgEl("title", {}, `${d} ${m}: ${n}`));
      g.append(rect);
    });
    svg.append(g);
    if (i === 0 || i === days - 1 || (days > 10 && i % 7 === 0 && days - 1 - i >= 4)) {
      svg.append(svgEl("text", { x: left + i * bw + bw / 2, y: H - bottom + 14, class: "axis", "text-anchor": "middle" }, d.slice(5)));
    }
  });
  svg.append(readout);
  const legend = el("ul", { class: "legend" }, modelsSeen.map((m, k) => el("li", {}, el("span", { class: "swatch series-" + (k % 6) }), m)));
  // The same numbers as a table, for keyboards and screen readers (a bar's <title> needs a mouse).
  const filled = dayList.filter((d) => per.get(d).size).reverse();
  const table = el("details", { id: "usage-table" }, el("summary", {}, "The numbers"),
    el("div", { class: "table-wrap" }, el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "Day"), modelsSeen.map((m) => el("th", {}, m)), el("th", {}, "Total"))),
      el("tbody", {}, filled.length ? filled.map((d) => el("tr", { "data-day": d }, el("td", {}, d),
        modelsSeen.map((m) => el("td", {}, per.get(d).get(m) || 0)), el("td", {}, totals[dayList.indexOf(d)])))
        : el("tr", {}, el("td", { colspan: modelsSeen.length + 2, class: "hint" }, "No model call in these days."))))));
  return [svg, legend, table];
}

async function statsRows(tenant, from) {
  const rows = [];
  let cursor = null;
  for (let page = 0; page < 10; page++) {
    const q = new URLSearchParams({ tenant, from, limit: "10000" });
    if (cursor) q.set("cursor", cursor);
    const r = await api("GET", "/v1/stats?" + q);
    if (r.status !== 200) { flash(r.data.error); break; }
    rows.push(...r.data.rows);
    cursor = r.data.next_cursor;
    if (!cursor) break;
  }
  return rows;
}

pages.tenants = async () => {
  const form = $("#tenant-form"), sel = $("#tenant-select");
  const { tenants: list, caller } = (await api("GET", "/v1/tenants")).data;
  sel.replaceChildren(...list.map((t) => el("option", { value: t }, t)));
  const params = new URLSearchParams(location.search), wanted = params.get("tenant") || caller;
  if (list.includes(wanted)) sel.value = wanted;
  if (params.get("days")) form.elements.days.value = params.get("days");
  const load = async () => {
    const tenant = sel.value, days = Number(form.elements.days.value);
    if (!tenant) { $("#usage-chart").replaceChildren(el("p", { class: "hint" }, "No tenant.")); return; }
    const from = isoDay(new Date(Date.now() - (days - 1) * 86400000));
    const t = encodeURIComponent(tenant);
    const [rows, st, lim] = await Promise.all([statsRows(tenant, from), api("GET", `/v1/tenants/${t}/state`),
                                               api("GET", `/v1/tenants/${t}/limits`)]);
    $("#usage-chart").replaceChildren(...usageChart(tenant, days, rows));
    if (st.status !== 200) { flash(st.data.error); return; }
    const { weight, min_concurrency: lo = {}, burst_concurrency: hi = {} } = lim.status === 200 ? lim.data : {};
    $("#dispatch-share").textContent = [`Weight ${weight ?? 1}: its share of model time when tenants compete.`,
      ...Object.keys({ ...lo, ...hi }).sort().map((m) => `${m}: ${plural(lo[m] ?? 0, "job")} guaranteed, at most ${hi[m] ?? "max_concurrency"}.`)].join(" ");
    $("#share-table tbody").replaceChildren(...st.data.models.map((m) => el("tr", { "data-model": m.model },
      el("td", {}, m.model), el("td", { class: "share" }, bar(m.in_use, m.cap), `${m.in_use} / ${m.cap}`),
      el("td", {}, m.queue_limit), el("td", {}, m.pending), el("td", {}, m.running), el("td", {}, m.retry_wait))));
    const rate = st.data.rate;
    $("#rate-policy").textContent = rate.limited
      ? `Each key: ${rate.rate_per_second} requests/s, bursts of ${rate.burst}.`
      : "Not rate-limited: no rate is set for this tenant and ASYNCH_RATE_LIMIT_PER_SECOND is 0.";
    $("#rate-table").hidden = !rate.keys.length;
    $("#rate-table tbody").replaceChildren(...rate.keys.map((k) => el("tr", { "data-key": k.key_id },
      el("td", {}, `key ${k.key_id}`),
      el("td", { class: "tokens" }, k.tokens === null ? "unknown (Redis unreachable)" : [bar(k.tokens, rate.burst), `${k.tokens.toFixed(1)} / ${rate.burst}`]))));
  };
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    history.replaceState(null, "", "?" + new URLSearchParams({ tenant: sel.value, days: form.elements.days.value }));
    load();
  });
  await load();
  setInterval(load, 10000);
};

// --- workers ------------------------------------------------------------------------------

const age = (s) => (s === null || s === undefined ? "never" : s < 60 ? `${s.toFixed(1)} s ago` : `${Math.round(s / 60)} min ago`);

pages.workers = async () => {
  const load = async () => {
    const r = await api("GET", "/v1/workers");
    if (r.status !== 200) { flash(r.data.error); return false; }
    const ws = r.data.workers;
    $("#workers-summary").textContent = `${plural(ws.length, "node")}, ${ws.filter((w) => w.alive).length} alive; a node silent `
      + `for ${r.data.ttl_seconds} s is dead and recovery fails its attempts.`
      + (r.data.unassigned_running ? ` ${plural(r.data.unassigned_running, "running job")} ${r.data.unassigned_running === 1 ? "names" : "name"} no node.` : "");
    $("#workers-table tbody").replaceChildren(...ws.map((w) => el("tr", { "data-node": w.node, class: w.alive ? "" : "dead" },
      el("td", {}, w.node, w.instance ? el("div", { class: "hint" }, w.instance) : null),
      el("td", { class: "alive " + (w.alive ? "yes" : "no") }, w.alive ? "alive" : "dead"),
      el("td", { class: "heartbeat" }, age(w.heartbeat_age_seconds)),
      el("td", {}, age(w.consumed_age_seconds)),
      el("td", {}, w.queues.join(", ")),
      el("td", { class: "running" }, w.running.length ? el("ul", { class: "plain" }, w.running.map((j) => el("li", {},
        el("a", { href: "/console/jobs/" + encodeURIComponent(j.job_id) }, j.job_id), ` ${j.model}, attempt ${j.attempt}, since ${fmtTime(j.started_at)}`)))
        : "idle"))));
    return true;
  };
  if (!(await load())) return;  // refused (a stale admin role): nothing to follow
  setInterval(load, 3000);  // heartbeat ages move on their own
  // Jobs starting and ending show at once: every job event re-reads the nodes (at most one read in flight).
  let busy = false;
  openStream("/v1/events", () => {
    if (!busy) { busy = true; load().finally(() => { busy = false; }); }
    return false;
  }, { onOpen: () => liveStatus("Live: following job events."), onFail: () => true });
};

// --- batches ----------------------------------------------------------------------------------

async function downloadFile(fileId, name) {
  const resp = await fetch(`/v1/files/${encodeURIComponent(fileId)}/content`,
                           { headers: { Authorization: "Bearer " + sessionStorage.getItem(KEY) }, credentials: "omit" });
  if (resp.status !== 200) { flash(`download: HTTP ${resp.status}`); return; }
  const a = el("a", { href: URL.createObjectURL(await resp.blob()), download: name });
  document.body.append(a);
  a.click();
  a.remove();
}

function fileButton(fileId, label, cls) {
  if (!fileId) return null;
  const b = el("button", { type: "button", class: "link " + cls, "data-file": fileId }, label);
  b.addEventListener("click", () => downloadFile(fileId, `${fileId}.jsonl`));
  return b;
}

pages.batches = async () => {
  const load = async () => {
    const r = await api("GET", "/v1/batches?limit=100");
    if (r.status !== 200) { flash(r.data.error); return false; }
    $("#batches-table tbody").replaceChildren(...r.data.data.map((b) => {
      const c = b.request_counts, doneN = c.completed + c.failed;
      const pct = c.total ? Math.floor((100 * doneN) / c.total) : 0;
      return el("tr", { "data-batch": b.id },
        el("td", {}, b.id, b.metadata ? el("div", { class: "hint" }, Object.entries(b.metadata).map(([k, v]) => `${k}=${v}`).join(", ")) : null),
        el("td", { class: "status" }, b.status,
           b.errors ? el("ul", { class: "plain errors" }, b.errors.data.slice(0, 5).map((e) =>
             el("li", { class: "error" }, `line ${e.line ?? "-"}: ${e.code}: ${e.message}`))) : null),
        el("td", { class: "progress" }, el("progress", { max: String(c.total || 1), value: String(doneN),
                                                         "aria-label": `${b.id} progress` }), ` ${doneN} / ${c.total} (${pct}%)`),
        el("td", { class: "completed" }, String(c.completed)),
        el("td", { class: "failed" }, String(c.failed)),
        el("td", {}, b.completion_window, el("div", { class: "hint" }, "ends " + unixTime(b.expires_at))),
        el("td", {}, unixTime(b.created_at)),
        el("td", { class: "files" }, fileButton(b.output_file_id, "Output", "output"), " ",
           fileButton(b.error_file_id, "Errors", "errors")));
    }));
    return true;
  };
  if (await load()) {
    liveStatus("Live: refreshed every 3 s.");
    setInterval(load, 3000);
  }
};

// --- maintenance ------------------------------------------------------------------------------

const unixTime = (t) => (t ? new Date(t * 1000).toLocaleString() : "");

pages.maintenance = async () => {
  const load = async () => {
    const [st, runs] = await Promise.all([api("GET", "/v1/maintenance/state"), api("GET", "/v1/maintenance/runs?limit=30")]);
    if (st.status !== 200) { flash(st.data.error); return false; }
    const l = st.data.leader;
    $("#leader").replaceChildren(...(l
      ? [el("strong", { id: "leader-owner" }, l.owner), ` holds the beat lock (fencing token ${l.token})`,
         l.ttl_ms !== null ? `, ${(l.ttl_ms / 1000).toFixed(1)} s left before it must renew.` : "."]
      : [el("strong", { id: "leader-owner", class: "error" }, "No beat leader:"), " no periodic pass is being scheduled."]));
    $("#gates-table tbody").replaceChildren(...st.data.gates.map((g) => el("tr", { "data-gate": g.model, class: g.drift ? "drift" : "" },
      el("td", {}, g.model, g.configured ? "" : " (model deleted)"), el("td", {}, g.slots), el("td", {}, g.active_rows),
      el("td", { class: "drift-cell" }, g.drift === 0 ? "in step" : (g.drift > 0 ? "+" : "") + g.drift))));
    const runRow = (e, withToken) => el("tr", { "data-task": e.task }, el("td", {}, e.task), el("td", {}, unixTime(e.ran_at)),
      el("td", {}, `${(e.took * 1000).toFixed(0)} ms`), el("td", { class: "processed" }, e.processed ?? ""),
      withToken ? el("td", {}, e.token ?? "manual") : null);
    $("#latest-table tbody").replaceChildren(...(st.data.latest.length ? st.data.latest.map((e) => runRow(e, true))
      : [el("tr", {}, el("td", { colspan: 5, class: "hint" }, "No periodic run recorded yet."))]));
    if (runs.status === 200) $("#runs-table tbody").replaceChildren(...runs.data.runs.slice().reverse().map((e) => runRow(e, false)));
    return true;
  };
  $("#reconcile").addEventListener("click", async () => {
    const r = await api("POST", "/v1/maintenance/reconcile");
    $("#reconcile-result").textContent = r.status === 200
      ? `Reconciled ${plural(r.data.models, "model")}: ${plural(r.data.added, "slot")} added, ${r.data.removed} removed.`
      : (r.data && r.data.error) || `HTTP ${r.status}`;
    await load();
  });
  if (await load()) setInterval(load, 5000);
};

// The pages only an admin key can use: a user key is told so on arrival, not on Save, and the page neither
// shows empty tables nor follows anything live.
const ADMIN_PAGES = { model_edit: "Creating and editing models is", workers: "The workers page is",
                      maintenance: "The maintenance page is" };

function adminOnly(page) {
  flash(`admin key required: ${ADMIN_PAGES[page]} for admin keys; this tab is logged in with a user key`
    + ` (tenant ${sessionStorage.getItem(TENANT) || "unknown"}).`);
  document.querySelectorAll("main > :not(h1):not(#flash)").forEach((n) => { n.hidden = true; });
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page !== "login") {
    if (!sessionStorage.getItem(KEY)) { toLogin(); return; }
    $("#whoami").textContent = [isAdmin() ? "admin" : "user", sessionStorage.getItem(TENANT)].filter(Boolean).join(" · ");
    $("#logout").addEventListener("click", () => { sessionStorage.clear(); location.href = "/console/login"; });
    if (isAdmin()) document.querySelectorAll(".admin-only").forEach((n) => { n.hidden = false; });
    else if (page in ADMIN_PAGES) { adminOnly(page); return; }
  }
  const init = pages[page];
  if (init) Promise.resolve().then(init).catch((e) => flash(String(e.message || e)));
});
