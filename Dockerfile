# sglang-tuning-exporter sidecar image.
#   docker build -t sglang-tuning-exporter:0.1.0 .
#   docker run --rm -p 9470:9470 -v /var/log/sglang:/logs:ro sglang-tuning-exporter:0.1.0 \
#     serve --sglang.log-file /logs/sglang.log --sglang.url http://sglang:30000
# Base image pinned by exact version; bump deliberately (docs/sidecar.md).

FROM python:3.11.11-slim-bookworm AS build
# A compiler for the optional C accelerator of the log reader (the wheel falls back to pure Python
# without one); only this stage has it.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY exporter ./exporter
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin exporter
USER 10001:10001
EXPOSE 9470
# No curl in the slim image: the health probe uses the Python already there.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9470/-/healthy', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["sglang-tuning-exporter"]
CMD ["serve"]
