// The group-chat page of `mascot chat RUN --web`: one conversation per tab, replies streamed as
// server-sent events (the same events the terminal renders), /why as a click on a reply. All model
// text is set as textContent, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
let group = null;      // GET /api/group
let session = null;    // this tab's conversation id
let busy = false;
const directives = new Map();  // reply or guard answer element -> the rows of its /why
// The server takes only JSON POSTs from this page (cli/web/guard.py), even those with nothing to say.
const JSON_POST = {method: "POST", headers: {"Content-Type": "application/json"}, body: "{}"};

function personaOf(id) {
  return group.personas.find((p) => p.id === id) || {id, name: id, color: "#888", role: ""};
}

function add(kind, text, speaker) {
  const item = document.createElement("li");
  item.className = "msg " + kind;
  if (speaker) {
    const persona = personaOf(speaker);
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = persona.name;
    who.style.color = persona.color;
    item.style.borderLeftColor = persona.color;
    item.dataset.speaker = speaker;
    item.append(who);
  } else if (kind === "crisis") {
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = "Safety guard";
    item.append(who);
  }
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text || "";
  item.append(body);
  $("messages").append(item);
  item.scrollIntoView({block: "end"});
  return item;
}

function directiveRows(d) {
  return [
    ["speaker", personaOf(d.speaker).name],
    ["instruction", d.instruction],
    ["tone", d.tone || "(none)"],
    ["fallback", d.fallback ? "yes: the Director gave no valid directive" : "no"],
    ["attempts", String(d.attempts)],
  ];
}

function guardRows(entry) {  // as CrisisEntry.reasons() in mascot/chat/transcript.py
  const rows = (entry.categories || []).map((c) => ["category", c]);
  if ((entry.rules || []).length) rows.push(["rules", entry.rules.join(", ")]);
  if (entry.classifier_score != null) rows.push(["classifier", "score " + entry.classifier_score.toFixed(2)]);
  const m = entry.moderation;
  if (m) rows.push([m.kind, m.error ? `failed, so flagged (${m.error})`
    : `${m.flagged ? "flagged" : "not flagged"}: ${m.categories.join(", ") || "safe"}`]);
  return rows;
}

function showWhy(item) {
  document.querySelectorAll(".msg.selected").forEach((el) => el.classList.remove("selected"));
  item.classList.add("selected");
  const rows = directives.get(item);
  const list = document.createElement("dl");
  for (const [term, value] of rows) {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    dd.textContent = value;
    list.append(dt, dd);
  }
  $("why").replaceChildren(list);
  $("why").classList.remove("dim");
}

function finishReply(item, entry) {
  item.classList.remove("streaming");
  item.querySelector(".text").textContent = entry.text;
  directives.set(item, directiveRows(entry.directive));
  item.addEventListener("click", () => showWhy(item));
  const notes = [];
  if (entry.withheld) notes.push("withheld by the safety guard");
  else if (entry.discarded) notes.push(entry.discarded + " draft(s) discarded by the safety guard");
  if (notes.length) {
    const note = document.createElement("span");
    note.className = "note";
    note.textContent = notes.join("; ");
    item.append(note);
  }
}

function addCrisis(entry) {  // the guard's answer; a click shows why (its categories and rules)
  const item = add("crisis", entry.text);
  directives.set(item, guardRows(entry));
  item.addEventListener("click", () => showWhy(item));
}

function render(entry) {  // a transcript entry (replay)
  if (entry.type === "user") add("user", entry.text);
  else if (entry.type === "crisis") addCrisis(entry);
  else if (entry.type === "reset") add("reset", "A new conversation.");
  else if (entry.type === "reply") finishReply(add("reply", "", entry.speaker), entry);
}

async function send(text) {
  busy = true;
  $("send").disabled = true;
  $("error").textContent = "";
  let streaming = null;
  const response = await fetch(`/api/sessions/${session}/messages`, {
    method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({text, turns: Number($("turns").value)}),
  });
  if (!response.ok) {
    const problem = await response.json().catch(() => ({}));
    $("error").textContent = problem.detail || `the server answered ${response.status}`;
    busy = false;
    $("send").disabled = false;
    return false;
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!frame.startsWith("data: ")) continue;
      const event = JSON.parse(frame.slice(6));
      if (event.type === "user") add("user", event.text);
      else if (event.type === "crisis") addCrisis(event);
      else if (event.type === "directive") {
        $("status").textContent = personaOf(event.speaker).name + " is replying…";
        streaming = add("reply streaming", "", event.speaker);
      } else if (event.type === "delta") streaming.querySelector(".text").textContent += event.text;
      else if (event.type === "discard") streaming.querySelector(".text").textContent = "";
      else if (event.type === "reply") { finishReply(streaming, event); streaming.scrollIntoView({block: "end"}); }
      else if (event.type === "error") $("error").textContent = event.message;
    }
  }
  $("status").textContent = "";
  busy = false;
  $("send").disabled = false;
  return true;
}

async function download(format) {
  const url = group.replay ? `/api/replay?format=${format}` : `/api/sessions/${session}/transcript?format=${format}`;
  const blob = await (await fetch(url)).blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = "transcript." + format;
  document.body.append(link);
  link.click();
  link.remove();
}

async function start() {
  group = await (await fetch("/api/group")).json();
  $("title").textContent = group.group;
  $("run").textContent = group.replay ? `replay of a conversation with ${group.run}` : `trained in ${group.run}`;
  $("notice").textContent = group.notice;
  for (const persona of group.personas) {
    const item = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = persona.color;
    const name = document.createElement("strong");
    name.textContent = persona.name;
    item.append(swatch, name, document.createTextNode(", " + persona.role));
    item.dataset.persona = persona.id;
    $("roster").append(item);
  }
  $("download-json").addEventListener("click", () => download("json"));
  $("download-md").addEventListener("click", () => download("md"));
  if (group.replay) {
    document.body.classList.add("replay");
    const transcript = await (await fetch("/api/replay?format=json")).json();
    transcript.entries.forEach(render);
    return;
  }
  for (let turns = 1; turns <= group.max_turns; turns++) {
    $("turns").append(new Option(String(turns), String(turns), false, turns === group.turns));
  }
  const opened = await fetch("/api/sessions", JSON_POST);
  if (!opened.ok) {
    $("error").textContent = (await opened.json()).detail;
    $("send").disabled = true;
    return;
  }
  session = (await opened.json()).id;
  // keepalive: the request outlives the page (sendBeacon cannot send the JSON type the server requires)
  window.addEventListener("pagehide", () => fetch(`/api/sessions/${session}/close`, {...JSON_POST, keepalive: true}));
  const input = $("input");
  const count = () => { $("count").textContent = `${input.value.length}/${group.max_message_chars}`; };
  input.addEventListener("input", count);
  count();
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("composer").requestSubmit(); }
  });
  $("composer").addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || busy) return;
    if (await send(text)) { input.value = ""; count(); }
  });
  $("reset").addEventListener("click", async () => {
    if (busy) return;
    await fetch(`/api/sessions/${session}/reset`, JSON_POST);
    add("reset", "A new conversation.");
  });
}

start().catch((error) => { $("error").textContent = "could not start: " + error; });
