"""``fracpilot recommend -o html``: one self-contained page whose numbers are the JSON's."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

from factories import sample, workload
from fracpilot_cli.recommend_html import render
from fracpilot_cli.report_html import num
from fracpilot_libs.analysis.recommendations import recommend
from fracpilot_libs.contracts import Policy, UsageSample

T0 = datetime(2026, 3, 2, tzinfo=UTC)
GIB = 1024**3


def series(name: str, node: str, compute: float) -> list[UsageSample]:
    return [
        sample(
            workload=workload(name, "genai"),
            pod=f"{name}-0",
            node=node,
            gpu_uuid=f"GPU-{name}",
            timestamp=T0 + timedelta(minutes=5 * i),
            compute=compute,
            memory_used_bytes=10 * GIB,
            memory_total_bytes=80 * GIB,
            allocated=None,
        )
        for i in range(600)
    ]


class Cells(HTMLParser):
    """The text of every table cell and the sources of the images."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.images: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(dict(attrs).get("src") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_the_page_holds_every_workload_and_the_cards_and_nodes_freed() -> None:
    history = {
        s[0].workload.key: s
        for s in (series("a", "n1", 0.1), series("b", "n1", 0.1), series("c", "n2", 0.1))
    }
    doc = recommend(history, Policy()).as_dict()
    page = render(doc, "2d", "http://prometheus:9090")
    parsed = Cells()
    parsed.feed(page)
    by_workload = {r[1]: r for r in parsed.rows if r and r[0] == "genai"}
    assert set(by_workload) == {"a", "b", "c"}
    for w in doc["workloads"]:
        row = by_workload[w["workload"]]
        assert row[3] == num(w["held_fraction"])
        assert row[4] == num(w["recommended_fraction"])
    [nodes] = [r for r in parsed.rows if r and r[0] == str(doc["totals"]["nodes_held"])]
    assert nodes == ["2", "1", "1"]  # held, at the recommendations, freed
    assert re.search(r"<b>3</b>cards held now", page)
    assert f"<b>{doc['totals']['cards_freed']}</b>cards packing would free" in page
    [src] = parsed.images
    assert base64.b64decode(src.removeprefix("data:image/png;base64,"))[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in page.replace("http://prometheus:9090", "")  # self-contained


def test_text_from_the_history_is_escaped() -> None:
    one = series("a", "n1", 0.1)
    doc = recommend({one[0].workload.key: one}, Policy()).as_dict()
    doc["workloads"][0]["workload"] = "<script>x</script>"
    page = render(doc, "2d", "http://p")
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
