# syntax=docker/dockerfile:1
# chime's image: one static binary on distroless static, as a non-root user.
#   docker build --build-arg VERSION=0.1.0 -t ghcr.io/chime-nats/chime:0.1.0 .
#   docker run -v chime-data:/data -v "$PWD/operators:/etc/chime/operators:ro" \
#     -e CHIME_OPERATOR_TOKENS_FILE=/etc/chime/operators -p 8080:8080 ghcr.io/chime-nats/chime:0.1.0
# (.ci/image builds it and checks both, where a Docker daemon runs.)
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first: they stay cached while only the source changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=0.0.0-dev
# Static (no cgo), without local paths, the version in main.version.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/chime ./cmd/chime
# The data dir, empty, for the non-root user to own in the image.
RUN mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/chime /chime
COPY --from=build --chown=65532:65532 /out/data /data
# The nonroot user of distroless (65532), as the chart's securityContext.
USER 65532:65532
# The embedded server's store: mount a volume here to keep it.
ENV CHIME_DATA_DIR=/data
VOLUME /data
WORKDIR /data
# HTTP listens on every interface of the container, which chime allows
# only with operator tokens (CHIME_OPERATOR_TOKENS_FILE): without them it
# refuses to start and says so. CHIME_HTTP_ADDR=127.0.0.1:8080 keeps it
# inside the container instead.
ENV CHIME_HTTP_ADDR=0.0.0.0:8080
# HTTP (API, console, callbacks, /metrics, /healthz, /readyz); 4222 only
# when the server is embedded and CHIME_NATS_LISTEN opens it (with
# CHIME_NATS_AUTH=true).
EXPOSE 8080
ENTRYPOINT ["/chime"]
CMD ["serve"]
