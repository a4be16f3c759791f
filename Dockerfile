# The one Railyard image: `railyard` (scheduler extender, node agent) and `railyard-cni`.
# Without the `sim` extra: the simulator's numpy/scipy/matplotlib stay out (decision 0079).
#   docker build -t <registry>/railyard:0.1.0 . && docker push <registry>/railyard:0.1.0
# The same image as hack/build-image makes without docker or a registry (decision 0092): Debian
# bookworm's python3 and a venv at /opt/railyard holding the wheel and its dependencies; the
# tests import that one into their box's containerd. Keep the two in step.
FROM debian:bookworm-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python3 -m venv /opt/railyard \
    && /opt/railyard/bin/pip install --no-cache-dir --disable-pip-version-check . \
    && rm -rf /opt/railyard/lib/python3*/site-packages/pip* \
              /opt/railyard/lib/python3*/site-packages/setuptools* /opt/railyard/bin/pip*

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man /usr/share/locale
COPY --from=build /opt/railyard /opt/railyard
ENV PATH=/opt/railyard/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8
RUN railyard --version && railyard-cni --version
# The extender runs as 65532 (the chart's securityContext); the agent and the CNI install
# step run as root with the few capabilities the chart grants them.
USER 65532:65532
ENTRYPOINT ["/opt/railyard/bin/railyard"]
CMD ["--help"]
