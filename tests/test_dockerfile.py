"""The Dockerfile: multi-stage, non-root, a pinned base image and runtime dependencies only."""

from __future__ import annotations

import re

from tests.support import REPO


def test_dockerfile_is_multistage_non_root_and_pinned():
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base)
    assert len(re.findall(r"^FROM ", text, re.M)) == 2
    user = re.findall(r"^USER (\S+)$", text, re.M)
    assert user and user[-1].split(":")[0].isdigit() and user[-1].split(":")[0] != "0"
    assert "[test" not in text and "-e " not in text  # runtime deps only, a real install
    assert re.search(r'^ENTRYPOINT \["gpuaware"\]$', text, re.M)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {"tests", ".git", ".venv"} <= set(ignored)
