// model-asynch console: calls the JSON API with the key kept in this tab's
// sessionStorage.  The DOM is built with textContent only (never innerHTML
// with data), so nothing a model or a caller stored can run as script.
"use strict";

const KEY = "asynch.key", ROLE = "asynch.role";
const TERMINAL = new Set(["done", "failed", "timeout", "canceled"]);
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
    sessionStorage.setItem(KEY, key);
    sessionStorage.setItem(ROLE, admin ? "admin" : "user");
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
    el("td", { class: "running" }, bar(m.running, m.max_concurrency), `${m.running} / ${m.max_concurrency}`),
    el("td", {}, ["queue_limit", "max_concurrency"].filter((k) => m.runtime[k] !== null)
      .map((k) => `${k}=${m.runtime[k]}`).join(", ") || "none"),
    el("td", {},
       m.enabled ? el("a", { href: "/console/submit?model=" + encodeURIComponent(m.model_name) }, "Submit") : "",
       " ", isAdmin() ? el("a", { href: "/console/models/edit?name=" + encodeURIComponent(m.model_name) }, "Edit") : ""))));
}

function chart(name, buckets, bucketMinutes) {
  const W = 300, H = 110, pad = 18, n = buckets.length, bw = (W - 2 * pad) / n;
  const maxDone = Math.max(1, ...buckets.map((b) => b.done));
  const p90s = buckets.map((b) => b.p90_seconds).filter((v) => v !== null);
  const maxP = Math.max(0.001, ...p90s);
  const NS = "http://www.w3.org/2000/svg";
  const s = (tag, attrs, text) => {
    const n2 = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) n2.setAttribute(k, v);
    if (text !== undefined) n2.textContent = text;
    return n2;
  };
  const svg = s("svg", { width: W, height: H + 30, class: "chart", role: "img", "aria-label": `${name} throughput and P90` });
  svg.append(s("text", { x: pad, y: 12 }, `${name}: ${buckets.reduce((a, b) => a + b.done, 0)} done, P90 max ${maxP.toFixed(2)}s`));
  const g = s("g", { class: "bars" });
  const pts = [];
  buckets.forEach((b, i) => {
    const h = ((H - 30) * b.done) / maxDone;
    g.append(s("rect", { x: pad + i * bw + 1, y: H - h, width: Math.max(1, bw - 2), height: h },));
    g.lastChild.append(s("title", {}, `${b.done} done; P90 ${b.p90_seconds === null ? "-" : b.p90_seconds.toFixed(2) + "s"}`));
    if (b.p90_seconds !== null) pts.push(`${pad + i * bw + bw / 2},${H - ((H - 30) * b.p90_seconds) / maxP}`);
  });
  svg.append(g);
  if (pts.length) svg.append(s("polyline", { class: "p90", points: pts.join(" ") }));
  svg.append(s("text", { x: pad, y: H + 14 }, `-${n * bucketMinutes} min`), s("text", { x: W - pad - 20, y: H + 14 }, "now"));
  return svg;
}

async function loadCharts() {
  const r = await api("GET", "/v1/overview/series?minutes=60");
  const names = Object.keys(r.data.models);
  $("#charts").replaceChildren(...(names.length ? names.map((m) => chart(m, r.data.models[m], r.data.bucket_minutes))
    : [el("p", { class: "hint" }, "No job finished in the last hour.")]));
}

pages.models = async () => {
  const tick = async () => { await loadModels(); await loadCharts(); };
  await tick();
  setInterval(tick, 5000);
};

