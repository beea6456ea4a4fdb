// The oploop web view: a sessions list (live through /api/events) and a session view (SSE, rendered in
// batches once per animation frame, so thousands of deltas a second cost one layout).
"use strict";

const $ = (id) => document.getElementById(id);
const INPUT_SHOWN = 400;    // characters of a tool's input shown before "more"
const OUTPUT_SHOWN = 2000;  // ... and of its output
const FRAME_BUDGET_MS = 12; // work per frame before yielding to the browser

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

function ago(ts) {
  if (!ts) return "";
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(ts * 1000).toLocaleString();
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

// -- the sessions list ---------------------------------------------------------------

let listTimer = null;

async function refreshList() {
  try {
    const { sessions } = await api("GET", "/api/sessions");
    const body = $("sessions").tBodies[0];
    const rows = sessions.map((s) => {
      const tr = el("tr");
      const link = el("a", "", s.session);
      link.href = `/s/${s.session}`;
      const state = el("span", `state ${s.state}`, s.state);
      const cells = [link, state, s.agent, s.runs, s.turns, s.last_seq, ago(s.created),
        ago(s.last_end)];
      for (const c of cells) {
        const td = el("td");
        if (c instanceof Node) td.append(c); else td.textContent = c ?? "";
        tr.append(td);
      }
      return tr;
    });
    body.replaceChildren(...rows);
    $("no-sessions").hidden = sessions.length > 0;
    $("conn").textContent = "";
  } catch (err) {
    $("conn").textContent = `host not answering: ${err.message}`;
  }
}

// The list is fetched again when a session changes (`/api/events` tells, at most
// every LIST_EVERY_MS), and every LIST_POLL_MS in any case.
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
  listTimer = setInterval(() => { if (!document.hidden) refreshList(); }, LIST_POLL_MS);
  const changes = new EventSource("/api/events");
  changes.onmessage = listSoon;
  changes.onopen = listSoon; // (re)connected: what changed meanwhile is listed
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

// -- one session ---------------------------------------------------------------------

class SessionView {
  constructor(sid) {
    this.sid = sid;
    this.log = $("log");
    this.queue = [];       // events received, not yet rendered
    this.scheduled = false;
    this.run = null;       // the current run's element
    this.text = null;      // the Text node streamed text is appended to (null: start one)
    this.thinking = null;  // the same for thinking
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
    // EventSource reconnects by itself with Last-Event-ID: the gateway resumes after it.
    this.source = new EventSource(`/api/sessions/${this.sid}/events`);
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
    api("GET", `/api/sessions/${this.sid}`).then(
      ({ session }) => this.setState(session.state),
      (err) => { $("notice").textContent = err.message; this.source.close(); });
  }

  // Render what arrived since the last frame (within a time budget: the rest waits
  // for the next frame), then scroll once.
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
    if (this.queue.length && !this.scheduled) {
      this.scheduled = true;
      requestAnimationFrame(() => this.flush());
    }
    this.log.dataset.seq = String(this.lastSeq);
    if (atBottom) window.scrollTo(0, document.body.scrollHeight);
  }

  render(ev) {
    const d = ev.data || {};
    switch (ev.type) {
      case "SESSION_START": {
        this.run = el("div", "run");
        this.run.append(el("div", "prompt", `▶ run ${d.run ?? ""}: ${d.prompt ?? ""}`));
        this.log.append(this.run);
        this.text = this.thinking = null;
        this.setState("running");
        break;
      }
      case "TURN_START":
        this.part().append(el("div", "turn", `turn ${ev.turn}`));
        this.text = this.thinking = null;
        break;
      case "TOKEN":
        if (!this.text) {
          const div = el("div", "text");
          this.text = document.createTextNode("");
          div.append(this.text);
          this.part().append(div);
          this.thinking = null;
        }
        this.text.appendData(d.text || "");
        break;
      case "THINKING":
        if (!this.thinking) {
          const box = el("details", "thinking");
          box.append(el("summary", "", "thinking"));
          const div = el("div");
          this.thinking = document.createTextNode("");
          div.append(this.thinking);
          box.append(div);
          this.part().append(box);
          this.text = null;
        }
        this.thinking.appendData(d.text || "");
        break;
      case "TOOL_START": {
        const box = el("div", "tool");
        const head = el("div", "head", `⚙ ${d.name} … running`);
        box.append(head, truncated(JSON.stringify(d.input ?? {}), INPUT_SHOWN));
        box.head = head;
        this.tools.set(d.tool_use_id, box);
        this.part().append(box);
        this.text = this.thinking = null;
        break;
      }
      case "TOOL_OUTPUT": { // what a running tool prints, streamed into its card (as text)
        const box = this.tools.get(d.call_id);
        if (!box) break; // its start was before the replay we have: its end shows the output
        if (!box.live) {
          box.live = el("details", "live");
          box.live.open = true;
          box.live.append(el("summary", "", "output as it came"), el("pre"));
          box.append(box.live);
        }
        box.live.lastChild.append(el("span", `stream-${d.stream}`, d.text || ""));
        break;
      }
      case "TOOL_END": {
        let box = this.tools.get(d.tool_use_id);
        this.tools.delete(d.tool_use_id);
        if (!box) { // its start was before the replay we have (or pruned)
          box = el("div", "tool");
          box.head = el("div", "head");
          box.append(box.head);
          this.part().append(box);
        }
        const ms = typeof d.duration_ms === "number" ? `${Math.round(d.duration_ms)} ms` : "";
        box.head.textContent = `⚙ ${d.name} ${d.is_error ? "failed" : "ok"} · ${ms}`;
        if (d.is_error) box.classList.add("error");
        const out = truncated(String(d.output ?? ""), OUTPUT_SHOWN);
        out.classList.add("output");
        box.append(out);
        this.text = this.thinking = null;
        break;
      }
      case "APPROVAL_REQUESTED": { // a call under an `ask` rule waits for a person
        const box = el("div", "ask");
        const head = el("div", "head", `? ${d.tool} waits for approval` +
          (d.rule ? ` (rule ${d.rule})` : ""));
        const buttons = el("div", "buttons");
        for (const [label, decision, always] of [["Approve", "approve", false],
          [`Always allow ${d.tool}`, "approve", true], ["Deny", "deny", false]]) {
          const b = el("button", decision, label);
          b.type = "button";
          b.onclick = () => this.decide(d.call_id, decision, always, box);
          buttons.append(b);
        }
        box.append(head, truncated(JSON.stringify(d.input ?? {}), INPUT_SHOWN), buttons);
        box.head = head;
        box.buttons = buttons;
        box.dataset.call = d.call_id;
        this.asks.set(d.call_id, box);
        this.part().append(box);
        this.text = this.thinking = null;
        break;
      }
      case "APPROVAL_DECIDED": {
        const box = this.asks.get(d.call_id);
        this.asks.delete(d.call_id);
        const verb = d.decision === "approve" ? "approved" : "denied";
        const line = `${verb} by ${d.by}` + (d.always ? `, always for ${d.always}` : "") +
          (verb === "denied" && d.reason ? `: ${d.reason}` : "");
        if (box) {
          box.buttons.remove();
          box.head.textContent += ` — ${line}`;
          box.classList.add(verb);
        } else {
          this.part().append(el("div", `ask ${verb}`, `? ${line} [${d.call_id}]`));
        }
        break;
      }
      case "USER_MESSAGE": { // said into the running run: the model reads it next
        const said = el("div", "said");
        said.append(el("span", "by", `✉ ${d.by ?? "?"}: `), el("span", "", d.text ?? ""));
        this.part().append(said);
        this.text = this.thinking = null;
        break;
      }
      case "MACHINE_EVENT": { // an event of the run ask_machine started on another host
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
        if (!what) break; // (TURN_START, TURN_END, ...: not worth a line)
        const line = el("div", "machine");
        line.append(el("span", "by", `[${d.machine ?? "?"}] `), el("span", "", what()));
        if (d.dropped) line.append(el("span", "by", ` (${d.dropped} events not shown)`));
        this.part().append(line);
        this.text = this.thinking = null;
        break;
      }
      case "RETRY":
        this.part().append(el("div", "retry",
          `↻ retry ${d.attempt}: ${d.error} (waiting ${d.wait_s} s)`));
        this.text = this.thinking = null;
        break;
      case "TURN_END": {
        const u = d.usage;
        if (u && typeof u === "object") {
          this.part().append(el("div", "turn",
            `tokens: ${u.input_tokens ?? 0} in, ${u.output_tokens ?? 0} out`));
        }
        break;
      }
      case "DONE":
      case "ERROR":
      case "CANCELLED": {
        const what = ev.type === "DONE" ? `done in ${d.turns} turns (${d.stop})`
          : ev.type === "ERROR" ? `error: ${d.error}: ${d.message}`
          : `cancelled (${d.mode})${d.reason ? ": " + d.reason : ""}`;
        this.part().append(el("div", `terminal ${ev.type}`, `${ev.type} — ${what}`));
        this.tools.clear();
        for (const box of this.asks.values()) { // the run ended: nothing waits any more
          box.buttons.remove();
          box.head.textContent += " — not decided (the run ended)";
        }
        this.asks.clear();
        this.text = this.thinking = null;
        this.setState("idle");
        break;
      }
      default:
        break;
    }
  }

  part() {
    if (!this.run) { // joined after the run's start (it was pruned or came before)
      this.run = el("div", "run");
      this.log.append(this.run);
    }
    return this.run;
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
      await api("POST", `/api/sessions/${this.sid}/cancel`, { mode });
      $("notice").textContent = `cancel (${mode}) sent`;
    } catch (err) {
      $("notice").textContent = err.message;
    }
  }

  async decide(callId, decision, always, box) {
    for (const b of box.buttons.children) b.disabled = true;
    const body = decision === "approve" ? { calls: [callId], always } : { calls: [callId] };
    try {
      await api("POST", `/api/sessions/${this.sid}/${decision}`, body);
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
      const sent = await api("POST", `/api/sessions/${this.sid}/messages`, { prompt });
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
