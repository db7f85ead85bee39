"""The committed dashboard JSON is what the code generates."""

from __future__ import annotations

from gpuaware.dashboards.build import rendered


def test_committed_dashboards_are_what_the_code_generates() -> None:
    for path, text in rendered().items():
        assert path.exists(), f"{path.name} is not committed: run python -m gpuaware.dashboards.build"
        assert path.read_text() == text, f"{path.name} differs from the code: run python -m gpuaware.dashboards.build"


def test_runbook_links_are_absolute_and_point_where_the_setting_says() -> None:
    import pytest

    from gpuaware.dashboards.build import RUNBOOK_URL
    from gpuaware.deploy.manifests import main, prometheus_rule

    def links(url: str | None = None) -> list[str]:
        rule = prometheus_rule() if url is None else prometheus_rule(url)
        return [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]

    assert links() and all(u.startswith(RUNBOOK_URL + "#") for u in links())
    wiki = links("https://wiki.example.com/gpuaware/runbooks/")
    assert wiki[0] == "https://wiki.example.com/gpuaware/runbooks#" + links()[0].split("#")[1]
    assert all(u.startswith("https://wiki.example.com/gpuaware/runbooks#") for u in wiki)
    with pytest.raises(ValueError, match="absolute"):
        prometheus_rule("docs/runbooks.md")
    assert main(["--runbook-url", "wiki/runbooks"]) == 2 and main(["--runbook-url"]) == 2