pages.model_edit = async () => {
  const name = new URLSearchParams(location.search).get("name");
  const form = $("#model-form");
  const input = (f) => form.elements[f];
  let original = {};
  if (name) {
    const r = await api("GET", "/v1/models/" + encodeURIComponent(name));
    if (r.status !== 200) { flash(r.data.error); return; }
    original = r.data;
    for (const [k, v] of Object.entries(r.data)) {
      const i = input(k);
      if (!i) continue;
      if (k === "head_msg") { i.placeholder = v ? `${v} (unchanged unless you type new headers)` : ""; continue; }
      if (i.type === "checkbox") i.checked = !!v;
      else if (k === "form") i.value = v ? JSON.stringify(v, null, 2) : "";
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
      else if (i.dataset.kind === "number") { if (i.value === "") continue; v = Number(i.value); }
      else if (i.dataset.kind === "json") {
        if (i.value.trim() === "") { v = null; } else {
          try { v = JSON.parse(i.value); } catch (e) { errs.push({ pointer: "/" + i.name, message: "is not valid JSON: " + e.message }); continue; }
        }
      } else v = i.value;
      if (i.name === "head_msg" && v === "") continue;  // keep the stored secret
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
    let extra = {};
    const extraRaw = $("#extra-json").value.trim();
    if (extraRaw) {
      try { extra = JSON.parse(extraRaw); } catch (e) { extra = null; }
      if (!extra || typeof extra !== "object" || Array.isArray(extra)) {
        showErrors(form, [{ pointer: "", message: "must be a JSON object" }]);
        return;
      }
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

pages.jobs = async () => {
  const form = $("#job-filters");
  const params = new URLSearchParams(location.search);
  if (isAdmin()) form.querySelectorAll(".admin-only").forEach((n) => { n.hidden = false; });
  const models = (await api("GET", "/v1/models")).data.models;
  $("#f-model").append(...models.map((m) => el("option", { value: m.model_name }, m.model_name)));
  for (const k of ["model", "state", "tenant", "since", "until"]) if (params.get(k)) form.elements[k].value = params.get(k);
  const query = () => {
    const q = new URLSearchParams();
    for (const k of ["model", "state", "tenant"]) if (form.elements[k].value) q.set(k, form.elements[k].value);
    for (const k of ["since", "until"]) if (form.elements[k].value) q.set(k, new Date(form.elements[k].value).toISOString());
    return q;
  };
  let cursor = null;
  const load = async (append) => {
    const q = query();
    q.set("limit", "50");
    if (append && cursor) q.set("cursor", cursor);
    const r = await api("GET", "/v1/jobs?" + q.toString());
    if (r.status !== 200) { flash(r.data.error + " " + JSON.stringify(r.data.errors || "")); return; }
    const rows = r.data.jobs.map((j) => el("tr", { "data-job": j.job_id },
      el("td", {}, el("a", { href: "/console/jobs/" + encodeURIComponent(j.job_id) }, j.job_id)),
      el("td", {}, j.model), el("td", { class: "state-" + j.state }, j.state), el("td", {}, fmtTime(j.created_at)),
      el("td", {}, (j.elapsed_ms / 1000).toFixed(1) + " s"), el("td", {}, j.attempt)));
    const tbody = $("#jobs-table tbody");
    if (append) tbody.append(...rows); else tbody.replaceChildren(...rows);
    cursor = r.data.next_cursor;
    $("#more").hidden = !cursor;
  };
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    history.replaceState(null, "", "?" + new URLSearchParams([...new FormData(form)].filter(([, v]) => v)).toString());
    load(false);
  });
  $("#more").addEventListener("click", () => load(true));
  await load(false);
};

const EXT = { "application/json": "json", "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "text/plain": "txt" };

async function showResult(job) {
  const box = $("#result");
  const resp = await fetch(job.result_url, { headers: { Authorization: "Bearer " + sessionStorage.getItem(KEY) }, credentials: "omit" });
  if (resp.status !== 200) { box.replaceChildren(el("p", { class: "error" }, `result: HTTP ${resp.status}`)); return; }
  const ctype = (resp.headers.get("Content-Type") || "application/octet-stream").split(";")[0].trim();
  const blob = await resp.blob();
  const url = URL.createObjectURL(blob);
  let preview;
  if (ctype === "application/json" || ctype.endsWith("+json")) {
    const text = await blob.text();
    try { preview = el("pre", { id: "result-json" }, JSON.stringify(JSON.parse(text), null, 2)); } catch (e) { preview = el("pre", {}, text); }
  } else if (ctype.startsWith("image/")) {
    preview = el("img", { id: "result-image", src: url, alt: "result image" });
  } else if (ctype.startsWith("text/")) {
    preview = el("pre", {}, (await blob.text()).slice(0, 20000));
  } else {
    preview = el("p", { class: "hint" }, `${ctype}, ${blob.size} bytes`);
  }
  box.replaceChildren(preview, el("p", {}, el("a", { id: "download", href: url, download: `${job.job_id}.${EXT[ctype] || "bin"}` },
    `Download (${ctype}, ${blob.size} bytes)`)));
}

pages.job = async () => {
  const id = document.body.dataset.jobId;
  let shown = false;
  const tick = async () => {
    const r = await api("GET", "/v1/jobs/" + encodeURIComponent(id));
    if (r.status !== 200) { flash(r.data.error); return true; }
    const j = r.data;
    const rows = [["Job", j.job_id], ["Model", j.model], ["State", j.state], ["Internal state", j.internal_state],
      ["Tenant", j.tenant], ["Attempt", j.attempt], ["Retries", j.retry_count], ["Elapsed", (j.elapsed_ms / 1000).toFixed(2) + " s"],
      ["Error", j.error || ""], ["Payload", JSON.stringify(j.payload)]];
    $("#job-fields").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k.toLowerCase() }, v)]));
    $("#timeline").replaceChildren(...j.timeline.map((e) => el("li", { "data-event": e.event },
      el("strong", {}, e.event), ` ${fmtTime(e.at)} `, e.detail)));
    const cancel = $("#cancel-job");
    cancel.hidden = TERMINAL.has(j.state);
    cancel.onclick = async () => { const c = await api("POST", j.poll_url + "/cancel"); flash(c.data.error || "Canceled.", !c.data.error); tick(); };
    if (j.state === "done" && !shown) { shown = true; await showResult(j); }
    return TERMINAL.has(j.state);
  };
  if (!(await tick())) {
    const t = setInterval(async () => { if (await tick()) clearInterval(t); }, 1000);
  }
};

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page !== "login") {
    if (!sessionStorage.getItem(KEY)) { toLogin(); return; }
    $("#whoami").textContent = isAdmin() ? "admin" : "user";
    $("#logout").addEventListener("click", () => { sessionStorage.clear(); location.href = "/console/login"; });
    if (isAdmin()) document.querySelectorAll(".admin-only").forEach((n) => { n.hidden = false; });
  }
  const init = pages[page];
  if (init) Promise.resolve().then(init).catch((e) => flash(String(e.message || e)));
});
