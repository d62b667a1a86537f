"""sheet.html: the blind comparison sheet as one page a rater opens offline, in any browser.

Everything is inline (no stylesheet, script, font or image is fetched), so the page works from a
file and cannot tell anyone that it was opened. Every piece of text is HTML-escaped: conversation
text is model output and may hold markup. The page keeps the rater's choices in the browser's
local storage, so closing it loses nothing, and downloads them as the CSV that
`mascot eval import-human` reads: item_id, rater, choice, comment.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape


@dataclass(frozen=True)
class Line:
    speaker: str
    text: str


@dataclass(frozen=True)
class SheetItem:
    """One blind comparison as raters see it: the opening, then the two continuations."""

    item_id: str
    query: str | None  # a meeting context's question, when it has one
    context: list[Line]
    a: list[Line]
    b: list[Line]


STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 72rem; padding: 1rem; color: #222; }
header { position: sticky; top: 0; background: #fff; border-bottom: 1px solid #ccc; padding: .5rem 0; z-index: 1; }
.item { border: 1px solid #ccc; border-radius: 6px; margin: 1.5rem 0; padding: 1rem; }
.item.rated { border-color: #6a6; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; }
@media (max-width: 50rem) { .pair { grid-template-columns: 1fr; } }
.turns { background: #f6f6f6; border-radius: 4px; padding: .5rem .75rem; }
.turn { margin: .4rem 0; white-space: pre-wrap; }
.speaker { font-weight: 600; }
.choice label { margin-right: 1.5rem; }
textarea { width: 100%; min-height: 2.5rem; }
.instructions { color: #444; }
"""

SCRIPT = """
const sheet = document.body.dataset.sheet;
const store = "blind-sheet-" + sheet;
function saved() { try { return JSON.parse(localStorage.getItem(store)) || {}; } catch (e) { return {}; } }
function save() {
  const state = {rater: document.getElementById("rater").value, items: {}};
  document.querySelectorAll(".item").forEach(item => {
    const picked = item.querySelector("input[type=radio]:checked");
    state.items[item.dataset.id] = {choice: picked ? picked.value : "", comment: item.querySelector("textarea").value};
  });
  try { localStorage.setItem(store, JSON.stringify(state)); } catch (e) { /* private mode: nothing kept */ }
  progress();
}
function progress() {
  const items = document.querySelectorAll(".item");
  let rated = 0;
  items.forEach(item => {
    const done = item.querySelector("input[type=radio]:checked") !== null;
    item.classList.toggle("rated", done);
    rated += done ? 1 : 0;
  });
  document.getElementById("progress").textContent = rated + " of " + items.length + " rated";
}
function restore() {
  const state = saved();
  const rater = document.getElementById("rater");
  rater.value = state.rater || rater.defaultValue;
  document.querySelectorAll(".item").forEach(item => {
    const kept = (state.items || {})[item.dataset.id];
    if (!kept) return;
    item.querySelectorAll("input[type=radio]").forEach(r => { r.checked = r.value === kept.choice; });
    item.querySelector("textarea").value = kept.comment || "";
  });
  progress();
}
function field(value) { return '"' + String(value).replace(/"/g, '""') + '"'; }
function download() {
  const rater = document.getElementById("rater").value.trim();
  if (!rater) { alert("Enter your rater id at the top first."); return; }
  const rows = [["item_id", "rater", "choice", "comment"]];
  let unrated = 0;
  document.querySelectorAll(".item").forEach(item => {
    const picked = item.querySelector("input[type=radio]:checked");
    if (!picked) { unrated += 1; return; }
    rows.push([item.dataset.id, rater, picked.value, item.querySelector("textarea").value.trim()]);
  });
  if (rows.length === 1) { alert("No item is rated yet."); return; }
  if (unrated && !confirm(unrated + " item(s) are not rated and will be left out. Download anyway?")) return;
  const text = rows.map(row => row.map(field).join(",")).join("\\r\\n") + "\\r\\n";
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([text], {type: "text/csv"}));
  link.download = "ratings-" + rater.replace(/[^A-Za-z0-9_.-]/g, "_") + ".csv";
  document.body.appendChild(link);
  link.click();
  link.remove();
}
document.addEventListener("change", save);
document.addEventListener("input", save);
document.getElementById("download").addEventListener("click", download);
restore();
"""


def _turns(lines: list[Line]) -> str:
    return "".join(f'<div class="turn"><span class="speaker">{escape(line.speaker)}:</span> {escape(line.text)}</div>'
                   for line in lines)


def _item(number: int, total: int, item: SheetItem) -> str:
    item_id = escape(item.item_id)
    query = f'<p><strong>Question about the meeting:</strong> {escape(item.query)}</p>' if item.query else ""
    choices = "".join(f'<label><input type="radio" name="choice-{item_id}" value="{value}"> {label}</label>'
                      for value, label in (("A", "A is better"), ("tie", "Tie"), ("B", "B is better")))
    return (f'<section class="item" data-id="{item_id}"><h2>Item {number} of {total} '
            f'<small>(id {item_id})</small></h2>{query}<h3>The conversation so far</h3>'
            f'<div class="turns">{_turns(item.context)}</div>'
            f'<div class="pair"><div><h3>Continuation A</h3><div class="turns">{_turns(item.a)}</div></div>'
            f'<div><h3>Continuation B</h3><div class="turns">{_turns(item.b)}</div></div></div>'
            f'<p class="choice">{choices}</p>'
            f'<label>Comment (optional)<textarea name="comment-{item_id}"></textarea></label></section>')


def render_sheet_html(items: list[SheetItem], sheet_id: str, rater: str | None = None) -> str:
    """The whole page; `sheet_id` keeps one sheet's saved choices apart from another's in the browser. A rater's
    own sheet has their id filled in (its sides and order are theirs)."""
    body = "".join(_item(number, len(items), item) for number, item in enumerate(items, 1))
    rater_value = f' value="{escape(rater)}"' if rater else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Which continuation is better?</title><style>{STYLE}</style></head>"
        f'<body data-sheet="{escape(sheet_id)}"><header><label>Your rater id: <input id="rater" '
        f'autocomplete="off"{rater_value}></label> <span id="progress"></span> '
        '<button id="download" type="button">Download my ratings (CSV)</button></header>'
        '<p class="instructions">Each item shows the start of a conversation and two ways it went on. Read both '
        "and choose the continuation that is better as a whole, or Tie when neither is. Which one is A says "
        "nothing about it. Your choices are kept in this browser as you go; when you are done, download your "
        "ratings and send back the CSV file.</p>"
        f"{body}<script>{SCRIPT}</script></body></html>\n"
    )
