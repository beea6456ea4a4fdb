// The oploop web view: a sessions list (live through /api/events) and a session view (SSE, rendered in
// batches once per animation frame, so thousands of deltas a second cost one layout).
//
// A model's text is Markdown: rendered by marked and inserted only as DOMPurify returns it
// (both vendored in /static/vendor/, see README.md there). Everything else (prompts, tool
// inputs and outputs, errors) is inserted as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const INPUT_SHOWN = 400;    // characters of a tool's input shown before "more"
const OUTPUT_SHOWN = 2000;  // ... and of its output
const FRAME_BUDGET_MS = 12; // work per frame before yielding to the browser
const MD_BIG = 20_000;      // a text longer than this is rendered again at most every MD_EVERY_MS
const MD_EVERY_MS = 250;

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.message || `${resp.status} ${resp.statusText}`);
  return data;
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// -- numbers and times for people ------------------------------------------------------

// A time in seconds since the epoch, or null (the summary's fields may be absent or null).
function epoch(ts) {
  return typeof ts === "number" && Number.isFinite(ts) && ts > 0 ? ts : null;
}

function ago(ts) {
  if (epoch(ts) === null) return "";
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  if (s < 7 * 86400) return `${Math.round(s / 86400)} d ago`;
  return new Date(ts * 1000).toLocaleDateString();
}

// A <time> saying how long ago `ts` was, the absolute time on hover.
function agoCell(ts) {
  const node = el("time", "ago", ago(ts));
  if (epoch(ts) !== null) {
    const at = new Date(ts * 1000);
    node.title = at.toLocaleString();
    node.dateTime = at.toISOString();
  }
  return node;
}

// An event's time of day (HH:MM:SS), the full date on hover.
function stamp(ts) {
  const node = el("time", "at");
  if (epoch(ts) === null) return node;
  const at = new Date(ts * 1000);
  node.textContent = at.toLocaleTimeString([], { hour12: false });
  node.title = at.toLocaleString();
  node.dateTime = at.toISOString();
  return node;
}

