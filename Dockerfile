# The one Railyard image: `railyard` (scheduler extender, node agent) and `railyard-cni`.
# Without the `sim` extra: the simulator's numpy/scipy/matplotlib stay out (decision 0079).
#   docker build -t <registry>/railyard:0.1.0 . && docker push <registry>/railyard:0.1.0
# No registry is used by this project's tests; the operator builds and pushes (docs/install.md).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/railyard-*.whl && rm -rf /wheels \
    && railyard --version && railyard-cni --version
# The extender runs as 65532 (the chart's securityContext); the agent and the CNI install
# step run as root with the few capabilities the chart grants them.
USER 65532:65532
ENTRYPOINT ["railyard"]
CMD ["--help"]
