"""`mascot eval rate RUN --web`: the blind pairwise comparisons of `export-human`, one at a time, in a local page.

The page serves the items of the export whose key it is given (rebuilt from the run's conversations,
`mascot.evaluation.human.sheet_items`), never the key: a rater sees persona names, not systems. Each choice
is saved at once, as the rater's CSV file in the columns `mascot eval import-human` reads (item_id, rater,
choice, comment), one file per rater, rewritten atomically; a rater who comes back finds their choices. The
keyboard does it all: A, T and B choose, the arrow keys move between items.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from cli.web import STATIC
from cli.web.guard import LOOPBACK_NAMES, LocalPageGuard
from mascot.evaluation.human import (
    CHOICES,
    HumanKey,
    HumanRatingsError,
    rater_problem,
    read_ratings,
    write_rater_file,
)
from mascot.evaluation.human_sheet import SheetItem


class RatingBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rater: str
    item_id: str
    choice: str
    comment: str = Field(default="", max_length=2000)


def rating_app(items: list[SheetItem], key: HumanKey, out: Path, names=LOOPBACK_NAMES,
               sheet_rater: str | None = None) -> FastAPI:
    """The rating page for `items` (in the sheets' order), answering to the Host `names`; ratings go to
    `out`/ratings-<rater>.csv. Only the page itself can record a rating (`cli.web.guard`). Given `sheet_rater`,
    the items are that rater's own sheet, and a rating by anyone else is refused."""
    app = FastAPI(title="mascot eval rate", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(LocalPageGuard, names=names)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    known = {item.item_id for item in items}
    writing = asyncio.Lock()  # one writer per file at a time; a rater's file holds all their ratings

    def rater_file(rater: str) -> Path:
        if (why := rater_problem(rater)) is not None:
            raise HTTPException(422, f"rater id {why}")
        if sheet_rater is not None and rater != sheet_rater:
            raise HTTPException(422, f"these items are rater {sheet_rater!r}'s own sheet, not {rater!r}'s")
        return out / f"ratings-{rater}.csv"

    def saved(rater: str) -> dict[str, tuple[str, str]]:
        path = rater_file(rater)
        if not path.exists():
            return {}
        try:
            ratings, _ = read_ratings([path], key)
        except HumanRatingsError as exc:
            raise HTTPException(409, f"{path} cannot be read back: {exc}") from None
        return {rating.item_id: (rating.choice, rating.comment) for rating in ratings if rating.rater == rater}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "rate.html")

    @app.get("/api/items")
    async def listed() -> dict:
        return {"items": [asdict(item) for item in items], "choices": list(CHOICES), "rater": sheet_rater}

    @app.get("/api/ratings/{rater}")
    async def ratings(rater: str) -> dict:
        return {item_id: {"choice": choice, "comment": comment} for item_id, (choice, comment) in saved(rater).items()}

    @app.post("/api/ratings")
    async def rate(body: RatingBody) -> dict:
        if body.item_id not in known:
            raise HTTPException(422, f"item {body.item_id!r} is not an item of these sheets")
        if body.choice not in CHOICES:
            raise HTTPException(422, f"choice {body.choice!r}: expected one of {', '.join(CHOICES)}")
        async with writing:
            ratings = saved(body.rater)
            ratings[body.item_id] = (body.choice, body.comment.strip())
            ordered = {item.item_id: ratings[item.item_id] for item in items if item.item_id in ratings}
            write_rater_file(rater_file(body.rater), body.rater, ordered)
        return {"rated": len(ordered), "items": len(items), "file": str(rater_file(body.rater))}

    return app