function duration(s) {
  if (typeof s !== "number" || !Number.isFinite(s) || s < 0) return "";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

function count(n) {  // as the CLI's short_count: 950, 12.3k, 4.1M
  if (n < 1000) return String(n);
  if (n < 1e6) return `${(n / 1000).toFixed(1).replace(/\.0$/, "")}k`;
  return `${(n / 1e6).toFixed(1).replace(/\.0$/, "")}M`;
}

function tokensOf(u) {
  if (!u || typeof u !== "object") return 0;
  return (u.input_tokens || 0) + (u.output_tokens || 0) +
    (u.cache_creation_input_tokens || 0) + (u.cache_read_input_tokens || 0);
}

function money(cost) {  // as the CLI's: "" when unknown (a model with no price)
  if (typeof cost !== "number") return "";
  if (cost === 0) return "$0.00";
  return cost < 0.01 ? `$${cost.toFixed(4)}` : `$${cost.toFixed(2)}`;
}

// "12.3k tokens (10k in · 2.3k out) · $0.04"
function usageLine(u) {
  if (!u || typeof u !== "object") return "";
  const cost = money(u.cost_usd);
  return `${count(tokensOf(u))} tokens (${count(u.input_tokens || 0)} in · ` +
    `${count(u.output_tokens || 0)} out)` + (cost ? ` · ${cost}` : "");
}

// A <pre> showing at most `limit` characters, with a button to show the rest.
function truncated(text, limit) {
  const pre = el("pre");
  if (text.length <= limit) {
    pre.textContent = text;
    return pre;
  }
  pre.textContent = text.slice(0, limit) + "…";
  const wrap = el("div");
  const more = el("button", "more", `show all (${text.length} chars)`);
  more.type = "button";
  more.onclick = () => { pre.textContent = text; more.remove(); };
  wrap.append(pre, more);
  return wrap;
}

// -- Markdown --------------------------------------------------------------------------

const MARKDOWN = typeof marked === "object" && typeof DOMPurify === "function" &&
  DOMPurify.isSupported;
if (MARKDOWN) {
  // Links a model wrote open elsewhere, and pass neither the page nor its address on.
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
}

// Render `div.raw` (a model's text) into `div`: sanitised HTML, or plain text without
// the libraries.
function renderMarkdown(div) {
  div.mdAt = performance.now();
  div.mdDue = false;
  if (!MARKDOWN) {
    div.textContent = div.raw;
    return;
  }
  const html = marked.parse(div.raw, { gfm: true, async: false });
  div.replaceChildren(DOMPurify.sanitize(html, { RETURN_DOM_FRAGMENT: true }));
}

// -- the sessions list -----------------------------------------------------------------

let listed = [];  // the sessions as last fetched

// How long a session has run: its finished runs, and the open one so far.
function sessionDuration(s) {
  let d = typeof s.duration_s === "number" ? s.duration_s : 0;
  if (s.state === "running" && epoch(s.run_started) !== null) {
    d += Math.max(0, Date.now() / 1000 - s.run_started);
  }
  return d;
}

function filtered() {
  const q = $("search").value.trim().toLowerCase();
  const state = $("filter-state").value;
  const agent = $("filter-agent").value;
  return listed.filter((s) =>
    (!state || s.state === state) && (!agent || s.agent === agent) &&
    (!q || `${s.title ?? ""} ${s.session} ${s.agent}`.toLowerCase().includes(q)));
}

function listRow(s) {
  const tr = el("tr");
  tr.dataset.session = s.session;
  const title = el("td", "title");
  const link = el("a", "", s.title || "(no prompt)");
  link.href = `/s/${encodeURIComponent(s.session)}`;
  title.append(link, el("span", "sid", s.session));
  const del = el("button", "delete", "Delete");
  del.type = "button";
  del.disabled = s.state === "running";
  del.title = del.disabled ? "running: cancel it first" : "delete the session and its events";
  del.onclick = () => deleteSession(s.session);
  const cost = money(s.usage?.cost_usd);
  const state = el("span", "", "");
  state.append(el("span", `state ${s.state}`, s.state));
  if (s.state !== "running" && (s.last_end === "ERROR" || s.last_end === "CANCELLED")) {
    state.append(el("span", `ended ${s.last_end}`, ` ${s.last_end.toLowerCase()}`));
  }
  const unpriced = el("span", "muted", "?");
  unpriced.title = "no price known for this model";
  const cells = [state, s.agent, agoCell(s.started ?? s.created),
    duration(sessionDuration(s)), s.turns, count(tokensOf(s.usage)), cost || unpriced, del];
  tr.append(title);
  for (const c of cells) {
    const td = el("td");
    if (c instanceof Node) td.append(c); else td.textContent = c ?? "";
    tr.append(td);
  }
  return tr;
}

function drawList() {
  // The agents offered by the filter: those listed (the choice kept while it exists).
  const pick = $("filter-agent");
  const agents = [...new Set(listed.map((s) => s.agent))].sort();
  const have = [...pick.options].slice(1).map((o) => o.value);
  if (agents.join("\n") !== have.join("\n")) {
    const chosen = pick.value;
    pick.replaceChildren(el("option", "", "every agent"),
      ...agents.map((a) => { const o = el("option", "", a); o.value = a; return o; }));
    pick.options[0].value = "";
    pick.value = agents.includes(chosen) ? chosen : "";
  }
  const shown = filtered();
  $("sessions").tBodies[0].replaceChildren(...shown.map(listRow));
  $("no-sessions").hidden = listed.length > 0;
  $("none-match").hidden = !listed.length || shown.length > 0;
  $("list-count").textContent = listed.length
    ? `${shown.length} of ${listed.length} session${listed.length === 1 ? "" : "s"}` : "";
}

async function refreshList() {
  try {
    const { sessions } = await api("GET", "/api/sessions");
    // Newest first: by first start, the id (time-ordered) breaking ties.
    listed = sessions.sort((a, b) => ((b.started ?? b.created ?? 0) - (a.started ?? a.created ?? 0))
      || String(b.session).localeCompare(String(a.session)));
    drawList();
    $("conn").textContent = "";
  } catch (err) {
    $("conn").textContent = `host not answering: ${err.message}`;
  }
}

async function deleteSession(sid) {
  if (!confirm(`Delete session ${sid}? Its history and events are removed for good.`)) return;
  try {
    await api("DELETE", `/api/sessions/${encodeURIComponent(sid)}`);
    $("conn").textContent = `session ${sid} deleted`;
  } catch (err) {
    $("conn").textContent = err.message;
  }
  refreshList();
}

// The list is fetched again when a session changes (`/api/events` tells, at most
// every LIST_EVERY_MS), and every LIST_POLL_MS in any case (times move on).
const LIST_EVERY_MS = 250;
const LIST_POLL_MS = 5000;
let listDue = false;

function listSoon() {
  if (listDue) return;
  listDue = true;
  setTimeout(() => { listDue = false; if (!document.hidden) refreshList(); }, LIST_EVERY_MS);
}

function showList() {
  $("list-view").hidden = false;
  refreshList();
  setInterval(() => { if (!document.hidden) refreshList(); }, LIST_POLL_MS);
  const changes = new EventSource("/api/events");
  changes.onmessage = listSoon;
  changes.onopen = listSoon; // (re)connected: what changed meanwhile is listed
  for (const id of ["search", "filter-state", "filter-agent"]) $(id).oninput = drawList;
  $("start-form").onsubmit = async (e) => {
    e.preventDefault();
    const prompt = $("start-prompt").value;
    if (!prompt.trim()) return;
    try {
      const started = await api("POST", "/api/sessions", { prompt });
      location.href = started.page;
    } catch (err) {
      $("conn").textContent = err.message;
    }
  };
}

// -- one session: how each event type is shown ------------------------------------------
//
// One function per event type, `(view, ev, data)`: it adds to the current run with
// `view.add(node, ev)` (a block with the event's time) or changes what is there. A type
// with no entry is shown generically (`genericEvent`), never dropped. To show a new
// type, add one entry.

const RENDERERS = {
  SESSION_START(v, ev, d) {
    v.run = el("div", "run");
    v.run.started = ev.ts;
    v.run.usage = null;
    const head = el("div", "prompt");
    head.append(stamp(ev.ts), el("span", "", `▶ run ${d.run ?? ""}: ${d.prompt ?? ""}`));
    v.run.totals = el("div", "totals", "running…");
    v.run.append(head, v.run.totals);
    v.log.append(v.run);
    v.text = v.thinking = null;
    v.setState("running");
  },
  ROUTE(v, ev, d) {
    v.add(el("div", "turn", `route: ${d.route ?? "?"}${d.reason ? ` (${d.reason})` : ""}`), ev);
  },
  TURN_START(v, ev) {
    v.add(el("div", "turn", `turn ${ev.turn}`), ev);
  },
  TOKEN(v, ev, d) {
    if (!v.text) { // a block: its time, and the text's Markdown rendered in `.md`
      const div = el("div", "text");
      const body = el("div", "md");
      body.raw = "";
      div.append(body);
      v.add(div, ev);
      v.text = body;
    }
    v.text.raw += d.text || "";
    v.dirty.add(v.text);
  },
  THINKING(v, ev, d) {
    if (!v.thinking) {
      const box = el("details", "thinking");
      box.append(el("summary", "", "thinking"));
      const div = el("div");
      v.add(box, ev);
      v.thinking = document.createTextNode("");
      div.append(v.thinking);
      box.append(div);
    }
    v.thinking.appendData(d.text || "");
  },
  TOOL_START(v, ev, d) {
    const box = el("div", "tool running");
    const head = el("div", "head");
    box.label = el("span", "", `⚙ ${d.name} `);
    box.status = el("span", "status", "running");
    box.elapsed = el("span", "elapsed");
    head.append(box.label, box.status, box.elapsed);
    box.started = epoch(ev.ts) ?? Date.now() / 1000;
    box.append(head, truncated(JSON.stringify(d.input ?? {}), INPUT_SHOWN));
    v.tools.set(d.tool_use_id, box);
    v.add(box, ev);
    v.tick();
  },
  TOOL_OUTPUT(v, ev, d) { // what a running tool prints, streamed into its card (as text)
    const box = v.tools.get(d.call_id);
    if (!box) return; // its start was before the replay we have: its end shows the output
    if (!box.live) {
      box.live = el("details", "live");
      box.live.open = true;
      box.live.append(el("summary", "", "output as it came"), el("pre"));
      box.append(box.live);
    }
    box.live.lastChild.append(el("span", `stream-${d.stream}`, d.text || ""));
  },
  TOOL_END(v, ev, d) {
    let box = v.tools.get(d.tool_use_id);
    v.tools.delete(d.tool_use_id);
    if (!box) { // its start was before the replay we have (or pruned)
      box = el("div", "tool");
      const head = el("div", "head");
      box.label = el("span", "", `⚙ ${d.name} `);
      box.status = el("span", "status");
      box.elapsed = el("span", "elapsed");
      head.append(box.label, box.status, box.elapsed);
      box.append(head);
      v.add(box, ev);
    }
    box.classList.remove("running");
    box.status.textContent = d.is_error ? "failed" : "ok";
    box.elapsed.textContent = typeof d.duration_ms === "number"
      ? ` · ${duration(d.duration_ms / 1000)}` : "";
    if (d.is_error) box.classList.add("error");
    const out = truncated(String(d.output ?? ""), OUTPUT_SHOWN);
    out.classList.add("output");
    box.append(out);
    v.text = v.thinking = null;
  },
  APPROVAL_REQUESTED(v, ev, d) { // a call under an `ask` rule waits for a person
    const box = el("div", "ask");
    const head = el("div", "head", `? ${d.tool} waits for approval` +
      (d.rule ? ` (rule ${d.rule})` : ""));
    const buttons = el("div", "buttons");
    for (const [label, decision, always] of [["Approve", "approve", false],
      [`Always allow ${d.tool}`, "approve", true], ["Deny", "deny", false]]) {
      const b = el("button", decision, label);
      b.type = "button";
      b.onclick = () => v.decide(d.call_id, decision, always, box);
      buttons.append(b);
    }
    box.append(head, truncated(JSON.stringify(d.input ?? {}), INPUT_SHOWN), buttons);
    box.head = head;
    box.buttons = buttons;
    box.dataset.call = d.call_id;
    v.asks.set(d.call_id, box);
    v.add(box, ev);
  },
  ELICITATION_REQUESTED(v, ev, d) { // an MCP server asks the operators: a form from its schema
    const box = el("form", "ask elicit");
    box.dataset.elicit = String(d.id);
    box.append(el("div", "head", `? MCP server ${d.server} asks: ${d.message ?? ""} [${d.id}]`));
    if (d.url) box.append(el("div", "url", `open ${d.url}`));
    const schema = d.schema && typeof d.schema === "object" ? d.schema : {};
    const required = new Set(Array.isArray(schema.required) ? schema.required : []);
    const fields = [];
    for (const [name, raw] of Object.entries(schema.properties || {})) {
      const f = raw && typeof raw === "object" ? raw : {};
      const choices = Array.isArray(f.enum) ? f.enum
        : (f.oneOf || f.anyOf || f.items?.enum || f.items?.anyOf || []).map((o) => o?.const ?? o);
      let input;
      if (f.type === "boolean") {
        input = el("input");
        input.type = "checkbox";
        input.checked = f.default === true;
      } else if (choices.length && f.type !== "array") {
        input = el("select");
        for (const c of choices) input.append(Object.assign(el("option", "", String(c)), { value: String(c) }));
        if (f.default !== undefined) input.value = String(f.default);
      } else {
        input = el("input");
        input.type = f.type === "number" || f.type === "integer" ? "number" : "text";
        if (f.type === "number") input.step = "any";
        if (f.type === "array") input.placeholder = `comma-separated: ${choices.join(", ")}`;
        if (f.default !== undefined) input.value = [].concat(f.default).join(",");
      }
      input.name = name;
      const label = el("label", "field", `${f.title || name}${required.has(name) ? " *" : ""} `);
      if (f.description) label.title = f.description;
      label.append(input);
      box.append(label);
      fields.push([name, f, input]);
    }
    const buttons = el("div", "buttons");
    const notice = el("div", "why");
    const send = async (action) => { // checked by the host against the form (400 names the field)
      const content = {};
      for (const [name, f, input] of action === "accept" ? fields : []) {
        if (f.type === "boolean") content[name] = input.checked;
        else if (input.value !== "") content[name] = f.type === "array"
          ? input.value.split(",").map((x) => x.trim()).filter(Boolean) : input.value;
      }
      for (const b of buttons.children) b.disabled = true;
      try {
        await api("POST", `/api/sessions/${encodeURIComponent(v.sid)}/answer`, { id: d.id, action, content });
        notice.textContent = ""; // ELICITATION_ANSWERED, on the stream, closes the form
      } catch (err) {
        for (const b of buttons.children) b.disabled = false;
        notice.textContent = err.message;
      }
    };
    for (const [label, action] of [["Send", "accept"], ["Decline", "decline"], ["Cancel", "cancel"]]) {
      const b = el("button", action, label);
      b.type = "button";
      b.onclick = () => send(action);
      buttons.append(b);
    }
    box.onsubmit = (e) => { e.preventDefault(); send("accept"); };
    box.append(buttons, notice);
    v.add(box, ev);
  },
  ELICITATION_ANSWERED(v, ev, d) {
    const line = `${d.action} by ${d.by}` + (d.fields?.length ? ` (${d.fields.join(", ")})` : "") +
      (d.reason ? `: ${d.reason}` : "");
    const box = document.querySelector(`form.elicit[data-elicit="${CSS.escape(String(d.id))}"]`);
    if (!box) {
      v.add(el("div", "ask answered", `? ${line} [${d.id}]`), ev);
      return;
    }
    box.querySelector(".buttons")?.remove();
    for (const input of box.querySelectorAll("input, select")) input.disabled = true;
    box.querySelector(".head").textContent += ` — ${line}`;
    box.classList.add("answered");
  },
  APPROVAL_DECIDED(v, ev, d) {
    const box = v.asks.get(d.call_id);
    v.asks.delete(d.call_id);
    const verb = d.decision === "approve" ? "approved" : "denied";
    const line = `${verb} by ${d.by}` + (d.always ? `, always for ${d.always}` : "") +
      (verb === "denied" && d.reason ? `: ${d.reason}` : "");
    if (box) {
      box.buttons.remove();
      box.head.textContent += ` — ${line}`;
      box.classList.add(verb);
    } else {
      v.add(el("div", `ask ${verb}`, `? ${line} [${d.call_id}]`), ev);
    }
  },
  USER_MESSAGE(v, ev, d) { // said into the running run: the model reads it next
    const said = el("div", "said");
    said.append(el("span", "by", `✉ ${d.by ?? "?"}: `), el("span", "", d.text ?? ""));
    v.add(said, ev);
  },
  MACHINE_EVENT(v, ev, d) { // an event of the run ask_machine started on another host
    const inner = d.event && typeof d.event === "object" ? d.event : {};
    const id = inner.data && typeof inner.data === "object" ? inner.data : {};
    const what = {
      SESSION_START: () => `session ${d.session ?? "?"} started`,
      TOKEN: () => id.text ?? "",
      THINKING: () => `(thinking) ${id.text ?? ""}`,
      TOOL_START: () => `⚙ ${id.name} ${JSON.stringify(id.input ?? {}).slice(0, INPUT_SHOWN)}`,
      TOOL_END: () => `⚙ ${id.name} ${id.is_error ? "failed" : "ok"}: ` +
        String(id.output ?? "").slice(0, 200),
      RETRY: () => `↻ retry ${id.attempt}: ${id.error}`,
      DONE: () => `DONE — ${String(id.text ?? "").slice(0, 200)}`,
      ERROR: () => `ERROR — ${id.error}: ${id.message}`,
      CANCELLED: () => `CANCELLED (${id.mode})${id.reason ? ": " + id.reason : ""}`,
    }[inner.type];
    if (!what) return; // (TURN_START, TURN_END, ...: not worth a line)
    const line = el("div", "machine");
    line.append(el("span", "by", `[${d.machine ?? "?"}] `), el("span", "", what()));
    if (d.dropped) line.append(el("span", "by", ` (${d.dropped} events not shown)`));
    v.add(line, ev);
  },
  RETRY(v, ev, d) {
    v.add(el("div", "retry", `↻ retry ${d.attempt}: ${d.error} (waiting ${d.wait_s} s)`), ev);
  },
  COMPACTED(v, ev, d) { // the requests' view of the history shrank (the log keeps all)
    v.add(el("div", "retry",
      `⇣ compacted (${d.by}): ${d.before_tokens} → ${d.after_tokens} tokens, ` +
      `${d.cleared_results} results cleared, ${d.summarised_turns} turns summarised` +
      (d.note ? ` — ${d.note}` : "")), ev);
  },
  RESUMED(v, ev, d) {
    v.add(el("div", "retry", `↺ resumed${d.reason ? ` (${d.reason})` : ""}`), ev);
  },
  STORE_UNAVAILABLE(v, ev, d) {
    v.add(el("div", "retry", `⏸ the store was unavailable: the session waited` +
      (d.error ? ` (${d.error})` : "")), ev);
  },
  STORE_AVAILABLE(v, ev, d) {
    const down = typeof d.down_s === "number" ? ` after ${d.down_s.toFixed(1)} s` : "";
    v.add(el("div", "retry", `▶ the store is back${down}: the session goes on`), ev);
  },
  TURN_END(v, ev, d) {
    const u = d.usage;
    if (!u || typeof u !== "object") return;
    const cost = money(u.cost_usd);
    v.add(el("div", "turn", `tokens: ${u.input_tokens ?? 0} in, ${u.output_tokens ?? 0} out` +
      (cost ? ` · ${cost}` : "")), ev);
    const run = v.part();
    run.usage = addUsage(run.usage, u);
    run.totals.textContent = `so far: ${usageLine(run.usage)}`;
  },
  DONE: terminal,
  ERROR: terminal,
  CANCELLED: terminal,
};

function addUsage(a, b) {
  if (!a) return { ...b };
  const out = {};
  for (const k of ["input_tokens", "output_tokens", "cache_creation_input_tokens",
    "cache_read_input_tokens"]) out[k] = (a[k] || 0) + (b[k] || 0);
  out.cost_usd = typeof a.cost_usd === "number" && typeof b.cost_usd === "number"
    ? a.cost_usd + b.cost_usd : null;
  return out;
}

// A run's end: what ended it, and the run's totals (its event carries them).
function terminal(v, ev, d) {
  const what = ev.type === "DONE" ? `done in ${d.turns} turns (${d.stop})`
    : ev.type === "ERROR" ? `error: ${d.error}: ${d.message}`
    : `cancelled (${d.mode})${d.reason ? ": " + d.reason : ""}`;
  v.add(el("div", `terminal ${ev.type}`, `${ev.type} — ${what}`), ev);
  const run = v.part();
  const took = epoch(run.started) !== null && epoch(ev.ts) !== null
    ? duration(ev.ts - run.started) : "";
  const usage = d.usage && typeof d.usage === "object" ? d.usage : run.usage;
  run.totals.textContent = ["run total:", usageLine(usage) || "no model call",
    took && `· ${took}`].filter(Boolean).join(" ");
  for (const box of v.tools.values()) box.classList.remove("running");
  v.tools.clear();
  for (const box of v.asks.values()) { // the run ended: nothing waits any more
    box.buttons.remove();
    box.head.textContent += " — not decided (the run ended)";
  }
  v.asks.clear();
  v.setState("idle");
}

// A type the page has no renderer for: its name and data, as text.
function genericEvent(v, ev, d) {
  const box = el("div", "event");
  box.append(el("span", "kind", ev.type ?? "?"));
  box.append(truncated(JSON.stringify(d), INPUT_SHOWN));
  v.add(box, ev);
}

// -- one session -------------------------------------------------------------------------

class SessionView {
  constructor(sid) {
    this.sid = sid;
    this.log = $("log");
    this.queue = [];       // events received, not yet rendered
    this.scheduled = false;
    this.run = null;       // the current run's element
    this.text = null;      // the element streamed text goes to (null: start one)
    this.thinking = null;  // the Text node streamed thinking is appended to
    this.dirty = new Set(); // text elements whose Markdown is to be rendered again
    this.tools = new Map(); // tool_use_id -> element awaiting its TOOL_END
    this.asks = new Map();  // call_id -> element of a call waiting for approval
    this.running = false;
    this.lastSeq = 0;
    this.rendered = 0;
  }

  open() {
    $("session-view").hidden = false;
    $("sid").textContent = this.sid;
    document.title = `oploop ${this.sid}`;
    $("cancel-ui").onclick = () => this.cancel("ui");
    $("cancel-op").onclick = () => this.cancel("operation");
    $("follow-form").onsubmit = (e) => { e.preventDefault(); this.followUp(); };
    this.setState("…");
    setInterval(() => this.tick(), 1000); // running tools' elapsed time
    // EventSource reconnects by itself with Last-Event-ID: the gateway resumes after it.
    this.source = new EventSource(`/api/sessions/${encodeURIComponent(this.sid)}/events`);
    this.source.onmessage = (msg) => {
      this.queue.push(msg.data);
      if (!this.scheduled) {
        this.scheduled = true;
        requestAnimationFrame(() => this.flush());
      }
    };
    this.source.onerror = () => {
      $("conn").textContent = this.source.readyState === EventSource.CLOSED
        ? "stream closed" : "reconnecting…";
    };
    this.source.onopen = () => { $("conn").textContent = ""; };
    // Deleted (`oploop rm`, retention): said once, and the stream is not reopened.
    this.source.addEventListener("removed", () => {
      this.source.close();
      this.setState("removed");
      $("conn").textContent = "";
      $("notice").textContent = `session ${this.sid} was removed`;
    });
    api("GET", `/api/sessions/${encodeURIComponent(this.sid)}`).then(
      ({ session }) => {
        this.setState(session.state);
        if (session.title) {
          $("title").textContent = session.title;
          document.title = `oploop ${this.sid}: ${session.title}`;
        }
      },
      (err) => { $("notice").textContent = err.message; this.source.close(); });
  }

  // Render what arrived since the last frame (within a time budget: the rest waits
  // for the next frame), then the texts' Markdown, then scroll once.
  flush() {
    this.scheduled = false;
    const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
    const end = performance.now() + FRAME_BUDGET_MS;
    let i = 0;
    for (; i < this.queue.length; i++) {
      const ev = JSON.parse(this.queue[i]);
      if (ev.seq <= this.lastSeq) continue; // never twice (the gateway resumes after it)
      this.lastSeq = ev.seq;
      this.render(ev);
      this.rendered++;
      if ((i & 63) === 63 && performance.now() > end) { i++; break; }
    }
    this.queue = i >= this.queue.length ? [] : this.queue.slice(i);
    this.markdown(this.queue.length > 0);
    if (this.queue.length && !this.scheduled) {
      this.scheduled = true;
      requestAnimationFrame(() => this.flush());
    }
    this.log.dataset.seq = String(this.lastSeq);
    if (atBottom) window.scrollTo(0, document.body.scrollHeight);
  }

  // Render the changed texts. A long one is rendered again at most every MD_EVERY_MS
  // (and once more when it stops changing), so a 100 kB reply streamed costs little.
  markdown(moreQueued) {
    const now = performance.now();
    for (const div of this.dirty) {
      if (div.raw.length > MD_BIG && now - (div.mdAt || 0) < MD_EVERY_MS) {
        if (!div.mdDue && !moreQueued) {
          div.mdDue = true;
          setTimeout(() => { if (div.mdDue) { renderMarkdown(div); this.dirty.delete(div); } },
            MD_EVERY_MS);
        }
        continue;
      }
      renderMarkdown(div);
      this.dirty.delete(div);
    }
  }

  render(ev) {
    const d = ev.data && typeof ev.data === "object" ? ev.data : {};
    (RENDERERS[ev.type] || genericEvent)(this, ev, d);
  }

  // Append a block to the current run, with the event's time; streamed text and
  // thinking start anew after it.
  add(node, ev) {
    node.prepend(stamp(ev.ts));
    this.part().append(node);
    this.text = this.thinking = null;
    return node;
  }

  part() {
    if (!this.run) { // joined after the run's start (it was pruned or came before)
      this.run = el("div", "run");
      this.run.totals = el("div", "totals");
      this.run.append(this.run.totals);
      this.log.append(this.run);
    }
    return this.run;
  }

  // The elapsed time of each running tool.
  tick() {
    const now = Date.now() / 1000;
    for (const box of this.tools.values()) {
      box.elapsed.textContent = ` · ${duration(Math.max(0, now - box.started))}`;
    }
  }

  setState(state) {
    this.running = state === "running";
    const badge = $("state");
    badge.textContent = state;
    badge.className = `state ${state}`;
    $("cancel-ui").disabled = $("cancel-op").disabled = !this.running;
    // The box serves both states: a follow-up run when idle, a message the running
    // run reads at its next step (after the current tool results) otherwise.
    $("follow-send").textContent = this.running ? "Send message" : "Send follow-up";
    $("follow-prompt").placeholder = this.running
      ? "Message for the running session: read at its next step"
      : "Follow-up: starts the next run of this session";
  }

  async cancel(mode) {
    try {
      await api("POST", `/api/sessions/${encodeURIComponent(this.sid)}/cancel`, { mode });
      $("notice").textContent = `cancel (${mode}) sent`;
    } catch (err) {
      $("notice").textContent = err.message;
    }
  }

  async decide(callId, decision, always, box) {
    for (const b of box.buttons.children) b.disabled = true;
    const body = decision === "approve" ? { calls: [callId], always } : { calls: [callId] };
    try {
      await api("POST", `/api/sessions/${encodeURIComponent(this.sid)}/${decision}`, body);
      $("notice").textContent = ""; // APPROVAL_DECIDED, on the stream, shows the decision
    } catch (err) {
      for (const b of box.buttons.children) b.disabled = false;
      $("notice").textContent = err.message;
    }
  }

  async followUp() {
    const prompt = $("follow-prompt").value;
    if (!prompt.trim()) return;
    try {
      const sent = await api("POST", `/api/sessions/${encodeURIComponent(this.sid)}/messages`,
        { prompt });
      $("follow-prompt").value = "";
      $("notice").textContent = sent.state === "queued"
        ? "message sent: the run reads it at its next step" : "";
    } catch (err) {
      $("notice").textContent = err.message;
    }
  }
}

const match = location.pathname.match(/^\/s\/([^/]+)$/);
if (match) {
  window.oploopView = new SessionView(decodeURIComponent(match[1]));
  window.oploopView.open();
} else {
  showList();
}
