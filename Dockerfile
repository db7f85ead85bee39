# One image for every gpuaware subcommand: `docker run IMAGE agent|stream|scheduler|...`.
# Base pinned by version; pin it by digest as well in your registry mirror (docs/deploy.md).
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuaware gpuaware
# Runtime dependencies only (no test extras): the versions pinned in pyproject.toml.
RUN python -m venv /opt/gpuaware \
 && /opt/gpuaware/bin/pip install --no-compile . \
 && /opt/gpuaware/bin/python -m compileall -q /opt/gpuaware/lib

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 65532 gpuaware \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin gpuaware
COPY --from=build /opt/gpuaware /opt/gpuaware
ENV PATH=/opt/gpuaware/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["gpuaware"]
CMD ["--help"]
