"""The committed dashboard JSON is what the code generates."""

from __future__ import annotations

from gpuaware.dashboards.build import rendered


def test_committed_dashboards_are_what_the_code_generates() -> None:
    for path, text in rendered().items():
        assert path.exists(), f"{path.name} is not committed: run python -m gpuaware.dashboards.build"
        assert path.read_text() == text, f"{path.name} differs from the code: run python -m gpuaware.dashboards.build"
