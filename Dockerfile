# syntax=docker/dockerfile:1
#
# The flashsale image: a static binary on distroless, running as a non-root
# user. Build from the repository root:
#
#   docker build -t flashsale .
#
# The binary is built by scripts/build-static.sh, the same script (and so the
# same flags) as `make build-static` and the test that checks the binary is
# static (deploy/image_test.go). The .git directory is part of the build
# context so the Go build info carries the commit (`flashsale version`).
#
# No HEALTHCHECK: distroless has no shell or curl to run one. Orchestrators
# probe the HTTP endpoints instead: liveness GET /healthz, readiness GET
# /readyz (200 "ok" or "degraded": keep sending traffic; 503: take the
# instance out). deploy/compose and deploy/haproxy show both.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    scripts/build-static.sh /out/flashsale && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/flashsale /usr/local/bin/flashsale
# The embedded JetStream store (FLASHSALE_NATS_URL=embedded, one instance
# only) needs a directory the non-root user may write; mount a volume here.
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENV FLASHSALE_HTTP_ADDR=0.0.0.0:8080 \
    FLASHSALE_DATA_DIR=/data \
    FLASHSALE_LOG_FORMAT=json
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/flashsale"]
CMD ["serve"]
