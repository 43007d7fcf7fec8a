"""`rill cluster status` fits 80 columns without cutting a node's URL."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from app.cli.cluster import status_table


def _render(healths: dict[str, dict[str, Any] | None]) -> list[str]:
    console = Console(width=80, record=True)
    console.print(status_table(healths))
    return console.export_text().splitlines()


def test_five_nodes_on_localhost_fit_80_columns() -> None:
    urls = [f"http://127.0.0.1:{port}" for port in (43117, 43118, 51234, 60000, 65535)]
    healths: dict[str, dict[str, Any] | None] = {
        url: {
            "node": n,
            "role": "leader" if n == 1 else "follower",
            "term": 12345,
            "leader": 1,
            "commit": 1234567,
            "applied": 1234566,
            "last_index": 1234567,
        }
        for n, url in enumerate(urls[:3], 1)
    }
    healths[urls[3]] = None  # no answer
    healths[urls[4]] = {"status": "ok"}  # up, details hidden without an admin token
    lines = _render(healths)
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert all(url in text for url in urls) and "…" not in text
    assert "1234566" in text and "candidate" not in text and "no answer" in text and "admin:*" in text


def test_https_and_huge_indexes_fold_numbers_not_urls() -> None:
    n = 123456789012
    url = "https://127.0.0.1:43117"
    lines = _render(
        {url: {"node": 1, "role": "candidate", "term": n, "leader": 1, "commit": n, "applied": n, "last_index": n}}
    )
    assert max(len(line) for line in lines) <= 80
    assert url in "\n".join(lines) and "…" not in "\n".join(lines)


def test_what_nodes_say_is_shown_as_text_not_markup() -> None:
    url = "http://127.0.0.1:1"
    lines = "\n".join(_render({url: {"node": 1, "role": "[red]leader[/red] [/x]", "term": 1, "leader": 1}}))
    assert "[red]leader[/red] [/x]" in lines
