"""`mascot eval`: human preference sheets from a finished evaluation, and the raters' choices read back."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cli.common import console, fail
from cli.web import AllowHostOption, AllowRemoteOption, HostOption, PortOption

eval_app = typer.Typer(help="Human preference: blind sheets for raters, and their ratings.", no_args_is_help=True)

RunArgument = Annotated[Path, typer.Argument(help="The run directory of a finished evaluation, e.g. runs/tiny.")]
KeyOption = Annotated[Path | None, typer.Option(
    "--key", help="The key file, which says which side is MASCOT (default: RUN/eval/human_key.json).")]


def default_key(run_dir: Path) -> Path:
    return run_dir / "eval" / "human_key.json"


@eval_app.command("export-human")
def export_human(
    run_dir: RunArgument,
    out: Annotated[Path | None, typer.Option(help="Folder of the sheets for raters (default: RUN/eval/human).")] = None,
    key: KeyOption = None,
    per_baseline: Annotated[int | None, typer.Option(
        help="At most this many comparisons per baseline, chosen by --seed (default: all).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sampling, the item order and MASCOT's sides.")] = 0,
    baselines: Annotated[str | None, typer.Option(
        help="Comma-separated baselines to compare MASCOT with (default: every one the evaluation ran).")] = None,
    force: Annotated[bool, typer.Option(help="Replace a key that another export wrote.")] = False,
    raters: Annotated[str | None, typer.Option(
        help="Comma-separated rater ids: one sheet per rater (OUT/<rater>/), with the same comparisons in that "
             "rater's own sides and order (default: one sheet shared by every rater).")] = None,
):
    """Write blind pairwise sheets (sheet.csv, sheet.html) of MASCOT against each baseline, and the key apart.

    Each item is MASCOT's conversation and a baseline's on the same context and seed, MASCOT on side A in
    half of each baseline's items; the sheets name no system. Send raters the sheets' folder; keep the key.
    """
    from mascot.artifacts import ArtifactChanged
    from mascot.evaluation.human import HumanRatingsError, export_sheets
    from mascot.yamlio import ConfigError

    names = [name.strip() for name in baselines.split(",") if name.strip()] if baselines else None
    rater_ids = [name.strip() for name in raters.split(",")] if raters is not None else None
    key = key or default_key(run_dir)
    try:
        export = export_sheets(run_dir, out or run_dir / "eval" / "human", key, seed=seed,
                               per_baseline=per_baseline, baselines=names, force=force, raters=rater_ids)
    except (HumanRatingsError, FileNotFoundError, ArtifactChanged, ConfigError) as exc:
        fail(exc)
    counts = ", ".join(f"{baseline} {n}" for baseline, n in export.per_baseline.items())
    console.print(f"[green]{export.items} blind comparisons[/green] ({counts})", highlight=False)
    if export.rater_sheets:
        for rater, folder in export.rater_sheets.items():
            console.print(f"send to {rater}: {folder / 'sheet.html'} (their own sides and order) or "
                          f"{folder / 'sheet.csv'}", highlight=False, soft_wrap=True)
    else:
        console.print(f"send to raters: {export.sheet_html} (one page, works offline) or {export.sheet_csv}",
                      highlight=False, soft_wrap=True)
    console.print(f"keep back:      {export.key} (says which side is MASCOT; import-human reads it)",
                  highlight=False, soft_wrap=True)
    console.print(f"then:           mascot eval import-human {run_dir} RATINGS.csv..."
                  + (f" --key {export.key}" if key != default_key(run_dir) else ""), highlight=False, soft_wrap=True)


def share_cell(share: dict | None) -> str:
    """A share with its interval and n, or a dash where nothing counts (no decisive choice; no pairwise judge)."""
    from mascot.evaluation.report import bracket

    if share is None:
        return "–"
    return f"{share['share']:.0%} {bracket(share, '.0%')} n={share['n']}"


@eval_app.command("import-human")
def import_human(
    run_dir: RunArgument,
    ratings: Annotated[list[Path], typer.Argument(
        help="Rater CSV files: item_id, rater, choice (A, B or tie), comment; one or more raters each.")],
    key: KeyOption = None,
):
    """Read raters' choices against the key: MASCOT's wins, ties, losses and win rate per baseline, and the
    raters' agreement. Writes RUN/eval/human_results.json; a bad file is refused, naming its line and field."""
    from mascot.artifacts import ArtifactChanged
    from mascot.evaluation.human import HumanRatingsError, import_ratings
    from mascot.evaluation.report import bracket
    from mascot.evaluation.systems import SYSTEMS

    try:
        summary = import_ratings(run_dir, ratings, key or default_key(run_dir), run_dir / "eval" / "human_results.json")
    except (HumanRatingsError, FileNotFoundError, ArtifactChanged) as exc:
        fail(exc)
    table = Table(title=f"Human preference, {len(summary['raters'])} rater(s): MASCOT against each baseline",
                  caption=f"n: ratings; W/T/L: MASCOT's wins, ties and losses; win rate: ties count half, "
                          f"[{summary['confidence']:.0%} interval over contexts and raters, crossed]; alpha: "
                          "Krippendorff's, ordinal, on the comparisons two or more raters rated; side A: the share "
                          "of decisive choices that picked A (0.5 without position bias); with judge: the share of "
                          "ratings that agree with the pairwise judge")
    table.add_column("baseline", no_wrap=True)
    for column in ("raters", "n", "contexts", "W/T/L", "win rate", "alpha (items)", "side A", "with judge"):
        table.add_column(column, justify="right", no_wrap=column in {"win rate", "side A", "with judge"})
    missing_alpha = []
    for entry in summary["results"]:
        agreement, label = entry["agreement"], SYSTEMS[entry["baseline"]].label if entry["baseline"] in SYSTEMS \
            else entry["baseline"]
        if agreement["alpha"] is None:
            missing_alpha.append(f"alpha against {label}: none, {agreement['reason']}")
        table.add_row(label, str(entry["raters"]), str(entry["ratings"]), str(entry["contexts"]),
                      f"{entry['wins']}/{entry['ties']}/{entry['losses']}",
                      f"{entry['win_rate']:.0%} {bracket(entry, '.0%')}",
                      "–" if agreement["alpha"] is None else f"{agreement['alpha']:.2f} ({agreement['items']})",
                      share_cell(entry["side_a_share"]), share_cell(entry["judge_agreement"]))
    console.print(table)
    for line in missing_alpha:
        console.print(line, highlight=False, soft_wrap=True)
    blank = sum(f["blank_rows"] for f in summary["ratings_files"])
    if blank:
        console.print(f"{blank} blank row(s) (items nobody rated on a filled-in sheet.csv) were left out",
                      highlight=False)
    console.print(f"results: {run_dir / 'eval' / 'human_results.json'}", highlight=False, soft_wrap=True)


