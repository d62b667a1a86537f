// The rating page of `mascot eval rate RUN --web`: one blind comparison at a time, each choice saved to the
// rater's CSV file at once. All conversation text is set as textContent, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
let items = [];
let ratings = {};  // item_id -> {choice, comment}
let at = 0;

function turns(element, lines) {
  element.replaceChildren(...lines.map((line) => {
    const turn = document.createElement("div");
    turn.className = "turn";
    const speaker = document.createElement("span");
    speaker.className = "speaker";
    speaker.textContent = line.speaker + ": ";
    turn.append(speaker, document.createTextNode(line.text));
    return turn;
  }));
}

function show(index) {
  at = Math.max(0, Math.min(items.length - 1, index));
  const item = items[at];
  $("item").hidden = false;
  $("item").dataset.id = item.item_id;
  $("number").textContent = `Item ${at + 1} of ${items.length}`;
  $("query").hidden = !item.query;
  $("query").textContent = item.query ? "Question about the meeting: " + item.query : "";
  turns($("context"), item.context);
  turns($("side-a"), item.a);
  turns($("side-b"), item.b);
  const rated = ratings[item.item_id];
  document.querySelectorAll("[data-choice]").forEach((button) => {
    button.classList.toggle("chosen", rated !== undefined && rated.choice === button.dataset.choice);
  });
  $("comment").value = rated ? rated.comment : "";
  progress();
}

function progress() {
  $("progress").textContent = `${Object.keys(ratings).length} of ${items.length} rated`;
}

function rater() {
  const id = $("rater").value.trim();
  if (!id) { $("error").textContent = "Enter your rater id at the top first."; $("rater").focus(); }
  return id;
}

async function choose(choice) {
  const id = rater();
  if (!id) return;
  const item = items[at];
  const response = await fetch("/api/ratings", {
    method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({rater: id, item_id: item.item_id, choice, comment: $("comment").value}),
  });
  const answer = await response.json();
  if (!response.ok) { $("error").textContent = answer.detail; return; }
  $("error").textContent = "";
  ratings[item.item_id] = {choice, comment: $("comment").value.trim()};
  $("saved").textContent = "saved to " + answer.file.split("/").pop();
  const next = items.findIndex((other, index) => index > at && !(other.item_id in ratings));
  const first = items.findIndex((other) => !(other.item_id in ratings));
  show(next >= 0 ? next : first >= 0 ? first : at);
}

async function load(id) {
  localStorage.setItem("mascot-rater", id);
  const response = await fetch(`/api/ratings/${encodeURIComponent(id)}`);
  const answer = await response.json();
  if (!response.ok) { $("error").textContent = answer.detail; return; }
  $("error").textContent = "";
  ratings = answer;
  const first = items.findIndex((item) => !(item.item_id in ratings));
  show(first >= 0 ? first : 0);
}

async function start() {
  const listed = await (await fetch("/api/items")).json();
  items = listed.items;
  // A rater's own sheet (its sides and order are theirs) is served to that rater only.
  if (listed.rater) { $("rater").value = listed.rater; $("rater").readOnly = true; }
  document.querySelectorAll("[data-choice]").forEach((button) => {
    button.addEventListener("click", () => choose(button.dataset.choice));
  });
  $("previous").addEventListener("click", () => show(at - 1));
  $("next").addEventListener("click", () => show(at + 1));
  $("rater").addEventListener("change", () => { if (rater()) load(rater()); });
  document.addEventListener("keydown", (event) => {
    if (event.target.matches("input, textarea") || event.ctrlKey || event.metaKey || event.altKey) return;
    const key = event.key.toLowerCase();
    if (key === "a") choose("A");
    else if (key === "t") choose("tie");
    else if (key === "b") choose("B");
    else if (event.key === "ArrowLeft") show(at - 1);
    else if (event.key === "ArrowRight") show(at + 1);
    else return;
    event.preventDefault();
  });
  const known = listed.rater || localStorage.getItem("mascot-rater");
  if (known) { $("rater").value = known; await load(known); } else { show(0); }
}

start().catch((error) => { $("error").textContent = "could not start: " + error; });