@eval_app.command("rate")
def rate(
    run_dir: RunArgument,
    web: Annotated[bool, typer.Option("--web", help="Serve the rating page (the only way to rate here; the offline "
                                                    "alternative is eval/human/sheet.html).")] = False,
    key: KeyOption = None,
    out: Annotated[Path | None, typer.Option(help="Folder of the raters' files, ratings-<rater>.csv (default: "
                                                  "RUN/eval/human_ratings).")] = None,
    rater: Annotated[str | None, typer.Option(help="The rater whose own sheet to serve, where export-human made one "
                                                   "per rater (--raters).")] = None,
    host: HostOption = "127.0.0.1",
    port: PortOption = 8766,
    allow_remote: AllowRemoteOption = False,
    allow_host: AllowHostOption = None,
):
    """Rate the blind comparisons of `export-human` in a local web page, one at a time, with keyboard shortcuts.

    Each choice is saved at once to RUN/eval/human_ratings/ratings-<rater>.csv, the file `import-human` reads; a
    rater who comes back finds their choices. The page shows what the sheets show, never the key.
    """
    from cli.web import check_host, serve
    from cli.web.guard import served_names
    from cli.web.rating_app import rating_app
    from mascot.artifacts import ArtifactChanged
    from mascot.evaluation.human import HumanRatingsError, read_key, sheet_items

    if not web:
        fail(f"rating runs in the browser: add --web, or send raters {run_dir / 'eval' / 'human' / 'sheet.html'} "
             "(it works offline)")
    check_host(host, allow_remote)
    key = key or default_key(run_dir)
    try:
        items = sheet_items(run_dir, key, rater)
        app = rating_app(items, read_key(key), out or run_dir / "eval" / "human_ratings",
                         served_names(host, allow_host or ()), sheet_rater=rater)
    except (HumanRatingsError, FileNotFoundError, ArtifactChanged) as exc:
        fail(exc)
    serve(app, host, port, f"{len(items)} blind comparisons of {run_dir}")
